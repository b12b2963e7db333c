// logit_edits: the edits a request's sampling settings make to its logits row before a token is drawn,
// on the (row, token) pairs involved only, in the Sampler's order (pagedcore/sampling/penalties.py):
//
//   1. logit_bias           l += bias                         (one pair per (row, token))
//   2. min_tokens bans      l  = -inf                         (EOS and stop ids of rows still short)
//   3. repetition_penalty   l  = l > 0 ? l / p : l * p        (HF; prompt and output tokens, each pair once)
//   4. presence/frequency   l  = l - presence, then count times l = l + (-frequency)
//                                                             (OpenAI; output tokens, each pair once with
//                                                              its number of occurrences)
//
// Why in C++: the one-call step (greedy_decode.h) keeps its logits in C++; with these, a step whose
// rows carry penalties, a logit bias or min_tokens runs as one call too instead of the Python forward.
// Each edit is the same fp32 operation, in the same order, as the torch stages make (stage 4's
// additions one occurrence at a time, as torch's serial index_put_(accumulate=True) does), so the
// edited logits are the Python path's bit for bit (tests/kernels/test_logit_edits.py).
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"

namespace pagedcore {
namespace kernels {

struct LogitEditsParams {
  // 1. logit_bias: [num_bias] each
  const int32_t* bias_rows = nullptr;
  const int32_t* bias_tokens = nullptr;
  const float* bias_values = nullptr;
  int64_t num_bias = 0;
  // 2. bans: [num_bans] each
  const int32_t* ban_rows = nullptr;
  const int32_t* ban_tokens = nullptr;
  int64_t num_bans = 0;
  // 3. repetition: [num_repetition] distinct pairs; repetition_penalty [num_rows], > 0
  const int32_t* repetition_rows = nullptr;
  const int32_t* repetition_tokens = nullptr;
  int64_t num_repetition = 0;
  const float* repetition_penalty = nullptr;
  // 4. presence / frequency: [num_counted] distinct pairs and each one's occurrences (>= 1);
  // presence_penalty, frequency_penalty [num_rows]
  const int32_t* counted_rows = nullptr;
  const int32_t* counted_tokens = nullptr;
  const int32_t* counts = nullptr;
  int64_t num_counted = 0;
  const float* presence_penalty = nullptr;
  const float* frequency_penalty = nullptr;

  bool empty() const { return num_bias == 0 && num_bans == 0 && num_repetition == 0 && num_counted == 0; }
};

// Every pair inside [0, num_rows) x [0, vocab), counts >= 1, penalties and biases finite (repetition
// penalties > 0), pointers present where their stage has pairs. Checked before anything is written.
Status check_logit_edits(const LogitEditsParams& e, int64_t num_rows, int64_t vocab);

// Applies the four stages to logits [num_rows, row_stride] (checked first).
Status apply_logit_edits(const LogitEditsParams& e, float* logits, int64_t num_rows, int64_t vocab,
                         int64_t row_stride);

}  // namespace kernels
}  // namespace pagedcore
