// The attention kernel instantiated for one instruction set (see attention_impl.h, CMakeLists.txt
// for this file's compile flags).
#include "kernels/simd_avx2.h"

#define PC_ISA_NAMESPACE avx2
#define PC_VEC ::pagedcore::kernels::VecAvx2
#include "kernels/attention_impl.h"
