// A named POSIX shared-memory segment (shm_open + mmap) shared by the processes of one group, and
// the identity table every segment starts with: who takes part (pid + process start time), so a
// waiting process can tell a live peer from a dead one.
//
// Names: the creator (the engine process) makes a unique name, creates the segment with O_EXCL and
// zero-filled, and writes the header last (magic published with release). Participants open it by
// name and register in their ParticipantSlot; the participant whose open completes the group unlinks
// the name, so once all ends are open nothing is left in /dev/shm even if every process is then
// SIGKILLed (the mappings live on until the last process unmaps them).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "distributed/peer_wait.h"

namespace pagedcore {
namespace distributed {

constexpr size_t kCacheLine = 64;
constexpr uint64_t kSegmentMagic = 0x70636f7265736d31ull;  // "pcoresm1"

enum class SegmentKind : uint32_t { kAllReduce = 1, kRing = 2 };

// The first cache line of every segment.
struct alignas(kCacheLine) SegmentHeader {
  std::atomic<uint64_t> magic;       // kSegmentMagic once the creator has written the header
  uint32_t kind;                     // SegmentKind
  uint32_t num_participants;         // all-reduce: world_size; ring: 1 writer + num_readers
  uint64_t data_bytes;               // kind-specific: all-reduce slot bytes / ring capacity
  uint64_t total_bytes;              // the whole mapping
  std::atomic<uint32_t> num_opened;  // participants that have opened their end
  uint32_t creator_pid;
  // Futex pair of the segment (peer_wait.h): `event` is bumped after every state change a peer may
  // wait for (a position, a generation, a close); `sleepers` counts waiters blocked in the kernel, so
  // a publisher makes the wake-up syscall only when someone sleeps.
  std::atomic<uint32_t> event;
  std::atomic<uint32_t> sleepers;
};
static_assert(sizeof(SegmentHeader) == kCacheLine, "the header is one cache line");

enum ParticipantState : uint32_t { kAbsent = 0, kOpen = 1, kClosed = 2 };

// One participant's identity; a cache line each so registrations never share a line.
struct alignas(kCacheLine) ParticipantSlot {
  std::atomic<uint32_t> state;       // ParticipantState
  std::atomic<int32_t> pid;          // 0 until open
  std::atomic<uint64_t> start_time;  // /proc/<pid>/stat field 22: tells a reused pid apart
};

// /proc/<pid>/stat field 22 (start time in clock ticks since boot, as other processes read it; 0 when unreadable).
uint64_t process_start_time(int pid);
// "" when the process (pid, start_time) is running; else why not ("exited", "a zombie: it exited and
// was not reaped yet", "exited (its pid now belongs to another process)").
std::string process_gone_reason(int pid, uint64_t start_time);

// A mapping of one segment; unmaps on destruction (never unlinks: see unlink()).
class SharedSegment {
 public:
  // Creates `name` (no leading '/') of `total_bytes`, zero-filled, O_EXCL; std::runtime_error naming
  // errno on failure (the name exists, /dev/shm is full). The header's magic is not set yet.
  static SharedSegment create(const std::string& name, size_t total_bytes);
  // Opens an existing segment; std::runtime_error when absent (the group was closed, or every end
  // was already opened and the name unlinked).
  static SharedSegment open(const std::string& name);
  // Removes the name (the mappings stay valid). False when it was already gone.
  static bool unlink(const std::string& name);

  SharedSegment() = default;
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();

  uint8_t* data() const { return base_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base_); }
  // The segment's futex pair (peer_wait.h): waits block on it, state changes notify it.
  FutexPair futex() const { return base_ ? FutexPair{&header()->event, &header()->sleepers} : FutexPair(); }
  // The participants table right after the header.
  ParticipantSlot* participants() const { return reinterpret_cast<ParticipantSlot*>(base_ + sizeof(SegmentHeader)); }

  // Checks the header (magic, kind, sizes) and takes participant `index`: std::runtime_error when
  // the header does not match or the index is taken. Unlinks the name when this open completes the group.
  void join(SegmentKind kind, uint32_t index);
  // Marks the participant closed (peers waiting on it then raise instead of waiting out a deadline).
  void leave(uint32_t index);

 private:
  SharedSegment(std::string name, uint8_t* base, size_t size) : name_(std::move(name)), base_(base), size_(size) {}
  std::string name_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

// Bytes of header + participants table, rounded to a cache line.
inline size_t participants_end(uint32_t num_participants) {
  return sizeof(SegmentHeader) + sizeof(ParticipantSlot) * num_participants;
}
inline size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace distributed
}  // namespace pagedcore
