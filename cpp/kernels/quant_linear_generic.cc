// The quantized linear kernels in portable C++ (quant_linear_impl.h), one 32-byte part per vector
// with vpmaddubsw's arithmetic: the AVX2 kernel's tiling on any CPU, and the fallback anywhere.
#define PC_ISA_NAMESPACE quant_generic
#define PC_QVEC QVecGeneric<1, /*kDpbusd=*/false>
#define PC_X16 X16Generic  // the repacked 16-row kernels (quant_x16_impl.h)
#include "kernels/quant_vec_generic.h"
#include "kernels/quant_linear_impl.h"
