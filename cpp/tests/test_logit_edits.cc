// logit_edits.h: each stage's fp32 rule on its pairs (bias add, ban, the repetition rule on both
// signs and zero, presence once then -frequency once per occurrence), the stage order, rows apart
// by row_stride, and every refusal leaving the logits as they were.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "check.h"
#include "kernels/logit_edits.h"

using namespace pagedcore::kernels;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

struct Edits {
  std::vector<int32_t> bias_rows, bias_tokens, ban_rows, ban_tokens, rep_rows, rep_tokens, counted_rows,
      counted_tokens, counts;
  std::vector<float> bias_values, rep_penalty, presence, frequency;
  LogitEditsParams params() const {
    LogitEditsParams p;
    p.bias_rows = bias_rows.data();
    p.bias_tokens = bias_tokens.data();
    p.bias_values = bias_values.data();
    p.num_bias = static_cast<int64_t>(bias_rows.size());
    p.ban_rows = ban_rows.data();
    p.ban_tokens = ban_tokens.data();
    p.num_bans = static_cast<int64_t>(ban_rows.size());
    p.repetition_rows = rep_rows.data();
    p.repetition_tokens = rep_tokens.data();
    p.num_repetition = static_cast<int64_t>(rep_rows.size());
    p.repetition_penalty = rep_penalty.data();
    p.counted_rows = counted_rows.data();
    p.counted_tokens = counted_tokens.data();
    p.counts = counts.data();
    p.num_counted = static_cast<int64_t>(counted_rows.size());
    p.presence_penalty = presence.data();
    p.frequency_penalty = frequency.data();
    return p;
  }
};

// Two rows of 6 tokens, 8 floats apart (the last two of each row are padding that must stay 99).
Edits example() {
  Edits e;
  e.bias_rows = {0, 1};
  e.bias_tokens = {1, 5};
  e.bias_values = {2.5f, -1.0f};
  e.ban_rows = {1};
  e.ban_tokens = {0};
  e.rep_rows = {0, 0, 0, 1};
  e.rep_tokens = {1, 2, 3, 0};
  e.rep_penalty = {2.0f, 1.5f};
  e.counted_rows = {0, 1};
  e.counted_tokens = {2, 4};
  e.counts = {1, 3};
  e.presence = {0.25f, 0.5f};
  e.frequency = {0.0f, 0.1f};
  return e;
}

std::vector<float> logits() {
  return {1.0f, 1.5f, -3.0f, 0.0f, 4.0f, 2.0f, 99.0f, 99.0f,   // row 0
          0.5f, 1.0f, 2.0f,  3.0f, 1.0f, 1.0f, 99.0f, 99.0f};  // row 1
}

}  // namespace

TEST(each_stage_applies_its_rule_in_order) {
  const Edits e = example();
  std::vector<float> x = logits();
  CHECK(apply_logit_edits(e.params(), x.data(), 2, 6, 8).is_ok());
  CHECK_EQ(x[0], 1.0f);                       // untouched
  CHECK_EQ(x[1], (1.5f + 2.5f) / 2.0f);       // bias, then the repetition rule on a positive logit
  CHECK_EQ(x[2], -3.0f * 2.0f - 0.25f);       // repetition on a negative one, then presence (frequency 0)
  CHECK_EQ(x[3], 0.0f * 2.0f);                // zero: the multiply branch (not > 0)
  CHECK_EQ(x[8], -kInf);                      // banned, then repetition keeps -inf
  float four = 1.0f - 0.5f;
  for (int i = 0; i < 3; ++i) four = four + -0.1f;  // one occurrence at a time
  CHECK_EQ(x[12], four);
  CHECK_EQ(x[13], 1.0f - 1.0f);
  CHECK_EQ(x[6], 99.0f);
  CHECK_EQ(x[15], 99.0f);
}

TEST(refusals_leave_the_logits_as_they_were) {
  const std::vector<float> before = logits();
  auto refused = [&](const Edits& e) {
    std::vector<float> x = before;
    const Status st = apply_logit_edits(e.params(), x.data(), 2, 6, 8);
    CHECK(!st.is_ok());
    CHECK(x == before);
  };
  Edits e = example();
  e.bias_tokens[1] = 6;  // past the vocabulary (inside the row stride)
  refused(e);
  e = example();
  e.rep_rows[0] = 2;
  refused(e);
  e = example();
  e.ban_tokens[0] = -1;
  refused(e);
  e = example();
  e.counts[1] = 0;
  refused(e);
  e = example();
  e.rep_penalty[1] = 0.0f;
  refused(e);
  e = example();
  e.presence[0] = kInf;
  refused(e);
  e = example();
  e.bias_values[0] = std::nanf("");
  refused(e);
  std::vector<float> x = before;
  CHECK(!apply_logit_edits(example().params(), x.data(), 2, 6, 5).is_ok());  // row_stride < vocab
  CHECK(x == before);
}

TEST(no_pairs_is_a_no_op_and_needs_no_pointers) {
  std::vector<float> x = logits();
  CHECK(apply_logit_edits(LogitEditsParams{}, x.data(), 2, 6, 8).is_ok());
  CHECK(x == logits());
  CHECK(check_logit_edits(LogitEditsParams{}, 0, 6).is_ok());
}

int main() { return pagedcore_test::run_all(); }
