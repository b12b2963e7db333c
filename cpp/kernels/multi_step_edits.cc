// MultiStepEdits (multi_step_edits.h): the first step's edit pairs split per sequence, then each step's
// pairs gathered for the sequences still stepping, advanced by the tokens they chose.
#include "kernels/multi_step_edits.h"

#include <string>

namespace pagedcore {
namespace kernels {

Status MultiStepEdits::init(const LogitEditsParams& first, const int32_t* ban_steps, int64_t num_seqs,
                            int64_t vocab) {
  const Status checked = check_logit_edits(first, num_seqs, vocab);
  if (!checked.is_ok()) return checked;
  if (!ban_steps && first.num_bans > 0) return Status::invalid("multi-step edits: bans without their ban_steps");
  seqs_.assign(num_seqs, Seq());
  for (int64_t s = 0; s < num_seqs; ++s) {
    Seq& q = seqs_[s];
    q.ban_steps = ban_steps ? ban_steps[s] : 0;
    if (q.ban_steps < 0)
      return Status::invalid("multi-step edits: sequence " + std::to_string(s) + " has negative ban_steps");
    q.repetition_penalty = first.repetition_penalty ? first.repetition_penalty[s] : 1.f;
    q.presence_penalty = first.presence_penalty ? first.presence_penalty[s] : 0.f;
    q.frequency_penalty = first.frequency_penalty ? first.frequency_penalty[s] : 0.f;
    if (q.repetition_penalty != 1.f) q.in_repetition.assign(vocab, false);
  }
  for (int64_t i = 0; i < first.num_bias; ++i) {
    seqs_[first.bias_rows[i]].bias_tokens.push_back(first.bias_tokens[i]);
    seqs_[first.bias_rows[i]].bias_values.push_back(first.bias_values[i]);
  }
  for (int64_t i = 0; i < first.num_bans; ++i) seqs_[first.ban_rows[i]].ban_tokens.push_back(first.ban_tokens[i]);
  for (int64_t i = 0; i < first.num_repetition; ++i) {
    Seq& q = seqs_[first.repetition_rows[i]];
    if (q.in_repetition.empty()) continue;  // (a pair of a row whose penalty is 1 edits nothing)
    if (!q.in_repetition[first.repetition_tokens[i]]) q.repetition_tokens.push_back(first.repetition_tokens[i]);
    q.in_repetition[first.repetition_tokens[i]] = true;
  }
  for (int64_t i = 0; i < first.num_counted; ++i) {
    Seq& q = seqs_[first.counted_rows[i]];
    const auto found = q.counted_index.find(first.counted_tokens[i]);
    if (found != q.counted_index.end()) {
      q.counts[found->second] += first.counts[i];
      continue;
    }
    q.counted_index.emplace(first.counted_tokens[i], static_cast<int64_t>(q.counted_tokens.size()));
    q.counted_tokens.push_back(first.counted_tokens[i]);
    q.counts.push_back(first.counts[i]);
  }
  return Status::ok();
}

const LogitEditsParams& MultiStepEdits::at_step(int64_t step, const int64_t* seqs, int64_t n) {
  bias_rows_.clear(), bias_tokens_.clear(), bias_values_.clear(), ban_rows_.clear(), ban_tokens_.clear();
  repetition_rows_.clear(), repetition_tokens_.clear(), counted_rows_.clear(), counted_tokens_.clear();
  counts_.clear(), repetition_penalty_.clear(), presence_penalty_.clear(), frequency_penalty_.clear();
  for (int64_t row = 0; row < n; ++row) {
    const Seq& q = seqs_[seqs[row]];
    const int32_t r = static_cast<int32_t>(row);
    bias_rows_.insert(bias_rows_.end(), q.bias_tokens.size(), r);
    bias_tokens_.insert(bias_tokens_.end(), q.bias_tokens.begin(), q.bias_tokens.end());
    bias_values_.insert(bias_values_.end(), q.bias_values.begin(), q.bias_values.end());
    if (step < q.ban_steps) {
      ban_rows_.insert(ban_rows_.end(), q.ban_tokens.size(), r);
      ban_tokens_.insert(ban_tokens_.end(), q.ban_tokens.begin(), q.ban_tokens.end());
    }
    repetition_rows_.insert(repetition_rows_.end(), q.repetition_tokens.size(), r);
    repetition_tokens_.insert(repetition_tokens_.end(), q.repetition_tokens.begin(), q.repetition_tokens.end());
    counted_rows_.insert(counted_rows_.end(), q.counted_tokens.size(), r);
    counted_tokens_.insert(counted_tokens_.end(), q.counted_tokens.begin(), q.counted_tokens.end());
    counts_.insert(counts_.end(), q.counts.begin(), q.counts.end());
    repetition_penalty_.push_back(q.repetition_penalty);
    presence_penalty_.push_back(q.presence_penalty);
    frequency_penalty_.push_back(q.frequency_penalty);
  }
  step_ = LogitEditsParams();
  step_.bias_rows = bias_rows_.data(), step_.bias_tokens = bias_tokens_.data();
  step_.bias_values = bias_values_.data(), step_.num_bias = static_cast<int64_t>(bias_rows_.size());
  step_.ban_rows = ban_rows_.data(), step_.ban_tokens = ban_tokens_.data();
  step_.num_bans = static_cast<int64_t>(ban_rows_.size());
  step_.repetition_rows = repetition_rows_.data(), step_.repetition_tokens = repetition_tokens_.data();
  step_.num_repetition = static_cast<int64_t>(repetition_rows_.size());
  step_.repetition_penalty = repetition_penalty_.data();
  step_.counted_rows = counted_rows_.data(), step_.counted_tokens = counted_tokens_.data();
  step_.counts = counts_.data(), step_.num_counted = static_cast<int64_t>(counted_rows_.size());
  step_.presence_penalty = presence_penalty_.data(), step_.frequency_penalty = frequency_penalty_.data();
  return step_;
}

void MultiStepEdits::chose(int64_t s, int32_t token) {
  Seq& q = seqs_[s];
  if (!q.in_repetition.empty() && !q.in_repetition[token]) {
    q.in_repetition[token] = true;
    q.repetition_tokens.push_back(token);
  }
  if (q.presence_penalty != 0.f || q.frequency_penalty != 0.f) {
    const auto found = q.counted_index.find(token);
    if (found != q.counted_index.end()) {
      ++q.counts[found->second];
    } else {
      q.counted_index.emplace(token, static_cast<int64_t>(q.counted_tokens.size()));
      q.counted_tokens.push_back(token);
      q.counts.push_back(1);
    }
  }
}

}  // namespace kernels
}  // namespace pagedcore
