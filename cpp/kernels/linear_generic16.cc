// The linear kernel in portable C++ at 16 lanes (see
// linear_impl.h); it runs the AVX-512 kernel's tiling on any CPU, so tests cover it.
#include "kernels/linear_vec_generic.h"

#define PC_LINEAR_NAMESPACE linear_generic16
#define PC_LINEAR_VEC ::pagedcore::kernels::linear_portable::LinearVecGeneric<16, false>
#include "kernels/linear_impl.h"
