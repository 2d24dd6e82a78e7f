// CPU dispatcher: picks the kernel table for the best ISA this CPU supports (or the one forced by
// force_isa, from KernelConfig.cpu_isa at engine start), validates arguments that would otherwise read or write out of bounds,
// and splits the work across OpenMP threads when it is large enough to pay for the fork/join.

#include "ops.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "gemm.h"
#include "gemm_pool.h"
#include "kernels.h"
#include "types.h"
#include "../cpu_features.h"

namespace kestrel::cpu {
namespace {

// ----------------------------------------------------------------------------------------------------
// ISA selection

// The CPU features of each level: csrc/cpu_features.h (kestrel::cpu_has_avx2 / _avx512 / _avx512bf16).
bool cpu_has_avx512bf16() {
#if defined(KESTREL_HAVE_AVX512BF16)
  return kestrel::cpu_has_avx512bf16();
#else
  return false;
#endif
}

const LinearTable* linear_for(const std::string& name) {
#if defined(KESTREL_X86_VARIANTS)
#if defined(KESTREL_HAVE_AVX512BF16)
  if (name == "avx512bf16") return cpu_has_avx512bf16() ? linear_table_avx512bf16() : nullptr;
#endif
  if (name == "avx512") return cpu_has_avx512() ? linear_table_avx512() : nullptr;
  if (name == "avx2") return cpu_has_avx2() ? linear_table_avx2() : nullptr;
#endif
  if (name == "scalar") return linear_table_scalar();
  return nullptr;
}

const LinearTable* best_linear() {
#if defined(KESTREL_X86_VARIANTS)
#if defined(KESTREL_HAVE_AVX512BF16)
  if (cpu_has_avx512bf16()) return linear_table_avx512bf16();
#endif
  if (cpu_has_avx512()) return linear_table_avx512();
  if (cpu_has_avx2()) return linear_table_avx2();
#endif
  return linear_table_scalar();
}

// "avx512bf16" is the "avx512" level plus the AVX512_BF16 extension (vdpbf16ps), which the linear kernels and
// the decode attention on bfloat16 caches use; the other kernels are the "avx512" ones compiled again.
const KernelTable* table_for(const std::string& name) {
#if defined(KESTREL_X86_VARIANTS)
#if defined(KESTREL_HAVE_AVX512BF16)
  if (name == "avx512bf16") return cpu_has_avx512bf16() ? table_avx512bf16() : nullptr;
#endif
  if (name == "avx512") return cpu_has_avx512() ? table_avx512() : nullptr;
  if (name == "avx2") return cpu_has_avx2() ? table_avx2() : nullptr;
#endif
  if (name == "scalar") return table_scalar();
  return nullptr;
}

const KernelTable* best_table() {
#if defined(KESTREL_X86_VARIANTS)
#if defined(KESTREL_HAVE_AVX512BF16)
  if (cpu_has_avx512bf16()) return table_avx512bf16();
#endif
  if (cpu_has_avx512()) return table_avx512();
  if (cpu_has_avx2()) return table_avx2();
#endif
  return table_scalar();
}

std::atomic<const KernelTable*> g_table{nullptr};
std::atomic<const LinearTable*> g_linear{nullptr};

const KernelTable& K() {
  const KernelTable* t = g_table.load(std::memory_order_acquire);
  if (t == nullptr) {
    t = best_table();  // force_isa (engine.ops.configure: KernelConfig.cpu_isa) changes it
    g_table.store(t, std::memory_order_release);
  }
  return *t;
}

const LinearTable& KL() {
  const LinearTable* t = g_linear.load(std::memory_order_acquire);
  if (t == nullptr) {
    t = best_linear();
    g_linear.store(t, std::memory_order_release);
  }
  return *t;
}

// ----------------------------------------------------------------------------------------------------
// Threads

int default_threads() {
#ifdef _OPENMP
  return std::max(1, omp_get_max_threads());
#else
  return 1;
#endif
}

std::atomic<int> g_threads{0};

int threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n <= 0) {
    n = default_threads();
    g_threads.store(n, std::memory_order_relaxed);
  }
  return n;
}

// A thread should get at least this much work (roughly elements read + written, weighted up for heavier
// kernels) before we fork: some 50-150 us of one core's time. An OpenMP fork/join costs a few us when
// the cores are free, but milliseconds when they are oversubscribed (a waiting thread spins through its
// time slice while the one it waits for is descheduled: measured 30 us -> 12 ms for decode attention on
// a loaded 2-core machine). So decode-sized calls (one token per sequence, contexts up to ~1k tokens)
// stay on the calling thread, and only prefill batches and long-context attention spread out, where
// the gain is large (attention, 2k context, 9/3 heads: 181 us on 1 thread, 54 us on 4, 40 us on 8).
constexpr int64_t kMinWorkPerThread = 512 * 1024;

int threads_for(int64_t items, int64_t total_work) {
  int64_t nt = threads();
  nt = std::min<int64_t>(nt, items);
  nt = std::min<int64_t>(nt, total_work / kMinWorkPerThread);
#ifdef _OPENMP
  if (omp_in_parallel()) nt = 1;  // called from inside a parallel region: stay serial
#endif
  return int(std::max<int64_t>(nt, 1));
}

// f(begin, end) over [0, n), split in contiguous even ranges.
template <class F>
void parallel_for(int64_t n, int64_t work_per_item, const F& f) {
  if (n <= 0) return;
  const int nt = threads_for(n, n * work_per_item);
  if (nt <= 1) {
    f(int64_t(0), n);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
  {
    const int64_t tid = omp_get_thread_num(), cnt = omp_get_num_threads();
    const int64_t b = n * tid / cnt, e = n * (tid + 1) / cnt;
    if (b < e) f(b, e);
  }
#endif
}

// Paged decode attention runs on the linear kernels' pool (gemm_pool.h pool_for): it runs between the GEMVs of a
// decode step, and an OpenMP team there left its threads spinning (libgomp's default wait policy) on the cores the
// next GEMV's pool workers needed. Measured on the 2-core dev machine, 1B Llama Q4_0 with --quantization gguf,
// batch-1 decode: 17.6-17.9 tok/s with OpenMP here, 26.4-27.1 on the pool (SmolLM2: the same within the noise).

void check(bool ok, const char* msg) {
  if (!ok) throw std::invalid_argument(msg);
}

void check_dtype(int dt) { check(dt == kFloat32 || dt == kBFloat16 || dt == kFloat16, "dtype code must be 0, 1 or 2"); }

template <class P>
P* ptr(uintptr_t p) {
  return reinterpret_cast<P*>(p);
}

}  // namespace

// ------------------------------------------------------------------------------------------------------
// Introspection

std::string isa_name() { return K().name; }

void force_isa(const std::string& name) {
  if (name == "auto" || name.empty()) {
    g_table.store(best_table(), std::memory_order_release);
    g_linear.store(best_linear(), std::memory_order_release);
    return;
  }
  const KernelTable* t = table_for(name);
  const LinearTable* l = linear_for(name);
  if (t == nullptr || l == nullptr) {
    throw std::invalid_argument("CPU ISA level '" + name +
                                "' is not available here (this build and CPU support: " + [] {
                                  std::string s;
                                  for (auto& n : available_isas()) s += (s.empty() ? "" : ", ") + n;
                                  return s;
                                }() + ")");
  }
  g_table.store(t, std::memory_order_release);
  g_linear.store(l, std::memory_order_release);
}

std::string linear_isa() { return KL().name; }

const LinearTable& active_linear_table() { return KL(); }

std::vector<std::string> available_isas() {
  std::vector<std::string> v{"scalar"};
  if (cpu_has_avx2()) v.push_back("avx2");
  if (cpu_has_avx512()) v.push_back("avx512");
  if (cpu_has_avx512bf16()) v.push_back("avx512bf16");
  return v;
}

void set_num_threads(int n) {
  check(n >= 1, "set_num_threads: n must be >= 1");
  g_threads.store(n, std::memory_order_relaxed);
}

int get_num_threads() { return threads(); }

bool has_openmp() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

// ------------------------------------------------------------------------------------------------------
// Kernels

void rms_norm(int dt, uintptr_t out, int64_t os, uintptr_t x, int64_t xs, uintptr_t w, int64_t T, int64_t H,
              double eps) {
  check_dtype(dt);
  check(T >= 0 && H > 0, "rms_norm: need T >= 0 and H > 0");
  const auto& k = K();
  parallel_for(T, 2 * H, [&](int64_t b, int64_t e) {
    k.rms_norm(dt, ptr<void>(out), os, ptr<const void>(x), xs, ptr<const void>(w), H, float(eps), b, e);
  });
}

void fused_add_rms_norm(int dt, uintptr_t x, int64_t xs, uintptr_t r, int64_t rs, uintptr_t w, int64_t T,
                        int64_t H, double eps) {
  check_dtype(dt);
  check(T >= 0 && H > 0, "fused_add_rms_norm: need T >= 0 and H > 0");
  const auto& k = K();
  parallel_for(T, 4 * H, [&](int64_t b, int64_t e) {
    k.fused_add_rms_norm(dt, ptr<void>(x), xs, ptr<void>(r), rs, ptr<const void>(w), H, float(eps), b, e);
  });
}

void rotary_embedding(int dt, uintptr_t positions, uintptr_t q, int64_t qs, uintptr_t kk, int64_t ks, int64_t T,
                      int64_t nh, int64_t nkv, int64_t hd, uintptr_t cache, int64_t max_pos, int64_t rot_dim,
                      bool is_neox) {
  check_dtype(dt);
  check(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= hd, "rotary_embedding: rot_dim must be even and <= head_size");
  check(hd <= kAttnMaxHeadDim, "rotary_embedding: head_size must be <= 512");
  const int64_t* pos = ptr<const int64_t>(positions);
  for (int64_t t = 0; t < T; ++t)
    check(pos[t] >= 0 && pos[t] < max_pos, "rotary_embedding: a position is outside the cos/sin cache");
  RotaryParams p{dt, pos, ptr<void>(q), qs, ptr<void>(kk), ks, nh, nkv, hd, rot_dim, ptr<const float>(cache), is_neox};
  const auto& k = K();
  parallel_for(T, 2 * (nh + nkv) * rot_dim, [&](int64_t b, int64_t e) { k.rotary(p, b, e); });
}

void silu_and_mul(int dt, uintptr_t out, int64_t os, uintptr_t x, int64_t xs, int64_t T, int64_t I) {
  check_dtype(dt);
  check(T >= 0 && I > 0, "silu_and_mul: need T >= 0 and I > 0");
  const auto& k = K();
  parallel_for(T, 6 * I, [&](int64_t b, int64_t e) {
    k.silu_and_mul(dt, ptr<void>(out), os, ptr<const void>(x), xs, I, b, e);
  });
}

void token_positions_and_slots(uintptr_t query_start, uintptr_t context_lens, uintptr_t block_tables,
                               int64_t bt_stride, int64_t width, int64_t S, int64_t T, int64_t bs,
                               uintptr_t positions, uintptr_t slots) {
  check(S >= 0 && T >= 0 && bs > 0 && width >= 0, "token_positions_and_slots: need S, T, width >= 0, block_size > 0");
  const int32_t* qs = ptr<const int32_t>(query_start);
  const int32_t* ctx = ptr<const int32_t>(context_lens);
  const int32_t* table = ptr<const int32_t>(block_tables);
  int64_t* pos = ptr<int64_t>(positions);
  int64_t* slot = ptr<int64_t>(slots);
  check(S == 0 ? T == 0 : (qs[0] == 0 && qs[S] == T), "token_positions_and_slots: query_start must run from 0 to T");
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q0 = qs[s], n = qs[s + 1] - q0, first = int64_t(ctx[s]) - n;
    check(n >= 0 && first >= 0, "token_positions_and_slots: a sequence has more query tokens than context");
    check(n == 0 || (first + n - 1) / bs < width, "token_positions_and_slots: a context is past its block table row");
    const int32_t* row = table + s * bt_stride;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = first + i;
      pos[q0 + i] = p;
      slot[q0 + i] = int64_t(row[p / bs]) * bs + p % bs;
    }
  }
}

void reshape_and_cache(int dt, uintptr_t key, int64_t ks0, int64_t ks1, uintptr_t value, int64_t vs0, int64_t vs1,
                       uintptr_t k_cache, uintptr_t v_cache, uintptr_t slot_mapping, int64_t T, int64_t nkv,
                       int64_t hd, int64_t num_slots) {
  check_dtype(dt);
  const int64_t* slots = ptr<const int64_t>(slot_mapping);
  for (int64_t t = 0; t < T; ++t)
    check(slots[t] < num_slots, "reshape_and_cache: a slot is past the end of the cache");
  const size_t esz = dt == kFloat32 ? 4 : 2;
  const char* kp = ptr<const char>(key);
  const char* vp = ptr<const char>(value);
  char* kc = ptr<char>(k_cache);
  char* vc = ptr<char>(v_cache);
  const int64_t row = nkv * hd;
  parallel_for(T, 4 * row, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t s = slots[t];
      if (s < 0) continue;
      char* kd = kc + size_t(s * row) * esz;
      char* vd = vc + size_t(s * row) * esz;
      if (ks1 == hd && vs1 == hd) {
        std::memcpy(kd, kp + size_t(t * ks0) * esz, size_t(row) * esz);
        std::memcpy(vd, vp + size_t(t * vs0) * esz, size_t(row) * esz);
      } else {
        for (int64_t h = 0; h < nkv; ++h) {
          std::memcpy(kd + size_t(h * hd) * esz, kp + size_t(t * ks0 + h * ks1) * esz, size_t(hd) * esz);
          std::memcpy(vd + size_t(h * hd) * esz, vp + size_t(t * vs0 + h * vs1) * esz, size_t(hd) * esz);
        }
      }
    }
  });
}

// y = x @ W^T + b. The per-ISA kernels (gemm_*.cpp) do all M rows for a range of output columns; this
// splits N across threads in chunks aligned to the kernel's block / panel width:
//  - GEMV regime (decode): chunks taken one at a time by the threads of the linear pool (gemm_pool.h:
//    the caller never waits for a worker that has not started, so a busy machine costs at most the
//    second core's help, not a time slice per call: measured 3.5 MB GEMV 0.2 ms -> 8 ms and a decode
//    step 4x slower with an OpenMP region on the loaded 2-core dev machine).
//  - GEMM regime (prefill): one contiguous range per thread, on the pool when OpenMP's workers sleep
//    between regions (gemm_pool.h gemm_on_pool: OMP_WAIT_POLICY=passive, the engine's default), else in an
//    OpenMP region. With spinning workers (libgomp's default) the region is better: prefill interleaves the
//    linears with OpenMP regions of torch (attention) and of the kernels above, whose idle workers
//    spin for a while after each region; a separate pool's worker then finds its core taken and the
//    linears ran at ~1.3 cores (prefill linears 421-469 ms against 291 ms with OMP_WAIT_POLICY=passive
//    and 296 ms for torch's own GEMM, measured side by side on the quiet dev machine). Sharing libgomp's
//    team avoids that (306 ms).
//
// Threads: a linear is memory-bound at decode sizes (the weights are streamed once: ~20 GB/s from one
// core of the dev machine, ~28 with two, which is what a plain streaming read gets there) and
// compute-bound for prefill. Use more than one when a single thread would need more than kLinearMinUs
// by a rough estimate of both: SmolLM2's smallest decode projection (576 x 576 bf16, 0.66 MB) went
// 37 -> 32 us with two; tiny calls stay on the calling thread.
namespace {

constexpr double kLinearBytesPerUs = 20e3;   // one core streaming weights from DRAM
constexpr double kLinearFlopsPerUs = 100e3;  // one core, fp32-accumulated FMAs, well blocked
constexpr double kLinearMinUs = 15.0;
// Chunks: ~8 per thread (balance, and a preempted worker holds up the caller for one chunk at most),
// between 64 KB and 1 MB of weights each (claims are atomics on a shared line; each chunk restarts a
// weight stream).
constexpr int64_t kLinearChunksPerThread = 8;
constexpr double kLinearChunkMinBytes = 64 * 1024, kLinearChunkMaxBytes = 1024 * 1024;

struct LinearJob {
  const LinearTable* table;
  const LinearParams* p;
  int64_t cols;  // per chunk
  std::atomic<bool> failed{false};
};

void linear_chunk(void* ctx, int64_t c) {
  auto* job = static_cast<LinearJob*>(ctx);
  const int64_t n0 = c * job->cols, n1 = std::min(job->p->N, n0 + job->cols);
  try {
    job->table->linear(*job->p, n0, n1);
  } catch (...) {  // scratch allocation: reported by the caller once every chunk has finished
    job->failed.store(true, std::memory_order_relaxed);
  }
}

// One call of the kernels over all N columns of p's M rows, threaded as described above.
void run_linear(const LinearTable& L, const LinearParams& p) {
  const int64_t N = p.N, K = p.K, M = p.M;
  const int dt = p.dtype;
  const int64_t align = std::max<int64_t>(1, L.n_align(p));
  const double row_bytes =
      p.w_scales ? double(K) * (1.0 + 4.0 / kQ8Group) : double(K) * (dt == kFloat32 ? 4 : 2);
  const double bytes = double(N) * row_bytes;
  const double flops = 2.0 * double(M) * double(N) * double(K);
  const double est_us = std::max(bytes / kLinearBytesPerUs, flops / kLinearFlopsPerUs);
  int64_t nt = std::min<int64_t>(threads(), (N + align - 1) / align);
  nt = std::min<int64_t>(nt, int64_t(est_us / kLinearMinUs));
#ifdef _OPENMP
  if (omp_in_parallel()) nt = 1;
#endif
  if (nt <= 1) {
    L.linear(p, 0, N);
    return;
  }
  const bool gemm = M > L.gemv_max_m && !p.gemv_any_m;
  const bool gemm_pool = gemm && gemm_on_pool();
#ifdef _OPENMP
  if (gemm && !gemm_pool) {
    const int64_t chunks = (N + align - 1) / align;
    bool failed = false;
#pragma omp parallel num_threads(int(nt)) reduction(|| : failed)
    {
      const int64_t tid = omp_get_thread_num(), cnt = omp_get_num_threads();
      const int64_t b = std::min(N, chunks * tid / cnt * align), e = std::min(N, chunks * (tid + 1) / cnt * align);
      try {
        if (b < e) L.linear(p, b, e);
      } catch (...) {  // scratch allocation; exceptions must not leave the region
        failed = true;
      }
    }
    if (failed) throw std::bad_alloc();
    return;
  }
#endif
  const double chunk_bytes =
      std::min(kLinearChunkMaxBytes, std::max(kLinearChunkMinBytes, bytes / double(kLinearChunksPerThread * nt)));
  const int64_t blocks = gemm_pool ? ((N + align - 1) / align + nt - 1) / nt  // GEMM: one aligned range per thread
                                   : std::max<int64_t>(1, int64_t(chunk_bytes / (row_bytes * double(align))));
  LinearJob job;
  job.table = &L;
  job.p = &p;
  job.cols = blocks * align;
  pool_run(int(nt), (N + job.cols - 1) / job.cols, linear_chunk, &job);
  if (job.failed.load(std::memory_order_relaxed)) throw std::bad_alloc();
}

}  // namespace

void linear(int dt_flags, uintptr_t out, int64_t os, uintptr_t x, int64_t xs, uintptr_t w, uintptr_t bias,
            int64_t M, int64_t N, int64_t K, uintptr_t w_scales) {
  check((dt_flags & ~(kDTypeMask | kBatchInvariant)) == 0, "linear: unknown option bits in the dtype code");
  const int dt = dt_flags & kDTypeMask;
  const bool invariant = (dt_flags & kBatchInvariant) != 0;
  check_dtype(dt);
  check(M >= 0 && N >= 0 && K >= 0, "linear: sizes must be >= 0");
  check(w_scales == 0 || K % kQ8Group == 0, "linear: int8 weights need K to be a multiple of 32");
  check(M <= 1 || os >= N, "linear: out's row stride must be >= N (rows must not overlap)");
  (void)xs;  // x's rows may overlap (e.g. a broadcast x): they are only read
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: out = bias (or 0)
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        const size_t o = size_t(m * os + n);
        switch (dt) {
          case kFloat32: ptr<float>(out)[o] = bias ? ptr<const float>(bias)[n] : 0.f; break;
          case kBFloat16: ptr<bf16_t>(out)[o] = bias ? ptr<const bf16_t>(bias)[n] : bf16_t{0}; break;
          default: ptr<f16_t>(out)[o] = bias ? ptr<const f16_t>(bias)[n] : f16_t{0}; break;
        }
      }
    }
    return;
  }
  LinearParams p{dt, ptr<const void>(x), xs, ptr<const void>(w), ptr<const void>(bias), ptr<void>(out), os, M, N, K,
                 ptr<const float>(w_scales)};
  const LinearTable& L = KL();
  if (!invariant) {
    run_linear(L, p);
    return;
  }
  // Batch-invariant: the GEMV kernels for every row, kInvariantRows rows per call (a row's result is the same
  // in any block: gemm_impl.h), so a request's rows come out the same bits whatever else the step holds.
  p.gemv_any_m = true;
  const size_t esz = dt == kFloat32 ? 4 : 2;
  for (int64_t m0 = 0; m0 < M; m0 += kInvariantRows) {
    LinearParams pb = p;
    pb.M = std::min<int64_t>(kInvariantRows, M - m0);
    pb.x = ptr<const char>(x) + size_t(m0 * xs) * esz;
    pb.out = ptr<char>(out) + size_t(m0 * os) * esz;
    run_linear(L, pb);
  }
}

// Batch-invariant mode (types.h kBatchInvariant): every context is cut into partitions of this many tokens
// (rounded up to whole blocks), whatever the batch and the threads, so a sequence's result depends on its own
// context only. A sequence that fits one partition comes out as without partitions (its one partial softmax is
// rescaled by exp(0) = 1).
constexpr int64_t kInvariantPartTokens = 512;

void paged_decode_attention(int dt_flags, uintptr_t out, int64_t os0, int64_t os1, uintptr_t q, int64_t qs0,
                            int64_t qs1, uintptr_t k_cache, uintptr_t v_cache, uintptr_t block_tables,
                            int64_t bt_stride, int64_t max_blocks, uintptr_t context_lens, int64_t B, int64_t nh,
                            int64_t nkv, int64_t hd, int64_t bs, int64_t num_blocks, double scale) {
  check((dt_flags & ~(kDTypeMask | kBatchInvariant)) == 0,
        "paged_decode_attention: unknown option bits in the dtype code");
  const int dt = dt_flags & kDTypeMask;
  const bool invariant = (dt_flags & kBatchInvariant) != 0;
  check_dtype(dt);
  check(nkv > 0 && nh % nkv == 0, "paged_decode_attention: num_heads must be a multiple of num_kv_heads");
  check(hd > 0 && hd <= kAttnMaxHeadDim, "paged_decode_attention: head_size must be in 1..512");
  check(bs > 0, "paged_decode_attention: block_size must be > 0");
  const int32_t* bt = ptr<const int32_t>(block_tables);
  const int32_t* ctx = ptr<const int32_t>(context_lens);
  int64_t max_ctx = 0, total_ctx = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t c = ctx[b];
    check(c >= 0 && c <= max_blocks * bs,
          "paged_decode_attention: a context length is negative or exceeds the block table's capacity");
    for (int64_t i = 0, n = (c + bs - 1) / bs; i < n; ++i) {
      const int64_t blk = bt[b * bt_stride + i];
      check(blk >= 0 && blk < num_blocks, "paged_decode_attention: a block table entry is outside the cache");
    }
    max_ctx = std::max(max_ctx, c);
    total_ctx += c;
  }

  // Spans (kernels.h): a row continues the previous row's span where its context is no shorter and the previous
  // row's blocks are its first ones (a verify pass's rows c, c + 1, ..., c + k of one request), so their attention
  // reads the cache once. Decided here from the tables on every call (a CPU decode tape's replays included); a row
  // gets the same result in a span as alone (the kernel's arithmetic per (row, head) does not depend on it).
  const int64_t G = nh / nkv;
  thread_local std::vector<AttnPiece> pieces;
  pieces.clear();
  for (int64_t b = 0; b < B;) {
    int64_t e = b + 1;
    for (; e < B && ctx[e] >= ctx[e - 1]; ++e) {
      const int32_t* prev = bt + (e - 1) * bt_stride;
      const int32_t* cur = bt + e * bt_stride;
      if (!std::equal(prev, prev + (ctx[e - 1] + bs - 1) / bs, cur)) break;
    }
    const int64_t slots = (e - b) * G, per = e - b == 1 ? kAttnGroup : kAttnMaxSlots;
    for (int64_t s0 = 0; s0 < slots; s0 += per) pieces.push_back({b, e - 1, s0, std::min(per, slots - s0)});
    b = e;
  }
  const int64_t base_items = int64_t(pieces.size()) * nkv;
  const int64_t work = std::max<int64_t>(total_ctx, 1) * 2 * hd * (nkv + nh);
  const int nt = threads_for(base_items * std::max<int64_t>(1, (max_ctx + 63) / 64), work);

  AttnParams p{};
  p.dtype = dt;
  p.out = ptr<void>(out);
  p.out_s0 = os0;
  p.out_s1 = os1;
  p.q = ptr<const void>(q);
  p.q_s0 = qs0;
  p.q_s1 = qs1;
  p.k_cache = ptr<const void>(k_cache);
  p.v_cache = ptr<const void>(v_cache);
  p.block_tables = bt;
  p.bt_stride = bt_stride;
  p.context_lens = ctx;
  p.B = B;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.head_size = hd;
  p.block_size = bs;
  p.scale = float(scale);
  p.pieces = pieces.data();
  p.num_parts = 1;
  p.part_tokens = std::max<int64_t>(max_ctx, 1);
  p.ws = nullptr;

  if (invariant) {
    const int64_t pt = (kInvariantPartTokens + bs - 1) / bs * bs;
    const int64_t parts = (max_ctx + pt - 1) / pt;
    if (parts > 1) {
      p.num_parts = parts;
      p.part_tokens = pt;
    }
  } else if (nt > 1 && base_items < 2 * nt) {
    // Too few (sequence, kv head) items to keep every thread busy: split the context (split-K) into
    // partitions of >= 64 tokens, about 4 items per thread, and combine the partial softmaxes after.
    const int64_t want = (4 * nt + base_items - 1) / base_items;
    int64_t pt = std::max<int64_t>(64, (max_ctx + want - 1) / want);
    pt = (pt + bs - 1) / bs * bs;
    const int64_t parts = (max_ctx + pt - 1) / pt;
    if (parts > 1) {
      p.num_parts = parts;
      p.part_tokens = pt;
    }
  }
  const auto& k = K();
  const int64_t items = base_items * p.num_parts;
  if (p.num_parts == 1) {
    if (nt <= 1) {
      k.attn_items(p, 0, items);
      return;
    }
    pool_for(nt, items, [&](int64_t i) { k.attn_items(p, i, i + 1); });
    return;
  }
  thread_local std::vector<float> ws;
  const size_t need = size_t(B * nh * p.num_parts * (2 + hd));
  if (ws.size() < need) ws.resize(need);
  p.ws = ws.data();
  if (invariant && (nt <= 1 || base_items >= 2 * nt)) {
    // Enough (sequence, kv head, head group) items for the threads: each one runs its partitions and combines
    // its heads' partial softmaxes itself, one worksharing loop (the same arithmetic as below, in any order;
    // a second barrier costs milliseconds when the cores are oversubscribed).
    const int64_t P = p.num_parts;
    auto whole = [&](int64_t i) {
      k.attn_items(p, i * P, (i + 1) * P);
      const AttnPiece& pc = p.pieces[i / nkv];  // (not `pieces`: thread_local, and this runs on the pool)
      const int64_t kvh = i % nkv;
      for (int64_t s = pc.slot0; s < pc.slot0 + pc.num_slots; ++s) {
        const int64_t bh = (pc.row0 + s / G) * nh + kvh * G + s % G;
        k.attn_reduce(p, bh, bh + 1);
      }
    };
    if (nt <= 1) {
      for (int64_t i = 0; i < base_items; ++i) whole(i);
      return;
    }
    pool_for(nt, base_items, whole);
    return;
  }
  pool_for(nt, items, [&](int64_t i) { k.attn_items(p, i, i + 1); });
  pool_for(nt, B * nh, [&](int64_t i) { k.attn_reduce(p, i, i + 1); });
}

}  // namespace kestrel::cpu
