// silu_mul (silu_mul.h): the linear kernel's SwiGLU epilogue on a stored gate/up output.
#include "kernels/silu_mul.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/linear_kernel.h"
#include "kernels/parallel.h"

namespace pagedcore {
namespace kernels {
namespace {

constexpr int64_t kRowsPerTask = 4;  // rows of one task: enough work per hand-out at decode sizes

// Rows [r0, r1): fp32 input is read in place; bf16 is widened into scratch first (exactly: the
// epilogue's bf16 rounding of g and u then leaves them as stored).
void run_rows(const SiluMulParams& p, const LinearEpilogueFn epilogue, int64_t r0, int64_t r1,
              std::vector<float>& scratch) {
  const int64_t es = dtype_size(p.dtype), n = r1 - r0, width = 2 * p.cols;
  LinearEpilogueArgs e;
  if (p.dtype == DType::kFloat32) {
    e.g = static_cast<const float*>(p.gate_up) + r0 * p.in_stride;
    e.sum_stride = p.in_stride;
  } else {
    scratch.resize(static_cast<size_t>(n * width));  // [n, 2 cols] fp32
    for (int64_t r = 0; r < n; ++r) {
      const uint16_t* src = static_cast<const uint16_t*>(p.gate_up) + (r0 + r) * p.in_stride;
      float* dst = scratch.data() + r * width;
      for (int64_t c = 0; c < width; ++c) dst[c] = bf16_to_float(src[c]);
    }
    e.g = scratch.data();
    e.sum_stride = width;
  }
  e.u = e.g + p.cols;
  e.out = static_cast<char*>(p.out) + r0 * p.out_stride * es;
  e.out_stride = p.out_stride;
  e.rows = n;
  e.cols = p.cols;
  e.out_dtype = p.dtype;
  e.kind = LinearEpilogue::kSiluMul;
  epilogue(e);
}

}  // namespace

Status silu_mul(const SiluMulParams& p, Isa isa) {
  const auto str = [](int64_t v) { return std::to_string(v); };
  if (p.rows < 0 || p.cols < 0) return Status::invalid("silu_mul: negative size");
  if (p.rows == 0 || p.cols == 0) return Status::ok();
  if (!p.gate_up || !p.out) return Status::invalid("silu_mul: a data pointer is null");
  if (p.in_stride < 2 * p.cols || p.out_stride < p.cols)
    return Status::invalid("silu_mul: row strides (" + str(p.in_stride) + ", " + str(p.out_stride) +
                           ") are shorter than the rows (" + str(2 * p.cols) + ", " + str(p.cols) + ")");
  if (!isa_supported(isa))
    return Status::invalid(std::string("silu_mul: this CPU (or build) cannot run the ") + isa_name(isa) + " kernel");
  const LinearEpilogueFn epilogue = linear_isa_kernels(isa).epilogue;
  const int64_t tasks = (p.rows + kRowsPerTask - 1) / kRowsPerTask;
  if (tasks == 1 || p.rows * p.cols < (1 << 14)) {  // decode sizes: a thread hand-off costs more than the work
    std::vector<float> scratch;
    run_rows(p, epilogue, 0, p.rows, scratch);
    return Status::ok();
  }
  std::vector<std::vector<float>> scratch(static_cast<size_t>(std::max(1, max_threads())));
  parallel_for(static_cast<int>(tasks), [&](int t, int thread) {
    const int64_t r0 = t * kRowsPerTask;
    run_rows(p, epilogue, r0, std::min(p.rows, r0 + kRowsPerTask), scratch[static_cast<size_t>(thread)]);
  });
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
