#include "kernels/logit_edits.h"

#include <cmath>
#include <limits>
#include <string>

namespace pagedcore {
namespace kernels {
namespace {

Status check_pairs(const char* stage, const int32_t* rows, const int32_t* tokens, int64_t n, int64_t num_rows,
                   int64_t vocab) {
  if (n < 0) return Status::invalid(std::string("logit_edits: a negative number of ") + stage + " pairs");
  if (n == 0) return Status::ok();
  if (!rows || !tokens) return Status::invalid(std::string("logit_edits: the ") + stage + " pairs are null");
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= num_rows)
      return Status::out_of_range(std::string("logit_edits: ") + stage + " pair " + std::to_string(i) + " names row " +
                                  std::to_string(rows[i]) + " of a step of " + std::to_string(num_rows) + " rows");
    if (tokens[i] < 0 || tokens[i] >= vocab)
      return Status::out_of_range(std::string("logit_edits: ") + stage + " pair " + std::to_string(i) +
                                  " names token " + std::to_string(tokens[i]) + ", outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
  }
  return Status::ok();
}

Status check_row_values(const char* what, const float* values, int64_t num_rows, bool positive) {
  if (!values) return Status::invalid(std::string("logit_edits: ") + what + " is null");
  for (int64_t r = 0; r < num_rows; ++r)
    if (!std::isfinite(values[r]) || (positive && !(values[r] > 0.0f)))
      return Status::invalid(std::string("logit_edits: row ") + std::to_string(r) + " has " + what + " " +
                             std::to_string(values[r]) + "; it must be finite" + (positive ? " and > 0" : ""));
  return Status::ok();
}

}  // namespace

Status check_logit_edits(const LogitEditsParams& e, int64_t num_rows, int64_t vocab) {
  Status st = check_pairs("logit_bias", e.bias_rows, e.bias_tokens, e.num_bias, num_rows, vocab);
  if (!st.is_ok()) return st;
  if (e.num_bias > 0) {
    if (!e.bias_values) return Status::invalid("logit_edits: the logit_bias values are null");
    for (int64_t i = 0; i < e.num_bias; ++i)
      if (!std::isfinite(e.bias_values[i]))
        return Status::invalid("logit_edits: logit_bias pair " + std::to_string(i) + " has a bias that is not finite");
  }
  if (!(st = check_pairs("ban", e.ban_rows, e.ban_tokens, e.num_bans, num_rows, vocab)).is_ok()) return st;
  st = check_pairs("repetition", e.repetition_rows, e.repetition_tokens, e.num_repetition, num_rows, vocab);
  if (!st.is_ok()) return st;
  if (e.num_repetition > 0 &&
      !(st = check_row_values("repetition_penalty", e.repetition_penalty, num_rows, true)).is_ok())
    return st;
  st = check_pairs("presence/frequency", e.counted_rows, e.counted_tokens, e.num_counted, num_rows, vocab);
  if (!st.is_ok()) return st;
  if (e.num_counted > 0) {
    if (!e.counts) return Status::invalid("logit_edits: the presence/frequency counts are null");
    for (int64_t i = 0; i < e.num_counted; ++i)
      if (e.counts[i] < 1)
        return Status::invalid("logit_edits: presence/frequency pair " + std::to_string(i) + " has count " +
                               std::to_string(e.counts[i]) + "; a listed token occurs at least once");
    if (!(st = check_row_values("presence_penalty", e.presence_penalty, num_rows, false)).is_ok()) return st;
    if (!(st = check_row_values("frequency_penalty", e.frequency_penalty, num_rows, false)).is_ok()) return st;
  }
  return Status::ok();
}

Status apply_logit_edits(const LogitEditsParams& e, float* logits, int64_t num_rows, int64_t vocab,
                         int64_t row_stride) {
  if (num_rows < 0 || vocab <= 0 || row_stride < vocab)
    return Status::invalid("logit_edits: invalid sizes (rows " + std::to_string(num_rows) + ", vocab " +
                           std::to_string(vocab) + ", row_stride " + std::to_string(row_stride) + ")");
  const Status st = check_logit_edits(e, num_rows, vocab);
  if (!st.is_ok() || e.empty()) return st;
  if (!logits) return Status::invalid("logit_edits: logits is null");
  auto at = [&](int32_t row, int32_t token) -> float& { return logits[row * row_stride + token]; };
  for (int64_t i = 0; i < e.num_bias; ++i) at(e.bias_rows[i], e.bias_tokens[i]) += e.bias_values[i];
  for (int64_t i = 0; i < e.num_bans; ++i) at(e.ban_rows[i], e.ban_tokens[i]) = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < e.num_repetition; ++i) {
    float& l = at(e.repetition_rows[i], e.repetition_tokens[i]);
    const float p = e.repetition_penalty[e.repetition_rows[i]];
    l = l > 0.0f ? l / p : l * p;
  }
  for (int64_t i = 0; i < e.num_counted; ++i) {
    const int32_t row = e.counted_rows[i];
    float& l = at(row, e.counted_tokens[i]);
    l = l - e.presence_penalty[row];
    const float minus_frequency = -e.frequency_penalty[row];
    for (int32_t c = 0; c < e.counts[i]; ++c) l = l + minus_frequency;
  }
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
