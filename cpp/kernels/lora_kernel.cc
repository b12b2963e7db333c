// The multi-LoRA launcher: argument checks (nothing is written on an error), then the kernel of
// the chosen instruction set.
#include "kernels/lora_kernel.h"

#include <string>
#include <vector>

namespace pagedcore {
namespace kernels {

namespace lora_generic {
void lora_shrink_expand(const LoRAParams& p);
}
#if defined(PAGEDCORE_KERNELS_X86)
namespace lora_avx2 {
void lora_shrink_expand(const LoRAParams& p);
}
#endif

namespace {

Status check(const LoRAParams& p) {
  const auto str = [](int64_t v) { return std::to_string(v); };
  if (!p.x || !p.y || !p.a_t || !p.b_t || !p.ranks || !p.slice_starts || !p.segment_starts) {
    return Status::invalid("lora_shrink_expand: a required pointer is null");
  }
  if (p.num_tokens < 0 || p.in_features <= 0 || p.out_features <= 0 || p.num_slots <= 0 || p.num_slices <= 0 ||
      p.max_rank <= 0 || p.num_segments < 0) {
    return Status::invalid("lora_shrink_expand: sizes must be positive (in " + str(p.in_features) + ", out " +
                           str(p.out_features) + ", slots " + str(p.num_slots) + ", slices " + str(p.num_slices) +
                           ", max_rank " + str(p.max_rank) + ")");
  }
  if (p.x_stride < p.in_features || p.y_stride < p.out_features) {
    return Status::invalid("lora_shrink_expand: row strides (" + str(p.x_stride) + ", " + str(p.y_stride) +
                           ") are shorter than the rows (" + str(p.in_features) + ", " + str(p.out_features) + ")");
  }
  if (p.slice_starts[0] != 0 || p.slice_starts[p.num_slices] != p.out_features) {
    return Status::invalid("lora_shrink_expand: slice_starts must run from 0 to out_features (" +
                           str(p.out_features) + ")");
  }
  for (int64_t s = 0; s < p.num_slices; ++s) {
    if (p.slice_starts[s] > p.slice_starts[s + 1]) {
      return Status::invalid("lora_shrink_expand: slice_starts must not decrease (slice " + str(s) + ")");
    }
  }
  for (int64_t i = 0; i < p.num_slots * p.num_slices; ++i) {
    if (p.ranks[i] < 0 || p.ranks[i] > p.max_rank) {
      return Status::out_of_range("lora_shrink_expand: ranks[" + str(i / p.num_slices) + ", " + str(i % p.num_slices) +
                                  "] = " + str(p.ranks[i]) + " is outside [0, max_rank " + str(p.max_rank) + "]");
    }
  }
  if (p.segment_starts[0] != 0) return Status::invalid("lora_shrink_expand: segment_starts must start at 0");
  std::vector<char> seen(static_cast<size_t>(p.num_tokens), 0);
  for (int64_t g = 0; g < p.num_segments; ++g) {
    if (p.segment_slots[g] < 0 || p.segment_slots[g] >= p.num_slots) {
      return Status::out_of_range("lora_shrink_expand: segment " + str(g) + " names slot " + str(p.segment_slots[g]) +
                                  " of " + str(p.num_slots));
    }
    if (p.segment_starts[g + 1] < p.segment_starts[g]) {
      return Status::invalid("lora_shrink_expand: segment_starts must not decrease (segment " + str(g) + ")");
    }
    for (int32_t i = p.segment_starts[g]; i < p.segment_starts[g + 1]; ++i) {
      const int32_t row = p.token_indices[i];
      if (row < 0 || row >= p.num_tokens) {
        return Status::out_of_range("lora_shrink_expand: token_indices[" + str(i) + "] = " + str(row) +
                                    " is outside [0, " + str(p.num_tokens) + ")");
      }
      if (seen[static_cast<size_t>(row)]) {
        return Status::invalid("lora_shrink_expand: token row " + str(row) + " is listed twice");
      }
      seen[static_cast<size_t>(row)] = 1;
    }
  }
  return Status::ok();
}

}  // namespace

Status lora_shrink_expand(const LoRAParams& p, Isa isa) {
  Status status = check(p);
  if (!status.is_ok()) return status;
#if defined(PAGEDCORE_KERNELS_X86)
  if (isa != Isa::kGeneric && isa != Isa::kGeneric16 && isa != Isa::kGeneric16Bf16 && isa_supported(Isa::kAvx2)) {
    lora_avx2::lora_shrink_expand(p);
    return status;
  }
#endif
  lora_generic::lora_shrink_expand(p);
  return status;
}

Status lora_apply(const LoRAStacks& w, const LoRASegments& s, const void* x, int64_t x_stride, void* y,
                  int64_t y_stride, int64_t num_tokens, int64_t in_features, int64_t out_features, DType dtype,
                  Isa isa) {
  LoRAParams p;
  p.x = x;
  p.y = y;
  p.a_t = w.a_t;
  p.b_t = w.b_t;
  p.ranks = w.ranks;
  p.slice_starts = w.slice_starts;
  p.token_indices = s.token_indices;
  p.segment_slots = s.segment_slots;
  p.segment_starts = s.segment_starts;
  p.num_tokens = num_tokens;
  p.in_features = in_features;
  p.out_features = out_features;
  p.x_stride = x_stride;
  p.y_stride = y_stride;
  p.num_slots = w.num_slots;
  p.num_slices = w.num_slices;
  p.max_rank = w.max_rank;
  p.num_segments = s.num_segments;
  p.dtype = dtype;
  return lora_shrink_expand(p, isa);
}

}  // namespace kernels
}  // namespace pagedcore
