// What the emulated CUDA kernel tests share (emulated_*_test.cc): the EXPECT macro and its failure
// count, a host buffer standing in for device memory, and the test entry points main() runs.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "device_common.cuh"

namespace pagedcore {
namespace cuda {
namespace emulated_test {

inline int g_failures = 0;  // checks failed, over every test file

#define EXPECT(cond, ...)                                     \
  do {                                                        \
    if (!(cond)) {                                            \
      ++g_failures;                                           \
      std::fprintf(stderr, "%s:%d: FAILED %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
    }                                                         \
  } while (0)

// A host buffer standing in for device memory, in one of the three dtypes.
struct Buffer {
  DType dtype;
  std::vector<unsigned char> bytes;
  Buffer(DType t, size_t n) : dtype(t), bytes(n * static_cast<size_t>(dtype_size(t)) + 16) {}
  void* data() { return bytes.data(); }
  float get(size_t i) const { return load_as_float(bytes.data(), static_cast<int64_t>(i), dtype); }
  void set(size_t i, float v) { store_from_float(bytes.data(), static_cast<int64_t>(i), dtype, v); }
};

// What the kernels would see: v rounded to the dtype.
inline float round_to(DType t, float v) {
  Buffer b(t, 1);
  b.set(0, v);
  return b.get(0);
}

void test_attention();          // paged attention against the double-precision reference
void test_checks();             // paged attention's argument checks
void test_reshape_and_cache();  // cache writes
void test_copy_and_swap();      // block copies and swaps

}  // namespace emulated_test
}  // namespace cuda
}  // namespace pagedcore
