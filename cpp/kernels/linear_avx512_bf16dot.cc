// The linear kernel for AVX-512 + AVX512-BF16 (Isa::kAvx512Bf16): vdpbf16ps for bf16 x and weights.
// Compiled with -mavx512bf16 when the compiler has it (CMakeLists.txt); without it the trait's
// kHasDotBf16 is false, this unit builds the plain AVX-512 kernel and isa_supported() says false.
#define PC_ISA_NAMESPACE linear_avx512_bf16dot
#define PC_VEC VecAvx512
#include "kernels/vec_avx512.h"
#include "kernels/linear_impl.h"
