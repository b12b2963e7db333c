// The shared-memory all-reduce of one tensor-parallel group on one machine: a sum over the ranks'
// tensors, in place, with no sockets and no copies beyond two memcpys per rank.
//
// The segment (one per group, created by the engine process, opened by each rank):
//
//   +--------------------+------------------------+---------------------------+----------------+
//   | SegmentHeader      | ParticipantSlot x W    | generation[W]             | pad to 4 KiB   |
//   | magic, W, slot size| state, pid, start time | one atomic u64 per line   |                |
//   +--------------------+------------------------+---------------------------+----------------+
//   | slot 0  [slot_bytes]: rank 0's input chunk   ... slot W-1 [slot_bytes]   | result [slot_bytes]
//   +---------------------------------------------------------------------------------------------+
//
// One chunk (at most slot_bytes of the tensor) per round:
//   1. rank r copies its chunk into slot r;                           barrier (generation + 1)
//   2. rank r sums elements [share r] of every slot into the result;  barrier (generation + 1)
//   3. every rank copies the result chunk back into its tensor.
// The shares are near-equal, 64-byte aligned element ranges, so no two ranks write the same cache
// line. Two barriers per chunk are enough: a rank overwrites slot r (step 1 of the next round) only
// after everyone passed the second barrier (the reads of the slots are over), and the result is
// rewritten (step 2) only after everyone passed the next first barrier (the copies out are over).
//
// The barrier is a generation barrier: rank r publishes its own counter (release) and waits until
// every rank's counter reaches it (acquire). A rank knows which peers it waits for, and checks
// exactly those for liveness (peer_wait.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/peer_wait.h"
#include "distributed/shm_segment.h"
#include "kernels/cpu_isa.h"
#include "kernels/kernel_types.h"

namespace pagedcore {
namespace distributed {

class ShmAllReduce {
 public:
  // The segment for a group of `world_size` ranks with slots of `slot_bytes` (rounded up to 64).
  // The caller unlinks it (SharedSegment::unlink) when the group is done or was never fully opened.
  static void create(const std::string& name, int world_size, size_t slot_bytes);

  // Opens rank `rank`'s end (each rank once).
  ShmAllReduce(const std::string& name, int rank);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // In place: data[i] = sum over ranks of their data[i]. data: [count] of dtype, contiguous. Every rank
  // calls it with the same count and dtype in the same order. PeerDiedError / WaitTimeoutError.
  // After an error the group is broken (the barriers are out of step): every later call raises.
  void all_reduce(void* data, int64_t count, kernels::DType dtype, const WaitOptions& options);
  // Like all_reduce, with the sum kernels' ISA named (tests of each path).
  void all_reduce_isa(void* data, int64_t count, kernels::DType dtype, const WaitOptions& options, kernels::Isa isa);

  // Marks this rank closed (peers waiting on it raise) and unmaps. Idempotent.
  void close();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  size_t slot_bytes() const { return slot_bytes_; }
  uint64_t generation() const { return generation_; }

 private:
  void barrier(const WaitOptions& options, const char* what);
  void check_peers_behind(uint64_t target) const;

  SharedSegment segment_;
  int rank_ = 0;
  int world_size_ = 0;
  size_t slot_bytes_ = 0;
  uint64_t generation_ = 0;     // this rank's barrier count (also published in the segment)
  bool broken_ = false;
  std::string broken_reason_;
  std::atomic<uint64_t>* generations_ = nullptr;  // [world_size], one per cache line
  uint8_t* slots_ = nullptr;                      // [world_size][slot_bytes]
  uint8_t* result_ = nullptr;                     // [slot_bytes]
};

}  // namespace distributed
}  // namespace pagedcore
