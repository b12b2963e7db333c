// argmax_rows (see argmax_rows.h). Two passes over a row: the maximum over 16 lanes (four 4-float
// vectors: m = v > m ? v : m is exactly maxps, which skips NaNs, so an unordered-compare flag tracks
// them), then the first index equal to it (or the first NaN), 16 values a compare, which stops at
// the first hit and re-reads the row from L1/L2.
// GCC / Clang vector extensions, compiled for the baseline ISA (SSE2 on x86-64; NEON elsewhere):
// a 49152-wide row is ~200 KB, read at L2 / memory speed by 4-float vectors already, so a per-ISA
// unit would buy ~1 us a row. (A plain 16-float array loop is not vectorised by GCC 12 at -O3.)
#include "kernels/argmax_rows.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/parallel.h"

namespace pagedcore {
namespace kernels {
namespace {

typedef float F4 __attribute__((vector_size(16)));      // 4 fp32 lanes
typedef int32_t Mask4 __attribute__((vector_size(16)));  // their compare results (0 / -1)

constexpr int64_t kChunk = 16;  // values per step: four F4
// Rows per task for a batch: a task of ~1 MB of logits amortises the hand-out.
constexpr int64_t kTaskFloats = 1 << 18;

F4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool any(Mask4 m) { return (m[0] | m[1] | m[2] | m[3]) != 0; }

// The row's maximum over its ordered values, and whether it holds a NaN. n >= 1.
float row_max(const float* x, int64_t n, bool* has_nan) {
  float m = x[0];
  bool nan = false;
  int64_t i = 0;
  if (n >= kChunk) {
    F4 lanes[4];
    Mask4 nans[4] = {};
    for (int k = 0; k < 4; ++k) lanes[k] = load4(x + 4 * k);
    for (i = 0; i + kChunk <= n; i += kChunk) {
      for (int k = 0; k < 4; ++k) {
        const F4 v = load4(x + i + 4 * k);
        lanes[k] = v > lanes[k] ? v : lanes[k];
        nans[k] |= v != v;
      }
    }
    for (int k = 0; k < 4; ++k) {
      nan |= any(nans[k]);
      for (int l = 0; l < 4; ++l) m = lanes[k][l] > m ? lanes[k][l] : m;
    }
  }
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan |= x[i] != x[i];
  }
  *has_nan = nan;
  return m;
}

// The first index whose value equals `target` (-0.0 == +0.0), or the first NaN when find_nan.
int64_t first_match(const float* x, int64_t n, float target, bool find_nan) {
  int64_t i = 0;
  const F4 t = {target, target, target, target};
  for (; i + kChunk <= n; i += kChunk) {
    Mask4 hit = {};
    for (int k = 0; k < 4; ++k) {
      const F4 v = load4(x + i + 4 * k);
      hit |= find_nan ? (v != v) : (v == t);
    }
    if (any(hit)) break;  // the scalar loop below finds it within this chunk
  }
  for (; i < n; ++i)
    if (find_nan ? x[i] != x[i] : x[i] == target) return i;
  return 0;  // unreachable: the target is one of the row's values
}

int64_t argmax_row(const float* x, int64_t n) {
  bool has_nan = false;
  const float m = row_max(x, n, &has_nan);
  return first_match(x, n, m, has_nan);
}

}  // namespace

Status argmax_rows(const ArgmaxRowsParams& p) {
  if (p.num_rows < 0 || p.vocab <= 0 || p.row_stride < p.vocab)
    return Status::invalid("argmax_rows: invalid sizes (rows " + std::to_string(p.num_rows) + ", vocab " +
                           std::to_string(p.vocab) + ", row_stride " + std::to_string(p.row_stride) + ")");
  if (p.num_rows == 0) return Status::ok();
  if (!p.logits || !p.out) return Status::invalid("argmax_rows: a data pointer is null");
  const int64_t rows_per_task = std::max<int64_t>(1, kTaskFloats / p.vocab);
  if (p.num_rows <= rows_per_task) {  // a decode step's few rows: no fork
    for (int64_t r = 0; r < p.num_rows; ++r) p.out[r] = argmax_row(p.logits + r * p.row_stride, p.vocab);
    return Status::ok();
  }
  const int64_t tasks = (p.num_rows + rows_per_task - 1) / rows_per_task;
  parallel_for(static_cast<int>(tasks), [&](int t, int) {
    const int64_t end = std::min(p.num_rows, (t + 1) * rows_per_task);
    for (int64_t r = t * rows_per_task; r < end; ++r) p.out[r] = argmax_row(p.logits + r * p.row_stride, p.vocab);
  });
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
