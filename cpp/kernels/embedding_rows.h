// embedding_rows: the rows of a token-embedding table a step looks up, decoded to floats.
//
// The table is held as its LM head's kernel reads it (a tied head multiplies by the same bytes),
// so a lookup decodes only the rows asked for, straight from that layout: dense rows (fp32 / bf16 / fp16),
// their x16 repacks, and the GGUF block formats Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K in ggml rows or
// their x16 repacks (quant_blocks.h). The values equal pagedcore.loader.gguf_dequant.dequantize_rows
// exactly: each weight is d * q (Q4_0: d * (q - 8); Q4_1: d * q, rounded, then + m, rounded; the
// k-quants as embedding_rows_kquant.h says) in fp32, then rounded once to bf16 when out_dtype is bf16.
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"
#include "kernels/linear.h"

namespace pagedcore {
namespace kernels {

struct EmbeddingRowsParams {
  void* out = nullptr;            // [num_ids, K] rows out_stride elements apart, out_dtype
  const void* table = nullptr;    // num_rows rows of `format` (x16: num_rows / 16 row groups)
  const int64_t* ids = nullptr;   // [num_ids] row indices in [0, num_rows)
  int64_t num_ids = 0;
  int64_t num_rows = 0;
  int64_t K = 0;                  // values per row (the hidden size)
  int64_t out_stride = 0;         // >= K
  WeightFormat format = WeightFormat::kDenseF32;
  DType out_dtype = DType::kFloat32;  // dense formats: their own dtype, or fp32 from bf16 / fp16 (widened, exact)
};

// Whether embedding_rows decodes tables of `format`.
bool has_embedding_rows(WeightFormat format);

// Checks the sizes and every id (nothing written on an error: OutOfRange for an id), then decodes.
Status embedding_rows(const EmbeddingRowsParams& p);

}  // namespace kernels
}  // namespace pagedcore
