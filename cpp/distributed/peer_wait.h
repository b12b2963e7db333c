// Waiting for peers in shared memory without stealing a core and without hanging on a dead one.
//
// A wait spins briefly (a peer usually arrives within microseconds when both are computing the same
// layer), then blocks in the kernel on the segment's futex word until the peer publishes (waking at
// once, and never in between: a waiter that woke up periodically would preempt the compute threads of
// the rank it waits for, and with OpenMP teams one preempted thread stalls the whole team; measured:
// single-stream decode through one worker rank ran at 7-12 tok/s with periodic sleeps against 32-36
// in one process). Without a futex word it yields, then sleeps for a time that grows with the time
// already waited. Every few tens of milliseconds it checks that the peers it waits for are
// alive (pid + start time, not a zombie) and calls an optional extra check (the Python is_alive);
// a dead peer raises PeerDiedError, a deadline WaitTimeoutError.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace pagedcore {
namespace distributed {

// A peer of this wait is gone (dead process, closed end, or the extra check said so).
struct PeerDiedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The wait's deadline passed with the peers alive but not there.
struct WaitTimeoutError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct WaitOptions {
  double timeout_s = -1;         // < 0: no deadline (liveness checks still run)
  double spin_us = 50;           // busy-wait this long first
  double yield_us = 2000;        // then sched_yield until this much time has passed
  double max_sleep_us = 1000;    // then sleep elapsed/20, at least 20 us, at most this
  double check_interval_ms = 50; // how often the liveness checks run
  // Extra liveness check, called every check interval (e.g. Python's is_alive, with the GIL taken):
  // throws PeerDiedError itself or returns normally. May be empty.
  std::function<void()> extra_check;
};

// A segment's futex pair (SegmentHeader::event / sleepers). With one, a wait blocks on `event` after
// the spin phase instead of yielding and sleeping; publishers call notify_waiters().
struct FutexPair {
  std::atomic<uint32_t>* event = nullptr;
  std::atomic<uint32_t>* sleepers = nullptr;
};

// After a state change peers may wait for: bumps the event word and wakes the sleepers (a syscall only
// when one sleeps).
void notify_waiters(const FutexPair& futex);

// Waits until ready() is true. check_peers() is called every check interval and throws
// PeerDiedError for a dead peer; `what` names the wait in the timeout message.
void wait_until(const std::function<bool()>& ready, const std::function<void()>& check_peers,
                const WaitOptions& options, const char* what, const FutexPair& futex = FutexPair());

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace distributed
}  // namespace pagedcore
