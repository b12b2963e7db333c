// The attention kernel instantiated for one instruction set (see attention_impl.h, CMakeLists.txt
// for this file's compile flags).
#include "kernels/simd_generic.h"

#define PC_ISA_NAMESPACE generic8
#define PC_VEC ::pagedcore::kernels::GenericVec<8>
#include "kernels/attention_impl.h"
