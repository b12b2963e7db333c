// Portable W-lane vector for the linear kernel (see linear_impl.h for the interface): plain loops
// over arrays, vectorised by the compiler for the baseline ISA. Included only by the generic
// translation units (baseline flags), so sharing its inline functions between them is safe.
//
// kDot = true adds dot_bf16, an emulation of AVX512-BF16's vdpbf16ps, so the tiling of the
// AVX512-BF16 kernel is tested on any CPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pagedcore {
namespace kernels {
namespace linear_portable {

inline float bf16_bits_to_float(uint32_t h) {
  const uint32_t bits = h << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_bf16_rne(float f) {  // as kernel_types.h float_to_bf16
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

template <int kW, bool kDot>
struct LinearVecGeneric {
  static constexpr int W = kW;
  static constexpr int kRegs = kW == 8 ? 16 : 32;  // the register file of the ISA this stands in for
  static constexpr bool kHasDotBf16 = kDot;
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
  static R fmadd(const R& a, const R& b, const R& c) {  // a * b + c, one rounding as the FMA unit
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return r;
  }
  static R exp(const R& a) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = std::exp(a.v[i]);
    return r;
  }
  // 2 W bf16 at p: even = p[0], p[2], ..., odd = p[1], p[3], ... widened to fp32.
  static void load_bf16_pairs(const uint16_t* p, R& even, R& odd) {
    for (int i = 0; i < W; ++i) {
      even.v[i] = bf16_bits_to_float(p[2 * i]);
      odd.v[i] = bf16_bits_to_float(p[2 * i + 1]);
    }
  }
  static R load_bf16(const uint16_t* p) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = bf16_bits_to_float(p[i]);
    return r;
  }
  static void store_bf16(uint16_t* p, const R& a) {
    for (int i = 0; i < W; ++i) p[i] = float_to_bf16_rne(a.v[i]);
  }
  static R round_bf16(const R& a) {  // to the nearest bf16, kept in fp32
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = bf16_bits_to_float(float_to_bf16_rne(a.v[i]));
    return r;
  }
  static RI load_i(const uint16_t* p) {
    RI r;
    std::memcpy(r.v, p, sizeof r.v);
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
  static float hsum(const R& a) {  // pairwise, as the vector versions fold halves
    float t[kW];
    std::memcpy(t, a.v, sizeof t);
    for (int n = W / 2; n >= 1; n /= 2)
      for (int i = 0; i < n; ++i) t[i] += t[i + n];
    return t[0];
  }
  static void hsum4(const R& a, const R& b, const R& c, const R& d, float* out) {
    out[0] = hsum(a);
    out[1] = hsum(b);
    out[2] = hsum(c);
    out[3] = hsum(d);
  }
};

}  // namespace linear_portable
}  // namespace kernels
}  // namespace pagedcore
