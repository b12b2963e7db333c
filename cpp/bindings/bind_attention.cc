// pagedcore._core's CPU attention entries: reshape_and_cache, paged_attention, copy_blocks
// (cpp/kernels/cache_kernels.h, paged_attention.h), their tuning knobs and the huge-page advice for
// the KV cache. Raw-pointer entries of pagedcore.ops.attention (see bind_common.h).
#include <pybind11/pybind11.h>

#include "bindings/bind_common.h"
#include "kernels/cache_kernels.h"
#include "kernels/huge_pages.h"
#include "kernels/paged_attention.h"

namespace pagedcore {
namespace bindings {

void bind_attention(py::module_& m) {
  m.def(
      "reshape_and_cache_cpu",
      [](uintptr_t key, uintptr_t value, uintptr_t key_cache, uintptr_t value_cache, uintptr_t slot_mapping,
         int64_t num_tokens, int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
         int64_t key_stride_token, int64_t key_stride_head, int64_t value_stride_token,
         int64_t value_stride_head, int32_t src_dtype, int32_t cache_dtype, int64_t kv_block_stride) {
        kernels::ReshapeAndCacheParams p;
        p.key = ptr<const void>(key);
        p.value = ptr<const void>(value);
        p.key_cache = ptr<void>(key_cache);
        p.value_cache = ptr<void>(value_cache);
        p.slot_mapping = ptr<const int64_t>(slot_mapping);
        p.num_tokens = num_tokens;
        p.num_kv_heads = num_kv_heads;
        p.head_size = head_size;
        p.num_blocks = num_blocks;
        p.block_size = block_size;
        p.kv_block_stride = kv_block_stride;
        p.key_stride_token = key_stride_token;
        p.key_stride_head = key_stride_head;
        p.value_stride_token = value_stride_token;
        p.value_stride_head = value_stride_head;
        p.src_dtype = to_dtype(src_dtype);
        p.cache_dtype = to_cache_dtype(cache_dtype);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::reshape_and_cache(p);
        }
        raise_if_error(status);
      },
      py::arg("key"), py::arg("value"), py::arg("key_cache"), py::arg("value_cache"), py::arg("slot_mapping"),
      py::arg("num_tokens"), py::arg("num_kv_heads"), py::arg("head_size"), py::arg("num_blocks"),
      py::arg("block_size"), py::arg("key_stride_token"), py::arg("key_stride_head"),
      py::arg("value_stride_token"), py::arg("value_stride_head"), py::arg("src_dtype"), py::arg("cache_dtype"),
      py::arg("kv_block_stride") = 0,
      "Raw-pointer entry of pagedcore.ops.attention.reshape_and_cache (call that instead).");
  m.def(
      "paged_attention_cpu",
      [](uintptr_t out, uintptr_t query, uintptr_t key_cache, uintptr_t value_cache, uintptr_t block_tables,
         uintptr_t seq_lens, uintptr_t query_start_loc, int64_t num_seqs, int64_t num_tokens,
         int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
         int64_t max_blocks_per_seq, int64_t q_stride_token, int64_t q_stride_head,
         int64_t out_stride_token, int64_t out_stride_head, int32_t q_dtype, int32_t cache_dtype,
         double scale, int64_t max_query_len, int64_t max_seq_len, int64_t kv_block_stride) {
        kernels::PagedAttentionParams p;
        p.kv_block_stride = kv_block_stride;
        p.out = ptr<void>(out);
        p.query = ptr<const void>(query);
        p.key_cache = ptr<const void>(key_cache);
        p.value_cache = ptr<const void>(value_cache);
        p.block_tables = ptr<const int32_t>(block_tables);
        p.seq_lens = ptr<const int32_t>(seq_lens);
        p.query_start_loc = ptr<const int32_t>(query_start_loc);
        p.num_seqs = num_seqs;
        p.num_tokens = num_tokens;
        p.num_heads = num_heads;
        p.num_kv_heads = num_kv_heads;
        p.head_size = head_size;
        p.num_blocks = num_blocks;
        p.block_size = block_size;
        p.max_blocks_per_seq = max_blocks_per_seq;
        p.q_stride_token = q_stride_token;
        p.q_stride_head = q_stride_head;
        p.out_stride_token = out_stride_token;
        p.out_stride_head = out_stride_head;
        p.q_dtype = to_dtype(q_dtype);
        p.cache_dtype = to_cache_dtype(cache_dtype);
        p.scale = static_cast<float>(scale);
        p.max_query_len = max_query_len;
        p.max_seq_len = max_seq_len;
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::paged_attention(p);
        }
        raise_if_error(status);
      },
      py::arg("out"), py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
      py::arg("seq_lens"), py::arg("query_start_loc"), py::arg("num_seqs"), py::arg("num_tokens"),
      py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_size"), py::arg("num_blocks"),
      py::arg("block_size"), py::arg("max_blocks_per_seq"), py::arg("q_stride_token"), py::arg("q_stride_head"),
      py::arg("out_stride_token"), py::arg("out_stride_head"), py::arg("q_dtype"), py::arg("cache_dtype"),
      py::arg("scale"), py::arg("max_query_len"), py::arg("max_seq_len"), py::arg("kv_block_stride") = 0,
      "Raw-pointer entry of pagedcore.ops.attention.paged_attention (call that instead).");
  m.def(
      "copy_blocks_cpu",
      [](uintptr_t src, uintptr_t dst, uintptr_t block_mapping, int64_t num_pairs, int64_t num_planes,
         int64_t src_num_blocks, int64_t dst_num_blocks, int64_t block_bytes, int64_t src_plane_stride,
         int64_t src_block_stride, int64_t dst_plane_stride, int64_t dst_block_stride) {
        kernels::CopyBlocksParams p;
        p.src = ptr<const void>(src);
        p.dst = ptr<void>(dst);
        p.block_mapping = ptr<const int32_t>(block_mapping);
        p.num_pairs = num_pairs;
        p.num_planes = num_planes;
        p.src_num_blocks = src_num_blocks;
        p.dst_num_blocks = dst_num_blocks;
        p.block_bytes = block_bytes;
        p.src_plane_stride = src_plane_stride;
        p.src_block_stride = src_block_stride;
        p.dst_plane_stride = dst_plane_stride;
        p.dst_block_stride = dst_block_stride;
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::copy_blocks(p);
        }
        raise_if_error(status);
      },
      py::arg("src"), py::arg("dst"), py::arg("block_mapping"), py::arg("num_pairs"), py::arg("num_planes"),
      py::arg("src_num_blocks"), py::arg("dst_num_blocks"), py::arg("block_bytes"), py::arg("src_plane_stride") = 0,
      py::arg("src_block_stride") = 0, py::arg("dst_plane_stride") = 0, py::arg("dst_block_stride") = 0,
      "Raw-pointer entry of pagedcore.ops.attention.copy_blocks / swap_blocks (call those instead).");
  m.def(
      "set_attention_tuning",
      [](int64_t max_tile_rows, int64_t min_partition_keys, int64_t items_per_thread) {
        kernels::set_attention_tuning({max_tile_rows, min_partition_keys, items_per_thread});
      },
      py::arg("max_tile_rows") = 0, py::arg("min_partition_keys") = 0, py::arg("items_per_thread") = 0,
      "Work-planning knobs of paged_attention (tests, benchmarks); 0 restores a default.");
  m.def("advise_huge_pages", &kernels::advise_huge_pages, py::arg("ptr"), py::arg("num_bytes"),
        "madvise(MADV_HUGEPAGE) over the whole 2 MB pages of [ptr, ptr + num_bytes); returns the bytes "
        "advised (0 where not possible). Call before the pages are first touched.");
}

}  // namespace bindings
}  // namespace pagedcore
