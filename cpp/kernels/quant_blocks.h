// The quantized weight formats' byte layouts: exactly ggml's (llama.cpp's GGUF files), so a loader
// hands a tensor's bytes to the kernels untouched. Plain data only (structs and constants): this
// header is included by units compiled for different instruction sets (see linear_kernel.h).
//
// A weight matrix W [N, K] is N rows, each K / kBlock* consecutive blocks along K. fp16 fields are
// IEEE half precision stored as uint16_t. Dequantised weight j of a block (q: the stored integer):
//   Q8_0  (32 weights):  d * q,  q int8
//   Q4_0  (32 weights):  d * (q - 8),  q = qs[j] & 15 for j < 16, qs[j - 16] >> 4 after
//   Q4_1  (32 weights):  d * q + m,  q as Q4_0
//   Q5_0  (32 weights):  d * (q - 16),  q 5-bit: the Q4_0 nibble plus bit j of qh (little-endian uint32) as 16
//   Q5_1  (32 weights):  d * q + m,  q as Q5_0 (what llama.cpp writes for Q4_K / Q5_K tensors whose rows are
//         not whole 256-weight super-blocks: most of a small model's Q4_K_M / Q5_K_M file)
//   Q4_K  (256 weights = 8 sub-blocks of 32): d * sc[s] * q - dmin * mn[s], q 4-bit, sc / mn 6-bit
//         per sub-block s packed in `scales` (12 bytes); qs byte 32 c + l holds weight 64 c + l in its
//         low nibble and weight 64 c + 32 + l in its high nibble
//   Q5_K  (256): as Q4_K plus a fifth bit: bit s of qh[l] is the high bit of weight 32 s + l
//   Q6_K  (256 = 16 sub-blocks of 16): d * sc[s] * (q - 32), q 6-bit: weight 128 h + 32 t + l
//         (t = 0..3) takes its low 4 bits from ql[64 h + 32 (t & 1) + l] (low nibble for t < 2,
//         high for t >= 2) and its top 2 bits from qh[32 h + l] >> 2 t; sc int8 per 16 weights
//   INT8 per channel: W int8 [N, K] and one fp32 scale per row: w = scale[n] * q (not a block format)
#pragma once

#include <cstdint>

namespace pagedcore {
namespace kernels {

constexpr int64_t kBlock32 = 32;    // Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 block; the sub-block of the k-quants
constexpr int64_t kBlockK = 256;    // the k-quants' super-block (Q8_K activations too)

struct BlockQ8_0 {
  uint16_t d;       // fp16 scale
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;       // fp16 scale
  uint8_t qs[16];   // weights j (low nibble) and j + 16 (high nibble)
};
struct BlockQ4_1 {
  uint16_t d;       // fp16 scale
  uint16_t m;       // fp16 minimum (added)
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;       // fp16 scale
  uint8_t qh[4];    // bit j: the fifth bit of weight j
  uint8_t qs[16];   // the low four bits, as Q4_0
};
struct BlockQ5_1 {
  uint16_t d;       // fp16 scale
  uint16_t m;       // fp16 minimum (added)
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ4_K {
  uint16_t d;          // fp16 super-block scale of the 6-bit sub-block scales
  uint16_t dmin;       // fp16 super-block scale of the 6-bit sub-block minimums
  uint8_t scales[12];  // 8 scales + 8 minimums, 6 bits each (see quant_linear_impl.h unpack_scales)
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];      // the fifth bits
  uint8_t qs[128];     // the low four bits, as Q4_K
};
struct BlockQ6_K {
  uint8_t ql[128];     // low four bits
  uint8_t qh[64];      // top two bits
  int8_t scales[16];   // one per 16 weights
  uint16_t d;          // fp16 super-block scale
};

// Repacked: 16 weight rows' blocks of the same 32 weights, interleaved so that one 64-byte vector
// holds 4 consecutive weights of each of the 16 rows (row r's 4 bytes at 4 r). A tensor of N rows is
// N / 16 row groups, each K / 32 of these blocks in K order (the same bytes as N ggml rows). Built by
// pagedcore.ops.quant_repack.
//   Q4_0x16 / Q4_1x16: qs[j] (j = 0..3) holds, for row r, ggml qs bytes 4 j .. 4 j + 3 of that row:
//                      low nibbles weights 4 j + t, high nibbles weights 16 + 4 j + t.
//   Q8_0x16:           qs[j] (j = 0..7) holds weights 4 j .. 4 j + 3 of each row, stored as q + 128
//                      (unsigned: vpdpbusd multiplies unsigned weights by signed activations).
//   Q5_0x16 / Q5_1x16: qs as Q4_0x16; the fifth bits moved beside the nibbles they complete: byte 4 r + t
//                      of qh holds, for row r, the fifth bit of weight 4 j + t at bit 2 j and of weight
//                      16 + 4 j + t at bit 2 j + 1 (j = 0..3), so the qs[j] vector's bits are one shift
//                      and one mask away (quant_x16_impl.h).
struct BlockQ4_0x16 {
  uint16_t d[16];      // fp16 scale of each row
  uint8_t qs[4][64];
};
struct BlockQ4_1x16 {
  uint16_t d[16];
  uint16_t m[16];      // fp16 minimum of each row
  uint8_t qs[4][64];
};
struct BlockQ5_0x16 {
  uint16_t d[16];
  uint8_t qh[64];      // the fifth bits, 8 of each row per byte (above)
  uint8_t qs[4][64];
};
struct BlockQ5_1x16 {
  uint16_t d[16];
  uint16_t m[16];
  uint8_t qh[64];
  uint8_t qs[4][64];
};
struct BlockQ8_0x16 {
  uint16_t d[16];
  uint8_t qs[8][64];   // q + 128
};
constexpr int64_t kRowsX16 = 16;

// The k-quants repacked: per 16-row group and super-block of 256 weights, the 16 rows' fields with
// the 6-bit scales unpacked to one byte each (quant_kx16_impl.h reads them with one widening load;
// pagedcore.ops.quant_repack builds them). A "pair chunk" p holds, for row r, sub-blocks 2 p and
// 2 p + 1's values at bytes 2 r, 2 r + 1: widened to int16 it is one int32 lane per row holding both
// (vpmaddwd / vpdpwssd against two activation sums; the low or high half is one sub-block's scale).
//   Q4_Kx16: qs[i] (i = 8 c + j) holds, for row r, ggml qs bytes 4 i .. 4 i + 3: low nibbles weights
//            64 c + 4 j + t (sub-block 2 c), high nibbles 64 c + 32 + 4 j + t (sub-block 2 c + 1).
//            148 bytes per row and super-block (ggml: 144; the 12 packed scale bytes become 16).
//   Q5_Kx16: as Q4_Kx16, plus qh[j] (j = 0..7) = ggml qh bytes 4 j .. 4 j + 3 of each row (bit s of
//            byte t: the fifth bit of weight 32 s + 4 j + t). 180 bytes per row (ggml: 176).
//   Q6_Kx16: ql[i] = ggml ql bytes 4 i .. 4 i + 3 (i = 16 h + 8 u + j: weights 128 h + 32 u + 4 j + t in
//            the low nibbles, 128 h + 32 (u + 2) + 4 j + t in the high), qh[i] = ggml qh bytes 4 i ..
//            4 i + 3 (i = 8 h + j: bits 2 t, 2 t + 1 of byte t' are the top bits of weight
//            128 h + 32 t + 4 j + t'); sc pair chunks of the int8 scales. 210 bytes per row, as ggml.
struct BlockQ4_Kx16 {
  uint16_t d[16];        // fp16 super-block scale of each row
  uint16_t dmin[16];     // fp16 scale of the minimums
  uint8_t sc[4][32];     // pair chunks of the 6-bit sub-block scales (0..63)
  uint8_t mn[4][32];     // pair chunks of the 6-bit sub-block minimums
  uint8_t qs[32][64];
};
struct BlockQ5_Kx16 {
  uint16_t d[16];
  uint16_t dmin[16];
  uint8_t sc[4][32];
  uint8_t mn[4][32];
  uint8_t qh[8][64];     // the fifth bits
  uint8_t qs[32][64];
};
struct BlockQ6_Kx16 {
  uint16_t d[16];
  int8_t sc[8][32];      // pair chunks of the int8 scales of the 16 sub-blocks of 16 weights
  uint8_t ql[32][64];
  uint8_t qh[16][64];
};

static_assert(sizeof(BlockQ8_0) == 34, "ggml block_q8_0 layout");
static_assert(sizeof(BlockQ4_0x16) == 16 * sizeof(BlockQ4_0), "16 rows of Q4_0, repacked");
static_assert(sizeof(BlockQ4_1x16) == 16 * sizeof(BlockQ4_1), "16 rows of Q4_1, repacked");
static_assert(sizeof(BlockQ8_0x16) == 16 * sizeof(BlockQ8_0), "16 rows of Q8_0, repacked");
static_assert(sizeof(BlockQ5_0x16) == 16 * sizeof(BlockQ5_0), "16 rows of Q5_0, repacked");
static_assert(sizeof(BlockQ5_1x16) == 16 * sizeof(BlockQ5_1), "16 rows of Q5_1, repacked");
static_assert(sizeof(BlockQ4_Kx16) == 16 * 148, "16 rows of Q4_K, repacked (scales unpacked)");
static_assert(sizeof(BlockQ5_Kx16) == 16 * 180, "16 rows of Q5_K, repacked (scales unpacked)");
static_assert(sizeof(BlockQ6_Kx16) == 16 * sizeof(BlockQ6_K), "16 rows of Q6_K, repacked");
static_assert(sizeof(BlockQ4_0) == 18, "ggml block_q4_0 layout");
static_assert(sizeof(BlockQ4_1) == 20, "ggml block_q4_1 layout");
static_assert(sizeof(BlockQ5_0) == 22, "ggml block_q5_0 layout");
static_assert(sizeof(BlockQ5_1) == 24, "ggml block_q5_1 layout");
static_assert(sizeof(BlockQ4_K) == 144, "ggml block_q4_K layout");
static_assert(sizeof(BlockQ5_K) == 176, "ggml block_q5_K layout");
static_assert(sizeof(BlockQ6_K) == 210, "ggml block_q6_K layout");

}  // namespace kernels
}  // namespace pagedcore
