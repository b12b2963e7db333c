// AVX-512 16-lane float vector for the attention kernel. Include only from a translation unit
// compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq (attention_avx512.cc). Same algorithm
// as VecAvx2, lane for lane; the portable GenericVec<16> runs the same tiling on any CPU in tests.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace pagedcore {
namespace kernels {

struct VecAvx512 {
  static constexpr int W = 16;
  using R = __m512;
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R a) { _mm512_storeu_ps(p, a); }
  static R load_bf16(const uint16_t* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static void store_bf16(uint16_t* p, R a) {
    const __m512i bits = _mm512_castps_si512(a);
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __m512i quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    const __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R fmadd(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static R exp(R x) {  // as VecAvx2::exp
    const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365478515625f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);  // false below lo (and for -inf)
    x = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, y, _mm512_castsi512_ps(e));
  }
  static float reduce_add(R a) { return _mm512_reduce_add_ps(a); }
  static float reduce_max(R a) { return _mm512_reduce_max_ps(a); }
  static void reduce_add4(R a, R b, R c, R d, float* out) {
    // Fold each to 8 lanes, then as VecAvx2::reduce_add4.
    const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
  }
};

}  // namespace kernels
}  // namespace pagedcore
