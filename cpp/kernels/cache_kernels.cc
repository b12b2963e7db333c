#include "kernels/cache_kernels.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>

#include "core/common.h"
#include "kernels/fp8.h"
#include "kernels/parallel.h"

namespace pagedcore {
namespace kernels {
namespace {

// Below this many bytes a kernel stays on the calling thread: waking a second one costs more.
constexpr int64_t kParallelBytes = 256 * 1024;

template <typename Src, typename Dst>
inline void convert_row(const Src* src, Dst* dst, int64_t n);

template <>
inline void convert_row<float, float>(const float* src, float* dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
template <>
inline void convert_row<uint16_t, uint16_t>(const uint16_t* src, uint16_t* dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(uint16_t));
}
template <>
inline void convert_row<float, uint16_t>(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}
template <>
inline void convert_row<uint16_t, float>(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

// fp32 or bf16 rows into an fp8 cache (fp8.h: nearest, ties to even, saturated).
inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return bf16_to_float(x); }
template <bool kE4M3, typename Src>
inline void convert_row_fp8(const Src* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_fp8<kE4M3>(widen(src[i]));
}

// kFp8: 0 = Dst is the cache's own type, 1 = e4m3, 2 = e5m2 (Dst uint8_t).
template <typename Src, typename Dst, int kFp8 = 0>
inline void write_row(const Src* src, Dst* dst, int64_t n) {
  if constexpr (kFp8 == 0) convert_row(src, dst, n);
  else convert_row_fp8<kFp8 == 1>(src, dst, n);
}

template <typename Src, typename Dst, int kFp8 = 0>
void reshape_and_cache_typed(const ReshapeAndCacheParams& p) {
  const int64_t row_bytes = p.num_kv_heads * p.head_size * static_cast<int64_t>(sizeof(Dst)) * 2;
  const int64_t block_stride = p.kv_block_stride > 0 ? p.kv_block_stride : p.num_kv_heads * p.block_size * p.head_size;
  auto write_tokens = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = p.slot_mapping[t];
      if (slot == kPadSlot) continue;
      const int64_t block = slot / p.block_size;
      const int64_t offset = slot % p.block_size;
      for (int64_t h = 0; h < p.num_kv_heads; ++h) {
        // element (block, h, offset, 0) of [num_blocks, num_kv_heads, block_size, head_size]
        const int64_t dst = block * block_stride + (h * p.block_size + offset) * p.head_size;
        write_row<Src, Dst, kFp8>(static_cast<const Src*>(p.key) + t * p.key_stride_token + h * p.key_stride_head,
                                  static_cast<Dst*>(p.key_cache) + dst, p.head_size);
        write_row<Src, Dst, kFp8>(
            static_cast<const Src*>(p.value) + t * p.value_stride_token + h * p.value_stride_head,
            static_cast<Dst*>(p.value_cache) + dst, p.head_size);
      }
    }
  };
  if (p.num_tokens * row_bytes < kParallelBytes) {
    write_tokens(0, p.num_tokens);
    return;
  }
  const int64_t chunk = std::max<int64_t>(1, kParallelBytes / 4 / row_bytes);
  const int num_chunks = static_cast<int>((p.num_tokens + chunk - 1) / chunk);
  parallel_for(num_chunks, [&](int c, int) {
    write_tokens(c * chunk, std::min<int64_t>(p.num_tokens, (c + 1) * chunk));
  });
}

}  // namespace

Status reshape_and_cache(const ReshapeAndCacheParams& p) {
  if (p.num_tokens < 0 || p.num_kv_heads <= 0 || p.head_size <= 0 || p.num_blocks < 0 || p.block_size <= 0)
    return Status::invalid("reshape_and_cache: sizes must be positive (num_kv_heads, head_size, block_size)");
  if (!valid_dtype(static_cast<int32_t>(p.src_dtype)) || !valid_cache_dtype(static_cast<int32_t>(p.cache_dtype)))
    return Status::invalid("reshape_and_cache: unknown source or cache dtype");
  if (p.kv_block_stride != 0 && p.kv_block_stride < p.num_kv_heads * p.block_size * p.head_size)
    return Status::invalid("reshape_and_cache: kv_block_stride " + std::to_string(p.kv_block_stride) +
                           " is shorter than a block (num_kv_heads * block_size * head_size); pass 0 for a "
                           "contiguous layer cache");
  const int64_t num_slots = p.num_blocks * p.block_size;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot != kPadSlot && (slot < 0 || slot >= num_slots)) {
      return Status::out_of_range("reshape_and_cache: slot_mapping[" + std::to_string(t) + "] = " +
                                  std::to_string(slot) + " is outside [0, num_blocks * block_size = " +
                                  std::to_string(num_slots) + "); use -1 for padding tokens");
    }
  }
  if (p.num_tokens == 0) return Status::ok();
  const bool src_bf16 = p.src_dtype == DType::kBFloat16;
  switch (p.cache_dtype) {
    case DType::kFloat32:
      if (src_bf16) reshape_and_cache_typed<uint16_t, float>(p);
      else reshape_and_cache_typed<float, float>(p);
      break;
    case DType::kBFloat16:
      if (src_bf16) reshape_and_cache_typed<uint16_t, uint16_t>(p);
      else reshape_and_cache_typed<float, uint16_t>(p);
      break;
    case DType::kFloat8E4M3:
      if (src_bf16) reshape_and_cache_typed<uint16_t, uint8_t, 1>(p);
      else reshape_and_cache_typed<float, uint8_t, 1>(p);
      break;
    case DType::kFloat8E5M2:
      if (src_bf16) reshape_and_cache_typed<uint16_t, uint8_t, 2>(p);
      else reshape_and_cache_typed<float, uint8_t, 2>(p);
      break;
  }
  return Status::ok();
}

Status copy_blocks(const CopyBlocksParams& p) {
  if (p.num_pairs < 0 || p.num_planes <= 0 || p.block_bytes <= 0)
    return Status::invalid("copy_blocks: num_planes and block_bytes must be positive");
  if (p.src_plane_stride < 0 || p.src_block_stride < 0 || p.dst_plane_stride < 0 || p.dst_block_stride < 0)
    return Status::invalid("copy_blocks: negative stride");
  const int64_t src_plane_stride = p.src_plane_stride ? p.src_plane_stride : p.src_num_blocks * p.block_bytes;
  const int64_t src_block_stride = p.src_block_stride ? p.src_block_stride : p.block_bytes;
  const int64_t dst_plane_stride = p.dst_plane_stride ? p.dst_plane_stride : p.dst_num_blocks * p.block_bytes;
  const int64_t dst_block_stride = p.dst_block_stride ? p.dst_block_stride : p.block_bytes;
  for (int64_t i = 0; i < p.num_pairs; ++i) {
    const int32_t src = p.block_mapping[2 * i], dst = p.block_mapping[2 * i + 1];
    if (src < 0 || src >= p.src_num_blocks || dst < 0 || dst >= p.dst_num_blocks) {
      return Status::out_of_range("copy_blocks: block_mapping row " + std::to_string(i) + " = (" +
                                  std::to_string(src) + ", " + std::to_string(dst) +
                                  ") is outside [0, " + std::to_string(p.src_num_blocks) + ") x [0, " +
                                  std::to_string(p.dst_num_blocks) + ")");
    }
  }
  const char* src_base = static_cast<const char*>(p.src);
  char* dst_base = static_cast<char*>(p.dst);
  auto copy_pair_plane = [&](int64_t pair, int64_t plane) {
    const int64_t src = p.block_mapping[2 * pair], dst = p.block_mapping[2 * pair + 1];
    if (src_base == dst_base && src == dst) return;
    std::memcpy(dst_base + plane * dst_plane_stride + dst * dst_block_stride,
                src_base + plane * src_plane_stride + src * src_block_stride, p.block_bytes);
  };
  // In one cache, two pairs touching the same block (one writes what another reads or writes)
  // must run in row order; otherwise the pairs are independent and run in parallel.
  bool ordered = false;
  if (src_base == dst_base && p.num_pairs > 1) {
    std::unordered_set<int32_t> sources, destinations;
    for (int64_t i = 0; i < p.num_pairs; ++i) {
      const int32_t src = p.block_mapping[2 * i], dst = p.block_mapping[2 * i + 1];
      if (src != dst) sources.insert(src);
    }
    for (int64_t i = 0; i < p.num_pairs && !ordered; ++i) {
      const int32_t src = p.block_mapping[2 * i], dst = p.block_mapping[2 * i + 1];
      if (src == dst) continue;
      ordered = sources.count(dst) > 0 || !destinations.insert(dst).second;
    }
  }
  const int64_t total = p.num_pairs * p.num_planes;
  if (ordered || total * p.block_bytes < kParallelBytes) {
    for (int64_t i = 0; i < p.num_pairs; ++i)
      for (int64_t plane = 0; plane < p.num_planes; ++plane) copy_pair_plane(i, plane);
    return Status::ok();
  }
  parallel_for(static_cast<int>(total), [&](int task, int) {
    copy_pair_plane(task / p.num_planes, task % p.num_planes);
  });
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
