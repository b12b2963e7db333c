// Prefill chunks (and any row the decode kernel leaves): a tile kernel. One CTA takes a tile of
// query rows (token x query head of one kv head, so GQA heads share every K/V tile), walks the K/V
// tiles of its sequence up to its last row's position, and keeps an fp32 online softmax per row.
//
// Two variants of one kernel:
//   tensor cores (bf16/fp16 caches): 4 warps, Q K^T and P V on wmma 16x16x16 fragments with fp32
//     accumulators; Q stays in registers as fragments, P is rounded to the cache dtype.
//   CUDA cores (any dtype; fp32 caches always): 2 warps, fp32 tiles in shared memory.
#pragma once

#include "device_common.cuh"
#include "paged_attention_args.h"

// bf16 wmma needs sm_80: device code built for older targets (-DCMAKE_CUDA_ARCHITECTURES=75) gets
// a tensor-core kernel that traps, and the host never launches it on such a GPU (make_plan).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define PAGEDCORE_WMMA 0
#else
#define PAGEDCORE_WMMA 1
#endif

namespace pagedcore {
namespace cuda {
namespace attention {

// Tile shapes and the shared-memory map (every region 128-byte aligned):
//
//   rows of a tile (kRows = 16 per warp): row r = (query token r / heads_per_cta,
//                                                  query head  first_head + r % heads_per_cta)
//   | K tile [kKeys][kLdKV] | V tile [kKeys][kLdKV] | Q [kRows][kLdKV] (CUDA cores; tensor cores stage
//   Q over K/V once) | key_valid [kKeys] | per warp: S [16][kLdS] fp32 | P [16][kLdP] | O [16][kLdO] fp32 |
//
// Leading dimensions are padded by 16 bytes against bank conflicts; wmma needs multiples of
// 8 elements (16-bit) or 4 (fp32) and 32-byte aligned tile starts, which the padding keeps.
template <typename cache_t, int kHeadSize, bool kTensorCores>
struct TileConfig {
  static constexpr int kWarps = prefill_rows_per_cta(kTensorCores) / 16;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * kWarps;
  static constexpr int kKeys = (kTensorCores && kHeadSize <= 128) ? 64 : 32;
  using smem_t = typename std::conditional<kTensorCores, cache_t, float>::type;
  static constexpr int kPad = 16 / static_cast<int>(sizeof(smem_t));
  static constexpr int kLdKV = kHeadSize + kPad;
  static constexpr int kLdP = kKeys + kPad;
  static constexpr int kLdS = ((kTensorCores && kHeadSize > kKeys) ? kHeadSize : kKeys) + 4;
  static constexpr int kLdO = kHeadSize + 4;
  static constexpr int kGlobalVec = kVec<cache_t>;
  static constexpr int kVecsPerRow = kHeadSize / kGlobalVec;

  static constexpr size_t align(size_t bytes) { return (bytes + 127) / 128 * 128; }
  static constexpr size_t kKVBytes = align(sizeof(smem_t) * kKeys * kLdKV);
  static constexpr size_t kQBytes = align(sizeof(smem_t) * kRows * kLdKV);
  static constexpr size_t kOffK = 0;
  static constexpr size_t kOffV = kKVBytes;
  static constexpr size_t kOffQ = kTensorCores ? 0 : 2 * kKVBytes;
  static constexpr size_t kQEnd = kTensorCores ? (kQBytes > 2 * kKVBytes ? kQBytes : 2 * kKVBytes) : 2 * kKVBytes + kQBytes;
  static constexpr size_t kOffValid = kQEnd;
  static constexpr size_t kOffS = kOffValid + align(sizeof(int) * kKeys);
  static constexpr size_t kSBytes = align(sizeof(float) * 16 * kLdS);
  static constexpr size_t kOffP = kOffS + kWarps * kSBytes;
  static constexpr size_t kPBytes = align(sizeof(smem_t) * 16 * kLdP);
  static constexpr size_t kOffO = kOffP + kWarps * kPBytes;
  static constexpr size_t kOBytes = align(sizeof(float) * 16 * kLdO);
  static constexpr size_t kSharedBytes = kOffO + kWarps * kOBytes;
  static_assert(!kTensorCores || kQBytes <= kOffValid, "Q staging must fit over the K/V tiles");
  static_assert(kSharedBytes <= 227 * 1024, "over the sm_90 shared-memory limit");
};

// Q as wmma fragments, loaded once (tensor cores); the CUDA-core variant reads Q from shared memory.
template <typename cache_t, int kHeadSize, bool kTensorCores>
struct QueryFragments {
  __device__ __forceinline__ void load(const cache_t*, int) {}
};
template <typename cache_t, int kHeadSize>
struct QueryFragments<cache_t, kHeadSize, true> {
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, cache_t, nvcuda::wmma::row_major> frag[kHeadSize / 16];
  __device__ __forceinline__ void load(const cache_t* rows, int ld) {
#pragma unroll
    for (int k = 0; k < kHeadSize / 16; ++k) nvcuda::wmma::load_matrix_sync(frag[k], rows + k * 16, ld);
  }
};

// S[16][kKeys] = Q[16][D] K^T for one warp's rows, into s_tile (ld kLdS), on tensor cores.
template <typename C, typename cache_t, int kHeadSize>
__device__ __forceinline__ void warp_scores_tc(const QueryFragments<cache_t, kHeadSize, true>& q,
                                               const cache_t* k_tile, float* s_tile) {
  using namespace nvcuda;
#pragma unroll
  for (int n = 0; n < C::kKeys / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int k = 0; k < kHeadSize / 16; ++k) {
      // K^T as a col-major KxN operand: element (d, key) at k_tile[key * kLdKV + d]
      wmma::fragment<wmma::matrix_b, 16, 16, 16, cache_t, wmma::col_major> k_frag;
      wmma::load_matrix_sync(k_frag, k_tile + n * 16 * C::kLdKV + k * 16, C::kLdKV);
      wmma::mma_sync(acc, q.frag[k], k_frag, acc);
    }
    wmma::store_matrix_sync(s_tile + n * 16, acc, C::kLdS, wmma::mem_row_major);
  }
}

// PV[16][D] = P[16][kKeys] V for one warp's rows, into s_tile (ld kLdS), on tensor cores.
template <typename C, typename cache_t, int kHeadSize>
__device__ __forceinline__ void warp_values_tc(const cache_t* p_tile, const cache_t* v_tile, float* s_tile) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, cache_t, wmma::row_major> p_frag[C::kKeys / 16];
#pragma unroll
  for (int k = 0; k < C::kKeys / 16; ++k) wmma::load_matrix_sync(p_frag[k], p_tile + k * 16, C::kLdP);
#pragma unroll
  for (int n = 0; n < kHeadSize / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int k = 0; k < C::kKeys / 16; ++k) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, cache_t, wmma::row_major> v_frag;
      wmma::load_matrix_sync(v_frag, v_tile + k * 16 * C::kLdKV + n * 16, C::kLdKV);
      wmma::mma_sync(acc, p_frag[k], v_frag, acc);
    }
    wmma::store_matrix_sync(s_tile + n * 16, acc, C::kLdS, wmma::mem_row_major);
  }
}

// S for one warp's rows on CUDA cores: lane (r = lane % 16, parity = lane / 16) computes keys
// parity, parity + 2, ... of row r.
template <typename C, int kHeadSize>
__device__ __forceinline__ void warp_scores_simt(const float* q_rows, const float* k_tile, float* s_tile, int lane) {
  const int r = lane % 16;
  const int parity = lane / 16;
  float acc[C::kKeys / 2];
#pragma unroll
  for (int i = 0; i < C::kKeys / 2; ++i) acc[i] = 0.f;
  const float* q_row = q_rows + r * C::kLdKV;
  for (int d = 0; d < kHeadSize; d += 4) {
    const float4 q4 = *reinterpret_cast<const float4*>(q_row + d);
#pragma unroll
    for (int i = 0; i < C::kKeys / 2; ++i) {
      const float4 k4 = *reinterpret_cast<const float4*>(k_tile + (parity + 2 * i) * C::kLdKV + d);
      acc[i] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
    }
  }
#pragma unroll
  for (int i = 0; i < C::kKeys / 2; ++i) s_tile[r * C::kLdS + parity + 2 * i] = acc[i];
}

// grid (num_tokens / tokens_per_cta + num_seqs, num_kv_heads * prefill_head_chunks),
// block TileConfig::kThreads, shared memory TileConfig::kSharedBytes.
//
// Tile t of sequence s runs in CTA x = query_start_loc[s] / tokens_per_cta + s + t: that start is
// strictly increasing in s and leaves each sequence at least ceil(q_len / tokens_per_cta) CTAs, so
// a CTA finds its sequence by binary search and CTAs past a sequence's last tile exit at once.
//
//   x:      0   1   2   3 | 4 | 5   6   7 |        (tokens_per_cta = 16)
//   seq:    0 (q_len 40)  | 1 | 2 (q_len 33, starts at token 41)
//           tiles 0 1 2,  3 spare | decode row | tiles 0 1 2
template <typename cache_t, int kHeadSize, bool kTensorCores>
__global__ void __launch_bounds__(TileConfig<cache_t, kHeadSize, kTensorCores>::kThreads, 1)
    paged_prefill_kernel(const AttentionArgs a) {
  using C = TileConfig<cache_t, kHeadSize, kTensorCores>;
  using smem_t = typename C::smem_t;
  constexpr bool kWmma = kTensorCores && PAGEDCORE_WMMA;
  if constexpr (kTensorCores && !kWmma) __trap();
  const int tokens_per_cta = a.prefill_tokens_per_cta;
  const int x = blockIdx.x;
  int lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.query_start_loc[mid] / tokens_per_cta + mid <= x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int seq = lo;
  const int q_start = a.query_start_loc[seq];
  const int q_end = a.query_start_loc[seq + 1];
  const int q_len = q_end - q_start;
  const int tile = x - (q_start / tokens_per_cta + seq);
  if (q_len < a.prefill_min_query_len || tile < 0 || tile * tokens_per_cta >= q_len || q_start < 0 ||
      q_end > a.num_tokens) {
    return;
  }
  const int seq_len = a.seq_lens[seq];
  if (seq_len < q_len || seq_len > a.max_blocks_per_seq * a.block_size) return;
  const int context_len = seq_len - q_len;
  const int token_begin = tile * tokens_per_cta;  // first query token of the tile, within the sequence
  const int num_tile_tokens = imin(tokens_per_cta, q_len - token_begin);
  const int kv_end = context_len + token_begin + num_tile_tokens;  // keys the tile's last row sees
  const int kv_head = blockIdx.y / a.prefill_head_chunks;
  const int heads_per_cta = a.prefill_heads_per_cta;
  const int first_group_head = (blockIdx.y % a.prefill_head_chunks) * heads_per_cta;
  const int num_group_heads = imin(heads_per_cta, a.group - first_group_head);
  const int first_head = kv_head * a.group + first_group_head;

  PC_SHARED_MEMORY(smem);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  smem_t* k_tile = reinterpret_cast<smem_t*>(smem + C::kOffK);
  smem_t* v_tile = reinterpret_cast<smem_t*>(smem + C::kOffV);
  smem_t* q_tile = reinterpret_cast<smem_t*>(smem + C::kOffQ);
  int* key_valid = reinterpret_cast<int*>(smem + C::kOffValid);
  float* s_tile = reinterpret_cast<float*>(smem + C::kOffS + warp * C::kSBytes);
  smem_t* p_tile = reinterpret_cast<smem_t*>(smem + C::kOffP + warp * C::kPBytes);
  float* o_tile = reinterpret_cast<float*>(smem + C::kOffO + warp * C::kOBytes);

  for (int i = threadIdx.x; i < C::kRows * kHeadSize; i += C::kThreads) {
    const int r = i / kHeadSize;
    const int d = i % kHeadSize;
    const int t = r / heads_per_cta;
    const int g = r % heads_per_cta;
    float value = 0.f;
    if (t < num_tile_tokens && g < num_group_heads) {
      value = load_as_float(a.query, static_cast<int64_t>(q_start + token_begin + t) * a.q_stride_token +
                                         static_cast<int64_t>(first_head + g) * a.q_stride_head + d,
                            a.q_dtype);
    }
    q_tile[r * C::kLdKV + d] = Num<smem_t>::from_float(value);
  }

  // This lane's row for the softmax and the output: row lane / 2 of the warp's 16, columns of half lane % 2.
  const int row_in_warp = lane / 2;
  const int half = lane % 2;
  const int my_row = warp * 16 + row_in_warp;
  const int my_token = my_row / heads_per_cta;
  const int my_group_head = my_row % heads_per_cta;
  const bool row_valid = my_token < num_tile_tokens && my_group_head < num_group_heads;
  const int my_position = row_valid ? context_len + token_begin + my_token : -1;  // -1 masks every key
  float row_max = -INFINITY, row_sum = 0.f;
  float* o_row = o_tile + row_in_warp * C::kLdO;
  for (int d = half * (kHeadSize / 2); d < (half + 1) * (kHeadSize / 2); ++d) o_row[d] = 0.f;

  QueryFragments<cache_t, kHeadSize, kWmma> q_frags;
  __syncthreads();
  if constexpr (kWmma) q_frags.load(q_tile + warp * 16 * C::kLdKV, C::kLdKV);

  const int32_t* block_row = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  const cache_t* key_cache = static_cast<const cache_t*>(a.key_cache);
  const cache_t* value_cache = static_cast<const cache_t*>(a.value_cache);
  const int64_t block_stride = static_cast<int64_t>(a.num_kv_heads) * a.block_size * kHeadSize;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * a.block_size * kHeadSize;

  for (int kv0 = 0; kv0 < kv_end; kv0 += C::kKeys) {
    __syncthreads();  // every warp is done with the previous K/V tile (and with the Q staging)
    for (int i = threadIdx.x; i < C::kKeys * C::kVecsPerRow; i += C::kThreads) {
      const int c = i / C::kVecsPerRow;
      const int v = i % C::kVecsPerRow;
      const int key = kv0 + c;
      const int block = key < kv_end ? block_row[key >> a.log2_block_size] : kNullBlock;
      const bool valid = block >= 0 && block < a.num_blocks;
      uint4 k_raw = make_uint4(0, 0, 0, 0), v_raw = make_uint4(0, 0, 0, 0);
      if (valid) {
        const int64_t at = block * block_stride + head_offset +
                           static_cast<int64_t>(key & (a.block_size - 1)) * kHeadSize + v * C::kGlobalVec;
        k_raw = load16(key_cache + at);
        v_raw = load16(value_cache + at);
      }
      if (v == 0) key_valid[c] = valid;
      smem_t* k_dst = k_tile + c * C::kLdKV + v * C::kGlobalVec;
      smem_t* v_dst = v_tile + c * C::kLdKV + v * C::kGlobalVec;
      if constexpr (std::is_same<smem_t, cache_t>::value) {
        *reinterpret_cast<uint4*>(k_dst) = k_raw;
        *reinterpret_cast<uint4*>(v_dst) = v_raw;
      } else {
        float k_f[C::kGlobalVec], v_f[C::kGlobalVec];
        unpack<cache_t>(k_raw, k_f);
        unpack<cache_t>(v_raw, v_f);
#pragma unroll
        for (int e = 0; e < C::kGlobalVec; ++e) {
          k_dst[e] = k_f[e];
          v_dst[e] = v_f[e];
        }
      }
    }
    __syncthreads();

    if constexpr (kWmma) {
      warp_scores_tc<C, cache_t, kHeadSize>(q_frags, k_tile, s_tile);
    } else if constexpr (!kTensorCores) {
      warp_scores_simt<C, kHeadSize>(q_tile + warp * 16 * C::kLdKV, k_tile, s_tile, lane);
    }
    __syncwarp();

    // Online softmax of this lane's half row; the two lanes of a row meet through one shuffle.
    float alpha;
    {
      const float* s_row = s_tile + row_in_warp * C::kLdS;
      smem_t* p_row = p_tile + row_in_warp * C::kLdP;
      const int c0 = half * (C::kKeys / 2);
      float tile_max = -INFINITY;
      for (int c = c0; c < c0 + C::kKeys / 2; ++c) {
        const bool seen = kv0 + c <= my_position && key_valid[c];
        tile_max = fmaxf(tile_max, seen ? s_row[c] * a.scale_log2 : -INFINITY);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      const float m_new = fmaxf(row_max, tile_max);
      const float m_use = safe_max(m_new);
      alpha = exp2f(row_max - m_use);
      float sum = 0.f;
      for (int c = c0; c < c0 + C::kKeys / 2; ++c) {
        const bool seen = kv0 + c <= my_position && key_valid[c];
        const float p = seen ? exp2f(s_row[c] * a.scale_log2 - m_use) : 0.f;
        p_row[c] = Num<smem_t>::from_float(p);
        sum += p;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      row_sum = row_sum * alpha + sum;
      row_max = m_new;
    }
    __syncwarp();

    // O = O * alpha + P V
    if constexpr (kWmma) {
      warp_values_tc<C, cache_t, kHeadSize>(p_tile, v_tile, s_tile);
      __syncwarp();
      const float* pv_row = s_tile + row_in_warp * C::kLdS;
      for (int d = half * (kHeadSize / 2); d < (half + 1) * (kHeadSize / 2); ++d) {
        o_row[d] = o_row[d] * alpha + pv_row[d];
      }
    } else if constexpr (!kTensorCores) {
      const float* p_row = p_tile + row_in_warp * C::kLdP;
      for (int d = half * (kHeadSize / 2); d < (half + 1) * (kHeadSize / 2); d += 4) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int c = 0; c < C::kKeys; ++c) {
          const float p = p_row[c];
          const float4 v4 = *reinterpret_cast<const float4*>(v_tile + c * C::kLdKV + d);
          acc.x += p * v4.x;
          acc.y += p * v4.y;
          acc.z += p * v4.z;
          acc.w += p * v4.w;
        }
        float4* o4 = reinterpret_cast<float4*>(o_row + d);
        o4->x = o4->x * alpha + acc.x;
        o4->y = o4->y * alpha + acc.y;
        o4->z = o4->z * alpha + acc.z;
        o4->w = o4->w * alpha + acc.w;
      }
    }
  }

  if (row_valid) {
    const int64_t out_base = static_cast<int64_t>(q_start + token_begin + my_token) * a.out_stride_token +
                             static_cast<int64_t>(first_head + my_group_head) * a.out_stride_head;
    const float inv_sum = row_sum > 0.f ? 1.f / row_sum : 0.f;
    for (int d = half * (kHeadSize / 2); d < (half + 1) * (kHeadSize / 2); ++d) {
      store_from_float(a.out, out_base + d, a.q_dtype, o_row[d] * inv_sum);
    }
  }
}

template <typename cache_t, int kHeadSize, bool kTensorCores>
cudaError_t launch_prefill_instance(const AttentionArgs& a, cudaStream_t stream) {
  using C = TileConfig<cache_t, kHeadSize, kTensorCores>;
  auto kernel = &paged_prefill_kernel<cache_t, kHeadSize, kTensorCores>;
  const cudaError_t status = allow_shared_memory(kernel, C::kSharedBytes);
  if (status != cudaSuccess) return status;
  const dim3 grid(static_cast<unsigned>(a.num_tokens / a.prefill_tokens_per_cta + a.num_seqs),
                  static_cast<unsigned>(a.num_kv_heads * a.prefill_head_chunks));
  PC_LAUNCH(kernel, grid, dim3(C::kThreads), C::kSharedBytes, stream, a);
  return last_launch_error();
}

template <typename cache_t, bool kTensorCores>
cudaError_t launch_prefill_variant(const AttentionArgs& a, int head_size, cudaStream_t stream) {
  switch (head_size) {
    case 64: return launch_prefill_instance<cache_t, 64, kTensorCores>(a, stream);
    case 128: return launch_prefill_instance<cache_t, 128, kTensorCores>(a, stream);
    case 256: return launch_prefill_instance<cache_t, 256, kTensorCores>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <typename cache_t>
cudaError_t launch_prefill_any(const AttentionArgs& a, int head_size, bool tensor_cores, cudaStream_t stream) {
  if constexpr (std::is_same<cache_t, float>::value) {
    return launch_prefill_variant<float, false>(a, head_size, stream);  // no fp32 tensor-core path
  } else {
    return tensor_cores ? launch_prefill_variant<cache_t, true>(a, head_size, stream)
                        : launch_prefill_variant<cache_t, false>(a, head_size, stream);
  }
}

}  // namespace attention
}  // namespace cuda
}  // namespace pagedcore
