// Non-x86 builds: no AVX kernels; isa_supported() says false for them, so they are never picked.
#include "kernels/attention_kernel.h"

namespace pagedcore {
namespace kernels {
namespace attention_avx2 {
AttentionItemFn attention_item_fn(int64_t) { return nullptr; }
}  // namespace attention_avx2
namespace attention_avx512 {
AttentionItemFn attention_item_fn(int64_t) { return nullptr; }
}  // namespace attention_avx512
namespace attention_avx512_bf16dot {
AttentionItemFn attention_item_fn(int64_t) { return nullptr; }
}  // namespace attention_avx512_bf16dot
}  // namespace kernels
}  // namespace pagedcore
