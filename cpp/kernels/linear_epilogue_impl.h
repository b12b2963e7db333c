// The linear kernel's epilogue (linear_kernel.h LinearEpilogueArgs): row scales, bias, SwiGLU and bf16 rounding
// of a task's raw fp32 sums, written against linear_impl.h's vector trait V, which includes this file
// inside each per-ISA translation unit (same namespace, same rules). load_any is shared with
// norm_impl.h, included after this file.
#ifndef PC_ISA_NAMESPACE
#error "linear_epilogue_impl.h is included by linear_impl.h"
#endif

#include <cstdint>
#include <cstring>

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

inline R load_any(const void* p, DType t, int64_t i) {
  if (t == DType::kFloat32) return V::load(static_cast<const float*>(p) + i);
  return V::load_bf16(static_cast<const uint16_t*>(p) + i);
}

// silu(g) = g / (1 + exp(-g)), as torch computes it.
inline R silu(R g) {
  const R one = V::set1(1.f);
  return V::div(g, V::add(one, V::exp(V::mul(g, V::set1(-1.f)))));
}

// One vector of outputs from W raw sums at g (and u).
inline R epilogue_vec(const LinearEpilogueArgs& e, const float* g, const float* u, int64_t c) {
  R gv = V::load(g);
  if (e.scale_g) gv = V::mul(gv, V::load(e.scale_g + c));  // (one rounding: the sum times its row's scale)
  if (e.bias_g) gv = V::add(gv, load_any(e.bias_g, e.bias_dtype, c));
  if (e.kind != LinearEpilogue::kSiluMul) return gv;
  R uv = V::load(u);
  if (e.scale_u) uv = V::mul(uv, V::load(e.scale_u + c));
  if (e.bias_u) uv = V::add(uv, load_any(e.bias_u, e.bias_dtype, c));
  if (e.out_dtype == DType::kBFloat16)  // torch, op by op in bf16: round g and u, round silu(g)
    return V::mul(V::round_bf16(silu(V::round_bf16(gv))), V::round_bf16(uv));
  return V::mul(silu(gv), uv);
}

void epilogue(const LinearEpilogueArgs& e) {
  for (int64_t r = 0; r < e.rows; ++r) {
    const float* g = e.g + r * e.sum_stride;
    const float* u = e.u ? e.u + r * e.sum_stride : nullptr;
    int64_t c = 0;
    for (; c + W <= e.cols; c += W) {
      const R y = epilogue_vec(e, g + c, u ? u + c : nullptr, c);
      if (e.out_dtype == DType::kFloat32) V::store(static_cast<float*>(e.out) + r * e.out_stride + c, y);
      else V::store_bf16(static_cast<uint16_t*>(e.out) + r * e.out_stride + c, y);
    }
    if (c < e.cols) {  // the last columns through the same vector code, via padded copies
      const int64_t n = e.cols - c;
      alignas(64) float gt[W] = {}, ut[W] = {}, bg[W] = {}, bu[W] = {}, sg[W] = {}, su[W] = {}, yt[W];
      alignas(64) uint16_t bg16[W] = {}, bu16[W] = {}, y16[W];
      std::memcpy(gt, g + c, n * sizeof(float));
      if (u) std::memcpy(ut, u + c, n * sizeof(float));
      LinearEpilogueArgs t = e;
      const int64_t bias_bytes = n * (e.bias_dtype == DType::kFloat32 ? 4 : 2);
      const char* bias_g = static_cast<const char*>(e.bias_g);
      const char* bias_u = static_cast<const char*>(e.bias_u);
      const int64_t offset = c * (e.bias_dtype == DType::kFloat32 ? 4 : 2);
      void* bgt = e.bias_dtype == DType::kFloat32 ? static_cast<void*>(bg) : static_cast<void*>(bg16);
      void* but = e.bias_dtype == DType::kFloat32 ? static_cast<void*>(bu) : static_cast<void*>(bu16);
      if (bias_g) std::memcpy(bgt, bias_g + offset, bias_bytes);
      if (bias_u) std::memcpy(but, bias_u + offset, bias_bytes);
      t.bias_g = bias_g ? bgt : nullptr;
      t.bias_u = bias_u ? but : nullptr;
      if (e.scale_g) std::memcpy(sg, e.scale_g + c, n * sizeof(float));
      if (e.scale_u) std::memcpy(su, e.scale_u + c, n * sizeof(float));
      t.scale_g = e.scale_g ? sg : nullptr;
      t.scale_u = e.scale_u ? su : nullptr;
      const R y = epilogue_vec(t, gt, ut, 0);
      if (e.out_dtype == DType::kFloat32) {
        V::store(yt, y);
        std::memcpy(static_cast<float*>(e.out) + r * e.out_stride + c, yt, n * sizeof(float));
      } else {
        V::store_bf16(y16, y);
        std::memcpy(static_cast<uint16_t*>(e.out) + r * e.out_stride + c, y16, n * sizeof(uint16_t));
      }
    }
  }
}

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
