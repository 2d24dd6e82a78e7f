// CUDA side of the communication strategies (compiled when CMake finds nvcc; KESTREL_WITH_CUDA).
// Conventions of csrc/cuda/ops.h: raw pointers as integers, element counts, dtype code (0 f32, 1 bf16,
// 2 f16), the device index and the cudaStream_t as an integer. Launches never synchronise.
#pragma once

#include <cstdint>
#include <string>

namespace kestrel::comm::cuda {

// Page-lock and map host memory (a POSIX shared-memory segment) for `device`; returns the device pointer
// of `ptr` (cudaHostRegisterMapped | Portable). No peer access is involved: in PCIe mode (NCCL_P2P_DISABLE=1)
// this is the only way the engine's own strategies move data between GPUs.
uintptr_t host_register(uintptr_t ptr, int64_t bytes, int device);
void host_unregister(uintptr_t ptr);

// Zero-copy all-reduce through mapped host memory for small (decode) messages, in place on x:
// each block writes its part of x into this rank's slot (bufs + ((seq & 1) * world + rank) * slot_bytes),
// fences (__threadfence_system), raises flags[rank * max_blocks + block] = seq, spins until every peer's flag
// for the same block reaches seq (cache-bypassing loads of host memory), then sums the parts of all ranks
// in rank order in fp32. `abort` (host word, mapped) and a timeout end the spin; `err` then gets 1 / 2.
// n * dtype size must fit in slot_bytes; blocks <= max_blocks.
void mapped_all_reduce(int dtype, uintptr_t x, int64_t n, uintptr_t bufs, int64_t slot_bytes, uintptr_t flags,
                       int max_blocks, int rank, int world, uint32_t seq, uintptr_t abort, uintptr_t err,
                       double timeout_s, int blocks, int device, uintptr_t stream);

// Int8 packets (int8 all-reduce over torch.distributed): the padded message of world * c elements
// (c % 128 == 0) is world sub-ranges; packet j = [c int8 | c/128 fp32 scales], packet_bytes = c + c/32.
// Groups are Walsh-Hadamard rotated before the absmax quantisation and rotated back when dequantised (see
// comm_kernels.h); sums happen in the rotated domain.
// quantize: x -> world packets at out (packet j = sub-range j).
void int8_quantize_packets(int dtype, uintptr_t x, int64_t c, int world, uintptr_t out, int device,
                           uintptr_t stream);
// in: world packets (one sub-range from every rank) -> out: one packet, sum in fp32 (rank order), requantised.
void int8_reduce_packets(uintptr_t in, int64_t c, int world, uintptr_t out, int device, uintptr_t stream);
// in: world packets (sub-range j from rank j) -> x (world * c elements of dtype).
void int8_dequantize_packets(int dtype, uintptr_t in, int64_t c, int world, uintptr_t x, int device,
                             uintptr_t stream);

}  // namespace kestrel::comm::cuda
