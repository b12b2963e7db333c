// The quantized linear kernels, written once against an integer-vector trait Q and compiled once
// per instruction set: quant_linear_<isa>.cc defines PC_ISA_NAMESPACE and the trait (inside that
// namespace), sets PC_QVEC and includes this file. Everything here lives in the per-ISA namespace
// and calls no shared inline function (see attention_kernel.h for why).
//
// A vector holds S chunks of 32 weights (S = 1 at 256 bits, 2 at 512), one chunk per "part";
// the trait's byte ops work per part. For each chunk the kernel unpacks the weights to 32 bytes
// (unsigned 0..63, or signed int8 for Q8_0 / int8), multiplies them with the 32 int8 activations of
// the same positions into int32 lanes (maddubs + madd, or vpdpbusd), then:
//   32-blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1):  acc += float(lanes) * d_w * d_x   (a float FMA per block),
//     and the offset / minimum as one scalar per block: -8 (Q5_0: -16) d_w s_x or m_w s_x, with
//     s_x = d_x sum(q_x) (QuantizedX.s);
//   k-quants (Q4_K, Q5_K, Q6_K):    int32 lanes += lanes * (6-bit or int8 sub-block scale) over the
//     super-block (madd with the scales, free on maddubs), then one float FMA with d * d_x per
//     super-block; minimums (Q4_K / Q5_K) and Q6_K's -32 offset from the activations' 16-sums;
//   int8 per channel:               int32 lanes over the whole row, times scale_w * d_x at the end.
// A register tile is MR rows of x by NR weight rows: the weights are unpacked once per tile and
// used MR times, so prefill is not M separate passes over the unpacking.
#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE and PC_QVEC before including quant_linear_impl.h"
#endif

#include <cstdint>
#include <cstring>

#include "kernels/quant_blocks.h"
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

using Q = PC_QVEC;
using V = Q::V;  // 32 S bytes
using I = Q::I;  // 8 S int32 lanes
using F = Q::F;  // 8 S fp32 lanes
constexpr int S = Q::S;
constexpr int kMaxRows = 4;
// Weight rows per tile: two where the format's accumulators fit the register file (Fmt::kWide;
// measured on AVX2 at 512 rows: 4 x 2 tiles +35% for the 32-blocks, -7% for the k-quants, whose
// int32 super-block sums double the live registers).
// One row of x (decode): four weight rows, so the row's setup, tail and horizontal sums are
// shared by more work (K = 576 rows are only 18 blocks).
template <class Fmt>
constexpr int tile_cols(int rows) { return rows == 1 ? 4 : Fmt::kWide || rows <= 2 ? 2 : 1; }

inline float half(uint16_t h) { return Q::half_to_float(h); }

template <class Block>
inline const Block* row_blocks(const QuantBlockArgs& a, int64_t n) {
  return reinterpret_cast<const Block*>(a.w + n * a.row_bytes);
}

// -- 32-weight blocks -------------------------------------------------------------------------------
// kKind: 0 = Q8_0 (signed bytes), 1 = Q4_0 (nibble - 8), 2 = Q4_1 (nibble, plus minimum), 3 = Q5_0 (5 bits
// - 16), 4 = Q5_1 (5 bits, plus minimum). Products of 5-bit weights fit vpmaddubsw's int16 pairs (2 x 31 x 127).
// Blocks go in groups of kGroup: the group's scale products d_w d_x and offset terms are computed
// together in short fixed-length loops (vectorised) rather than as scalars between the vector ops.
#ifndef PC_QUANT_GROUP
#define PC_QUANT_GROUP 8
#endif
constexpr int kGroup = PC_QUANT_GROUP;  // (the macro: A/B measurements of the grouped scales)
// Weight tiles ahead whose bytes a tile prefetches while it runs (0: none). A gather that misses
// the cache stalls and the hardware prefetcher does not follow gathers well: without this a
// 576 x 1536 Q4_1 GEMV from DRAM took 131 us against 36 us from L2 (Zen 5, one thread).
#ifndef PC_QUANT_PREFETCH_TILES
#define PC_QUANT_PREFETCH_TILES 2
#endif
constexpr int kPrefetchTiles = PC_QUANT_PREFETCH_TILES;

template <class Block, int kKind>
struct Blocks32 {
  static constexpr bool kWide = true;
  static constexpr float kOffset = kKind == 3 ? -16.f : -8.f;  // Q5_0's, Q4_0's stored-integer offset
  template <class B>
  static uint32_t qh_word(const B& b) {  // Q5_0 / Q5_1: the fifth bits, bit j for weight j
    uint32_t h;
    std::memcpy(&h, b.qh, sizeof h);
    return h;
  }
  template <int MR, int NR>
  struct Tile {
    const int8_t* xq[MR];
    const float* xd[MR];
    const float* xs[MR];
    const Block* w[NR];
    F acc[MR][NR];
    float corr[MR][NR];
    typename Q::F8 corr8[MR][NR];

    // Blocks [ib0, ib0 + kN) (kN == kGroup, or 1 for the tail blocks).
    template <int kN>
    void group(int64_t ib0) {
      // sc[r][j][g] = d_w d_x of block g; one zero past the end for the second part of a lone
      // block when S == 2 (that part reads the next block's bytes, or x's zero padding, times 0).
      alignas(64) float sc[MR][NR][kN + 1];
      if constexpr (kN == kGroup) {  // the group's fp16 fields by one gather, products as vectors
        using F8 = typename Q::F8;
        F8 dw[NR], cw[NR];
        for (int j = 0; j < NR; ++j) {
          dw[j] = Q::half8(&w[j][ib0].d, sizeof(Block));
          if constexpr (kKind == 1 || kKind == 3) cw[j] = Q::mul8(dw[j], Q::set8(kOffset));
          else if constexpr (kKind == 2 || kKind == 4) cw[j] = Q::half8(&w[j][ib0].m, sizeof(Block));
        }
        for (int r = 0; r < MR; ++r) {
          const F8 xd8 = Q::load8(xd[r] + ib0);
          for (int j = 0; j < NR; ++j) {
            Q::store8(sc[r][j], Q::mul8(dw[j], xd8));
            sc[r][j][kN] = 0.f;
          }
          if constexpr (kKind != 0) {
            const F8 xs8 = Q::load8(xs[r] + ib0);
            for (int j = 0; j < NR; ++j) corr8[r][j] = Q::fmadd8(cw[j], xs8, corr8[r][j]);
          }
        }
      } else {
        for (int j = 0; j < NR; ++j)
          for (int g = 0; g < kN; ++g) {
            const Block& b = w[j][ib0 + g];
            const float dw = half(b.d);
            float cw = 0.f;
            if constexpr (kKind == 1 || kKind == 3) cw = kOffset * dw;
            else if constexpr (kKind == 2 || kKind == 4) cw = half(b.m);
            for (int r = 0; r < MR; ++r) {
              sc[r][j][g] = dw * xd[r][ib0 + g];
              corr[r][j] += cw * xs[r][ib0 + g];
            }
          }
        for (int r = 0; r < MR; ++r)
          for (int j = 0; j < NR; ++j) sc[r][j][kN] = 0.f;
      }
      for (int g = 0; g < kN; g += S) {
        const int64_t ib = ib0 + g;
        const int64_t ib1 = S == 2 && g + 1 < kN ? ib + 1 : ib;
        V wv[NR];
        for (int j = 0; j < NR; ++j) {
          if constexpr (kKind == 0) wv[j] = Q::load2(w[j][ib].qs, w[j][ib1].qs);
          else if constexpr (kKind >= 3) wv[j] = Q::or_(Q::nib16(w[j][ib].qs, w[j][ib1].qs),
                                                        Q::high_bits(qh_word(w[j][ib]), qh_word(w[j][ib1])));
          else wv[j] = Q::nib16(w[j][ib].qs, w[j][ib1].qs);
        }
        for (int r = 0; r < MR; ++r) {
          const V xv = Q::load(xq[r] + ib * kBlock32);
          for (int j = 0; j < NR; ++j) {
            I p;
            if constexpr (kKind == 0) p = Q::dot_signed(wv[j], xv);
            else p = Q::dot(wv[j], xv);
            acc[r][j] = Q::fmadd(Q::cvt(p), Q::bcast2(&sc[r][j][g]), acc[r][j]);
          }
        }
      }
    }
  };

  template <int MR, int NR>
  static void tile(const QuantBlockArgs& a, int64_t m, int64_t n, float (&out)[MR][NR]) {
    const int64_t nb = a.K / kBlock32;
    Tile<MR, NR> t;
    for (int j = 0; j < NR; ++j) t.w[j] = row_blocks<Block>(a, n + j);
    for (int r = 0; r < MR; ++r) {
      t.xq[r] = a.x.q + (m + r) * a.x.q_stride;
      t.xd[r] = a.x.d + (m + r) * a.x.d_stride;
      t.xs[r] = a.x.s + (m + r) * a.x.s_stride;
      for (int j = 0; j < NR; ++j) {
        t.acc[r][j] = Q::fzero();
        t.corr[r][j] = 0.f;
        t.corr8[r][j] = Q::set8(0.f);
      }
    }
    // The rows kPrefetchTiles tiles on (contiguous after this tile's), one slice per group.
    const char* ahead = reinterpret_cast<const char*>(row_blocks<Block>(a, n + kPrefetchTiles * NR));
    const int64_t ahead_bytes = kPrefetchTiles > 0 ? NR * a.row_bytes : 0;
    const int64_t num_groups = nb / kGroup;
    const int64_t slice = num_groups > 0 ? (ahead_bytes / num_groups + 63) / 64 * 64 : 0;
    int64_t ib = 0;
    for (int64_t g = 0; ib + kGroup <= nb; ib += kGroup, ++g) {
      for (int64_t b = g * slice; b < (g + 1) * slice && b < ahead_bytes; b += 64) __builtin_prefetch(ahead + b);
      t.template group<kGroup>(ib);
    }
    for (; ib + 2 <= nb; ib += 2) t.template group<2>(ib);  // the tail in pairs: full vectors at S = 2
    for (; ib < nb; ++ib) t.template group<1>(ib);
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) out[r][j] = Q::hsum(t.acc[r][j]) + (Q::hsum8(t.corr8[r][j]) + t.corr[r][j]);
  }
};

// -- k-quants (quant_kquant_impl.h: BlocksK) --------------------------------------------------------
}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
#include "kernels/quant_kquant_impl.h"
namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

// -- int8 per channel -------------------------------------------------------------------------------
struct Int8Rows {
  static constexpr bool kWide = true;
  template <int MR, int NR>
  static void tile(const QuantBlockArgs& a, int64_t m, int64_t n, float (&out)[MR][NR]) {
    const int8_t* w[NR];
    for (int j = 0; j < NR; ++j) w[j] = reinterpret_cast<const int8_t*>(a.w + (n + j) * a.row_bytes);
    const int8_t* xq[MR];
    for (int r = 0; r < MR; ++r) xq[r] = a.x.q + (m + r) * a.x.q_stride;
    I isum[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) isum[r][j] = Q::izero();
    int64_t k = 0;
    for (; k + 32 * S <= a.K; k += 32 * S) {
      V wv[NR];
      for (int j = 0; j < NR; ++j) wv[j] = Q::load(w[j] + k);
      for (int r = 0; r < MR; ++r) {
        const V xv = Q::load(xq[r] + k);
        for (int j = 0; j < NR; ++j) isum[r][j] = Q::add(isum[r][j], Q::dot_signed(wv[j], xv));
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) {
        int32_t total = Q::hsum_i(isum[r][j]);
        for (int64_t t = k; t < a.K; ++t) total += static_cast<int32_t>(w[j][t]) * xq[r][t];
        out[r][j] = static_cast<float>(total) * a.w_scales[n + j] * a.x.d[(m + r) * a.x.d_stride];
      }
  }
};

// -- tiles over a task ------------------------------------------------------------------------------

template <class Fmt, int MR, int NR>
void run_tile(const QuantBlockArgs& a, int64_t m, int64_t n, float* dst, int64_t ds) {
  float out[MR][NR];
  Fmt::template tile<MR, NR>(a, m, n, out);
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) dst[r * ds + j] = out[r][j];
}

template <class Fmt, int MR>
void run_rows(const QuantBlockArgs& a, int64_t m, int64_t n, int cols, float* dst, int64_t ds) {
  if constexpr (MR == 1) {  // up to four weight rows (tile_cols)
    if (cols == 4) return run_tile<Fmt, 1, 4>(a, m, n, dst, ds);
    if (cols == 3) {
      run_tile<Fmt, 1, 2>(a, m, n, dst, ds);
      return run_tile<Fmt, 1, 1>(a, m, n + 2, dst + 2, ds);
    }
  }
  if (cols == 2) run_tile<Fmt, MR, 2>(a, m, n, dst, ds);
  else run_tile<Fmt, MR, 1>(a, m, n, dst, ds);
}

template <class Fmt>
void run_any(const QuantBlockArgs& a, int64_t m, int rows, int64_t n, int cols, float* dst, int64_t ds) {
  switch (rows) {
    case 4: run_rows<Fmt, 4>(a, m, n, cols, dst, ds); break;
    case 3: run_rows<Fmt, 3>(a, m, n, cols, dst, ds); break;
    case 2: run_rows<Fmt, 2>(a, m, n, cols, dst, ds); break;
    default: run_rows<Fmt, 1>(a, m, n, cols, dst, ds); break;
  }
}

template <class Fmt>
void block(const QuantBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst, int64_t ds) {
  const int first_rows = static_cast<int>(m1 - m0 < kMaxRows ? m1 - m0 : kMaxRows);
  const int ncols = tile_cols<Fmt>(first_rows);
  if (a.n_outer) {  // weight rows outer: each weight row is read from memory once
    for (int64_t n = n0; n < n1; n += ncols) {
      const int cols = static_cast<int>(n1 - n < ncols ? n1 - n : ncols);
      for (int64_t m = m0; m < m1; m += kMaxRows) {
        const int rows = static_cast<int>(m1 - m < kMaxRows ? m1 - m : kMaxRows);
        run_any<Fmt>(a, m, rows, n, cols, dst + (m - m0) * ds + (n - n0), ds);
      }
    }
    return;
  }
  for (int64_t m = m0; m < m1; m += kMaxRows) {  // rows outer: the task's weights stay in L2
    const int rows = static_cast<int>(m1 - m < kMaxRows ? m1 - m : kMaxRows);
    const int nc = tile_cols<Fmt>(rows);
    for (int64_t n = n0; n < n1; n += nc) {
      const int cols = static_cast<int>(n1 - n < nc ? n1 - n : nc);
      run_any<Fmt>(a, m, rows, n, cols, dst + (m - m0) * ds + (n - n0), ds);
    }
  }
}

#ifdef PC_X16
}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
#include "kernels/quant_activation_impl.h"
#include "kernels/quant_x16_impl.h"
#include "kernels/quant_kx16_impl.h"
namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {
#define PC_X16_FN(kind) &x16::block<kind>
#define PC_X16_Q8_FN &x16::block<0>
#define PC_X16_I8_FN &x16::i8block
#define PC_KX16_FN(kind) &x16::kblock<kind>
#else  // no repacked kernels for this ISA (the loader does not repack for it)
#define PC_X16_FN(kind) nullptr
#define PC_X16_Q8_FN nullptr
#define PC_X16_I8_FN nullptr
#define PC_KX16_FN(kind) nullptr
#endif

const QuantIsaKernels kQuantKernels = {{
    /* kDenseF32 */ nullptr,
    /* kDenseBf16 */ nullptr,
    /* kInt8PerChannel */ &block<Int8Rows>,
    /* kQ4_0 */ &block<Blocks32<BlockQ4_0, 1>>,
    /* kQ4_1 */ &block<Blocks32<BlockQ4_1, 2>>,
    /* kQ8_0 */ &block<Blocks32<BlockQ8_0, 0>>,
    /* kQ4_K */ &block<BlocksK<BlockQ4_K, 4>>,
    /* kQ5_K */ &block<BlocksK<BlockQ5_K, 5>>,
    /* kQ6_K */ &block<BlocksK<BlockQ6_K, 6>>,
    /* kQ4_0x16 */ PC_X16_FN(1),
    /* kQ4_1x16 */ PC_X16_FN(2),
    /* kQ8_0x16 */ PC_X16_Q8_FN,
    /* kQ4_Kx16 */ PC_KX16_FN(4),
    /* kQ5_Kx16 */ PC_KX16_FN(5),
    /* kQ6_Kx16 */ PC_KX16_FN(6),
    /* kDenseF32x16 */ nullptr,
    /* kDenseBf16x16 */ nullptr,
    /* kInt8PerChannelX16 */ PC_X16_I8_FN,
    /* kDenseF16 */ nullptr,
    /* kDenseF16x16 */ nullptr,
    /* kDenseFp8E4M3 */ nullptr,  // (the dense family's: x stays float)
    /* kDenseFp8E4M3x16 */ nullptr,
    /* kQ5_0 */ &block<Blocks32<BlockQ5_0, 3>>,
    /* kQ5_1 */ &block<Blocks32<BlockQ5_1, 4>>,
    /* kQ5_0x16 */ PC_X16_FN(3),
    /* kQ5_1x16 */ PC_X16_FN(4),
}, &x_quant::quantize_rows};
#undef PC_X16_FN
#undef PC_X16_Q8_FN
#undef PC_X16_I8_FN
#undef PC_KX16_FN

const QuantIsaKernels& quant_kernels() { return kQuantKernels; }

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
