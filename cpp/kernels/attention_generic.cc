// The attention kernel instantiated for one instruction set (see attention_impl.h, CMakeLists.txt
// for this file's compile flags).
#define PC_ISA_NAMESPACE attention_generic8
#define PC_VEC VecGeneric<8, false>
#include "kernels/vec_generic.h"
#include "kernels/attention_impl.h"
