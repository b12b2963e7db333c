// The multi-LoRA kernel body (lora_kernel.h), compiled once per instruction set inside
// PC_ISA_NAMESPACE: lora_generic.cc (baseline flags) and lora_avx2.cc (-mavx2 -mfma).
// Both inner loops are axpys over contiguous floats, which the compiler vectorises without
// reassociating sums (no -ffast-math needed).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/kernel_types.h"
#include "kernels/lora_kernel.h"
#include "kernels/parallel.h"

namespace pagedcore {
namespace kernels {
namespace PC_ISA_NAMESPACE {

namespace {

constexpr int kTileTokens = 8;  // tokens sharing one pass over an adapter's A^T and B^T rows
constexpr int64_t kSplitMinFloats = 1 << 15;  // a tile's stack floats from which run_split shares it out

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) { return bf16_to_float(p[i]); }
inline void add_store(float* p, int64_t i, float v) { p[i] += v; }
inline void add_store(uint16_t* p, int64_t i, float v) { p[i] = float_to_bf16(bf16_to_float(p[i]) + v); }

struct Tile {
  int32_t segment;
  int32_t first;  // index into token_indices
  int32_t count;  // 1..kTileTokens
};

template <typename T>
void run_tile(const LoRAParams& p, const Tile& tile, float* x_buf, float* u_buf, float* d_buf) {
  // x_buf [kTileTokens, in]  u_buf [kTileTokens, S*R]  d_buf [kTileTokens, out]
  const int64_t in = p.in_features, out = p.out_features, R = p.max_rank, SR = p.num_slices * p.max_rank;
  const int32_t slot = p.segment_slots[tile.segment];
  const float* a_t = p.a_t + slot * in * SR;    // [in, S*R]
  const float* b_t = p.b_t + slot * SR * out;   // [S*R, out]
  const int32_t* ranks = p.ranks + slot * p.num_slices;  // [S]
  const T* x = static_cast<const T*>(p.x);
  const int n = tile.count;
  int32_t used = 0;  // columns of u worth computing: up to the last adapted slice's rank
  for (int64_t s = 0; s < p.num_slices; ++s) {
    if (ranks[s] > 0) used = static_cast<int32_t>(s * R + ranks[s]);
  }
  for (int t = 0; t < n; ++t) {
    const T* row = x + static_cast<int64_t>(p.token_indices[tile.first + t]) * p.x_stride;
    float* dst = x_buf + t * in;
    for (int64_t i = 0; i < in; ++i) dst[i] = load(row, i);
  }
  std::fill(u_buf, u_buf + n * SR, 0.0f);
  // Shrink: u[t, :used] += x[t, i] * a_t[i, :used]: one long axpy over every slice, cheaper than a
  // short loop per slice; columns past a slice's rank are computed but never read by the expand.
  for (int64_t i = 0; i < in; ++i) {
    const float* a_row = a_t + i * SR;
    for (int t = 0; t < n; ++t) {
      const float xv = x_buf[t * in + i];
      float* u = u_buf + t * SR;
      for (int32_t k = 0; k < used; ++k) u[k] += xv * a_row[k];
    }
  }
  // Expand: delta[t, o] = sum_k u[t, k] * b_t[k, o] over each slice's columns, each row of b_t read
  // once for the whole tile; then y += delta (one rounding in bf16).
  T* y = static_cast<T*>(p.y);
  for (int64_t s = 0; s < p.num_slices; ++s) {
    const int64_t c0 = p.slice_starts[s], c1 = p.slice_starts[s + 1];
    if (ranks[s] == 0) continue;
    for (int t = 0; t < n; ++t) std::fill(d_buf + t * out + c0, d_buf + t * out + c1, 0.0f);
    for (int64_t k = s * R; k < s * R + ranks[s]; ++k) {
      const float* b_row = b_t + k * out;
      for (int t = 0; t < n; ++t) {
        const float uk = u_buf[t * SR + k];
        float* d = d_buf + t * out;
        for (int64_t o = c0; o < c1; ++o) d[o] += uk * b_row[o];
      }
    }
    for (int t = 0; t < n; ++t) {
      T* y_row = y + static_cast<int64_t>(p.token_indices[tile.first + t]) * p.y_stride;
      const float* d = d_buf + t * out;
      for (int64_t o = c0; o < c1; ++o) add_store(y_row, o, d[o]);
    }
  }
}

// Columns of u a tile's rows need: up to the last adapted slice's rank (as run_tile computes it).
inline int32_t used_columns(const LoRAParams& p, int32_t slot) {
  const int32_t* ranks = p.ranks + slot * p.num_slices;  // [S]
  int32_t used = 0;
  for (int64_t s = 0; s < p.num_slices; ++s) {
    if (ranks[s] > 0) used = static_cast<int32_t>(s * p.max_rank + ranks[s]);
  }
  return used;
}

inline int64_t round_up16(int64_t v) { return (v + 15) / 16 * 16; }

// Fewer tiles than threads (decode: one token per adapter): run_tile per tile would leave cores
// idle, so each tile's shrink is split over column ranges of u and its expand over column ranges
// of each slice, `parts` ranges each. Every element is summed over the same terms in the same order
// as in run_tile (u over i, the expand over k, then one add into y), only on different threads.
template <typename T>
void run_split(const LoRAParams& p, const std::vector<Tile>& tiles, int64_t parts) {
  const int64_t in = p.in_features, R = p.max_rank, SR = p.num_slices * p.max_rank;
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  std::vector<float> u_all(static_cast<size_t>(num_tiles * kTileTokens * SR), 0.0f);  // [tiles, kTileTokens, S*R]
  // Shrink: task = (tile, range of u's columns).
  const int64_t k_chunk = round_up16((SR + parts - 1) / parts);
  const int64_t k_parts = (SR + k_chunk - 1) / k_chunk;
  parallel_for(static_cast<int>(num_tiles * k_parts), [&](int task, int) {
    const Tile& tile = tiles[static_cast<size_t>(task / k_parts)];
    const int32_t slot = p.segment_slots[tile.segment];
    const int64_t k0 = (task % k_parts) * k_chunk;
    const int64_t k1 = std::min<int64_t>(used_columns(p, slot), k0 + k_chunk);
    if (k0 >= k1) return;
    const float* a_t = p.a_t + slot * in * SR;  // [in, S*R]
    float* u_tile = u_all.data() + (task / k_parts) * kTileTokens * SR;
    const T* rows[kTileTokens];
    for (int t = 0; t < tile.count; ++t) rows[t] = x + static_cast<int64_t>(p.token_indices[tile.first + t]) * p.x_stride;
    for (int64_t i = 0; i < in; ++i) {
      const float* a_row = a_t + i * SR;
      for (int t = 0; t < tile.count; ++t) {
        const float xv = load(rows[t], i);
        float* u = u_tile + t * SR;
        for (int64_t k = k0; k < k1; ++k) u[k] += xv * a_row[k];
      }
    }
  });
  // Expand: task = (tile, slice, range of the slice's columns).
  struct Range {
    int64_t tile, slice, c0, c1;
  };
  std::vector<Range> ranges;
  int64_t widest = 0;
  for (int64_t ti = 0; ti < num_tiles; ++ti) {
    const int32_t* ranks = p.ranks + p.segment_slots[tiles[static_cast<size_t>(ti)].segment] * p.num_slices;
    for (int64_t s = 0; s < p.num_slices; ++s) {
      if (ranks[s] == 0) continue;
      const int64_t c0 = p.slice_starts[s], c1 = p.slice_starts[s + 1];
      const int64_t chunk = round_up16((c1 - c0 + parts - 1) / parts);
      for (int64_t c = c0; c < c1; c += chunk) ranges.push_back(Range{ti, s, c, std::min(c1, c + chunk)});
      widest = std::max(widest, std::min(chunk, c1 - c0));
    }
  }
  std::vector<std::vector<float>> scratch(static_cast<size_t>(std::max(1, max_threads())));
  parallel_for(static_cast<int>(ranges.size()), [&](int task, int thread) {
    const Range& r = ranges[static_cast<size_t>(task)];
    const Tile& tile = tiles[static_cast<size_t>(r.tile)];
    const int32_t slot = p.segment_slots[tile.segment];
    const float* b_t = p.b_t + slot * SR * p.out_features;  // [S*R, out]
    const int32_t rank = p.ranks[slot * p.num_slices + r.slice];
    const float* u_tile = u_all.data() + r.tile * kTileTokens * SR;
    const int64_t width = r.c1 - r.c0;
    std::vector<float>& d_buf = scratch[static_cast<size_t>(thread)];  // [kTileTokens, widest]
    d_buf.assign(static_cast<size_t>(kTileTokens * widest), 0.0f);
    for (int64_t k = r.slice * R; k < r.slice * R + rank; ++k) {
      const float* b_row = b_t + k * p.out_features + r.c0;
      for (int t = 0; t < tile.count; ++t) {
        const float uk = u_tile[t * SR + k];
        float* d = d_buf.data() + t * widest;
        for (int64_t o = 0; o < width; ++o) d[o] += uk * b_row[o];
      }
    }
    for (int t = 0; t < tile.count; ++t) {
      T* y_row = y + static_cast<int64_t>(p.token_indices[tile.first + t]) * p.y_stride + r.c0;
      const float* d = d_buf.data() + t * widest;
      for (int64_t o = 0; o < width; ++o) add_store(y_row, o, d[o]);
    }
  });
}

template <typename T>
void run(const LoRAParams& p) {
  std::vector<Tile> tiles;
  for (int64_t g = 0; g < p.num_segments; ++g) {
    for (int32_t i = p.segment_starts[g]; i < p.segment_starts[g + 1]; i += kTileTokens) {
      tiles.push_back(Tile{static_cast<int32_t>(g), i, std::min<int32_t>(kTileTokens, p.segment_starts[g + 1] - i)});
    }
  }
  if (tiles.empty()) return;
  // Split only where the stack floats a tile reads pay for a thread hand-off (the default model at
  // rank 16: qkv 172 KB, gate_up 270 KB, down 135 KB split; o_proj's 74 KB runs on one thread).
  const int64_t tile_floats = p.num_slices * p.max_rank * (p.in_features + p.out_features / p.num_slices);
  if (static_cast<int>(tiles.size()) < max_threads() && tile_floats >= kSplitMinFloats) {
    run_split<T>(p, tiles, (max_threads() + static_cast<int64_t>(tiles.size()) - 1) / static_cast<int64_t>(tiles.size()));
    return;
  }
  const int64_t SR = p.num_slices * p.max_rank;
  const int64_t per_thread = kTileTokens * (p.in_features + SR + p.out_features);
  const int num_threads = std::max(1, std::min<int>(max_threads(), static_cast<int>(tiles.size())));
  std::vector<float> scratch(static_cast<size_t>(per_thread * std::max(1, max_threads())));
  auto body = [&](int task, int thread) {
    float* x_buf = scratch.data() + static_cast<int64_t>(thread) * per_thread;
    float* u_buf = x_buf + kTileTokens * p.in_features;
    float* d_buf = u_buf + kTileTokens * SR;
    run_tile<T>(p, tiles[static_cast<size_t>(task)], x_buf, u_buf, d_buf);
  };
  if (num_threads == 1) {
    for (size_t i = 0; i < tiles.size(); ++i) body(static_cast<int>(i), 0);
  } else {
    parallel_for(static_cast<int>(tiles.size()), body);
  }
}

}  // namespace

void lora_shrink_expand(const LoRAParams& p) {
  if (p.dtype == DType::kFloat32) {
    run<float>(p);
  } else {
    run<uint16_t>(p);
  }
}

}  // namespace PC_ISA_NAMESPACE
}  // namespace kernels
}  // namespace pagedcore
