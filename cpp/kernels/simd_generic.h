// Portable W-lane float vector for the attention kernel (see attention_impl.h for the interface).
// Plain loops over an array: the compiler vectorises them for whatever the baseline ISA is.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pagedcore {
namespace kernels {

template <int kW>
struct GenericVec {
  static constexpr int W = kW;
  struct R {
    float v[kW];
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
    for (int i = 0; i < W; ++i) {
      uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
      std::memcpy(&r.v[i], &bits, 4);
    }
    return r;
  }
  // Round to nearest even; NaN stays a quiet NaN (as kernel_types.h float_to_bf16).
  static void store_bf16(uint16_t* p, const R& a) {
    for (int i = 0; i < W; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &a.v[i], 4);
      if ((bits & 0x7fffffffu) > 0x7f800000u) {
        p[i] = static_cast<uint16_t>((bits >> 16) | 0x0040u);
      } else {
        p[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
      }
    }
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
  static R fmadd(const R& a, const R& b, const R& c) {  // a * b + c
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] * b.v[i] + c.v[i];
    return r;
  }
  static R max(const R& a, const R& b) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
    return r;
  }
  static R exp(const R& a) {  // exp(-inf) = 0 exactly
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = std::exp(a.v[i]);
    return r;
  }
  static float reduce_add(const R& a) {
    float s = 0.f;
    for (int i = 0; i < W; ++i) s += a.v[i];
    return s;
  }
  static float reduce_max(const R& a) {
    float s = a.v[0];
    for (int i = 1; i < W; ++i) s = a.v[i] > s ? a.v[i] : s;
    return s;
  }
  // out[0..3] = horizontal sums of a, b, c, d.
  static void reduce_add4(const R& a, const R& b, const R& c, const R& d, float* out) {
    out[0] = reduce_add(a);
    out[1] = reduce_add(b);
    out[2] = reduce_add(c);
    out[3] = reduce_add(d);
  }
};

}  // namespace kernels
}  // namespace pagedcore
