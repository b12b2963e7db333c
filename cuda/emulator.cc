// The fiber scheduler behind emulator.h (test builds only).
#include "emulator.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace pagedcore {
namespace cuda {
namespace emu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;  // kernels keep fragments and register arrays on it
constexpr size_t kMailboxBytes = 64;

enum class State { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  ucontext_t context;
  ThreadContext thread;
  State state = State::kReady;
  int warp = 0;
  unsigned char mailbox[kMailboxBytes];
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<std::unique_ptr<char[]>> stacks;
  ucontext_t scheduler;
  int current = -1;
  int live = 0;              // fibers not done
  int block_arrived = 0;     // fibers waiting at __syncthreads
  std::vector<int> warp_live;
  std::vector<int> warp_arrived;
  std::vector<char> shared;
  const std::function<void()>* body = nullptr;
};

Block g_block;
Order g_order = Order::kForward;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "cuda emulator: %s\n", what);
  std::abort();
}

Fiber& current_fiber() {
  if (g_block.current < 0) fail("a device built-in was used outside a kernel launch");
  return g_block.fibers[static_cast<size_t>(g_block.current)];
}

void yield() {
  Fiber& f = current_fiber();
  if (swapcontext(&f.context, &g_block.scheduler) != 0) fail("swapcontext failed");
}

void release_block_if_complete() {
  if (g_block.block_arrived == 0 || g_block.block_arrived < g_block.live) return;
  for (Fiber& f : g_block.fibers) {
    if (f.state == State::kAtBlockBarrier) f.state = State::kReady;
  }
  g_block.block_arrived = 0;
}

void release_warp_if_complete(int warp) {
  const size_t w = static_cast<size_t>(warp);
  if (g_block.warp_arrived[w] == 0 || g_block.warp_arrived[w] < g_block.warp_live[w]) return;
  for (Fiber& f : g_block.fibers) {
    if (f.warp == warp && f.state == State::kAtWarpBarrier) f.state = State::kReady;
  }
  g_block.warp_arrived[w] = 0;
}

void fiber_main() {
  (*g_block.body)();
  Fiber& f = current_fiber();
  f.state = State::kDone;
  --g_block.live;
  --g_block.warp_live[static_cast<size_t>(f.warp)];
  // An exited thread no longer holds back a barrier (what the hardware does in practice).
  release_block_if_complete();
  release_warp_if_complete(f.warp);
  // returning resumes g_block.scheduler through uc_link
}

void run_block(dim3 grid, dim3 block, uint3 block_idx) {
  const int n = static_cast<int>(block.x * block.y * block.z);
  const int num_warps = (n + 31) / 32;
  g_block.fibers.assign(static_cast<size_t>(n), Fiber{});
  while (g_block.stacks.size() < static_cast<size_t>(n)) g_block.stacks.emplace_back(new char[kStackBytes]);
  g_block.live = n;
  g_block.block_arrived = 0;
  g_block.warp_live.assign(static_cast<size_t>(num_warps), 0);
  g_block.warp_arrived.assign(static_cast<size_t>(num_warps), 0);
  std::memset(g_block.shared.data(), 0xff, g_block.shared.size());
  for (int i = 0; i < n; ++i) {
    Fiber& f = g_block.fibers[static_cast<size_t>(i)];
    f.thread.block_idx = block_idx;
    f.thread.block_dim = block;
    f.thread.grid_dim = grid;
    f.thread.thread_idx = make_uint3(static_cast<unsigned>(i) % block.x, (static_cast<unsigned>(i) / block.x) % block.y,
                                     static_cast<unsigned>(i) / (block.x * block.y));
    f.thread.linear_thread = i;
    f.warp = i / 32;
    ++g_block.warp_live[static_cast<size_t>(f.warp)];
    if (getcontext(&f.context) != 0) fail("getcontext failed");
    f.context.uc_stack.ss_sp = g_block.stacks[static_cast<size_t>(i)].get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &g_block.scheduler;
    makecontext(&f.context, fiber_main, 0);
  }
  int done = 0;
  while (done < n) {
    bool progressed = false;
    for (int k = 0; k < n; ++k) {
      const int i = g_order == Order::kForward ? k : n - 1 - k;
      Fiber& f = g_block.fibers[static_cast<size_t>(i)];
      if (f.state != State::kReady) continue;
      g_block.current = i;
      if (swapcontext(&g_block.scheduler, &f.context) != 0) fail("swapcontext failed");
      g_block.current = -1;
      progressed = true;
      if (f.state == State::kDone) ++done;
    }
    if (!progressed && done < n) fail("deadlock: every live thread waits at a barrier the others never reach");
  }
}

}  // namespace

void launch(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  if (g_block.current >= 0) fail("a kernel launched from inside a kernel");
  if (block.x * block.y * block.z == 0 || block.x * block.y * block.z > 1024) fail("bad block size");
  g_block.body = &body;
  g_block.shared.assign(shared_bytes + 128, 0);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) run_block(grid, block, make_uint3(x, y, z));
    }
  }
  g_block.body = nullptr;
}

void set_order(Order order) { g_order = order; }

const ThreadContext& self() { return current_fiber().thread; }

char* shared_memory() {
  // 128-byte aligned, like the dynamic shared memory the kernels declare
  const uintptr_t base = reinterpret_cast<uintptr_t>(g_block.shared.data());
  return g_block.shared.data() + ((128 - base % 128) % 128);
}

void sync_block() {
  Fiber& f = current_fiber();
  f.state = State::kAtBlockBarrier;
  ++g_block.block_arrived;
  release_block_if_complete();
  if (f.state != State::kReady) yield();
}

void sync_warp() {
  Fiber& f = current_fiber();
  f.state = State::kAtWarpBarrier;
  ++g_block.warp_arrived[static_cast<size_t>(f.warp)];
  release_warp_if_complete(f.warp);
  if (f.state != State::kReady) yield();
}

void warp_exchange(const void* value, void* out, size_t bytes, int src_lane) {
  if (bytes > kMailboxBytes) fail("shuffle of a value wider than the mailbox");
  Fiber& f = current_fiber();
  std::memcpy(f.mailbox, value, bytes);
  sync_warp();
  const size_t src = static_cast<size_t>(f.warp * 32 + src_lane);
  if (src >= g_block.fibers.size()) fail("shuffle from a lane outside the block");
  std::memcpy(out, g_block.fibers[src].mailbox, bytes);
  sync_warp();
}

}  // namespace emu
}  // namespace cuda
}  // namespace pagedcore
