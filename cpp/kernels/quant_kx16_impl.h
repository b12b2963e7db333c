// The repacked k-quant kernels (WeightFormat kQ4_Kx16, kQ5_Kx16, kQ6_Kx16; layouts in
// quant_blocks.h), written once against quant_x16_impl.h's 16-lane trait X (lane l = output column
// l of a 16-row group) and included by quant_linear_impl.h after it, in each per-ISA namespace.
//
// Per super-block (256 weights) of a row group and row r of x (Q8_K: one d_x per 256, int16 sums
// q_x per 16 in QuantizedX.bsum):
//   Q4_K / Q5_K: isum[col] = sum_s sc[col, s] * sum_{k in s} u[col, k] q_x[k]          (int32)
//                msum[col] = sum_s mn[col, s] * sum_{k in s} q_x[k]                     (int32)
//                out += d[col] d_x isum - dmin[col] d_x msum
//   Q6_K:        isum as above (16 sub-blocks of 16, int8 scales, u the 6-bit quant), and
//                out += d[col] d_x (isum - 32 sum_s sc[col, s] sum_{k in s} q_x[k])
// so a super-block ends with one or two conversions and FMAs per row of x for all 16 columns.
// The sub-block scale multiplies inside vpmaddwd where the ISA has no vpdpbusd (X::kScaleInDot:
// free), else one vpmulld per sub-block after vpdpbusd sums it. The int32 sums cannot overflow:
// |isum| <= 256 * 63 * 127 * 128 < 2^31 (Q6_K, the widest).
#ifndef PC_ISA_NAMESPACE
#error "include quant_kx16_impl.h from quant_linear_impl.h"
#endif

#include <cstdint>

#include "kernels/quant_blocks.h"
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

namespace x16 {

// Rows of x per tile (their sums stay in registers).
constexpr int kMaxRowsK = X::kMaxRowsK;
// Super-blocks ahead whose bytes the loop prefetches (a quarter per quarter of the current one).
constexpr int kPrefetchSuper = 2;

// kKind: 4 = Q4_Kx16, 5 = Q5_Kx16, 6 = Q6_Kx16.
template <int kKind>
struct KFormat;
template <>
struct KFormat<4> {
  using Block = BlockQ4_Kx16;
};
template <>
struct KFormat<5> {
  using Block = BlockQ5_Kx16;
};
template <>
struct KFormat<6> {
  using Block = BlockQ6_Kx16;
};

// Part `part` of `parts` of the block at `ahead` into the cache.
template <class Block>
inline void prefetch_part(const Block* ahead, int part, int parts) {
  constexpr int kLines = (static_cast<int>(sizeof(Block)) + 63) / 64;
  const char* p = reinterpret_cast<const char*>(ahead);
  for (int line = part * kLines / parts; line < (part + 1) * kLines / parts; ++line) __builtin_prefetch(p + 64 * line);
}

// Bit `bit` of every byte of v moved to bit 4 (Q5_K's fifth bit): a 16-bit shift never brings a
// neighbouring byte's bit to position 4 for bit <= 7 (checked in quant_blocks.h's terms: the shift
// is at most 4 either way).
inline typename X::V fifth_bit(const typename X::V& v, int bit) {
  return X::and8(bit <= 4 ? X::shl16(v, 4 - bit) : X::shr16(v, bit - 4), 0x10);
}
// Bits 2 t, 2 t + 1 of every byte moved to bits 4, 5 (Q6_K's top two bits of quant t).
inline typename X::V top_bits(const typename X::V& v, int t) {
  return X::and8(t <= 2 ? X::shl16(v, 4 - 2 * t) : X::shr16(v, 2 * t - 4), 0x30);
}

// Sub-block sums of MR rows of x: added into isum[r] times sc (kScaleInDot), or into s[r] (a fresh
// sum, scaled by the caller).
template <int MR>
inline void dot_rows(typename X::I (&sums)[MR], const typename X::V& w, const int8_t* const (&xq)[MR],
                     int64_t k, const typename X::I& sc) {
  for (int r = 0; r < MR; ++r) {
    if constexpr (X::kScaleInDot) sums[r] = X::dot4_sc(sums[r], w, xq[r] + k, sc);
    else sums[r] = X::dot4(sums[r], w, xq[r] + k);
  }
}

// Q4_K / Q5_K: super-block sb's integer sums for MR rows into isum (scaled by the sub-block scales).
template <int kKind, int MR>
inline void sums_q45(const typename KFormat<kKind>::Block& w, const int8_t* const (&xq)[MR], int64_t k0,
                     const typename KFormat<kKind>::Block* ahead, typename X::I (&isum)[MR]) {
  using I = typename X::I;
  using V = typename X::V;
  for (int c = 0; c < 4; ++c) {  // sub-blocks 2 c (low nibbles) and 2 c + 1 (high nibbles)
    prefetch_part(ahead, c, 4);
    const I pairs = X::pairs_u8(w.sc[c]);
    const I sc0 = X::scale_lo(pairs), sc1 = X::scale_hi(pairs);
    I s0[MR], s1[MR];
    if constexpr (!X::kScaleInDot)
      for (int r = 0; r < MR; ++r) s0[r] = s1[r] = X::izero();
    for (int j = 0; j < 8; ++j) {
      const V v = X::load(w.qs[8 * c + j]);
      V lo = X::lo4(v), hi = X::hi4(v);
      if constexpr (kKind == 5) {
        const V h = X::load(w.qh[j]);
        lo = X::or_(lo, fifth_bit(h, 2 * c));
        hi = X::or_(hi, fifth_bit(h, 2 * c + 1));
      }
      const int64_t k = k0 + 64 * c + 4 * j;
      if constexpr (X::kScaleInDot) {
        dot_rows<MR>(isum, lo, xq, k, sc0);
        dot_rows<MR>(isum, hi, xq, k + 32, sc1);
      } else {
        dot_rows<MR>(s0, lo, xq, k, sc0);
        dot_rows<MR>(s1, hi, xq, k + 32, sc1);
      }
    }
    if constexpr (!X::kScaleInDot)
      for (int r = 0; r < MR; ++r) isum[r] = X::mul_add(X::mul_add(isum[r], s0[r], sc0), s1[r], sc1);
  }
}

// Q6_K: super-block sb's integer sums (times the int8 scales, without the -32 offset) into isum.
// One pass over each ql / qh chunk: chunk (h, j) gives the quants of t = 0..3 (weights
// 128 h + 32 t + 4 j + (0..3), sub-block 8 h + 2 t + j / 4) from two ql vectors and one qh vector.
template <int MR>
inline void sums_q6(const BlockQ6_Kx16& w, const int8_t* const (&xq)[MR], int64_t k0, const BlockQ6_Kx16* ahead,
                    typename X::I (&isum)[MR]) {
  using I = typename X::I;
  using V = typename X::V;
  for (int h = 0; h < 2; ++h) {
    for (int half = 0; half < 2; ++half) {  // sub-blocks 8 h + 2 t + half, t = 0..3
      prefetch_part(ahead, 2 * h + half, 4);
      I sc[4];
      for (int t = 0; t < 4; ++t) {
        const I pairs = X::pairs_s8(w.sc[4 * h + t]);
        sc[t] = half == 0 ? X::scale_lo(pairs) : X::scale_hi(pairs);
      }
      I s[4][MR];
      if constexpr (!X::kScaleInDot)
        for (int t = 0; t < 4; ++t)
          for (int r = 0; r < MR; ++r) s[t][r] = X::izero();
      for (int j = 4 * half; j < 4 * half + 4; ++j) {
        const V ql0 = X::load(w.ql[16 * h + j]), ql1 = X::load(w.ql[16 * h + 8 + j]);
        const V qh = X::load(w.qh[8 * h + j]);
        const V u[4] = {X::or_(X::lo4(ql0), top_bits(qh, 0)), X::or_(X::lo4(ql1), top_bits(qh, 1)),
                        X::or_(X::hi4(ql0), top_bits(qh, 2)), X::or_(X::hi4(ql1), top_bits(qh, 3))};
        for (int t = 0; t < 4; ++t) {
          const int64_t k = k0 + 128 * h + 32 * t + 4 * j;
          if constexpr (X::kScaleInDot) dot_rows<MR>(isum, u[t], xq, k, sc[t]);
          else dot_rows<MR>(s[t], u[t], xq, k, sc[t]);
        }
      }
      if constexpr (!X::kScaleInDot)
        for (int t = 0; t < 4; ++t)
          for (int r = 0; r < MR; ++r) isum[r] = X::mul_add(isum[r], s[t][r], sc[t]);
    }
  }
}

// Rows [m, m + MR) of x against the 16 weight rows of `group` (nsb super-blocks): dst[r * ds + l].
template <int kKind, int MR>
void ktile(const QuantBlockArgs& a, int64_t m, const typename KFormat<kKind>::Block* group, int64_t nsb, float* dst,
           int64_t ds) {
  using I = typename X::I;
  const int8_t* xq[MR];
  const float* xd[MR];
  const int16_t* xb[MR];  // [K / 16] int16 sums of 16 quantized activations
  typename X::F acc[MR];
  for (int r = 0; r < MR; ++r) {
    xq[r] = a.x.q + (m + r) * a.x.q_stride;
    xd[r] = a.x.d + (m + r) * a.x.d_stride;
    xb[r] = a.x.bsum + (m + r) * a.x.bsum_stride;
    acc[r] = X::fzero();
  }
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const auto& w = group[sb];
    I isum[MR];
    for (int r = 0; r < MR; ++r) isum[r] = X::izero();
    const int64_t k0 = sb * kBlockK;
    const typename X::F dw = X::half16(w.d);
    if constexpr (kKind == 6) {
      sums_q6<MR>(w, xq, k0, group + sb + kPrefetchSuper, isum);
      for (int r = 0; r < MR; ++r) {
        I corr = X::izero();  // sum_s sc[s] * (sum of x over sub-block s): the -32 offset's weight
        for (int p = 0; p < 8; ++p) corr = X::dot2(corr, X::pairs_s8(w.sc[p]), xb[r] + sb * 16 + 2 * p);
        const I total = X::sub(isum[r], X::shl32(corr, 5));
        acc[r] = X::fmadd(dw, X::mul_s(X::cvt(total), xd[r][sb]), acc[r]);
      }
    } else {
      sums_q45<kKind, MR>(w, xq, k0, group + sb + kPrefetchSuper, isum);
      const typename X::F mw = X::half16(w.dmin);
      I mn[4];
      for (int p = 0; p < 4; ++p) mn[p] = X::pairs_u8(w.mn[p]);
      for (int r = 0; r < MR; ++r) {
        // Sums of x over the 8 sub-blocks of 32, as int16 pairs (|sum| <= 32 * 127).
        alignas(16) int16_t x32[8];
        const int16_t* bs = xb[r] + sb * 16;
        for (int s = 0; s < 8; ++s) x32[s] = static_cast<int16_t>(bs[2 * s] + bs[2 * s + 1]);
        I msum = X::izero();
        for (int p = 0; p < 4; ++p) msum = X::dot2(msum, mn[p], x32 + 2 * p);
        acc[r] = X::fmadd(dw, X::mul_s(X::cvt(isum[r]), xd[r][sb]), acc[r]);
        acc[r] = X::fmadd(mw, X::mul_s(X::cvt(msum), -xd[r][sb]), acc[r]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) X::store(dst + r * ds, acc[r]);
}

// A tile of `count` rows of x (1 .. MR): the largest tile, by recursion on MR.
template <int kKind, int MR = kMaxRowsK>
void krows(const QuantBlockArgs& a, int64_t m, int count, const typename KFormat<kKind>::Block* group, int64_t nsb,
           float* dst, int64_t ds) {
  if constexpr (MR == 1) {
    ktile<kKind, 1>(a, m, group, nsb, dst, ds);
  } else {
    if (count >= MR) ktile<kKind, MR>(a, m, group, nsb, dst, ds);
    else krows<kKind, MR - 1>(a, m, count, group, nsb, dst, ds);
  }
}

// QuantBlockFn over row groups (n_begin, n_end multiples of 16, as quant_x16_impl.h's block()).
template <int kKind>
void kblock(const QuantBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst, int64_t ds) {
  using Block = typename KFormat<kKind>::Block;
  const int64_t nsb = a.K / kBlockK;
  const auto* groups = reinterpret_cast<const Block*>(a.w);
  auto run = [&](int64_t m, int64_t n) {
    const int count = static_cast<int>(m1 - m < kMaxRowsK ? m1 - m : kMaxRowsK);
    krows<kKind>(a, m, count, groups + (n / kRowsX16) * nsb, nsb, dst + (m - m0) * ds + (n - n0), ds);
  };
  for_each_tile(a.n_outer, m0, m1, n0, n1, kMaxRowsK, run);
}

}  // namespace x16

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
