// Fused elementwise ops of a decoder layer: RMSNorm with the residual add before it, and the rotary
// embedding of q and k. One pass over the rows each, instead of the 3-5 torch ops (and their
// dispatch) they replace; rounding as torch's op-by-op sequence, so bf16 results are bit-identical
// to it and fp32 ones equal up to the summation order of the mean of squares.
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"
#include "kernels/linear.h"

namespace pagedcore {
namespace kernels {

// Without residual:  out = weight * (x / sqrt(mean(x^2) + eps))
// With residual:     residual = residual + x;  out = weight * (residual / sqrt(mean(residual^2) + eps))
// computed in fp32; for bf16 the normalised value is rounded to bf16 before the weight multiply
// (HF Llama's order), the sum rounded once. Rows may alias: out == x is allowed (in place).
//   x        [rows, n], row stride x_stride, last stride 1
//   residual [rows, n], row stride residual_stride, or nullptr
//   out      [rows, n], row stride out_stride
//   weight   [n]
// All of dtype.
struct RmsNormParams {
  void* out = nullptr;
  void* residual = nullptr;
  const void* x = nullptr;
  const void* weight = nullptr;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t x_stride = 0;
  int64_t out_stride = 0;
  int64_t residual_stride = 0;
  float eps = 1e-6f;
  DType dtype = DType::kFloat32;
};
// The first form runs the kernels of active_isa().
Status rms_norm(const RmsNormParams& p);
Status rms_norm(const RmsNormParams& p, Isa isa);

// Rotary embedding, rotate-half convention, in place over every head of every token:
//   x1 = x[..., :half], x2 = x[..., half:], (cos, sin) = cos_sin[t, :half], cos_sin[t, half:]
//   x1' = x1 * cos - x2 * sin,  x2' = x2 * cos + x1 * sin        (each product rounded, as torch)
//   x        [num_tokens, num_heads, head_dim], strides (x_stride_token, x_stride_head, 1)
//   cos_sin  [num_tokens, head_dim], row stride cos_sin_stride: the rows of the step's positions
struct RotaryParams {
  void* x = nullptr;
  const void* cos_sin = nullptr;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;  // even
  int64_t x_stride_token = 0;
  int64_t x_stride_head = 0;
  int64_t cos_sin_stride = 0;
  DType dtype = DType::kFloat32;  // x and cos_sin
};
Status rotary_embedding(const RotaryParams& p);
Status rotary_embedding(const RotaryParams& p, Isa isa);

}  // namespace kernels
}  // namespace pagedcore
