// The AVX2 + FMA vector trait: 8 fp32 lanes, 16 registers; the interface of vec_generic.h. Include
// only from a unit compiled with -mavx2 -mfma -mf16c, after defining PC_ISA_NAMESPACE: the trait
// lives in that unit's namespace (see vec_generic.h).
#pragma once

#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE (the kernel unit's namespace) before including vec_avx2.h"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/vec_exp.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

struct VecAvx2 {
  static constexpr int W = 8;
  static constexpr int kRegs = 16;
  static constexpr bool kHasDotBf16 = false;
  static constexpr bool kHasFp8Bf16Quad = false;  // (no bf16 dot on AVX2)
  using R = __m256;
  using RI = __m256i;  // 16 bf16
  static void load_e4m3_bf16_quad(const uint8_t* p, RI& k01, RI& k23);  // declared only: kHasFp8Bf16Quad is false
  using M = __m256;    // all-ones lanes where true
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R a) { _mm256_storeu_ps(p, a); }
  static R load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // 8 IEEE fp16 widened to fp32 (F16C; exact, subnormals included).
  static R load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // 8 fp8 (kernels/fp8.h) widened through fp16 (F16C), as VecAvx512::load_fp8.
  static R load_fp8(const uint8_t* p, bool e4m3) {
    if (!e4m3) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
      return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(bytes), 8));
    }
    return _mm256_mul_ps(load_e4m3_low(p), _mm256_set1_ps(256.f));
  }
  // 8 e4m3 as fp32 at 2^-8 times their values (exact), as VecAvx512::load_e4m3_low.
  static R load_e4m3_low(const uint8_t* p) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7),
                                         _mm_set1_epi16(static_cast<int16_t>(0xbfff))));
  }
  static void fp8_to_bf16(const uint8_t* p, uint16_t* dst, bool e4m3) { store_bf16(dst, load_fp8(p, e4m3)); }
  static void fp8_rows_to_bf16(const uint8_t* p, uint16_t* dst, int64_t count, bool e4m3) {  // count % W == 0
    for (int64_t c = 0; c < count; c += W) fp8_to_bf16(p + c, dst + c, e4m3);
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
  // bf16 is the top half of an fp32: even elements are the 32-bit lanes << 16, odd ones & 0xffff0000.
  static void load_bf16_pairs(const uint16_t* p, R& even, R& odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static RI load_i(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static RI broadcast_pair(const uint16_t* p) {  // p[0], p[1] in every 32-bit lane (dense_x16_impl.h)
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(static_cast<int>(v));
  }
  static R dot_bf16(R acc, RI x, RI w) {  // not used on AVX2 (kHasDotBf16 false); correct anyway
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(x, hi)), _mm256_castsi256_ps(_mm256_and_si256(w, hi)),
                          acc);
    return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)),
                           _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), acc);
  }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R div(R a, R b) { return _mm256_div_ps(a, b); }
  static R min(R a, R b) { return _mm256_min_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static R fmadd(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R fnmadd(R a, R b, R c) { return _mm256_fnmadd_ps(a, b, c); }
  static R mul_add(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R round_nearest(R a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static R pow2n(R n) {  // 2^n for integral n in the normal range: n + 127 in the exponent field
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static M less(R a, R b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static R zero_where(M m, R a) { return _mm256_andnot_ps(m, a); }
  static R exp(R x) { return vec_exp<VecAvx2>(x); }
  static float reduce_add(R a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // Four reduce_add at once, each summed in exactly reduce_add's order (halves folded), so a dot
  // product does not change with the tile it lands in (a row of a 5-row call equals the same row
  // alone: what makes greedy speculation equal greedy decoding).
  static void reduce_add4(R a, R b, R c, R d, float* out) {
    __m128 s0 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 s1 = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    __m128 s2 = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    __m128 s3 = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
    _MM_TRANSPOSE4_PS(s0, s1, s2, s3);  // s<i> = lane i of a, b, c, d
    _mm_storeu_ps(out, _mm_add_ps(_mm_add_ps(s0, s2), _mm_add_ps(s1, s3)));
  }
  static float reduce_max(R a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
