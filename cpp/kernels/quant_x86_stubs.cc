// Non-x86 builds: no AVX quantized kernels; the portable ones stand in (isa_supported() is false
// for the AVX ISAs there, so these are never selected).
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace kernels {
namespace quant_avx2 {
const QuantIsaKernels& quant_kernels() { return quant_generic::quant_kernels(); }
}  // namespace quant_avx2
namespace quant_avx512 {
const QuantIsaKernels& quant_kernels() { return quant_generic16::quant_kernels(); }
}  // namespace quant_avx512
namespace quant_avx512_vnni {
const QuantIsaKernels& quant_kernels() { return quant_generic16::quant_kernels(); }
}  // namespace quant_avx512_vnni
}  // namespace kernels
}  // namespace pagedcore
