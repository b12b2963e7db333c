// NcclCommunicator: libnccl.so.2 through dlopen (see nccl_communicator.h). The few NCCL types used
// are declared here with their ABI values (nccl.h, stable since NCCL 2.10), so no NCCL header is needed.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "nccl_communicator.h"

namespace pagedcore {
namespace cuda {
namespace {

using ncclResult_t = int;  // ncclSuccess = 0
using ncclComm_t = void*;
struct ncclUniqueId {
  char internal[kNcclUniqueIdBytes];
};
constexpr int kNcclSum = 0;        // ncclRedOp_t ncclSum
constexpr int kNcclFloat16 = 6;    // ncclDataType_t
constexpr int kNcclFloat32 = 7;
constexpr int kNcclBfloat16 = 9;

struct NcclLibrary {
  void* handle = nullptr;
  std::string path;
  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  const char* (*get_error_string)(ncclResult_t) = nullptr;
};

std::mutex g_mutex;
NcclLibrary g_library;

template <typename Fn>
void resolve(NcclLibrary& lib, Fn* fn, const char* name) {
  *fn = reinterpret_cast<Fn>(dlsym(lib.handle, name));
  if (*fn == nullptr) {
    throw std::runtime_error(std::string("NCCL library ") + lib.path + " has no symbol " + name +
                             "; it is too old or not NCCL (pagedcore needs NCCL >= 2.10)");
  }
}

const NcclLibrary& library(const std::string& requested) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::string path = requested;
  if (path.empty()) {
    const char* env = std::getenv("PAGEDCORE_NCCL_LIBRARY");
    path = env && *env ? env : "libnccl.so.2";
  }
  if (g_library.handle != nullptr) {
    if (!requested.empty() && requested != g_library.path) {
      throw std::runtime_error("NCCL is already loaded from " + g_library.path + "; cannot switch to " + requested +
                               " in the same process");
    }
    return g_library;
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("cannot load the NCCL library '" + path + "' (" + (why ? why : "unknown error") +
                             "); install it with `pip install nvidia-nccl-cu13` (pagedcore.ops.nccl finds it "
                             "there) or point PAGEDCORE_NCCL_LIBRARY at libnccl.so.2");
  }
  NcclLibrary lib;
  lib.handle = handle;
  lib.path = path;
  try {
    resolve(lib, &lib.get_version, "ncclGetVersion");
    resolve(lib, &lib.get_unique_id, "ncclGetUniqueId");
    resolve(lib, &lib.comm_init_rank, "ncclCommInitRank");
    resolve(lib, &lib.comm_destroy, "ncclCommDestroy");
    resolve(lib, &lib.all_reduce, "ncclAllReduce");
    resolve(lib, &lib.get_error_string, "ncclGetErrorString");
  } catch (...) {
    dlclose(handle);
    throw;
  }
  g_library = lib;
  return g_library;
}

void check(const NcclLibrary& lib, ncclResult_t result, const char* what) {
  if (result == 0) return;
  throw std::runtime_error(std::string(what) + " failed: " + lib.get_error_string(result) + " (NCCL error " +
                           std::to_string(result) + "; NCCL_DEBUG=WARN in the environment says more)");
}

void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(status));
}

}  // namespace

NcclUniqueId NcclCommunicator::unique_id(const std::string& library_path) {
  const NcclLibrary& lib = library(library_path);
  ncclUniqueId id;
  check(lib, lib.get_unique_id(&id), "ncclGetUniqueId");
  NcclUniqueId out;
  std::memcpy(out.data(), id.internal, kNcclUniqueIdBytes);
  return out;
}

std::string NcclCommunicator::version(const std::string& library_path) {
  const NcclLibrary& lib = library(library_path);
  int code = 0;
  check(lib, lib.get_version(&code), "ncclGetVersion");
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

NcclCommunicator::NcclCommunicator(int world_size, int rank, const NcclUniqueId& id, int device,
                                   const std::string& library_path)
    : world_size_(world_size), rank_(rank), device_(device) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is not in [0, world_size " +
                                std::to_string(world_size) + ")");
  }
  const NcclLibrary& lib = library(library_path);
  int previous = 0;
  check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId raw;
  std::memcpy(raw.internal, id.data(), kNcclUniqueIdBytes);
  ncclComm_t comm = nullptr;
  const ncclResult_t result = lib.comm_init_rank(&comm, world_size, raw, rank);
  cudaSetDevice(previous);
  check(lib, result, "ncclCommInitRank");
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr && g_library.comm_destroy != nullptr) g_library.comm_destroy(comm_);
}

void NcclCommunicator::destroy() {
  if (comm_ == nullptr) return;
  const NcclLibrary& lib = library("");
  void* comm = comm_;
  comm_ = nullptr;
  check(lib, lib.comm_destroy(comm), "ncclCommDestroy");
}

void NcclCommunicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, cudaStream_t stream) {
  if (comm_ == nullptr) throw std::logic_error("all_reduce on a destroyed NcclCommunicator");
  const NcclLibrary& lib = library("");
  const int nccl_dtype = dtype == DType::kFloat32 ? kNcclFloat32 : dtype == DType::kBFloat16 ? kNcclBfloat16 : kNcclFloat16;
  check(lib, lib.all_reduce(send, recv, count, nccl_dtype, kNcclSum, comm_, stream), "ncclAllReduce");
}

}  // namespace cuda
}  // namespace pagedcore
