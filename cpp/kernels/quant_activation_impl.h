// The activation quantizer of one ISA unit: the integers and scales of quant_activation.cc's portable
// quantize_x_rows (the reference, and the generic units' quantizer), computed 16 (AVX-512) or 8
// (AVX2) values at a time. Included by quant_linear_impl.h inside the per-ISA namespace.
//
// Why: the portable loop converts, scans and rounds one value at a time (~1.2 ns a value on Zen 5),
// and a prefill GEMM of 576 output columns spends ~40% of its time there (o_proj at 2048 rows: 1.4 ms
// of quantizing against ~1 ms of integer products on two threads).
//
// The same values, bit for bit: max |x| is order-free; scale = amax / 127 and inv = 1 / scale are the
// same scalar divisions; x * inv is one rounded multiply, rounded to the nearest integer (ties to even)
// by roundscale / round_ps, which equals the portable (v + 1.5 * 2^23) - 1.5 * 2^23 for |v| < 2^22 (an
// instruction, so no add the compiler could contract into an FMA with the multiply); the clamp to
// [-127, 127] keeps max(r, -127)'s NaN answer (-127, as std::max(-127.f, r)); a NaN x never raises
// the block maximum (max(|x|, amax) returns amax, as std::max(amax, |x|)). Sums of q are integers.
// cpp/tests/test_quant_activation.cc holds each unit to the portable bytes.
#ifndef PC_ISA_NAMESPACE
#error "include quant_activation_impl.h from quant_linear_impl.h"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__AVX512BW__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/quant_blocks.h"
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {
namespace x_quant {

#if defined(__AVX512BW__)

inline __m512 load16(const void* x, DType dtype, int64_t offset, __mmask16 mask) {
  if (dtype == DType::kFloat32) return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(x) + offset);
  const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(x) + offset);  // bf16
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

void quantize_rows(const void* x, DType x_dtype, int64_t x_stride, int64_t K, int64_t block, int64_t m_begin,
                   int64_t m_end, const QuantizedX& qx) {
  const __m512 sign = _mm512_set1_ps(-0.f), lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  for (int64_t m = m_begin; m < m_end; ++m) {
    int8_t* q = const_cast<int8_t*>(qx.q) + m * qx.q_stride;
    float* d = const_cast<float*>(qx.d) + m * qx.d_stride;
    const int64_t row = m * x_stride;
    for (int64_t b0 = 0; b0 < K; b0 += block) {
      const int64_t len = std::min(block, K - b0);
      __m512 amax = _mm512_setzero_ps();
      for (int64_t k = 0; k < len; k += 16)
        amax = _mm512_max_ps(_mm512_andnot_ps(sign, load16(x, x_dtype, row + b0 + k, lanes(len - k))), amax);
      const float scale = _mm512_reduce_max_ps(amax) / 127.f;
      const __m512 inv = _mm512_set1_ps(scale != 0.f ? 1.f / scale : 0.f);
      d[b0 / block] = scale;
      for (int64_t k = 0; k < len; k += 16) {
        const __mmask16 mask = lanes(len - k);
        const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(load16(x, x_dtype, row + b0 + k, mask), inv),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i v = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi));
        _mm512_mask_cvtsepi32_storeu_epi8(q + b0 + k, mask, v);
      }
    }
    if (K == 0) d[0] = 0.f;
    std::memset(q + K, 0, qx.q_stride - K);
    if (qx.s) {  // d * sum(q) over each 32 (block == 32)
      float* s = const_cast<float*>(qx.s) + m * qx.s_stride;
      const __m512i ones = _mm512_set1_epi16(1);
      for (int64_t b = 0; b < K / kBlock32; ++b) {
        const __m256i* p = reinterpret_cast<const __m256i*>(q + b * kBlock32);
        const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(p));
        s[b] = d[b * kBlock32 / block] * static_cast<float>(_mm512_reduce_add_epi32(_mm512_madd_epi16(w, ones)));
      }
    }
    if (qx.bsum) {  // sum(q) over each 16 (block == 256)
      int16_t* bsum = const_cast<int16_t*>(qx.bsum) + m * qx.bsum_stride;
      for (int64_t b = 0; b < K / 16; ++b) {
        const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * 16));
        bsum[b] = static_cast<int16_t>(_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(w)));
      }
    }
  }
}

#elif defined(__AVX2__)

inline __m256 load8(const void* x, DType dtype, int64_t offset) {
  if (dtype == DType::kFloat32) return _mm256_loadu_ps(static_cast<const float*>(x) + offset);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + offset));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float hmax(__m256 v) {  // no NaN lanes: the order of the maxima does not matter
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

void quantize_rows(const void* x, DType x_dtype, int64_t x_stride, int64_t K, int64_t block, int64_t m_begin,
                   int64_t m_end, const QuantizedX& qx) {
  if (block % 8 != 0 || K % 8 != 0) {  // int8 per channel with K not a multiple of 8: no tail code here
    quantize_x_rows(x, x_dtype, x_stride, K, block, m_begin, m_end, qx);
    return;
  }
  const __m256 sign = _mm256_set1_ps(-0.f), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  for (int64_t m = m_begin; m < m_end; ++m) {
    int8_t* q = const_cast<int8_t*>(qx.q) + m * qx.q_stride;
    float* d = const_cast<float*>(qx.d) + m * qx.d_stride;
    const int64_t row = m * x_stride;
    for (int64_t b0 = 0; b0 < K; b0 += block) {
      const int64_t len = std::min(block, K - b0);
      __m256 amax = _mm256_setzero_ps();
      for (int64_t k = 0; k < len; k += 8)
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, load8(x, x_dtype, row + b0 + k)), amax);
      const float scale = hmax(amax) / 127.f;
      const __m256 inv = _mm256_set1_ps(scale != 0.f ? 1.f / scale : 0.f);
      d[b0 / block] = scale;
      for (int64_t k = 0; k < len; k += 8) {
        const __m256 r = _mm256_round_ps(_mm256_mul_ps(load8(x, x_dtype, row + b0 + k), inv),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i v = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
        const __m128i v16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + b0 + k), _mm_packs_epi16(v16, v16));
      }
    }
    if (K == 0) d[0] = 0.f;
    std::memset(q + K, 0, qx.q_stride - K);
    const __m256i ones = _mm256_set1_epi16(1);
    if (qx.s) {  // d * sum(q) over each 32 (block == 32)
      float* s = const_cast<float*>(qx.s) + m * qx.s_stride;
      for (int64_t b = 0; b < K / kBlock32; ++b) {
        const __m128i* p = reinterpret_cast<const __m128i*>(q + b * kBlock32);
        const __m256i w =
            _mm256_add_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(p)), _mm256_cvtepi8_epi16(_mm_loadu_si128(p + 1)));
        s[b] = d[b * kBlock32 / block] * static_cast<float>(hsum(_mm256_madd_epi16(w, ones)));
      }
    }
    if (qx.bsum) {  // sum(q) over each 16 (block == 256)
      int16_t* bsum = const_cast<int16_t*>(qx.bsum) + m * qx.bsum_stride;
      for (int64_t b = 0; b < K / 16; ++b) {
        const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * 16)));
        bsum[b] = static_cast<int16_t>(hsum(_mm256_madd_epi16(w, ones)));
      }
    }
  }
}

#else  // the portable units: the reference itself

void quantize_rows(const void* x, DType x_dtype, int64_t x_stride, int64_t K, int64_t block, int64_t m_begin,
                   int64_t m_end, const QuantizedX& qx) {
  quantize_x_rows(x, x_dtype, x_stride, K, block, m_begin, m_end, qx);
}

#endif

}  // namespace x_quant
}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
