// Work-sharing pool for the linear kernels; see gemm_pool.h for why and how.
//
// One job at a time. Its state is a single 64-bit word, the ticket: generation (24 bits) | front (20) |
// back (20); the unclaimed chunks are [front, back). The caller claims chunk `front` (front + 1), workers
// claim chunk `back - 1` (back - 1), both by compare-and-swap on the whole word, so a worker that wakes
// up late, holding a stale ticket, can never claim a chunk of a newer job. The job's function and
// context are written before the ticket is published (release) and read by a worker only after its
// claim succeeded (acquire); they cannot change before the caller has seen that chunk done.

#include "gemm_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KESTREL_PAUSE() _mm_pause()
#else
#define KESTREL_PAUSE() std::this_thread::yield()
#endif

#include <strings.h>
#include <unistd.h>

#include <cstdlib>

namespace kestrel::cpu {
namespace {

constexpr int kIdxBits = 20;
constexpr uint64_t kIdxMask = (uint64_t(1) << kIdxBits) - 1;
constexpr uint64_t kGenMask = (uint64_t(1) << 24) - 1;
// Workers keep spinning this long after their last chunk before they sleep: longer than the gaps
// between the linear calls of one decode step (Python and the small kernels in between: up to ~100 us;
// waking a sleeping worker costs tens of us on the dev VM, where an idle vCPU halts), short next to a
// step. Measured in a SmolLM2 bf16 decode step: with 30 us the gate_up GEMV took 175 us (20 GB/s),
// with 500 us 126-143 us (25-28 GB/s). After kSpinYield the spin yields the core to anything runnable.
constexpr auto kSpin = std::chrono::microseconds(500);
constexpr auto kSpinYield = std::chrono::microseconds(5);

inline uint64_t gen_of(uint64_t t) { return t >> (2 * kIdxBits); }
inline uint64_t front_of(uint64_t t) { return (t >> kIdxBits) & kIdxMask; }
inline uint64_t back_of(uint64_t t) { return t & kIdxMask; }

struct Pool {
  std::atomic<uint64_t> ticket{0};
  std::atomic<int64_t> worker_done{0};  // chunks of the current job finished by workers
  std::atomic<int> active{0};           // workers [0, active) take part in the current job
  void (*fn)(void*, int64_t) = nullptr;
  void* ctx = nullptr;
  uint64_t gen = 0;                     // caller side only (under `submit`)
  std::mutex submit;                    // one job at a time
  std::mutex grow;                      // serialises thread creation
  std::atomic<int> nworkers{0};
  std::atomic<int> sleepers{0};
  std::mutex m;
  std::condition_variable cv;
  pid_t pid = getpid();
};

// Run chunks of the job `g` from the back until none is left. Returns the number run.
int64_t claim_back(Pool* P, uint64_t g) {
  int64_t ran = 0;
  uint64_t t = P->ticket.load(std::memory_order_acquire);
  while (gen_of(t) == g && front_of(t) < back_of(t)) {
    if (P->ticket.compare_exchange_weak(t, t - 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      P->fn(P->ctx, int64_t(back_of(t) - 1));
      P->worker_done.fetch_add(1, std::memory_order_release);
      ++ran;
      t = P->ticket.load(std::memory_order_acquire);
    }
  }
  return ran;
}

void worker_main(Pool* P, int index) {
  uint64_t seen = gen_of(P->ticket.load(std::memory_order_acquire));
  auto last = std::chrono::steady_clock::now();
  for (;;) {
    const uint64_t t = P->ticket.load(std::memory_order_acquire);
    const uint64_t g = gen_of(t);
    if (g != seen) {
      seen = g;
      if (index < P->active.load(std::memory_order_relaxed)) claim_back(P, g);
      last = std::chrono::steady_clock::now();
      continue;
    }
    const auto idle = std::chrono::steady_clock::now() - last;
    if (idle < kSpin) {
      // Spin, but from kSpinYield on offer the core to anything else runnable (another process, or
      // torch's OpenMP workers, which would otherwise wait for this thread's time slice).
      if (idle < kSpinYield) {
        for (int i = 0; i < 16; ++i) KESTREL_PAUSE();
      } else {
        std::this_thread::yield();
      }
      continue;
    }
    P->sleepers.fetch_add(1, std::memory_order_seq_cst);
    {
      std::unique_lock<std::mutex> lk(P->m);
      P->cv.wait(lk, [&] { return gen_of(P->ticket.load(std::memory_order_seq_cst)) != seen; });
    }
    P->sleepers.fetch_sub(1, std::memory_order_relaxed);
    last = std::chrono::steady_clock::now();
  }
}

std::atomic<Pool*> g_pool{nullptr};
std::mutex g_pool_mutex;

// The pool (never destroyed: its threads sleep until the process exits), with at least n workers. A
// forked child gets a fresh one (the parent's threads do not exist there; the old object is leaked).
Pool* get_pool(int n) {
  Pool* P = g_pool.load(std::memory_order_acquire);
  if (P == nullptr || P->pid != getpid()) {
    std::lock_guard<std::mutex> l(g_pool_mutex);
    P = g_pool.load(std::memory_order_acquire);
    if (P == nullptr || P->pid != getpid()) {
      P = new Pool();
      g_pool.store(P, std::memory_order_release);
    }
  }
  if (P->nworkers.load(std::memory_order_acquire) < n) {
    std::lock_guard<std::mutex> l(P->grow);
    for (int i = P->nworkers.load(std::memory_order_relaxed); i < n; ++i) {
      try {
        std::thread(worker_main, P, i).detach();
      } catch (...) {  // no more threads: make do with what there is
        break;
      }
      P->nworkers.store(i + 1, std::memory_order_release);
    }
  }
  return P;
}

}  // namespace

namespace {
std::atomic<int> g_gemm_threads{-1};  // -1 auto (by OMP_WAIT_POLICY), 0 openmp, 1 pool: set_gemm_threads
}  // namespace

void set_gemm_threads(const std::string& mode) {
  if (mode == "auto" || mode.empty()) g_gemm_threads.store(-1, std::memory_order_relaxed);
  else if (mode == "pool") g_gemm_threads.store(1, std::memory_order_relaxed);
  else if (mode == "openmp") g_gemm_threads.store(0, std::memory_order_relaxed);
  else throw std::invalid_argument("gemm threads: expected auto, pool or openmp, not '" + mode + "'");
}

bool gemm_on_pool() {
  static const bool passive = [] {  // libgomp reads its policy once, at start-up: so does this
    const char* e = std::getenv("OMP_WAIT_POLICY");
    return e != nullptr && strcasecmp(e, "passive") == 0;
  }();
  const int mode = g_gemm_threads.load(std::memory_order_relaxed);
  return mode < 0 ? passive : mode == 1;
}

void pool_run(int threads, int64_t chunks, void (*fn)(void* ctx, int64_t chunk), void* ctx) {
  if (chunks <= 0) return;
  if (threads <= 1 || chunks <= 1 || uint64_t(chunks) > kIdxMask) {
    for (int64_t c = 0; c < chunks; ++c) fn(ctx, c);
    return;
  }
  Pool* P = get_pool(threads - 1);
  std::unique_lock<std::mutex> busy(P->submit, std::try_to_lock);
  if (!busy.owns_lock() || P->nworkers.load(std::memory_order_acquire) == 0) {
    for (int64_t c = 0; c < chunks; ++c) fn(ctx, c);
    return;
  }
  P->fn = fn;
  P->ctx = ctx;
  P->worker_done.store(0, std::memory_order_relaxed);
  P->active.store(threads - 1, std::memory_order_relaxed);
  P->gen = (P->gen + 1) & kGenMask;
  const uint64_t g = P->gen;
  uint64_t t = (g << (2 * kIdxBits)) | uint64_t(chunks);  // front 0, back = chunks
  P->ticket.store(t, std::memory_order_seq_cst);
  if (P->sleepers.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> l(P->m);
    P->cv.notify_all();
  }
  int64_t mine = 0;
  t = P->ticket.load(std::memory_order_acquire);
  while (front_of(t) < back_of(t)) {  // gen is ours until we return
    const uint64_t next = t + (uint64_t(1) << kIdxBits);
    if (P->ticket.compare_exchange_weak(t, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
      fn(ctx, int64_t(front_of(t)));
      ++mine;
      t = P->ticket.load(std::memory_order_acquire);
    }
  }
  // Only chunks that workers claimed are left: wait for them (spin, then yield the core, in case the
  // worker was preempted and needs it).
  const int64_t theirs = chunks - mine;
  for (int spins = 0; P->worker_done.load(std::memory_order_acquire) < theirs; ++spins) {
    if (spins < 4000)
      KESTREL_PAUSE();
    else
      std::this_thread::yield();
  }
}

}  // namespace kestrel::cpu
