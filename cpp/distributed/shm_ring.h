// The shared-memory ring behind a Channel: one writer, n readers, variable-size messages, FIFO.
//
//   +--------------+--------------------------------+-------------+---------------------+--------+
//   | SegmentHeader| ParticipantSlot x (1 + n)      | write_pos   | read_pos[n]         | pad    |
//   | capacity     | 0: writer, 1 + i: reader i     | (own line)  | (one line each)     | 4 KiB  |
//   +--------------+--------------------------------+-------------+---------------------+--------+
//   | data [capacity bytes], used as a circle: byte p of the stream lives at data[p % capacity]  |
//   +--------------------------------------------------------------------------------------------+
//
// The stream is a sequence of frames [u64 length][length bytes]. write_pos and read_pos[i] count
// bytes since the start (they never wrap). The writer may write while write_pos + k - min(read_pos)
// <= capacity (backpressure: the slowest reader holds the writer back); reader i may read while
// read_pos[i] < write_pos. A frame that fits the ring is published at once (a timeout never leaves
// half a frame); a larger one streams through in pieces, the readers copying as it arrives.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distributed/peer_wait.h"
#include "distributed/shm_segment.h"

namespace pagedcore {
namespace distributed {

class ShmRing {
 public:
  static constexpr uint32_t kWriter = 0xffffffffu;  // the `reader_index` that opens the writer's end

  // The segment of a ring with `num_readers` readers and `capacity_bytes` of data (>= 64).
  static void create(const std::string& name, int num_readers, size_t capacity_bytes);

  // Opens the writer's end (reader_index == kWriter) or reader `reader_index`'s end (each once).
  ShmRing(const std::string& name, uint32_t reader_index);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // Writer: one frame holding the concatenation of `parts` (pointer, bytes).
  void write(const std::vector<std::pair<const void*, size_t>>& parts, const WaitOptions& options);
  // Reader: the length of the next frame (waits for its header; does not consume it).
  uint64_t next_size(const WaitOptions& options);
  // Reader: copies the next frame (of next_size() bytes) into dst and consumes it.
  void read(void* dst, uint64_t size, const WaitOptions& options);

  // Marks this end closed (a writer closing lets readers drain, then raises PeerDiedError) and unmaps.
  void close();

  bool is_writer() const { return index_ == kWriter; }
  int num_readers() const { return num_readers_; }
  size_t capacity() const { return capacity_; }

 private:
  void copy_in(uint64_t pos, const uint8_t* src, uint64_t n);
  void copy_out(uint64_t pos, uint8_t* dst, uint64_t n) const;
  uint64_t min_read_pos() const;
  void check_readers_behind(uint64_t needed_pos) const;
  void check_writer(uint64_t needed_write_pos) const;
  void wait_for_space(uint64_t end_pos, const WaitOptions& options);
  void wait_for_data(uint64_t end_pos, const WaitOptions& options);
  void fail(const std::exception& e);

  SharedSegment segment_;
  uint32_t index_ = kWriter;
  int num_readers_ = 0;
  size_t capacity_ = 0;
  std::atomic<uint64_t>* write_pos_ = nullptr;
  std::atomic<uint64_t>* read_pos_ = nullptr;  // [num_readers], one per cache line
  uint8_t* data_ = nullptr;                    // [capacity]
  uint64_t pos_ = 0;                           // this end's own position (write_pos or its read_pos)
  bool broken_ = false;
  std::string broken_reason_;
};

}  // namespace distributed
}  // namespace pagedcore
