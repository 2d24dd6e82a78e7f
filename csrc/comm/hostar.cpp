// Host-memory all-reduce (see hostar.h for the protocol) and the dispatch of the per-ISA comm kernels.

#include "hostar.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "comm_kernels.h"
#include "comm_types.h"
#include "../cpu_features.h"

namespace kestrel::cpu {
int get_num_threads();  // csrc/cpu/dispatch.cpp: threads the CPU kernels may use
}

namespace kestrel::comm {
namespace {

// ----------------------------------------------------------------------------------------------------
// ISA dispatch (the same levels as csrc/cpu; force_isa forces one there, comm_force_isa here)

// The CPU features of each level: csrc/cpu_features.h.
bool has_avx2() { return kestrel::cpu_has_avx2(); }
bool has_avx512() { return kestrel::cpu_has_avx512(); }

const Kernels* best() {
#if defined(KESTREL_X86_VARIANTS)
  if (has_avx512()) return kernels_avx512();
  if (has_avx2()) return kernels_avx2();
#endif
  return kernels_scalar();
}

std::atomic<const Kernels*> g_kernels{nullptr};

const Kernels& K() {
  const Kernels* k = g_kernels.load(std::memory_order_acquire);
  if (k == nullptr) {
    k = best();
    g_kernels.store(k, std::memory_order_release);
  }
  return *k;
}

// ----------------------------------------------------------------------------------------------------
// Waiting

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

inline bool reached(const uint32_t* f, uint32_t target) {
  return int32_t(__atomic_load_n(f, __ATOMIC_ACQUIRE) - target) >= 0;
}

void futex_sleep(const uint32_t* f, uint32_t seen, int64_t ns) {
#ifdef __linux__
  timespec ts{time_t(ns / 1000000000LL), long(ns % 1000000000LL)};
  // Shared (not FUTEX_PRIVATE): the word lives in memory mapped by several processes.
  syscall(SYS_futex, const_cast<uint32_t*>(f), FUTEX_WAIT, seen, &ts, nullptr, 0);
#else
  (void)f;
  (void)seen;
  timespec ts{0, long(std::min<int64_t>(ns, 50000))};
  nanosleep(&ts, nullptr);
#endif
}

void futex_wake_all(uint32_t* f) {
#ifdef __linux__
  syscall(SYS_futex, f, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)f;
#endif
}

// Work split for OpenMP: [lo, hi) of n items, part t of nt, aligned to `align` items.
inline std::pair<int64_t, int64_t> part_of(int64_t n, int t, int nt, int64_t align) {
  int64_t per = (n + nt - 1) / nt;
  per = (per + align - 1) / align * align;
  int64_t lo = std::min<int64_t>(n, per * t), hi = std::min<int64_t>(n, lo + per);
  return {lo, hi};
}

template <class F>
void parallel(int nt, F&& f) {
#ifdef _OPENMP
  if (nt > 1) {
#pragma omp parallel num_threads(nt)
    f(omp_get_thread_num(), omp_get_num_threads());
    return;
  }
#endif
  f(0, 1);
}

void copy_bytes(char* dst, const char* src, int64_t n, int nt) {
  if (nt <= 1) {
    std::memcpy(dst, src, size_t(n));
    return;
  }
  parallel(nt, [&](int t, int m) {
    auto [lo, hi] = part_of(n, t, m, 4096);
    if (hi > lo) std::memcpy(dst + lo, src + lo, size_t(hi - lo));
  });
}

inline int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Partial trailing group: quantise from / dequantise into a zero-padded copy.
void quantize_any(int dtype, const char* x, int64_t n, int8_t* q, float* s) {
  const int64_t full = n / kGroup * kGroup;
  const int esz = dtype_size(dtype);
  if (full) K().quantize(dtype, x, full, q, s);
  if (n > full) {
    alignas(64) char tmp[kGroup * 4];
    std::memset(tmp, 0, sizeof(tmp));
    std::memcpy(tmp, x + full * esz, size_t((n - full) * esz));
    K().quantize(dtype, tmp, kGroup, q + full, s + full / kGroup);
  }
}

void dequantize_any(int dtype, const int8_t* q, const float* s, int64_t n, char* out) {
  const int64_t full = n / kGroup * kGroup;
  const int esz = dtype_size(dtype);
  if (full) K().dequantize(dtype, q, s, full, out);
  if (n > full) {
    alignas(64) char tmp[kGroup * 4];
    K().dequantize(dtype, q + full, s + full / kGroup, kGroup, tmp);
    std::memcpy(out + full * esz, tmp, size_t((n - full) * esz));
  }
}

constexpr int64_t kMaxWorld = 64;
constexpr int64_t kParallelBytes = 256 * 1024;  // below this one thread does the work (fork/join costs more)

}  // namespace

int wait_flag(const uint32_t* flag, uint32_t target, const WaitParams& w) {
  if (reached(flag, target)) return kOk;
  const int64_t t0 = now_ns();
  int64_t t = t0;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (reached(flag, target)) return kOk;
      cpu_relax();
    }
    t = now_ns();
    if (t - t0 >= w.spin_ns) break;
  }
  for (;;) {
    if (reached(flag, target)) return kOk;
    if (__atomic_load_n(w.abort, __ATOMIC_ACQUIRE) != 0) return kAborted;
    t = now_ns();
    if (t - t0 > w.timeout_ns) return kTimeout;
    if (t - t0 < w.spin_ns + w.yield_ns) {
      sched_yield();
      continue;
    }
    __atomic_fetch_add(w.sleepers, 1u, __ATOMIC_SEQ_CST);
    const uint32_t seen = __atomic_load_n(flag, __ATOMIC_SEQ_CST);
    if (int32_t(seen - target) < 0) futex_sleep(flag, seen, 1000000);
    __atomic_fetch_sub(w.sleepers, 1u, __ATOMIC_SEQ_CST);
  }
}

void signal_flag(uint32_t* flag, uint32_t value, uint32_t* sleepers) {
  __atomic_store_n(flag, value, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST) != 0) futex_wake_all(flag);
}

// ----------------------------------------------------------------------------------------------------
// HostComm

HostComm::HostComm(uintptr_t flags, uintptr_t sleepers, uintptr_t abort, uintptr_t slots, int64_t slot_bytes,
                   int nslots, int rank, int world, int64_t spin_ns, int64_t yield_ns, int64_t timeout_ns)
    : flags_(reinterpret_cast<uint32_t*>(flags)),
      wait_{reinterpret_cast<uint32_t*>(sleepers), reinterpret_cast<const uint32_t*>(abort), spin_ns, yield_ns,
            timeout_ns},
      slots_(reinterpret_cast<char*>(slots)),
      slot_bytes_(slot_bytes),
      nslots_(nslots),
      rank_(rank),
      world_(world) {
  if (world < 1 || world > kMaxWorld || rank < 0 || rank >= world)
    throw std::invalid_argument("HostComm: bad rank/world " + std::to_string(rank) + "/" + std::to_string(world));
  if (nslots < 2) throw std::invalid_argument("HostComm: nslots must be >= 2");
  if (slot_bytes < 64 * 1024 || slot_bytes % 4096) throw std::invalid_argument("HostComm: bad slot_bytes");
  // The sequence numbers continue where the segment's flags are (all ranks attach to fresh, zeroed flags).
  seq_ = __atomic_load_n(flag(0, rank), __ATOMIC_ACQUIRE);
}

void HostComm::set_timing(int64_t spin_ns, int64_t yield_ns, int64_t timeout_ns) {
  wait_.spin_ns = spin_ns;
  wait_.yield_ns = yield_ns;
  wait_.timeout_ns = timeout_ns;
}

char* HostComm::slot(uint32_t seq, int j) const {
  return slots_ + (int64_t(seq % uint32_t(nslots_)) * world_ + j) * slot_bytes_;
}

uintptr_t HostComm::slot_address(uint32_t seq, int j) const { return reinterpret_cast<uintptr_t>(slot(seq, j)); }

std::pair<int64_t, int64_t> HostComm::subrange(int64_t m, int j) const {
  // Parts aligned to 64 elements (128-256 bytes: whole cache lines, whole SIMD vectors).
  int64_t part = round_up((m + world_ - 1) / world_, 64);
  int64_t a = std::min<int64_t>(m, part * j), b = std::min<int64_t>(m, a + part);
  return {a, b};
}

int HostComm::threads_for(int64_t bytes) const {
  if (bytes < kParallelBytes) return 1;
  int nt = threads_ > 0 ? threads_ : kestrel::cpu::get_num_threads();
  return std::max(1, nt);
}

int HostComm::publish_and_wait(int phase, uint32_t s) {
  signal_flag(flag(phase, rank_), s, wait_.sleepers);
  for (int j = 0; j < world_; ++j) {
    if (j == rank_) continue;
    int st = wait_flag(flag(phase, j), s, wait_);
    if (st != kOk) return st;
  }
  return kOk;
}

int HostComm::barrier() { return publish_and_wait(0, ++seq_); }

int HostComm::arrive() { return publish_and_wait(0, ++seq_); }

int HostComm::reduce_own(int dtype, int64_t m) {
  const int esz = dtype_size(dtype);
  auto [a, b] = subrange(m, rank_);
  if (b > a) {
    const void* src[kMaxWorld];
    for (int j = 0; j < world_; ++j) src[j] = slot(seq_, j) + a * esz;
    char* out = slot(seq_, rank_) + a * esz;
    const int nt = threads_for((b - a) * esz * world_);
    parallel(nt, [&](int t, int T) {
      auto [lo, hi] = part_of(b - a, t, T, 64);
      if (hi <= lo) return;
      const void* s2[kMaxWorld];
      for (int j = 0; j < world_; ++j) s2[j] = static_cast<const char*>(src[j]) + lo * esz;
      K().reduce(dtype, out + lo * esz, s2, world_, hi - lo);
    });
  }
  return publish_and_wait(1, seq_);
}

int HostComm::all_reduce(int dtype, uintptr_t xp, int64_t n, int64_t oneshot_max) {
  if (world_ == 1 || n <= 0) return kOk;
  const int esz = dtype_size(dtype);
  char* x = reinterpret_cast<char*>(xp);
  const int64_t bytes = n * esz;
  if (bytes <= oneshot_max && bytes <= slot_bytes_) {
    // One phase: everybody reads everybody (latency: one synchronisation instead of two).
    const uint32_t s = ++seq_;
    std::memcpy(slot(s, rank_), x, size_t(bytes));
    int st = publish_and_wait(0, s);
    if (st != kOk) return st;
    const void* src[kMaxWorld];
    for (int j = 0; j < world_; ++j) src[j] = j == rank_ ? static_cast<const void*>(x) : slot(s, j);
    K().reduce(dtype, x, src, world_, n);  // same order on every rank: bitwise identical results
    return kOk;
  }
  // Reduce-scatter + all-gather, one slot-sized chunk at a time.
  const int64_t chunk = slot_bytes_ / esz / (64 * world_) * (64 * world_);
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t m = std::min(chunk, n - c0);
    char* xc = x + c0 * esz;
    const int nt = threads_for(m * esz);
    copy_bytes(slot(seq_ + 1, rank_), xc, m * esz, nt);
    int st = arrive();
    if (st == kOk) st = reduce_own(dtype, m);
    if (st != kOk) return st;
    parallel(nt, [&](int t, int T) {
      for (int j = 0; j < world_; ++j) {
        auto [a, b] = subrange(m, j);
        auto [lo, hi] = part_of(b - a, t, T, 64);
        if (hi > lo) std::memcpy(xc + (a + lo) * esz, slot(seq_, j) + (a + lo) * esz, size_t((hi - lo) * esz));
      }
    });
  }
  return kOk;
}

int64_t HostComm::int8_chunk_elems() const {
  // Slot layout of one chunk of m elements: int8 values [m rounded to groups], 64-byte aligned fp32 scales.
  const int64_t unit = kGroup * world_;
  int64_t m = slot_bytes_ * kGroup / (kGroup + 4) / unit * unit;
  while (m > unit && round_up(m, 64) + m / kGroup * 4 > slot_bytes_) m -= unit;
  return m;
}

int HostComm::int8_all_reduce(int dtype, uintptr_t xp, int64_t n) {
  if (world_ == 1 || n <= 0) return kOk;
  const int esz = dtype_size(dtype);
  char* x = reinterpret_cast<char*>(xp);
  const int64_t chunk = int8_chunk_elems();
  const int64_t s_off = round_up(chunk, 64);
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t m = std::min(chunk, n - c0);
    const int64_t ng = (m + kGroup - 1) / kGroup;
    const int64_t gp = (ng + world_ - 1) / world_;  // groups per rank
    char* xc = x + c0 * esz;
    const uint32_t s = seq_ + 1;
    {
      int8_t* q = reinterpret_cast<int8_t*>(slot(s, rank_));
      float* sc = reinterpret_cast<float*>(slot(s, rank_) + s_off);
      const int nt = threads_for(m * esz);
      parallel(nt, [&](int t, int T) {
        auto [g0, g1] = part_of(ng, t, T, 1);
        if (g1 <= g0) return;
        const int64_t e0 = g0 * kGroup, e1 = std::min(m, g1 * kGroup);
        quantize_any(dtype, xc + e0 * esz, e1 - e0, q + e0, sc + g0);
      });
    }
    int st = arrive();
    if (st != kOk) return st;
    {
      const int64_t g0 = std::min(ng, gp * rank_), g1 = std::min(ng, g0 + gp);
      if (g1 > g0) {
        const int8_t* qs[kMaxWorld];
        const float* ss[kMaxWorld];
        for (int j = 0; j < world_; ++j) {
          qs[j] = reinterpret_cast<const int8_t*>(slot(s, j)) + g0 * kGroup;
          ss[j] = reinterpret_cast<const float*>(slot(s, j) + s_off) + g0;
        }
        int8_t* oq = reinterpret_cast<int8_t*>(slot(s, rank_)) + g0 * kGroup;
        float* os = reinterpret_cast<float*>(slot(s, rank_) + s_off) + g0;
        const int nt = threads_for((g1 - g0) * kGroup * world_);
        parallel(nt, [&](int t, int T) {
          auto [h0, h1] = part_of(g1 - g0, t, T, 1);
          if (h1 <= h0) return;
          const int8_t* q2[kMaxWorld];
          const float* s2[kMaxWorld];
          for (int j = 0; j < world_; ++j) {
            q2[j] = qs[j] + h0 * kGroup;
            s2[j] = ss[j] + h0;
          }
          K().dequant_sum_requant(q2, s2, world_, (h1 - h0) * kGroup, oq + h0 * kGroup, os + h0);
        });
      }
    }
    st = publish_and_wait(1, s);
    if (st != kOk) return st;
    const int nt = threads_for(m * esz);
    parallel(nt, [&](int t, int T) {
      for (int j = 0; j < world_; ++j) {
        const int64_t g0 = std::min(ng, gp * j), g1 = std::min(ng, g0 + gp);
        auto [h0, h1] = part_of(g1 - g0, t, T, 1);
        if (h1 <= h0) continue;
        const int64_t e0 = (g0 + h0) * kGroup, e1 = std::min(m, (g0 + h1) * kGroup);
        dequantize_any(dtype, reinterpret_cast<const int8_t*>(slot(s, j)) + e0,
                       reinterpret_cast<const float*>(slot(s, j) + s_off) + (g0 + h0), e1 - e0, xc + e0 * esz);
      }
    });
  }
  return kOk;
}

int HostComm::all_gather(uintptr_t xp, int64_t nbytes, uintptr_t outp) {
  const char* x = reinterpret_cast<const char*>(xp);
  char* out = reinterpret_cast<char*>(outp);
  if (world_ == 1) {
    std::memcpy(out, x, size_t(nbytes));
    return kOk;
  }
  for (int64_t c0 = 0; c0 < nbytes; c0 += slot_bytes_) {
    const int64_t m = std::min(slot_bytes_, nbytes - c0);
    const uint32_t s = ++seq_;
    const int nt = threads_for(m * world_);
    copy_bytes(slot(s, rank_), x + c0, m, nt);
    int st = publish_and_wait(0, s);
    if (st != kOk) return st;
    for (int j = 0; j < world_; ++j) {
      char* dst = out + int64_t(j) * nbytes + c0;
      if (j == rank_)
        copy_bytes(dst, x + c0, m, nt);
      else
        copy_bytes(dst, slot(s, j), m, nt);
    }
  }
  return kOk;
}

// ----------------------------------------------------------------------------------------------------
// Kernel entry points

const char* comm_isa() { return K().name; }

void comm_force_isa(const char* name) {
  std::string s(name);
  const Kernels* k = nullptr;
  if (s == "auto") k = best();
  if (s == "scalar") k = kernels_scalar();
#if defined(KESTREL_X86_VARIANTS)
  if (s == "avx2" && has_avx2()) k = kernels_avx2();
  if ((s == "avx512" || s == "avx512bf16") && has_avx512()) k = kernels_avx512();
#endif
  if (k == nullptr) throw std::invalid_argument("comm_force_isa: '" + s + "' is not available here");
  g_kernels.store(k, std::memory_order_release);
}

void reduce_into(int dtype, uintptr_t out, const uintptr_t* srcs, int nsrc, int64_t n) {
  const void* src[kMaxWorld];
  for (int k = 0; k < nsrc; ++k) src[k] = reinterpret_cast<const void*>(srcs[k]);
  K().reduce(dtype, reinterpret_cast<void*>(out), src, nsrc, n);
}

void quantize_int8(int dtype, uintptr_t x, int64_t n, uintptr_t q, uintptr_t s) {
  quantize_any(dtype, reinterpret_cast<const char*>(x), n, reinterpret_cast<int8_t*>(q), reinterpret_cast<float*>(s));
}

void dequant_sum_requant(const uintptr_t* q, const uintptr_t* s, int nsrc, int64_t n, uintptr_t oq, uintptr_t os) {
  const int8_t* qs[kMaxWorld];
  const float* ss[kMaxWorld];
  for (int k = 0; k < nsrc; ++k) {
    qs[k] = reinterpret_cast<const int8_t*>(q[k]);
    ss[k] = reinterpret_cast<const float*>(s[k]);
  }
  K().dequant_sum_requant(qs, ss, nsrc, n, reinterpret_cast<int8_t*>(oq), reinterpret_cast<float*>(os));
}

void dequantize_int8(int dtype, uintptr_t q, uintptr_t s, int64_t n, uintptr_t out) {
  dequantize_any(dtype, reinterpret_cast<const int8_t*>(q), reinterpret_cast<const float*>(s), n,
                 reinterpret_cast<char*>(out));
}

}  // namespace kestrel::comm
