// The repacked 16-row kernels (WeightFormat kQ4_0x16, kQ4_1x16, kQ5_0x16, kQ5_1x16, kQ8_0x16,
// kInt8PerChannelX16; layouts
// in quant_blocks.h), written once against a 16-lane trait X and included by quant_linear_impl.h in each
// per-ISA namespace that defines PC_X16 (the trait) before including it.
//
// Why a second layout: in ggml's layout one vector of integer products covers 32 weights of ONE
// row, so every block of every (row of x, weight row) pair pays a conversion, a scale broadcast and
// an FMA, and a dot product ends in a horizontal sum. Here lane l of every vector is output column
// l of a 16-row group: one vpdpbusd adds 4 weights x 4 activations into each of the 16 columns (the
// activations' 4 bytes broadcast), and a block (32 weights) ends with one conversion and two FMAs
// per row of x for all 16 columns, the scales of the 16 rows loaded as one vector.
//
// Per block b of a row group and row r of x (d_x, s_x = d_x sum(q_x): QuantizedX.d, .s):
//   out[r, col] += d_w[col] * (d_x * sum_k u[col, k] q_x[k]) + c_w[col] * s_x
// with u the stored unsigned weights: Q4_0 nibble (c_w = -8 d_w), Q4_1 nibble (c_w = m), Q5_0 5 bits
// (c_w = -16 d_w), Q5_1 5 bits (c_w = m), Q8_0 q + 128 (c_w = -128 d_w): the offset of the stored integer
// times sum(x) is the s_x term.
//
// Trait X (16 int32 / fp32 lanes):
//   V (64 weight bytes), I (16 int32), F (16 fp32); kQ8Signed and I dot4_q8(I acc, V u, x4) for the
//   stored q + 128 bytes of Q8_0x16 / int8 x16 (false: sum(u x) like vpdpbusd, the kernel subtracts the
//   offset; true: sum(q x) by the sign trick, since vpmaddubsw's int16 pairs of bytes up to 255 would
//   saturate); I isub_s(I, int32_t); F loadf(const float*); F mul(F, F); kPairs16 (a vpmaddubsw
//   trait: P (32 int16), P pzero(), P pdot4(P acc, V w, const int8_t* x4) (the int16 pair sums of
//   w and x4 broadcast, added to acc), I widen(P) (adjacent int16 pairs summed into int32 lanes))
//   V load(p); V lo4(V), hi4(V) (nibbles as bytes); I izero(); I dot4(I acc, V w, const int8_t* x4)
//   (acc[l] += sum_t w[4 l + t] x4[t]); F fzero(); F cvt(I); F half16(const uint16_t*);
//   F mul_s(F, float); F fmadd(F a, F b, F c); F fmadd_s(F a, float s, F c); void store(float*, F)
#ifndef PC_ISA_NAMESPACE
#error "include quant_x16_impl.h from quant_linear_impl.h"
#endif

#include <cstdint>

#include "kernels/quant_blocks.h"
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

namespace x16 {

using X = PC_X16;

// Rows of x per tile: their int32 and fp32 accumulators stay in registers (X::kMaxRows).
constexpr int kMaxRows = X::kMaxRows;
// Blocks ahead whose bytes the loop prefetches (the next row group's, at the end of a group). 12, not 4:
// a decode token's 120 Q4_1x16 linears took 1.37-1.45 ms at 4 and 1.23-1.25 ms at 12 against a 1.15-1.22 ms
// read of the same bytes (bench/micro/token_linears.cc, Zen 5, 2026-12-04; Q8_0 3% faster; M = 16 and
// 128 no slower): each thread needs ~4 KB in flight to stream at the DRAM rate.
constexpr int kPrefetchBlocks = 12;

// The tiles of a task, run(m, n) for rows [m, m + rows_per_tile) of x and the row group at n: with few rows
// of x (n_outer) each row group is read from memory once; else rows of x outer, so the task's row groups
// stay in L2. Shared by block(), i8block() and quant_kx16_impl.h's kblock().
template <class Run>
inline void for_each_tile(bool n_outer, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int rows_per_tile,
                          Run&& run) {
  if (n_outer) {
    for (int64_t n = n0; n < n1; n += kRowsX16)
      for (int64_t m = m0; m < m1; m += rows_per_tile) run(m, n);
  } else {
    for (int64_t m = m0; m < m1; m += rows_per_tile)
      for (int64_t n = n0; n < n1; n += kRowsX16) run(m, n);
  }
}

// T, as a type that depends on K (names looked up in it wait for the instantiation).
template <int K, class T>
struct Dependent {
  using type = T;
};

// kKind: 0 = Q8_0x16, 1 = Q4_0x16, 2 = Q4_1x16, 3 = Q5_0x16, 4 = Q5_1x16.
template <int kKind>
struct Format;
template <>
struct Format<0> {
  using Block = BlockQ8_0x16;
  static constexpr float kOffset = -128.f;
};
template <>
struct Format<1> {
  using Block = BlockQ4_0x16;
  static constexpr float kOffset = -8.f;
};
template <>
struct Format<2> {
  using Block = BlockQ4_1x16;
  static constexpr float kOffset = 0.f;  // the minimum m instead
};
template <>
struct Format<3> {
  using Block = BlockQ5_0x16;
  static constexpr float kOffset = -16.f;
};
template <>
struct Format<4> {
  using Block = BlockQ5_1x16;
  static constexpr float kOffset = 0.f;  // the minimum m instead
};

// Q5_0x16 / Q5_1x16: the fifth bits of the qs[j] vector's low (bit 2 j of qh's bytes) or high nibbles
// (bit 2 j + 1) as 16 in each byte: one shift and one mask (quant_blocks.h). A 16-bit shift by at most 4
// brings bit 4 of each byte from the same byte (the bits that cross bytes are masked off).
inline X::V fifth_bits(const X::V& qh, int bit) {
  const X::V at4 = bit < 4 ? X::shl16(qh, 4 - bit) : bit > 4 ? X::shr16(qh, bit - 4) : qh;
  return X::and8(at4, 16);
}

// Rows [m, m + MR) of x against the 16 weight rows of `group` (nb blocks): dst[r * ds + l].
template <int kKind, int MR>
void tile(const QuantBlockArgs& a, int64_t m, const typename Format<kKind>::Block* group, int64_t nb, float* dst,
          int64_t ds) {
  using Block = typename Format<kKind>::Block;
  const int8_t* xq[MR];
  const float* xd[MR];
  const float* xs[MR];
  typename X::F acc[MR];
  for (int r = 0; r < MR; ++r) {
    xq[r] = a.x.q + (m + r) * a.x.q_stride;
    xd[r] = a.x.d + (m + r) * a.x.d_stride;
    xs[r] = a.x.s + (m + r) * a.x.s_stride;
    acc[r] = X::fzero();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const Block& w = group[b];
    const char* ahead = reinterpret_cast<const char*>(group + b + kPrefetchBlocks);
    for (int line = 0; line < static_cast<int>(sizeof(Block)); line += 64) __builtin_prefetch(ahead + line);
    const typename X::F dw = X::half16(w.d);
    typename X::F cw;
    if constexpr (kKind == 2 || kKind == 4) cw = X::half16(w.m);
    else cw = X::mul_s(dw, Format<kKind>::kOffset);
    typename X::I sum[MR];
    for (int r = 0; r < MR; ++r) sum[r] = X::izero();
    // The weights of the qs[j] vector: its low nibbles (weights 4 j + t) and high nibbles (16 + 4 j + t),
    // with their fifth bits for Q5_0 / Q5_1.
    typename X::V qh{};
    if constexpr (kKind >= 3) qh = X::load(w.qh);
    auto weights = [&](int j, typename X::V& lo, typename X::V& hi) {
      const typename X::V v = X::load(w.qs[j]);
      lo = X::lo4(v);
      hi = X::hi4(v);
      if constexpr (kKind >= 3) {
        lo = X::or_(lo, fifth_bits(qh, 2 * j));
        hi = X::or_(hi, fifth_bits(qh, 2 * j + 1));
      }
    };
    if constexpr (kKind != 0 && X::kPairs16) {
      using XP = typename Dependent<kKind, X>::type;  // a dependent name: traits without P compile
      // Nibbles on vpmaddubsw: the block's 8 products of byte pairs add up in int16 (each is at most
      // 2 * 15 * 128 = 3840 in magnitude, so 8 of them fit: no saturation, no wrap) and widen to int32
      // once, instead of a vpmaddwd and a vpaddd after each: the same integers, ~30% fewer
      // instructions on the multiply ports. 5-bit weights (2 * 31 * 128 = 7936) widen after every 4.
      constexpr int kPairsPerWiden = kKind >= 3 ? 2 : 4;  // qs vectors (2 products each) per int16 sum
      for (int j0 = 0; j0 < 4; j0 += kPairsPerWiden) {
        typename XP::P pairs[MR];
        for (int r = 0; r < MR; ++r) pairs[r] = XP::pzero();
        for (int j = j0; j < j0 + kPairsPerWiden; ++j) {
          typename XP::V lo, hi;
          weights(j, lo, hi);
          for (int r = 0; r < MR; ++r) {
            pairs[r] = XP::pdot4(pairs[r], lo, xq[r] + b * kBlock32 + 4 * j);
            pairs[r] = XP::pdot4(pairs[r], hi, xq[r] + b * kBlock32 + 16 + 4 * j);
          }
        }
        for (int r = 0; r < MR; ++r) sum[r] = j0 == 0 ? XP::widen(pairs[r]) : XP::add(sum[r], XP::widen(pairs[r]));
      }
    } else if constexpr (kKind == 0) {  // (kQ8Signed: sum(q x) itself, no offset term below)
      for (int j = 0; j < 8; ++j) {
        const typename X::V v = X::load(w.qs[j]);
        for (int r = 0; r < MR; ++r) sum[r] = X::dot4_q8(sum[r], v, xq[r] + b * kBlock32 + 4 * j);
      }
    } else {
      for (int j = 0; j < 4; ++j) {
        typename X::V lo, hi;
        weights(j, lo, hi);
        for (int r = 0; r < MR; ++r) {
          sum[r] = X::dot4(sum[r], lo, xq[r] + b * kBlock32 + 4 * j);
          sum[r] = X::dot4(sum[r], hi, xq[r] + b * kBlock32 + 16 + 4 * j);
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      acc[r] = X::fmadd(dw, X::mul_s(X::cvt(sum[r]), xd[r][b]), acc[r]);
      if constexpr (!(kKind == 0 && X::kQ8Signed)) acc[r] = X::fmadd_s(cw, xs[r][b], acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) X::store(dst + r * ds, acc[r]);
}

// A tile of `count` rows of x (1 .. MR): the largest tile, by recursion on MR.
template <int kKind, int MR = kMaxRows>
void rows(const QuantBlockArgs& a, int64_t m, int count, const typename Format<kKind>::Block* group, int64_t nb,
          float* dst, int64_t ds) {
  if constexpr (MR == 1) {
    tile<kKind, 1>(a, m, group, nb, dst, ds);
  } else {
    if (count >= MR) tile<kKind, MR>(a, m, group, nb, dst, ds);
    else rows<kKind, MR - 1>(a, m, count, group, nb, dst, ds);
  }
}

// QuantBlockFn over row groups: n_begin and n_end are multiples of 16 (quant_linear.cc aligns tasks).
template <int kKind>
void block(const QuantBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst, int64_t ds) {
  using Block = typename Format<kKind>::Block;
  const int64_t nb = a.K / kBlock32;
  const auto* groups = reinterpret_cast<const Block*>(a.w);
  auto run = [&](int64_t m, int64_t n) {
    const int count = static_cast<int>(m1 - m < kMaxRows ? m1 - m : kMaxRows);
    rows<kKind>(a, m, count, groups + (n / kRowsX16) * nb, nb, dst + (m - m0) * ds + (n - n0), ds);
  };
  for_each_tile(a.n_outer, m0, m1, n0, n1, kMaxRows, run);
}

// -- int8 per channel, repacked (kInt8PerChannelX16) -------------------------------------------------
// A row group is K / 4 vectors of 64 bytes, vector v holding weights 4 v .. 4 v + 3 of each of the
// 16 rows as q + 128 (unsigned for vpdpbusd; quant_blocks.h); the fp32 scale of each row stays in
// w_scales. No block scales: one int32 sum per column over the whole row, then exactly the integer
// the row-major kernel (quant_linear_impl.h Int8Rows) sums, total = sum((q + 128) x) - 128 sum(x)
// (|sum| <= 255 * 127 * K fits int32 for K <= 65536; a kQ8Signed trait sums q x itself), and the
// same float products, (float(total) * scale_w) * d_x: the two layouts give the same bits.
constexpr int kI8PrefetchLines = 32;  // lines ahead of the stream (2 KB, as Q8_0x16's 4 blocks)

template <int MR>
void i8_tile(const QuantBlockArgs& a, int64_t m, const uint8_t* group, const float* w_scales, const int32_t* xsum,
             float* dst, int64_t ds) {
  const int64_t nv = a.K / 4;
  const int8_t* xq[MR];
  typename X::I sum[MR];
  for (int r = 0; r < MR; ++r) {
    xq[r] = a.x.q + (m + r) * a.x.q_stride;
    sum[r] = X::izero();
  }
  for (int64_t v = 0; v < nv; ++v) {
    __builtin_prefetch(group + (v + kI8PrefetchLines) * 64);
    const typename X::V w = X::load(group + v * 64);
    for (int r = 0; r < MR; ++r) sum[r] = X::dot4_q8(sum[r], w, xq[r] + 4 * v);
  }
  const typename X::F ws = X::loadf(w_scales);
  for (int r = 0; r < MR; ++r) {
    const typename X::F total = X::kQ8Signed ? X::cvt(sum[r]) : X::cvt(X::isub_s(sum[r], 128 * xsum[r]));
    X::store(dst + r * ds, X::mul_s(X::mul(total, ws), a.x.d[(m + r) * a.x.d_stride]));
  }
}

template <int MR = kMaxRows>
void i8_rows(const QuantBlockArgs& a, int64_t m, int count, const uint8_t* group, const float* w_scales,
             const int32_t* xsum, float* dst, int64_t ds) {
  if constexpr (MR == 1) {
    i8_tile<1>(a, m, group, w_scales, xsum, dst, ds);
  } else {
    if (count >= MR) i8_tile<MR>(a, m, group, w_scales, xsum, dst, ds);
    else i8_rows<MR - 1>(a, m, count, group, w_scales, xsum, dst, ds);
  }
}

// Rows of x whose sums a call keeps on the stack (tasks hold at most 64: quant_linear.cc).
constexpr int64_t kI8SumRows = 64;

// QuantBlockFn over row groups (n_begin, n_end multiples of 16).
inline void i8block(const QuantBlockArgs& a, int64_t m_begin, int64_t m_end, int64_t n0, int64_t n1, float* dst,
                    int64_t ds) {
  const int64_t group_bytes = kRowsX16 * a.K;
  for (int64_t m0 = m_begin; m0 < m_end; m0 += kI8SumRows) {
    const int64_t m1 = m0 + kI8SumRows < m_end ? m0 + kI8SumRows : m_end;
    // sum(x) of each row of x, once (the +128 of the stored weights times it is subtracted)
    int32_t xsums[kI8SumRows] = {};
    for (int64_t m = m0; m < m1 && !X::kQ8Signed; ++m) {
      const int8_t* q = a.x.q + m * a.x.q_stride;
      int32_t s = 0;
      for (int64_t k = 0; k < a.K; ++k) s += q[k];
      xsums[m - m0] = s;
    }
    float* out = dst + (m0 - m_begin) * ds;
    auto run = [&](int64_t m, int64_t n) {
      const int count = static_cast<int>(m1 - m < kMaxRows ? m1 - m : kMaxRows);
      i8_rows(a, m, count, a.w + (n / kRowsX16) * group_bytes, a.w_scales + n, xsums + (m - m0),
              out + (m - m0) * ds + (n - n0), ds);
    };
    for_each_tile(a.n_outer, m0, m1, n0, n1, kMaxRows, run);
  }
}

}  // namespace x16

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
