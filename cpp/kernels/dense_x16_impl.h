// The dense kernels of the repacked x16 layouts (linear.h kDenseF32x16, kDenseBf16x16, kDenseF16x16,
// kDenseFp8E4M3x16), written once against the vector trait V of the including unit (linear_impl.h
// includes this inside its per-ISA namespace set-up; see there for why nothing here is shared between units).
//
// Outer-product form: lane l of an accumulator is output column l of a 16-column group, x[m, k] is
// broadcast, so no accumulator is ever folded horizontally:
//
//   f32x16   W [N/16][K][16]        fp32; one 16-lane vector = 16 columns at one k
//   bf16x16  W [N/16][K/2][16][2]   bf16; one 64-byte vector = 16 columns x the pair (k, k+1),
//                                   what vdpbf16ps takes against x[m, k:k+2] broadcast as 32 bits
//   f16x16   W [N/16][K][16]        IEEE fp16; one 32-byte load = 16 columns at one k, widened
//                                   (F16C): f32x16's loop and sums at half the bytes
//   fp8x16   W [N/16][K][16]        e4m3 bytes; one W-byte load = W columns at one k, widened exactly at
//                                   2^-8 of their values (V::load_e4m3_low), the sums then times 2^8:
//                                   f32x16's sums at a quarter of the bytes (linear_impl.h: kFp8).
//                                   Against bf16 x with the bf16 dot (kX16Fp8Dot, K % 4 == 0): 64 bytes (4 k x
//                                   16 columns) become two vectors of bf16 pairs exactly
//                                   (V::load_e4m3_bf16_quad), then bf16x16's loop: bf16x16_dot's sums on the
//                                   bf16 copy, bit for bit
//
//   acc[i][v] (MR rows x NV column vectors) += x[m + i, k] * W[group, k, v lanes]     over all of K
//
// Every output element is summed over k in increasing order by the same instruction sequence
// whatever the tile size or the task split, so a row's result never depends on the other rows of
// the call (or on the threads). K is not sliced: the tile's weight panel (NV x 16 columns x K) stays
// in L2 while the task's row tiles pass over it; the launcher (linear.cc) sizes tasks so.
//
// Registers: a tile's weight vectors at k are loaded first, then each row's broadcast is used at once
// (MR NV accumulators + NV weights + 1 live broadcast: 28 of AVX-512's 32). Written the other way round
// (each weight vector against all MR broadcasts) the compiler keeps MR broadcasts live and spills an
// accumulator through the stack every k (two in bf16): on Zen 5, 2 threads, M >= 128, fp32 400-420 -> 490-510
// GFLOP/s and bf16 700-790 -> 850-950 (bench_linear.py --library, 2026-12-04).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/linear_kernel.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

constexpr int kX16Cols = 16;                          // columns per group
constexpr int kX16VecsPerGroup = kX16Cols / W;        // 1 at 16 lanes, 2 at 8
constexpr int kX16Vecs = V::kRegs >= 32 ? 3 : 2;      // column vectors per register tile
constexpr int kX16Groups = kX16Vecs / kX16VecsPerGroup;  // 3 groups (AVX-512), 1 (AVX2)
constexpr int kX16Rows = V::kRegs >= 32 ? 8 : 6;      // rows per tile: 24 / 12 accumulators

enum X16Mode { kX16F32 = 0, kX16Bf16Widen = 1, kX16Bf16Dot = 2, kX16F16Widen = 3, kX16Fp8Widen = 4, kX16Fp8Dot = 5 };

// Rows per tile of a mode: widening keeps an even and an odd vector per column vector live, so with 16
// registers (AVX2) 6 rows would need 12 + 4 + 1 = 17 and spill; 5 rows fit (10 + 4 + 1). kX16Fp8Dot holds
// two pair vectors per column vector and load_e4m3_bf16_quad's 6 constant vectors besides its accumulators:
// 6 rows (Zen 4, 2 threads, M = 256, the default model's three shapes: 5 rows 340-364 GFLOP/s, 6 rows 410-424,
// 7 rows 398-410; bf16x16 441-455).
template <int kMode>
constexpr int x16_rows() {
  if constexpr (kMode == kX16Fp8Dot) return 6;
  return kMode == kX16Bf16Widen && V::kRegs < 32 ? 5 : kX16Rows;
}

// dst[i * ds + c] = x[m + i] . W[16 g0 + c] for i < MR, c < 16 NG (raw sums). kBlockScaled (fp8 with
// block-wise scales, a.block_scales): K in blocks of a.block_k, each block's sums times its scale
// block_scales[g][kb] as it ends and added into dst in kb order (dst holds the scaled sums, not raw ones).
template <int MR, int NG, int kMode, bool kBlockScaled = false>
inline void x16_tile(const LinearBlockArgs& a, int64_t m, int64_t g0, float* dst, int64_t ds) {
  constexpr int NV = NG * kX16VecsPerGroup;
  const int64_t K = a.K;
  const int64_t group_elems = K * kX16Cols;  // elements of one group (fp32, bf16, fp16 or fp8)
  R acc[MR * NV];
#pragma GCC unroll 32
  for (int q = 0; q < MR * NV; ++q) acc[q] = V::zero();
  if constexpr (kBlockScaled) {
    if (K == 0) {
      for (int i = 0; i < MR; ++i)
        for (int q = 0; q < NV; ++q) V::store(dst + i * ds + q * W, V::zero());
      return;
    }
  }
  // One pass over all of K, or (kBlockScaled) one per scale block.
  const int64_t k_step = kBlockScaled ? a.block_k : K;
  for (int64_t k_lo = 0, kb = 0; k_lo < K || (!kBlockScaled && kb == 0); k_lo += k_step, ++kb) {
    // (no std::min: a Debug build would emit it as a weak symbol shared by the ISA units; check_isa_symbols.sh)
    const int64_t k_hi = kBlockScaled && k_lo + k_step < K ? k_lo + k_step : K;

    if constexpr (kMode == kX16F32 || kMode == kX16F16Widen || kMode == kX16Fp8Widen) {
      using WeightT = std::conditional_t<kMode == kX16F32, float,
                                         std::conditional_t<kMode == kX16F16Widen, uint16_t, uint8_t>>;
      const WeightT* w = static_cast<const WeightT*>(a.w) + g0 * group_elems;  // [NG][K][16]
      const float* xr[MR];
      for (int i = 0; i < MR; ++i) xr[i] = a.x32 + (m + i) * a.x_stride;
      for (int64_t k = k_lo; k < k_hi; ++k) {
        R wv[NV];  // the panel's NV column vectors at k, loaded first: then one broadcast is live at a time
#pragma GCC unroll 8
        for (int q = 0; q < NV; ++q) {
          const int g = q / kX16VecsPerGroup, v = q % kX16VecsPerGroup;
          const WeightT* at = w + g * group_elems + k * kX16Cols + v * W;
          if constexpr (kMode == kX16Fp8Widen) {
            // A group's stream moves 16 bytes a k (a line every 4), too slowly for the hardware prefetcher to
            // stay ahead with few rows: fetch 4 KB ahead (Zen 4, M = 1, gate_up 3072 x 576 from DRAM: 91 -> 79 us,
            // a decode token of the fp8 default model 8.8 -> 7.2-8.3 ms; bench/RESULTS.md 2026-12-05 17:41).
            if ((k & 3) == 0 && v == 0) __builtin_prefetch(at + 4096, 0, 1);
          }
          if constexpr (kMode == kX16F32) wv[q] = V::load(at);
          else if constexpr (kMode == kX16F16Widen) wv[q] = V::load_f16(at);
          else wv[q] = V::load_e4m3_low(at);
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const R xb = V::set1(xr[i][k]);
#pragma GCC unroll 8
          for (int q = 0; q < NV; ++q) acc[i * NV + q] = V::fmadd(xb, wv[q], acc[i * NV + q]);
        }
      }
    } else if constexpr (kMode == kX16Bf16Widen) {
      const uint16_t* w = static_cast<const uint16_t*>(a.w) + g0 * group_elems;  // [NG][K/2][16][2]
      const float* xr[MR];
      for (int i = 0; i < MR; ++i) xr[i] = a.x32 + (m + i) * a.x_stride;
      for (int64_t k = k_lo; k < k_hi; k += 2) {
        R we[NV], wo[NV];  // columns of each vector at k (even) and k + 1 (odd)
#pragma GCC unroll 8
        for (int q = 0; q < NV; ++q) {
          const int g = q / kX16VecsPerGroup, v = q % kX16VecsPerGroup;
          V::load_bf16_pairs(w + g * group_elems + k * kX16Cols + v * 2 * W, we[q], wo[q]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const R x0 = V::set1(xr[i][k]);
#pragma GCC unroll 8
          for (int q = 0; q < NV; ++q) acc[i * NV + q] = V::fmadd(x0, we[q], acc[i * NV + q]);
          const R x1 = V::set1(xr[i][k + 1]);
#pragma GCC unroll 8
          for (int q = 0; q < NV; ++q) acc[i * NV + q] = V::fmadd(x1, wo[q], acc[i * NV + q]);
        }
      }
    } else if constexpr (kMode == kX16Fp8Dot) {
      if constexpr (V::kHasFp8Bf16Quad && kX16VecsPerGroup == 1) {  // (16-lane traits only)
        const uint8_t* w = static_cast<const uint8_t*>(a.w) + g0 * group_elems;  // [NG][K][16] e4m3 bytes
        const uint16_t* xr[MR];
        for (int i = 0; i < MR; ++i) xr[i] = a.x16 + (m + i) * a.x_stride;
        for (int64_t k = k_lo; k < k_hi; k += 4) {  // (K % 4 == 0: the launcher's condition for this mode)
          typename V::RI w01[NV], w23[NV];  // column vector q's pairs (k, k+1) and (k+2, k+3)
#pragma GCC unroll 8
          for (int q = 0; q < NV; ++q) {
            const uint8_t* at = w + q * group_elems + k * kX16Cols;
            // The same k of the next panel (the groups after these, next in memory): a group is only K x 16
            // bytes, so each panel's streams would start cold (Zen 4, M = 1 from DRAM, bf16 x: gate_up 3072 x 576
            // 65 -> 54 us, qkv 960 x 576 22 -> 20 us; fetching 4 KB ahead in the stream instead, as kX16Fp8Widen
            // does, left them there).
            __builtin_prefetch(at + NV * group_elems, 0, 1);
            V::load_e4m3_bf16_quad(at, w01[q], w23[q]);
          }
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const auto x01 = V::broadcast_pair(xr[i] + k);
#pragma GCC unroll 8
            for (int q = 0; q < NV; ++q) acc[i * NV + q] = V::dot_bf16(acc[i * NV + q], x01, w01[q]);
            const auto x23 = V::broadcast_pair(xr[i] + k + 2);
#pragma GCC unroll 8
            for (int q = 0; q < NV; ++q) acc[i * NV + q] = V::dot_bf16(acc[i * NV + q], x23, w23[q]);
          }
        }
      }
    } else {
      if constexpr (V::kHasDotBf16) {
        const uint16_t* w = static_cast<const uint16_t*>(a.w) + g0 * group_elems;  // [NG][K/2][16][2]
        const uint16_t* xr[MR];
        for (int i = 0; i < MR; ++i) xr[i] = a.x16 + (m + i) * a.x_stride;
        for (int64_t k = k_lo; k < k_hi; k += 2) {
          typename V::RI wv[NV];
#pragma GCC unroll 8
          for (int q = 0; q < NV; ++q) {
            const int g = q / kX16VecsPerGroup, v = q % kX16VecsPerGroup;
            wv[q] = V::load_i(w + g * group_elems + k * kX16Cols + v * 2 * W);
          }
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const auto xb = V::broadcast_pair(xr[i] + k);
#pragma GCC unroll 8
            for (int q = 0; q < NV; ++q) acc[i * NV + q] = V::dot_bf16(acc[i * NV + q], xb, wv[q]);
          }
        }
      }
    }
    if constexpr (kBlockScaled) {  // this block's sums times its scale (one per 16-column group), into dst
      constexpr float kWiden = kMode == kX16Fp8Widen ? 256.f : 1.f;  // (load_e4m3_low's 2^-8)
#pragma GCC unroll 8
      for (int q = 0; q < NV; ++q) {
        const R scale = V::set1(a.block_scales[(g0 + q / kX16VecsPerGroup) * a.k_blocks + kb] * kWiden);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          float* out = dst + i * ds + q * W;
          V::store(out, kb == 0 ? V::mul(acc[i * NV + q], scale) : V::fmadd(acc[i * NV + q], scale, V::load(out)));
          acc[i * NV + q] = V::zero();
        }
      }
    }
  }  // (the pass over K, or its blocks)
  if constexpr (!kBlockScaled) {
    if constexpr (kMode == kX16Fp8Widen) {
#pragma GCC unroll 32
      for (int q = 0; q < MR * NV; ++q) acc[q] = V::mul(acc[q], V::set1(256.f));  // (load_e4m3_low's 2^-8)
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int q = 0; q < NV; ++q) V::store(dst + i * ds + q * W, acc[i * NV + q]);
  }
}

// The last MR_LEFT (< x16_rows) rows of a column panel, one tile of exactly that many rows.
template <int NG, int kMode, bool kBS, int kRest = x16_rows<kMode>() - 1>
inline void x16_rest(const LinearBlockArgs& a, int64_t m, int64_t rest, int64_t g, float* dst, int64_t ds) {
  if constexpr (kRest >= 1) {
    if (rest == kRest) x16_tile<kRest, NG, kMode, kBS>(a, m, g, dst, ds);
    else x16_rest<NG, kMode, kBS, kRest - 1>(a, m, rest, g, dst, ds);
  }
}

// Rows [m_begin, m_end) against the NG groups at g: the weight panel stays in cache across row tiles.
template <int NG, int kMode, bool kBS>
inline void x16_panel(const LinearBlockArgs& a, int64_t m_begin, int64_t m_end, int64_t g, float* dst,
                      int64_t ds) {
  int64_t m = m_begin;
  constexpr int MR = x16_rows<kMode>();
  for (; m + MR <= m_end; m += MR) x16_tile<MR, NG, kMode, kBS>(a, m, g, dst + (m - m_begin) * ds, ds);
  if (m < m_end) x16_rest<NG, kMode, kBS>(a, m, m_end - m, g, dst + (m - m_begin) * ds, ds);
}

// A LinearBlockFn over an x16 layout; n_begin and n_end are multiples of 16 (the launcher's tasks).
template <int kMode, bool kBS = false>
void x16_block(const LinearBlockArgs& a, int64_t m_begin, int64_t m_end, int64_t n_begin, int64_t n_end,
               float* dst, int64_t ds) {
  int64_t g = n_begin / kX16Cols;
  const int64_t g_end = n_end / kX16Cols;
  for (; g + kX16Groups <= g_end; g += kX16Groups)
    x16_panel<kX16Groups, kMode, kBS>(a, m_begin, m_end, g, dst + (g * kX16Cols - n_begin), ds);
  if constexpr (kX16Groups > 2) {
    if (g + 2 <= g_end) {
      x16_panel<2, kMode, kBS>(a, m_begin, m_end, g, dst + (g * kX16Cols - n_begin), ds);
      g += 2;
    }
  }
  if constexpr (kX16Groups > 1) {
    if (g < g_end) x16_panel<1, kMode, kBS>(a, m_begin, m_end, g, dst + (g * kX16Cols - n_begin), ds);
  }
}

void block_f32x16(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst,
                  int64_t ds) {
  x16_block<kX16F32>(a, m0, m1, n0, n1, dst, ds);
}
void block_bf16x16(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst,
                   int64_t ds) {
  x16_block<kX16Bf16Widen>(a, m0, m1, n0, n1, dst, ds);
}
void block_f16x16(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst,
                  int64_t ds) {
  x16_block<kX16F16Widen>(a, m0, m1, n0, n1, dst, ds);
}
void block_fp8x16(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst,
                  int64_t ds) {
  if (a.block_scales) x16_block<kX16Fp8Widen, true>(a, m0, m1, n0, n1, dst, ds);
  else x16_block<kX16Fp8Widen>(a, m0, m1, n0, n1, dst, ds);
}
void block_fp8x16_dot(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst,
                      int64_t ds) {
  if (a.block_scales) x16_block<kX16Fp8Dot, true>(a, m0, m1, n0, n1, dst, ds);
  else x16_block<kX16Fp8Dot>(a, m0, m1, n0, n1, dst, ds);
}
void block_bf16x16_dot(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst,
                       int64_t ds) {
  x16_block<kX16Bf16Dot>(a, m0, m1, n0, n1, dst, ds);
}

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
