// The attention kernel instantiated for one instruction set (see attention_impl.h, CMakeLists.txt
// for this file's compile flags).
#define PC_ISA_NAMESPACE attention_avx2
#define PC_VEC VecAvx2
#include "kernels/vec_avx2.h"
#include "kernels/attention_impl.h"
