// Dispatcher of the GGUF linear kernels (gguf.h): ISA selection, argument validation, the two regimes and their
// threads (the decode GEMV on the linear pool, gemm_pool.h; the prefill panels and the dequantization where
// dispatch.cpp's run_linear puts its GEMM, for the same reasons: on the pool when OpenMP's workers sleep between
// regions, gemm_on_pool, else in an OpenMP region).

#include "gguf_ops.h"

#include <algorithm>
#include <atomic>
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
#include "gguf.h"
#include "ops.h"
#include "types.h"
#include "../cpu_features.h"

namespace kestrel::cpu {
namespace {

// ------------------------------------------------------------------------------------------------------
// ISA levels: scalar < avx2 < avxvnni < avx512vnni (each needs the CPU feature and a compiler that knew it).

// The CPU features of each level: csrc/cpu_features.h; the levels the compiler could not build are left out.
bool has(const char* feature) {
#if defined(KESTREL_X86_VARIANTS)
  if (std::strcmp(feature, "avx2") == 0) return cpu_has_avx2();
#if defined(KESTREL_HAVE_AVXVNNI)
  if (std::strcmp(feature, "avxvnni") == 0) return cpu_has_avxvnni();
#endif
#if defined(KESTREL_HAVE_AVX512VNNI)
  if (std::strcmp(feature, "avx512vnni") == 0) return cpu_has_avx512vnni();
#endif
#endif
  (void)feature;
  return false;
}

const GGUFTable* table_for(const std::string& name) {
  if (name == "scalar") return gguf_table_scalar();
#if defined(KESTREL_X86_VARIANTS)
  if (name == "avx2" && has("avx2")) return gguf_table_avx2();
#if defined(KESTREL_HAVE_AVXVNNI)
  if (name == "avxvnni" && has("avxvnni")) return gguf_table_avxvnni();
#endif
#if defined(KESTREL_HAVE_AVX512VNNI)
  if (name == "avx512vnni" && has("avx512vnni")) return gguf_table_avx512vnni();
#endif
#endif
  return nullptr;
}

// The best level at or below the linear kernels' level (so force_isa("avx2") also keeps these
// kernels off AVX-512).
const GGUFTable* auto_table() {
  const std::string lin = linear_isa();
  std::vector<std::string> levels = gguf_isas();
  for (auto it = levels.rbegin(); it != levels.rend(); ++it) {
    if (lin == "scalar" && *it != "scalar") continue;
    if (lin == "avx2" && *it == "avx512vnni") continue;
    return table_for(*it);
  }
  return gguf_table_scalar();
}

std::atomic<const GGUFTable*> g_forced{nullptr};  // gguf_force_isa (KernelConfig.gguf_isa); null: auto

const GGUFTable& T() {
  const GGUFTable* t = g_forced.load(std::memory_order_acquire);
  return t != nullptr ? *t : *auto_table();
}

void check(bool ok, const char* msg) {
  if (!ok) throw std::invalid_argument(msg);
}

template <class P>
P* ptr(uintptr_t p) {
  return reinterpret_cast<P*>(p);
}

// The cost model of dispatch.cpp's run_linear (a thread gets at least kMinUs of work), with this kernel's measured
// rate: ~8 GB/s of GGUF bytes from DRAM per core on the dev machine (the integer work per byte is higher than the
// float GEMV's), so SmolLM2's q/k/v and o projections (0.2-0.35 MB in Q4_1) also use two threads.
constexpr double kBytesPerUs = 8e3;
constexpr double kIntOpsPerUs = 60e3;     // integer GEMV: multiply-adds (2 ops) per us and core
constexpr double kFlopsPerUs = 100e3;     // float GEMM on dequantized panels
constexpr double kMinUs = 10.0;
constexpr int64_t kChunksPerThread = 8;
constexpr double kChunkMinBytes = 64 * 1024, kChunkMaxBytes = 1024 * 1024;
constexpr double kPanelBytes = 256 * 1024;  // dequantized panel (fp32 / bf16): stays in L2 while M rows stream by

struct GemvJob {
  const GGUFTable* table;
  const GGUFParams* p;
  int64_t rows;  // per chunk
};

void gemv_chunk(void* ctx, int64_t c) {
  auto* job = static_cast<GemvJob*>(ctx);
  const int64_t n0 = c * job->rows, n1 = std::min(job->p->N, n0 + job->rows);
  job->table->gemv(*job->p, n0, n1);
}

void run_gemv(const GGUFTable& G, GGUFParams& p, const void* x, int64_t xs) {
  const int64_t M = p.M, N = p.N, K = p.K, nb = K / kGGUFBlock;
  static thread_local std::vector<int8_t> xq;
  static thread_local std::vector<float> xds;
  xq.resize(size_t(M * K));
  xds.resize(size_t(2 * M * nb));
  G.quantize_x(p.dtype, x, xs, K, 0, M, xq.data(), xds.data(), xds.data() + M * nb);
  p.xq = xq.data();
  p.xd = xds.data();
  p.xs = xds.data() + M * nb;
  const double bytes = double(N) * double(p.row_bytes);
  const double est_us = std::max(bytes / kBytesPerUs, 2.0 * double(M) * double(N) * double(K) / kIntOpsPerUs);
  int64_t nt = std::min<int64_t>(get_num_threads(), N);
  nt = std::min<int64_t>(nt, int64_t(est_us / kMinUs));
#ifdef _OPENMP
  if (omp_in_parallel()) nt = 1;
#endif
  if (nt <= 1) {
    G.gemv(p, 0, N);
    return;
  }
  const double chunk_bytes =
      std::min(kChunkMaxBytes, std::max(kChunkMinBytes, bytes / double(kChunksPerThread * nt)));
  GemvJob job{&G, &p, std::max<int64_t>(1, int64_t(chunk_bytes / double(p.row_bytes)))};
  pool_run(int(nt), (N + job.rows - 1) / job.rows, gemv_chunk, &job);
}

// x rounded to its Q8 blocks, back in x's dtype: q * d (exact in float32, rounded once in bfloat16 / float16).
template <class T>
void fake_quantize(const int8_t* xq, const float* xd, int64_t m0, int64_t m1, int64_t K, T* out) {
  const int64_t nb = K / kGGUFBlock;
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t k = 0; k < K; ++k)
      out[m * K + k] = from_f32<T>(float(xq[m * K + k]) * xd[m * nb + k / kGGUFBlock]);
}

// Prefill: x quantized per block as the decode kernels quantize it (so that a row's result does not depend on how
// many rows share its call, beyond float rounding: decodes batched with a prefill chunk get what they get alone),
// then panels of `rows` weight rows dequantized to x's dtype, each multiplied by all M rows of that x with the
// float kernels of the active linear table (as a GEMM of N = rows).
void run_panels(const GGUFTable& G, const GGUFParams& p, const void* x_in, int64_t xs_in) {
  const LinearTable& L = active_linear_table();
  const int64_t M = p.M, N = p.N, K = p.K, nb = K / kGGUFBlock;
  const size_t esz = p.dtype == kFloat32 ? 4 : 2;
  static thread_local std::vector<int8_t> xq;
  static thread_local std::vector<float> xds;
  static thread_local std::vector<char> xf;
  xq.resize(size_t(M * K));
  xds.resize(size_t(2 * M * nb));
  xf.resize(size_t(M * K) * esz);
  // The caller's buffers, by pointer: a thread_local named inside the OpenMP region would be the worker's own.
  int8_t* const q = xq.data();
  float* const d = xds.data();
  char* const f = xf.data();
  auto quantize_rows = [&](int64_t m0, int64_t m1) {  // x rows [m0, m1) -> their quantized values in f
    G.quantize_x(p.dtype, x_in, xs_in, K, m0, m1, q, d, d + M * nb);
    switch (p.dtype) {
      case kFloat32: fake_quantize(q, d, m0, m1, K, reinterpret_cast<float*>(f)); break;
      case kBFloat16: fake_quantize(q, d, m0, m1, K, reinterpret_cast<bf16_t*>(f)); break;
      default: fake_quantize(q, d, m0, m1, K, reinterpret_cast<f16_t*>(f)); break;
    }
  };
  const void* x = f;
  const int64_t xs = K;
  const int64_t align = 16;
  const int64_t rows = std::max<int64_t>(align, int64_t(kPanelBytes / double(K * esz)) / align * align);
  const int64_t panels = (N + rows - 1) / rows;
  auto do_panels = [&](int64_t q0, int64_t q1) {
    static thread_local std::vector<char> scratch;
    scratch.resize(size_t(rows * K) * esz);
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t n0 = q * rows, n1 = std::min(N, n0 + rows);
      G.dequantize(p.qtype, p.dtype, p.w, p.row_bytes, K, n0, n1, scratch.data());
      LinearParams lp{p.dtype, x, xs, scratch.data(),
                      p.bias ? static_cast<const char*>(p.bias) + size_t(n0) * esz : nullptr,
                      static_cast<char*>(p.out) + size_t(n0) * esz, p.out_stride, M, n1 - n0, K};
      L.linear(lp, 0, n1 - n0);
    }
  };
  const double est_us = 2.0 * double(M) * double(N) * double(K) / kFlopsPerUs;
  int64_t nt = std::min<int64_t>(get_num_threads(), panels);
  nt = std::min<int64_t>(nt, int64_t(est_us / kMinUs));
#ifdef _OPENMP
  if (omp_in_parallel()) nt = 1;
#endif
  if (nt > 1 && gemm_on_pool()) {  // x's rows quantized in nt ranges, then the panels claimed one at a time
    pool_for(int(nt), nt, [&](int64_t c) { quantize_rows(M * c / nt, M * (c + 1) / nt); });
    std::atomic<bool> failed{false};
    pool_for(int(nt), panels, [&](int64_t q) {
      try {
        do_panels(q, q + 1);
      } catch (...) {  // scratch allocation: reported once every panel has finished
        failed.store(true, std::memory_order_relaxed);
      }
    });
    if (failed.load(std::memory_order_relaxed)) throw std::bad_alloc();
    return;
  }
#ifdef _OPENMP
  if (nt > 1) {
    bool failed = false;
#pragma omp parallel num_threads(int(nt)) reduction(|| : failed)
    {
      const int64_t tid = omp_get_thread_num(), cnt = omp_get_num_threads();
      quantize_rows(M * tid / cnt, M * (tid + 1) / cnt);  // no allocation: the buffers are sized above
#pragma omp barrier
      try {
        do_panels(panels * tid / cnt, panels * (tid + 1) / cnt);
      } catch (...) {  // scratch allocation; exceptions must not leave the region
        failed = true;
      }
    }
    if (failed) throw std::bad_alloc();
    return;
  }
#endif
  quantize_rows(0, M);
  do_panels(0, panels);
}

}  // namespace

std::string gguf_isa() { return T().name; }

std::vector<std::string> gguf_isas() {
  std::vector<std::string> v{"scalar"};
  for (const char* n : {"avx2", "avxvnni", "avx512vnni"})
    if (table_for(n) != nullptr) v.push_back(n);
  return v;
}

void gguf_force_isa(const std::string& name) {
  if (name == "auto" || name.empty()) {
    g_forced.store(nullptr, std::memory_order_release);
    return;
  }
  const GGUFTable* t = table_for(name);
  if (t == nullptr) {
    std::string s;
    for (auto& n : gguf_isas()) s += (s.empty() ? "" : ", ") + n;
    throw std::invalid_argument("GGUF kernel level '" + name + "' is not available here (this build and CPU: " + s +
                                ")");
  }
  g_forced.store(t, std::memory_order_release);
}

bool gguf_has_kernel(int qtype) { return gguf_type_size(qtype) != 0; }

// The arguments gguf_get_rows and gguf_dequantize share: N rows of row_bytes GGUF bytes of qtype, K weights each,
// dequantized to dtype.
static void check_rows(const char* op, int dtype, int qtype, int64_t row_bytes, int64_t N, int64_t K) {
  auto fail_if = [op](bool bad, const char* what) {
    if (bad) throw std::invalid_argument(std::string(op) + ": " + what);
  };
  fail_if(dtype != kFloat32 && dtype != kBFloat16 && dtype != kFloat16, "dtype code must be 0, 1 or 2");
  fail_if(gguf_type_size(qtype) == 0, "no kernel for this GGUF type (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K have one)");
  fail_if(N < 0 || K <= 0 || K % gguf_block_elems(qtype) != 0,
          "K must be a positive multiple of the type's block (32; 256 for the K-quants)");
  fail_if(row_bytes != K / gguf_block_elems(qtype) * gguf_type_size(qtype), "row_bytes does not match K and the type");
}

void gguf_get_rows(int dtype, uintptr_t out, uintptr_t w, int64_t row_bytes, int qtype, uintptr_t ids, int64_t count,
                   int64_t N, int64_t K) {
  check(count >= 0, "gguf_get_rows: count must be >= 0");
  check_rows("gguf_get_rows", dtype, qtype, row_bytes, N, K);
  const int64_t* id = ptr<const int64_t>(ids);
  for (int64_t t = 0; t < count; ++t)
    check(id[t] >= 0 && id[t] < N, "gguf_get_rows: a token id is out of the table's rows");
  const GGUFTable& G = T();
  const size_t row_out = size_t(K) * (dtype == kFloat32 ? 4 : 2);
  char* o = ptr<char>(out);
  const uint8_t* base = ptr<const uint8_t>(w);
  for (int64_t t = 0; t < count; ++t)  // a row is K values: a few microseconds, not worth threads
    G.dequantize(qtype, dtype, base + id[t] * row_bytes, row_bytes, K, 0, 1, o + size_t(t) * row_out);
}

void gguf_dequantize(int dtype, uintptr_t out, uintptr_t w, int64_t row_bytes, int qtype, int64_t N, int64_t K) {
  check_rows("gguf_dequantize", dtype, qtype, row_bytes, N, K);
  const GGUFTable& G = T();
  const uint8_t* base = ptr<const uint8_t>(w);
  char* o = ptr<char>(out);
  const size_t row_out = size_t(K) * (dtype == kFloat32 ? 4 : 2);
  // ~1 ns per weight and thread: a thread gets at least 256k weights. On the threads of the GEMM that multiplies
  // the panel next (gemm_on_pool): on the linear pool while torch's OpenMP threads spun, they took the pool's
  // cores and the route ran ~1.5-2x slower at 16-64 rows (python -m engine.ops.bench --prefill-rows, SmolLM2
  // shapes).
  int64_t nt = std::min<int64_t>(get_num_threads(), N * K / (256 * 1024));
#ifdef _OPENMP
  if (omp_in_parallel()) nt = 1;
#endif
  if (nt > 1 && gemm_on_pool()) {
    const int64_t chunks = 2 * nt;
    pool_for(int(nt), chunks, [&](int64_t c) {
      const int64_t n0 = N * c / chunks, n1 = N * (c + 1) / chunks;
      G.dequantize(qtype, dtype, base, row_bytes, K, n0, n1, o + size_t(n0) * row_out);
    });
    return;
  }
#ifdef _OPENMP
  if (nt > 1) {
#pragma omp parallel num_threads(int(nt))
    {
      const int64_t tid = omp_get_thread_num(), cnt = omp_get_num_threads();
      const int64_t n0 = N * tid / cnt, n1 = N * (tid + 1) / cnt;
      G.dequantize(qtype, dtype, base, row_bytes, K, n0, n1, o + size_t(n0) * row_out);
    }
    return;
  }
#endif
  (void)nt;
  G.dequantize(qtype, dtype, base, row_bytes, K, 0, N, o);
}

void gguf_linear(int dt_flags, uintptr_t out, int64_t os, uintptr_t x, int64_t xs, uintptr_t w, int64_t row_bytes,
                 int qtype, uintptr_t bias, int64_t M, int64_t N, int64_t K) {
  check((dt_flags & ~(kDTypeMask | kBatchInvariant)) == 0, "gguf_linear: unknown option bits in the dtype code");
  const int dt = dt_flags & kDTypeMask;
  check(dt == kFloat32 || dt == kBFloat16 || dt == kFloat16, "gguf_linear: dtype code must be 0, 1 or 2");
  check(gguf_type_size(qtype) != 0,
        "gguf_linear: no kernel for this GGUF type (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K have one)");
  check(M >= 0 && N >= 0 && K > 0 && K % kGGUFBlock == 0, "gguf_linear: K must be a positive multiple of 32");
  check(K % gguf_block_elems(qtype) == 0,
        "gguf_linear: K must be a multiple of 256 for the K-quant types (Q4_K, Q5_K, Q6_K: super-blocks of 256)");
  check(row_bytes == K / gguf_block_elems(qtype) * gguf_type_size(qtype),
        "gguf_linear: row_bytes does not match K and the type");
  check(M <= 1 || os >= N, "gguf_linear: out's row stride must be >= N (rows must not overlap)");
  if (M == 0 || N == 0) return;
  GGUFParams p{dt, qtype, ptr<const uint8_t>(w), row_bytes, ptr<const void>(bias), ptr<void>(out), os, M, N, K,
               nullptr, nullptr, nullptr};
  const GGUFTable& G = T();
  if (M <= kGGUFGemvMaxM || (dt_flags & kBatchInvariant) != 0) {
    run_gemv(G, p, ptr<const void>(x), xs);
  } else {
    run_panels(G, p, ptr<const void>(x), xs);
  }
}

}  // namespace kestrel::cpu
