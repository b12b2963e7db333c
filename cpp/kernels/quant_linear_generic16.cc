// The quantized linear kernels in portable C++ (quant_linear_impl.h), two 32-byte parts per vector
// with vpdpbusd's arithmetic: the AVX512-VNNI kernel's tiling, tested on any CPU.
#define PC_ISA_NAMESPACE quant_generic16
#define PC_QVEC QVecGeneric<2, /*kDpbusd=*/true>
#define PC_X16 X16Generic  // the repacked 16-row kernels (quant_x16_impl.h)
#include "kernels/quant_vec_generic.h"
#include "kernels/quant_linear_impl.h"
