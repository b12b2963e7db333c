// The quantized linear kernels for AVX512-VNNI (quant_linear_impl.h over quant_vec_avx512.h,
// vpdpbusd); compiled with -mavx512vnni (CMakeLists.txt).
#define PC_ISA_NAMESPACE quant_avx512_vnni
#define PC_QVEC QVecAvx512</*kVnni=*/true>
#define PC_X16 X16Avx512</*kVnni=*/true>  // the repacked 16-row kernels (quant_x16_impl.h)
#include "kernels/quant_vec_avx512.h"
#include "kernels/quant_linear_impl.h"
