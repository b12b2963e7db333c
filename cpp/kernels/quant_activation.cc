// Activations quantized per block to int8 (QuantizedX, quant_linear.h): Q8_0 / Q8_1 for the
// 32-weight block formats, Q8_K (256-blocks with 16-value sums) for the k-quants, one scale per row
// for int8 per channel. Portable C++ compiled with -ffp-contract=off: these are the reference bytes,
// which tests reproduce exactly in float32 numpy; each SIMD unit quantizes with its own copy
// (quant_activation_impl.h), held to these bytes by cpp/tests/test_quant_activation.cc.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant_blocks.h"
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace kernels {
namespace {

// Round to nearest, ties to even, for |v| < 2^22 (here |v| <= 127.5): adding and subtracting 1.5 * 2^23
// leaves no fraction bits (what np.rint does; vectorises without SSE4.1's roundps). Needs IEEE
// arithmetic: this unit is never built with -ffast-math.
inline float round_even(float v) {
  const float magic = 12582912.f;
  return (v + magic) - magic;
}

// x[m, k0 .. k0 + n) as fp32 into dst.
void load_row(const void* x, DType dtype, int64_t offset, int64_t n, float* dst) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, static_cast<const float*>(x) + offset, n * sizeof(float));
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(x) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  }
}

}  // namespace

void quantize_x_rows(const void* x, DType x_dtype, int64_t x_stride, int64_t K, int64_t block,
                     int64_t m_begin, int64_t m_end, const QuantizedX& qx) {
  float buf[kBlockK];
  for (int64_t m = m_begin; m < m_end; ++m) {
    int8_t* q = const_cast<int8_t*>(qx.q) + m * qx.q_stride;
    float* d = const_cast<float*>(qx.d) + m * qx.d_stride;
    float* s = qx.s ? const_cast<float*>(qx.s) + m * qx.s_stride : nullptr;
    int16_t* bsum = qx.bsum ? const_cast<int16_t*>(qx.bsum) + m * qx.bsum_stride : nullptr;
    // One pass for the block's max |x|, one to scale and round (the row is re-read in pieces of
    // kBlockK values, converted from bf16 when needed).
    for (int64_t b0 = 0; b0 < K; b0 += block) {
      const int64_t len = std::min(block, K - b0);
      float amax = 0.f;
      for (int64_t k = 0; k < len; k += kBlockK) {
        const int64_t n = std::min<int64_t>(kBlockK, len - k);
        load_row(x, x_dtype, m * x_stride + b0 + k, n, buf);
        for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(buf[i]));
      }
      const float scale = amax / 127.f;
      const float inv = scale != 0.f ? 1.f / scale : 0.f;
      d[b0 / block] = scale;
      for (int64_t k = 0; k < len; k += kBlockK) {
        const int64_t n = std::min<int64_t>(kBlockK, len - k);
        load_row(x, x_dtype, m * x_stride + b0 + k, n, buf);
        for (int64_t i = 0; i < n; ++i) {
          const float r = round_even(buf[i] * inv);
          q[b0 + k + i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, r)));
        }
      }
    }
    if (K == 0) d[0] = 0.f;  // (int8 per channel: an empty row has scale 0)
    std::memset(q + K, 0, qx.q_stride - K);
    if (s) {  // d * sum(q) over each 32 (block == 32)
      for (int64_t b = 0; b < K / kBlock32; ++b) {
        int32_t sum = 0;
        for (int64_t i = 0; i < kBlock32; ++i) sum += q[b * kBlock32 + i];
        s[b] = d[b * kBlock32 / block] * static_cast<float>(sum);
      }
    }
    if (bsum) {  // sum(q) over each 16 (block == 256)
      for (int64_t b = 0; b < K / 16; ++b) {
        int32_t sum = 0;
        for (int64_t i = 0; i < 16; ++i) sum += q[b * 16 + i];
        bsum[b] = static_cast<int16_t>(sum);
      }
    }
  }
}

}  // namespace kernels
}  // namespace pagedcore
