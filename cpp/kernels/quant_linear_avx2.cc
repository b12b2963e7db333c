// The quantized linear kernels for AVX2 (quant_linear_impl.h over quant_vec_avx2.h); compiled with
// its own flags (CMakeLists.txt).
#define PC_ISA_NAMESPACE quant_avx2
#define PC_QVEC QVecAvx2
#define PC_X16 X16Avx2  // the repacked 16-row kernels (quant_x16_impl.h)
#include "kernels/quant_vec_avx2.h"
#include "kernels/quant_linear_impl.h"
