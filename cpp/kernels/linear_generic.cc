// The linear kernel in portable C++ at 8 lanes (see
// linear_impl.h); the fallback on any CPU.
#include "kernels/linear_vec_generic.h"

#define PC_LINEAR_NAMESPACE linear_generic8
#define PC_LINEAR_VEC ::pagedcore::kernels::linear_portable::LinearVecGeneric<8, false>
#include "kernels/linear_impl.h"
