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

#if defined(__AVX512BW__) || defined(__AVX2__)

// The row loop, once, over a vector trait T: W lanes; F; load(x, dtype, offset, n) (n <= W lanes, the rest
// 0); absmax(F acc, F v) = max(|v|, acc); reduce_max; set1; quantize(F v, F inv) = the clamped integers;
// store_q(int8_t*, quantized, n); sum32 / sum16 (the int8 sums of 32 / 16 bytes).
template <class T>
void quantize_rows_with(const void* x, DType x_dtype, int64_t x_stride, int64_t K, int64_t block, int64_t m_begin,
                        int64_t m_end, const QuantizedX& qx) {
  for (int64_t m = m_begin; m < m_end; ++m) {
    int8_t* q = const_cast<int8_t*>(qx.q) + m * qx.q_stride;
    float* d = const_cast<float*>(qx.d) + m * qx.d_stride;
    const int64_t row = m * x_stride;
    for (int64_t b0 = 0; b0 < K; b0 += block) {
      const int64_t len = K - b0 < block ? K - b0 : block;  // (no std::min: a Debug build emits it weak)
      typename T::F amax = T::set1(0.f);
      for (int64_t k = 0; k < len; k += T::W) amax = T::absmax(amax, T::load(x, x_dtype, row + b0 + k, len - k));
      const float scale = T::reduce_max(amax) / 127.f;
      const typename T::F inv = T::set1(scale != 0.f ? 1.f / scale : 0.f);
      d[b0 / block] = scale;
      for (int64_t k = 0; k < len; k += T::W)
        T::store_q(q + b0 + k, T::quantize(T::load(x, x_dtype, row + b0 + k, len - k), inv), len - k);
    }
    if (K == 0) d[0] = 0.f;
    std::memset(q + K, 0, qx.q_stride - K);
    if (qx.s) {  // d * sum(q) over each 32 (block == 32)
      float* s = const_cast<float*>(qx.s) + m * qx.s_stride;
      for (int64_t b = 0; b < K / kBlock32; ++b)
        s[b] = d[b * kBlock32 / block] * static_cast<float>(T::sum32(q + b * kBlock32));
    }
    if (qx.bsum) {  // sum(q) over each 16 (block == 256)
      int16_t* bsum = const_cast<int16_t*>(qx.bsum) + m * qx.bsum_stride;
      for (int64_t b = 0; b < K / 16; ++b) bsum[b] = static_cast<int16_t>(T::sum16(q + b * 16));
    }
  }
}

#endif

#if defined(__AVX512BW__)

struct Avx512 {
  static constexpr int W = 16;
  using F = __m512;
  static __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }
  static F load(const void* x, DType dtype, int64_t offset, int64_t n) {
    if (dtype == DType::kFloat32) return _mm512_maskz_loadu_ps(lanes(n), static_cast<const float*>(x) + offset);
    const __m256i h = _mm256_maskz_loadu_epi16(lanes(n), static_cast<const uint16_t*>(x) + offset);  // bf16
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F absmax(F acc, F v) { return _mm512_max_ps(_mm512_andnot_ps(_mm512_set1_ps(-0.f), v), acc); }
  static float reduce_max(F v) { return _mm512_reduce_max_ps(v); }
  static __m512i quantize(F v, F inv) {
    const F r = _mm512_roundscale_ps(_mm512_mul_ps(v, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.f)), _mm512_set1_ps(127.f)));
  }
  static void store_q(int8_t* q, __m512i v, int64_t n) { _mm512_mask_cvtsepi32_storeu_epi8(q, lanes(n), v); }
  static int32_t sum32(const int8_t* q) {
    const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    return _mm512_reduce_add_epi32(_mm512_madd_epi16(w, _mm512_set1_epi16(1)));
  }
  static int32_t sum16(const int8_t* q) {
    return _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
  }
};

void quantize_rows(const void* x, DType x_dtype, int64_t x_stride, int64_t K, int64_t block, int64_t m_begin,
                   int64_t m_end, const QuantizedX& qx) {
  quantize_rows_with<Avx512>(x, x_dtype, x_stride, K, block, m_begin, m_end, qx);
}

#elif defined(__AVX2__)

struct Avx2 {  // whole vectors only: quantize_rows sends K or blocks not in 8s to the portable code
  static constexpr int W = 8;
  using F = __m256;
  static F load(const void* x, DType dtype, int64_t offset, int64_t) {
    if (dtype == DType::kFloat32) return _mm256_loadu_ps(static_cast<const float*>(x) + offset);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + offset));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F absmax(F acc, F v) { return _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), v), acc); }
  static float reduce_max(F v) {  // no NaN lanes: the order of the maxima does not matter
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
  }
  static __m256i quantize(F v, F inv) {
    const F r = _mm256_round_ps(_mm256_mul_ps(v, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.f)), _mm256_set1_ps(127.f)));
  }
  static void store_q(int8_t* q, __m256i v, int64_t) {
    const __m128i v16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(v16, v16));
  }
  static int32_t hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
  }
  static int32_t sum16(const int8_t* q) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    return hsum(_mm256_madd_epi16(w, _mm256_set1_epi16(1)));
  }
  static int32_t sum32(const int8_t* q) { return sum16(q) + sum16(q + 16); }
};

void quantize_rows(const void* x, DType x_dtype, int64_t x_stride, int64_t K, int64_t block, int64_t m_begin,
                   int64_t m_end, const QuantizedX& qx) {
  if (block % 8 != 0 || K % 8 != 0) {  // int8 per channel with K not a multiple of 8: no tail code here
    quantize_x_rows(x, x_dtype, x_stride, K, block, m_begin, m_end, qx);
    return;
  }
  quantize_rows_with<Avx2>(x, x_dtype, x_stride, K, block, m_begin, m_end, qx);
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
