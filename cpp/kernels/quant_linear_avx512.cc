// The quantized linear kernels for AVX-512BW (quant_linear_impl.h over quant_vec_avx512.h,
// vpmaddubsw); compiled with its own flags (CMakeLists.txt).
#define PC_ISA_NAMESPACE quant_avx512
#define PC_QVEC QVecAvx512</*kVnni=*/false>
#define PC_X16 X16Avx512</*kVnni=*/false>  // the repacked 16-row kernels (quant_x16_impl.h)
#include "kernels/quant_vec_avx512.h"
#include "kernels/quant_linear_impl.h"
