// The AVX-512 vector trait: 16 fp32 lanes, 32 registers; the interface of vec_generic.h, lane for
// lane the algorithm of VecAvx2. Include only from a unit compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq, after defining PC_ISA_NAMESPACE (see vec_generic.h). A unit compiled with
// -mavx512bf16 as well gets vdpbf16ps for dot_bf16 (kHasDotBf16).
#pragma once

#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE (the kernel unit's namespace) before including vec_avx512.h"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/vec_exp.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

// The bf16 bits of the e4m3 magnitude `mag` (exponent << 3 | mantissa, 0..127), exactly: a normal code
// 2^(e-7) (1 + m/8) is bf16 exponent e + 120 over mantissa m << 4; a subnormal one m 2^-9 is normalised
// (0x7f, a NaN code quantizers never write, reads 480 as everywhere else).
constexpr uint16_t e4m3_magnitude_bf16(int mag) {
  if (mag >= 8) return static_cast<uint16_t>((mag + (120 << 3)) << 4);
  if (mag == 0) return 0;
  const int p = mag >= 4 ? 2 : mag >= 2 ? 1 : 0;  // mag 2^-9 = 2^(p-9) (mag / 2^p), 1 <= mag / 2^p < 2
  return static_cast<uint16_t>(((118 + p) << 7) | ((mag - (1 << p)) << (7 - p)));
}

// The e4m3 -> bf16 tables of VecAvx512::load_e4m3_bf16_quad: the high and low bytes of each magnitude's bf16
// (e4m3_magnitude_bf16), and the byte order that makes vpunpck{l,h}bw's per-128-bit-lane
// interleave come out as column pairs: output word i of lane j is, in k01, column 4 j + i / 2 at row i % 2, in
// k23 the same column at row 2 + i % 2 (rows of 16 bytes).
struct E4m3Bf16Table {
  alignas(64) uint8_t hi[128];
  alignas(64) uint8_t lo[128];
  alignas(64) uint8_t perm[64];
};
constexpr E4m3Bf16Table make_e4m3_bf16_table() {
  E4m3Bf16Table t{};
  for (int mag = 0; mag < 128; ++mag) {
    const uint16_t bits = e4m3_magnitude_bf16(mag);
    t.hi[mag] = static_cast<uint8_t>(bits >> 8);
    t.lo[mag] = static_cast<uint8_t>(bits & 0xff);
  }
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 8; ++i) {
      t.perm[16 * j + i] = static_cast<uint8_t>((i % 2) * 16 + 4 * j + i / 2);
      t.perm[16 * j + 8 + i] = static_cast<uint8_t>((2 + i % 2) * 16 + 4 * j + i / 2);
    }
  return t;
}
constexpr E4m3Bf16Table kE4m3Bf16Table = make_e4m3_bf16_table();

struct VecAvx512 {
  static constexpr int W = 16;
  static constexpr int kRegs = 32;
#ifdef __AVX512BF16__
  static constexpr bool kHasDotBf16 = true;
#else
  static constexpr bool kHasDotBf16 = false;
#endif
  using R = __m512;
  using RI = __m512i;  // 32 bf16
  using M = __mmask16;
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R a) { _mm512_storeu_ps(p, a); }
  static R load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // 16 IEEE fp16 widened to fp32 (exact, subnormals included).
  static R load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // 16 fp8 (kernels/fp8.h) widened through fp16: an e5m2 byte is an fp16's top byte; an e4m3 one's
  // exponent and mantissa shifted into an fp16 read 2^8 too small (bias 15, not 7). The NaN codes are
  // never written (the cache writes saturate; fp8 weight quantizers never write them): e4m3's read +-480.
  static R load_fp8(const uint8_t* p, bool e4m3) {
    if (!e4m3) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 8));
    }
    return _mm512_mul_ps(load_e4m3_low(p), _mm512_set1_ps(256.f));
  }
  // 16 e4m3 as fp32 at 2^-8 times their values (exact; subnormal codes included), for loops that scale their
  // sums by 2^8 once instead. The byte sign-extended to 16 bits and shifted left 7 puts its sign in bits 15
  // and 14 and its exponent and mantissa in 13..7; clearing bit 14 leaves that fp16 (3 integer operations
  // where masking each field took 5).
  static R load_e4m3_low(const uint8_t* p) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7),
                                       _mm256_set1_epi16(static_cast<int16_t>(0xbfff)));
    return _mm512_cvtph_ps(h);
  }
  // 64 e4m3 bytes of an fp8x16 tile, W[k .. k+4)[16 columns] (dense_x16_impl.h), as the bf16 pairs vdpbf16ps
  // takes: k01's 32-bit lane c = (W[k][c], W[k+1][c]), k23's = (W[k+2][c], W[k+3][c]); exact (every e4m3 value is
  // a bf16 normal; subnormal codes are normalised by the table). One byte permute puts each output word's source
  // where the unpacks read it, two 128-entry lookups (vpermi2b; bit 7 ignored) give each magnitude's bf16 high and
  // low bytes, the sign is or-ed into the high bytes and two unpacks interleave them into words: 6 instructions
  // for 64 weights where widening to fp32 takes 16 (AVX512-VBMI, which isa_supported(kAvx512Bf16) requires).
#if defined(__AVX512VBMI__) && defined(__AVX512BF16__)
  static constexpr bool kHasFp8Bf16Quad = true;
  static void load_e4m3_bf16_quad(const uint8_t* p, RI& k01, RI& k23) {
    const __m512i b = _mm512_permutexvar_epi8(_mm512_load_si512(kE4m3Bf16Table.perm), _mm512_loadu_si512(p));
    const __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(kE4m3Bf16Table.hi), b,
                                                _mm512_load_si512(kE4m3Bf16Table.hi + 64));
    const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(kE4m3Bf16Table.lo), b,
                                                _mm512_load_si512(kE4m3Bf16Table.lo + 64));
    const __m512i signed_hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
    k01 = _mm512_unpacklo_epi8(lo, signed_hi);  // (128-bit lane j: the words of perm[16 j .. 16 j + 8))
    k23 = _mm512_unpackhi_epi8(lo, signed_hi);
  }
#else
  static constexpr bool kHasFp8Bf16Quad = false;
  static void load_e4m3_bf16_quad(const uint8_t* p, RI& k01, RI& k23);  // declared only (kHasFp8Bf16Quad false)
#endif
  // 16 fp8 as bf16, exactly, for the pair-dot tiles: the byte's exponent and mantissa placed in an fp32 with
  // the wrong bias (127 for 7 or 15), scaled by 2^120 / 2^112 (subnormals come out right too), top halves kept.
  static void fp8_to_bf16(const uint8_t* p, uint16_t* dst, bool e4m3) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i mag = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x7f)), e4m3 ? 20 : 21);
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
    const R f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_or_si512(mag, sign)),
                              _mm512_set1_ps(e4m3 ? 0x1p120f : 0x1p112f));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16)));
  }
  // count fp8 (a multiple of 16) as bf16, 32 a step by table: the byte's low 7 bits pick one of 128 bf16
  // magnitudes (two vpermt2w lookups of 64, chosen by bit 6) and its top bit is the sign: 7 instructions a 32
  // values where fp8_to_bf16 takes ~20. The tables hold fp8_to_bf16's own results for the 128 magnitudes, so
  // both give the same bits. (With 128-token blocks an fp8 cache's attention spent 1.4-1.5x bf16's time on
  // the Zen 5 VM, most of it widening: docs/performance.md.)
  static void fp8_rows_to_bf16(const uint8_t* p, uint16_t* dst, int64_t count, bool e4m3) {
    const uint16_t* table = fp8_table(e4m3).bits;  // [128] bf16 bits of the magnitudes 0x00 .. 0x7f
    const __m512i t0 = _mm512_load_si512(table), t1 = _mm512_load_si512(table + 32);
    const __m512i t2 = _mm512_load_si512(table + 64), t3 = _mm512_load_si512(table + 96);
    const __m512i bit6 = _mm512_set1_epi16(0x40), sign = _mm512_set1_epi16(static_cast<int16_t>(0x8000));
    int64_t c = 0;
    for (; c + 32 <= count; c += 32) {
      const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + c)));
      const __m512i low = _mm512_permutex2var_epi16(t0, w, t1);   // index bits 5:0: magnitudes 0x00 .. 0x3f
      const __m512i high = _mm512_permutex2var_epi16(t2, w, t3);  // the same bits: 0x40 .. 0x7f
      const __m512i mag = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(w, bit6), low, high);
      // mag | (w << 8 & 0x8000): the byte's bit 7 as the bf16 sign
      _mm512_storeu_si512(dst + c, _mm512_ternarylogic_epi32(mag, _mm512_slli_epi16(w, 8), sign, 0xF8));
    }
    for (; c < count; c += W) fp8_to_bf16(p + c, dst + c, e4m3);
  }
  struct Fp8Table {
    alignas(64) uint16_t bits[128];
  };
  static Fp8Table make_fp8_table(bool e4m3) {
    Fp8Table t;
    alignas(16) uint8_t codes[128];
    for (int i = 0; i < 128; ++i) codes[i] = static_cast<uint8_t>(i);
    for (int i = 0; i < 128; i += W) fp8_to_bf16(codes + i, t.bits + i, e4m3);
    return t;
  }
  static const Fp8Table& fp8_table(bool e4m3) {
    static const Fp8Table tables[2] = {make_fp8_table(false), make_fp8_table(true)};  // e5m2, e4m3
    return tables[e4m3 ? 1 : 0];
  }
  static __m512i round_bits(R a) {  // fp32 bits rounded to nearest even bf16 in the top half; NaN quiet
    const __m512i bits = _mm512_castps_si512(a);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    const __m512i quiet_nan = _mm512_or_si512(bits, _mm512_set1_epi32(0x400000));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    return _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
  }
  static R round_bf16(R a) {
    return _mm512_castsi512_ps(_mm512_and_si512(round_bits(a), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static void store_bf16(uint16_t* p, R a) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_bits(a), 16)));
  }
  // bf16 is the top half of an fp32: even elements are the 32-bit lanes << 16, odd ones & 0xffff0000.
  static void load_bf16_pairs(const uint16_t* p, R& even, R& odd) {
    const __m512i v = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static RI load_i(const uint16_t* p) { return _mm512_loadu_si512(p); }
  static RI broadcast_pair(const uint16_t* p) {  // p[0], p[1] in every 32-bit lane (dense_x16_impl.h)
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(static_cast<int>(v));
  }
  static R dot_bf16(R acc, RI x, RI w) {
#ifdef __AVX512BF16__
    return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
#else  // unused without AVX512-BF16 (kHasDotBf16 false); correct anyway
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(x, hi)), _mm512_castsi512_ps(_mm512_and_si512(w, hi)),
                          acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), acc);
#endif
  }
  static RI zero_i() { return _mm512_setzero_si512(); }
  // Pairs of two rows' bf16 for dot_bf16 over the rows (vpunpck{l,h}wd, within 128-bit lanes):
  //   lo 32-bit lane 4L + i = (a[8L + i], b[8L + i]),  hi lane 4L + i = (a[8L + 4 + i], b[8L + 4 + i])
  static void interleave_bf16(RI a, RI b, RI& lo, RI& hi) {
    lo = _mm512_unpacklo_epi16(a, b);
    hi = _mm512_unpackhi_epi16(a, b);
  }
  // Lane j = the sum of a[j]'s lanes, for 16 vectors at once: a transposing tree of 15 (2 shuffles +
  // 1 add) steps, against 16 separate reductions. (Its order differs from reduce_add's.)
  __attribute__((always_inline)) static R reduce_add16(const R* a) {
    R b[8], c[4];
    for (int i = 0; i < 8; ++i)  // 128-bit lane L: (a0 x0+x2, a1 x0+x2, a0 x1+x3, a1 x1+x3)
      b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; ++i)  // lane L: keys 4i..4i+3, each summed over lane L's 4 elements
      c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44), _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    const R d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x44), _mm512_shuffle_f32x4(c[0], c[1], 0xEE));
    const R d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x44), _mm512_shuffle_f32x4(c[2], c[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
  }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R div(R a, R b) { return _mm512_div_ps(a, b); }
  static R min(R a, R b) { return _mm512_min_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static R fmadd(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R fnmadd(R a, R b, R c) { return _mm512_fnmadd_ps(a, b, c); }
  static R mul_add(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R round_nearest(R a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static R pow2n(R n) {  // 2^n for integral n in the normal range: n + 127 in the exponent field
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static M less(R a, R b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static R zero_where(M m, R a) { return _mm512_maskz_mov_ps(static_cast<__mmask16>(~m), a); }
  static R exp(R x) { return vec_exp<VecAvx512>(x); }
  static float reduce_add(R a) {  // halves folded: the order of VecAvx2::reduce_add
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // Four reduce_add at once, each in exactly reduce_add's order (see VecAvx2::reduce_add4: a dot
  // product must not depend on the tile it lands in).
  static void reduce_add4(R a, R b, R c, R d, float* out) {
    __m128 s[4];
    const R v[4] = {a, b, c, d};
    for (int i = 0; i < 4; ++i) {
      const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v[i]), _mm512_extractf32x8_ps(v[i], 1));
      s[i] = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    }
    _MM_TRANSPOSE4_PS(s[0], s[1], s[2], s[3]);  // s[i] = lane i of a, b, c, d
    _mm_storeu_ps(out, _mm_add_ps(_mm_add_ps(s[0], s[2]), _mm_add_ps(s[1], s[3])));
  }
  static float reduce_max(R a) { return _mm512_reduce_max_ps(a); }
};

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
