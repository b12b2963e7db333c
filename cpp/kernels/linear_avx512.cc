// The linear kernel for AVX-512 F/BW/VL/DQ: 16 fp32 lanes, 32 registers. Compiled with its own
// flags (CMakeLists.txt).
#define PC_ISA_NAMESPACE linear_avx512
#define PC_VEC VecAvx512
#include "kernels/vec_avx512.h"
#include "kernels/linear_impl.h"
