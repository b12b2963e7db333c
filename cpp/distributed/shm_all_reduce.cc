#include "distributed/shm_all_reduce.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "distributed/sum_kernels.h"

namespace pagedcore {
namespace distributed {
namespace {

constexpr size_t kPage = 4096;
constexpr uint32_t kGenerationStride = kCacheLine / sizeof(uint64_t);  // one counter per cache line

struct Layout {
  size_t generations = 0;  // offset of generation[0]
  size_t slots = 0;        // offset of slot 0
  size_t result = 0;
  size_t total = 0;
};

Layout layout_of(int world_size, size_t slot_bytes) {
  Layout l;
  l.generations = round_up(participants_end(world_size), kCacheLine);
  l.slots = round_up(l.generations + kCacheLine * world_size, kPage);
  l.result = l.slots + slot_bytes * world_size;
  l.total = round_up(l.result + slot_bytes, kPage);
  return l;
}

}  // namespace

void ShmAllReduce::create(const std::string& name, int world_size, size_t slot_bytes) {
  if (world_size < 1 || world_size > 1024) throw std::invalid_argument("world_size must be in 1..1024");
  if (slot_bytes < kCacheLine) throw std::invalid_argument("slot_bytes must be at least 64");
  slot_bytes = round_up(slot_bytes, kCacheLine);
  const Layout l = layout_of(world_size, slot_bytes);
  SharedSegment seg = SharedSegment::create(name, l.total);
  SegmentHeader* h = seg.header();
  h->kind = static_cast<uint32_t>(SegmentKind::kAllReduce);
  h->num_participants = static_cast<uint32_t>(world_size);
  h->data_bytes = slot_bytes;
  h->total_bytes = l.total;
  h->creator_pid = static_cast<uint32_t>(::getpid());
  h->magic.store(kSegmentMagic, std::memory_order_release);
}

ShmAllReduce::ShmAllReduce(const std::string& name, int rank) : segment_(SharedSegment::open(name)), rank_(rank) {
  if (rank < 0) throw std::invalid_argument("rank must be >= 0");
  segment_.join(SegmentKind::kAllReduce, static_cast<uint32_t>(rank));
  world_size_ = static_cast<int>(segment_.header()->num_participants);
  slot_bytes_ = segment_.header()->data_bytes;
  const Layout l = layout_of(world_size_, slot_bytes_);
  generations_ = reinterpret_cast<std::atomic<uint64_t>*>(segment_.data() + l.generations);
  slots_ = segment_.data() + l.slots;
  result_ = segment_.data() + l.result;
  generation_ = generations_[rank_ * kGenerationStride].load(std::memory_order_acquire);
}

ShmAllReduce::~ShmAllReduce() { close(); }

void ShmAllReduce::close() {
  if (!segment_.data()) return;
  segment_.leave(static_cast<uint32_t>(rank_));
  segment_ = SharedSegment();
}

void ShmAllReduce::check_peers_behind(uint64_t target) const {
  const ParticipantSlot* peers = segment_.participants();
  for (int r = 0; r < world_size_; ++r) {
    if (generations_[r * kGenerationStride].load(std::memory_order_acquire) >= target) continue;
    const uint32_t state = peers[r].state.load(std::memory_order_acquire);
    const int pid = peers[r].pid.load(std::memory_order_acquire);
    if (state == kClosed) {
      throw PeerDiedError("all-reduce peer rank " + std::to_string(r) + " (pid " + std::to_string(pid) +
                          ") closed the group while rank " + std::to_string(rank_) + " waited for it");
    }
    if (state == kOpen) {
      const std::string gone = process_gone_reason(pid, peers[r].start_time.load(std::memory_order_relaxed));
      if (!gone.empty()) {
        throw PeerDiedError("all-reduce peer rank " + std::to_string(r) + " (pid " + std::to_string(pid) +
                            ") is gone: " + gone);
      }
    }
    // kAbsent: the rank has not opened its end yet; only the deadline (or the extra check) can tell.
  }
}

void ShmAllReduce::barrier(const WaitOptions& options, const char* what) {
  const uint64_t target = ++generation_;
  generations_[rank_ * kGenerationStride].store(target, std::memory_order_release);
  notify_waiters(segment_.futex());
  auto all_there = [&] {
    for (int r = 0; r < world_size_; ++r) {
      if (generations_[r * kGenerationStride].load(std::memory_order_acquire) < target) return false;
    }
    return true;
  };
  wait_until(all_there, [&] { check_peers_behind(target); }, options, what, segment_.futex());
}

void ShmAllReduce::all_reduce(void* data, int64_t count, kernels::DType dtype, const WaitOptions& options) {
  all_reduce_isa(data, count, dtype, options, kernels::active_isa());
}

void ShmAllReduce::all_reduce_isa(void* data, int64_t count, kernels::DType dtype, const WaitOptions& options,
                                  kernels::Isa isa) {
  if (!segment_.data()) throw std::logic_error("all_reduce on a closed shared-memory group");
  if (broken_) throw PeerDiedError("the shared-memory group is unusable after an earlier error: " + broken_reason_);
  if (count < 0) throw std::invalid_argument("count must be >= 0");
  if (world_size_ == 1 || count == 0) return;
  const int64_t elem = kernels::dtype_size(dtype);
  const int64_t chunk_elems = static_cast<int64_t>(slot_bytes_) / elem;
  constexpr int64_t kAlignElems = 16;  // shares start on 64-byte lines (16 fp32 / 32 bf16 -> take 32)
  uint8_t* bytes = static_cast<uint8_t*>(data);
  std::vector<const void*> inputs(world_size_);
  try {
    for (int64_t begin = 0; begin < count; begin += chunk_elems) {
      const int64_t n = std::min(chunk_elems, count - begin);
      std::memcpy(slots_ + slot_bytes_ * rank_, bytes + begin * elem, n * elem);
      barrier(options, "the all-reduce peers' inputs");
      // This rank's share: a near-equal, line-aligned element range of the chunk.
      const int64_t align = kAlignElems * (elem == 2 ? 2 : 1);
      const int64_t share = (n + world_size_ - 1) / world_size_;
      const int64_t share_aligned = (share + align - 1) / align * align;
      const int64_t lo = std::min(n, share_aligned * rank_);
      const int64_t hi = std::min(n, lo + share_aligned);
      if (hi > lo) {
        for (int r = 0; r < world_size_; ++r) inputs[r] = slots_ + slot_bytes_ * r + lo * elem;
        sum_elements(dtype, result_ + lo * elem, inputs.data(), world_size_, hi - lo, isa);
      }
      barrier(options, "the all-reduce peers' sums");
      std::memcpy(bytes + begin * elem, result_, n * elem);
    }
  } catch (const std::exception& e) {
    broken_ = true;
    broken_reason_ = e.what();
    throw;
  }
}

}  // namespace distributed
}  // namespace pagedcore
