// The linear kernel in portable C++ at 16 lanes, with the AVX512-BF16 pair dot products emulated (see
// linear_impl.h); it runs the AVX-512 kernel's tiling on any CPU, so tests cover it.
#include "kernels/linear_vec_generic.h"

#define PC_LINEAR_NAMESPACE linear_generic16_bf16dot
#define PC_LINEAR_VEC ::pagedcore::kernels::linear_portable::LinearVecGeneric<16, true>
#include "kernels/linear_impl.h"
