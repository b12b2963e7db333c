// logprobs_rows: the logprobs a request asks for, from each row of raw fp32 logits: the chosen
// token's log-probability and rank, and the row's top-K tokens with theirs (vLLM's layout: column 0
// the chosen token, columns 1..K the most likely first).
//
// Why in C++: torch's ops for one 49,152-wide row (gather, a compare and count, topk, amax, exp, sum,
// log) took ~0.58 ms a step on the 2-core AMD EPYC Zen 4 (2026-12-03): 10% of a single-stream Q4_1
// token of a request with logprobs. Here a row costs one pass for the rank, the maximum and the top-K,
// and the sampler's exp pass (sample_rows_pass.h) for the normaliser.
//
// Semantics (pagedcore/sampling/logprobs.py, which calls this for CPU logits):
//   log_normaliser = log(sum_i exp(l_i - max)) + max     (fp32; weights under exp(-87) count as 0)
//   logprob(t)     = l_t - log_normaliser
//   rank(t)        = #{ i : l_i >= l_t }                  (1-based; 0 when l_t is NaN)
//   top-K          = the K largest logits, ties by the lower token id first; NaN counts as the largest
// The row's values are overwritten (the exp pass runs in place): pass a copy.
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"

namespace pagedcore {
namespace kernels {

struct LogprobsRowsParams {
  float* logits = nullptr;          // [num_rows, vocab], rows row_stride floats apart; consumed
  int64_t num_rows = 0;
  int64_t vocab = 0;                // > 0
  int64_t row_stride = 0;           // >= vocab
  const int64_t* token_ids = nullptr;  // [num_rows] the chosen token of each row, in [0, vocab)
  int64_t num_top = 0;              // K, in [0, vocab]
  int64_t* out_ids = nullptr;       // [num_rows, num_top + 1]
  float* out_logprobs = nullptr;    // [num_rows, num_top + 1]
  int64_t* out_ranks = nullptr;     // [num_rows]
};

Status logprobs_rows(const LogprobsRowsParams& p);

}  // namespace kernels
}  // namespace pagedcore
