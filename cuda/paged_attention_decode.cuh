// Decode rows (q_len == 1), flash-decoding style: the context of each sequence is split into
// partitions of partition_size tokens; one CTA (4 warps) serves one (sequence, kv head, head chunk,
// partition) and keeps the query heads of its chunk (GQA: they share every K/V load) in registers.
// Online softmax in fp32, scores in the log2 domain. With more than one partition each CTA writes a
// normalised partial output plus its (max, sum) and paged_decode_reduce_kernel merges them.
#pragma once

#include "device_common.cuh"
#include "paged_attention_args.h"

namespace pagedcore {
namespace cuda {
namespace attention {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = 32 * kDecodeWarps;
constexpr int kReduceThreads = 128;

// How a warp reads K/V rows with 16-byte loads (L = kLanesPerKey, V = kVec elements per load):
//
//   key row (head_size elements):  | vec 0 | vec 1 | ... | vec L-1 | vec L | ... |
//   lane (slot, sub) loads vectors  sub, sub + L, ...  of key  step_base + slot
//
//   lanes:   | slot 0: lanes 0 .. L-1 | slot 1: lanes L .. 2L-1 | ... |   (32 / L keys per step)
//   warp chunk: kSteps steps of consecutive keys; warp w takes chunks w, w + 4, w + 8, ...
//
// A key's dot product is a sum over its L lanes (shuffles inside the slot); each lane then runs its
// own online softmax over the keys of its slot, and the slots and warps are merged at the end.
template <typename cache_t, int kHeadSize>
struct DecodeLayout {
  static constexpr int kVecElems = kVec<cache_t>;
  static constexpr int kVecsPerRow = kHeadSize / kVecElems;
  static constexpr int kLanesPerKey = kVecsPerRow < 32 ? kVecsPerRow : 32;
  static constexpr int kVecsPerLane = kVecsPerRow / kLanesPerKey;
  static constexpr int kKeysPerStep = 32 / kLanesPerKey;
  static constexpr int kSteps = 4;
  static constexpr int kKeysPerChunk = kSteps * kKeysPerStep;
  static constexpr int kElemsPerLane = kVecsPerLane * kVecElems;
  static_assert(kVecsPerRow % kLanesPerKey == 0, "head_size must be a multiple of 16 bytes' elements");

  // Head-dimension index of this lane's element e (0 <= e < kElemsPerLane).
  static __device__ __forceinline__ int dim(int sub, int e) {
    return ((e / kVecElems) * kLanesPerKey + sub) * kVecElems + e % kVecElems;
  }
};

// The checks every decode/reduce CTA makes before touching memory; false = nothing to do.
struct DecodeRow {
  int q_start;
  int seq_len;
};
__device__ __forceinline__ bool decode_row(const AttentionArgs& a, int seq, DecodeRow* row) {
  const int q_start = a.query_start_loc[seq];
  const int q_end = a.query_start_loc[seq + 1];
  if (q_end - q_start != 1 || q_start < 0 || q_end > a.num_tokens) return false;
  const int seq_len = a.seq_lens[seq];
  if (seq_len < 1 || seq_len > a.max_blocks_per_seq * a.block_size) return false;
  row->q_start = q_start;
  row->seq_len = seq_len;
  return true;
}

// grid (num_seqs, num_kv_heads * decode_head_chunks, num_partitions), block kDecodeThreads.
// Shared memory: decode_shared_bytes<kHeadSize, kMaxGroup>().
template <typename cache_t, int kHeadSize, int kMaxGroup>
__global__ void __launch_bounds__(kDecodeThreads) paged_decode_kernel(const AttentionArgs a) {
  using L = DecodeLayout<cache_t, kHeadSize>;
  const int seq = blockIdx.x;
  const int kv_head = blockIdx.y / a.decode_head_chunks;
  const int head_chunk = blockIdx.y % a.decode_head_chunks;
  const int partition = blockIdx.z;
  DecodeRow row;
  if (!decode_row(a, seq, &row)) return;
  const int key_begin = partition * a.partition_size;
  if (key_begin >= row.seq_len) return;
  const int key_end = imin(row.seq_len, key_begin + a.partition_size);
  const int first_group_head = head_chunk * a.decode_heads_per_cta;
  const int num_group_heads = imin(a.decode_heads_per_cta, a.group - first_group_head);
  const int first_head = kv_head * a.group + first_group_head;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int slot = lane / L::kLanesPerKey;
  const int sub = lane % L::kLanesPerKey;

  // This lane's slice of each query head, scaled into the log2 domain.
  float q[kMaxGroup][L::kElemsPerLane];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    const int64_t q_base = row.q_start * a.q_stride_token + static_cast<int64_t>(first_head + g) * a.q_stride_head;
#pragma unroll
    for (int e = 0; e < L::kElemsPerLane; ++e) {
      q[g][e] = g < num_group_heads ? load_as_float(a.query, q_base + L::dim(sub, e), a.q_dtype) * a.scale_log2 : 0.f;
    }
  }

  // key_cache [num_blocks, num_kv_heads, block_size, head_size]: the row of (block, kv_head, offset)
  // starts at ((block * num_kv_heads + kv_head) * block_size + offset) * head_size.
  const int32_t* block_row = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  const cache_t* key_cache = static_cast<const cache_t*>(a.key_cache);
  const cache_t* value_cache = static_cast<const cache_t*>(a.value_cache);
  const int64_t block_stride = static_cast<int64_t>(a.num_kv_heads) * a.block_size * kHeadSize;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * a.block_size * kHeadSize;

  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][L::kElemsPerLane];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < L::kElemsPerLane; ++e) acc[g][e] = 0.f;
  }

  for (int chunk_begin = key_begin + warp * L::kKeysPerChunk; chunk_begin < key_end;
       chunk_begin += kDecodeWarps * L::kKeysPerChunk) {
    // Issue every K and V load of the chunk before using any (memory-level parallelism).
    uint4 k_raw[L::kSteps][L::kVecsPerLane], v_raw[L::kSteps][L::kVecsPerLane];
    bool valid[L::kSteps];
#pragma unroll
    for (int i = 0; i < L::kSteps; ++i) {
      const int key = chunk_begin + i * L::kKeysPerStep + slot;
      const int block = key < key_end ? block_row[key >> a.log2_block_size] : kNullBlock;
      valid[i] = block >= 0 && block < a.num_blocks;
      const int64_t base = valid[i] ? block * block_stride + head_offset +
                                          static_cast<int64_t>(key & (a.block_size - 1)) * kHeadSize
                                    : 0;
#pragma unroll
      for (int v = 0; v < L::kVecsPerLane; ++v) {
        const int64_t at = base + (v * L::kLanesPerKey + sub) * L::kVecElems;
        k_raw[i][v] = valid[i] ? load16(key_cache + at) : make_uint4(0, 0, 0, 0);
        v_raw[i][v] = valid[i] ? load16(value_cache + at) : make_uint4(0, 0, 0, 0);
      }
    }

    float s[kMaxGroup][L::kSteps];
#pragma unroll
    for (int i = 0; i < L::kSteps; ++i) {
      float k[L::kElemsPerLane];
#pragma unroll
      for (int v = 0; v < L::kVecsPerLane; ++v) unpack<cache_t>(k_raw[i][v], k + v * L::kVecElems);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < L::kElemsPerLane; ++e) dot += q[g][e] * k[e];
        dot = group_sum<L::kLanesPerKey>(dot);
        s[g][i] = valid[i] ? dot : -INFINITY;
      }
    }

    // Online softmax: one rescale per chunk, then the chunk's keys at the new max.
    float m_use[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      float chunk_max = s[g][0];
#pragma unroll
      for (int i = 1; i < L::kSteps; ++i) chunk_max = fmaxf(chunk_max, s[g][i]);
      const float m_new = fmaxf(m[g], chunk_max);
      m_use[g] = safe_max(m_new);
      const float alpha = exp2f(m[g] - m_use[g]);
      m[g] = m_new;
      l[g] *= alpha;
#pragma unroll
      for (int e = 0; e < L::kElemsPerLane; ++e) acc[g][e] *= alpha;
    }
#pragma unroll
    for (int i = 0; i < L::kSteps; ++i) {
      float v[L::kElemsPerLane];
#pragma unroll
      for (int u = 0; u < L::kVecsPerLane; ++u) unpack<cache_t>(v_raw[i][u], v + u * L::kVecElems);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        const float p = exp2f(s[g][i] - m_use[g]);  // 0 for a masked key
        l[g] += p;
#pragma unroll
        for (int e = 0; e < L::kElemsPerLane; ++e) acc[g][e] += p * v[e];
      }
    }
  }

  // Merge the slots of the warp: lanes (slot, sub) and (slot ^ k, sub) hold the same dims.
#pragma unroll
  for (int offset = L::kLanesPerKey; offset < 32; offset *= 2) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      const float m_other = __shfl_xor_sync(0xffffffffu, m[g], offset);
      const float l_other = __shfl_xor_sync(0xffffffffu, l[g], offset);
      const float m_new = fmaxf(m[g], m_other);
      const float self_scale = exp2f(m[g] - safe_max(m_new));
      const float other_scale = exp2f(m_other - safe_max(m_new));
      l[g] = l[g] * self_scale + l_other * other_scale;
#pragma unroll
      for (int e = 0; e < L::kElemsPerLane; ++e) {
        const float acc_other = __shfl_xor_sync(0xffffffffu, acc[g][e], offset);
        acc[g][e] = acc[g][e] * self_scale + acc_other * other_scale;
      }
      m[g] = m_new;
    }
  }

  // Merge the warps through shared memory:
  //   warp_max [kDecodeWarps][kMaxGroup] | warp_sum [kDecodeWarps][kMaxGroup] |
  //   warp_acc [kDecodeWarps][kMaxGroup][kHeadSize]
  PC_SHARED_MEMORY(smem);
  float* warp_max = reinterpret_cast<float*>(smem);
  float* warp_sum = warp_max + kDecodeWarps * kMaxGroup;
  float* warp_acc = warp_sum + kDecodeWarps * kMaxGroup;
  if (slot == 0) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (sub == 0) {
        warp_max[warp * kMaxGroup + g] = m[g];
        warp_sum[warp * kMaxGroup + g] = l[g];
      }
#pragma unroll
      for (int e = 0; e < L::kElemsPerLane; ++e) warp_acc[(warp * kMaxGroup + g) * kHeadSize + L::dim(sub, e)] = acc[g][e];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < num_group_heads * kHeadSize; i += kDecodeThreads) {
    const int g = i / kHeadSize;
    const int d = i % kHeadSize;
    float max_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) max_all = fmaxf(max_all, warp_max[w * kMaxGroup + g]);
    float sum = 0.f, out = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float scale = exp2f(warp_max[w * kMaxGroup + g] - safe_max(max_all));
      sum += warp_sum[w * kMaxGroup + g] * scale;
      out += warp_acc[(w * kMaxGroup + g) * kHeadSize + d] * scale;
    }
    const float o = sum > 0.f ? out / sum : 0.f;
    const int head = first_head + g;
    if (a.num_partitions == 1) {
      store_from_float(a.out, row.q_start * a.out_stride_token + head * a.out_stride_head + d, a.q_dtype, o);
    } else {
      const int64_t part = (static_cast<int64_t>(seq) * a.num_heads + head) * a.num_partitions + partition;
      a.partial_out[part * kHeadSize + d] = o;
      if (d == 0) {
        a.partial_max[part] = max_all;
        a.partial_sum[part] = sum;
      }
    }
  }
}

template <int kHeadSize, int kMaxGroup>
constexpr size_t decode_shared_bytes() {
  return sizeof(float) * kDecodeWarps * kMaxGroup * (2 + kHeadSize);
}

// Merges the partitions of each decode row:
//   out = sum_p w_p * partial_out_p / sum_p w_p,   w_p = partial_sum_p * exp2(partial_max_p - max_p')
// grid (num_seqs, num_heads), block kReduceThreads, shared memory num_partitions floats.
__global__ void __launch_bounds__(kReduceThreads) paged_decode_reduce_kernel(const AttentionArgs a, int head_size);

template <typename cache_t, int kHeadSize, int kMaxGroup>
cudaError_t launch_decode_instance(const AttentionArgs& a, cudaStream_t stream) {
  auto kernel = &paged_decode_kernel<cache_t, kHeadSize, kMaxGroup>;
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.num_kv_heads * a.decode_head_chunks),
                  static_cast<unsigned>(a.num_partitions));
  const size_t shared_bytes = decode_shared_bytes<kHeadSize, kMaxGroup>();
  PC_LAUNCH(kernel, grid, dim3(kDecodeThreads), shared_bytes, stream, a);
  return last_launch_error();
}

template <typename cache_t, int kHeadSize>
cudaError_t launch_decode_head_size(const AttentionArgs& a, int max_group, cudaStream_t stream) {
  switch (max_group) {
    case 1: return launch_decode_instance<cache_t, kHeadSize, 1>(a, stream);
    case 2: return launch_decode_instance<cache_t, kHeadSize, 2>(a, stream);
    case 4: return launch_decode_instance<cache_t, kHeadSize, 4>(a, stream);
    case 8: return launch_decode_instance<cache_t, kHeadSize, 8>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <typename cache_t>
cudaError_t launch_decode_any(const AttentionArgs& a, int head_size, int max_group, cudaStream_t stream) {
  switch (head_size) {
    case 64: return launch_decode_head_size<cache_t, 64>(a, max_group, stream);
    case 128: return launch_decode_head_size<cache_t, 128>(a, max_group, stream);
    case 256: return launch_decode_head_size<cache_t, 256>(a, max_group, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace attention
}  // namespace cuda
}  // namespace pagedcore
