// multi_step_edits.h: the first step's edit pairs split per sequence, regathered for the sequences still
// stepping (rows renumbered), bans ending after ban_steps, each chosen token counted from the next step;
// bad pairs and ban steps refused at init.
#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "check.h"
#include "kernels/multi_step_edits.h"

using namespace pagedcore::kernels;

namespace {

constexpr int64_t V = 50;

// (row, token, count) of a stage's pairs, as a set (their order does not matter to the edits).
std::set<std::tuple<int32_t, int32_t, int32_t>> pairs(const int32_t* rows, const int32_t* tokens, const int32_t* counts,
                                                     int64_t n) {
  std::set<std::tuple<int32_t, int32_t, int32_t>> out;
  for (int64_t i = 0; i < n; ++i) out.insert({rows[i], tokens[i], counts ? counts[i] : 0});
  return out;
}

}  // namespace

TEST(multi_step_edits_advance_with_the_chosen_tokens) {
  // Sequence 0: repetition 1.3 over {3, 4}, bias on 9; sequence 1: frequency over 5 (x2), bans of 7 for 2
  // steps; sequence 2: nothing.
  const std::vector<int32_t> bias_rows = {0}, bias_tokens = {9}, ban_rows = {1}, ban_tokens = {7};
  const std::vector<float> bias_values = {2.f};
  const std::vector<int32_t> rep_rows = {0, 0}, rep_tokens = {3, 4}, cnt_rows = {1}, cnt_tokens = {5}, counts = {2};
  const std::vector<float> rep = {1.3f, 1.f, 1.f}, presence = {0.f, 0.5f, 0.f}, frequency = {0.f, 0.25f, 0.f};
  const std::vector<int32_t> ban_steps = {0, 2, 0};
  LogitEditsParams first;
  first.bias_rows = bias_rows.data(), first.bias_tokens = bias_tokens.data(), first.bias_values = bias_values.data();
  first.num_bias = 1;
  first.ban_rows = ban_rows.data(), first.ban_tokens = ban_tokens.data(), first.num_bans = 1;
  first.repetition_rows = rep_rows.data(), first.repetition_tokens = rep_tokens.data(), first.num_repetition = 2;
  first.repetition_penalty = rep.data();
  first.counted_rows = cnt_rows.data(), first.counted_tokens = cnt_tokens.data(), first.counts = counts.data();
  first.num_counted = 1, first.presence_penalty = presence.data(), first.frequency_penalty = frequency.data();
  MultiStepEdits edits;
  CHECK(edits.init(first, ban_steps.data(), 3, V).is_ok());
  const std::vector<int64_t> all = {0, 1, 2};
  const LogitEditsParams& e0 = edits.at_step(0, all.data(), 3);
  CHECK(e0.num_bias == 1 && e0.num_bans == 1 && e0.num_repetition == 2 && e0.num_counted == 1);
  CHECK(e0.frequency_penalty[1] == 0.25f && e0.repetition_penalty[0] == 1.3f);
  edits.chose(0, 3), edits.chose(1, 5), edits.chose(2, 5);  // 3 already penalised; 5 counted once more
  const LogitEditsParams& e1 = edits.at_step(1, all.data(), 3);
  CHECK(e1.num_repetition == 2 && e1.num_bans == 1);
  CHECK((pairs(e1.counted_rows, e1.counted_tokens, e1.counts, e1.num_counted) ==
         std::set<std::tuple<int32_t, int32_t, int32_t>>{{1, 5, 3}}));
  edits.chose(0, 8), edits.chose(1, 6);
  // Step 2, sequence 0 done: sequences 1 and 2 are rows 0 and 1; sequence 1's bans are over.
  const std::vector<int64_t> later = {1, 2};
  const LogitEditsParams& e2 = edits.at_step(2, later.data(), 2);
  CHECK(e2.num_bias == 0 && e2.num_bans == 0 && e2.num_repetition == 0);
  CHECK((pairs(e2.counted_rows, e2.counted_tokens, e2.counts, e2.num_counted) ==
         std::set<std::tuple<int32_t, int32_t, int32_t>>{{0, 5, 3}, {0, 6, 1}}));
  CHECK(e2.presence_penalty[0] == 0.5f && e2.presence_penalty[1] == 0.f);
  const std::vector<int64_t> just0 = {0};
  const LogitEditsParams& e3 = edits.at_step(3, just0.data(), 1);
  CHECK((pairs(e3.repetition_rows, e3.repetition_tokens, nullptr, e3.num_repetition) ==
         std::set<std::tuple<int32_t, int32_t, int32_t>>{{0, 3, 0}, {0, 4, 0}, {0, 8, 0}}));
  CHECK(e3.num_bias == 1 && e3.bias_rows[0] == 0 && e3.bias_values[0] == 2.f);
}

TEST(multi_step_edits_refuse_bad_input) {
  const std::vector<int32_t> rows = {0}, tokens = {V};  // a token past the vocabulary
  const std::vector<float> values = {1.f};
  LogitEditsParams bad;
  bad.bias_rows = rows.data(), bad.bias_tokens = tokens.data(), bad.bias_values = values.data(), bad.num_bias = 1;
  MultiStepEdits edits;
  CHECK(!edits.init(bad, nullptr, 1, V).is_ok());
  const std::vector<int32_t> ban_tokens = {2};
  LogitEditsParams bans;
  bans.ban_rows = rows.data(), bans.ban_tokens = ban_tokens.data(), bans.num_bans = 1;
  CHECK(!edits.init(bans, nullptr, 1, V).is_ok());  // bans without their ban_steps
  const std::vector<int32_t> negative = {-1};
  CHECK(!edits.init(bans, negative.data(), 1, V).is_ok());
}

int main() { return pagedcore_test::run_all(); }
