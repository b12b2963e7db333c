// The linear kernel for AVX2 + FMA (+ F16C): 8 fp32 lanes, 16 registers. Compiled with
// -mavx2 -mfma -mf16c (CMakeLists.txt); the trait lives in this file's ISA namespace so no inline
// function compiled with these flags is shared with other translation units.
#include <immintrin.h>

#include <cstdint>

namespace pagedcore {
namespace kernels {
namespace linear_avx2 {

struct Vec {
  static constexpr int W = 8;
  static constexpr int kRegs = 16;
  static constexpr bool kHasDotBf16 = false;
  using R = __m256;
  using RI = __m256i;  // 16 bf16
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R a) { _mm256_storeu_ps(p, a); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R div(R a, R b) { return _mm256_div_ps(a, b); }
  static R fmadd(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static void load_bf16_pairs(const uint16_t* p, R& even, R& odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static R load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static __m256i round_bits(R a) {  // fp32 bits rounded to nearest even bf16 in the top half; NaN quiet
    const __m256i bits = _mm256_castps_si256(a);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    const __m256i quiet_nan = _mm256_or_si256(bits, _mm256_set1_epi32(0x400000));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  }
  static R round_bf16(R a) {
    return _mm256_castsi256_ps(_mm256_and_si256(round_bits(a), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static void store_bf16(uint16_t* p, R a) {
    const __m256i r = _mm256_srli_epi32(round_bits(a), 16);
    // packus works per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; gather qwords 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static RI load_i(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static R dot_bf16(R acc, RI x, RI w) {  // not used on AVX2 (kHasDotBf16 false); correct anyway
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(x, hi)), _mm256_castsi256_ps(_mm256_and_si256(w, hi)), acc);
    return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)),
                           _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), acc);
  }
  // Cephes-style exp (as simd_avx2.h): 2^n * p(r), |rel err| ~ 2e-7; below -87.3 gives 0.
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
  static float hsum(R a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void hsum4(R a, R b, R c, R d, float* out) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
  }
};

}  // namespace linear_avx2
}  // namespace kernels
}  // namespace pagedcore

#define PC_LINEAR_NAMESPACE linear_avx2
#define PC_LINEAR_VEC ::pagedcore::kernels::linear_avx2::Vec
#include "kernels/linear_impl.h"
