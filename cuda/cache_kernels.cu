// reshape_and_cache, copy_blocks and swap_blocks on the GPU (see cache_kernels_cuda.h).
#include <climits>
#include <string>
#include <unordered_set>

#include "cache_kernels_cuda.h"
#include "device_common.cuh"

namespace pagedcore {
namespace cuda {
namespace {

constexpr int kCacheThreads = 128;
constexpr int kCopyThreads = 256;

// One CTA per token: its num_kv_heads * head_size elements of K and of V, converted to the cache dtype.
template <typename src_t, typename cache_t>
__global__ void __launch_bounds__(kCacheThreads) reshape_and_cache_kernel(const ReshapeAndCacheParams p) {
  const int64_t token = blockIdx.x;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0 || slot >= p.num_blocks * p.block_size) return;  // kPadSlot, or not a slot of this cache
  const int64_t block = slot / p.block_size;
  const int64_t offset = slot % p.block_size;
  const src_t* key = static_cast<const src_t*>(p.key) + token * p.key_stride_token;
  const src_t* value = static_cast<const src_t*>(p.value) + token * p.value_stride_token;
  // element (block, head, offset, d) = ((block * num_kv_heads + head) * block_size + offset) * head_size + d
  const int64_t row = (block * p.num_kv_heads * p.block_size + offset) * p.head_size;
  cache_t* key_cache = static_cast<cache_t*>(p.key_cache) + row;
  cache_t* value_cache = static_cast<cache_t*>(p.value_cache) + row;
  const int head_size = static_cast<int>(p.head_size);
  const int n = static_cast<int>(p.num_kv_heads) * head_size;
  const int64_t head_stride = p.block_size * p.head_size;
  for (int i = threadIdx.x; i < n; i += kCacheThreads) {
    const int head = i / head_size;
    const int d = i % head_size;
    key_cache[head * head_stride + d] = convert<cache_t>(key[head * p.key_stride_head + d]);
    value_cache[head * head_stride + d] = convert<cache_t>(value[head * p.value_stride_head + d]);
  }
}

template <typename src_t, typename cache_t>
cudaError_t launch_reshape_and_cache(const ReshapeAndCacheParams& p) {
  auto kernel = &reshape_and_cache_kernel<src_t, cache_t>;
  PC_LAUNCH(kernel, dim3(static_cast<unsigned>(p.num_tokens)), dim3(kCacheThreads), 0, p.stream, p);
  return last_launch_error();
}

template <typename src_t>
cudaError_t launch_reshape_and_cache_from(const ReshapeAndCacheParams& p) {
  switch (p.cache_dtype) {
    case DType::kBFloat16: return launch_reshape_and_cache<src_t, __nv_bfloat16>(p);
    case DType::kFloat16: return launch_reshape_and_cache<src_t, __half>(p);
    default: return launch_reshape_and_cache<src_t, float>(p);
  }
}

// The pairs [first_pair, first_pair + gridDim.x) of one launch; blockIdx.y is the plane.
struct CopyLaunch {
  const char* src;
  char* dst;
  const int32_t* block_mapping;  // [num_pairs, 2], device memory
  int64_t first_pair;
  int64_t src_num_blocks;
  int64_t dst_num_blocks;
  int64_t block_bytes;
  bool vectorized;               // 16-byte copies: block_bytes and both bases are multiples of 16
};

__global__ void __launch_bounds__(kCopyThreads) copy_blocks_kernel(const CopyLaunch c) {
  const int64_t pair = c.first_pair + blockIdx.x;
  const int64_t plane = blockIdx.y;
  const int64_t src_block = c.block_mapping[2 * pair];
  const int64_t dst_block = c.block_mapping[2 * pair + 1];
  if (src_block < 0 || src_block >= c.src_num_blocks || dst_block < 0 || dst_block >= c.dst_num_blocks) return;
  const char* src = c.src + (plane * c.src_num_blocks + src_block) * c.block_bytes;
  char* dst = c.dst + (plane * c.dst_num_blocks + dst_block) * c.block_bytes;
  if (c.vectorized) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (int64_t i = threadIdx.x; i < c.block_bytes / 16; i += kCopyThreads) d[i] = s[i];
  } else {
    for (int64_t i = threadIdx.x; i < c.block_bytes; i += kCopyThreads) dst[i] = src[i];
  }
}

#ifdef PAGEDCORE_CUDA_EMULATION
int max_pitch() { return INT_MAX; }
cudaError_t memcpy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                      cudaStream_t) {
  for (size_t r = 0; r < height; ++r) {
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  }
  return cudaSuccess;
}
#else
int max_pitch() {
  int device = 0, pitch = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;  // then every plane is copied on its own
  }
  return pitch;
}
cudaError_t memcpy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                      cudaStream_t stream) {
  return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, stream);
}
#endif

}  // namespace

std::string check_reshape_and_cache(const ReshapeAndCacheParams& p) {
  if (p.num_tokens < 0 || p.num_tokens > INT_MAX) return "num_tokens must be in [0, 2^31)";
  if (p.num_kv_heads <= 0 || p.head_size <= 0 || p.num_kv_heads * p.head_size > INT_MAX) {
    return "num_kv_heads and head_size must be positive";
  }
  if (p.block_size <= 0 || p.num_blocks < 0) return "block_size must be positive and num_blocks >= 0";
  if (p.num_tokens > 0 && (!p.key || !p.value || !p.key_cache || !p.value_cache || !p.slot_mapping)) {
    return "a null data pointer";
  }
  return std::string();
}

cudaError_t reshape_and_cache(const ReshapeAndCacheParams& p) {
  if (!check_reshape_and_cache(p).empty()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  switch (p.src_dtype) {
    case DType::kBFloat16: return launch_reshape_and_cache_from<__nv_bfloat16>(p);
    case DType::kFloat16: return launch_reshape_and_cache_from<__half>(p);
    default: return launch_reshape_and_cache_from<float>(p);
  }
}

std::string check_block_mapping(const int32_t* host_rows, int64_t num_pairs, int64_t src_num_blocks,
                                int64_t dst_num_blocks) {
  for (int64_t i = 0; i < num_pairs; ++i) {
    const int64_t src = host_rows[2 * i], dst = host_rows[2 * i + 1];
    if (src < 0 || src >= src_num_blocks || dst < 0 || dst >= dst_num_blocks) {
      return "block_mapping row " + std::to_string(i) + " is (" + std::to_string(src) + ", " + std::to_string(dst) +
             "); ids must lie in [0, " + std::to_string(src_num_blocks) + ") and [0, " +
             std::to_string(dst_num_blocks) + ")";
    }
  }
  return std::string();
}

cudaError_t copy_blocks(const CopyBlocksParams& p) {
  if (p.num_pairs < 0 || p.num_planes < 0 || p.num_planes > 65535 || p.block_bytes < 0) return cudaErrorInvalidValue;
  if (p.num_pairs == 0 || p.num_planes == 0 || p.block_bytes == 0) return cudaSuccess;
  if (!p.src || !p.dst || !p.block_mapping) return cudaErrorInvalidValue;
  CopyLaunch c;
  c.src = static_cast<const char*>(p.src);
  c.dst = static_cast<char*>(p.dst);
  c.block_mapping = p.block_mapping;
  c.src_num_blocks = p.src_num_blocks;
  c.dst_num_blocks = p.dst_num_blocks;
  c.block_bytes = p.block_bytes;
  c.vectorized = p.block_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.src) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(p.dst) % 16 == 0;
  auto kernel = &copy_blocks_kernel;
  auto launch = [&](int64_t first, int64_t count) {
    c.first_pair = first;
    const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>(p.num_planes));
    PC_LAUNCH(kernel, grid, dim3(kCopyThreads), 0, p.stream, c);
    return last_launch_error();
  };
  if (p.block_mapping_host == nullptr) return launch(0, p.num_pairs);
  // Waves of independent rows, in row order (a row depending on an earlier one of its wave starts the next).
  std::unordered_set<int32_t> read, written;
  int64_t wave_begin = 0;
  for (int64_t i = 0; i < p.num_pairs; ++i) {
    const int32_t src = p.block_mapping_host[2 * i], dst = p.block_mapping_host[2 * i + 1];
    if (written.count(src) || written.count(dst) || read.count(dst)) {
      const cudaError_t status = launch(wave_begin, i - wave_begin);
      if (status != cudaSuccess) return status;
      wave_begin = i;
      read.clear();
      written.clear();
    }
    read.insert(src);
    written.insert(dst);
  }
  return launch(wave_begin, p.num_pairs - wave_begin);
}

cudaError_t swap_blocks(const CopyBlocksParams& p) {
  if (p.num_pairs < 0 || p.num_planes < 0 || p.block_bytes < 0) return cudaErrorInvalidValue;
  if (p.num_pairs == 0 || p.num_planes == 0 || p.block_bytes == 0) return cudaSuccess;
  if (!p.src || !p.dst || !p.block_mapping) return cudaErrorInvalidValue;
  if (!check_block_mapping(p.block_mapping, p.num_pairs, p.src_num_blocks, p.dst_num_blocks).empty()) {
    return cudaErrorInvalidValue;
  }
  const int64_t src_pitch = p.src_num_blocks * p.block_bytes;  // bytes from one plane to the next
  const int64_t dst_pitch = p.dst_num_blocks * p.block_bytes;
  const int64_t pitch_limit = max_pitch();
  const bool strided = src_pitch <= pitch_limit && dst_pitch <= pitch_limit;
  const char* src = static_cast<const char*>(p.src);
  char* dst = static_cast<char*>(p.dst);
  for (int64_t i = 0; i < p.num_pairs;) {
    const int64_t src_block = p.block_mapping[2 * i], dst_block = p.block_mapping[2 * i + 1];
    int64_t run = 1;  // rows (s, d), (s + 1, d + 1), ... are one contiguous copy per plane
    while (i + run < p.num_pairs && p.block_mapping[2 * (i + run)] == src_block + run &&
           p.block_mapping[2 * (i + run) + 1] == dst_block + run) {
      ++run;
    }
    const size_t width = static_cast<size_t>(run * p.block_bytes);
    cudaError_t status = cudaSuccess;
    if (strided) {
      status = memcpy_2d(dst + dst_block * p.block_bytes, static_cast<size_t>(dst_pitch),
                         src + src_block * p.block_bytes, static_cast<size_t>(src_pitch), width,
                         static_cast<size_t>(p.num_planes), p.stream);
    } else {
      for (int64_t plane = 0; plane < p.num_planes && status == cudaSuccess; ++plane) {
        status = memcpy_2d(dst + plane * dst_pitch + dst_block * p.block_bytes, width,
                           src + plane * src_pitch + src_block * p.block_bytes, width, width, 1, p.stream);
      }
    }
    if (status != cudaSuccess) return status;
    i += run;
  }
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace pagedcore
