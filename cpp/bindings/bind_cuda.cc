// pagedcore._core's CUDA entries (cuda/): the paged-attention and cache kernels and the NCCL
// communicator, present when the build found a CUDA toolkit (has_cuda). Only forwards:
// pagedcore.ops.attention_cuda / pagedcore.ops.nccl check the tensors and pass data_ptr() ints, sizes,
// strides and the CUDA stream; the launchers check sizes and return a cudaError_t. Invalid arguments
// raise ValueError (out-of-range block ids IndexError), CUDA errors RuntimeError.
#include <pybind11/pybind11.h>

#include "bindings/bind_common.h"

#ifndef PAGEDCORE_HAS_CUDA

namespace pagedcore {
namespace bindings {

void bind_cuda(py::module_& m) {
  m.attr("has_cuda") = false;
  m.def("cuda_device_count", []() { return 0; }, "Visible CUDA devices (0: built without CUDA).");
}

}  // namespace bindings
}  // namespace pagedcore

#else
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#include "cache_kernels_cuda.h"
#include "device_info.h"
#include "nccl_communicator.h"
#include "paged_attention_cuda.h"

namespace pagedcore {
namespace bindings {
namespace {

cuda::DType to_cuda_dtype(int32_t code) {
  if (!cuda::valid_dtype(code)) throw py::value_error("unknown CUDA dtype code " + std::to_string(code));
  return static_cast<cuda::DType>(code);
}

template <typename T>
T* device_ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

cudaStream_t to_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

void raise_if_cuda_error(cudaError_t status, const char* op) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string(op) + " failed: " + cudaGetErrorName(status) + " (" +
                           cudaGetErrorString(status) + ")");
}

void raise_if_invalid(const std::string& problem, const char* op) {
  if (!problem.empty()) throw py::value_error(std::string(op) + ": " + problem);
}

}  // namespace

void bind_cuda(py::module_& m) {
  m.attr("has_cuda") = true;
  m.def("cuda_device_count", &cuda::device_count, "Visible CUDA devices (0 without a driver or GPU).");
  m.def(
      "reshape_and_cache_cuda",
      [](uintptr_t key, uintptr_t value, uintptr_t key_cache, uintptr_t value_cache, uintptr_t slot_mapping,
         int64_t num_tokens, int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
         int64_t key_stride_token, int64_t key_stride_head, int64_t value_stride_token, int64_t value_stride_head,
         int32_t src_dtype, int32_t cache_dtype, uintptr_t stream) {
        cuda::ReshapeAndCacheParams p;
        p.key = device_ptr<const void>(key);
        p.value = device_ptr<const void>(value);
        p.key_cache = device_ptr<void>(key_cache);
        p.value_cache = device_ptr<void>(value_cache);
        p.slot_mapping = device_ptr<const int64_t>(slot_mapping);
        p.num_tokens = num_tokens;
        p.num_kv_heads = num_kv_heads;
        p.head_size = head_size;
        p.num_blocks = num_blocks;
        p.block_size = block_size;
        p.key_stride_token = key_stride_token;
        p.key_stride_head = key_stride_head;
        p.value_stride_token = value_stride_token;
        p.value_stride_head = value_stride_head;
        p.src_dtype = to_cuda_dtype(src_dtype);
        p.cache_dtype = to_cuda_dtype(cache_dtype);
        p.stream = to_stream(stream);
        raise_if_invalid(cuda::check_reshape_and_cache(p), "reshape_and_cache");
        raise_if_cuda_error(cuda::reshape_and_cache(p), "reshape_and_cache");
      },
      py::arg("key"), py::arg("value"), py::arg("key_cache"), py::arg("value_cache"), py::arg("slot_mapping"),
      py::arg("num_tokens"), py::arg("num_kv_heads"), py::arg("head_size"), py::arg("num_blocks"),
      py::arg("block_size"), py::arg("key_stride_token"), py::arg("key_stride_head"),
      py::arg("value_stride_token"), py::arg("value_stride_head"), py::arg("src_dtype"), py::arg("cache_dtype"),
      py::arg("stream"),
      "Raw-pointer entry of pagedcore.ops.attention_cuda.reshape_and_cache (call that instead).");
  m.def(
      "paged_attention_cuda",
      [](uintptr_t out, uintptr_t query, uintptr_t key_cache, uintptr_t value_cache, uintptr_t block_tables,
         uintptr_t seq_lens, uintptr_t query_start_loc, int64_t num_seqs, int64_t num_tokens, int64_t num_heads,
         int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
         int64_t max_blocks_per_seq, int64_t q_stride_token, int64_t q_stride_head, int64_t out_stride_token,
         int64_t out_stride_head, int32_t q_dtype, int32_t cache_dtype, double scale, int64_t max_query_len,
         int64_t max_seq_len, uintptr_t workspace, int64_t workspace_bytes, uintptr_t stream,
         int64_t partition_size, int32_t prefill_impl, int32_t decode_impl) -> int64_t {
        cuda::PagedAttentionParams p;
        p.out = device_ptr<void>(out);
        p.query = device_ptr<const void>(query);
        p.key_cache = device_ptr<const void>(key_cache);
        p.value_cache = device_ptr<const void>(value_cache);
        p.block_tables = device_ptr<const int32_t>(block_tables);
        p.seq_lens = device_ptr<const int32_t>(seq_lens);
        p.query_start_loc = device_ptr<const int32_t>(query_start_loc);
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
        p.q_dtype = to_cuda_dtype(q_dtype);
        p.cache_dtype = to_cuda_dtype(cache_dtype);
        p.scale = static_cast<float>(scale);
        p.max_query_len = max_query_len;
        p.max_seq_len = max_seq_len;
        p.workspace = device_ptr<void>(workspace);
        p.workspace_bytes = workspace_bytes;
        p.stream = to_stream(stream);
        p.tuning.partition_size = partition_size;
        p.tuning.prefill = prefill_impl;
        p.tuning.decode = decode_impl;
        raise_if_invalid(cuda::check_paged_attention(p), "paged_attention");
        const int64_t needed = cuda::paged_attention_workspace_bytes(p);
        if (needed > workspace_bytes || (needed > 0 && workspace == 0)) return needed;  // nothing launched
        raise_if_cuda_error(cuda::paged_attention(p), "paged_attention");
        return 0;
      },
      py::arg("out"), py::arg("query"), py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
      py::arg("seq_lens"), py::arg("query_start_loc"), py::arg("num_seqs"), py::arg("num_tokens"),
      py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_size"), py::arg("num_blocks"),
      py::arg("block_size"), py::arg("max_blocks_per_seq"), py::arg("q_stride_token"), py::arg("q_stride_head"),
      py::arg("out_stride_token"), py::arg("out_stride_head"), py::arg("q_dtype"), py::arg("cache_dtype"),
      py::arg("scale"), py::arg("max_query_len"), py::arg("max_seq_len"), py::arg("workspace"),
      py::arg("workspace_bytes"), py::arg("stream"), py::arg("partition_size"), py::arg("prefill_impl"),
      py::arg("decode_impl"),
      "Raw-pointer entry of pagedcore.ops.attention_cuda.paged_attention (call that instead). Returns 0 once "
      "launched, or the workspace bytes the call needs (nothing launched) when the given one is smaller.");
  m.def(
      "copy_blocks_cuda",
      [](uintptr_t kv_cache, uintptr_t block_mapping, uintptr_t block_mapping_host, int64_t num_pairs,
         int64_t num_planes, int64_t num_blocks, int64_t block_bytes, uintptr_t stream) {
        const int32_t* host_rows = device_ptr<const int32_t>(block_mapping_host);
        if (host_rows != nullptr) {
          const std::string problem = cuda::check_block_mapping(host_rows, num_pairs, num_blocks, num_blocks);
          if (!problem.empty()) throw py::index_error("copy_blocks: " + problem);
        }
        cuda::CopyBlocksParams p;
        p.src = device_ptr<const void>(kv_cache);
        p.dst = device_ptr<void>(kv_cache);
        p.block_mapping = device_ptr<const int32_t>(block_mapping);
        p.block_mapping_host = host_rows;
        p.num_pairs = num_pairs;
        p.num_planes = num_planes;
        p.src_num_blocks = num_blocks;
        p.dst_num_blocks = num_blocks;
        p.block_bytes = block_bytes;
        p.stream = to_stream(stream);
        raise_if_cuda_error(cuda::copy_blocks(p), "copy_blocks");
      },
      py::arg("kv_cache"), py::arg("block_mapping"), py::arg("block_mapping_host"), py::arg("num_pairs"),
      py::arg("num_planes"), py::arg("num_blocks"), py::arg("block_bytes"), py::arg("stream"),
      "Raw-pointer entry of pagedcore.ops.attention_cuda.copy_blocks (call that instead).");
  m.def(
      "swap_blocks_cuda",
      [](uintptr_t src, uintptr_t dst, uintptr_t block_mapping_host, int64_t num_pairs, int64_t num_planes,
         int64_t src_num_blocks, int64_t dst_num_blocks, int64_t block_bytes, uintptr_t stream) {
        const int32_t* host_rows = device_ptr<const int32_t>(block_mapping_host);
        const std::string problem = cuda::check_block_mapping(host_rows, num_pairs, src_num_blocks, dst_num_blocks);
        if (!problem.empty()) throw py::index_error("swap_blocks: " + problem);
        cuda::CopyBlocksParams p;
        p.src = device_ptr<const void>(src);
        p.dst = device_ptr<void>(dst);
        p.block_mapping = host_rows;
        p.num_pairs = num_pairs;
        p.num_planes = num_planes;
        p.src_num_blocks = src_num_blocks;
        p.dst_num_blocks = dst_num_blocks;
        p.block_bytes = block_bytes;
        p.stream = to_stream(stream);
        cudaError_t status;
        {
          py::gil_scoped_release release;  // a copy from pageable host memory returns only once staged
          status = cuda::swap_blocks(p);
        }
        raise_if_cuda_error(status, "swap_blocks");
      },
      py::arg("src"), py::arg("dst"), py::arg("block_mapping_host"), py::arg("num_pairs"), py::arg("num_planes"),
      py::arg("src_num_blocks"), py::arg("dst_num_blocks"), py::arg("block_bytes"), py::arg("stream"),
      "Raw-pointer entry of pagedcore.ops.attention_cuda.swap_blocks (call that instead).");

  py::class_<cuda::NcclCommunicator>(m, "NcclCommunicator",
                                     "One rank of an NCCL group (libnccl.so.2 loaded at run time). "
                                     "pagedcore.ops.nccl.NcclCommunicator wraps it for tensors.")
      .def(py::init([](int world_size, int rank, const py::bytes& unique_id, int device, const std::string& library) {
             const std::string id = unique_id;
             if (id.size() != cuda::kNcclUniqueIdBytes) {
               throw py::value_error("unique_id must be the " + std::to_string(cuda::kNcclUniqueIdBytes) +
                                     " bytes of NcclCommunicator.get_unique_id(), got " + std::to_string(id.size()));
             }
             cuda::NcclUniqueId raw;
             std::copy(id.begin(), id.end(), raw.begin());
             py::gil_scoped_release release;  // blocks until every rank has joined
             return std::make_unique<cuda::NcclCommunicator>(world_size, rank, raw, device, library);
           }),
           py::arg("world_size"), py::arg("rank"), py::arg("unique_id"), py::arg("device"),
           py::arg("library_path") = "")
      .def_static(
          "get_unique_id",
          [](const std::string& library) {
            const cuda::NcclUniqueId id = cuda::NcclCommunicator::unique_id(library);
            return py::bytes(id.data(), id.size());
          },
          py::arg("library_path") = "", "A new group id (rank 0 makes it and sends it to the others).")
      .def_static("nccl_version", &cuda::NcclCommunicator::version, py::arg("library_path") = "")
      .def(
          "all_reduce",
          [](cuda::NcclCommunicator& c, uintptr_t send, uintptr_t recv, size_t count, int32_t dtype,
             uintptr_t stream) {
            const cuda::DType t = to_cuda_dtype(dtype);
            py::gil_scoped_release release;
            c.all_reduce(device_ptr<const void>(send), device_ptr<void>(recv), count, t, to_stream(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("stream"),
          "Sum over ranks on `stream` (pointers as ints; recv may equal send).")
      .def("destroy", &cuda::NcclCommunicator::destroy)
      .def_property_readonly("world_size", &cuda::NcclCommunicator::world_size)
      .def_property_readonly("rank", &cuda::NcclCommunicator::rank)
      .def_property_readonly("device", &cuda::NcclCommunicator::device)
      .def_property_readonly("destroyed", &cuda::NcclCommunicator::destroyed);
}

}  // namespace bindings
}  // namespace pagedcore

#endif  // PAGEDCORE_HAS_CUDA
