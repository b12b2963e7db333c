// The portable sums (and the dispatch). -ffp-contract is irrelevant here: only adds.
#include "distributed/sum_kernels.h"

namespace pagedcore {
namespace distributed {

void sum_fp32_generic(float* out, const float* const* inputs, int num_inputs, int64_t count) {
  constexpr int64_t kTile = 256;  // a tile of the accumulator stays in registers / L1 across inputs
  for (int64_t begin = 0; begin < count; begin += kTile) {
    const int64_t n = count - begin < kTile ? count - begin : kTile;
    float acc[kTile];
    const float* first = inputs[0] + begin;
    for (int64_t i = 0; i < n; ++i) acc[i] = first[i];
    for (int k = 1; k < num_inputs; ++k) {
      const float* in = inputs[k] + begin;
      for (int64_t i = 0; i < n; ++i) acc[i] += in[i];
    }
    for (int64_t i = 0; i < n; ++i) out[begin + i] = acc[i];
  }
}

void sum_bf16_generic(uint16_t* out, const uint16_t* const* inputs, int num_inputs, int64_t count) {
  constexpr int64_t kTile = 256;
  for (int64_t begin = 0; begin < count; begin += kTile) {
    const int64_t n = count - begin < kTile ? count - begin : kTile;
    float acc[kTile];
    for (int64_t i = 0; i < n; ++i) acc[i] = kernels::bf16_to_float(inputs[0][begin + i]);
    for (int k = 1; k < num_inputs; ++k) {
      const uint16_t* in = inputs[k] + begin;
      for (int64_t i = 0; i < n; ++i) acc[i] += kernels::bf16_to_float(in[i]);
    }
    for (int64_t i = 0; i < n; ++i) out[begin + i] = kernels::float_to_bf16(acc[i]);
  }
}

bool sum_uses_avx512(kernels::Isa isa) {
#if defined(PAGEDCORE_DISTRIBUTED_X86)
  const bool avx512 = isa == kernels::Isa::kAvx512 || isa == kernels::Isa::kAvx512Bf16 ||
                      isa == kernels::Isa::kAvx512Vnni;
  return avx512 && kernels::isa_supported(kernels::Isa::kAvx512);
#else
  return false;
#endif
}

void sum_elements(kernels::DType dtype, void* out, const void* const* inputs, int num_inputs, int64_t count,
                  kernels::Isa isa) {
  const bool avx512 = sum_uses_avx512(isa);
  if (dtype == kernels::DType::kFloat32) {
    auto fn = avx512 ? sum_fp32_avx512 : sum_fp32_generic;
    fn(static_cast<float*>(out), reinterpret_cast<const float* const*>(inputs), num_inputs, count);
  } else {
    auto fn = avx512 ? sum_bf16_avx512 : sum_bf16_generic;
    fn(static_cast<uint16_t*>(out), reinterpret_cast<const uint16_t* const*>(inputs), num_inputs, count);
  }
}

#if !defined(PAGEDCORE_DISTRIBUTED_X86)
// Other CPUs: the AVX-512 entries are never chosen (sum_uses_avx512 is false); they forward.
void sum_fp32_avx512(float* out, const float* const* inputs, int num_inputs, int64_t count) {
  sum_fp32_generic(out, inputs, num_inputs, count);
}
void sum_bf16_avx512(uint16_t* out, const uint16_t* const* inputs, int num_inputs, int64_t count) {
  sum_bf16_generic(out, inputs, num_inputs, count);
}
#endif

}  // namespace distributed
}  // namespace pagedcore
