// The linear kernel for AVX-512 F/BW/VL/DQ: 16 fp32 lanes,
// 32 registers. Compiled with its own flags (CMakeLists.txt); the trait is included into this
// file's ISA namespace, so nothing compiled with these flags is shared with other units.
#include <immintrin.h>

#include <cstdint>

namespace pagedcore {
namespace kernels {
namespace linear_avx512 {
#define PC_LINEAR_AVX512_DOT 0
#include "kernels/linear_vec_avx512.inc"
#undef PC_LINEAR_AVX512_DOT
}  // namespace linear_avx512
}  // namespace kernels
}  // namespace pagedcore

#define PC_LINEAR_NAMESPACE linear_avx512
#define PC_LINEAR_VEC ::pagedcore::kernels::linear_avx512::Vec
#include "kernels/linear_impl.h"
