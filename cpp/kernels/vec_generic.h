// The portable vector trait: W fp32 lanes as plain loops over an array, vectorised by the compiler
// for the baseline ISA. One of the three trait headers (vec_generic.h, vec_avx2.h, vec_avx512.h)
// that every kernel family (attention_impl.h, linear_impl.h, norm_impl.h) is written against.
//
// A kernel translation unit defines PC_ISA_NAMESPACE (e.g. linear_generic16) and includes one trait
// header: the trait is defined inside that per-unit namespace, so each unit compiles its own copy
// with its own flags and no inline function is shared between units (see attention_kernel.h).
//
// The interface, the same in every trait (R: W floats; RI: 2 W bf16; M: a lane mask):
//   W, kRegs (vector registers of the ISA), kHasDotBf16 (dot_bf16 is the hardware's)
//   zero set1 load store load_bf16 store_bf16 round_bf16 (to the nearest bf16, kept in fp32) load_f16 (IEEE fp16)
//   load_fp8 (e4m3 / e5m2) load_e4m3_low (e4m3 at 2^-8 times its value)
//   load_bf16_pairs (2 W bf16 -> even, odd lanes) load_i dot_bf16 (vdpbf16ps)
//   kHasFp8Bf16Quad, load_e4m3_bf16_quad (64 e4m3 of an fp8x16 tile -> two vectors of bf16 pairs; 16 lanes
//   with the bf16 dot only)
//   16 lanes only (attention_dot_tiles.h): zero_i, interleave_bf16 (vpunpck{l,h}wd pairs of two
//   rows), reduce_add16 (16 vectors -> one vector of their sums)
//   add sub mul div min max
//   fmadd, fnmadd:  a * b + c, c - a * b with one rounding, as an FMA unit (the linear and norm
//                   kernels rely on it: every ISA rounds their sums alike)
//   mul_add:        a * b + c at the ISA's speed: fused on the AVX traits, a multiply then an add
//                   here (a scalar fma call per lane would be slow; the attention kernel uses it)
//   exp reduce_add (pairwise, halves folded as the AVX traits do) reduce_add4 reduce_max
//   round_nearest pow2n less zero_where: the pieces of vec_exp.h's polynomial (AVX traits only)
//
// VecGeneric<kW, kEmulateDotBf16>: kEmulateDotBf16 = true makes dot_bf16 an emulation of
// AVX512-BF16's vdpbf16ps (kHasDotBf16), so that kernel's tiling is tested on any CPU.
#pragma once

#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE (the kernel unit's namespace) before including vec_generic.h"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

inline float bf16_bits_to_float(uint32_t h) {
  const uint32_t bits = h << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE fp16 -> fp32, exactly (kernel_types.h fp16_to_float's arithmetic; its own copy, as every function here).
inline float f16_bits_to_float(uint16_t h) {
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0x1fu) v = man ? NAN : INFINITY;
  else if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);  // subnormal: man * 2^-24, exact
  else v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  return (h & 0x8000u) ? -v : v;
}

// Round to nearest even; NaN stays a quiet NaN (as kernel_types.h float_to_bf16).
inline uint16_t float_to_bf16_rne(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

template <int kW, bool kEmulateDotBf16>
struct VecGeneric {
  static constexpr int W = kW;
  static constexpr int kRegs = kW == 8 ? 16 : 32;  // the register file of the ISA this stands in for
  static constexpr bool kHasDotBf16 = kEmulateDotBf16;
  struct R {
    float v[kW];
  };
  struct RI {  // 2 W bf16 values
    uint16_t v[2 * kW];
  };
  static R zero() { return set1(0.f); }
  static R set1(float x) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = x;
    return r;
  }
  static R load(const float* p) {
    R r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static void store(float* p, const R& a) { std::memcpy(p, a.v, sizeof a.v); }
  static R load_bf16(const uint16_t* p) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = bf16_bits_to_float(p[i]);
    return r;
  }
  static void store_bf16(uint16_t* p, const R& a) {
    for (int i = 0; i < W; ++i) p[i] = float_to_bf16_rne(a.v[i]);
  }
  static R load_f16(const uint16_t* p) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = f16_bits_to_float(p[i]);
    return r;
  }
  static void fp8_to_bf16(const uint8_t* p, uint16_t* dst, bool e4m3) { store_bf16(dst, load_fp8(p, e4m3)); }
  static void fp8_rows_to_bf16(const uint8_t* p, uint16_t* dst, int64_t count, bool e4m3) {  // count % W == 0
    for (int64_t c = 0; c < count; c += W) fp8_to_bf16(p + c, dst + c, e4m3);
  }
  // W fp8 (kernels/fp8.h; its own copy here, as every function of a trait: see attention_kernel.h).
  static R load_fp8(const uint8_t* p, bool e4m3) {
    R r;
    for (int i = 0; i < W; ++i) {
      const int mant = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
      const int e = (p[i] & 0x7f) >> mant, m = p[i] & ((1 << mant) - 1);
      const float v = e == 0 ? std::ldexp(static_cast<float>(m), 1 - bias - mant)
                             : std::ldexp(static_cast<float>((1 << mant) + m), e - bias - mant);
      r.v[i] = (p[i] & 0x80) ? -v : v;
    }
    return r;
  }
  // W e4m3 at 2^-8 times their values (exact: the smallest, 2^-17, is an fp32 normal), as the SIMD traits'.
  static R load_e4m3_low(const uint8_t* p) {
    R r = load_fp8(p, true);
    for (int i = 0; i < W; ++i) r.v[i] *= 0x1p-8f;
    return r;
  }
  // vec_avx512.h's load_e4m3_bf16_quad (16 lanes with the bf16 dot emulated): the 64 e4m3 bytes W[k .. k+4)[16]
  // of an fp8x16 tile as bf16 pairs, k01 lane c = (W[k][c], W[k+1][c]), k23 = (W[k+2][c], W[k+3][c]), exactly.
  static constexpr bool kHasFp8Bf16Quad = kEmulateDotBf16 && kW == 16;
  static void load_e4m3_bf16_quad(const uint8_t* p, RI& k01, RI& k23) {
    static_assert(kW == 16, "load_e4m3_bf16_quad reads 16 columns");
    R rows[4];
    for (int r = 0; r < 4; ++r) rows[r] = load_fp8(p + 16 * r, true);
    for (int c = 0; c < 16; ++c) {
      k01.v[2 * c] = float_to_bf16_rne(rows[0].v[c]);  // (exact: every e4m3 value is a bf16)
      k01.v[2 * c + 1] = float_to_bf16_rne(rows[1].v[c]);
      k23.v[2 * c] = float_to_bf16_rne(rows[2].v[c]);
      k23.v[2 * c + 1] = float_to_bf16_rne(rows[3].v[c]);
    }
  }
  static R round_bf16(const R& a) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = bf16_bits_to_float(float_to_bf16_rne(a.v[i]));
    return r;
  }
  // 2 W bf16 at p: even = p[0], p[2], ..., odd = p[1], p[3], ... widened to fp32.
  static void load_bf16_pairs(const uint16_t* p, R& even, R& odd) {
    for (int i = 0; i < W; ++i) {
      even.v[i] = bf16_bits_to_float(p[2 * i]);
      odd.v[i] = bf16_bits_to_float(p[2 * i + 1]);
    }
  }
  static RI load_i(const uint16_t* p) {
    RI r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static RI broadcast_pair(const uint16_t* p) {  // p[0], p[1] in every pair of lanes (dense_x16_impl.h)
    RI r;
    for (int i = 0; i < W; ++i) {
      r.v[2 * i] = p[0];
      r.v[2 * i + 1] = p[1];
    }
    return r;
  }
  // vdpbf16ps: acc[i] += x[2i+1] * w[2i+1] + x[2i] * w[2i] (bf16 products are exact in fp32; the
  // hardware adds them into acc in this order, flushing denormals, which test data avoids).
  static R dot_bf16(const R& acc, const RI& x, const RI& w) {
    R r;
    for (int i = 0; i < W; ++i) {
      float s = acc.v[i] + bf16_bits_to_float(x.v[2 * i + 1]) * bf16_bits_to_float(w.v[2 * i + 1]);
      r.v[i] = s + bf16_bits_to_float(x.v[2 * i]) * bf16_bits_to_float(w.v[2 * i]);
    }
    return r;
  }
  static RI zero_i() {
    RI r;
    std::memset(r.v, 0, sizeof r.v);
    return r;
  }
  // vpunpck{l,h}wd per 8-element group L: lo pair 4L + i = (a[8L + i], b[8L + i]), hi pair 4L + i =
  // (a[8L + 4 + i], b[8L + 4 + i]) (W = 16 only: the AVX-512 instruction this emulates).
  static void interleave_bf16(const RI& a, const RI& b, RI& lo, RI& hi) {
    static_assert(kW == 16, "interleave_bf16 emulates 512-bit vpunpcklwd");
    for (int L = 0; L < 4; ++L)
      for (int i = 0; i < 4; ++i) {
        lo.v[8 * L + 2 * i] = a.v[8 * L + i];
        lo.v[8 * L + 2 * i + 1] = b.v[8 * L + i];
        hi.v[8 * L + 2 * i] = a.v[8 * L + 4 + i];
        hi.v[8 * L + 2 * i + 1] = b.v[8 * L + 4 + i];
      }
  }
  static R reduce_add16(const R* a) {  // lane j = reduce_add(a[j])
    static_assert(kW == 16, "reduce_add16 takes W = 16 vectors");
    R r;
    for (int j = 0; j < W; ++j) r.v[j] = reduce_add(a[j]);
    return r;
  }
  static R add(const R& a, const R& b) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] + b.v[i];
    return r;
  }
  static R sub(const R& a, const R& b) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] - b.v[i];
    return r;
  }
  static R mul(const R& a, const R& b) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] * b.v[i];
    return r;
  }
  static R div(const R& a, const R& b) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] / b.v[i];
    return r;
  }
  static R min(const R& a, const R& b) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] < b.v[i] ? a.v[i] : b.v[i];
    return r;
  }
  static R max(const R& a, const R& b) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
    return r;
  }
  static R fmadd(const R& a, const R& b, const R& c) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return r;
  }
  static R fnmadd(const R& a, const R& b, const R& c) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = std::fma(-a.v[i], b.v[i], c.v[i]);
    return r;
  }
  static R mul_add(const R& a, const R& b, const R& c) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] * b.v[i] + c.v[i];
    return r;
  }
  static R exp(const R& a) {  // exp(-inf) = 0 exactly
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = std::exp(a.v[i]);
    return r;
  }
  static float reduce_add(const R& a) {
    float t[kW];
    std::memcpy(t, a.v, sizeof t);
    for (int n = W / 2; n >= 1; n /= 2)
      for (int i = 0; i < n; ++i) t[i] += t[i + n];
    return t[0];
  }
  static void reduce_add4(const R& a, const R& b, const R& c, const R& d, float* out) {
    out[0] = reduce_add(a);
    out[1] = reduce_add(b);
    out[2] = reduce_add(c);
    out[3] = reduce_add(d);
  }
  static float reduce_max(const R& a) {
    float s = a.v[0];
    for (int i = 1; i < W; ++i) s = a.v[i] > s ? a.v[i] : s;
    return s;
  }
};

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
