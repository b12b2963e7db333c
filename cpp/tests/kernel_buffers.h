// Test buffers shared by the kernel tests (test_linear.cc, test_norm.cc): a tensor held as float values
// exactly representable in its dtype plus its bytes, and the ISAs to run.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/kernel_types.h"

namespace pagedcore_test {

using pagedcore::kernels::bf16_to_float;
using pagedcore::kernels::DType;
using pagedcore::kernels::float_to_bf16;
using pagedcore::kernels::Isa;
using pagedcore::kernels::kNumIsas;

// Every ISA, the named-but-unbuilt ones too (they must be refused).
inline std::vector<Isa> all_isas() {
  std::vector<Isa> isas;
  for (int code = 0; code < kNumIsas; ++code) isas.push_back(static_cast<Isa>(code));
  return isas;
}

// A tensor held as float values that are exactly representable in its dtype, plus its bytes.
struct Buf {
  DType dtype;
  std::vector<float> values;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  const void* data() const { return dtype == DType::kFloat32 ? static_cast<const void*>(f32.data()) : bf16.data(); }
  void* mut() { return dtype == DType::kFloat32 ? static_cast<void*>(f32.data()) : bf16.data(); }
  float at(size_t i) const { return dtype == DType::kFloat32 ? f32[i] : bf16_to_float(bf16[i]); }
};

inline Buf make(DType dtype, size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> normal(0.f, scale);
  Buf b{dtype, {}, {}, {}};
  for (size_t i = 0; i < n; ++i) {
    float v = normal(rng);
    if (dtype == DType::kBFloat16) v = bf16_to_float(float_to_bf16(v));
    b.values.push_back(v);
  }
  if (dtype == DType::kFloat32) b.f32 = b.values;
  else
    for (float v : b.values) b.bf16.push_back(float_to_bf16(v));
  return b;
}

inline Buf zeros(DType dtype, size_t n, float fill) {
  Buf b{dtype, std::vector<float>(n, fill), {}, {}};
  if (dtype == DType::kFloat32) b.f32.assign(n, fill);
  else b.bf16.assign(n, float_to_bf16(fill));
  return b;
}

inline float round_bf16(float v) { return bf16_to_float(float_to_bf16(v)); }

// The ISAs this CPU runs.
inline std::vector<Isa> supported_isas() {
  std::vector<Isa> isas;
  for (Isa isa : all_isas())
    if (pagedcore::kernels::isa_supported(isa)) isas.push_back(isa);
  return isas;
}

// bf16x16's layout [N/16][K/2][16][2] of W [N, K] (K even): packed[g][p][c][j] = W[16 g + c][2 p + j].
template <typename T>
std::vector<T> pack_pairs_x16(const std::vector<T>& w, int64_t N, int64_t K) {
  std::vector<T> packed(w.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) packed[(n / 16) * K * 16 + (k / 2) * 32 + (n % 16) * 2 + k % 2] = w[n * K + k];
  return packed;
}

// W [N, K] -> the x16 layout [N/16][K][16] of any element type (f32x16, f16x16 and fp8_e4m3x16 alike).
template <typename T>
std::vector<T> pack_x16(const std::vector<T>& w, int64_t N, int64_t K) {
  std::vector<T> packed(w.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) packed[(n / 16) * K * 16 + k * 16 + n % 16] = w[n * K + k];
  return packed;
}

}  // namespace pagedcore_test
