// The attention kernel instantiated for one instruction set (see attention_impl.h, CMakeLists.txt
// for this file's compile flags).
#define PC_ISA_NAMESPACE attention_avx512
#define PC_VEC VecAvx512
#include "kernels/vec_avx512.h"
#include "kernels/attention_impl.h"
