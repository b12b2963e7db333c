#include "distributed/shm_ring.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace pagedcore {
namespace distributed {
namespace {

constexpr size_t kPage = 4096;
constexpr uint32_t kPosStride = kCacheLine / sizeof(uint64_t);
constexpr uint64_t kFrameHeader = sizeof(uint64_t);

struct Layout {
  size_t write_pos = 0;
  size_t read_pos = 0;
  size_t data = 0;
  size_t total = 0;
};

Layout layout_of(int num_readers, size_t capacity) {
  Layout l;
  l.write_pos = round_up(participants_end(1 + num_readers), kCacheLine);
  l.read_pos = l.write_pos + kCacheLine;
  l.data = round_up(l.read_pos + kCacheLine * num_readers, kPage);
  l.total = round_up(l.data + capacity, kPage);
  return l;
}

}  // namespace

void ShmRing::create(const std::string& name, int num_readers, size_t capacity_bytes) {
  if (num_readers < 1 || num_readers > 1024) throw std::invalid_argument("num_readers must be in 1..1024");
  if (capacity_bytes < kCacheLine) throw std::invalid_argument("capacity_bytes must be at least 64");
  const Layout l = layout_of(num_readers, capacity_bytes);
  SharedSegment seg = SharedSegment::create(name, l.total);
  SegmentHeader* h = seg.header();
  h->kind = static_cast<uint32_t>(SegmentKind::kRing);
  h->num_participants = static_cast<uint32_t>(1 + num_readers);
  h->data_bytes = capacity_bytes;
  h->total_bytes = l.total;
  h->creator_pid = static_cast<uint32_t>(::getpid());
  h->magic.store(kSegmentMagic, std::memory_order_release);
}

ShmRing::ShmRing(const std::string& name, uint32_t reader_index) : segment_(SharedSegment::open(name)), index_(reader_index) {
  const SegmentHeader* h = segment_.header();
  if (h->magic.load(std::memory_order_acquire) == kSegmentMagic && reader_index != kWriter &&
      h->kind == static_cast<uint32_t>(SegmentKind::kRing) && reader_index + 1 >= h->num_participants) {
    throw std::invalid_argument("reader " + std::to_string(reader_index) + " is outside channel /dev/shm/" + name +
                                " (" + std::to_string(h->num_participants - 1) + " readers)");
  }
  segment_.join(SegmentKind::kRing, reader_index == kWriter ? 0 : reader_index + 1);
  num_readers_ = static_cast<int>(segment_.header()->num_participants) - 1;
  capacity_ = segment_.header()->data_bytes;
  const Layout l = layout_of(num_readers_, capacity_);
  write_pos_ = reinterpret_cast<std::atomic<uint64_t>*>(segment_.data() + l.write_pos);
  read_pos_ = reinterpret_cast<std::atomic<uint64_t>*>(segment_.data() + l.read_pos);
  data_ = segment_.data() + l.data;
  pos_ = is_writer() ? write_pos_->load(std::memory_order_acquire)
                     : read_pos_[index_ * kPosStride].load(std::memory_order_acquire);
}

ShmRing::~ShmRing() { close(); }

void ShmRing::close() {
  if (!segment_.data()) return;
  segment_.leave(is_writer() ? 0 : index_ + 1);
  segment_ = SharedSegment();
}

void ShmRing::copy_in(uint64_t pos, const uint8_t* src, uint64_t n) {
  if (n == 0) return;  // an empty part may come with a null pointer
  const uint64_t at = pos % capacity_;
  const uint64_t first = std::min<uint64_t>(n, capacity_ - at);
  std::memcpy(data_ + at, src, first);
  if (n > first) std::memcpy(data_, src + first, n - first);
}

void ShmRing::copy_out(uint64_t pos, uint8_t* dst, uint64_t n) const {
  if (n == 0) return;
  const uint64_t at = pos % capacity_;
  const uint64_t first = std::min<uint64_t>(n, capacity_ - at);
  std::memcpy(dst, data_ + at, first);
  if (n > first) std::memcpy(dst + first, data_, n - first);
}

uint64_t ShmRing::min_read_pos() const {
  uint64_t lowest = UINT64_MAX;
  for (int i = 0; i < num_readers_; ++i) lowest = std::min(lowest, read_pos_[i * kPosStride].load(std::memory_order_acquire));
  return lowest;
}

void ShmRing::check_readers_behind(uint64_t needed_pos) const {
  const ParticipantSlot* peers = segment_.participants();
  for (int i = 0; i < num_readers_; ++i) {
    if (read_pos_[i * kPosStride].load(std::memory_order_acquire) >= needed_pos) continue;
    const ParticipantSlot& p = peers[i + 1];
    const uint32_t state = p.state.load(std::memory_order_acquire);
    const int pid = p.pid.load(std::memory_order_acquire);
    if (state == kClosed) {
      throw PeerDiedError("channel reader " + std::to_string(i) + " (pid " + std::to_string(pid) +
                          ") closed its end with the channel full");
    }
    if (state == kOpen) {
      const std::string gone = process_gone_reason(pid, p.start_time.load(std::memory_order_relaxed));
      if (!gone.empty()) {
        throw PeerDiedError("channel reader " + std::to_string(i) + " (pid " + std::to_string(pid) + ") is gone: " + gone);
      }
    }
  }
}

void ShmRing::check_writer(uint64_t needed_write_pos) const {
  if (write_pos_->load(std::memory_order_acquire) >= needed_write_pos) return;
  const ParticipantSlot& p = segment_.participants()[0];
  const uint32_t state = p.state.load(std::memory_order_acquire);
  const int pid = p.pid.load(std::memory_order_acquire);
  if (state == kClosed) throw PeerDiedError("the channel's writer (pid " + std::to_string(pid) + ") closed the channel");
  if (state == kOpen) {
    const std::string gone = process_gone_reason(pid, p.start_time.load(std::memory_order_relaxed));
    if (!gone.empty()) throw PeerDiedError("the channel's writer (pid " + std::to_string(pid) + ") is gone: " + gone);
  }
}

void ShmRing::wait_for_space(uint64_t end_pos, const WaitOptions& options) {
  // Room up to end_pos once every reader has read past end_pos - capacity.
  const uint64_t needed = end_pos > capacity_ ? end_pos - capacity_ : 0;
  wait_until([&] { return min_read_pos() >= needed; }, [&] { check_readers_behind(needed); }, options,
             "the channel's readers to make room", segment_.futex());
}

void ShmRing::wait_for_data(uint64_t end_pos, const WaitOptions& options) {
  wait_until([&] { return write_pos_->load(std::memory_order_acquire) >= end_pos; }, [&] { check_writer(end_pos); },
             options, "the channel's writer", segment_.futex());
}

void ShmRing::fail(const std::exception& e) {
  broken_ = true;
  broken_reason_ = e.what();
}

void ShmRing::write(const std::vector<std::pair<const void*, size_t>>& parts, const WaitOptions& options) {
  if (!segment_.data()) throw std::logic_error("put on a closed channel");
  if (!is_writer()) throw std::logic_error("put on a channel's reader end");
  if (broken_) throw PeerDiedError("the channel is unusable after an earlier error: " + broken_reason_);
  uint64_t length = 0;
  for (const auto& part : parts) length += part.second;
  const uint64_t frame = kFrameHeader + length;
  if (frame <= capacity_) {
    wait_for_space(pos_ + frame, options);  // a timeout here leaves the stream untouched
    uint64_t at = pos_;
    copy_in(at, reinterpret_cast<const uint8_t*>(&length), kFrameHeader);
    at += kFrameHeader;
    for (const auto& part : parts) {
      copy_in(at, static_cast<const uint8_t*>(part.first), part.second);
      at += part.second;
    }
    pos_ = at;
    write_pos_->store(pos_, std::memory_order_release);
    notify_waiters(segment_.futex());
    return;
  }
  // Larger than the ring: stream it, publishing each piece as it lands.
  try {
    auto push = [&](const uint8_t* src, uint64_t n) {
      while (n > 0) {
        wait_for_space(pos_ + 1, options);
        const uint64_t room = capacity_ - (pos_ - min_read_pos());
        const uint64_t k = std::min(n, room);
        copy_in(pos_, src, k);
        pos_ += k;
        src += k;
        n -= k;
        write_pos_->store(pos_, std::memory_order_release);
        notify_waiters(segment_.futex());
      }
    };
    push(reinterpret_cast<const uint8_t*>(&length), kFrameHeader);
    for (const auto& part : parts) push(static_cast<const uint8_t*>(part.first), part.second);
  } catch (const std::exception& e) {
    fail(e);
    throw;
  }
}

uint64_t ShmRing::next_size(const WaitOptions& options) {
  if (!segment_.data()) throw std::logic_error("get on a closed channel");
  if (is_writer()) throw std::logic_error("get on a channel's writer end");
  if (broken_) throw PeerDiedError("the channel is unusable after an earlier error: " + broken_reason_);
  wait_for_data(pos_ + kFrameHeader, options);
  uint64_t length = 0;
  copy_out(pos_, reinterpret_cast<uint8_t*>(&length), kFrameHeader);
  return length;
}

void ShmRing::read(void* dst, uint64_t size, const WaitOptions& options) {
  const uint64_t length = next_size(options);
  if (length != size) {
    throw std::invalid_argument("read of " + std::to_string(size) + " bytes but the next frame has " + std::to_string(length));
  }
  std::atomic<uint64_t>& my_pos = read_pos_[index_ * kPosStride];
  uint8_t* out = static_cast<uint8_t*>(dst);
  const uint64_t frame = kFrameHeader + length;
  if (frame <= capacity_) {
    wait_for_data(pos_ + frame, options);  // a timeout here leaves this reader's position untouched
    copy_out(pos_ + kFrameHeader, out, length);
    pos_ += frame;
    my_pos.store(pos_, std::memory_order_release);
    notify_waiters(segment_.futex());
    return;
  }
  try {
    pos_ += kFrameHeader;
    my_pos.store(pos_, std::memory_order_release);
    notify_waiters(segment_.futex());
    uint64_t left = length;
    while (left > 0) {
      wait_for_data(pos_ + 1, options);
      const uint64_t k = std::min(left, write_pos_->load(std::memory_order_acquire) - pos_);
      copy_out(pos_, out, k);
      pos_ += k;
      out += k;
      left -= k;
      my_pos.store(pos_, std::memory_order_release);
      notify_waiters(segment_.futex());
    }
  } catch (const std::exception& e) {
    fail(e);
    throw;
  }
}

}  // namespace distributed
}  // namespace pagedcore
