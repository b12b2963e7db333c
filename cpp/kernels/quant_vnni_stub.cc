// Built when the compiler lacks -mavx512vnni: isa_supported(kAvx512Vnni) is false, so this table
// (the AVX-512BW kernels) is never selected; it only satisfies the link.
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace kernels {
namespace quant_avx512_vnni {
const QuantIsaKernels& quant_kernels() { return quant_avx512::quant_kernels(); }
}  // namespace quant_avx512_vnni
}  // namespace kernels
}  // namespace pagedcore
