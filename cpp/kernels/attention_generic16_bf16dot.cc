// The attention kernel in portable C++ at 16 lanes with AVX512-BF16's pair dot products emulated
// (Isa::kGeneric16Bf16): the AVX512-BF16 kernel's tiles and pair order on any CPU, so tests cover them.
#define PC_ISA_NAMESPACE attention_generic16_bf16dot
#define PC_VEC VecGeneric<16, /*kEmulateDotBf16=*/true>
#include "kernels/vec_generic.h"
#include "kernels/attention_impl.h"
