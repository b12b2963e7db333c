// The elementwise sums of the shared-memory all-reduce: out[i] = in[0][i] + in[1][i] + ... in rank
// order (the same order for every element and every rank, so the result does not depend on which
// rank reduced which share). bf16 is summed in fp32 and rounded once (round to nearest even).
// A portable unit (auto-vectorised for the baseline ISA) and an AVX-512 one, picked by
// kernels::active_isa() like the other CPU kernels.
#pragma once

#include <cstdint>

#include "kernels/cpu_isa.h"
#include "kernels/kernel_types.h"

namespace pagedcore {
namespace distributed {

// out: [count]; inputs: num_inputs pointers to [count] each (out may equal inputs[0]).
void sum_fp32_generic(float* out, const float* const* inputs, int num_inputs, int64_t count);
void sum_bf16_generic(uint16_t* out, const uint16_t* const* inputs, int num_inputs, int64_t count);
void sum_fp32_avx512(float* out, const float* const* inputs, int num_inputs, int64_t count);
void sum_bf16_avx512(uint16_t* out, const uint16_t* const* inputs, int num_inputs, int64_t count);

// True when `isa` runs the AVX-512 unit (built and supported here).
bool sum_uses_avx512(kernels::Isa isa);

// Dispatch on dtype and ISA; element pointers as void.
void sum_elements(kernels::DType dtype, void* out, const void* const* inputs, int num_inputs, int64_t count,
                  kernels::Isa isa);

}  // namespace distributed
}  // namespace pagedcore
