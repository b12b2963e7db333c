// decode_kquant_row (see embedding_rows_kquant.h). Each super-block (256 weights) of the row is first
// brought into one canonical record, the x16 "lane record" of quant_blocks.h / ops/quant_repack.py
// (the 6-bit scales unpacked to a byte each), from either layout; one decoder per format reads that.
// Built with -ffp-contract=off (as embedding_rows.cc): gguf.quants rounds d * sc, then d_sc * q,
// then subtracts dmin * m, each in fp32.
#include "kernels/embedding_rows_kquant.h"

#include <cstring>

#include "kernels/kernel_types.h"
#include "kernels/quant_blocks.h"

namespace pagedcore {
namespace kernels {
namespace {

constexpr int64_t kGroupRows = 16;  // rows per x16 group
constexpr int kMaxLaneBytes = 210;  // Q6_K's record; Q4_K 148, Q5_K 180

// A lane record's fields in order: (bytes per row, bytes per interleaved chunk) in the x16 layout.
struct Field {
  int width;
  int unit;
};
struct LaneLayout {
  int ggml_bytes;
  int lane_bytes;
  int num_fields;
  Field fields[6];
};
// Q4_K: d, dmin, sc[8], mn[8], qs[128]   Q5_K: d, dmin, sc[8], mn[8], qh[32], qs[128]
// Q6_K: d, sc[16] (int8), ql[128], qh[64]
constexpr LaneLayout kQ4K{144, 148, 5, {{2, 2}, {2, 2}, {8, 2}, {8, 2}, {128, 4}}};
constexpr LaneLayout kQ5K{176, 180, 6, {{2, 2}, {2, 2}, {8, 2}, {8, 2}, {32, 4}, {128, 4}}};
constexpr LaneLayout kQ6K{210, 210, 4, {{2, 2}, {16, 2}, {128, 4}, {64, 4}}};

WeightFormat ggml_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::kQ4_Kx16: return WeightFormat::kQ4_K;
    case WeightFormat::kQ5_Kx16: return WeightFormat::kQ5_K;
    case WeightFormat::kQ6_Kx16: return WeightFormat::kQ6_K;
    default: return f;
  }
}

const LaneLayout& layout_of(WeightFormat ggml) {
  return ggml == WeightFormat::kQ4_K ? kQ4K : ggml == WeightFormat::kQ5_K ? kQ5K : kQ6K;
}

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return fp16_to_float(h);
}

// ggml's 12 bytes of Q4_K / Q5_K scales -> sc[8], mn[8] (6-bit values; quant_repack._unpack_scales).
// quant_kquant_impl.h has the same unpacking inside each per-ISA namespace: inline code in a header
// shared by units built with different -m flags could link the AVX-512 copy into portable code.
void unpack_scales(const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = q[j] & 63;
    mn[j] = q[4 + j] & 63;
    sc[4 + j] = static_cast<uint8_t>((q[8 + j] & 15) | ((q[j] >> 6) << 4));
    mn[4 + j] = static_cast<uint8_t>((q[8 + j] >> 4) | ((q[4 + j] >> 6) << 4));
  }
}

// One ggml super-block -> its lane record.
void ggml_to_lane(WeightFormat ggml, const uint8_t* block, uint8_t* lane) {
  if (ggml == WeightFormat::kQ6_K) {  // [ql 128, qh 64, scales 16, d 2] -> [d, scales, ql, qh]
    std::memcpy(lane, block + 208, 2);
    std::memcpy(lane + 2, block + 192, 16);
    std::memcpy(lane + 18, block, 192);
    return;
  }
  std::memcpy(lane, block, 4);  // d, dmin
  unpack_scales(block + 4, lane + 4, lane + 12);
  std::memcpy(lane + 20, block + 16, ggml == WeightFormat::kQ4_K ? 128 : 160);  // (qh,) qs
}

// Row c's lane record out of a repacked 16-row block: chunk k / unit of a field holds unit bytes of
// each of the 16 rows (row c's at unit * c).
void x16_to_lane(const LaneLayout& L, const uint8_t* block, int64_t c, uint8_t* lane) {
  int start = 0;
  for (int i = 0; i < L.num_fields; ++i) {
    const Field& f = L.fields[i];
    const uint8_t* field = block + kGroupRows * start;
    for (int chunk = 0; chunk < f.width / f.unit; ++chunk)
      std::memcpy(lane + start + chunk * f.unit, field + chunk * kGroupRows * f.unit + c * f.unit, f.unit);
    start += f.width;
  }
}

// Q4_K / Q5_K lane record -> 256 values: weight 32 s + l = (d sc[s]) q - (dmin mn[s]), q the nibble
// of qs[32 (s / 2) + l] (low for even s), plus bit s of qh[l] as the fifth bit (Q5_K).
void decode_q45_k(const uint8_t* lane, bool q5, float* out) {
  const float d = half_at(lane), dmin = half_at(lane + 2);
  const uint8_t* sc = lane + 4;
  const uint8_t* mn = lane + 12;
  const uint8_t* qh = q5 ? lane + 20 : nullptr;
  const uint8_t* qs = lane + (q5 ? 52 : 20);
  for (int s = 0; s < 8; ++s) {
    const float dsc = d * static_cast<float>(sc[s]);
    const float dm = dmin * static_cast<float>(mn[s]);
    const uint8_t* bytes = qs + 32 * (s / 2);
    const int shift = 4 * (s & 1);
    for (int l = 0; l < 32; ++l) {
      int q = (bytes[l] >> shift) & 15;
      if (q5) q |= ((qh[l] >> s) & 1) << 4;
      const float scaled = dsc * static_cast<float>(q);
      out[32 * s + l] = scaled - dm;
    }
  }
}

// Q6_K lane record -> 256 values: weight w = 128 h + 32 t + l = (d sc[w / 16]) (q - 32), q's low four
// bits from ql[64 h + 32 (t & 1) + l] (high nibble for t >= 2), its top two from qh[32 h + l] >> 2 t.
void decode_q6_k(const uint8_t* lane, float* out) {
  const float d = half_at(lane);
  const int8_t* sc = reinterpret_cast<const int8_t*>(lane + 2);
  const uint8_t* ql = lane + 18;
  const uint8_t* qh = lane + 146;
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 4; ++t)
      for (int l = 0; l < 32; ++l) {
        const int w = 128 * h + 32 * t + l;
        const int lo = (ql[64 * h + 32 * (t & 1) + l] >> (4 * (t >> 1))) & 15;
        const int hi = (qh[32 * h + l] >> (2 * t)) & 3;
        const float dsc = d * static_cast<float>(sc[w / 16]);
        out[w] = dsc * static_cast<float>((lo | (hi << 4)) - 32);
      }
}

}  // namespace

bool is_kquant_table(WeightFormat f) {
  const WeightFormat g = ggml_of(f);
  return g == WeightFormat::kQ4_K || g == WeightFormat::kQ5_K || g == WeightFormat::kQ6_K;
}

void decode_kquant_row(WeightFormat format, const void* table, int64_t row, int64_t K, float* values) {
  const WeightFormat ggml = ggml_of(format);
  const LaneLayout& L = layout_of(ggml);
  const bool x16 = ggml != format;
  const int64_t nb = K / kBlockK;
  const uint8_t* bytes = static_cast<const uint8_t*>(table);
  uint8_t lane[kMaxLaneBytes];
  for (int64_t b = 0; b < nb; ++b) {
    if (x16) {
      const uint8_t* block = bytes + ((row / kGroupRows) * nb + b) * kGroupRows * L.lane_bytes;
      x16_to_lane(L, block, row % kGroupRows, lane);
    } else {
      ggml_to_lane(ggml, bytes + (row * nb + b) * L.ggml_bytes, lane);
    }
    float* out = values + b * kBlockK;
    if (ggml == WeightFormat::kQ6_K) decode_q6_k(lane, out);
    else decode_q45_k(lane, ggml == WeightFormat::kQ5_K, out);
  }
}

}  // namespace kernels
}  // namespace pagedcore
