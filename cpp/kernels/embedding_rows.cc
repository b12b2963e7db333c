// embedding_rows (see embedding_rows.h). Scalar code: a step looks up one row per token, a few KB,
// so the decode is a few microseconds; what it saves is the dozens of small torch ops (index
// arithmetic, gathers, casts) a lookup in Python cost (~0.1-0.4 ms a decode step, docs/performance.md).
// Built with -ffp-contract=off: Q4_1's d * q + m rounds twice, as the Python decoder's mul_ then add_.
#include "kernels/embedding_rows.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/embedding_rows_kquant.h"
#include "kernels/parallel.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace kernels {
namespace {

constexpr int64_t kGroupRows = 16;  // rows per x16 group

uint16_t load_u16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Writes one decoded row (fp32 values, K of them) in the output dtype.
void store_row(const float* values, int64_t K, void* out, DType dtype) {
  if (dtype == DType::kFloat32) {
    std::memcpy(out, values, K * sizeof(float));
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(out);
  for (int64_t k = 0; k < K; ++k) dst[k] = float_to_bf16(values[k]);
}

// One Q8_0 block's 32 weights -> fp32.
void decode_q8_0(float d, const int8_t* q, float* out) {
  for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(q[j]);
}

// The 16 nibble bytes of a Q4 block (ggml order) -> weights j (low nibbles) and 16 + j (high).
void unpack_nibbles(const uint8_t* qs, float* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<float>(qs[j] & 15);
    q[16 + j] = static_cast<float>(qs[j] >> 4);
  }
}

void decode_q4(WeightFormat base, float d, float m, const uint8_t* qs, float* out) {
  float q[32];
  unpack_nibbles(qs, q);
  if (base == WeightFormat::kQ4_0) {
    for (int j = 0; j < 32; ++j) out[j] = (q[j] - 8.f) * d;
  } else {
    for (int j = 0; j < 32; ++j) {
      const float scaled = q[j] * d;  // rounded, then the minimum added (two roundings, as ggml and Python)
      out[j] = scaled + m;
    }
  }
}

// Q5_0 (base kQ5_0: (q - 16) d) or Q5_1 (d q + m, two roundings as Q4_1): the nibbles plus bit j of qh as 16.
void decode_q5(WeightFormat base, float d, float m, const uint8_t* qs, uint32_t qh, float* out) {
  float q[32];
  unpack_nibbles(qs, q);
  for (int j = 0; j < 32; ++j) q[j] += static_cast<float>(16u * (qh >> j & 1u));
  if (base == WeightFormat::kQ5_0) {
    for (int j = 0; j < 32; ++j) out[j] = (q[j] - 16.f) * d;
  } else {
    for (int j = 0; j < 32; ++j) {
      const float scaled = q[j] * d;
      out[j] = scaled + m;
    }
  }
}

uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Row c's ggml qh word of a Q5_0x16 / Q5_1x16 block: byte 4 c + t of the plane holds the fifth bit of
// weight 4 j + t at bit 2 j and of weight 16 + 4 j + t at bit 2 j + 1 (quant_blocks.h).
uint32_t qh_of_x16_row(const uint8_t* plane, int64_t c) {
  uint32_t qh = 0;
  for (int t = 0; t < 4; ++t)
    for (int j = 0; j < 4; ++j) {
      const uint32_t byte = plane[4 * c + t];
      qh |= (byte >> (2 * j) & 1u) << (4 * j + t);
      qh |= (byte >> (2 * j + 1) & 1u) << (16 + 4 * j + t);
    }
  return qh;
}

bool is_q5(WeightFormat f) {
  return f == WeightFormat::kQ5_0 || f == WeightFormat::kQ5_1 || f == WeightFormat::kQ5_0x16 ||
         f == WeightFormat::kQ5_1x16;
}

// Row `row` of a Q5_0 / Q5_1 table (ggml rows or their x16 repack) -> fp32 values [K].
void decode_q5_row(const EmbeddingRowsParams& p, int64_t row, float* values) {
  const int64_t nb = p.K / kBlock32;
  const uint8_t* table = static_cast<const uint8_t*>(p.table);
  const WeightFormat f = p.format;
  const bool x16 = f == WeightFormat::kQ5_0x16 || f == WeightFormat::kQ5_1x16;
  const WeightFormat base = f == WeightFormat::kQ5_0 || f == WeightFormat::kQ5_0x16 ? WeightFormat::kQ5_0
                                                                                    : WeightFormat::kQ5_1;
  const int64_t g = row / kGroupRows, c = row % kGroupRows;
  for (int64_t b = 0; b < nb; ++b) {
    float* out = values + b * kBlock32;
    if (!x16) {
      const uint8_t* r = table + row * quant_row_bytes(f, p.K);
      if (base == WeightFormat::kQ5_0) {
        const BlockQ5_0* blk = reinterpret_cast<const BlockQ5_0*>(r) + b;
        decode_q5(base, fp16_to_float(load_u16(&blk->d)), 0.f, blk->qs, load_u32(blk->qh), out);
      } else {
        const BlockQ5_1* blk = reinterpret_cast<const BlockQ5_1*>(r) + b;
        decode_q5(base, fp16_to_float(load_u16(&blk->d)), fp16_to_float(load_u16(&blk->m)), blk->qs,
                  load_u32(blk->qh), out);
      }
      continue;
    }
    uint8_t qs[16];  // the row's ggml nibble bytes: chunk j holds bytes 4 j .. 4 j + 3
    if (base == WeightFormat::kQ5_0) {
      const BlockQ5_0x16* blk = reinterpret_cast<const BlockQ5_0x16*>(table) + g * nb + b;
      for (int j = 0; j < 4; ++j) std::memcpy(qs + 4 * j, blk->qs[j] + 4 * c, 4);
      decode_q5(base, fp16_to_float(blk->d[c]), 0.f, qs, qh_of_x16_row(blk->qh, c), out);
    } else {
      const BlockQ5_1x16* blk = reinterpret_cast<const BlockQ5_1x16*>(table) + g * nb + b;
      for (int j = 0; j < 4; ++j) std::memcpy(qs + 4 * j, blk->qs[j] + 4 * c, 4);
      decode_q5(base, fp16_to_float(blk->d[c]), fp16_to_float(blk->m[c]), qs, qh_of_x16_row(blk->qh, c), out);
    }
  }
}

// Row `row` of a GGUF block table (ggml rows or their x16 repack) -> fp32 values [K].
void decode_block_row(const EmbeddingRowsParams& p, int64_t row, float* values) {
  const int64_t nb = p.K / kBlock32;
  const uint8_t* table = static_cast<const uint8_t*>(p.table);
  const WeightFormat f = p.format;
  if (is_kquant_table(f)) {
    decode_kquant_row(f, p.table, row, p.K, values);
    return;
  }
  if (is_q5(f)) {
    decode_q5_row(p, row, values);
    return;
  }
  if (f == WeightFormat::kQ8_0 || f == WeightFormat::kQ4_0 || f == WeightFormat::kQ4_1) {
    const int64_t row_bytes = quant_row_bytes(f, p.K);
    const uint8_t* r = table + row * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      float* out = values + b * kBlock32;
      if (f == WeightFormat::kQ8_0) {
        const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(r) + b;
        decode_q8_0(fp16_to_float(load_u16(&blk->d)), blk->qs, out);
      } else if (f == WeightFormat::kQ4_0) {
        const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(r) + b;
        decode_q4(f, fp16_to_float(load_u16(&blk->d)), 0.f, blk->qs, out);
      } else {
        const BlockQ4_1* blk = reinterpret_cast<const BlockQ4_1*>(r) + b;
        decode_q4(f, fp16_to_float(load_u16(&blk->d)), fp16_to_float(load_u16(&blk->m)), blk->qs, out);
      }
    }
    return;
  }
  // x16: row group g holds nb blocks of 16 rows; row c of the group owns bytes 4 c .. 4 c + 3 of
  // every 64-byte chunk of a field.
  const int64_t g = row / kGroupRows, c = row % kGroupRows;
  for (int64_t b = 0; b < nb; ++b) {
    float* out = values + b * kBlock32;
    if (f == WeightFormat::kQ8_0x16) {
      const BlockQ8_0x16* blk = reinterpret_cast<const BlockQ8_0x16*>(table) + g * nb + b;
      int8_t q[32];
      for (int j = 0; j < 8; ++j)
        for (int t = 0; t < 4; ++t) q[4 * j + t] = static_cast<int8_t>(blk->qs[j][4 * c + t] - 128);
      decode_q8_0(fp16_to_float(blk->d[c]), q, out);
    } else {
      uint8_t qs[16];  // the row's ggml nibble bytes: chunk j holds bytes 4 j .. 4 j + 3
      const uint8_t(*chunks)[64];
      float d, m = 0.f;
      if (f == WeightFormat::kQ4_0x16) {
        const BlockQ4_0x16* blk = reinterpret_cast<const BlockQ4_0x16*>(table) + g * nb + b;
        chunks = blk->qs;
        d = fp16_to_float(blk->d[c]);
      } else {
        const BlockQ4_1x16* blk = reinterpret_cast<const BlockQ4_1x16*>(table) + g * nb + b;
        chunks = blk->qs;
        d = fp16_to_float(blk->d[c]);
        m = fp16_to_float(blk->m[c]);
      }
      for (int j = 0; j < 4; ++j) std::memcpy(qs + 4 * j, chunks[j] + 4 * c, 4);
      decode_q4(f == WeightFormat::kQ4_0x16 ? WeightFormat::kQ4_0 : WeightFormat::kQ4_1, d, m, qs, out);
    }
  }
}

// Row `row` of a dense table (checkpoint layout or x16 repack) -> out, in the table's own dtype.
void copy_dense_row(const EmbeddingRowsParams& p, int64_t row, void* out) {
  const int64_t K = p.K;
  const WeightFormat f = p.format;
  if (f == WeightFormat::kDenseF32 || f == WeightFormat::kDenseBf16 || f == WeightFormat::kDenseF16) {
    const int64_t es = f == WeightFormat::kDenseF32 ? 4 : 2;
    std::memcpy(out, static_cast<const char*>(p.table) + row * K * es, K * es);
    return;
  }
  const int64_t g = row / kGroupRows, c = row % kGroupRows;
  if (f == WeightFormat::kDenseF32x16) {  // [N/16, K, 16]
    const float* src = static_cast<const float*>(p.table) + g * K * kGroupRows + c;
    float* dst = static_cast<float*>(out);
    for (int64_t k = 0; k < K; ++k) dst[k] = src[k * kGroupRows];
    return;
  }
  if (f == WeightFormat::kDenseF16x16) {  // [N/16, K, 16] fp16
    const uint16_t* src = static_cast<const uint16_t*>(p.table) + g * K * kGroupRows + c;
    uint16_t* dst = static_cast<uint16_t*>(out);
    for (int64_t k = 0; k < K; ++k) dst[k] = src[k * kGroupRows];
    return;
  }
  // bf16x16 [N/16, K/2, 16, 2]: pair p of row c at (p * 16 + c) * 2
  const uint16_t* src = static_cast<const uint16_t*>(p.table) + g * K * kGroupRows + 2 * c;
  uint16_t* dst = static_cast<uint16_t*>(out);
  for (int64_t pair = 0; pair < K / 2; ++pair) {
    dst[2 * pair] = src[pair * 2 * kGroupRows];
    dst[2 * pair + 1] = src[pair * 2 * kGroupRows + 1];
  }
}

bool is_dense(WeightFormat f) {
  return f == WeightFormat::kDenseF32 || f == WeightFormat::kDenseBf16 || f == WeightFormat::kDenseF16 ||
         f == WeightFormat::kDenseF32x16 || f == WeightFormat::kDenseBf16x16 || f == WeightFormat::kDenseF16x16;
}
bool is_dense_x16(WeightFormat f) {
  return f == WeightFormat::kDenseF32x16 || f == WeightFormat::kDenseBf16x16 || f == WeightFormat::kDenseF16x16;
}
bool is_f16(WeightFormat f) { return f == WeightFormat::kDenseF16 || f == WeightFormat::kDenseF16x16; }

// The dtype a dense table's rows have as stored; an fp16 table (which no activation dtype matches) answers
// kBFloat16, its element size, and its rows only ever widen to fp32.
DType dense_dtype(WeightFormat f) {
  return f == WeightFormat::kDenseF32 || f == WeightFormat::kDenseF32x16 ? DType::kFloat32 : DType::kBFloat16;
}

}  // namespace

bool has_embedding_rows(WeightFormat f) {
  return is_dense(f) || f == WeightFormat::kQ8_0 || f == WeightFormat::kQ4_0 || f == WeightFormat::kQ4_1 ||
         f == WeightFormat::kQ8_0x16 || f == WeightFormat::kQ4_0x16 || f == WeightFormat::kQ4_1x16 ||
         is_q5(f) || is_kquant_table(f);
}

Status embedding_rows(const EmbeddingRowsParams& p) {
  const WeightFormat f = p.format;
  if (!has_embedding_rows(f))
    return Status::invalid(std::string("embedding_rows: no decoder for ") + weight_format_name(f) +
                           " tables (dense, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and their x16 repacks "
                           "have one)");
  if (p.num_ids < 0 || p.num_rows <= 0 || p.K <= 0 || p.out_stride < p.K)
    return Status::invalid("embedding_rows: invalid sizes (num_ids " + std::to_string(p.num_ids) + ", rows " +
                           std::to_string(p.num_rows) + ", K " + std::to_string(p.K) + ", out_stride " +
                           std::to_string(p.out_stride) + ")");
  const bool x16 = is_x16_format(f) || is_dense_x16(f);
  const bool blocked = !is_dense(f);
  if ((blocked && p.K % (is_kquant_table(f) ? kBlockK : kBlock32)) || (x16 && p.num_rows % kGroupRows) ||
      (f == WeightFormat::kDenseBf16x16 && p.K % 2))
    return Status::invalid("embedding_rows: a " + std::string(weight_format_name(f)) + " table cannot have " +
                           std::to_string(p.num_rows) + " rows of " + std::to_string(p.K) + " values");
  // A bf16 or fp16 table may also give fp32 rows (widened, exact): a pre-quantized checkpoint's 16-bit table
  // under a model's fp32 activations is held as stored (layers/embedding.py). An fp16 table only widens.
  const bool widen = is_dense(f) && dense_dtype(f) == DType::kBFloat16 && p.out_dtype == DType::kFloat32;
  if (is_dense(f) && (p.out_dtype != dense_dtype(f) || is_f16(f)) && !widen)
    return Status::invalid("embedding_rows: a dense table's rows come out in its own dtype (or fp32 from bf16 "
                           "or fp16)");
  if (p.num_ids == 0) return Status::ok();
  if (!p.out || !p.table || !p.ids) return Status::invalid("embedding_rows: a data pointer is null");
  for (int64_t i = 0; i < p.num_ids; ++i)
    if (p.ids[i] < 0 || p.ids[i] >= p.num_rows)
      return Status::out_of_range("embedding_rows: id " + std::to_string(p.ids[i]) + " is outside the table's " +
                                  std::to_string(p.num_rows) + " rows");
  const int64_t es = p.out_dtype == DType::kFloat32 ? 4 : 2;
  auto decode_ids = [&](int64_t begin, int64_t end) {
    std::vector<float> values(blocked ? p.K : 0);  // fp32 [K] of a block row
    std::vector<uint16_t> narrow(widen ? p.K : 0);  // bf16 / fp16 [K] of a row to widen
    for (int64_t i = begin; i < end; ++i) {
      char* out = static_cast<char*>(p.out) + i * p.out_stride * es;
      if (blocked) {
        decode_block_row(p, p.ids[i], values.data());
        store_row(values.data(), p.K, out, p.out_dtype);
      } else if (widen) {
        copy_dense_row(p, p.ids[i], narrow.data());
        float* dst = reinterpret_cast<float*>(out);
        if (is_f16(f))
          for (int64_t k = 0; k < p.K; ++k) dst[k] = fp16_to_float(narrow[k]);
        else
          for (int64_t k = 0; k < p.K; ++k) dst[k] = bf16_to_float(narrow[k]);
      } else {
        copy_dense_row(p, p.ids[i], out);
      }
    }
  };
  // A decode step's few rows: here. A long prompt's: spread over the threads.
  const int64_t rows_per_task = std::max<int64_t>(1, (int64_t{1} << 15) / p.K);
  if (p.num_ids <= rows_per_task) {
    decode_ids(0, p.num_ids);
  } else {
    const int64_t tasks = (p.num_ids + rows_per_task - 1) / rows_per_task;
    parallel_for(static_cast<int>(tasks), [&](int t, int) {
      decode_ids(t * rows_per_task, std::min(p.num_ids, (t + 1) * rows_per_task));
    });
  }
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
