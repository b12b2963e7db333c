// A CPU emulator for this folder's kernels, so that their index arithmetic, masking, online softmax
// and barriers are tested on machines with no GPU (CI, laptops). Test builds only: compiled when
// PAGEDCORE_CUDA_EMULATION is defined, never into pagedcore._core.
//
// Each CUDA thread of a block runs as a cooperative fiber (ucontext) on one OS thread; blocks run
// one after another. A fiber runs until it reaches a barrier (__syncthreads, __syncwarp, a shuffle;
// wmma operations imply none, as on the GPU), so a missing barrier shows up as a read of data
// another thread has not written yet. Shared memory starts as 0xff bytes (NaN in
// every float type) so that a read of never-written shared memory poisons the result.
//
// What it does not model: timing, memory coalescing, bank conflicts, warp divergence costs, and
// the hardware's freedom to reorder unsynchronised accesses in other ways than these two
// deterministic schedules (threads in order, or in reverse order).
#pragma once

#include <vector_functions.h>  // make_uint3, make_uint4, make_float4
#include <vector_types.h>      // dim3, uint3, uint4, float4: host-compilable plain structs

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>

namespace pagedcore {
namespace cuda {
namespace emu {

struct ThreadContext {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  int linear_thread = 0;  // x + y * bx + z * bx * by
};

enum class Order { kForward, kReverse };

// Runs body once per thread of every block of the grid, blocks in order, threads as fibers.
void launch(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body);
// Which thread runs the next fiber first after a barrier; tests run both to expose missing barriers.
void set_order(Order order);

const ThreadContext& self();
char* shared_memory();
void sync_block();
void sync_warp();
// Warp shuffle: writes `bytes` of `value` to this lane's mailbox, waits for the warp, reads
// `src_lane`'s mailbox into `out`, waits again.
void warp_exchange(const void* value, void* out, size_t bytes, int src_lane);

}  // namespace emu
}  // namespace cuda
}  // namespace pagedcore

// ---- the CUDA built-ins the kernels use, as the emulator provides them ----
#define threadIdx (::pagedcore::cuda::emu::self().thread_idx)
#define blockIdx (::pagedcore::cuda::emu::self().block_idx)
#define blockDim (::pagedcore::cuda::emu::self().block_dim)
#define gridDim (::pagedcore::cuda::emu::self().grid_dim)
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

[[noreturn]] inline void __trap() { std::abort(); }
inline void __syncthreads() { ::pagedcore::cuda::emu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::pagedcore::cuda::emu::sync_warp(); }

template <typename T>
T __shfl_xor_sync(unsigned, T value, int lane_mask, int width = 32) {
  const int lane = ::pagedcore::cuda::emu::self().linear_thread % 32;
  const int segment = lane & ~(width - 1);
  const int src = segment | ((lane ^ lane_mask) & (width - 1));
  T out;
  ::pagedcore::cuda::emu::warp_exchange(&value, &out, sizeof(T), src);
  return out;
}

template <typename T>
T __shfl_sync(unsigned, T value, int src_lane, int width = 32) {
  const int lane = ::pagedcore::cuda::emu::self().linear_thread % 32;
  const int src = (lane & ~(width - 1)) | (src_lane & (width - 1));
  T out;
  ::pagedcore::cuda::emu::warp_exchange(&value, &out, sizeof(T), src);
  return out;
}

// nvcuda::wmma with whole-matrix fragments: every lane holds the full 16x16 tile, loads read all
// of it (so data other lanes have not stored yet is seen stale), stores write only this lane's
// 1/32 share (so a read of a stored tile before __syncwarp is seen stale too). Products accumulate
// in fp32 from the stored bf16/fp16 inputs, as the tensor cores do.
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator models the 16x16x16 shape only");
  static constexpr int num_elements = 256;
  T x[256];  // x[row * 16 + col] of the logical tile (A: MxK, B: KxN, accumulator: MxN)
};

// What the hardware requires of every wmma load/store: a 256-bit aligned tile start and a leading
// dimension that is a multiple of 16 bytes.
inline void check_tile(const void* p, unsigned ldm, size_t element_bytes) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * element_bytes) % 16 != 0) {
    std::fprintf(stderr, "cuda emulator: wmma tile at %p with ldm %u breaks the 32-byte/16-byte alignment rule\n", p, ldm);
    std::abort();
  }
}

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  check_tile(p, ldm, sizeof(T));
  constexpr bool kRowMajor = std::is_same<Layout, row_major>::value;
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = kRowMajor ? p[r * ldm + c] : p[c * ldm + r];
  }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  check_tile(p, ldm, sizeof(float));
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  check_tile(p, ldm, sizeof(float));
  const int lane = ::pagedcore::cuda::emu::self().linear_thread % 32;
  for (int i = lane; i < 256; i += 32) {
    const int r = i / 16, c = i % 16;
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[i];
  }
}

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T value) {
  for (auto& e : f.x) e = value;
}

template <typename T, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int r = 0; r < 16; ++r) {
    for (int n = 0; n < 16; ++n) {
      float sum = c.x[r * 16 + n];
      for (int k = 0; k < 16; ++k) sum += static_cast<float>(a.x[r * 16 + k]) * static_cast<float>(b.x[k * 16 + n]);
      out[r * 16 + n] = sum;
    }
  }
  std::memcpy(d.x, out, sizeof out);
}

}  // namespace wmma
}  // namespace nvcuda
