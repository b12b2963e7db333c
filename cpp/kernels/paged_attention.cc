// The paged-attention launcher: checks the call, cuts it into work items, runs them on the
// threads of parallel.h with the kernel of the chosen ISA, and merges context partitions.
#include "kernels/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/common.h"
#include "kernels/attention_kernel.h"
#include "kernels/parallel.h"

namespace pagedcore {
namespace kernels {
namespace {

constexpr int64_t kDefaultMaxTileRows = 64;
constexpr int64_t kDefaultMinPartitionKeys = 128;
constexpr int64_t kDefaultItemsPerThread = 4;
// Keys per online-softmax step (whole blocks, at least one).
constexpr int64_t kChunkKeys = 64;

std::atomic<int64_t> g_max_tile_rows{kDefaultMaxTileRows};
std::atomic<int64_t> g_min_partition_keys{kDefaultMinPartitionKeys};
std::atomic<int64_t> g_items_per_thread{kDefaultItemsPerThread};

std::string str(int64_t v) { return std::to_string(v); }

Status check(const PagedAttentionParams& p) {
  if (p.num_seqs < 0 || p.num_tokens < 0 || p.num_blocks < 0 || p.max_blocks_per_seq < 0)
    return Status::invalid("paged_attention: negative size");
  // Empty tensors may have null data: demand a pointer only where it will be read.
  if (!p.query_start_loc || (p.num_seqs > 0 && !p.seq_lens) ||
      (p.num_seqs > 0 && p.max_blocks_per_seq > 0 && !p.block_tables) ||
      (p.num_tokens > 0 && (!p.out || !p.query)) || (p.num_blocks > 0 && (!p.key_cache || !p.value_cache)))
    return Status::invalid("paged_attention: a data pointer is null");
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0)
    return Status::invalid("paged_attention: num_heads (" + str(p.num_heads) +
                           ") must be a positive multiple of num_kv_heads (" + str(p.num_kv_heads) + ")");
  if (p.head_size <= 0 || p.head_size % 8 != 0 || p.head_size > kMaxHeadSize)
    return Status::invalid("paged_attention: head_size " + str(p.head_size) +
                           " is not supported; use a multiple of 8 up to " + str(kMaxHeadSize));
  if (p.block_size <= 0) return Status::invalid("paged_attention: block_size must be positive");
  if (p.kv_block_stride != 0 && p.kv_block_stride < p.num_kv_heads * p.block_size * p.head_size)
    return Status::invalid("paged_attention: kv_block_stride " + str(p.kv_block_stride) +
                           " is shorter than a block (num_kv_heads * block_size * head_size); pass 0 for a "
                           "contiguous layer cache");
  if (p.num_tokens > std::numeric_limits<int32_t>::max() ||
      p.max_blocks_per_seq * p.block_size > std::numeric_limits<int32_t>::max())
    return Status::invalid("paged_attention: more than 2^31 tokens or positions");
  const int32_t* qsl = p.query_start_loc;
  if (qsl[0] != 0)
    return Status::invalid("paged_attention: query_start_loc[0] = " + str(qsl[0]) + "; it must be 0");
  if (qsl[p.num_seqs] != p.num_tokens)
    return Status::invalid("paged_attention: query_start_loc[-1] = " + str(qsl[p.num_seqs]) +
                           " but query has " + str(p.num_tokens) + " rows");
  const int64_t max_positions = p.max_blocks_per_seq * p.block_size;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t q_len = static_cast<int64_t>(qsl[s + 1]) - qsl[s];
    const int64_t seq_len = p.seq_lens[s];
    if (q_len < 0)
      return Status::invalid("paged_attention: query_start_loc is not non-decreasing at sequence " + str(s));
    if (q_len == 0) continue;
    if (seq_len < q_len)
      return Status::invalid("paged_attention: sequence " + str(s) + " has seq_len " + str(seq_len) +
                             " < its " + str(q_len) + " query rows; seq_lens must count this step's tokens");
    if (seq_len > max_positions)
      return Status::out_of_range("paged_attention: sequence " + str(s) + " has seq_len " + str(seq_len) +
                                  " but block_tables holds only " + str(p.max_blocks_per_seq) + " blocks of " +
                                  str(p.block_size));
    if (p.max_query_len >= 0 && q_len > p.max_query_len)
      return Status::invalid("paged_attention: sequence " + str(s) + " has " + str(q_len) +
                             " query rows > max_query_len " + str(p.max_query_len));
    if (p.max_seq_len >= 0 && seq_len > p.max_seq_len)
      return Status::invalid("paged_attention: sequence " + str(s) + " has seq_len " + str(seq_len) +
                             " > max_seq_len " + str(p.max_seq_len));
    const int32_t* row = p.block_tables + s * p.max_blocks_per_seq;
    const int64_t used_blocks = (seq_len + p.block_size - 1) / p.block_size;
    for (int64_t b = 0; b < used_blocks; ++b) {
      if (row[b] < 0 || row[b] >= p.num_blocks)
        return Status::out_of_range("paged_attention: block_tables[" + str(s) + ", " + str(b) + "] = " +
                                    str(row[b]) + " is outside [0, " + str(p.num_blocks) + ") but position " +
                                    str(b * p.block_size) + " < seq_len " + str(seq_len) + " needs it");
    }
  }
  return Status::ok();
}

AttentionItemFn pick_kernel(Isa isa, int64_t head_size) {
  switch (isa) {
    case Isa::kAvx512Bf16:
    case Isa::kAmxBf16:  // every AMX CPU has AVX512-BF16; no AMX attention tiles (yet)
    case Isa::kAmxInt8:
      if (AttentionItemFn fn = attention_avx512_bf16dot::attention_item_fn(head_size)) return fn;
      return attention_avx2::attention_item_fn(head_size);  // head_size % 16 != 0: 8 lanes
    case Isa::kAvx512:
    case Isa::kAvx512Vnni:
      if (AttentionItemFn fn = attention_avx512::attention_item_fn(head_size)) return fn;
      return attention_avx2::attention_item_fn(head_size);  // head_size % 16 != 0: 8 lanes
    case Isa::kAvx2:
      return attention_avx2::attention_item_fn(head_size);
    case Isa::kGeneric16Bf16:
      if (AttentionItemFn fn = attention_generic16_bf16dot::attention_item_fn(head_size)) return fn;
      return attention_generic8::attention_item_fn(head_size);
    case Isa::kGeneric16:
      if (AttentionItemFn fn = attention_generic16::attention_item_fn(head_size)) return fn;
      return attention_generic8::attention_item_fn(head_size);
    case Isa::kGeneric:
    default:
      return attention_generic8::attention_item_fn(head_size);
  }
}

// A tile of query rows whose key range was split into partitions, merged after the items ran.
struct PartitionedTile {
  int32_t seq, kv_head, row_begin, row_end;
  int32_t first_partial, num_partials;
};

// Per calling thread, reused across calls (no allocation on the hot path once warm).
struct Workspace {
  std::vector<AttentionWorkItem> items;
  std::vector<int64_t> cost;
  std::vector<int32_t> order;
  std::vector<AttentionWorkItem> sorted;
  std::vector<PartitionedTile> tiles;
  std::vector<int32_t> tile_of_partial;  // [num_partials] the tile a partition belongs to
  std::vector<int32_t> partitions_done;  // [tiles] partitions finished (atomic adds): the last merges
  std::vector<float> scratch;
  std::vector<float> partial_m, partial_l, partial_acc;
};

Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

// Merges the partitions of one tile:  out = sum_k e^(m_k - M) acc_k / sum_k e^(m_k - M) l_k,
// M = max_k m_k. A partition whose keys all lie after a row's position has m = -inf, l = 0.
void merge_tile(const PagedAttentionParams& p, const PartitionedTile& t, const AttentionPartials& part,
                int64_t max_rows, float* row_buf) {
  const int64_t D = p.head_size;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t q_begin = p.query_start_loc[t.seq];
  const int64_t rows = t.row_end - t.row_begin;
  for (int64_t m = 0; m < rows * group; ++m) {
    float m_max = -std::numeric_limits<float>::infinity();
    for (int32_t k = 0; k < t.num_partials; ++k)
      m_max = std::max(m_max, part.m[(t.first_partial + k) * max_rows + m]);
    std::fill(row_buf, row_buf + D, 0.f);
    float l_sum = 0.f;
    for (int32_t k = 0; k < t.num_partials; ++k) {
      const int64_t idx = (t.first_partial + k) * max_rows + m;
      if (part.l[idx] == 0.f) continue;
      const float w = std::exp(part.m[idx] - m_max);
      l_sum += w * part.l[idx];
      const float* acc = part.acc + idx * D;
      for (int64_t d = 0; d < D; ++d) row_buf[d] += w * acc[d];
    }
    const float inv = 1.f / l_sum;
    const int64_t token = q_begin + t.row_begin + m / group;
    const int64_t head = t.kv_head * group + m % group;
    const int64_t off = token * p.out_stride_token + head * p.out_stride_head;
    if (p.q_dtype == DType::kFloat32) {
      float* dst = static_cast<float*>(p.out) + off;
      for (int64_t d = 0; d < D; ++d) dst[d] = row_buf[d] * inv;
    } else {
      uint16_t* dst = static_cast<uint16_t*>(p.out) + off;
      for (int64_t d = 0; d < D; ++d) dst[d] = float_to_bf16(row_buf[d] * inv);
    }
  }
}

}  // namespace

void set_attention_tuning(const AttentionTuning& t) {
  g_max_tile_rows = t.max_tile_rows > 0 ? t.max_tile_rows : kDefaultMaxTileRows;
  g_min_partition_keys = t.min_partition_keys > 0 ? t.min_partition_keys : kDefaultMinPartitionKeys;
  g_items_per_thread = t.items_per_thread > 0 ? t.items_per_thread : kDefaultItemsPerThread;
}

Status paged_attention(const PagedAttentionParams& p) { return paged_attention(p, active_isa()); }

Status paged_attention(const PagedAttentionParams& p, Isa isa) {
  if (!isa_supported(isa))
    return Status::invalid(std::string("paged_attention: this CPU or build lacks ISA ") + isa_name(isa));
  Status status = check(p);
  if (!status.is_ok() || p.num_tokens == 0 || p.num_seqs == 0) return status;
  const AttentionItemFn kernel = pick_kernel(isa, p.head_size);

  // ---- plan: tiles of query rows x one kv head, optionally split along the keys ----
  //
  //   seq s, q_len rows:  rows [0, R) [R, 2R) ... one tile each (R = max_tile_rows / group rows),
  //   times num_kv_heads.  Tile rows [r0, r1) see keys [0, first_pos + r1) (causal).
  //   Too few tiles for the threads (decode at small batch): cut each long key range into
  //   partitions aligned to blocks:   [0 .. P) [P .. 2P) ... [.. key_end)
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t tile_rows = std::max<int64_t>(1, g_max_tile_rows.load() / group);
  const int64_t max_rows = tile_rows * group;
  const int threads = std::max(1, max_threads());
  Workspace& ws = workspace();
  ws.items.clear();
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t q_len = static_cast<int64_t>(p.query_start_loc[s + 1]) - p.query_start_loc[s];
    const int64_t first_pos = p.seq_lens[s] - q_len;
    for (int64_t r0 = 0; r0 < q_len; r0 += tile_rows) {
      const int64_t r1 = std::min(q_len, r0 + tile_rows);
      for (int64_t g = 0; g < p.num_kv_heads; ++g) {
        ws.items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(g), static_cast<int32_t>(r0),
                            static_cast<int32_t>(r1), 0, static_cast<int32_t>(first_pos + r1), -1});
      }
    }
  }
  const int64_t num_tiles = static_cast<int64_t>(ws.items.size());
  const int64_t wanted_items = threads * g_items_per_thread.load();
  const int64_t min_keys = g_min_partition_keys.load();
  ws.tiles.clear();
  ws.tile_of_partial.clear();
  int64_t num_partials = 0;
  if (threads > 1 && num_tiles < wanted_items) {
    // Enough parts for the wanted items, and a whole number of items per thread where the key ranges
    // allow it (equal items handed out dynamically: 9 items on 2 threads leave one idle for a ninth).
    int64_t parts_wanted = (wanted_items + num_tiles - 1) / num_tiles;
    for (int64_t extra = 0; extra < threads && (num_tiles * parts_wanted) % threads != 0; ++extra) ++parts_wanted;
    for (int64_t i = 0; i < num_tiles; ++i) {
      AttentionWorkItem tile = ws.items[i];
      const int64_t keys = tile.key_end;
      const int64_t parts = std::min(parts_wanted, keys / min_keys);
      if (parts < 2) continue;
      const int64_t part_keys = ((keys + parts - 1) / parts + p.block_size - 1) / p.block_size * p.block_size;
      const int64_t real_parts = (keys + part_keys - 1) / part_keys;
      if (real_parts < 2) continue;
      ws.tiles.push_back({tile.seq, tile.kv_head, tile.row_begin, tile.row_end,
                          static_cast<int32_t>(num_partials), static_cast<int32_t>(real_parts)});
      ws.tile_of_partial.insert(ws.tile_of_partial.end(), real_parts, static_cast<int32_t>(ws.tiles.size() - 1));
      for (int64_t k = 0; k < real_parts; ++k) {
        AttentionWorkItem part = tile;
        part.key_begin = static_cast<int32_t>(k * part_keys);
        part.key_end = static_cast<int32_t>(std::min(keys, (k + 1) * part_keys));
        part.partial_index = static_cast<int32_t>(num_partials + k);
        if (k == 0) ws.items[i] = part;
        else ws.items.push_back(part);
      }
      num_partials += real_parts;
    }
  }
  // Largest first, so that the dynamic hand-out ends with small items (balances the threads).
  const int64_t num_items = static_cast<int64_t>(ws.items.size());
  ws.cost.resize(num_items);
  ws.order.resize(num_items);
  for (int64_t i = 0; i < num_items; ++i) {
    const AttentionWorkItem& it = ws.items[i];
    ws.cost[i] = static_cast<int64_t>(it.row_end - it.row_begin) * (it.key_end - it.key_begin);
    ws.order[i] = static_cast<int32_t>(i);
  }
  std::stable_sort(ws.order.begin(), ws.order.end(),
                   [&](int32_t a, int32_t b) { return ws.cost[a] > ws.cost[b]; });
  ws.sorted.resize(num_items);
  for (int64_t i = 0; i < num_items; ++i) ws.sorted[i] = ws.items[ws.order[i]];

  // ---- scratch: one slice per thread, each array 64-byte aligned ----
  auto round16 = [](int64_t x) { return (x + 15) / 16 * 16; };
  AttentionScratchLayout layout;
  layout.max_rows = max_rows;
  layout.blocks_per_chunk = std::max<int64_t>(1, kChunkKeys / p.block_size);
  const int64_t chunk_keys = layout.blocks_per_chunk * p.block_size;
  layout.s_stride = round16(chunk_keys);
  int64_t off = 0;
  auto take = [&](int64_t n) {
    const int64_t at = off;
    off += round16(n);
    return at;
  };
  layout.q = take(max_rows * p.head_size);
  layout.acc = take(max_rows * p.head_size);
  layout.s = take(max_rows * layout.s_stride);
  layout.k = take(chunk_keys * p.head_size);
  layout.v = take(chunk_keys * p.head_size);
  layout.m = take(max_rows);
  layout.l = take(max_rows);
  layout.alpha = take(max_rows);
  layout.qb = take((max_rows * p.head_size + 1) / 2);         // bf16, two to a float
  layout.pb = take((max_rows * layout.s_stride + 1) / 2);
  const int64_t merge_row = take(p.head_size);  // [head_size] row buffer of merge_tile
  layout.per_thread = off;
  ws.scratch.resize(threads * layout.per_thread + 16);
  float* scratch = ws.scratch.data();
  scratch += (16 - (reinterpret_cast<uintptr_t>(scratch) / sizeof(float)) % 16) % 16;

  ws.partial_m.resize(num_partials * max_rows);
  ws.partial_l.resize(num_partials * max_rows);
  ws.partial_acc.resize(num_partials * max_rows * p.head_size);
  const AttentionPartials partials{ws.partial_m.data(), ws.partial_l.data(), ws.partial_acc.data()};

  // A partitioned tile is merged by the thread that finishes its last partition, in the same region
  // (a second parallel region for the merges cost a fork and a join; with the balancing below, warm
  // decode calls at batch 1 got 4-12% faster on the Zen 4: bench/RESULTS.md, 2026-12-03 13:40).
  ws.partitions_done.assign(ws.tiles.size(), 0);
  const AttentionWorkItem* items = ws.sorted.data();
  const PartitionedTile* tiles = ws.tiles.data();
  const int32_t* tile_of_partial = ws.tile_of_partial.data();
  int32_t* partitions_done = ws.partitions_done.data();
  parallel_for(static_cast<int>(num_items), [&](int i, int thread) {
    float* thread_scratch = scratch + thread * layout.per_thread;
    kernel(p, items[i], layout, thread_scratch, partials);
    if (items[i].partial_index < 0) return;
    const int32_t t = tile_of_partial[items[i].partial_index];
    // acq_rel: each partition's partials are written before its add; the last add sees them all.
    if (__atomic_add_fetch(&partitions_done[t], 1, __ATOMIC_ACQ_REL) == tiles[t].num_partials)
      merge_tile(p, tiles[t], partials, max_rows, thread_scratch + merge_row);
  });
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
