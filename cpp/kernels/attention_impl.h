// The paged-attention work-item kernel, written once against a vector trait V (simd_*.h) and
// compiled once per instruction set: attention_<isa>.cc defines PC_ISA_NAMESPACE and PC_VEC, then
// includes this file. Everything here lives in that per-ISA namespace and calls no shared inline
// function (see attention_kernel.h for why).
//
// One work item = a tile of M = rows x group query vectors (all query heads of one kv head for a
// few query rows) against the keys of one sequence, a chunk of whole blocks (~64 keys) at a time,
// with an online softmax:
//
//   for each chunk of K/V blocks in the item's key range (block_size keys of head_size each):
//     S[M, n]  = Qs[M, D] . K[n, D]^T          (Qs pre-scaled; dot products, MR rows x NR keys per
//                                              register tile, horizontal sums 4 at a time)
//     per row: mask keys past the row's position, m' = max(m, max S), p = exp(S - m'),
//              l = l * exp(m - m') + sum p
//     acc[M, D] = acc * exp(m - m') + P[M, n] . V[n, D]   (MR rows x NV vectors per register tile)
//
// bf16 blocks are widened to fp32 in registers when a tile has at most 4 rows (decode), or once
// per chunk into a per-thread buffer for larger tiles (prefill); fp32 blocks are read in place.
#ifndef PC_ISA_NAMESPACE
#error "define PC_ISA_NAMESPACE and PC_VEC before including attention_impl.h"
#endif

#include <cstdint>
#include <type_traits>

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

// Blocks are scattered, so the hardware prefetcher stops at each block's end: while block i of a
// chunk is in use, ask for plane i of the next chunk (one chunk, ~64 keys, ahead), into L2
// (prefetcht1, not L1: with t0 hints the L1 fill buffers ran out). The tile loops below issue the
// prefetch a key row at a time, interleaved with the FMAs that use the current plane: one burst of
// 64 prefetches per 4 KB plane (the first version) left most of them waiting for a free miss slot.
// Measured (fp32, 104 sequences x 350 tokens, 2 threads, alternating builds): 3.94 -> 3.24 ms a
// layer; the 64-request throughput benchmark 154 -> 169 output tok/s.
inline void prefetch_lines(const char* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 2);
}
inline R load_f(const uint16_t* p) { return V::load_bf16(p); }

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
    if (pf) prefetch_lines(pf + j * D * static_cast<int64_t>(sizeof(T)), NR * D * static_cast<int64_t>(sizeof(T)));
    R acc[kAcc + 3];
#pragma GCC unroll 16
    for (int a = 0; a < kAcc + 3; ++a) acc[a] = V::zero();
    for (int64_t c = 0; c < D; c += W) {
      R x[MR];
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) x[i] = V::load(q[i] + c);
#pragma GCC unroll 8
      for (int t = 0; t < NR; ++t) {
        const R y = load_f(k + t * D + c);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) acc[i * NR + t] = V::fmadd(x[i], y, acc[i * NR + t]);
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
      for (int i = 0; i < MR; ++i) acc[i] = V::fmadd(V::load(q[i] + c), y, acc[i]);
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
    const bool first_pass = pf && c == 0;  // spread the next plane's prefetch over the first pass
    for (int64_t j = 0; j < n; ++j) {
      if (first_pass) prefetch_lines(pf + j * D * static_cast<int64_t>(sizeof(T)), D * static_cast<int64_t>(sizeof(T)));
      R v[NV];
#pragma GCC unroll 4
      for (int u = 0; u < NV; ++u) v[u] = load_f(Vb + j * D + c + u * W);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const R pj = V::set1(p[i][j]);
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u) r[i][u] = V::fmadd(pj, v[u], r[i][u]);
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
      const R v0 = load_f(Vb + j * D + c);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) r[i] = V::fmadd(V::set1(p[i][j]), v0, r[i]);
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

template <int kD>
void attention_item(const PagedAttentionParams& p, const AttentionWorkItem& item,
                    const AttentionScratchLayout& layout, float* scratch,
                    const AttentionPartials& partials) {
  const int64_t D = kD ? kD : p.head_size;
  const int64_t BS = p.block_size;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t g = item.kv_head;
  const int64_t q_begin = p.query_start_loc[item.seq];
  const int64_t q_len = p.query_start_loc[item.seq + 1] - q_begin;
  const int64_t first_pos = p.seq_lens[item.seq] - q_len + item.row_begin;  // position of tile row 0
  const int64_t rows = item.row_end - item.row_begin;
  const int64_t M = rows * group;
  const int64_t s_stride = layout.s_stride;
  auto qk_dispatch = [](int mr, const float* Qs_, const auto* K, float* S_, int64_t m, int64_t n, int64_t D_,
                        int64_t stride, int64_t col, const char* pf) {
    using T = typename std::remove_const<typename std::remove_pointer<decltype(K)>::type>::type;
    Tiles<kD, T>::qk(mr, Qs_, K, S_, m, n, D_, stride, col, pf);
  };
  auto pv_dispatch = [](int mr, const float* P, const auto* Vb, float* acc_, const float* alpha_, int64_t m,
                        int64_t n, int64_t D_, int64_t stride, int64_t col, const char* pf) {
    using T = typename std::remove_const<typename std::remove_pointer<decltype(Vb)>::type>::type;
    Tiles<kD, T>::pv(mr, P, Vb, acc_, alpha_, m, n, D_, stride, col, pf);
  };

  float* Qs = scratch + layout.q;      // [M, D]
  float* acc = scratch + layout.acc;   // [M, D]
  float* S = scratch + layout.s;       // [M, s_stride]
  float* Kst = scratch + layout.k;     // [chunk keys, D] fp32 copy of a bf16 K chunk (prefill tiles)
  float* Vst = scratch + layout.v;     // [chunk keys, D]
  float* m_run = scratch + layout.m;   // [M]
  float* l_run = scratch + layout.l;   // [M]
  float* alpha = scratch + layout.alpha;  // [M]

  // Tile row m = r * group + h  <-  query[q_begin + row_begin + r, g * group + h, :] * scale
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = q_begin + item.row_begin + r;
    for (int64_t h = 0; h < group; ++h) {
      const int64_t head = g * group + h;
      const int64_t off = token * p.q_stride_token + head * p.q_stride_head;
      const void* src = p.q_dtype == DType::kFloat32
                            ? static_cast<const void*>(static_cast<const float*>(p.query) + off)
                            : static_cast<const void*>(static_cast<const uint16_t*>(p.query) + off);
      load_row<kD>(src, p.q_dtype, Qs + (r * group + h) * D, p.scale, D);
    }
  }
  for (int64_t m = 0; m < M; ++m) {
    m_run[m] = kNegInf;
    l_run[m] = 0.f;
  }
  for (int64_t i = 0; i < M * D; i += W) V::store(acc + i, V::zero());

  const int32_t* block_table = p.block_tables + item.seq * p.max_blocks_per_seq;
  const bool bf16_cache = p.cache_dtype == DType::kBFloat16;
  // Elements of one [block_size, head_size] plane (one block, one kv head).
  const int64_t plane = BS * D;
  // Keys are taken a chunk of whole blocks at a time (about 64 keys), so the softmax bookkeeping
  // (row max, rescale, sums) runs once per chunk rather than once per 16-key block:
  //
  //   positions  [key_begin ......................................... key_end)
  //   chunks     [ blk b | blk b+1 | blk b+2 | blk b+3 ][ blk b+4 | ...
  //   S columns    0..BS   BS..2BS   ...                  0..BS ...
  const int64_t chunk_keys = layout.blocks_per_chunk * BS;
  for (int64_t chunk_start = item.key_begin; chunk_start < item.key_end; chunk_start += chunk_keys) {
    const int64_t n_chunk = imin(chunk_keys, item.key_end - chunk_start);
    // Tile rows before chunk_start see none of it; rows are in position order.
    const int64_t first_row = imax(0, chunk_start - first_pos);
    if (first_row >= rows) break;
    const int64_t m0 = first_row * group;
    // Few rows (decode): widen bf16 inside the loops, each element is used by at most 4 rows.
    // Many rows (prefill tiles): widen each block once into the staging buffers.
    const bool stage = bf16_cache && M - m0 > 4;
    const int64_t elem = bf16_cache ? 2 : 4;
    // Plane offset (elements) of the block holding chunk column `col` of the next chunk, or -1.
    auto next_plane = [&](int64_t col) -> int64_t {
      const int64_t pos = chunk_start + chunk_keys + col;
      if (pos >= item.key_end) return -1;
      return (static_cast<int64_t>(block_table[pos / BS]) * p.num_kv_heads + g) * plane;
    };
    for (int64_t col = 0; col < n_chunk; col += BS) {
      const int64_t b = (chunk_start + col) / BS;
      const int64_t n = imin(BS, n_chunk - col);
      // key_cache[block, g] is the plane at ((block * num_kv_heads + g) * block_size) * head_size.
      const int64_t base = (static_cast<int64_t>(block_table[b]) * p.num_kv_heads + g) * plane;
      const int64_t ahead = next_plane(col);
      // The next chunk's plane, prefetched by the first row tile as it goes (nullptr: none).
      const char* k_ahead = ahead >= 0 ? static_cast<const char*>(p.key_cache) + ahead * elem : nullptr;
      if (!bf16_cache) {
        const float* Kb = static_cast<const float*>(p.key_cache) + base;
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
          qk_dispatch(mr, Qs, Kb, S, m, n, D, s_stride, col, m == m0 ? k_ahead : nullptr);
        });
      } else if (stage) {  // many rows, compute-bound: one burst for the whole plane is enough
        if (k_ahead) prefetch_lines(k_ahead, plane * elem);
        float* Kb = Kst + col * D;
        widen_rows<kD>(static_cast<const uint16_t*>(p.key_cache) + base, Kb, n, D);
        widen_rows<kD>(static_cast<const uint16_t*>(p.value_cache) + base, Vst + col * D, n, D);
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) { qk_dispatch(mr, Qs, Kb, S, m, n, D, s_stride, col, nullptr); });
      } else {
        const uint16_t* Kb = static_cast<const uint16_t*>(p.key_cache) + base;
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
          qk_dispatch(mr, Qs, Kb, S, m, n, D, s_stride, col, m == m0 ? k_ahead : nullptr);
        });
      }
    }
    const int64_t n_padded = (n_chunk + W - 1) / W * W;
    for (int64_t m = m0; m < M; ++m) {
      const int64_t pos = first_pos + m / group;
      const int64_t n_visible = imin(n_chunk, pos - chunk_start + 1);
      alpha[m] = softmax_row(S + m * s_stride, n_visible, n_padded, m_run + m, l_run + m);
    }
    for (int64_t col = 0; col < n_chunk; col += BS) {
      const int64_t b = (chunk_start + col) / BS;
      const int64_t n = imin(BS, n_chunk - col);
      const int64_t base = (static_cast<int64_t>(block_table[b]) * p.num_kv_heads + g) * plane;
      const int64_t ahead = next_plane(col);
      const char* v_ahead = ahead >= 0 ? static_cast<const char*>(p.value_cache) + ahead * elem : nullptr;
      const float* rescale = col == 0 ? alpha : nullptr;
      if (!bf16_cache) {
        const float* Vb = static_cast<const float*>(p.value_cache) + base;
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
          pv_dispatch(mr, S, Vb, acc, rescale, m, n, D, s_stride, col, m == m0 ? v_ahead : nullptr);
        });
      } else if (stage) {
        if (v_ahead) prefetch_lines(v_ahead, plane * elem);
        const float* Vb = Vst + col * D;
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
          pv_dispatch(mr, S, Vb, acc, rescale, m, n, D, s_stride, col, nullptr);
        });
      } else {
        const uint16_t* Vb = static_cast<const uint16_t*>(p.value_cache) + base;
        for_row_tiles<4>(m0, M, [&](int64_t m, int mr) {
          pv_dispatch(mr, S, Vb, acc, rescale, m, n, D, s_stride, col, m == m0 ? v_ahead : nullptr);
        });
      }
    }
  }

  if (item.partial_index >= 0) {
    const int64_t k = static_cast<int64_t>(item.partial_index) * layout.max_rows;
    for (int64_t m = 0; m < M; ++m) {
      partials.m[k + m] = m_run[m];
      partials.l[k + m] = l_run[m];
      float* dst = partials.acc + (k + m) * D;
      for (int64_t c = 0; c < D; c += W) V::store(dst + c, V::load(acc + m * D + c));
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = q_begin + item.row_begin + r;
    for (int64_t h = 0; h < group; ++h) {
      const int64_t m = r * group + h;
      const int64_t off = token * p.out_stride_token + (g * group + h) * p.out_stride_head;
      void* dst = p.q_dtype == DType::kFloat32
                      ? static_cast<void*>(static_cast<float*>(p.out) + off)
                      : static_cast<void*>(static_cast<uint16_t*>(p.out) + off);
      // l > 0: every row sees position 0 of its sequence in an unpartitioned item.
      store_row<kD>(acc + m * D, 1.f / l_run[m], dst, p.q_dtype, D);
    }
  }
}

AttentionItemFn attention_item_fn(int64_t head_size) {
  if (head_size % W != 0) return nullptr;
  if (head_size == 64) return &attention_item<64>;
  if (head_size == 128) return &attention_item<128>;
  return &attention_item<0>;
}

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
