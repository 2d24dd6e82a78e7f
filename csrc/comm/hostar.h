// Host-memory all-reduce across rank processes through one POSIX shared-memory segment.
//
// The segment is created and laid out by engine/parallel/comm/shm.py; this code gets raw addresses in it:
//   flags    [2 phases][world] uint32 sequence numbers, each in its own 128-byte line
//   sleepers uint32: how many waiters sleep in futex_wait (writers only wake when it is non-zero)
//   abort    uint32: non-zero = the group is dead (set by the executor's monitor); every wait gives up
//   slots    [nslots][world][slot_bytes]: rank r writes only slots[.][r]; slot of a step = seq % nslots
//
// Synchronisation (no locks): every collective step increments the per-rank sequence number `seq`
// (identical on all ranks: they make the same calls in the same order). A rank writes its data into its
// slot, publishes flag[0][rank] = seq (release), waits until every flag[0][j] >= seq (acquire), then reads.
// Two-phase steps (reduce-scatter + all-gather) publish flag[1][rank] = seq after writing their reduced
// part and wait for all flag[1] before gathering. Slot reuse is safe because a rank publishes flag[0] for
// step t only after all its reads of step t - (nslots - 1) are complete (on the CPU, reads of step t - 1).
// Waiting spins (pause) for spin_ns, then yields for yield_ns, then sleeps in futex_wait (1 ms slices) —
// so oversubscribed cores (TP=3 on 2 cores) still make progress — and checks `abort` and a deadline.
#pragma once

#include <cstdint>
#include <utility>

namespace kestrel::comm {

enum Status : int { kOk = 0, kAborted = 1, kTimeout = 2 };

struct WaitParams {
  uint32_t* sleepers;
  const uint32_t* abort;
  int64_t spin_ns;
  int64_t yield_ns;
  int64_t timeout_ns;
};

// Wait until (int32)(*flag - target) >= 0.
int wait_flag(const uint32_t* flag, uint32_t target, const WaitParams& w);
// *flag = value (seq_cst), then wake sleepers if any.
void signal_flag(uint32_t* flag, uint32_t value, uint32_t* sleepers);

class HostComm {
 public:
  HostComm(uintptr_t flags, uintptr_t sleepers, uintptr_t abort, uintptr_t slots, int64_t slot_bytes, int nslots,
           int rank, int world, int64_t spin_ns, int64_t yield_ns, int64_t timeout_ns);

  // In place: x (n elements of dtype, host memory) <- sum over ranks. One phase (every rank reads every
  // slot) up to oneshot_max bytes, else reduce-scatter + all-gather in slot-sized chunks.
  int all_reduce(int dtype, uintptr_t x, int64_t n, int64_t oneshot_max);
  // Int8 all-reduce: group-wise absmax quantisation (kGroup), reduce-scatter of int8 + fp32 scales, own
  // part summed in fp32 and requantised, all-gather of int8, dequantised into x. In place.
  int int8_all_reduce(int dtype, uintptr_t x, int64_t n);
  // out[j * nbytes + i] = rank j's x[i] (exact all-gather of raw bytes).
  int all_gather(uintptr_t x, int64_t nbytes, uintptr_t out);
  int barrier();

  // Pieces for the GPU path (engine/parallel/comm/host.py): the caller copies its data into
  // slot_address(seq + 1, rank) (a device-to-host copy), then arrive() publishes and waits for all;
  // reduce_own() sums this rank's part subrange(m, rank) of every slot into its own slot, publishes phase 2
  // and waits for all, after which every slot's own part holds the sum (host-to-device copies read them).
  int arrive();
  int reduce_own(int dtype, int64_t m);

  uintptr_t slot_address(uint32_t seq, int rank) const;
  std::pair<int64_t, int64_t> subrange(int64_t m, int j) const;
  uint32_t seq() const { return seq_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t int8_chunk_elems() const;
  void set_timing(int64_t spin_ns, int64_t yield_ns, int64_t timeout_ns);
  void set_threads(int n) { threads_ = n; }

 private:
  uint32_t* flag(int phase, int j) const { return flags_ + (phase * world_ + j) * 32; }
  char* slot(uint32_t seq, int j) const;
  int publish_and_wait(int phase, uint32_t s);
  int threads_for(int64_t bytes) const;

  uint32_t* flags_;
  WaitParams wait_;
  char* slots_;
  int64_t slot_bytes_;
  int nslots_;
  int rank_, world_;
  uint32_t seq_ = 0;
  int threads_ = 0;  // 0: the kernels' thread count (engine._C.set_num_threads)
};

// Kernel entry points for tests and the int8-over-torch.distributed transport (no synchronisation).
const char* comm_isa();
void comm_force_isa(const char* name);
void reduce_into(int dtype, uintptr_t out, const uintptr_t* srcs, int nsrc, int64_t n);
void quantize_int8(int dtype, uintptr_t x, int64_t n, uintptr_t q, uintptr_t s);
void dequant_sum_requant(const uintptr_t* q, const uintptr_t* s, int nsrc, int64_t n, uintptr_t oq, uintptr_t os);
void dequantize_int8(int dtype, uintptr_t q, uintptr_t s, int64_t n, uintptr_t out);

}  // namespace kestrel::comm
