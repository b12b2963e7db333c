// argmax_rows: the greedy token of each row of fp32 logits, exactly as torch.argmax(dim=-1) picks it.
//
// Why in C++: torch's CPU argmax over one 49152-wide row took ~45-50 us (a reduction that does not
// vectorise), about 1% of a single-stream decode token; over a batch it ran rows on torch's thread
// team, ~50 us a row. This reads each row at memory speed (see argmax_rows.cc).
//
// Semantics (torch's): the first index of the row's maximum; a NaN counts as larger than every
// number, so a row with NaNs gives the index of its first NaN; -0.0 and +0.0 are equal (the first
// wins); a row of -inf gives 0.
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"

namespace pagedcore {
namespace kernels {

struct ArgmaxRowsParams {
  const float* logits = nullptr;  // [num_rows, vocab], rows row_stride floats apart
  int64_t num_rows = 0;
  int64_t vocab = 0;              // > 0
  int64_t row_stride = 0;         // >= vocab
  int64_t* out = nullptr;         // [num_rows]
};

Status argmax_rows(const ArgmaxRowsParams& p);

}  // namespace kernels
}  // namespace pagedcore
