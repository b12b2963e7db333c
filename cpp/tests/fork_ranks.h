// Runs one function per rank in fork()ed processes for the shared-memory tests: rank 0 in this
// process, ranks 1.. in children. A child reports failure by its exit status (and prints why).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "check.h"

namespace pagedcore_test {

// Forks `count` children running fn(1 .. count); returns their pids (children never return).
inline std::vector<pid_t> fork_children(int count, const std::function<void(int)>& fn) {
  std::vector<pid_t> pids;
  std::fflush(stdout);
  for (int r = 1; r <= count; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw Failure("fork failed");
    if (pid == 0) {
      int code = 0;
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::printf("  child rank %d: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(stdout);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  return pids;
}

// Waits for the children; a failure names the rank that failed.
inline void expect_children_ok(const std::vector<pid_t>& pids) {
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw Failure("child rank " + std::to_string(i + 1) + " failed (status " + std::to_string(status) + ")");
    }
  }
}

// Rank 0 here, ranks 1 .. world_size - 1 in children; every rank must succeed.
inline void run_ranks(int world_size, const std::function<void(int)>& fn) {
  std::vector<pid_t> pids = fork_children(world_size - 1, fn);
  try {
    fn(0);
  } catch (...) {
    for (pid_t pid : pids) ::kill(pid, SIGKILL);
    for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
    throw;
  }
  expect_children_ok(pids);
}

// A name no other test run uses.
inline std::string unique_shm_name(const char* what) {
  static int counter = 0;
  return "pagedcore-test-" + std::to_string(::getpid()) + "-" + what + "-" + std::to_string(counter++);
}

}  // namespace pagedcore_test
