// Python bindings of csrc/comm, registered into engine._C by bindings.cpp (kestrel::comm::bind).
// Raw addresses as Python ints, as everywhere in engine._C; the Python face is engine/parallel/comm.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "comm_kernels.h"
#include "hostar.h"
#ifdef KESTREL_WITH_CUDA
#include "cuda_comm.h"
#endif

namespace py = pybind11;

namespace kestrel::comm {

void bind(py::module_& m) {
  using release = py::call_guard<py::gil_scoped_release>;
  m.attr("comm_int8_group") = kGroup;
  m.def("comm_isa", &comm_isa, "ISA level of the comm reduction kernels (scalar, avx2, avx512)");
  m.def("comm_force_isa", [](const std::string& s) { comm_force_isa(s.c_str()); }, py::arg("name"),
        "Force the comm kernels' ISA level ('scalar', 'avx2', 'avx512') or go back to the best ('auto')");
  m.def("comm_wait_u32",
        [](uintptr_t flag, uint32_t target, uintptr_t sleepers, uintptr_t abort, int64_t spin_ns, int64_t yield_ns,
           int64_t timeout_ns) {
          WaitParams w{reinterpret_cast<uint32_t*>(sleepers), reinterpret_cast<const uint32_t*>(abort), spin_ns,
                       yield_ns, timeout_ns};
          return wait_flag(reinterpret_cast<const uint32_t*>(flag), target, w);
        },
        release(), "Wait until the uint32 at flag reaches target (wrapping compare): 0 ok, 1 aborted, 2 timeout");
  m.def("comm_signal_u32",
        [](uintptr_t flag, uint32_t value, uintptr_t sleepers) {
          signal_flag(reinterpret_cast<uint32_t*>(flag), value, reinterpret_cast<uint32_t*>(sleepers));
        },
        release(), "Store value at flag (seq_cst) and wake its futex sleepers");
  m.def("comm_reduce",
        [](int dtype, uintptr_t out, const std::vector<uintptr_t>& srcs, int64_t n) {
          reduce_into(dtype, out, srcs.data(), int(srcs.size()), n);
        },
        release(), "out = dtype(sum of srcs in order, fp32)");
  m.def("comm_quantize_int8", &quantize_int8, release(), py::arg("dtype"), py::arg("x"), py::arg("n"), py::arg("q"),
        py::arg("s"), "Group-wise absmax int8: q [ceil(n/128)*128], s [ceil(n/128)] fp32");
  m.def("comm_dequant_sum_requant",
        [](const std::vector<uintptr_t>& q, const std::vector<uintptr_t>& s, int64_t n, uintptr_t oq, uintptr_t os) {
          dequant_sum_requant(q.data(), s.data(), int(q.size()), n, oq, os);
        },
        release(), "Sum of dequantised int8 sources (fp32, in order), requantised; n % 128 == 0");
  m.def("comm_dequantize_int8", &dequantize_int8, release(), py::arg("dtype"), py::arg("q"), py::arg("s"),
        py::arg("n"), py::arg("out"));

  py::class_<HostComm>(m, "HostComm", "Host-memory all-reduce over a shared segment (csrc/comm/hostar.h)")
      .def(py::init<uintptr_t, uintptr_t, uintptr_t, uintptr_t, int64_t, int, int, int, int64_t, int64_t, int64_t>(),
           py::arg("flags"), py::arg("sleepers"), py::arg("abort"), py::arg("slots"), py::arg("slot_bytes"),
           py::arg("nslots"), py::arg("rank"), py::arg("world"), py::arg("spin_ns"), py::arg("yield_ns"),
           py::arg("timeout_ns"))
      .def("all_reduce", &HostComm::all_reduce, release(), py::arg("dtype"), py::arg("x"), py::arg("n"),
           py::arg("oneshot_max"))
      .def("int8_all_reduce", &HostComm::int8_all_reduce, release())
      .def("all_gather", &HostComm::all_gather, release())
      .def("barrier", &HostComm::barrier, release())
      .def("arrive", &HostComm::arrive, release())
      .def("reduce_own", &HostComm::reduce_own, release())
      .def("slot_address", &HostComm::slot_address)
      .def("subrange", &HostComm::subrange)
      .def("int8_chunk_elems", &HostComm::int8_chunk_elems)
      .def("set_timing", &HostComm::set_timing)
      .def("set_threads", &HostComm::set_threads)
      .def_property_readonly("seq", &HostComm::seq)
      .def_property_readonly("slot_bytes", &HostComm::slot_bytes);

#ifdef KESTREL_WITH_CUDA
  m.def("cuda_host_register", &cuda::host_register, release());
  m.def("cuda_host_unregister", &cuda::host_unregister, release());
  m.def("cuda_mapped_all_reduce", &cuda::mapped_all_reduce, release());
  m.def("cuda_int8_quantize_packets", &cuda::int8_quantize_packets, release());
  m.def("cuda_int8_reduce_packets", &cuda::int8_reduce_packets, release());
  m.def("cuda_int8_dequantize_packets", &cuda::int8_dequantize_packets, release());
#endif
}

}  // namespace kestrel::comm
