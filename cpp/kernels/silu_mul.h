// The SwiGLU of a gate/up output already in memory: out[t, n] = silu(gate[t, n]) * up[t, n].
//
// The linear kernel fuses this into its epilogue (LinearEpilogue::kSiluMul) when nothing comes
// between the gate/up product and the activation. A LoRA step adds the adapter terms to the
// gate/up output first, so the activation runs on its own; this op runs the very epilogue code of
// the chosen ISA's linear table on the stored values, so its bits are the fused epilogue's when
// nothing was added (bf16: the stored g and u are the fused path's rounded g and u). The C++
// decoder stack and the Python layer loop's LoRA branch both call it: one rounding for both.
#pragma once

#include <cstdint>

#include "kernels/cpu_isa.h"
#include "kernels/kernel_types.h"

namespace pagedcore {
namespace kernels {

struct SiluMulParams {
  const void* gate_up = nullptr;  // [rows, 2 * cols] rows in_stride apart, dtype: gate columns, then up
  void* out = nullptr;            // [rows, cols] rows out_stride apart, dtype; may not overlap gate_up
  int64_t rows = 0;
  int64_t cols = 0;               // intermediate size (half a gate_up row)
  int64_t in_stride = 0;          // >= 2 * cols
  int64_t out_stride = 0;         // >= cols
  DType dtype = DType::kFloat32;
};

// Checks the sizes (nothing written on an error), then runs linear_isa_kernels(isa)'s epilogue.
Status silu_mul(const SiluMulParams& p, Isa isa);

}  // namespace kernels
}  // namespace pagedcore
