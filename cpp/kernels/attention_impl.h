// The paged-attention work-item kernel, written once against a vector trait V (vec_*.h) and
// compiled once per instruction set: attention_<isa>.cc defines PC_ISA_NAMESPACE and PC_VEC, then
// includes this file. Everything here lives in that per-ISA namespace and calls no shared inline
// function (see attention_kernel.h for why).
//
// One work item = a tile of M = rows x group query vectors (all query heads of one kv head for a
// few query rows) against the keys of one sequence, a chunk of whole blocks (~64 keys) at a time,
// with an online softmax:
//
//   for each chunk of K/V blocks in the item's key range (block_size keys of head_size each):
//     S[M, n]  = Qs[M, D] . K[n, D]^T          (Qs pre-scaled; dot products, MR rows x NR keys per
//                                              register tile, horizontal sums 4 at a time)
//     per row: mask keys past the row's position, m' = max(m, max S), p = exp(S - m'),
//              l = l * exp(m - m') + sum p
//     acc[M, D] = acc * exp(m - m') + P[M, n] . V[n, D]   (MR rows x NV vectors per register tile)
//
// bf16 blocks are widened to fp32 in registers when a tile has at most 4 rows (decode), or once
// per chunk into a per-thread buffer for larger tiles (prefill); fp32 blocks are read in place; fp8
// blocks (fp8.h, vLLM's --kv-cache-dtype fp8*) are always widened into the buffers, a plane at a time.
// A bf16 cache (either query dtype) on a CPU with pair dot products (AVX512-BF16, or its emulation)
// takes the tiles of attention_dot_tiles.h instead: bf16 operands as stored, no widening; an fp8 cache
// there too, each plane widened to bf16 (exactly) into the staging buffers first.
#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE and PC_VEC before including attention_impl.h"
#endif

#include <cstdint>
#include <type_traits>

#include "kernels/attention_kernel.h"
#include "kernels/attention_tiles.h"  // V, R, W and the register tiles, in this ISA namespace
#include "kernels/attention_dot_tiles.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

template <int kD>
void attention_item(const PagedAttentionParams& p, const AttentionWorkItem& item,
                    const AttentionScratchLayout& layout, float* scratch,
                    const AttentionPartials& partials) {
  const int64_t D = kD ? kD : p.head_size;
  const int64_t BS = p.block_size;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t g = item.kv_head;
  const int64_t q_begin = p.query_start_loc[item.seq];
  const int64_t q_len = p.query_start_loc[item.seq + 1] - q_begin;
  const int64_t first_pos = p.seq_lens[item.seq] - q_len + item.row_begin;  // position of tile row 0
  const int64_t rows = item.row_end - item.row_begin;
  const int64_t M = rows * group;
  const int64_t s_stride = layout.s_stride;
  auto qk_dispatch = [](int mr, const float* Qs_, const auto* K, float* S_, int64_t m, int64_t n, int64_t D_,
                        int64_t stride, int64_t col, const char* pf) {
    using T = typename std::remove_const<typename std::remove_pointer<decltype(K)>::type>::type;
    Tiles<kD, T>::qk(mr, Qs_, K, S_, m, n, D_, stride, col, pf);
  };
  auto pv_dispatch = [](int mr, const float* P, const auto* Vb, float* acc_, const float* alpha_, int64_t m,
                        int64_t n, int64_t D_, int64_t stride, int64_t col, const char* pf) {
    using T = typename std::remove_const<typename std::remove_pointer<decltype(Vb)>::type>::type;
    Tiles<kD, T>::pv(mr, P, Vb, acc_, alpha_, m, n, D_, stride, col, pf);
  };

  float* Qs = scratch + layout.q;      // [M, D]
  float* acc = scratch + layout.acc;   // [M, D]
  float* S = scratch + layout.s;       // [M, s_stride]
  float* Kst = scratch + layout.k;     // [chunk keys, D] fp32 copy of a bf16 K chunk (prefill tiles)
  float* Vst = scratch + layout.v;     // [chunk keys, D]
  float* m_run = scratch + layout.m;   // [M]
  float* l_run = scratch + layout.l;   // [M]
  float* alpha = scratch + layout.alpha;  // [M]
  constexpr bool kDotIsa = V::kHasDotBf16 && W == 16;
  // An fp32 query over a bf16 cache (quantized models' activations) is rounded to bf16 for the
  // scores, as llama.cpp rounds it to its cache's type.
  // An fp8 cache takes them too: each plane is widened to bf16 (exactly) into the staging buffers first.
  // (No kernel_types.h helpers here, is_fp8 / dtype_size: an inline function called from this unit may be
  // emitted with its AVX flags and kept by the linker for every caller; check_isa_symbols.sh.)
  const bool bf16_cache = p.cache_dtype == DType::kBFloat16;
  const bool fp8_cache = p.cache_dtype == DType::kFloat8E4M3 || p.cache_dtype == DType::kFloat8E5M2;
  const bool dot = kDotIsa && (bf16_cache || fp8_cache) && D % 32 == 0;
  uint16_t* Qb = reinterpret_cast<uint16_t*>(scratch + layout.qb);  // [M, D] bf16 query rows, unscaled
  uint16_t* Pb = reinterpret_cast<uint16_t*>(scratch + layout.pb);  // [M, s_stride] bf16 probabilities

  // Tile row m = r * group + h  <-  query[q_begin + row_begin + r, g * group + h, :] * scale
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = q_begin + item.row_begin + r;
    for (int64_t h = 0; h < group; ++h) {
      const int64_t head = g * group + h;
      const int64_t off = token * p.q_stride_token + head * p.q_stride_head;
      const void* src = p.q_dtype == DType::kFloat32
                            ? static_cast<const void*>(static_cast<const float*>(p.query) + off)
                            : static_cast<const void*>(static_cast<const uint16_t*>(p.query) + off);
      if (dot) load_row_bf16<kD>(src, p.q_dtype, Qb + (r * group + h) * D, D);  // scaled in qk_dot_row
      else load_row<kD>(src, p.q_dtype, Qs + (r * group + h) * D, p.scale, D);
    }
  }
  for (int64_t m = 0; m < M; ++m) {
    m_run[m] = kNegInf;
    l_run[m] = 0.f;
  }
  for (int64_t i = 0; i < M * D; i += W) V::store(acc + i, V::zero());

  const int32_t* block_table = p.block_tables + item.seq * p.max_blocks_per_seq;
  const bool e4m3 = p.cache_dtype == DType::kFloat8E4M3;
  // Elements of one [block_size, head_size] plane (one block, one kv head).
  const int64_t plane = BS * D;
  // Elements from block b to block b + 1 of this layer's cache (a block-major model cache interleaves layers).
  const int64_t block_stride = p.kv_block_stride > 0 ? p.kv_block_stride : p.num_kv_heads * plane;
  // Keys are taken a chunk of whole blocks at a time (about 64 keys), so the softmax bookkeeping
  // (row max, rescale, sums) runs once per chunk rather than once per 16-key block:
  //
  //   positions  [key_begin ......................................... key_end)
  //   chunks     [ blk b | blk b+1 | blk b+2 | blk b+3 ][ blk b+4 | ...
  //   S columns    0..BS   BS..2BS   ...                  0..BS ...
  const int64_t chunk_keys = layout.blocks_per_chunk * BS;
  for (int64_t chunk_start = item.key_begin; chunk_start < item.key_end; chunk_start += chunk_keys) {
    const int64_t n_chunk = imin(chunk_keys, item.key_end - chunk_start);
    // Tile rows before chunk_start see none of it; rows are in position order.
    const int64_t first_row = imax(0, chunk_start - first_pos);
    if (first_row >= rows) break;
    const int64_t m0 = first_row * group;
    // Few rows (decode): widen bf16 inside the loops, each element is used by at most 4 rows.
    // Many rows (prefill tiles): widen each block once into the staging buffers.
    const bool stage = ((bf16_cache && M - m0 > 4) || fp8_cache) && !dot;
    const int64_t elem = bf16_cache ? 2 : fp8_cache ? 1 : 4;
    // Plane offset (elements) of the block holding chunk column `col` of the next chunk, or -1.
    auto next_plane = [&](int64_t col) -> int64_t {
      const int64_t pos = chunk_start + chunk_keys + col;
      if (pos >= item.key_end) return -1;
      return static_cast<int64_t>(block_table[pos / BS]) * block_stride + g * plane;
    };
    for (int64_t col = 0; col < n_chunk; col += BS) {
      const int64_t b = (chunk_start + col) / BS;
      const int64_t n = imin(BS, n_chunk - col);
      // key_cache[block, g] is the plane at block * block_stride + g * block_size * head_size.
      const int64_t base = static_cast<int64_t>(block_table[b]) * block_stride + g * plane;
      const int64_t ahead = next_plane(col);
      // The next chunk's plane, prefetched by the first row tile as it goes (nullptr: none).
      const char* k_ahead = ahead >= 0 ? static_cast<const char*>(p.key_cache) + ahead * elem : nullptr;
      if constexpr (kDotIsa) {
        if (dot) {
          const uint16_t* Kb = static_cast<const uint16_t*>(p.key_cache) + base;
          if (fp8_cache) {  // K and V of this plane as bf16 rows of the staging buffers
            uint16_t* Kbf = reinterpret_cast<uint16_t*>(Kst) + col * D;
            narrow_rows_fp8<kD>(static_cast<const uint8_t*>(p.key_cache) + base, Kbf, n, D, e4m3);
            narrow_rows_fp8<kD>(static_cast<const uint8_t*>(p.value_cache) + base,
                                reinterpret_cast<uint16_t*>(Vst) + col * D, n, D, e4m3);
            Kb = Kbf;
          }
          for (int64_t m = m0; m < M; ++m)
            for (int64_t j = 0; j < n; j += 16)
              qk_dot_row<kD>(Qb + m * D, Kb + j * D, imin(16, n - j), D, p.scale, S + m * s_stride + col + j,
                             m == m0 && k_ahead ? k_ahead + j * D * elem : nullptr);
          continue;
        }
      }
      if (stage) {  // many rows, compute-bound (or fp8): one burst for the whole plane is enough
        if (k_ahead) prefetch_lines(k_ahead, plane * elem);
        float* Kb = Kst + col * D;
        if (fp8_cache) {
          widen_rows_fp8<kD>(static_cast<const uint8_t*>(p.key_cache) + base, Kb, n, D, e4m3);
          widen_rows_fp8<kD>(static_cast<const uint8_t*>(p.value_cache) + base, Vst + col * D, n, D, e4m3);
        } else {
          widen_rows<kD>(static_cast<const uint16_t*>(p.key_cache) + base, Kb, n, D);
          widen_rows<kD>(static_cast<const uint16_t*>(p.value_cache) + base, Vst + col * D, n, D);
        }
        for_row_tiles<4>(m0, M,
                         [&](int64_t m, int mr) { qk_dispatch(mr, Qs, Kb, S, m, n, D, s_stride, col, nullptr); });
      } else if (!bf16_cache) {
        const float* Kb = static_cast<const float*>(p.key_cache) + base;
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
          qk_dispatch(mr, Qs, Kb, S, m, n, D, s_stride, col, m == m0 ? k_ahead : nullptr);
        });
      } else {
        const uint16_t* Kb = static_cast<const uint16_t*>(p.key_cache) + base;
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
          qk_dispatch(mr, Qs, Kb, S, m, n, D, s_stride, col, m == m0 ? k_ahead : nullptr);
        });
      }
    }
    const int64_t n_padded = (n_chunk + W - 1) / W * W;
    for (int64_t m = m0; m < M; ++m) {
      const int64_t pos = first_pos + m / group;
      const int64_t n_visible = imin(n_chunk, pos - chunk_start + 1);
      alpha[m] = softmax_row(S + m * s_stride, n_visible, n_padded, m_run + m, l_run + m);
      if (dot)
        for (int64_t j = 0; j < n_padded; j += W) V::store_bf16(Pb + m * s_stride + j, V::load(S + m * s_stride + j));
    }
    for (int64_t col = 0; col < n_chunk; col += BS) {
      const int64_t b = (chunk_start + col) / BS;
      const int64_t n = imin(BS, n_chunk - col);
      const int64_t base = static_cast<int64_t>(block_table[b]) * block_stride + g * plane;
      const int64_t ahead = next_plane(col);
      const char* v_ahead = ahead >= 0 ? static_cast<const char*>(p.value_cache) + ahead * elem : nullptr;
      const float* rescale = col == 0 ? alpha : nullptr;
      if constexpr (kDotIsa) {
        if (dot) {
          const uint16_t* Vb = fp8_cache ? reinterpret_cast<const uint16_t*>(Vst) + col * D
                                         : static_cast<const uint16_t*>(p.value_cache) + base;
          for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
            pv_dot(mr, Pb, Vb, acc, rescale, m, n, D, s_stride, col, m == m0 ? v_ahead : nullptr);
          });
          continue;
        }
      }
      if (stage) {
        if (v_ahead) prefetch_lines(v_ahead, plane * elem);
        const float* Vb = Vst + col * D;
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
          pv_dispatch(mr, S, Vb, acc, rescale, m, n, D, s_stride, col, nullptr);
        });
      } else if (!bf16_cache) {
        const float* Vb = static_cast<const float*>(p.value_cache) + base;
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
          pv_dispatch(mr, S, Vb, acc, rescale, m, n, D, s_stride, col, m == m0 ? v_ahead : nullptr);
        });
      } else {
        const uint16_t* Vb = static_cast<const uint16_t*>(p.value_cache) + base;
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
          pv_dispatch(mr, S, Vb, acc, rescale, m, n, D, s_stride, col, m == m0 ? v_ahead : nullptr);
        });
      }
    }
  }

  if (dot)
    for (int64_t m = 0; m < M; ++m) unpermute_pairs(acc + m * D, D);
  if (item.partial_index >= 0) {
    const int64_t k = static_cast<int64_t>(item.partial_index) * layout.max_rows;
    for (int64_t m = 0; m < M; ++m) {
      partials.m[k + m] = m_run[m];
      partials.l[k + m] = l_run[m];
      float* dst = partials.acc + (k + m) * D;
      for (int64_t c = 0; c < D; c += W) V::store(dst + c, V::load(acc + m * D + c));
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = q_begin + item.row_begin + r;
    for (int64_t h = 0; h < group; ++h) {
      const int64_t m = r * group + h;
      const int64_t off = token * p.out_stride_token + (g * group + h) * p.out_stride_head;
      void* dst = p.q_dtype == DType::kFloat32
                      ? static_cast<void*>(static_cast<float*>(p.out) + off)
                      : static_cast<void*>(static_cast<uint16_t*>(p.out) + off);
      // l > 0: every row sees position 0 of its sequence in an unpartitioned item.
      store_row<kD>(acc + m * D, 1.f / l_run[m], dst, p.q_dtype, D);
    }
  }
}

AttentionItemFn attention_item_fn(int64_t head_size) {
  if (head_size % W != 0) return nullptr;
  if (head_size == 64) return &attention_item<64>;
  if (head_size == 128) return &attention_item<128>;
  return &attention_item<0>;
}

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
