// The shared-memory ring behind a Channel across fork()ed processes: FIFO order of variable-size
// frames to every reader, backpressure with a small ring, frames larger than the ring streamed
// through, timeouts that leave the ring usable, and a dead writer or reader raising PeerDiedError.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "distributed/shm_ring.h"
#include "distributed/shm_segment.h"
#include "fork_ranks.h"

using namespace pagedcore::distributed;
using pagedcore_test::unique_shm_name;

namespace {

WaitOptions quick(double timeout_s = 30) {
  WaitOptions o;
  o.timeout_s = timeout_s;
  o.check_interval_ms = 10;
  return o;
}

// Message k: its bytes are a function of (k, position); lengths vary from 0 to ~3x a 4 KiB ring.
std::vector<uint8_t> message(int k) {
  const size_t length = static_cast<size_t>((k * 2654435761u) % 12000);
  std::vector<uint8_t> m(length);
  for (size_t i = 0; i < length; ++i) m[i] = static_cast<uint8_t>((i * 31 + k * 7) & 0xff);
  return m;
}

std::vector<uint8_t> read_one(ShmRing& ring, const WaitOptions& o) {
  std::vector<uint8_t> got(ring.next_size(o));
  ring.read(got.data(), got.size(), o);
  return got;
}

}  // namespace

TEST(two_readers_get_every_frame_in_order_through_a_small_ring) {
  const std::string name = unique_shm_name("ring");
  ShmRing::create(name, 2, 4096);
  constexpr int kMessages = 300;
  std::vector<pid_t> readers = pagedcore_test::fork_children(2, [&](int r) {
    ShmRing ring(name, static_cast<uint32_t>(r - 1));
    for (int k = 0; k < kMessages; ++k) {
      if (read_one(ring, quick()) != message(k)) throw std::runtime_error("frame " + std::to_string(k) + " differs");
    }
  });
  ShmRing writer(name, ShmRing::kWriter);
  for (int k = 0; k < kMessages; ++k) {
    const std::vector<uint8_t> m = message(k);
    // Two parts: the frame is their concatenation.
    const size_t half = m.size() / 2;
    writer.write({{m.data(), half}, {m.data() + half, m.size() - half}}, quick());
  }
  pagedcore_test::expect_children_ok(readers);
}

TEST(a_live_process_is_not_taken_for_a_reused_pid) {
  // The start time a process records for itself must be the one its peers read for its pid (under QEMU's
  // user-mode emulator the process's own /proc/<pid>/stat is answered by the emulator: a forked child got its
  // parent's start time, and a reader declared a live writer's pid reused).
  const int parent = static_cast<int>(getpid());
  const uint64_t parent_start = process_start_time(parent);
  CHECK(parent_start != 0);
  std::vector<pid_t> children = pagedcore_test::fork_children(1, [&](int) {
    const uint64_t own = process_start_time(static_cast<int>(getpid()));
    if (own == 0 || own < parent_start) throw std::runtime_error("the child's own start time is off");
    if (!process_gone_reason(parent, parent_start).empty()) throw std::runtime_error("the live parent is gone");
    if (!process_gone_reason(static_cast<int>(getpid()), own).empty()) throw std::runtime_error("self is gone");
  });
  pagedcore_test::expect_children_ok(children);
}

TEST(the_writer_waits_for_the_slowest_reader) {
  const std::string name = unique_shm_name("backpressure");
  ShmRing::create(name, 1, 256);
  ShmRing writer(name, ShmRing::kWriter);
  ShmRing reader(name, 0);
  std::vector<uint8_t> m(100, 7);
  writer.write({{m.data(), m.size()}}, quick());
  writer.write({{m.data(), m.size()}}, quick());  // 2 x 108 bytes of 256
  bool timed_out = false;
  try {
    writer.write({{m.data(), m.size()}}, quick(0.1));  // no room until the reader reads
  } catch (const WaitTimeoutError&) {
    timed_out = true;
  }
  CHECK(timed_out);
  CHECK(read_one(reader, quick()) == m);
  writer.write({{m.data(), m.size()}}, quick(0.1));  // room again; the timeout broke nothing
  CHECK(read_one(reader, quick()) == m);
  CHECK(read_one(reader, quick()) == m);
  timed_out = false;
  try {
    reader.next_size(quick(0.05));
  } catch (const WaitTimeoutError&) {
    timed_out = true;
  }
  CHECK(timed_out);
}

TEST(a_dead_writer_is_detected_after_its_frames_are_read) {
  const std::string name = unique_shm_name("deadwriter");
  ShmRing::create(name, 1, 4096);
  std::vector<pid_t> child = pagedcore_test::fork_children(1, [&](int) {
    ShmRing writer(name, ShmRing::kWriter);
    for (int k = 0; k < 2; ++k) {
      const std::vector<uint8_t> m = message(k + 1);
      writer.write({{m.data(), m.size()}}, quick());
    }
    ::raise(SIGKILL);
  });
  ShmRing reader(name, 0);
  CHECK(read_one(reader, quick()) == message(1));
  CHECK(read_one(reader, quick()) == message(2));
  const auto start = std::chrono::steady_clock::now();
  bool died = false;
  try {
    reader.next_size(quick(60));
  } catch (const PeerDiedError&) {
    died = true;
  }
  CHECK(died);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 10);
  ::waitpid(child[0], nullptr, 0);
}

TEST(a_dead_reader_fails_a_blocked_writer) {
  const std::string name = unique_shm_name("deadreader");
  ShmRing::create(name, 2, 256);
  std::vector<pid_t> child = pagedcore_test::fork_children(1, [&](int) {
    ShmRing reader(name, 1);
    ::raise(SIGKILL);  // never reads
  });
  ShmRing writer(name, ShmRing::kWriter);
  ShmRing reader0(name, 0);
  std::vector<uint8_t> m(100, 1);
  bool died = false;
  try {
    for (int k = 0; k < 10; ++k) {
      writer.write({{m.data(), m.size()}}, quick(60));
      read_one(reader0, quick());
    }
  } catch (const PeerDiedError&) {
    died = true;
  }
  CHECK(died);
  ::waitpid(child[0], nullptr, 0);
}

TEST(a_closed_writer_lets_readers_drain_then_raises) {
  const std::string name = unique_shm_name("closedwriter");
  ShmRing::create(name, 1, 1024);
  ShmRing reader(name, 0);
  {
    ShmRing writer(name, ShmRing::kWriter);
    std::vector<uint8_t> m(10, 3);
    writer.write({{m.data(), m.size()}}, quick());
  }
  CHECK_EQ(read_one(reader, quick()).size(), static_cast<size_t>(10));
  CHECK_THROWS(reader.next_size(quick(30)));
}

int main() { return pagedcore_test::run_all(); }
