// The AVX-512 sums: 16 lanes, a masked tail; bf16 widened to fp32, summed, rounded once to nearest
// even with the same rule as kernels::float_to_bf16 (NaN stays a quiet NaN). Built with -mavx512f
// -mavx512bw; called only where kernels::isa_supported(kAvx512).
#include <immintrin.h>

#include "distributed/sum_kernels.h"

namespace pagedcore {
namespace distributed {
namespace {

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

inline __m512 load_bf16(const uint16_t* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m256i round_to_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x00400000));
  const __m512i chosen = _mm512_mask_blend_epi32(nan, rounded, quiet);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(chosen, 16));
}

}  // namespace

void sum_fp32_avx512(float* out, const float* const* inputs, int num_inputs, int64_t count) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m512 acc = _mm512_loadu_ps(inputs[0] + i);
    for (int k = 1; k < num_inputs; ++k) acc = _mm512_add_ps(acc, _mm512_loadu_ps(inputs[k] + i));
    _mm512_storeu_ps(out + i, acc);
  }
  if (i < count) {
    const __mmask16 m = tail_mask(count - i);
    __m512 acc = _mm512_maskz_loadu_ps(m, inputs[0] + i);
    for (int k = 1; k < num_inputs; ++k) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, inputs[k] + i));
    _mm512_mask_storeu_ps(out + i, m, acc);
  }
}

void sum_bf16_avx512(uint16_t* out, const uint16_t* const* inputs, int num_inputs, int64_t count) {
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 m = count - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(count - i);
    __m512 acc = load_bf16(inputs[0] + i, m);
    for (int k = 1; k < num_inputs; ++k) acc = _mm512_add_ps(acc, load_bf16(inputs[k] + i, m));
    _mm256_mask_storeu_epi16(out + i, m, round_to_bf16(acc));
  }
}

}  // namespace distributed
}  // namespace pagedcore
