// The linear kernel in portable C++ at 16 lanes (see linear_impl.h); it runs the AVX-512 kernel's
// tiling on any CPU, so tests cover it.
#define PC_ISA_NAMESPACE linear_generic16
#define PC_VEC VecGeneric<16, /*kEmulateDotBf16=*/false>
#include "kernels/vec_generic.h"
#include "kernels/linear_impl.h"
