// The vector passes of sample_rows over one row (sample_rows.h), compiled once per ISA from
// sample_rows_pass.inc and chosen by the active ISA. Every unit works on 16 fp32 lanes (one AVX-512
// register, two AVX2 or four SSE2 ones), element i of a block in lane i mod 16, sums reduced in one
// fixed tree and no FMA contraction: the weights, block sums and so the tokens are bit-identical on
// every ISA (tests/kernels/test_sample_rows.py runs each one the CPU has).
#pragma once

#include <cstdint>

#include "kernels/cpu_isa.h"

namespace pagedcore {
namespace kernels {

struct SamplePass {
  // The largest value of x [n] (NaNs skipped); -inf when there is none.
  float (*row_max)(const float* x, int64_t n);
  // In place, x [n] -> w = exp((x - max) * inv_t) (0 below exp(-87) and for NaN), and per block of
  // kSampleBlock tokens its sum and largest weight: block_sum, block_max [ceil(n / kSampleBlock)].
  void (*to_weights)(float* x, int64_t n, float max, float inv_t, float* block_sum, float* block_max);
  // The sum of the weights >= tau among w [n], n <= kSampleBlock (one block).
  float (*kept_sum)(const float* w, int64_t n, float tau);
};

const SamplePass& sample_pass(Isa isa);

namespace sample_generic { const SamplePass& pass(); }
namespace sample_avx2 { const SamplePass& pass(); }
namespace sample_avx512 { const SamplePass& pass(); }

}  // namespace kernels
}  // namespace pagedcore
