// Internal: what the linear launcher (linear.cc) hands each per-ISA kernel (linear_<isa>.cc).
// Plain data and declarations only: this header is included by translation units compiled for
// different instruction sets, so nothing here may define a function (see attention_kernel.h).
#pragma once

#include <cstdint>

#include "kernels/linear.h"
#include "kernels/norm.h"

namespace pagedcore {
namespace kernels {

// Activations as a block function reads them (LinearXLayout).
//
//   fp32 weights (kF32Natural):    x32 [M, x_stride] fp32, natural order.
//   bf16 weights (kF32PairOrder):  x32 [M, x_stride] fp32 in "pair order": the vector part of each row
//     (the first K - K % (2 W) elements) in chunks of 2 W, each chunk stored as its W even-indexed
//     elements followed by its W odd-indexed ones, the tail in natural order:
//
//       x[k .. k+2W)   ->  x32[k .. k+W) = x[k], x[k+2], ..., x[k+2W-2]
//                          x32[k+W .. k+2W) = x[k+1], x[k+3], ..., x[k+2W-1]
//
//     because a 2W-element bf16 weight load splits into even and odd lanes with one shift and one
//     and (bf16 is the high half of an fp32), no shuffle.
//   bf16 x and weights on AVX512-BF16 (block_bf16_x): x16 [M, x_stride] bf16, natural order, read
//     in place; vdpbf16ps multiplies adjacent pairs.
enum class LinearXLayout : int32_t { kF32Natural = 0, kF32PairOrder = 1 };

struct LinearBlockArgs {
  const float* x32 = nullptr;
  const uint16_t* x16 = nullptr;
  int64_t x_stride = 0;
  const void* w = nullptr;  // [N, K] in the weight format of the block function
  int64_t K = 0;
  // Loop order of a block: weight tiles outer, rows of x inner (few rows: the weights stream once
  // from memory in long runs), or rows outer (many rows: the block's weights stay in L2).
  bool n_outer = false;
  // fp8x16 with block-wise scales (linear.h): fp32 [N/16][k_blocks], block_k inputs per block; else nullptr
  const float* block_scales = nullptr;
  int64_t block_k = 0;
  int64_t k_blocks = 0;
};

// dst[(m - m_begin) * dst_stride + (n - n_begin)] = x[m] . W[n] for m in [m_begin, m_end),
// n in [n_begin, n_end): raw fp32 sums, no bias.
using LinearBlockFn = void (*)(const LinearBlockArgs& a, int64_t m_begin, int64_t m_end, int64_t n_begin,
                               int64_t n_end, float* dst, int64_t dst_stride);

// The epilogue of one task: rows x cols raw sums (g; for kSiluMul also u, the up rows) -> out.
// bias_g / bias_u point at the task's first column's bias (nullptr: none); scale_g / scale_u likewise at
// its rows' fp32 weight scales (fp8 weights: each sum times its row's scale first, then the bias).
struct LinearEpilogueArgs {
  const float* g = nullptr;
  const float* u = nullptr;   // kSiluMul only
  int64_t sum_stride = 0;     // row stride of g and u
  const void* bias_g = nullptr;
  const void* bias_u = nullptr;
  const float* scale_g = nullptr;  // [cols] fp32, or nullptr: no scale
  const float* scale_u = nullptr;  // [cols] fp32 (kSiluMul, with scale_g)
  void* out = nullptr;        // the task's first element
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  DType bias_dtype = DType::kFloat32;
  DType out_dtype = DType::kFloat32;
  LinearEpilogue kind = LinearEpilogue::kNone;
};
using LinearEpilogueFn = void (*)(const LinearEpilogueArgs& a);

// Sum of bytes / 4 floats from data (a bandwidth probe; the value is meaningless).
using LinearReadFn = float (*)(const void* data, int64_t bytes);

// norm.h's ops over rows [begin, end) of a checked call (tokens, for the rotary embedding).
using RmsNormRowsFn = void (*)(const RmsNormParams& p, int64_t row_begin, int64_t row_end);
using RotaryRowsFn = void (*)(const RotaryParams& p, int64_t token_begin, int64_t token_end);

// One row of an ISA's table: the inner loops of one weight format.
struct LinearFormatKernels {
  LinearBlockFn block = nullptr;  // reads fp32 x32 in x_layout; nullptr: this ISA lacks the format
  LinearXLayout x_layout = LinearXLayout::kF32Natural;
  LinearBlockFn block_bf16_x = nullptr;  // reads bf16 x16 in place (bf16 dot products); nullptr: none
};

// The kernels of one ISA: a new weight format is a new row of `formats`, in every ISA's table
// (linear_impl.h), not a new field.
struct LinearIsaKernels {
  int lanes;  // W: the pair-order chunk is 2 W
  LinearFormatKernels formats[kNumWeightFormats];  // indexed by WeightFormat
  LinearEpilogueFn epilogue;
  LinearReadFn read;
  RmsNormRowsFn rms_norm_rows;
  RotaryRowsFn rotary_rows;
};

// The kernels of `isa`; the caller has checked isa_supported(isa).
const LinearIsaKernels& linear_isa_kernels(Isa isa);

namespace linear_generic8 { const LinearIsaKernels& linear_kernels(); }
namespace linear_generic16 { const LinearIsaKernels& linear_kernels(); }
namespace linear_generic16_bf16dot { const LinearIsaKernels& linear_kernels(); }
namespace linear_avx2 { const LinearIsaKernels& linear_kernels(); }
namespace linear_avx512 { const LinearIsaKernels& linear_kernels(); }
namespace linear_avx512_bf16dot { const LinearIsaKernels& linear_kernels(); }

}  // namespace kernels
}  // namespace pagedcore
