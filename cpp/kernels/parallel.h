// How the CPU kernels spread work over cores: a dynamic task loop over OpenMP (default when built
// with it) or over a small persistent std::thread pool.
//
// Why OpenMP by default (measured with bench/bench_attention.py --threading; figures in its docstring): torch's CPU wheel ships its
// libgomp under the soname libgomp.so.1, so the dynamic loader maps ours and torch's to one runtime
// and one thread team. Our parallel regions reuse torch's spinning workers (no wake-up latency) and
// leave no second team spinning beside torch's GEMMs. A private pool cannot avoid competing with
// torch's spinning OpenMP workers on a 2-core machine. When two OpenMP runtimes are mapped (a torch
// build whose runtime is renamed or not GNU's) the pool is chosen instead;
// PAGEDCORE_KERNEL_THREADING=pool|openmp overrides the choice. This is the library's default: the Python
// engine switches a process to the pool when every linear layer of its model runs these kernels (no torch
// GEMM in a step to share a team with; python/pagedcore/ops/kernel_threading.py has the rule and figures).
#pragma once

#include <cstdint>
#include <type_traits>

namespace pagedcore {
namespace kernels {

enum class Threading { kOpenMP = 0, kPool = 1 };

// OpenMP when the build has it, one OpenMP runtime is mapped, and PAGEDCORE_KERNEL_THREADING is not
// "pool". Decided at the first call.
Threading active_threading();
void set_active_threading(Threading threading);  // falls back to kPool without OpenMP
bool openmp_available();

// Threads a parallel_for may use: omp_get_max_threads(), which follows torch.set_num_threads on the
// calling thread (the pool too, capped at the CPUs this process may run on; without OpenMP, those CPUs).
int max_threads();

// The threading the one-call decode (greedy_decode.h run / run_steps) runs under: kInherit (the default)
// keeps the active one; kPool / kOpenMP switch to it for the call; kAuto takes the pool for forwards of at
// most kAutoPoolMaxTokens tokens (single-stream, small batches) and keeps the active threading for larger
// ones. A token's ~150 fork/joins cost 0.16 us each on the pool against 0.45-1.6 us under OpenMP (Zen 5
// VM), but switching per call did not pay: single-stream decode alternated in one process (2026-12-04)
// ran auto 2.610 / pool-for-everything 2.492 / inherit 2.572 ms a token, and auto lost in two of three
// other runs (docs/performance.md). PAGEDCORE_DECODE_THREADING=inherit|auto|pool|openmp, read at first use.
enum class DecodeThreading { kInherit = 0, kOpenMP = 1, kPool = 2, kAuto = 3 };
constexpr int64_t kAutoPoolMaxTokens = 8;
DecodeThreading decode_threading();
void set_decode_threading(DecodeThreading threading);

// Sets the active threading for a scope and restores it after (kInherit: no change; kAuto: the pool for a
// forward of at most kAutoPoolMaxTokens tokens, else no change).
class ThreadingScope {
 public:
  ThreadingScope(DecodeThreading threading, int64_t tokens_per_forward);
  ~ThreadingScope();
  ThreadingScope(const ThreadingScope&) = delete;
  ThreadingScope& operator=(const ThreadingScope&) = delete;

 private:
  Threading saved_;
  bool changed_ = false;
};

using TaskFn = void (*)(void* ctx, int task, int thread);
// Runs fn(ctx, task, thread) for every task in [0, num_tasks) on up to max_threads() threads,
// tasks handed out in order by an atomic counter; thread is in [0, max_threads()). Returns when
// all tasks are done.
void parallel_for_raw(int num_tasks, TaskFn fn, void* ctx);

template <class F>
void parallel_for(int num_tasks, F&& f) {
  using Fn = typename std::remove_reference<F>::type;
  parallel_for_raw(
      num_tasks, [](void* ctx, int task, int thread) { (*static_cast<Fn*>(ctx))(task, thread); },
      static_cast<void*>(&f));
}

}  // namespace kernels
}  // namespace pagedcore
