// The paged-attention kernels instantiated for __nv_bfloat16 caches (one file per cache dtype: parallel compiles).
#include "paged_attention_decode.cuh"
#include "paged_attention_prefill.cuh"

namespace pagedcore {
namespace cuda {
namespace attention {

cudaError_t launch_decode_bf16(const AttentionArgs& args, int head_size, int max_group, cudaStream_t stream) {
  return launch_decode_any<__nv_bfloat16>(args, head_size, max_group, stream);
}

cudaError_t launch_prefill_bf16(const AttentionArgs& args, int head_size, bool tensor_cores, cudaStream_t stream) {
  return launch_prefill_any<__nv_bfloat16>(args, head_size, tensor_cores, stream);
}

}  // namespace attention
}  // namespace cuda
}  // namespace pagedcore
