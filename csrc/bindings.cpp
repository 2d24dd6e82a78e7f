// engine._C: the native kernels behind engine/ops. No torch headers here by design (see docs/ARCHITECTURE.md,
// "Native kernels"): every function takes raw pointers as Python ints (tensor.data_ptr()), sizes and
// strides in elements and a dtype code (0 float32, 1 bfloat16, 2 float16); CUDA functions also take
// the device index and the stream (torch.cuda.current_stream().cuda_stream). The Python face in
// engine/ops checks devices, dtypes, shapes and strides before calling in.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cpu/gemm_pool.h"
#include "cpu/gguf_ops.h"
#include "cpu/moe_ops.h"
#include "cpu/ops.h"
#ifdef KESTREL_WITH_CUDA
#include "cuda/ops.h"
#endif

namespace py = pybind11;

#ifdef KESTREL_WITH_COMM
namespace kestrel::comm {
void bind(py::module_& m);  // csrc/comm/bind_comm.cpp: host all-reduce, int8 kernels (tensor parallelism)
}
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "Kestrel native kernels (CPU: AVX-512 / AVX2 / scalar dispatch with OpenMP; CUDA when built with it)";
  using release = py::call_guard<py::gil_scoped_release>;

#ifdef KESTREL_WITH_CUDA
  m.attr("has_cuda") = true;
  m.attr("cuda_archs") = KESTREL_CUDA_ARCHS_STR;
#else
  m.attr("has_cuda") = false;
  m.attr("cuda_archs") = "";
#endif
  m.attr("has_openmp") = kestrel::cpu::has_openmp();

  m.def("cpu_isa", &kestrel::cpu::isa_name, "ISA level the CPU dispatcher uses now: scalar, avx2 or avx512");
  m.def("force_isa", &kestrel::cpu::force_isa, py::arg("name"),
        "Force the CPU ISA level ('scalar', 'avx2', 'avx512'; 'avx512bf16': avx512 with the bf16 dot product in "
        "the linear kernels) or go back to the best one ('auto'). "
        "Raises ValueError for a level this build or CPU lacks. engine.ops.configure sets it at engine start "
        "(KernelConfig.cpu_isa).");
  m.def("available_isas", &kestrel::cpu::available_isas, "ISA levels usable on this CPU with this build");
  m.def("linear_isa", &kestrel::cpu::linear_isa,
        "ISA level the CPU linear kernels use now: scalar, avx2, avx512 or avx512bf16 (AVX-512 with vdpbf16ps "
        "for bfloat16). force_isa('avx512bf16') selects it (other kernels then run at 'avx512'); "
        "force_isa('avx512') turns the bf16 dot product off");
  m.def("set_num_threads", &kestrel::cpu::set_num_threads, py::arg("n"), "Threads the CPU kernels may use");
  m.def("get_num_threads", &kestrel::cpu::get_num_threads);
  m.def("gemm_on_pool", &kestrel::cpu::gemm_on_pool,
        "Whether the GEMM regime runs on the linear pool (else OpenMP): set_gemm_threads, or OMP_WAIT_POLICY");
  m.def("set_gemm_threads", &kestrel::cpu::set_gemm_threads, py::arg("mode"),
        "Threads of the GEMM regime: 'pool', 'openmp' or 'auto' (by OMP_WAIT_POLICY); engine.ops.configure sets it at "
        "engine start (KernelConfig.gemm_threads). Raises ValueError for another value.");

  m.def("rms_norm", &kestrel::cpu::rms_norm, release(), py::arg("dtype"), py::arg("out"), py::arg("out_stride"),
        py::arg("x"), py::arg("x_stride"), py::arg("weight"), py::arg("T"), py::arg("H"), py::arg("eps"));
  m.def("fused_add_rms_norm", &kestrel::cpu::fused_add_rms_norm, release(), py::arg("dtype"), py::arg("x"),
        py::arg("x_stride"), py::arg("residual"), py::arg("residual_stride"), py::arg("weight"), py::arg("T"),
        py::arg("H"), py::arg("eps"));
  m.def("rotary_embedding", &kestrel::cpu::rotary_embedding, release(), py::arg("dtype"), py::arg("positions"),
        py::arg("q"), py::arg("q_stride"), py::arg("k"), py::arg("k_stride"), py::arg("T"), py::arg("num_heads"),
        py::arg("num_kv_heads"), py::arg("head_size"), py::arg("cos_sin_cache"), py::arg("max_position"),
        py::arg("rot_dim"), py::arg("is_neox"));
  m.def("silu_and_mul", &kestrel::cpu::silu_and_mul, release(), py::arg("dtype"), py::arg("out"),
        py::arg("out_stride"), py::arg("x"), py::arg("x_stride"), py::arg("T"), py::arg("I"));
  m.def("reshape_and_cache", &kestrel::cpu::reshape_and_cache, release(), py::arg("dtype"), py::arg("key"),
        py::arg("key_s0"), py::arg("key_s1"), py::arg("value"), py::arg("value_s0"), py::arg("value_s1"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("slot_mapping"), py::arg("T"), py::arg("num_kv_heads"),
        py::arg("head_size"), py::arg("num_slots"));
  m.def("token_positions_and_slots", &kestrel::cpu::token_positions_and_slots, release(), py::arg("query_start"),
        py::arg("context_lens"), py::arg("block_tables"), py::arg("bt_stride"), py::arg("width"), py::arg("S"),
        py::arg("T"), py::arg("block_size"), py::arg("positions"), py::arg("slots"));
  m.def("linear", &kestrel::cpu::linear, release(), py::arg("dtype"), py::arg("out"), py::arg("out_stride"),
        py::arg("x"), py::arg("x_stride"), py::arg("weight"), py::arg("bias"), py::arg("M"), py::arg("N"),
        py::arg("K"), py::arg("w_scales") = 0,
        "out = x @ weight^T + bias; with w_scales (fp32 [N, K/32]) weight is int8 [N, K], scaled per group of 32");
  m.def("paged_decode_attention", &kestrel::cpu::paged_decode_attention, release(), py::arg("dtype"),
        py::arg("out"), py::arg("out_s0"), py::arg("out_s1"), py::arg("q"), py::arg("q_s0"), py::arg("q_s1"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("bt_stride"),
        py::arg("max_blocks_per_seq"), py::arg("context_lens"), py::arg("B"), py::arg("num_heads"),
        py::arg("num_kv_heads"), py::arg("head_size"), py::arg("block_size"), py::arg("num_blocks"),
        py::arg("scale"));

  // GGUF quantized weights on the CPU (csrc/cpu/gguf.h; engine/ops/gguf_quant.py)
  m.def("gguf_linear", &kestrel::cpu::gguf_linear, release(), py::arg("dtype"), py::arg("out"), py::arg("out_stride"),
        py::arg("x"), py::arg("x_stride"), py::arg("weight"), py::arg("row_bytes"), py::arg("qtype"), py::arg("bias"),
        py::arg("M"), py::arg("N"), py::arg("K"),
        "out = x @ W^T + bias with W in GGUF blocks (Q4_0, Q4_1, Q8_0: ggml type ids 2, 3, 8), N rows of row_bytes");
  m.def("gguf_get_rows", &kestrel::cpu::gguf_get_rows, release(), py::arg("dtype"), py::arg("out"), py::arg("weight"),
        py::arg("row_bytes"), py::arg("qtype"), py::arg("ids"), py::arg("count"), py::arg("N"), py::arg("K"),
        "out[t] = row ids[t] (int64) of the GGUF weight's N rows, dequantized to dtype: the embedding lookup");
  m.def("gguf_dequantize", &kestrel::cpu::gguf_dequantize, release(), py::arg("dtype"), py::arg("out"),
        py::arg("weight"), py::arg("row_bytes"), py::arg("qtype"), py::arg("N"), py::arg("K"),
        "out[N, K] = the GGUF weight's N rows dequantized to dtype, on the linear threads");
  m.def("moe_experts", &kestrel::cpu::moe_experts, release(), py::arg("dtype"), py::arg("out"), py::arg("x"),
        py::arg("x_stride"), py::arg("T"), py::arg("H"), py::arg("I"), py::arg("k"), py::arg("logits"), py::arg("E"),
        py::arg("route"), py::arg("ids"), py::arg("weights"), py::arg("w13"), py::arg("row_bytes13"),
        py::arg("qtype13"), py::arg("w2"), py::arg("row_bytes2"), py::arg("qtype2"),
        "A mixture of experts' routed step on GGUF experts (csrc/cpu/moe_ops.h): softmax top-k routing (route 1 / 2) "
        "and every chosen expert's gate_up, SiLU-and-mul and down, grouped by expert");
  m.def("gguf_has_kernel", &kestrel::cpu::gguf_has_kernel, py::arg("qtype"), "Whether a ggml type id has a kernel");
  m.def("gguf_isa", &kestrel::cpu::gguf_isa, "Level the GGUF kernels use now: scalar, avx2, avxvnni or avx512vnni");
  m.def("gguf_isas", &kestrel::cpu::gguf_isas, "GGUF kernel levels this build and CPU have");
  m.def("gguf_force_isa", &kestrel::cpu::gguf_force_isa, py::arg("name"),
        "Force the GGUF kernel level (one of gguf_isas()) or go back to 'auto' (the best one at or below the linear "
        "kernels' level); engine.ops.configure sets it at engine start (KernelConfig.gguf_isa)");

#ifdef KESTREL_WITH_COMM
  m.attr("has_comm") = true;
  kestrel::comm::bind(m);
#else
  m.attr("has_comm") = false;
#endif

#ifdef KESTREL_WITH_CUDA
  m.def("cuda_runtime_info", &kestrel::cuda::runtime_info);
  m.def("cuda_rms_norm", &kestrel::cuda::rms_norm, release());
  m.def("cuda_fused_add_rms_norm", &kestrel::cuda::fused_add_rms_norm, release());
  m.def("cuda_silu_and_mul", &kestrel::cuda::silu_and_mul, release());
  m.def("cuda_rotary_embedding", &kestrel::cuda::rotary_embedding, release());
  m.def("cuda_reshape_and_cache", &kestrel::cuda::reshape_and_cache, release());
  m.def("cuda_rotary_and_cache", &kestrel::cuda::rotary_and_cache, release());
  m.def("cuda_token_positions_and_slots", &kestrel::cuda::token_positions_and_slots, release());
  m.def("cuda_paged_decode_attention_workspace", &kestrel::cuda::paged_decode_attention_workspace);
  m.def("cuda_paged_decode_attention", &kestrel::cuda::paged_decode_attention, release());
  m.def("cuda_int_mma_linear", &kestrel::cuda::int_mma_linear, release());
  m.def("cuda_int_mma_dequantize", &kestrel::cuda::int_mma_dequantize, release());
  m.def("cuda_set_int_mma_warps", &kestrel::cuda::set_int_mma_warps, py::arg("warps"),
        "Warps per block of cuda_int_mma_linear (1..16), or 0: by the SM count (KernelConfig.int_mma_warps)");
#endif
}
