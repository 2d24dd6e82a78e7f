// A small work-sharing pool for the linear kernels' GEMV (decode) regime (gemm_pool.cpp).
//
// Why not an OpenMP parallel region: its closing barrier waits for every thread of the team, so when
// another process holds the second core, a call that forks waits for the worker's next time slice
// (measured on the shared 2-core dev machine: 3.5 MB GEMV 0.12 ms -> 8 ms; a decode step 4x slower
// with 2 threads than with 1). Here the work is split into chunks that threads claim one at a time,
// the caller from the front, the workers from the back (so each streams through contiguous weight
// rows): the caller never waits for a worker that has not started (it takes the unclaimed chunks
// itself), only for chunks a worker has claimed and is running. With free cores it behaves like a
// static split; workers spin briefly between calls (a decode step issues ~120 of them back to back)
// and then sleep. (The GEMM regime uses OpenMP instead: see linear() in dispatch.cpp.)
#pragma once

#include <cstdint>
#include <string>

namespace kestrel::cpu {

// Calls fn(ctx, c) once for each chunk c in [0, chunks), on the calling thread and up to threads - 1
// pool workers; returns when all are done. Serial when threads <= 1, chunks <= 1, or the pool is busy
// with another caller's job. fn must not throw.
void pool_run(int threads, int64_t chunks, void (*fn)(void* ctx, int64_t chunk), void* ctx);

// pool_run for a callable: f(i) for each i in [0, n), claimed one at a time by the caller and up to nt - 1 workers
// (as OpenMP's schedule(dynamic, 1) would). f must not throw.
template <class F>
void pool_for(int nt, int64_t n, const F& f) {
  if (nt <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  pool_run(nt, n, [](void* ctx, int64_t i) { (*static_cast<const F*>(ctx))(i); },
           const_cast<void*>(static_cast<const void*>(&f)));
}

// Whether the GEMM regime (prefill: the float GEMM, the GGUF panels and their dequantization) runs on this pool
// too, rather than in OpenMP regions. With OpenMP's workers sleeping after each region (OMP_WAIT_POLICY=passive,
// the engine's default: engine/__init__.py), every region wakes them again, and a prefill opens hundreds (on the
// 2-core Zen 5 dev VM, whose idle vCPUs halt, the 1B Q4_0 prefill lost ~22%: 268-271 against 345 tok/s); the
// pool's workers stay awake between calls. With spinning OpenMP workers (libgomp's default), sharing OpenMP's team
// is faster (the workers would take this pool's cores: dispatch.cpp run_linear). set_gemm_threads("pool" / "openmp")
// forces either (KernelConfig.gemm_threads, engine.ops.configure; a benchmark may compare both in one process);
// "auto": by OMP_WAIT_POLICY, read once.
bool gemm_on_pool();
void set_gemm_threads(const std::string& mode);

}  // namespace kestrel::cpu
