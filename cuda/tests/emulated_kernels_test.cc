// The emulated CUDA kernel tests' entry point. The CUDA kernels run on the CPU emulator (emulator.h)
// against naive double-precision references (emulated_attention_test.cc, emulated_cache_test.cc).
// No GPU involved: this checks the kernels' logic, not the hardware.
#include <cstdio>

#include "emulated_test_support.h"

using namespace pagedcore::cuda::emulated_test;

int main() {
  test_checks();
  test_reshape_and_cache();
  test_copy_and_swap();
  test_attention();
  if (g_failures) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("all emulated kernel tests passed\n");
  return 0;
}
