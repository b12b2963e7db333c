// Batched multi-LoRA: y[t] += B_a (A_a x[t]) for every token t whose sequence runs adapter a, many
// adapters in one call (punica's SGMV idea on the CPU). Torch-free and Python-free.
//
// Each adapter lives in a "slot" of per-layer weight stacks. A fused layer (qkv, gate_up) has
// several output slices, each with its own A and B; the stacks hold them side by side along the
// rank dimension, transposed so both inner loops run over contiguous memory (axpy, no reduction):
//
//   a_t [num_slots, in, num_slices * max_rank]   A^T; slice s uses columns [s*R, s*R + ranks[a, s])
//   b_t [num_slots, num_slices * max_rank, out]  (scaling * B)^T; row s*R + k only in slice s's columns
//
//   token rows, grouped by slot (built by the caller from the step's sequences):
//     token_indices:  4 5 6 | 0 1 | 9          rows of x and y
//     segment_slots:  2     | 0   | 3          the slot of each group
//     segment_starts: 0       3     5   6      [num_segments + 1] into token_indices
//
// shrink:  u[t, s*R + k] = sum_i x[t, i] * a_t[a, i, s*R + k]        k < ranks[a, s]
// expand:  y[t, o]      += sum_k u[t, s*R + k] * b_t[a, s*R + k, o]  o in slice s's columns
// Rows not listed (base-model tokens) are not touched.
#pragma once

#include <cstdint>

#include "kernels/cpu_isa.h"
#include "kernels/kernel_types.h"

namespace pagedcore {
namespace kernels {

struct LoRAParams {
  const void* x = nullptr;               // [num_tokens, in_features] rows x_stride elements apart, dtype
  void* y = nullptr;                     // [num_tokens, out_features] rows y_stride apart, dtype; added into
  const float* a_t = nullptr;            // [num_slots, in_features, num_slices * max_rank]
  const float* b_t = nullptr;            // [num_slots, num_slices * max_rank, out_features]
  const int32_t* ranks = nullptr;        // [num_slots, num_slices] 0..max_rank (0: slice not adapted)
  const int32_t* slice_starts = nullptr; // [num_slices + 1] first output column of each slice, then out_features
  const int32_t* token_indices = nullptr;  // [num_lora_tokens] rows of x / y, grouped by slot
  const int32_t* segment_slots = nullptr;  // [num_segments]
  const int32_t* segment_starts = nullptr; // [num_segments + 1] 0 .. num_lora_tokens
  int64_t num_tokens = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  int64_t x_stride = 0;
  int64_t y_stride = 0;
  int64_t num_slots = 0;
  int64_t num_slices = 0;
  int64_t max_rank = 0;
  int64_t num_segments = 0;
  DType dtype = DType::kFloat32;
};

// Checks every index and size (nothing is written on an error), then runs the kernel for `isa`
// (AVX2 and up: the AVX2 build; else the portable one).
Status lora_shrink_expand(const LoRAParams& p, Isa isa);

// The weight side of LoRAParams for one adapted linear layer: its slot stacks, bound once (the C++
// decoder stack keeps one per linear of every layer). An adapter loaded into a slot rewrites the
// stacks in place, so the pointers stay valid. a_t == nullptr: the layer has no adapter stacks.
struct LoRAStacks {
  const float* a_t = nullptr;             // [num_slots, in_features, num_slices * max_rank]
  const float* b_t = nullptr;             // [num_slots, num_slices * max_rank, out_features]
  const int32_t* ranks = nullptr;         // [num_slots, num_slices]
  const int32_t* slice_starts = nullptr;  // [num_slices + 1]
  int64_t num_slots = 0;
  int64_t num_slices = 0;
  int64_t max_rank = 0;
};

// The step side: the token rows that run an adapter, grouped by slot (as in LoRAParams).
struct LoRASegments {
  const int32_t* token_indices = nullptr;   // [num_lora_tokens]
  const int32_t* segment_slots = nullptr;   // [num_segments]
  const int32_t* segment_starts = nullptr;  // [num_segments + 1]
  int64_t num_segments = 0;                 // 0: no adapter rows this step
};

// y[t] += B_a A_a x[t] for the listed rows of one layer: x [num_tokens, in_features] (x_stride),
// y [num_tokens, out_features] (y_stride), both `dtype`. Checked as lora_shrink_expand checks.
Status lora_apply(const LoRAStacks& w, const LoRASegments& s, const void* x, int64_t x_stride, void* y,
                  int64_t y_stride, int64_t num_tokens, int64_t in_features, int64_t out_features, DType dtype,
                  Isa isa);

}  // namespace kernels
}  // namespace pagedcore
