// MultiStepEdits: the logit edits (logit_edits.h) of each step of a multi-step (GreedyDecoder::run_steps),
// from the edits a single step would make before the first of them.
//
// Why: a row's repetition / presence / frequency penalties read its output tokens so far and its
// min_tokens bans end once it has enough of them, so inside a multi-step each step's edits are the
// previous step's plus the token it chose. A single step builds them in Python (sampling/logit_edits.py);
// here they advance in C++, to the same pair sets, so every step edits its logits as the single step
// would (the four stages' pairs are distinct (row, token) entries: their order does not change a bit).
//
//   bias          per sequence, the same every step
//   bans          per sequence, while step < ban_steps[s] (min_tokens - outputs before the multi-step)
//   repetition    per sequence with a penalty != 1: the first step's distinct tokens + each chosen token
//   counted       per sequence with presence / frequency != 0: (token, count) + 1 for each chosen token
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kernels/kernel_types.h"
#include "kernels/logit_edits.h"

namespace pagedcore {
namespace kernels {

class MultiStepEdits {
 public:
  // first: the edits of the multi-step's first step over its num_seqs sequences (rows 0..num_seqs-1, as
  // a single step over them makes; checked here); ban_steps [num_seqs] >= 0: the steps each sequence's
  // bans last.
  Status init(const LogitEditsParams& first, const int32_t* ban_steps, int64_t num_seqs, int64_t vocab);
  // The edits of step `step` for the sequences seqs[0..n) still stepping (rows 0..n-1 in that order).
  const LogitEditsParams& at_step(int64_t step, const int64_t* seqs, int64_t n);
  // Sequence s chose `token` at the current step: its penalties count it from the next step on.
  void chose(int64_t s, int32_t token);

 private:
  struct Seq {
    std::vector<int32_t> bias_tokens, ban_tokens, repetition_tokens, counted_tokens, counts;
    std::vector<float> bias_values;
    std::unordered_map<int32_t, int64_t> counted_index;  // token -> index in counted_tokens
    std::vector<bool> in_repetition;                      // [vocab] when the sequence has a repetition penalty
    int32_t ban_steps = 0;
    float repetition_penalty = 1.f, presence_penalty = 0.f, frequency_penalty = 0.f;
  };
  std::vector<Seq> seqs_;
  LogitEditsParams step_;
  std::vector<int32_t> bias_rows_, bias_tokens_, ban_rows_, ban_tokens_, repetition_rows_, repetition_tokens_,
      counted_rows_, counted_tokens_, counts_;
  std::vector<float> bias_values_, repetition_penalty_, presence_penalty_, frequency_penalty_;
};

}  // namespace kernels
}  // namespace pagedcore
