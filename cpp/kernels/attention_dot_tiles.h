// The paged-attention tiles for a bf16 cache on a CPU with pair dot products
// (vdpbf16ps, V::kHasDotBf16, 16 lanes): the scores and the value sums take bf16 operands as they
// are, two products per fp32 lane, instead of widening every K/V element to fp32 first.
//
//   scores  S[m, j] = scale * (q[m] . K[j])   q, K bf16 (an fp32 query rounded once); fp32 sums;
//                                             16 keys' sums reduced at once
//   values  acc[m] += P[m, j] V[j] + P[m, j+1] V[j+1]   P rounded to bf16 (as flash attention's
//                                                       P . V GEMM), V rows j, j+1 paired per lane
//
// The value sums land in a fixed permutation of each 32-element group of acc (the order
// V::interleave_bf16 pairs two rows in): unpermute_pairs puts a row back once, when it is written.
// Include only from attention_impl.h (after attention_tiles.h), in a per-ISA namespace.
#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE and PC_VEC before including attention_dot_tiles.h"
#endif

#include <cstdint>
#include <cstring>

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

// A query row as bf16, unscaled: copied when it is bf16, rounded to nearest even when fp32.
template <int kD>
inline void load_row_bf16(const void* src, DType dtype, uint16_t* dst, int64_t D_rt) {
  const int64_t D = kD ? kD : D_rt;
  if (dtype == DType::kBFloat16) {
    std::memcpy(dst, src, D * sizeof(uint16_t));
    return;
  }
  const float* f = static_cast<const float*>(src);
  for (int64_t c = 0; c < D; c += W) V::store_bf16(dst + c, V::load(f + c));
}

// s[j] = scale * (qb . K[j]) for j < n <= 16:  qb [D] bf16;  K [n, D] bf16 row stride D;  s [n].
// One accumulator per key (16 independent dot-product chains), then one 16-way reduction tree.
// pf: the same keys' rows in the next chunk (nullptr: none), prefetched one line beside each line
// loaded here: a burst of a plane's 32-64 prefetches at once filled the miss buffers and stalled
// the loads behind them (perf, Qwen3 shapes on the Zen 4).
template <int kD, typename Vec = V>
inline void qk_dot_row(const uint16_t* qb, const uint16_t* K, int64_t n, int64_t D_rt, float scale, float* s,
                       const char* pf) {
  const int64_t D = kD ? kD : D_rt;
  using RI = typename Vec::RI;
  typename Vec::R acc[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) acc[t] = Vec::zero();
  if (n == 16) {
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) {  // key rows in memory order
#pragma GCC unroll 8
      for (int64_t c = 0; c < D; c += 2 * Vec::W) {  // 2 W bf16 = one 64-byte line
        if (pf) __builtin_prefetch(pf + (t * D + c) * 2, 0, 2);
        acc[t] = Vec::dot_bf16(acc[t], Vec::load_i(qb + c), Vec::load_i(K + t * D + c));
      }
    }
    Vec::store(s, Vec::mul(Vec::reduce_add16(acc), Vec::set1(scale)));
    return;
  }
  for (int64_t c = 0; c < D; c += 2 * Vec::W) {  // a block's last keys: rows past n are never read
    const RI q = Vec::load_i(qb + c);
    for (int64_t t = 0; t < n; ++t) acc[t] = Vec::dot_bf16(acc[t], q, Vec::load_i(K + t * D + c));
  }
  float sums[16];
  Vec::store(sums, Vec::mul(Vec::reduce_add16(acc), Vec::set1(scale)));
  std::memcpy(s, sums, n * sizeof(float));
}

// r[i][u] += x[u] . pair[i] (pairwise), for the MR x NV register tile of pv_dot_tile.
template <int MR, int NV, typename Vec>
__attribute__((always_inline)) inline void pv_dot_step(typename Vec::R (&r)[MR][NV], const typename Vec::RI* x,
                                                       const typename Vec::RI* pair) {
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) r[i][u] = Vec::dot_bf16(r[i][u], x[u], pair[i]);
}

// acc[m + i, c .. c + 16 NV) = acc (* alpha[m + i] when alpha) + sum_{j < n} P[m + i, j] Vb[j, c ..],
// in the pair permutation, for i < MR:
//   Pb [*, s_stride] bf16 probabilities (column p_col = key 0);  Vb [n, D] bf16;  acc [*, D] fp32.
// Register tile: MR rows x NV vectors (NV = 4: 64 elements of a row; 2: the last 32).
template <int MR, int NV, typename Vec = V>
inline void pv_dot_tile(const uint16_t* Pb, const uint16_t* Vb, float* acc, const float* alpha, int64_t m,
                        int64_t n, int64_t D, int64_t s_stride, int64_t p_col, int64_t c, const char* pf) {
  using RI = typename Vec::RI;
  using Rv = typename Vec::R;
  constexpr int W = Vec::W;
  const uint16_t* p[MR];
  float* a[MR];
  Rv r[MR][NV];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    p[i] = Pb + (m + i) * s_stride + p_col;
    a[i] = acc + (m + i) * D + c;
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) {
      r[i][u] = Vec::load(a[i] + u * W);
      if (alpha) r[i][u] = Vec::mul(r[i][u], Vec::set1(alpha[m + i]));
    }
  }
  RI x[NV], pair[MR];
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {  // keys j, j + 1
    const uint16_t* v0 = Vb + j * D + c;
#pragma GCC unroll 2
    for (int h = 0; h < NV / 2; ++h) {
      if (pf) {  // the lines of the next chunk's plane beside the two loaded here (see qk_dot_row)
        __builtin_prefetch(pf + (j * D + c + h * 2 * W) * 2, 0, 2);
        __builtin_prefetch(pf + ((j + 1) * D + c + h * 2 * W) * 2, 0, 2);
      }
      Vec::interleave_bf16(Vec::load_i(v0 + h * 2 * W), Vec::load_i(v0 + D + h * 2 * W), x[2 * h], x[2 * h + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) pair[i] = Vec::broadcast_pair(p[i] + j);  // (P[j], P[j + 1])
    pv_dot_step<MR, NV, Vec>(r, x, pair);
  }
  if (j < n) {  // odd n: the last key with a zero partner (the row past n may hold anything, and
                // P[j + 1] may lie past the row)
    const uint16_t* v0 = Vb + j * D + c;
    for (int h = 0; h < NV / 2; ++h)
      Vec::interleave_bf16(Vec::load_i(v0 + h * 2 * W), Vec::zero_i(), x[2 * h], x[2 * h + 1]);
    for (int i = 0; i < MR; ++i) {
      const uint16_t last[2] = {p[i][j], 0};
      pair[i] = Vec::broadcast_pair(last);
    }
    pv_dot_step<MR, NV, Vec>(r, x, pair);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) Vec::store(a[i] + u * W, r[i][u]);
}

// All of a row tile's value sums for one block: 64-element groups, then a last 32 (D % 64 == 32).
template <int MR, typename Vec = V>
inline void pv_dot_rows(const uint16_t* Pb, const uint16_t* Vb, float* acc, const float* alpha, int64_t m,
                        int64_t n, int64_t D, int64_t s_stride, int64_t p_col, const char* pf) {
  int64_t c = 0;
  for (; c + 64 <= D; c += 64)
    pv_dot_tile<MR, 4, Vec>(Pb, Vb, acc, alpha, m, n, D, s_stride, p_col, c, pf);
  if (c < D) pv_dot_tile<MR, 2, Vec>(Pb, Vb, acc, alpha, m, n, D, s_stride, p_col, c, pf);
}

template <typename Vec = V>
inline void pv_dot(int mr, const uint16_t* Pb, const uint16_t* Vb, float* acc, const float* alpha, int64_t m,
                   int64_t n, int64_t D, int64_t s_stride, int64_t p_col, const char* pf) {
  switch (mr) {
    case 4: pv_dot_rows<4, Vec>(Pb, Vb, acc, alpha, m, n, D, s_stride, p_col, pf); break;
    case 3: pv_dot_rows<3, Vec>(Pb, Vb, acc, alpha, m, n, D, s_stride, p_col, pf); break;
    case 2: pv_dot_rows<2, Vec>(Pb, Vb, acc, alpha, m, n, D, s_stride, p_col, pf); break;
    default: pv_dot_rows<1, Vec>(Pb, Vb, acc, alpha, m, n, D, s_stride, p_col, pf); break;
  }
}

// A row of acc back in element order: in each 32-element group, position p < 16 holds element
// 8 (p / 4) + p % 4 and position 16 + p holds element 8 (p / 4) + 4 + p % 4 (interleave_bf16's pairs).
inline void unpermute_pairs(float* row, int64_t D) {
  float group[32];
  for (int64_t c = 0; c < D; c += 32) {
    std::memcpy(group, row + c, sizeof group);
    for (int p = 0; p < 16; ++p) {
      row[c + 8 * (p / 4) + p % 4] = group[p];
      row[c + 8 * (p / 4) + 4 + p % 4] = group[16 + p];
    }
  }
}

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
