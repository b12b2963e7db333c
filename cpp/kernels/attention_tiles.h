// The register tiles of the paged-attention kernel (attention_impl.h): S = Q . K^T for a few
// query rows against a block of keys, the online-softmax step of a row, acc += P . V, and the row
// loads, stores and bf16 widening around them. Written once against the vector trait V and
// compiled once per instruction set: include only from attention_impl.h, which is itself included
// by attention_<isa>.cc with PC_ISA_NAMESPACE and PC_VEC defined. Everything here lives in that
// per-ISA namespace and calls no shared inline function (see attention_kernel.h for why).
#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE and PC_VEC before including attention_tiles.h"
#endif

#include <cstdint>

#include "kernels/attention_kernel.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

using V = PC_VEC;
using R = V::R;
constexpr int W = V::W;

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
constexpr float kNegInf = -__builtin_inff();

inline R load_f(const float* p) { return V::load(p); }
inline R load_f(const uint16_t* p) { return V::load_bf16(p); }

// Blocks are scattered, so the hardware prefetcher stops at each block's end: while block i of a
// chunk is in use, ask for plane i of the next chunk (one chunk, ~64 keys, ahead), into L2
// (prefetcht1, not L1: with t0 hints the L1 fill buffers ran out). The tile loops below issue one
// line of it beside each line they load (prefetch_line_beside). History: one burst of 64 prefetches
// per 4 KB plane (the first version) left most of them waiting for a free miss slot; a key row (or
// NR rows) at a time (fp32, 104 sequences x 350 tokens, 2 threads: 3.94 -> 3.24 ms a layer) still
// stalled the loads behind each burst (perf, Zen 4); a line per load: fp32 workload attention
// 13.2 -> 11.3 s (Zen 4, 2026-12-02). prefetch_lines stays for the prefill staging path (one
// burst per plane, compute-bound).
inline void prefetch_lines(const char* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 2);
}
// The line of the next chunk's plane at element `index` (of `elem` bytes), issued beside the load
// of the same element of this plane.
inline void prefetch_line_beside(const char* pf, int64_t index, int64_t elem) {
  __builtin_prefetch(pf + index * elem, 0, 2);
}

// S[m + i, s_col + j] = Qs[m + i, :] . K[j, :] for i < MR, j < n; K fp32 or bf16 (widened here).
//   Qs [*, D] row stride D;  K [n, D] row stride D;  S [*, s_stride]
// Register tile: MR rows x NR keys, MR * NR (8 or 9) independent FMA chains to cover the FMA
// latency; horizontal sums 4 accumulators at a time.
template <int MR, int NR, int kD, typename T>
inline void qk_rows(const float* Qs, const T* K, float* S, int64_t m, int64_t n, int64_t D_rt,
                    int64_t s_stride, int64_t s_col, const char* pf) {
  const int64_t D = kD ? kD : D_rt;
  constexpr int kAcc = MR * NR;
  const float* q[MR];
  float* s[MR];
  for (int i = 0; i < MR; ++i) {
    q[i] = Qs + (m + i) * D;
    s[i] = S + (m + i) * s_stride + s_col;
  }
  int64_t j = 0;
  for (; j + NR <= n; j += NR) {
    const T* k = K + j * D;
    R acc[kAcc + 3];
#pragma GCC unroll 16
    for (int a = 0; a < kAcc + 3; ++a) acc[a] = V::zero();
    for (int64_t c = 0; c < D; c += W) {
      R x[MR];
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) x[i] = V::load(q[i] + c);
#pragma GCC unroll 8
      for (int t = 0; t < NR; ++t) {
        if (pf && (c * sizeof(T)) % 64 == 0) prefetch_line_beside(pf, (j + t) * D + c, sizeof(T));
        const R y = load_f(k + t * D + c);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) acc[i * NR + t] = V::mul_add(x[i], y, acc[i * NR + t]);
      }
    }
    if constexpr (NR % 4 == 0) {  // four keys of one row: one contiguous store
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
        for (int t = 0; t < NR; t += 4)
          V::reduce_add4(acc[i * NR + t], acc[i * NR + t + 1], acc[i * NR + t + 2], acc[i * NR + t + 3],
                         s[i] + j + t);
    } else if constexpr (NR == 2) {  // two keys of two rows
      float sums[4];
#pragma GCC unroll 4
      for (int i = 0; i < MR; i += 2) {
        V::reduce_add4(acc[i * 2], acc[i * 2 + 1], acc[i * 2 + 2], acc[i * 2 + 3], sums);  // acc[MR*2..] = 0
        s[i][j] = sums[0];
        s[i][j + 1] = sums[1];
        if (i + 1 < MR) {
          s[i + 1][j] = sums[2];
          s[i + 1][j + 1] = sums[3];
        }
      }
    } else {
      float sums[kAcc + 3];
#pragma GCC unroll 4
      for (int a = 0; a < kAcc; a += 4) V::reduce_add4(acc[a], acc[a + 1], acc[a + 2], acc[a + 3], sums + a);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int t = 0; t < NR; ++t) s[i][j + t] = sums[i * NR + t];
    }
  }
  for (; j < n; ++j) {
    const T* k = K + j * D;
    R acc[MR];
    for (int i = 0; i < MR; ++i) acc[i] = V::zero();
    for (int64_t c = 0; c < D; c += W) {
      const R y = load_f(k + c);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) acc[i] = V::mul_add(V::load(q[i] + c), y, acc[i]);
    }
    for (int i = 0; i < MR; ++i) s[i][j] = V::reduce_add(acc[i]);
  }
}

// acc[m + i, :] = acc[m + i, :] (* alpha[m + i] when alpha) + sum_j P[m + i, p_col + j] * Vb[j, :]
// for i < MR, j < n; Vb fp32 or bf16 (widened here).
//   P [*, s_stride];  Vb [n, D] row stride D;  acc [*, D]
// Register tile: MR rows x NV vectors of head_size (MR * NV = 8 FMA chains), then single vectors.
template <int MR, int NV, int kD, typename T>
inline void pv_rows(const float* P, const T* Vb, float* acc, const float* alpha, int64_t m, int64_t n,
                    int64_t D_rt, int64_t s_stride, int64_t p_col, const char* pf) {
  const int64_t D = kD ? kD : D_rt;
  const float* p[MR];
  float* a[MR];
  R scale[MR];
  for (int i = 0; i < MR; ++i) {
    p[i] = P + (m + i) * s_stride + p_col;
    a[i] = acc + (m + i) * D;
    scale[i] = V::set1(alpha ? alpha[m + i] : 1.f);
  }
  int64_t c = 0;
  for (; c + NV * W <= D; c += NV * W) {
    R r[MR][NV];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int u = 0; u < NV; ++u) {
        r[i][u] = V::load(a[i] + c + u * W);
        if (alpha) r[i][u] = V::mul(r[i][u], scale[i]);
      }
    for (int64_t j = 0; j < n; ++j) {
      R v[NV];
#pragma GCC unroll 4
      for (int u = 0; u < NV; ++u) {
        if (pf && ((c + u * W) * sizeof(T)) % 64 == 0) prefetch_line_beside(pf, j * D + c + u * W, sizeof(T));
        v[u] = load_f(Vb + j * D + c + u * W);
      }
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const R pj = V::set1(p[i][j]);
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u) r[i][u] = V::mul_add(pj, v[u], r[i][u]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int u = 0; u < NV; ++u) V::store(a[i] + c + u * W, r[i][u]);
  }
  for (; c < D; c += W) {  // head_size not a multiple of NV * W: the rest one vector at a time
    R r[MR];
    for (int i = 0; i < MR; ++i) r[i] = alpha ? V::mul(V::load(a[i] + c), scale[i]) : V::load(a[i] + c);
    for (int64_t j = 0; j < n; ++j) {
      if (pf && (c * sizeof(T)) % 64 == 0) prefetch_line_beside(pf, j * D + c, sizeof(T));
      const R v0 = load_f(Vb + j * D + c);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) r[i] = V::mul_add(V::set1(p[i][j]), v0, r[i]);
    }
    for (int i = 0; i < MR; ++i) V::store(a[i] + c, r[i]);
  }
}

// Online-softmax step of one row: scores s[0, n_visible) are live, s[n_visible, n_padded) are
// masked (set to -inf here, so exp gives exactly 0). Turns s into probabilities in place and
// returns the factor by which the row's accumulator must be rescaled.
inline float softmax_row(float* s, int64_t n_visible, int64_t n_padded, float* m_run, float* l_run) {
  for (int64_t j = n_visible; j < n_padded; ++j) s[j] = kNegInf;
  R mx = V::set1(kNegInf);
  for (int64_t j = 0; j < n_padded; j += W) mx = V::max(mx, V::load(s + j));
  const float m_old = *m_run;
  const float block_max = V::reduce_max(mx);
  const float m_new = block_max > m_old ? block_max : m_old;
  const float alpha = m_old == kNegInf ? 0.f : __builtin_expf(m_old - m_new);
  const R shift = V::set1(m_new);
  R sum = V::zero();
  for (int64_t j = 0; j < n_padded; j += W) {
    const R e = V::exp(V::sub(V::load(s + j), shift));
    V::store(s + j, e);
    sum = V::add(sum, e);
  }
  *m_run = m_new;
  *l_run = *l_run * alpha + V::reduce_add(sum);
  return alpha;
}

template <int kD>
inline void widen_rows(const uint16_t* src, float* dst, int64_t n, int64_t D_rt) {
  const int64_t count = n * (kD ? kD : D_rt);
  for (int64_t c = 0; c < count; c += W) V::store(dst + c, V::load_bf16(src + c));
}

template <int kD>
inline void widen_rows_fp8(const uint8_t* src, float* dst, int64_t n, int64_t D_rt, bool e4m3) {
  const int64_t count = n * (kD ? kD : D_rt);
  for (int64_t c = 0; c < count; c += W) V::store(dst + c, V::load_fp8(src + c, e4m3));
}

// fp8 rows as bf16 (every fp8 value is one exactly), for the pair-dot tiles.
template <int kD>
inline void narrow_rows_fp8(const uint8_t* src, uint16_t* dst, int64_t n, int64_t D_rt, bool e4m3) {
  V::fp8_rows_to_bf16(src, dst, n * (kD ? kD : D_rt), e4m3);
}

template <int kD>
inline void load_row(const void* src, DType dtype, float* dst, float scale, int64_t D_rt) {
  const int64_t D = kD ? kD : D_rt;
  const R sc = V::set1(scale);
  if (dtype == DType::kFloat32) {
    const float* f = static_cast<const float*>(src);
    for (int64_t c = 0; c < D; c += W) V::store(dst + c, V::mul(V::load(f + c), sc));
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(src);
    for (int64_t c = 0; c < D; c += W) V::store(dst + c, V::mul(V::load_bf16(h + c), sc));
  }
}

template <int kD>
inline void store_row(const float* src, float scale, void* dst, DType dtype, int64_t D_rt) {
  const int64_t D = kD ? kD : D_rt;
  const R sc = V::set1(scale);
  if (dtype == DType::kFloat32) {
    float* f = static_cast<float*>(dst);
    for (int64_t c = 0; c < D; c += W) V::store(f + c, V::mul(V::load(src + c), sc));
  } else {
    uint16_t* h = static_cast<uint16_t*>(dst);
    for (int64_t c = 0; c < D; c += W) V::store_bf16(h + c, V::mul(V::load(src + c), sc));
  }
}

// Calls f(m, mr) over rows [m0, M) in tiles of kTile rows, then once with the remainder (< kTile).
template <int kTile, typename F>
inline void for_row_tiles(int64_t m0, int64_t M, F&& f) {
  int64_t m = m0;
  for (; m + kTile <= M; m += kTile) f(m, kTile);
  if (m < M) f(m, static_cast<int>(M - m));
}


// Runtime row count (1..4) to the register-tile template: QK tiles of 1x8, 2x4, 3x2, 4x2 keys;
// PV tiles of 1x4, 2x4, 3x2, 4x2 vectors.
template <int kD, typename T>
struct Tiles {
  static void qk(int mr, const float* Qs, const T* K, float* S, int64_t m, int64_t n, int64_t D,
                 int64_t s_stride, int64_t col, const char* pf) {
    switch (mr) {
      case 4: qk_rows<4, 2, kD>(Qs, K, S, m, n, D, s_stride, col, pf); break;
      case 3: qk_rows<3, 2, kD>(Qs, K, S, m, n, D, s_stride, col, pf); break;
      case 2: qk_rows<2, 4, kD>(Qs, K, S, m, n, D, s_stride, col, pf); break;
      default: qk_rows<1, 8, kD>(Qs, K, S, m, n, D, s_stride, col, pf); break;
    }
  }
  static void pv(int mr, const float* P, const T* Vb, float* acc, const float* alpha, int64_t m, int64_t n,
                 int64_t D, int64_t s_stride, int64_t col, const char* pf) {
    switch (mr) {
      case 4: pv_rows<4, 2, kD>(P, Vb, acc, alpha, m, n, D, s_stride, col, pf); break;
      case 3: pv_rows<3, 2, kD>(P, Vb, acc, alpha, m, n, D, s_stride, col, pf); break;
      case 2: pv_rows<2, 4, kD>(P, Vb, acc, alpha, m, n, D, s_stride, col, pf); break;
      default: pv_rows<1, 4, kD>(P, Vb, acc, alpha, m, n, D, s_stride, col, pf); break;
    }
  }
};

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
