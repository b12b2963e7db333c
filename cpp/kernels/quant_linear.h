// Internal: the quantized linear family (linear.h's WeightFormat kInt8PerChannel, kQ8_0, kQ4_0,
// kQ4_1, kQ5_0, kQ5_1, kQ4_K, kQ5_K, kQ6_K, and their 16-row repacked forms kQ*x16). linear() hands these
// formats to quant_linear(), which quantizes x per block to int8 (as llama.cpp does), runs the per-ISA integer dot-product kernels
// (quant_linear_<isa>.cc, written once in quant_linear_impl.h) on tasks of rows x weight rows and
// finishes each task with the dense family's epilogue (bias, SwiGLU, bf16 out).
//
// Plain data and declarations only (included by units compiled for different instruction sets).
#pragma once

#include <cstdint>

#include "kernels/cpu_isa.h"
#include "kernels/linear.h"
#include "kernels/linear_kernel.h"

namespace pagedcore {
namespace kernels {

// True for the formats this family computes (every one but the dense ones).
bool is_quantized_format(WeightFormat format);
// True for the repacked 16-row formats (kQ4_0x16, kQ4_1x16, kQ5_0x16, kQ5_1x16, kQ8_0x16, kQ4_Kx16,
// kQ5_Kx16, kQ6_Kx16, kInt8PerChannelX16).
bool is_x16_format(WeightFormat format);
// True for kInt8PerChannel and kInt8PerChannelX16 (per-row fp32 scales, x quantized per row).
bool is_int8_per_channel(WeightFormat format);
// Weights per block along K (32; 256 for the k-quants; 1 for kInt8PerChannel), and the bytes of one
// weight row of K weights (K a multiple of the block); -1 for a dense or unknown format.
int64_t quant_block_size(WeightFormat format);
int64_t quant_row_bytes(WeightFormat format, int64_t K);

// The kernels of the family that run for `isa` (rule in cpu_isa.h): `from_active` is true when the
// caller named no ISA (the active one), which on a CPU with AVX512-VNNI promotes avx512 to it.
Isa quant_kernel_isa(Isa isa, bool from_active);

// Whether the kernels of `isa` (already mapped by quant_kernel_isa()) compute `format`: every ISA
// runs the GGUF and int8 formats; the repacked x16 formats run where a 16-lane kernel exists.
bool has_quant_kernel(WeightFormat format, Isa isa);

// The checked call (linear.h's contract). `isa` is already mapped by quant_kernel_isa().
Status quant_linear(const LinearParams& p, Isa isa);

// x quantized per block, as every kernel reads it. A row of q is x's row scaled by 1 / d of its
// block and rounded to nearest (ties to even) into [-127, 127]: d = max|x over the block| / 127
// (0 for an all-zero block). Rows are padded with zeros to q_stride (a multiple of 64, >= K + 32),
// so a kernel may read a 64-byte vector starting at any 32-byte block inside K.
struct QuantizedX {
  const int8_t* q = nullptr;       // [M, q_stride]
  int64_t q_stride = 0;
  const float* d = nullptr;        // [M, d_stride]: one scale per block of `block` values
  int64_t d_stride = 0;
  const float* s = nullptr;        // [M, s_stride]: d * sum(q) over each 32 values (block 32 only)
  int64_t s_stride = 0;
  const int16_t* bsum = nullptr;   // [M, bsum_stride]: sum(q) over each 16 values (block 256 only)
  int64_t bsum_stride = 0;
};

// Quantizes rows [m_begin, m_end) of x [M, K] (fp32 or bf16, row stride x_stride) in blocks of
// `block` (32, 256, or K for one scale per row) into the buffers qx points at (sized by the caller
// for the padded strides). Portable code: every ISA's kernel reads the same integers.
void quantize_x_rows(const void* x, DType x_dtype, int64_t x_stride, int64_t K, int64_t block,
                     int64_t m_begin, int64_t m_end, const QuantizedX& qx);

struct QuantBlockArgs {
  QuantizedX x;
  const uint8_t* w = nullptr;          // [N, row_bytes] in the kernel's format
  int64_t row_bytes = 0;
  const float* w_scales = nullptr;     // [N] fp32 (kInt8PerChannel and its x16 layout only)
  int64_t K = 0;
  bool n_outer = false;                // weight rows outer (few rows of x: stream W once)
};

// dst[(m - m_begin) * dst_stride + (n - n_begin)] = x[m] . W[n] (raw fp32 sums, no bias).
using QuantBlockFn = void (*)(const QuantBlockArgs& a, int64_t m_begin, int64_t m_end, int64_t n_begin,
                              int64_t n_end, float* dst, int64_t dst_stride);

// quantize_x_rows' signature: one ISA's quantizer (the same bytes as quantize_x_rows, faster).
using QuantizeRowsFn = void (*)(const void* x, DType x_dtype, int64_t x_stride, int64_t K, int64_t block,
                                int64_t m_begin, int64_t m_end, const QuantizedX& qx);

// One ISA's kernels, indexed by WeightFormat (nullptr for the dense formats), and its quantizer.
struct QuantIsaKernels {
  QuantBlockFn formats[kNumWeightFormats];
  QuantizeRowsFn quantize_rows;
};

namespace quant_generic { const QuantIsaKernels& quant_kernels(); }
namespace quant_generic16 { const QuantIsaKernels& quant_kernels(); }
namespace quant_avx2 { const QuantIsaKernels& quant_kernels(); }
namespace quant_avx512 { const QuantIsaKernels& quant_kernels(); }
namespace quant_avx512_vnni { const QuantIsaKernels& quant_kernels(); }

}  // namespace kernels
}  // namespace pagedcore
