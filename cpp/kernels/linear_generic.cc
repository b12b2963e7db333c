// The linear kernel in portable C++ at 8 lanes (see linear_impl.h); the fallback on any CPU.
#define PC_ISA_NAMESPACE linear_generic8
#define PC_VEC VecGeneric<8, /*kEmulateDotBf16=*/false>
#include "kernels/vec_generic.h"
#include "kernels/linear_impl.h"
