// norm.h's ops (RMSNorm with residual add, rotary embedding) written against the vector trait V of
// linear_impl.h, which includes this file inside each per-ISA translation unit (same namespace,
// same rules: nothing here is shared across units).
//
// Rounding follows torch's op-by-op sequence: every value torch would store in bf16 is rounded
// here too (round_bf16), products are never fused into an FMA where torch rounds them apart (the
// units build with -ffp-contract=off), so bf16 results match the unfused torch ops bit for bit and
// fp32 ones up to the order of the sum of squares.
#ifndef PC_ISA_NAMESPACE
#error "norm_impl.h is included by linear_impl.h"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

inline float* f32_at(void* base, int64_t i) { return static_cast<float*>(base) + i; }
inline uint16_t* bf16_at(void* base, int64_t i) { return static_cast<uint16_t*>(base) + i; }

// count (<= W) elements at element offset i, the rest of the lanes zero.
inline R load_n(const void* base, DType t, int64_t i, int64_t count) {
  if (count == W) return load_any(base, t, i);
  alignas(64) float tmp[W] = {};
  if (t == DType::kFloat32) {
    std::memcpy(tmp, static_cast<const float*>(base) + i, count * sizeof(float));
  } else {
    for (int64_t k = 0; k < count; ++k) tmp[k] = bf16_scalar(static_cast<const uint16_t*>(base)[i + k]);
  }
  return V::load(tmp);
}

// Stores the first count lanes (bf16: rounded to nearest even).
inline void store_n(void* base, DType t, int64_t i, int64_t count, R v) {
  if (t == DType::kFloat32) {
    if (count == W) return V::store(f32_at(base, i), v);
    alignas(64) float tmp[W];
    V::store(tmp, v);
    std::memcpy(f32_at(base, i), tmp, count * sizeof(float));
  } else {
    if (count == W) return V::store_bf16(bf16_at(base, i), v);
    alignas(64) uint16_t tmp[W];
    V::store_bf16(tmp, v);
    std::memcpy(bf16_at(base, i), tmp, count * sizeof(uint16_t));
  }
}

inline const void* row_ptr(const void* base, DType t, int64_t offset) {
  return static_cast<const char*>(base) + offset * (t == DType::kFloat32 ? 4 : 2);
}
inline void* row_ptr(void* base, DType t, int64_t offset) {
  return static_cast<char*>(base) + offset * (t == DType::kFloat32 ? 4 : 2);
}

// RMSNorm over rows [r0, r1): (residual += x), then out = norm(residual or x) * weight.
//   pass 1: the value to normalise (rounded to the dtype when it is stored in residual) and its
//           sum of squares;  pass 2: out = round(round(v * rinv) * w).
void rms_norm_rows(const RmsNormParams& p, int64_t r0, int64_t r1) {
  const DType t = p.dtype;
  const bool bf16 = t == DType::kBFloat16;
  const int64_t n = p.n;
  for (int64_t r = r0; r < r1; ++r) {
    const void* x = row_ptr(p.x, t, r * p.x_stride);
    void* res = p.residual ? row_ptr(p.residual, t, r * p.residual_stride) : nullptr;
    void* out = row_ptr(p.out, t, r * p.out_stride);
    R acc0 = V::zero(), acc1 = V::zero();
    int64_t c = 0;
    for (; c < n; c += W) {
      const int64_t cnt = n - c < W ? n - c : W;
      R v = load_n(x, t, c, cnt);
      if (res) {
        v = V::add(load_n(res, t, c, cnt), v);
        if (bf16) v = V::round_bf16(v);
        store_n(res, t, c, cnt, v);
      }
      if ((c / W) & 1) acc1 = V::fmadd(v, v, acc1);
      else acc0 = V::fmadd(v, v, acc0);
    }
    const float mean = V::reduce_add(V::add(acc0, acc1)) / static_cast<float>(n);
    // __builtin_sqrtf, not std::sqrt: an unoptimised build emits std::sqrt(float) as a weak inline
    // symbol compiled with this ISA's flags, and the linker may hand that copy to generic callers.
    const R rinv = V::set1(1.f / __builtin_sqrtf(mean + p.eps));
    const void* src = res ? static_cast<const void*>(res) : x;
    for (c = 0; c < n; c += W) {
      const int64_t cnt = n - c < W ? n - c : W;
      R y = V::mul(load_n(src, t, c, cnt), rinv);
      if (bf16) y = V::round_bf16(y);
      store_n(out, t, c, cnt, V::mul(y, load_n(p.weight, t, c, cnt)));
    }
  }
}

// Rotary embedding of tokens [t0, t1), every head, in place (see norm.h):
//   x1' = x1 * cos - x2 * sin,  x2' = x2 * cos + x1 * sin,  each product rounded to the dtype.
void rotary_rows(const RotaryParams& p, int64_t t0, int64_t t1) {
  const DType t = p.dtype;
  const bool bf16 = t == DType::kBFloat16;
  const int64_t half = p.head_dim / 2;
  for (int64_t tok = t0; tok < t1; ++tok) {
    const void* cs = row_ptr(p.cos_sin, t, tok * p.cos_sin_stride);
    for (int64_t c = 0; c < half; c += W) {
      const int64_t cnt = half - c < W ? half - c : W;
      const R cosv = load_n(cs, t, c, cnt);
      const R sinv = load_n(cs, t, half + c, cnt);
      for (int64_t h = 0; h < p.num_heads; ++h) {
        void* x = row_ptr(p.x, t, tok * p.x_stride_token + h * p.x_stride_head);
        const R a = load_n(x, t, c, cnt);
        const R b = load_n(x, t, half + c, cnt);
        R p1 = V::mul(a, cosv), p2 = V::mul(b, sinv), p3 = V::mul(b, cosv), p4 = V::mul(a, sinv);
        if (bf16) {
          p1 = V::round_bf16(p1);
          p2 = V::round_bf16(p2);
          p3 = V::round_bf16(p3);
          p4 = V::round_bf16(p4);
        }
        store_n(x, t, c, cnt, V::sub(p1, p2));
        store_n(x, t, half + c, cnt, V::add(p3, p4));
      }
    }
  }
}

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
