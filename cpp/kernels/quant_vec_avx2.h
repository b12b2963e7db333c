// The AVX2 integer-vector trait of the quantized linear kernels (interface: quant_vec_generic.h):
// one 32-byte part per ymm register, int8 products with vpmaddubsw (unsigned x signed bytes ->
// int16 pair sums) and vpmaddwd (int16 pairs -> int32, times 1 or the sub-block scales).
#pragma once

#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE (the kernel unit's namespace) before including quant_vec_avx2.h"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

struct QVecAvx2 {
  static constexpr int S = 1;
  static constexpr int kRegs = 16;
  using V = __m256i;
  using I = __m256i;
  using F = __m256;
  using SC = __m256i;  // int16 lanes: 8 per 16 bytes

  static V load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static V load2(const void* p0, const void*) { return load(p0); }
  static V nib16(const void* p0, const void*) {
    const __m128i q = _mm_loadu_si128(static_cast<const __m128i*>(p0));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
  }
  static V shr_and(V v, int s0, int, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(s0)), _mm256_set1_epi8(static_cast<char>(mask)));
  }
  // Q5_0 / Q5_1: bit i of h (the block's qh) as 16 in byte i: each byte picks its qh byte, then its bit.
  static V high_bits(uint32_t h0, uint32_t) {
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h0)),
                                              _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                               2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
  }
  static V or_(V a, V b) { return _mm256_or_si256(a, b); }
  static V shl4(V a) { return _mm256_slli_epi16(a, 4); }
  static I dot(V u, V x) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)); }
  static I dot_signed(V w, V x) { return dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)); }
  static SC scales(const int16_t* sc) { return _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0])); }
  static I dot_scaled(V u, V x, SC sc) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), sc); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I izero() { return _mm256_setzero_si256(); }
  static int32_t hsum_i(I a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
  }

  static F fzero() { return _mm256_setzero_ps(); }
  static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F set1(float s) { return _mm256_set1_ps(s); }
  static F set2(float s0, float) { return _mm256_set1_ps(s0); }
  static F bcast2(const float* p) { return _mm256_broadcast_ss(p); }
  static float hsum(F a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // 8 fp32 lanes for per-block scale arithmetic (quant_vec_generic.h).
  using F8 = __m256;
  static F8 set8(float s) { return _mm256_set1_ps(s); }
  static F8 load8(const float* p) { return _mm256_loadu_ps(p); }
  static void store8(float* p, F8 a) { _mm256_storeu_ps(p, a); }
  static F8 mul8(F8 a, F8 b) { return _mm256_mul_ps(a, b); }
  static F8 fmadd8(F8 a, F8 b, F8 c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum8(F8 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // The 8 dwords holding the fp16 values, their low halves packed, one conversion.
  static F8 half8(const void* p, int stride) {
    // Eight scalar loads, not vpgatherdd: a gather is microcoded on AMD (Zen 4/5) and was ~35% of a
    // Q4_1 GEMV's cycles there; loads and inserts issue at several per cycle.
    const char* b = static_cast<const char*>(p);
    const __m256i g = _mm256_setr_epi32(dword(b), dword(b + stride), dword(b + 2 * stride), dword(b + 3 * stride),
                                        dword(b + 4 * stride), dword(b + 5 * stride), dword(b + 6 * stride),
                                        dword(b + 7 * stride));
    const __m256i lo = _mm256_shuffle_epi8(g, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                                               0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(lo, _MM_SHUFFLE(3, 1, 2, 0))));
  }
  static int dword(const char* p) {
    int v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
};

// The 16-lane trait of the repacked kernels (quant_x16_impl.h) as two 8-lane ymm halves (rows 0-7
// and 8-15 of a group). vpmaddubsw sums byte pairs in int16: fine for nibbles (2 * 15 * 127), not
// for Q8_0x16's stored bytes up to 255, so those take the sign trick (dot4_q8, kQ8Signed).
struct X16Avx2 {
  static constexpr int kMaxRows = 2;  // 2 x (2 int32 + 2 fp32) accumulators + working registers of 16
  static constexpr bool kQ8Signed = true;
  static constexpr bool kPairs16 = true;
  struct V { __m256i h[2]; };
  struct I { __m256i h[2]; };
  struct F { __m256 h[2]; };
  static V load(const void* p) {
    const auto* q = static_cast<const __m256i*>(p);
    return {{_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)}};
  }
  static V lo4(V v) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    return {{_mm256_and_si256(v.h[0], mask), _mm256_and_si256(v.h[1], mask)}};
  }
  static V hi4(V v) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    return {{_mm256_and_si256(_mm256_srli_epi16(v.h[0], 4), mask), _mm256_and_si256(_mm256_srli_epi16(v.h[1], 4), mask)}};
  }
  static I izero() { return {{_mm256_setzero_si256(), _mm256_setzero_si256()}}; }
  static I dot4(I acc, const V& w, const int8_t* x4) {
    int32_t four;
    std::memcpy(&four, x4, sizeof four);
    const __m256i x = _mm256_set1_epi32(four), ones = _mm256_set1_epi16(1);
    for (int i = 0; i < 2; ++i)
      acc.h[i] = _mm256_add_epi32(acc.h[i], _mm256_madd_epi16(_mm256_maddubs_epi16(w.h[i], x), ones));
    return acc;
  }
  // Stored q + 128 bytes (Q8_0x16, int8 x16) against x4: sum(q x) per lane, the sign trick: q = byte ^ 0x80,
  // |q| (up to 128) as the unsigned operand and x with q's sign as the signed one, so a pair sum is at
  // most 2 * 128 * 127 and never saturates (x is in [-127, 127]).
  static I dot4_q8(I acc, const V& u, const int8_t* x4) {
    int32_t four;
    std::memcpy(&four, x4, sizeof four);
    const __m256i x = _mm256_set1_epi32(four), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(-128);
    for (int i = 0; i < 2; ++i) {
      const __m256i q = _mm256_xor_si256(u.h[i], flip);
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
      acc.h[i] = _mm256_add_epi32(acc.h[i], _mm256_madd_epi16(pairs, ones));
    }
    return acc;
  }
  // int16 pair sums of a nibble block (quant_x16_impl.h, kPairs16); lane layout as I, int16 halves.
  using P = I;
  static P pzero() { return izero(); }
  static P pdot4(P acc, const V& w, const int8_t* x4) {
    int32_t four;
    std::memcpy(&four, x4, sizeof four);
    const __m256i x = _mm256_set1_epi32(four);
    for (int i = 0; i < 2; ++i) acc.h[i] = _mm256_add_epi16(acc.h[i], _mm256_maddubs_epi16(w.h[i], x));
    return acc;
  }
  static I widen(const P& p) {
    const __m256i ones = _mm256_set1_epi16(1);
    return {{_mm256_madd_epi16(p.h[0], ones), _mm256_madd_epi16(p.h[1], ones)}};
  }
  static F fzero() { return {{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
  static F cvt(const I& a) { return {{_mm256_cvtepi32_ps(a.h[0]), _mm256_cvtepi32_ps(a.h[1])}}; }
  static F half16(const uint16_t* p) {
    return {{_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
             _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))}};
  }
  static F mul_s(F a, float s) {
    const __m256 v = _mm256_set1_ps(s);
    return {{_mm256_mul_ps(a.h[0], v), _mm256_mul_ps(a.h[1], v)}};
  }
  static F fmadd(const F& a, const F& b, F c) {
    return {{_mm256_fmadd_ps(a.h[0], b.h[0], c.h[0]), _mm256_fmadd_ps(a.h[1], b.h[1], c.h[1])}};
  }
  static F fmadd_s(const F& a, float s, F c) {
    const __m256 v = _mm256_set1_ps(s);
    return {{_mm256_fmadd_ps(a.h[0], v, c.h[0]), _mm256_fmadd_ps(a.h[1], v, c.h[1])}};
  }
  static I isub_s(const I& a, int32_t s) {
    const __m256i v = _mm256_set1_epi32(s);
    return {{_mm256_sub_epi32(a.h[0], v), _mm256_sub_epi32(a.h[1], v)}};
  }
  static F loadf(const float* p) { return {{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}}; }
  static F mul(const F& a, const F& b) { return {{_mm256_mul_ps(a.h[0], b.h[0]), _mm256_mul_ps(a.h[1], b.h[1])}}; }
  static void store(float* p, const F& a) {
    _mm256_storeu_ps(p, a.h[0]);
    _mm256_storeu_ps(p + 8, a.h[1]);
  }

  // The repacked k-quants (quant_kx16_impl.h): the sub-block scale inside vpmaddwd (both int16
  // halves of a lane hold it), as AVX-512BW.
  static constexpr int kMaxRowsK = 2;
  static constexpr bool kScaleInDot = true;
  static V or_(const V& a, const V& b) { return {{_mm256_or_si256(a.h[0], b.h[0]), _mm256_or_si256(a.h[1], b.h[1])}}; }
  static V and8(const V& a, uint8_t m) {
    const __m256i mask = _mm256_set1_epi8(static_cast<char>(m));
    return {{_mm256_and_si256(a.h[0], mask), _mm256_and_si256(a.h[1], mask)}};
  }
  static V shl16(const V& a, int n) {
    const __m128i c = _mm_cvtsi32_si128(n);
    return {{_mm256_sll_epi16(a.h[0], c), _mm256_sll_epi16(a.h[1], c)}};
  }
  static V shr16(const V& a, int n) {
    const __m128i c = _mm_cvtsi32_si128(n);
    return {{_mm256_srl_epi16(a.h[0], c), _mm256_srl_epi16(a.h[1], c)}};
  }
  static I pairs_u8(const uint8_t* p) {
    const auto* q = reinterpret_cast<const __m128i*>(p);
    return {{_mm256_cvtepu8_epi16(_mm_loadu_si128(q)), _mm256_cvtepu8_epi16(_mm_loadu_si128(q + 1))}};
  }
  static I pairs_s8(const int8_t* p) {
    const auto* q = reinterpret_cast<const __m128i*>(p);
    return {{_mm256_cvtepi8_epi16(_mm_loadu_si128(q)), _mm256_cvtepi8_epi16(_mm_loadu_si128(q + 1))}};
  }
  static I dot2(I acc, const I& pairs, const int16_t* x2) {
    int32_t two;
    std::memcpy(&two, x2, sizeof two);
    const __m256i x = _mm256_set1_epi32(two);
    for (int i = 0; i < 2; ++i) acc.h[i] = _mm256_add_epi32(acc.h[i], _mm256_madd_epi16(pairs.h[i], x));
    return acc;
  }
  static I scale_lo(const I& p) {
    const __m256i lo = _mm256_set1_epi32(0xFFFF);
    return {{_mm256_or_si256(_mm256_and_si256(p.h[0], lo), _mm256_slli_epi32(p.h[0], 16)),
             _mm256_or_si256(_mm256_and_si256(p.h[1], lo), _mm256_slli_epi32(p.h[1], 16))}};
  }
  static I scale_hi(const I& p) {
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    return {{_mm256_or_si256(_mm256_and_si256(p.h[0], hi), _mm256_srli_epi32(p.h[0], 16)),
             _mm256_or_si256(_mm256_and_si256(p.h[1], hi), _mm256_srli_epi32(p.h[1], 16))}};
  }
  static I dot4_sc(I acc, const V& w, const int8_t* x4, const I& sc) {
    int32_t four;
    std::memcpy(&four, x4, sizeof four);
    const __m256i x = _mm256_set1_epi32(four);
    for (int i = 0; i < 2; ++i)
      acc.h[i] = _mm256_add_epi32(acc.h[i], _mm256_madd_epi16(_mm256_maddubs_epi16(w.h[i], x), sc.h[i]));
    return acc;
  }
  static I mul_add(I acc, const I& s, const I& sc) {
    for (int i = 0; i < 2; ++i) acc.h[i] = _mm256_add_epi32(acc.h[i], _mm256_mullo_epi32(s.h[i], sc.h[i]));
    return acc;
  }
  static I sub(const I& a, const I& b) { return {{_mm256_sub_epi32(a.h[0], b.h[0]), _mm256_sub_epi32(a.h[1], b.h[1])}}; }
  static I add(const I& a, const I& b) { return {{_mm256_add_epi32(a.h[0], b.h[0]), _mm256_add_epi32(a.h[1], b.h[1])}}; }
  static I shl32(const I& a, int n) {
    const __m128i c = _mm_cvtsi32_si128(n);
    return {{_mm256_sll_epi32(a.h[0], c), _mm256_sll_epi32(a.h[1], c)}};
  }
};

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
