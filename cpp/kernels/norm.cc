// Launchers of norm.h's ops: check, then run the chosen ISA's row function, over threads when the
// call is big enough to pay for a parallel region.
#include "kernels/norm.h"

#include <algorithm>
#include <string>

#include "kernels/linear_kernel.h"
#include "kernels/parallel.h"

namespace pagedcore {
namespace kernels {
namespace {

// Elements per task; below two tasks the call runs on the calling thread (a parallel region costs
// a few microseconds, a decode row of a small model well under one).
constexpr int64_t kElementsPerTask = 16384;

std::string str(int64_t v) { return std::to_string(v); }

template <typename F>
void for_rows(int64_t rows, int64_t elements_per_row, F&& fn) {
  const int64_t per_task = std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, elements_per_row));
  const int64_t tasks = (rows + per_task - 1) / per_task;
  if (tasks <= 1) {
    fn(int64_t{0}, rows);
    return;
  }
  parallel_for(static_cast<int>(tasks), [&](int task, int) {
    const int64_t begin = task * per_task;
    fn(begin, std::min(rows, begin + per_task));
  });
}

bool valid(DType t) { return t == DType::kFloat32 || t == DType::kBFloat16; }

}  // namespace

Status rms_norm(const RmsNormParams& p) { return rms_norm(p, active_isa()); }

Status rms_norm(const RmsNormParams& p, Isa isa) {
  if (p.rows < 0 || p.n <= 0) return Status::invalid("rms_norm: rows must be >= 0 and n > 0, got rows " +
                                                    str(p.rows) + ", n " + str(p.n));
  if (!valid(p.dtype)) return Status::invalid("rms_norm: unknown dtype");
  if (!(p.eps >= 0.f)) return Status::invalid("rms_norm: eps must be >= 0");
  if (p.rows == 0) return Status::ok();
  if (!p.out || !p.x || !p.weight) return Status::invalid("rms_norm: a data pointer is null");
  if (p.x_stride < 0 || p.out_stride < 0 || p.residual_stride < 0)
    return Status::invalid("rms_norm: negative row stride");
  if (p.rows > 1 && (p.x_stride < p.n || p.out_stride < p.n || (p.residual && p.residual_stride < p.n)))
    return Status::invalid("rms_norm: a row stride is smaller than n = " + str(p.n) + "; rows would overlap");
  if (!isa_supported(isa))
    return Status::invalid(std::string("rms_norm: this CPU cannot run the ") + isa_name(isa) + " kernel");
  const LinearIsaKernels& k = linear_isa_kernels(isa);
  for_rows(p.rows, p.n, [&](int64_t begin, int64_t end) { k.rms_norm_rows(p, begin, end); });
  return Status::ok();
}

Status rotary_embedding(const RotaryParams& p) { return rotary_embedding(p, active_isa()); }

Status rotary_embedding(const RotaryParams& p, Isa isa) {
  if (p.num_tokens < 0 || p.num_heads < 0) return Status::invalid("rotary_embedding: negative size");
  if (p.head_dim <= 0 || p.head_dim % 2 != 0)
    return Status::invalid("rotary_embedding: head_dim must be positive and even, got " + str(p.head_dim));
  if (!valid(p.dtype)) return Status::invalid("rotary_embedding: unknown dtype");
  if (p.num_tokens == 0 || p.num_heads == 0) return Status::ok();
  if (!p.x || !p.cos_sin) return Status::invalid("rotary_embedding: a data pointer is null");
  if (p.x_stride_token < 0 || p.x_stride_head < 0 || p.cos_sin_stride < 0)
    return Status::invalid("rotary_embedding: negative stride");
  if ((p.num_heads > 1 && p.x_stride_head < p.head_dim) ||
      (p.num_tokens > 1 && p.x_stride_token < p.x_stride_head * (p.num_heads - 1) + p.head_dim) ||
      (p.num_tokens > 1 && p.cos_sin_stride < p.head_dim))
    return Status::invalid("rotary_embedding: strides make heads or tokens overlap");
  if (!isa_supported(isa))
    return Status::invalid(std::string("rotary_embedding: this CPU cannot run the ") + isa_name(isa) + " kernel");
  const LinearIsaKernels& k = linear_isa_kernels(isa);
  for_rows(p.num_tokens, p.num_heads * p.head_dim,
           [&](int64_t begin, int64_t end) { k.rotary_rows(p, begin, end); });
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
