// AVX2 + FMA 8-lane float vector for the attention kernel. Include only from a translation unit
// compiled with -mavx2 -mfma -mf16c (attention_avx2.cc); the interface is GenericVec's.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace pagedcore {
namespace kernels {

struct VecAvx2 {
  static constexpr int W = 8;
  using R = __m256;
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R a) { _mm256_storeu_ps(p, a); }
  static R load_bf16(const uint16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static void store_bf16(uint16_t* p, R a) {
    const __m256i bits = _mm256_castps_si256(a);
    const __m256i high = _mm256_srli_epi32(bits, 16);
    const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    // packus works per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; gather qwords 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R fmadd(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  // Cephes-style exp: 2^n * p(r), |rel err| ~ 2e-7; inputs below -87.3 (and -inf) give exactly 0.
  static R exp(R x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365478515625f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
  }
  static float reduce_add(R a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(R a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void reduce_add4(R a, R b, R c, R d, float* out) {
    const __m256 ab = _mm256_hadd_ps(a, b);     // a01 a23 b01 b23 | a45 a67 b45 b67
    const __m256 cd = _mm256_hadd_ps(c, d);
    const __m256 abcd = _mm256_hadd_ps(ab, cd);  // a0123 b0123 c0123 d0123 | a4567 ...
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
  }
};

}  // namespace kernels
}  // namespace pagedcore
