// What every kernel in cuda/ includes: the CUDA headers (or, in test builds on machines with no
// GPU, the CPU emulator of emulator.h), conversions between fp32/bf16/fp16, 16-byte vector loads,
// warp reductions, and the launch macro that hides the <<<>>> syntax from the emulated build.
// No torch or pybind11 include may appear under cuda/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_types.h"

#ifdef PAGEDCORE_CUDA_EMULATION
#include "emulator.h"
// One declaration everywhere: every kernel's dynamic shared memory, 128-byte aligned.
#define PC_SHARED_MEMORY(name) char* name = ::pagedcore::cuda::emu::shared_memory()
#define PC_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ::pagedcore::cuda::emu::launch(grid, block, shared_bytes, [&] { kernel(__VA_ARGS__); })
#else
#include <cuda_runtime.h>
#include <mma.h>
#define PC_SHARED_MEMORY(name) extern __shared__ __align__(128) char name[]
#define PC_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<grid, block, shared_bytes, stream>>>(__VA_ARGS__)
#endif

namespace pagedcore {
namespace cuda {

constexpr float kLog2e = 1.4426950408889634f;

// ---- host-side launch helpers (no-ops or constants in the emulated build) ----
#ifdef PAGEDCORE_CUDA_EMULATION
template <typename Kernel>
inline cudaError_t allow_shared_memory(Kernel, size_t) { return cudaSuccess; }
inline int num_multiprocessors() { return 132; }  // an H200
inline int compute_capability_major() { return 9; }
inline cudaError_t last_launch_error() { return cudaSuccess; }
#else
// Kernels that use more than 48 KiB of dynamic shared memory must say so once per device.
template <typename Kernel>
inline cudaError_t allow_shared_memory(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}
inline int num_multiprocessors() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 132;
  }
  return count;
}
inline int compute_capability_major() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major;
}
inline cudaError_t last_launch_error() { return cudaGetLastError(); }
#endif

// ---- element conversions (host and device) ----
template <typename T>
struct Num;
template <>
struct Num<float> {
  static __host__ __device__ __forceinline__ float to_float(float x) { return x; }
  static __host__ __device__ __forceinline__ float from_float(float x) { return x; }
};
template <>
struct Num<__nv_bfloat16> {
  static __host__ __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  // round to nearest even, as torch's .to(torch.bfloat16)
  static __host__ __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16(x); }
};
template <>
struct Num<__half> {
  static __host__ __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __host__ __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};

template <typename To, typename From>
__host__ __device__ __forceinline__ To convert(From x) {
  return Num<To>::from_float(Num<From>::to_float(x));
}
template <>
__host__ __device__ __forceinline__ float convert<float, float>(float x) {
  return x;
}

// Reads/writes one element of a buffer whose dtype is known only at run time (query, out): used
// once per element per CTA, never in an inner loop.
__host__ __device__ __forceinline__ float load_as_float(const void* base, int64_t index, DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    case DType::kFloat16: return __half2float(static_cast<const __half*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}
__host__ __device__ __forceinline__ void store_from_float(void* base, int64_t index, DType dtype, float value) {
  switch (dtype) {
    case DType::kBFloat16: static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16(value); break;
    case DType::kFloat16: static_cast<__half*>(base)[index] = __float2half_rn(value); break;
    default: static_cast<float*>(base)[index] = value; break;
  }
}

// ---- 16-byte vectors: kVec<T> elements of T in one uint4 ----
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

__host__ __device__ __forceinline__ float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// The kVec<T> elements of `raw` as floats, in memory order.
template <typename T>
__host__ __device__ __forceinline__ void unpack(const uint4& raw, float* out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (std::is_same<T, float>::value) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = bits_to_float(w[i]);
  } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = bits_to_float(w[i] << 16);            // low half comes first in memory
      out[2 * i + 1] = bits_to_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half_raw lo, hi;
      lo.x = static_cast<unsigned short>(w[i] & 0xffffu);
      hi.x = static_cast<unsigned short>(w[i] >> 16);
      out[2 * i] = __half2float(__half(lo));
      out[2 * i + 1] = __half2float(__half(hi));
    }
  }
}

template <typename T>
__host__ __device__ __forceinline__ uint4 load16(const T* p) {
#ifdef PAGEDCORE_CUDA_EMULATION
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) __trap();  // the GPU faults on a misaligned 16-byte load
#endif
  return *reinterpret_cast<const uint4*>(p);
}

// ---- warp reductions over groups of `width` consecutive lanes (a power of two <= 32) ----
template <int width>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = width / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__host__ __device__ constexpr int ilog2(int x) { return x <= 1 ? 0 : 1 + ilog2(x / 2); }
__host__ __device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
// The max a softmax subtracts: a row that has seen no key yet (max -inf) subtracts 0, so that
// exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN.
__host__ __device__ __forceinline__ float safe_max(float m) { return m == -INFINITY ? 0.f : m; }

}  // namespace cuda
}  // namespace pagedcore
