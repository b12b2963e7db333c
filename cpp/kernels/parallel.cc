#include "kernels/parallel.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include <link.h>
#include <pthread.h>
#include <sched.h>

#ifdef PAGEDCORE_KERNELS_OPENMP
#include <omp.h>
#endif

namespace pagedcore {
namespace kernels {
namespace {

// True on a thread while it runs a pool job's tasks: a parallel_for from inside a task runs its tasks
// inline (the pool takes one job at a time; waiting for it there would deadlock), as OpenMP's path does
// under omp_in_parallel().
thread_local bool t_in_job = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

int affinity_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

// A persistent pool: the caller is thread 0, workers are 1..n-1. Workers spin for a short while
// (PAGEDCORE_POOL_SPIN_US, default 20 us) after a job before sleeping on a condition variable, so
// back-to-back kernel calls (one per layer) skip the futex wake-up; they never spin longer, so a
// torch GEMM that follows gets the cores.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
    if (const char* env = std::getenv("PAGEDCORE_POOL_SPIN_US")) spin_us_ = std::atoi(env);
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      generation_.fetch_add(1);
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  int num_threads() const { return num_threads_; }

  // Up to max_threads threads (the caller and max_threads - 1 workers) take the tasks.
  void run(int num_tasks, TaskFn fn, void* ctx, int max_threads) {
    std::lock_guard<std::mutex> call_lock(call_mu_);  // one job at a time (two Python threads)
    InJob in_job;
    const int threads = max_threads < num_threads_ ? (max_threads < 1 ? 1 : max_threads) : num_threads_;
    int helpers = num_tasks - 1 < threads - 1 ? num_tasks - 1 : threads - 1;
    fn_ = fn;
    ctx_ = ctx;
    num_tasks_ = num_tasks;
    next_task_.store(0);
    max_helper_ = helpers;
    pending_.store(num_threads_ - 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      generation_.fetch_add(1);
    }
    cv_.notify_all();
    work(0);
    // Spin briefly, then yield: on an oversubscribed machine the worker we wait for may be
    // descheduled, and spinning would only burn the time slice it needs.
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins < 4096) cpu_relax();
      else std::this_thread::yield();
    }
  }

 private:
  // Marks the calling thread as inside a job for its scope (a nested parallel_for then runs inline).
  struct InJob {
    InJob() { t_in_job = true; }
    ~InJob() { t_in_job = false; }
  };
  void work(int thread) {
    for (;;) {
      int task = next_task_.fetch_add(1, std::memory_order_relaxed);
      if (task >= num_tasks_) break;
      fn_(ctx_, task, thread);
    }
  }
  void worker_loop(int thread) {
    uint64_t seen = 0;
    for (;;) {
      auto spin_end = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
      for (uint32_t spins = 1; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        cpu_relax();
        if (spins % kSpinsPerClockRead == 0 && std::chrono::steady_clock::now() >= spin_end) break;
      }
      if (generation_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_.load() != seen; });
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_) return;
      if (thread <= max_helper_) {
        InJob in_job;
        work(thread);
      }
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  // Pauses between two clock reads of a worker's spin. A read after every pause (a vDSO call) made the worker
  // notice a new job 0.65 us late on average, 0.20 us with a read every 32 (timed inside the pool, Zen 5 VM,
  // 2026-12-05); single-stream Q4_0 decode 0.94x the time (10 alternated process pairs), the workload equal.
  static constexpr uint32_t kSpinsPerClockRead = 32;
  const int num_threads_;
  int spin_us_ = 20;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  bool stop_ = false;
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int num_tasks_ = 0;
  int max_helper_ = 0;
  std::atomic<int> next_task_{0};
  std::atomic<int> pending_{0};
};

// Leaked on purpose: joining threads from a static destructor at interpreter exit can deadlock.
// A forked child has none of the parent's workers: it drops (leaks) the pool and builds its own.
std::atomic<ThreadPool*> g_pool{nullptr};
std::mutex g_pool_mu;

ThreadPool& pool() {
  ThreadPool* p = g_pool.load(std::memory_order_acquire);
  if (p) return *p;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  p = g_pool.load(std::memory_order_relaxed);
  if (!p) {
    p = new ThreadPool(affinity_cpus());
    g_pool.store(p, std::memory_order_release);
    static const int registered = pthread_atfork(nullptr, nullptr, [] {
      g_pool.store(nullptr);
      new (&g_pool_mu) std::mutex();  // the parent's lock state is meaningless in the child
    });
    (void)registered;
  }
  return *p;
}

// OpenMP runtimes mapped into this process (libgomp*, libiomp*, libomp*). Two of them (e.g. a
// torch build that bundles a renamed libgomp-<hash>.so.1, or LLVM's libomp) would mean two thread
// teams spinning against each other; then the pool is the lesser evil.
int count_openmp_runtimes() {
  int count = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        const char* name = info->dlpi_name ? std::strrchr(info->dlpi_name, '/') : nullptr;
        name = name ? name + 1 : info->dlpi_name;
        if (name && (std::strncmp(name, "libgomp", 7) == 0 || std::strncmp(name, "libiomp", 7) == 0 ||
                     std::strncmp(name, "libomp", 6) == 0))
          ++*static_cast<int*>(data);
        return 0;
      },
      &count);
  return count;
}

Threading initial_threading() {
  const char* env = std::getenv("PAGEDCORE_KERNEL_THREADING");
  if (env && std::strcmp(env, "pool") == 0) return Threading::kPool;
  if (env && std::strcmp(env, "openmp") == 0 && openmp_available()) return Threading::kOpenMP;
  if (!openmp_available() || count_openmp_runtimes() > 1) return Threading::kPool;
  return Threading::kOpenMP;
}

std::atomic<int>& threading_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_threading())};
  return slot;
}

}  // namespace

bool openmp_available() {
#ifdef PAGEDCORE_KERNELS_OPENMP
  return true;
#else
  return false;
#endif
}

Threading active_threading() { return static_cast<Threading>(threading_slot().load()); }

void set_active_threading(Threading threading) {
  if (!openmp_available()) threading = Threading::kPool;
  threading_slot().store(static_cast<int>(threading));
}

int max_threads() {
#ifdef PAGEDCORE_KERNELS_OPENMP
  const int omp_threads = omp_get_max_threads();
  if (active_threading() == Threading::kOpenMP) return omp_threads;
  return omp_threads < pool().num_threads() ? omp_threads : pool().num_threads();
#else
  return pool().num_threads();
#endif
}

namespace {

DecodeThreading initial_decode_threading() {
  const char* env = std::getenv("PAGEDCORE_DECODE_THREADING");
  if (env && std::strcmp(env, "pool") == 0) return DecodeThreading::kPool;
  if (env && std::strcmp(env, "openmp") == 0) return DecodeThreading::kOpenMP;
  if (env && std::strcmp(env, "auto") == 0) return DecodeThreading::kAuto;
  return DecodeThreading::kInherit;
}

std::atomic<int>& decode_threading_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_decode_threading())};
  return slot;
}

}  // namespace

DecodeThreading decode_threading() { return static_cast<DecodeThreading>(decode_threading_slot().load()); }

void set_decode_threading(DecodeThreading threading) { decode_threading_slot().store(static_cast<int>(threading)); }

ThreadingScope::ThreadingScope(DecodeThreading threading, int64_t tokens_per_forward)
    : saved_(active_threading()) {
  if (threading == DecodeThreading::kAuto)
    threading = tokens_per_forward <= kAutoPoolMaxTokens ? DecodeThreading::kPool : DecodeThreading::kInherit;
  if (threading == DecodeThreading::kInherit) return;
  set_active_threading(threading == DecodeThreading::kPool ? Threading::kPool : Threading::kOpenMP);
  changed_ = active_threading() != saved_;
}

ThreadingScope::~ThreadingScope() {
  if (changed_) set_active_threading(saved_);
}

void parallel_for_raw(int num_tasks, TaskFn fn, void* ctx) {
  if (num_tasks <= 0) return;
  if (num_tasks == 1) {
    fn(ctx, 0, 0);
    return;
  }
#ifdef PAGEDCORE_KERNELS_OPENMP
  if (active_threading() == Threading::kOpenMP) {
    int nt = omp_get_max_threads();
    if (nt > num_tasks) nt = num_tasks;
    if (nt <= 1 || omp_in_parallel()) {
      for (int t = 0; t < num_tasks; ++t) fn(ctx, t, 0);
      return;
    }
    std::atomic<int> next{0};
#pragma omp parallel num_threads(nt)
    {
      int thread = omp_get_thread_num();
      for (;;) {
        int task = next.fetch_add(1, std::memory_order_relaxed);
        if (task >= num_tasks) break;
        fn(ctx, task, thread);
      }
    }
    return;
  }
#endif
  const int threads = max_threads();
  if (threads <= 1 || t_in_job) {  // one thread (or nested in a pool task): no workers to wake
    for (int t = 0; t < num_tasks; ++t) fn(ctx, t, 0);
    return;
  }
  pool().run(num_tasks, fn, ctx, threads);
}

}  // namespace kernels
}  // namespace pagedcore
