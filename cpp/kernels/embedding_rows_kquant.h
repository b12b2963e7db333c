// One row of a k-quant table (Q4_K, Q5_K, Q6_K in ggml rows or their x16 repacks, quant_blocks.h)
// decoded to fp32: embedding_rows' decoder for the formats users' Q4_K_M / Q5_K_M / Q6_K GGUFs hold
// their token tables in. Values equal gguf.quants' dequantize_blocks (what
// pagedcore.loader.gguf_dequant calls) bit for bit: fp32 products rounded one at a time, no FMA.
#pragma once

#include <cstdint>

#include "kernels/linear.h"

namespace pagedcore {
namespace kernels {

// Whether `format` is one of the six k-quant layouts decode_kquant_row reads.
bool is_kquant_table(WeightFormat format);

// Row `row` of `table` (num_rows rows of K values, K a multiple of 256; x16: row groups of 16) ->
// values fp32 [K]. The caller checked the sizes and the row.
void decode_kquant_row(WeightFormat format, const void* table, int64_t row, int64_t K, float* values);

}  // namespace kernels
}  // namespace pagedcore
