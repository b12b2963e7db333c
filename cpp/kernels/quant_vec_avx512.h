// The AVX-512 integer-vector traits of the quantized linear kernels (interface: quant_vec_generic.h):
// two 32-byte parts per zmm register.
//   QVecAvx512<false>: AVX-512BW, vpmaddubsw + vpmaddwd as on AVX2 at twice the width.
//   QVecAvx512<true>:  AVX512-VNNI, vpdpbusd (4 unsigned x signed byte products summed straight
//                      into int32 lanes); sub-block scales by vpmulld.
// AVX-512 has no vpsignb: signed weights become |w| with x negated under w's sign mask.
#pragma once

#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE (the kernel unit's namespace) before including quant_vec_avx512.h"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

template <bool kVnni>
struct QVecAvx512 {
  static constexpr int S = 2;
  static constexpr int kRegs = 32;
  using V = __m512i;
  using I = __m512i;
  using F = __m512;
  using SC = __m512i;  // VNNI: int32 lanes, 4 per 16 bytes; BW: int16 lanes, 8 per 16 bytes

  static __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
  static V load(const void* p) { return _mm512_loadu_si512(p); }
  static V load2(const void* p0, const void* p1) {
    return join(_mm256_loadu_si256(static_cast<const __m256i*>(p0)), _mm256_loadu_si256(static_cast<const __m256i*>(p1)));
  }
  static V nib16(const void* p0, const void* p1) {
    const __m256i q = _mm256_set_m128i(_mm_loadu_si128(static_cast<const __m128i*>(p1)),
                                       _mm_loadu_si128(static_cast<const __m128i*>(p0)));
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m512i v = join(_mm256_and_si256(q, mask), _mm256_and_si256(_mm256_srli_epi16(q, 4), mask));
    // 128-bit lanes [lo0, lo1, hi0, hi1] -> [lo0, hi0, lo1, hi1]
    return _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0));
  }
  // Q5_0 / Q5_1: bit i of the part's qh as 16 in byte i of the part (a mask register holds both parts).
  static V high_bits(uint32_t h0, uint32_t h1) {
    return _mm512_maskz_mov_epi8(_cvtu64_mask64(h0 | static_cast<uint64_t>(h1) << 32), _mm512_set1_epi8(16));
  }
  static V shr_and(V v, int s0, int s1, int mask) {
    const __m512i counts = join(_mm256_set1_epi16(static_cast<short>(s0)), _mm256_set1_epi16(static_cast<short>(s1)));
    return _mm512_and_si512(_mm512_srlv_epi16(v, counts), _mm512_set1_epi8(static_cast<char>(mask)));
  }
  static V or_(V a, V b) { return _mm512_or_si512(a, b); }
  static V shl4(V a) { return _mm512_slli_epi16(a, 4); }
  static I dot(V u, V x) {
    if (kVnni) return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1));
  }
  static I dot_signed(V w, V x) {
    const __mmask64 negative = _mm512_movepi8_mask(w);
    return dot(_mm512_abs_epi8(w), _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x));
  }
  // sc[0..3] spread over the four 16-byte groups: one 8-byte load and one lane permute.
  static SC scales(const int16_t* sc) {
    const __m128i four = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc));
    if (kVnni)
      return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                      _mm512_castsi128_si512(_mm_cvtepi16_epi32(four)));
    const __m512i idx = _mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,
                                         0x0002000200020002, 0x0001000100010001, 0x0001000100010001, 0, 0);
    return _mm512_permutexvar_epi16(idx, _mm512_castsi128_si512(four));
  }
  static I dot_scaled(V u, V x, SC sc) {
    if (kVnni) return _mm512_mullo_epi32(dot(u, x), sc);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), sc);
  }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I izero() { return _mm512_setzero_si512(); }
  static int32_t hsum_i(I a) { return _mm512_reduce_add_epi32(a); }

  static F fzero() { return _mm512_setzero_ps(); }
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F set1(float s) { return _mm512_set1_ps(s); }
  static F set2(float s0, float s1) { return _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1); }
  static F bcast2(const float* p) { return _mm512_insertf32x8(_mm512_set1_ps(p[0]), _mm256_broadcast_ss(p + 1), 1); }
  static float hsum(F a) { return _mm512_reduce_add_ps(a); }
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

// The 16-lane trait of the repacked kernels (quant_x16_impl.h): lane l = output column l of a
// 16-row group. BW (vpmaddubsw) sums byte pairs in int16: fine for nibbles (2 * 15 * 127), not for
// Q8_0x16's bytes up to 255: without VNNI those take the sign trick (dot4_q8, kQ8Signed).
template <bool kVnni>
struct X16Avx512 {
  static constexpr int kMaxRows = 8;  // 8 int32 + 8 fp32 accumulators + 6 working zmm of 32
  static constexpr bool kQ8Signed = !kVnni;
  static constexpr bool kPairs16 = !kVnni;  // vpdpbusd already sums into int32 in one instruction
  using V = __m512i;
  using I = __m512i;
  using F = __m512;
  static V load(const void* p) { return _mm512_loadu_si512(p); }
  static V lo4(V v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static V hi4(V v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  static I izero() { return _mm512_setzero_si512(); }
  static I dot4(I acc, V w, const int8_t* x4) {
    int32_t four;
    std::memcpy(&four, x4, sizeof four);
    const __m512i x = _mm512_set1_epi32(four);
    if (kVnni) return _mm512_dpbusd_epi32(acc, w, x);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
  }
  // Stored q + 128 bytes against x4: VNNI sums the unsigned bytes (the kernel subtracts 128 sum(x));
  // BW sums q x by the sign trick (q = byte ^ 0x80; |q| unsigned, x negated where q < 0: pairs fit int16).
  static I dot4_q8(I acc, V u, const int8_t* x4) {
    if (kVnni) return dot4(acc, u, x4);
    int32_t four;
    std::memcpy(&four, x4, sizeof four);
    const __m512i x = _mm512_set1_epi32(four);
    const __m512i q = _mm512_xor_si512(u, _mm512_set1_epi8(-128));
    const __m512i signed_x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(q), _mm512_setzero_si512(), x);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(q), signed_x),
                                                    _mm512_set1_epi16(1)));
  }
  using P = __m512i;  // int16 pair sums (kPairs16)
  static P pzero() { return _mm512_setzero_si512(); }
  static P pdot4(P acc, V w, const int8_t* x4) {
    int32_t four;
    std::memcpy(&four, x4, sizeof four);
    return _mm512_add_epi16(acc, _mm512_maddubs_epi16(w, _mm512_set1_epi32(four)));
  }
  static I widen(P p) { return _mm512_madd_epi16(p, _mm512_set1_epi16(1)); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  static F half16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F mul_s(F a, float s) { return _mm512_mul_ps(a, _mm512_set1_ps(s)); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fmadd_s(F a, float s, F c) { return _mm512_fmadd_ps(a, _mm512_set1_ps(s), c); }
  static void store(float* p, F a) { _mm512_storeu_ps(p, a); }
  // int8 per channel x16: lanes minus one integer, 16 fp32 scales, a lane-wise product.
  static I isub_s(I a, int32_t s) { return _mm512_sub_epi32(a, _mm512_set1_epi32(s)); }
  static F loadf(const float* p) { return _mm512_loadu_ps(p); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }

  // The repacked k-quants (quant_kx16_impl.h). BW multiplies the sub-block scale inside vpmaddwd
  // (both int16 halves of a lane hold it); VNNI sums a sub-block by vpdpbusd, then one vpmulld.
  // Rows of x per tile: VNNI keeps 4 x (2 sub-block sums + a super-block sum + fp32); 6 measured
  // slower (Q6_K 135 against 180 GFLOP/s at 128 rows, Zen 4); BW 8 against 4: +7%.
  static constexpr int kMaxRowsK = kVnni ? 4 : 8;
  static constexpr bool kScaleInDot = !kVnni;
  static V or_(V a, V b) { return _mm512_or_si512(a, b); }
  static V and8(V a, uint8_t m) { return _mm512_and_si512(a, _mm512_set1_epi8(static_cast<char>(m))); }
  static V shl16(V a, int n) { return _mm512_sll_epi16(a, _mm_cvtsi32_si128(n)); }
  static V shr16(V a, int n) { return _mm512_srl_epi16(a, _mm_cvtsi32_si128(n)); }
  static I pairs_u8(const uint8_t* p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static I pairs_s8(const int8_t* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static I dot2(I acc, I pairs, const int16_t* x2) {
    int32_t two;
    std::memcpy(&two, x2, sizeof two);
    if (kVnni) return _mm512_dpwssd_epi32(acc, pairs, _mm512_set1_epi32(two));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi32(two)));
  }
  static I scale_lo(I pairs) {
    if (kVnni) return _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16);
    return _mm512_or_si512(_mm512_and_si512(pairs, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(pairs, 16));
  }
  static I scale_hi(I pairs) {
    if (kVnni) return _mm512_srai_epi32(pairs, 16);
    return _mm512_or_si512(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))),
                           _mm512_srli_epi32(pairs, 16));
  }
  static I dot4_sc(I acc, V w, const int8_t* x4, I sc) {
    int32_t four;
    std::memcpy(&four, x4, sizeof four);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, _mm512_set1_epi32(four)), sc));
  }
  static I mul_add(I acc, I s, I sc) { return _mm512_add_epi32(acc, _mm512_mullo_epi32(s, sc)); }
  static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I shl32(I a, int n) { return _mm512_sll_epi32(a, _mm_cvtsi32_si128(n)); }
};

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
