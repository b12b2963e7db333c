// The attention kernel instantiated for one instruction set (see attention_impl.h, CMakeLists.txt
// for this file's compile flags).
#include "kernels/simd_avx512.h"

#define PC_ISA_NAMESPACE avx512
#define PC_VEC ::pagedcore::kernels::VecAvx512
#include "kernels/attention_impl.h"
