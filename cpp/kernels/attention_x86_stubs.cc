// Non-x86 builds: no AVX kernels; cpu_isa.cc never selects them there.
#include "kernels/attention_kernel.h"

namespace pagedcore {
namespace kernels {
namespace avx2 {
AttentionItemFn attention_item_fn(int64_t) { return nullptr; }
}  // namespace avx2
namespace avx512 {
AttentionItemFn attention_item_fn(int64_t) { return nullptr; }
}  // namespace avx512
}  // namespace kernels
}  // namespace pagedcore
