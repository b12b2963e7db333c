// Types shared by the CUDA launchers and their callers (the binding, the emulated tests): dtype
// codes and the stream type. Host-only, torch-free and Python-free; no CUDA runtime call is made here.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t: plain declarations, no runtime linkage

#include <cstdint>

#include "core/common.h"  // kNullBlock, kPadSlot: the sentinels are defined once, there

namespace pagedcore {
namespace cuda {

// Element type of an activation or cache buffer. Codes 0 and 1 are those of the CPU kernels
// (cpp/kernels/kernel_types.h); fp16 exists only on the GPU. Shared with python/pagedcore/ops/dtypes.py.
enum class DType : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

inline bool valid_dtype(int32_t code) { return code >= 0 && code <= 2; }
inline int64_t dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
  return t == DType::kFloat32 ? "float32" : t == DType::kBFloat16 ? "bfloat16" : "float16";
}

}  // namespace cuda
}  // namespace pagedcore
