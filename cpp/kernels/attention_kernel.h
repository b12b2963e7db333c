// Internal: what the attention launcher (paged_attention.cc) hands each per-ISA kernel
// (attention_<isa>.cc). Plain data only: these headers are included by translation units compiled
// for different instruction sets, so nothing here may define a function (an inline function
// compiled with -mavx512f in one unit could be the copy the linker keeps for all).
#pragma once

#include <cstdint>

#include "kernels/paged_attention.h"

namespace pagedcore {
namespace kernels {

// One unit of work: query rows [row_begin, row_end) of sequence `seq` (relative to its first row),
// every query head of kv head `kv_head`, against key positions [key_begin, key_end):
//
//   tile rows m = r * group + h  (r: query row in the tile, h: head in the kv group)
//   keys     [key_begin ............ key_end)    key_begin is a multiple of block_size
//
// A whole key range writes `out`; a partition (partial_index >= 0) writes its running max, sum
// and unnormalised accumulator to the partial buffers, merged afterwards by the launcher.
struct AttentionWorkItem {
  int32_t seq;
  int32_t kv_head;
  int32_t row_begin;
  int32_t row_end;
  int32_t key_begin;
  int32_t key_end;
  int32_t partial_index;  // -1: write out directly
};

// Offsets (in floats) of each per-thread scratch array; a thread's scratch starts at
// base + thread * per_thread. max_rows = tile rows x group; a chunk = blocks_per_chunk blocks of
// keys handled by one softmax step; s_stride = chunk keys rounded up to 16.
struct AttentionScratchLayout {
  int64_t max_rows;
  int64_t blocks_per_chunk;
  int64_t s_stride;
  int64_t q;      // [max_rows, head_size]  query tile, fp32, pre-scaled
  int64_t acc;    // [max_rows, head_size]  output accumulator
  int64_t s;      // [max_rows, s_stride]   scores, then probabilities, of one chunk
  int64_t k;      // [chunk keys, head_size] fp32 copy of a bf16 key chunk
  int64_t v;      // [chunk keys, head_size] fp32 copy of a bf16 value chunk
  int64_t m;      // [max_rows] running max
  int64_t l;      // [max_rows] running sum
  int64_t alpha;  // [max_rows] rescale factor of this block
  int64_t qb;     // [max_rows, head_size] bf16 query tile, unscaled (pair-dot kernels)
  int64_t pb;     // [max_rows, s_stride] bf16 probabilities of one chunk (pair-dot kernels)
  int64_t per_thread;
};

// Partition results: partial k, row i at index k * max_rows + i.
struct AttentionPartials {
  float* m;    // [num_partials, max_rows]
  float* l;    // [num_partials, max_rows]
  float* acc;  // [num_partials, max_rows, head_size]
};

using AttentionItemFn = void (*)(const PagedAttentionParams& p, const AttentionWorkItem& item,
                                 const AttentionScratchLayout& layout, float* scratch,
                                 const AttentionPartials& partials);

// One per instruction set; head_size picks a specialisation (64, 128 or any multiple of W).
// nullptr when this ISA's kernel can not take head_size (e.g. 16 lanes and head_size % 16 != 0).
// The *_bf16dot variants take a bf16 cache (either query dtype) with pair dot products
// (attention_dot_tiles.h): AVX512-BF16's vdpbf16ps, and its portable emulation for tests.
namespace attention_generic8 { AttentionItemFn attention_item_fn(int64_t head_size); }
namespace attention_generic16 { AttentionItemFn attention_item_fn(int64_t head_size); }
namespace attention_generic16_bf16dot { AttentionItemFn attention_item_fn(int64_t head_size); }
namespace attention_avx2 { AttentionItemFn attention_item_fn(int64_t head_size); }
namespace attention_avx512 { AttentionItemFn attention_item_fn(int64_t head_size); }
namespace attention_avx512_bf16dot { AttentionItemFn attention_item_fn(int64_t head_size); }

}  // namespace kernels
}  // namespace pagedcore
