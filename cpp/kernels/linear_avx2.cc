// The linear kernel for AVX2 + FMA (+ F16C): 8 fp32 lanes, 16 registers. Compiled with
// -mavx2 -mfma -mf16c (CMakeLists.txt).
#define PC_ISA_NAMESPACE linear_avx2
#define PC_VEC VecAvx2
#include "kernels/vec_avx2.h"
#include "kernels/linear_impl.h"
