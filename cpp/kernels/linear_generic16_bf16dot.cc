// The linear kernel in portable C++ at 16 lanes with the AVX512-BF16 pair dot products emulated
// (Isa::kGeneric16Bf16; see linear_impl.h): the AVX512-BF16 kernel's tiling on any CPU, so tests cover it.
#define PC_ISA_NAMESPACE linear_generic16_bf16dot
#define PC_VEC VecGeneric<16, /*kEmulateDotBf16=*/true>
#include "kernels/vec_generic.h"
#include "kernels/linear_impl.h"
