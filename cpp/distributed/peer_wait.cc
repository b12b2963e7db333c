#include "distributed/peer_wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>

namespace pagedcore {
namespace distributed {
namespace {

// FUTEX_WAIT on a word in a shared mapping (not FUTEX_PRIVATE: the waker is another process).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, double timeout_us) {
  timespec ts{static_cast<time_t>(timeout_us / 1e6), static_cast<long>(std::fmod(timeout_us, 1e6) * 1000.0)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace

void notify_waiters(const FutexPair& futex) {
  std::atomic<uint32_t>* event = futex.event;
  std::atomic<uint32_t>* sleepers = futex.sleepers;
  if (event == nullptr) return;
  // The state change before this is a release store; the RMW orders it before the sleepers read, and
  // a waiter increments sleepers before its last look at the state (see wait_until): either it sees
  // the change or this sees it asleep (or about to compare the event word, which has moved).
  event->fetch_add(1, std::memory_order_seq_cst);
  if (sleepers->load(std::memory_order_seq_cst) > 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(event), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

void wait_until(const std::function<bool()>& ready, const std::function<void()>& check_peers,
                const WaitOptions& options, const char* what, const FutexPair& futex) {
  using Clock = std::chrono::steady_clock;
  if (ready()) return;
  const Clock::time_point start = Clock::now();
  const auto check_every = std::chrono::duration<double, std::milli>(options.check_interval_ms);
  Clock::time_point next_check = start + std::chrono::duration_cast<Clock::duration>(check_every);
  for (;;) {
    for (int i = 0; i < 32; ++i) {  // a short burst between clock reads
      if (ready()) return;
      cpu_relax();
    }
    const Clock::time_point now = Clock::now();
    const double waited_us = std::chrono::duration<double, std::micro>(now - start).count();
    if (now >= next_check) {
      check_peers();
      if (options.extra_check) options.extra_check();
      if (ready()) return;  // the checks take time: look again before judging the deadline
      next_check = now + std::chrono::duration_cast<Clock::duration>(check_every);
    }
    if (options.timeout_s >= 0 && waited_us >= options.timeout_s * 1e6) {
      throw WaitTimeoutError(std::string("timed out after ") + std::to_string(options.timeout_s) + " s waiting for " +
                             what + " (the peers are alive but did not get there)");
    }
    if (waited_us < options.spin_us) continue;
    if (futex.event != nullptr) {
      // Block until a publisher bumps the event word, or until the next liveness check / deadline.
      double block_us = std::chrono::duration<double, std::micro>(next_check - now).count();
      if (options.timeout_s >= 0) block_us = std::min(block_us, options.timeout_s * 1e6 - waited_us);
      const uint32_t seen = futex.event->load(std::memory_order_seq_cst);
      futex.sleepers->fetch_add(1, std::memory_order_seq_cst);
      if (!ready()) futex_wait(futex.event, seen, std::max(block_us, 1.0));
      futex.sleepers->fetch_sub(1, std::memory_order_seq_cst);
      continue;
    }
    if (waited_us < options.yield_us) {
      sched_yield();
      continue;
    }
    const double sleep_us = std::clamp(waited_us / 20.0, 20.0, std::max(20.0, options.max_sleep_us));
    timespec ts{0, static_cast<long>(sleep_us * 1000.0)};
    nanosleep(&ts, nullptr);
  }
}

}  // namespace distributed
}  // namespace pagedcore
