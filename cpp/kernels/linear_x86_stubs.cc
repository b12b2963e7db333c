// Non-x86 builds: no AVX linear kernels; linear.cc never selects them there.
#include "kernels/linear_kernel.h"

namespace pagedcore {
namespace kernels {
namespace linear_avx2 {
const LinearIsaKernels& linear_kernels() { return linear_generic8::linear_kernels(); }
}  // namespace linear_avx2
namespace linear_avx512 {
const LinearIsaKernels& linear_kernels() { return linear_generic16::linear_kernels(); }
}  // namespace linear_avx512
namespace linear_avx512_bf16dot {
const LinearIsaKernels& linear_kernels() { return linear_generic16_bf16dot::linear_kernels(); }
}  // namespace linear_avx512_bf16dot
}  // namespace kernels
}  // namespace pagedcore
