// An NCCL communicator for tensor parallelism (all-reduce of partial sums after attention and MLP).
// libnccl.so.2 is loaded with dlopen at run time: the CUDA toolkit does not ship it, so the build
// never links it, and a machine without it gets a clear error only when a communicator is asked for.
// On GPU machines the pip package nvidia-nccl-cu13 provides it (python/pagedcore/ops/nccl.py
// finds it there).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda_types.h"

namespace pagedcore {
namespace cuda {

constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
using NcclUniqueId = std::array<char, kNcclUniqueIdBytes>;

// Errors are std::runtime_error with NCCL's own message and what to do about it.
class NcclCommunicator {
 public:
  // Which library to load: `library_path` when not empty, else $PAGEDCORE_NCCL_LIBRARY, else
  // "libnccl.so.2" through the dynamic loader's search path. Loaded once per process.
  static NcclUniqueId unique_id(const std::string& library_path = "");
  // "major.minor.patch" of the loaded library.
  static std::string version(const std::string& library_path = "");

  // Joins the group: blocks until all world_size ranks have called it with the same id. Makes
  // `device` current for the call and restores the previous device afterwards.
  NcclCommunicator(int world_size, int rank, const NcclUniqueId& id, int device, const std::string& library_path = "");
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Sum over ranks of `count` elements of `dtype` on `stream` (recv may equal send: in place).
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, cudaStream_t stream);
  // Frees the communicator (also done by the destructor); later calls raise.
  void destroy();

  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  int device() const { return device_; }
  bool destroyed() const { return comm_ == nullptr; }

 private:
  void* comm_ = nullptr;  // ncclComm_t
  int world_size_ = 0;
  int rank_ = 0;
  int device_ = 0;
};

}  // namespace cuda
}  // namespace pagedcore
