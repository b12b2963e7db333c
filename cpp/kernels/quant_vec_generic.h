// The portable integer-vector trait of the quantized linear kernels (quant_linear_impl.h): plain
// loops over arrays, exact emulations of the instructions the AVX traits use, so the kernel's
// tiling and arithmetic are tested on any CPU.
//   QVecGeneric<1, false>: one 32-byte part, vpmaddubsw + vpmaddwd (the AVX2 kernel);
//   QVecGeneric<2, true>:  two parts, vpdpbusd (the AVX512-VNNI kernel).
//
// The trait interface (the same in quant_vec_avx2.h, quant_vec_avx512.h):
//   S (32-byte parts per vector), kRegs; types V (32 S bytes), I (8 S int32), F (8 S fp32), SC
//   load(p)                32 S bytes; load2(p0, p1): part 0 from p0, part 1 from p1
//   nib16(p0, p1)          per part: 16 bytes q -> [q & 15 (16 bytes), q >> 4 (16 bytes)]
//   shr_and(v, s0, s1, m)  per part: (byte >> s) & m   (m <= 255 >> s)
//   or_, shl4              bytewise (shl4 on values < 16)
//   dot(u, x)              int32 lanes of sum(u * x) over groups of 4 bytes: u unsigned <= 63,
//                          x signed (sums of pairs fit int16: no saturation)
//   dot_signed(w, x)       the same for signed w (as |w| * sign(w) x)
//   scales(sc)             2 S int16 scales, one per 16 bytes; dot_scaled(u, x, scales): dot with
//                          each 16-byte group's products times its scale
//   add izero hsum_i; fzero cvt fmadd(a, b, c) = a * b + c, set1, set2 (per part), hsum,
//   bcast2(p)              part 0 = p[0], part 1 = p[1] (S == 2)
//   F8 (8 fp32) set8 load8 store8 mul8 fmadd8 hsum8, half8(p, stride): 8 strided fp16 -> fp32
//   half_to_float          IEEE fp16 -> fp32
#pragma once

#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE (the kernel unit's namespace) before including quant_vec_generic.h"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/kernel_types.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

template <int kS, bool kDpbusd>
struct QVecGeneric {
  static constexpr int S = kS;
  static constexpr int kRegs = 32;
  static constexpr int kBytes = 32 * kS;
  static constexpr int kLanes = 8 * kS;
  struct V { uint8_t b[kBytes]; };
  struct I { int32_t v[kLanes]; };
  struct F { float v[kLanes]; };
  struct SC { int32_t s[2 * kS]; };

  static V load(const void* p) {
    V r;
    std::memcpy(r.b, p, kBytes);
    return r;
  }
  static V load2(const void* p0, const void* p1) {
    V r;
    std::memcpy(r.b, p0, 32);
    if (kS == 2) std::memcpy(r.b + 32, p1, 32);
    return r;
  }
  static V nib16(const void* p0, const void* p1) {
    V r;
    for (int part = 0; part < kS; ++part) {
      const uint8_t* q = static_cast<const uint8_t*>(part ? p1 : p0);
      for (int i = 0; i < 16; ++i) {
        r.b[32 * part + i] = q[i] & 15;
        r.b[32 * part + 16 + i] = q[i] >> 4;
      }
    }
    return r;
  }
  // Q5_0 / Q5_1: bit i of part p's qh word as 16 in byte 32 p + i.
  static V high_bits(uint32_t h0, uint32_t h1) {
    V r;
    for (int part = 0; part < kS; ++part)
      for (int i = 0; i < 32; ++i) r.b[32 * part + i] = static_cast<uint8_t>(((part ? h1 : h0) >> i & 1u) << 4);
    return r;
  }
  static V shr_and(V v, int s0, int s1, int mask) {
    for (int i = 0; i < kBytes; ++i) v.b[i] = static_cast<uint8_t>((v.b[i] >> (i < 32 ? s0 : s1)) & mask);
    return v;
  }
  static V or_(V a, V b) {
    for (int i = 0; i < kBytes; ++i) a.b[i] |= b.b[i];
    return a;
  }
  static V shl4(V a) {
    for (int i = 0; i < kBytes; ++i) a.b[i] = static_cast<uint8_t>(a.b[i] << 4);
    return a;
  }

  // vpmaddubsw's saturating pair sum.
  static int32_t sat16(int32_t v) { return v > 32767 ? 32767 : v < -32768 ? -32768 : v; }
  static int32_t pair(const V& u, const V& x, int k) {
    return sat16(u.b[2 * k] * static_cast<int8_t>(x.b[2 * k]) + u.b[2 * k + 1] * static_cast<int8_t>(x.b[2 * k + 1]));
  }
  static int32_t quad(const V& u, const V& x, int j) {  // vpdpbusd: exact sum of 4 products
    int32_t s = 0;
    for (int i = 0; i < 4; ++i) s += u.b[4 * j + i] * static_cast<int8_t>(x.b[4 * j + i]);
    return s;
  }
  static I dot(const V& u, const V& x) {
    I r;
    for (int j = 0; j < kLanes; ++j) r.v[j] = kDpbusd ? quad(u, x, j) : pair(u, x, 2 * j) + pair(u, x, 2 * j + 1);
    return r;
  }
  static I dot_signed(const V& w, const V& x) {
    V u, xs;
    for (int i = 0; i < kBytes; ++i) {
      const int8_t wi = static_cast<int8_t>(w.b[i]), xi = static_cast<int8_t>(x.b[i]);
      u.b[i] = static_cast<uint8_t>(wi < 0 ? -wi : wi);  // -128 -> 128
      xs.b[i] = static_cast<uint8_t>(wi < 0 ? -xi : wi == 0 ? 0 : xi);
    }
    return dot(u, xs);
  }
  static SC scales(const int16_t* sc) {
    SC r;
    for (int i = 0; i < 2 * kS; ++i) r.s[i] = sc[i];
    return r;
  }
  static I dot_scaled(const V& u, const V& x, const SC& sc) {
    I r;
    for (int j = 0; j < kLanes; ++j) {  // lane j covers bytes 4 j .. 4 j + 3, in 16-byte group j / 4
      const int32_t s = sc.s[j / 4];
      r.v[j] = kDpbusd ? quad(u, x, j) * s : pair(u, x, 2 * j) * s + pair(u, x, 2 * j + 1) * s;
    }
    return r;
  }
  static I add(I a, const I& b) {
    for (int j = 0; j < kLanes; ++j) a.v[j] += b.v[j];
    return a;
  }
  static I izero() { return I{}; }
  static int32_t hsum_i(const I& a) {
    int32_t s = 0;
    for (int j = 0; j < kLanes; ++j) s += a.v[j];
    return s;
  }

  static F fzero() { return F{}; }
  static F cvt(const I& a) {
    F r;
    for (int j = 0; j < kLanes; ++j) r.v[j] = static_cast<float>(a.v[j]);
    return r;
  }
  static F fmadd(const F& a, const F& b, F c) {
    for (int j = 0; j < kLanes; ++j) c.v[j] += a.v[j] * b.v[j];
    return c;
  }
  static F set1(float s) {
    F r;
    for (int j = 0; j < kLanes; ++j) r.v[j] = s;
    return r;
  }
  static F set2(float s0, float s1) {
    F r;
    for (int j = 0; j < kLanes; ++j) r.v[j] = j < 8 ? s0 : s1;
    return r;
  }
  static F bcast2(const float* p) { return set2(p[0], kS == 2 ? p[1] : p[0]); }
  static float hsum(const F& a) {
    float s = 0.f;
    for (int j = 0; j < kLanes; ++j) s += a.v[j];
    return s;
  }

  // 8 fp32 lanes for per-block scale arithmetic; half8: the fp16 at p, p + stride, ... p + 7 stride.
  struct F8 { float v[8]; };
  static F8 set8(float s) {
    F8 r;
    for (int i = 0; i < 8; ++i) r.v[i] = s;
    return r;
  }
  static F8 load8(const float* p) {
    F8 r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static void store8(float* p, const F8& a) { std::memcpy(p, a.v, sizeof a.v); }
  static F8 mul8(F8 a, const F8& b) {
    for (int i = 0; i < 8; ++i) a.v[i] *= b.v[i];
    return a;
  }
  static F8 fmadd8(const F8& a, const F8& b, F8 c) {
    for (int i = 0; i < 8; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }
  static float hsum8(const F8& a) {
    float s = 0.f;
    for (int i = 0; i < 8; ++i) s += a.v[i];
    return s;
  }
  static F8 half8(const void* p, int stride) {
    F8 r;
    for (int i = 0; i < 8; ++i) {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(p) + i * stride, 2);
      r.v[i] = half_to_float(h);
    }
    return r;
  }

  static float half_to_float(uint16_t h) { return fp16_to_float(h); }
};

// The 16-lane trait of the repacked kernels (quant_x16_impl.h) in portable C++: the reference
// arithmetic of the SIMD traits (int32 sums, fp32 FMAs), on any CPU.
struct X16Generic {
  static constexpr int kMaxRows = 4;
  static constexpr bool kQ8Signed = false;  // sums the stored q + 128 bytes, as vpdpbusd does
  static constexpr bool kPairs16 = false;  // (a trait with kPairs16 also defines P, pzero, pdot4, widen)
  struct V { uint8_t b[64]; };
  struct I { int32_t v[16]; };
  struct F { float v[16]; };
  static V load(const void* p) {
    V r;
    std::memcpy(r.b, p, sizeof r.b);
    return r;
  }
  static V lo4(V v) {
    for (uint8_t& b : v.b) b &= 0x0F;
    return v;
  }
  static V hi4(V v) {
    for (uint8_t& b : v.b) b >>= 4;
    return v;
  }
  static I izero() { return I{}; }
  static I dot4(I acc, const V& w, const int8_t* x4) {
    for (int l = 0; l < 16; ++l)
      for (int t = 0; t < 4; ++t) acc.v[l] += static_cast<int32_t>(w.b[4 * l + t]) * x4[t];
    return acc;
  }
  static I dot4_q8(I acc, const V& w, const int8_t* x4) { return dot4(acc, w, x4); }
  static F fzero() { return F{}; }
  static F cvt(const I& a) {
    F r;
    for (int l = 0; l < 16; ++l) r.v[l] = static_cast<float>(a.v[l]);
    return r;
  }
  static F half16(const uint16_t* p) {
    F r;
    for (int l = 0; l < 16; ++l) r.v[l] = QVecGeneric<1, false>::half_to_float(p[l]);
    return r;
  }
  static F mul_s(F a, float s) {
    for (float& v : a.v) v *= s;
    return a;
  }
  static F fmadd(const F& a, const F& b, F c) {
    for (int l = 0; l < 16; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
    return c;
  }
  static F fmadd_s(const F& a, float s, F c) {
    for (int l = 0; l < 16; ++l) c.v[l] = std::fma(a.v[l], s, c.v[l]);
    return c;
  }
  static void store(float* p, const F& a) { std::memcpy(p, a.v, sizeof a.v); }
  static I isub_s(I a, int32_t s) {
    for (int32_t& v : a.v) v -= s;
    return a;
  }
  static F loadf(const float* p) {
    F r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static F mul(F a, const F& b) {
    for (int l = 0; l < 16; ++l) a.v[l] *= b.v[l];
    return a;
  }

  // The repacked k-quants (quant_kx16_impl.h), VNNI's arithmetic: a sub-block's sums, then times its
  // scale. A lane of a pairs vector holds two int16 values (lo, hi): kept as lo + 65536 hi.
  static constexpr int kMaxRowsK = 4;
  static constexpr bool kScaleInDot = false;
  static V or_(V a, const V& b) {
    for (int i = 0; i < 64; ++i) a.b[i] |= b.b[i];
    return a;
  }
  static V and8(V a, uint8_t m) {
    for (uint8_t& b : a.b) b &= m;
    return a;
  }
  // Per byte: the SIMD traits shift 16-bit words, which differs only in bits the callers mask off.
  static V shl16(V a, int n) {
    for (uint8_t& b : a.b) b = static_cast<uint8_t>(b << n);
    return a;
  }
  static V shr16(V a, int n) {
    for (uint8_t& b : a.b) b = static_cast<uint8_t>(b >> n);
    return a;
  }
  static I pairs_u8(const uint8_t* p) {
    I r;
    for (int l = 0; l < 16; ++l) r.v[l] = static_cast<int32_t>(p[2 * l]) + 65536 * static_cast<int32_t>(p[2 * l + 1]);
    return r;
  }
  static I pairs_s8(const int8_t* p) {
    I r;
    for (int l = 0; l < 16; ++l) r.v[l] = static_cast<int32_t>(p[2 * l]) + 65536 * static_cast<int32_t>(p[2 * l + 1]);
    return r;
  }
  static int32_t lo16(int32_t v) { return static_cast<int16_t>(static_cast<uint32_t>(v) & 0xFFFFu); }
  static int32_t hi16(int32_t v) { return (v - lo16(v)) / 65536; }
  static I dot2(I acc, const I& pairs, const int16_t* x2) {
    for (int l = 0; l < 16; ++l) acc.v[l] += lo16(pairs.v[l]) * x2[0] + hi16(pairs.v[l]) * x2[1];
    return acc;
  }
  static I scale_lo(I p) {
    for (int32_t& v : p.v) v = lo16(v);
    return p;
  }
  static I scale_hi(I p) {
    for (int32_t& v : p.v) v = hi16(v);
    return p;
  }
  static I dot4_sc(I acc, const V& w, const int8_t* x4, const I& sc) {  // (unused: kScaleInDot is false)
    return mul_add(acc, dot4(izero(), w, x4), sc);
  }
  static I mul_add(I acc, const I& s, const I& sc) {
    for (int l = 0; l < 16; ++l) acc.v[l] += s.v[l] * sc.v[l];
    return acc;
  }
  static I sub(I a, const I& b) {
    for (int l = 0; l < 16; ++l) a.v[l] -= b.v[l];
    return a;
  }
  static I add(I a, const I& b) {
    for (int l = 0; l < 16; ++l) a.v[l] += b.v[l];
    return a;
  }
  static I shl32(I a, int n) {
    for (int32_t& v : a.v) v *= 1 << n;
    return a;
  }
};

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
