// The linear-layer kernel, written once against a vector trait V and compiled once per instruction
// set: linear_<isa>.cc defines PC_ISA_NAMESPACE and PC_VEC and includes one trait header
// (vec_*.h, which defines the trait inside that namespace), then this file. Everything here lives in the per-ISA
// namespace and calls no shared inline function (see attention_kernel.h for why).
//
// Dot-product form over the checkpoint layout W [N, K] (no packing): a register tile of MR rows of
// x by NR rows of W keeps MR x NR vector accumulators, walks K one chunk at a time and folds each
// accumulator horizontally at the end:
//
//            k ->  chunk (W lanes; 2 W for bf16 weights)
//   x rows  m   [=====|=====|=====| ... |tail]      MR rows, from L1 (fp32 scratch or x itself)
//   W rows  n   [=====|=====|=====| ... |tail]      NR rows, streamed from memory once
//   acc[i][j] += x[m+i, chunk] * W[n+j, chunk]       dst[i][j] = reduce_add(acc[i][j]) + tail
//
// bf16 weights: a chunk of 2 W bf16 is one W x 32-bit load; its even elements are the load << 16
// and its odd ones the load & 0xffff0000 (bf16 is the top half of an fp32), matched by x stored in
// pair order (linear_kernel.h). With AVX512-BF16 and bf16 x, vdpbf16ps does pairs directly.
// fp16 weights (kF16): a chunk of W fp16 widened by one conversion (F16C) against x in natural order,
// otherwise kF32's loop: the same sums in the same order as the fp32 copy of the weights.
// fp8 e4m3 weights (kFp8): likewise a chunk of W bytes widened exactly, at 2^-8 of their values (an fp16 read
// of the byte's bits: V::load_e4m3_low), each sum then times 2^8: the fp32 copy's sums, bit for bit unless
// some product or partial sum is under 2^-118 (subnormal at 2^-8 of it). The row scales are the epilogue's.
#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE and PC_VEC before including linear_impl.h"
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/linear_kernel.h"
#include "kernels/linear_scalar_impl.h"

#ifndef PC_LINEAR_PREFETCH
#define PC_LINEAR_PREFETCH 1
#endif

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

using V = PC_VEC;
using R = V::R;
constexpr int W = V::W;

enum Mode { kF32 = 0, kBf16Pairs = 1, kBf16Dot = 2, kF16 = 3, kFp8 = 4 };

// Register tiles: MR rows of x x NR rows of W. Accumulators + x registers held across the NR
// weight rows + the weight being widened must fit the register file (16 on AVX2, 32 on AVX-512).
// Past kMaxRows, rows are done kMaxRows at a time.
constexpr int kMaxRows = V::kRegs >= 32 ? 4 : 3;
constexpr int tile_cols(int mode, int rows) {
  if (V::kRegs >= 32) return rows <= 2 ? 8 : rows == 3 ? 6 : (mode == kBf16Pairs ? 4 : 5);  // (kF16, kFp8: kF32's)
  if (mode == kBf16Pairs) return rows == 1 ? 8 : rows == 2 ? 4 : 3;
  return rows == 1 ? 8 : 4;
}

// x value k of row `row` as the scalar tail reads it (the tail is in natural order in every layout).
template <int kMode>
inline float x_at(const LinearBlockArgs& a, int64_t row, int64_t k) {
  if constexpr (kMode == kBf16Dot) return bf16_scalar(a.x16[row * a.x_stride + k]);
  else return a.x32[row * a.x_stride + k];
}
template <int kMode>
inline float w_at(const LinearBlockArgs& a, int64_t row, int64_t k) {
  if constexpr (kMode == kF32) return static_cast<const float*>(a.w)[row * a.K + k];
  else if constexpr (kMode == kF16) return f16_scalar(static_cast<const uint16_t*>(a.w)[row * a.K + k]);
  else if constexpr (kMode == kFp8) return e4m3_scalar(static_cast<const uint8_t*>(a.w)[row * a.K + k]);
  else return bf16_scalar(static_cast<const uint16_t*>(a.w)[row * a.K + k]);
}

// A slice [k0, k1) of the vector part of K (whole chunks); `first` stores the tile's sums, later
// slices add to them; `last` also adds the scalar tail past the vector part.
struct KSlice {
  int64_t k0, k1;
  bool first, last;
};

// Elements of K per slice: an x block (kMaxRows rows, fp32) and a weight tile stay in L1 together
// (K = 1536 in one slice ran at 60% of the speed of K = 576 for lack of it).
constexpr int64_t kKSlice = 512;
constexpr int64_t kKSliceMax = 768;  // up to this, K is one slice

template <int kMode>
constexpr int chunk_of() { return kMode == kF32 || kMode == kF16 || kMode == kFp8 ? W : 2 * W; }

// dst[i * ds + j] (=, or += after the first slice) x[m + i, k slice] . W[n + j, k slice], i < MR, j < NR.
template <int MR, int NR, int kMode>
inline void tile(const LinearBlockArgs& a, int64_t m, int64_t n, float* dst, int64_t ds, const KSlice& ks) {
  const int64_t K = a.K;
  constexpr int kChunk = chunk_of<kMode>();
  const int64_t k_vec = K - K % kChunk;
  constexpr int kAcc = MR * NR;
  // Few rows of x: the tile streams its weights once; fetch the next tile's rows (they follow
  // these in memory) while this one runs, since rows of ~1-2 KB are too short for the hardware
  // prefetcher to ramp up on each.
  constexpr bool kPrefetch = PC_LINEAR_PREFETCH;
  constexpr int64_t kLineFloats = 16;  // a 64-byte line of fp32 (32 bf16)
  R acc[kAcc];
#pragma GCC unroll 32
  for (int q = 0; q < kAcc; ++q) acc[q] = V::zero();

  if constexpr (kMode == kF32 || kMode == kF16 || kMode == kFp8) {
    using WeightT = std::conditional_t<kMode == kF32, float, std::conditional_t<kMode == kF16, uint16_t, uint8_t>>;
    constexpr int64_t kLineElems = 64 / sizeof(WeightT);
    const float* xr[MR];
    const WeightT* wr[NR];
    for (int i = 0; i < MR; ++i) xr[i] = a.x32 + (m + i) * a.x_stride;
    for (int j = 0; j < NR; ++j) wr[j] = static_cast<const WeightT*>(a.w) + (n + j) * K;
    for (int64_t k = ks.k0; k < ks.k1; k += kChunk) {
      if constexpr (kPrefetch) {
        if ((k & (kLineElems - 1)) == 0)
          for (int j = 0; j < NR; ++j) __builtin_prefetch(wr[j] + 2 * NR * K + k, 0, 1);
      }
      R xv[MR];
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) xv[i] = V::load(xr[i] + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        R wv;
        if constexpr (kMode == kF32) wv = V::load(wr[j] + k);
        else if constexpr (kMode == kF16) wv = V::load_f16(wr[j] + k);
        else wv = V::load_e4m3_low(wr[j] + k);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) acc[i * NR + j] = V::fmadd(xv[i], wv, acc[i * NR + j]);
      }
    }
  } else if constexpr (kMode == kBf16Pairs) {
    const float* xr[MR];
    const uint16_t* wr[NR];
    for (int i = 0; i < MR; ++i) xr[i] = a.x32 + (m + i) * a.x_stride;
    for (int j = 0; j < NR; ++j) wr[j] = static_cast<const uint16_t*>(a.w) + (n + j) * K;
    for (int64_t k = ks.k0; k < ks.k1; k += kChunk) {
      if constexpr (kPrefetch) {
        if ((k & (2 * kLineFloats - 1)) == 0)
          for (int j = 0; j < NR; ++j) __builtin_prefetch(wr[j] + 2 * NR * K + k, 0, 1);
      }
      R xe[MR], xo[MR];
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        xe[i] = V::load(xr[i] + k);
        xo[i] = V::load(xr[i] + k + W);
      }
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        R we, wo;
        V::load_bf16_pairs(wr[j] + k, we, wo);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          acc[i * NR + j] = V::fmadd(xe[i], we, acc[i * NR + j]);
          acc[i * NR + j] = V::fmadd(xo[i], wo, acc[i * NR + j]);
        }
      }
    }
  } else {
    if constexpr (V::kHasDotBf16) {
      const uint16_t* xr[MR];
      const uint16_t* wr[NR];
      for (int i = 0; i < MR; ++i) xr[i] = a.x16 + (m + i) * a.x_stride;
      for (int j = 0; j < NR; ++j) wr[j] = static_cast<const uint16_t*>(a.w) + (n + j) * K;
      for (int64_t k = ks.k0; k < ks.k1; k += kChunk) {
        if constexpr (kPrefetch) {  // as the other modes (measured: 5 rows of a bf16 gate_up -28%)
          if ((k & (2 * kLineFloats - 1)) == 0)
            for (int j = 0; j < NR; ++j) __builtin_prefetch(wr[j] + 2 * NR * K + k, 0, 1);
        }
        typename V::RI xv[MR];
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) xv[i] = V::load_i(xr[i] + k);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) {
          const typename V::RI wv = V::load_i(wr[j] + k);
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) acc[i * NR + j] = V::dot_bf16(acc[i * NR + j], xv[i], wv);
        }
      }
    }
  }

  float sums[kAcc + 3];
  int q = 0;
#pragma GCC unroll 8
  for (; q + 4 <= kAcc; q += 4) V::reduce_add4(acc[q], acc[q + 1], acc[q + 2], acc[q + 3], sums + q);
#pragma GCC unroll 4
  for (; q < kAcc; ++q) sums[q] = V::reduce_add(acc[q]);
  if constexpr (kMode == kFp8)
    for (q = 0; q < kAcc; ++q) sums[q] *= 256.f;  // (V::load_e4m3_low's 2^-8, exactly)
  if (ks.last && k_vec < K) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        float s = 0.f;
        for (int64_t k = k_vec; k < K; ++k) s += x_at<kMode>(a, m + i, k) * w_at<kMode>(a, n + j, k);
        sums[i * NR + j] += s;
      }
  }
  if (ks.first) {
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) dst[i * ds + j] = sums[i * NR + j];
  } else {
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) dst[i * ds + j] += sums[i * NR + j];
  }
}

// Rows [m, m + MR) against W rows [n_begin, n_end): full tiles, then 4-, 2- and 1-column tiles.
template <int MR, int kMode>
inline void row_panel(const LinearBlockArgs& a, int64_t m, int64_t n_begin, int64_t n_end, float* dst,
                      int64_t ds, const KSlice& ks) {
  constexpr int NR = tile_cols(kMode, MR);
  int64_t n = n_begin;
  for (; n + NR <= n_end; n += NR) tile<MR, NR, kMode>(a, m, n, dst + (n - n_begin), ds, ks);
  if constexpr (NR > 4) {
    if (n + 4 <= n_end) {
      tile<MR, 4, kMode>(a, m, n, dst + (n - n_begin), ds, ks);
      n += 4;
    }
  }
  if constexpr (NR > 2) {
    if (n + 2 <= n_end) {
      tile<MR, 2, kMode>(a, m, n, dst + (n - n_begin), ds, ks);
      n += 2;
    }
  }
  if constexpr (NR > 1) {
    if (n < n_end) tile<MR, 1, kMode>(a, m, n, dst + (n - n_begin), ds, ks);
  }
}

// Every row [m_begin, m_end) against the NR weight rows at n: kMaxRows-row tiles, then the rest.
template <int NR, int kMode>
inline void column_panel(const LinearBlockArgs& a, int64_t m_begin, int64_t m_end, int64_t n, float* dst,
                         int64_t ds, const KSlice& ks) {
  int64_t m = m_begin;
  for (; m + kMaxRows <= m_end; m += kMaxRows)
    tile<kMaxRows, NR, kMode>(a, m, n, dst + (m - m_begin) * ds, ds, ks);
  const int64_t rest = m_end - m;
  float* d = dst + (m - m_begin) * ds;
  if (kMaxRows > 3 && rest == 3) tile<3, NR, kMode>(a, m, n, d, ds, ks);
  else if (rest == 2) tile<2, NR, kMode>(a, m, n, d, ds, ks);
  else if (rest == 1) tile<1, NR, kMode>(a, m, n, d, ds, ks);
}

// The K slices of a call: one when K is short, else kKSlice-element slices (whole chunks).
template <int kMode>
inline int64_t num_slices(int64_t K) {
  const int64_t k_vec = K - K % chunk_of<kMode>();
  return k_vec <= kKSliceMax ? 1 : (k_vec + kKSlice - 1) / kKSlice;
}
template <int kMode>
inline KSlice slice(int64_t K, int64_t s, int64_t count) {
  const int64_t k_vec = K - K % chunk_of<kMode>();
  if (count == 1) return {0, k_vec, true, true};
  const int64_t k0 = s * kKSlice, k1 = s + 1 == count ? k_vec : k0 + kKSlice;
  return {k0, k1, s == 0, s + 1 == count};
}

template <int kMode>
void block(const LinearBlockArgs& a, int64_t m_begin, int64_t m_end, int64_t n_begin, int64_t n_end, float* dst,
           int64_t ds) {
  const int64_t slices = num_slices<kMode>(a.K);
  if (a.n_outer && m_end - m_begin > kMaxRows) {
    // Few rows, many weights: each weight tile is read from memory once and used for every row
    // while it sits in L1; x (a few rows) stays in L1/L2. The task's weight rows stream in order.
    constexpr int NR = tile_cols(kMode, kMaxRows);
    int64_t n = n_begin;
    for (; n + NR <= n_end; n += NR)
      for (int64_t s = 0; s < slices; ++s)
        column_panel<NR, kMode>(a, m_begin, m_end, n, dst + (n - n_begin), ds, slice<kMode>(a.K, s, slices));
    for (; n + 2 <= n_end; n += 2)
      for (int64_t s = 0; s < slices; ++s)
        column_panel<2, kMode>(a, m_begin, m_end, n, dst + (n - n_begin), ds, slice<kMode>(a.K, s, slices));
    if (n < n_end)
      for (int64_t s = 0; s < slices; ++s)
        column_panel<1, kMode>(a, m_begin, m_end, n, dst + (n - n_begin), ds, slice<kMode>(a.K, s, slices));
    return;
  }
  // Many rows (or one row block): x rows kMaxRows at a time from L1, against the task's weight
  // rows held in L2, one K slice at a time.
  for (int64_t s = 0; s < slices; ++s) {
    const KSlice ks = slice<kMode>(a.K, s, slices);
    int64_t m = m_begin;
    for (; m + kMaxRows <= m_end; m += kMaxRows)
      row_panel<kMaxRows, kMode>(a, m, n_begin, n_end, dst + (m - m_begin) * ds, ds, ks);
    const int64_t rest = m_end - m;
    float* d = dst + (m - m_begin) * ds;
    if (kMaxRows > 3 && rest == 3) row_panel<3, kMode>(a, m, n_begin, n_end, d, ds, ks);
    else if (rest == 2) row_panel<2, kMode>(a, m, n_begin, n_end, d, ds, ks);
    else if (rest == 1) row_panel<1, kMode>(a, m, n_begin, n_end, d, ds, ks);
  }
}

void block_f32(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst, int64_t ds) {
  block<kF32>(a, m0, m1, n0, n1, dst, ds);
}
void block_bf16(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst, int64_t ds) {
  block<kBf16Pairs>(a, m0, m1, n0, n1, dst, ds);
}
void block_f16(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst, int64_t ds) {
  block<kF16>(a, m0, m1, n0, n1, dst, ds);
}
void block_fp8(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst, int64_t ds) {
  block<kFp8>(a, m0, m1, n0, n1, dst, ds);
}
void block_bf16_dot(const LinearBlockArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* dst,
                    int64_t ds) {
  block<kBf16Dot>(a, m0, m1, n0, n1, dst, ds);
}

// -- bandwidth probe ------------------------------------------------------------------------------

float read(const void* data, int64_t bytes) {
  const float* p = static_cast<const float*>(data);
  const int64_t n = bytes / 4;
  R a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = V::add(a0, V::load(p + i));
    a1 = V::add(a1, V::load(p + i + W));
    a2 = V::add(a2, V::load(p + i + 2 * W));
    a3 = V::add(a3, V::load(p + i + 3 * W));
  }
  float s = V::reduce_add(V::add(V::add(a0, a1), V::add(a2, a3)));
  for (; i < n; ++i) s += p[i];
  return s;
}

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore

#include "kernels/dense_x16_impl.h"
#include "kernels/linear_epilogue_impl.h"
#include "kernels/norm_impl.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

// Rows in WeightFormat order; the quantized formats are quant_linear.h's (empty rows here).
const LinearIsaKernels kKernels = {
    W,
    {
        /* kDenseF32 */ {&block_f32, LinearXLayout::kF32Natural, nullptr},
        /* kDenseBf16 */ {&block_bf16, LinearXLayout::kF32PairOrder, V::kHasDotBf16 ? &block_bf16_dot : nullptr},
        {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {},  // kInt8PerChannel .. kQ6_Kx16: quant_linear.h's
        /* kDenseF32x16 */ {&block_f32x16, LinearXLayout::kF32Natural, nullptr},
        /* kDenseBf16x16 */ {&block_bf16x16, LinearXLayout::kF32Natural,
                             V::kHasDotBf16 ? &block_bf16x16_dot : nullptr},
        {},  // kInt8PerChannelX16: quant_linear.h's
        /* kDenseF16 */ {&block_f16, LinearXLayout::kF32Natural, nullptr},
        /* kDenseF16x16 */ {&block_f16x16, LinearXLayout::kF32Natural, nullptr},
        /* kDenseFp8E4M3 */ {&block_fp8, LinearXLayout::kF32Natural, nullptr},
        /* kDenseFp8E4M3x16 */ {&block_fp8x16, LinearXLayout::kF32Natural,
                                V::kHasFp8Bf16Quad ? &block_fp8x16_dot : nullptr},
    },
    &epilogue,
    &read,
    &rms_norm_rows,
    &rotary_rows};

const LinearIsaKernels& linear_kernels() { return kKernels; }

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
