// logprobs_rows.h: ranks, top-K order (ties by the lower id, NaN the largest) and values against a
// double-precision log-softmax, rows in parallel equal to rows one at a time, and argument errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "check.h"
#include "kernels/logprobs_rows.h"

using namespace pagedcore::kernels;

namespace {

struct Out {
  std::vector<int64_t> ids, ranks;
  std::vector<float> values;
};

Out run(std::vector<float> logits, int64_t rows, int64_t V, const std::vector<int64_t>& tokens, int64_t K,
        Status* status = nullptr) {
  Out o{std::vector<int64_t>(rows * (K + 1), -1), std::vector<int64_t>(rows, -1), std::vector<float>(rows * (K + 1))};
  LogprobsRowsParams p;
  p.logits = logits.data();
  p.num_rows = rows;
  p.vocab = V;
  p.row_stride = V;
  p.token_ids = tokens.data();
  p.num_top = K;
  p.out_ids = o.ids.data();
  p.out_logprobs = o.values.data();
  p.out_ranks = o.ranks.data();
  const Status st = logprobs_rows(p);
  if (status) *status = st;
  else CHECK(st.is_ok());
  return o;
}

}  // namespace

TEST(a_row_against_double_log_softmax) {
  const int64_t V = 1000, K = 6;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(V);
  for (float& v : x) v = std::round(nd(rng) * 4.0f) / 4.0f;  // ties
  const int64_t token = 17;
  const Out o = run(x, 1, V, {token}, K);
  double peak = *std::max_element(x.begin(), x.end()), sum = 0.0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - peak);
  const double log_norm = std::log(sum) + peak;
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
  CHECK_EQ(o.ids[0], token);
  for (int64_t k = 0; k < K; ++k) CHECK_EQ(o.ids[k + 1], order[k]);
  int64_t rank = 0;
  for (float v : x) rank += v >= x[token];
  CHECK_EQ(o.ranks[0], rank);
  for (int64_t k = 0; k <= K; ++k) CHECK(std::fabs(o.values[k] - (x[o.ids[k]] - log_norm)) < 1e-5);
}

TEST(rows_in_parallel_equal_rows_one_at_a_time) {
  const int64_t V = 777, R = 5, K = 3;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> x(R * V);
  for (float& v : x) v = nd(rng);
  const std::vector<int64_t> tokens = {0, 776, 5, 300, 12};
  const Out all = run(x, R, V, tokens, K);
  for (int64_t r = 0; r < R; ++r) {
    const Out one = run(std::vector<float>(x.begin() + r * V, x.begin() + (r + 1) * V), 1, V, {tokens[r]}, K);
    CHECK(std::equal(one.ids.begin(), one.ids.end(), all.ids.begin() + r * (K + 1)));
    CHECK(std::equal(one.values.begin(), one.values.end(), all.values.begin() + r * (K + 1)));
    CHECK_EQ(one.ranks[0], all.ranks[r]);
  }
}

TEST(nan_and_infinite_rows_and_errors) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Out o = run({0.0f, nan, 1.0f, -inf}, 1, 4, {1}, 2);
  CHECK(o.ids[1] == 1 && o.ids[2] == 2);  // NaN first in the top-K
  CHECK(o.ranks[0] == 0 && std::isnan(o.values[0]));
  o = run({-inf, -inf, -inf}, 1, 3, {2}, 1);
  CHECK(o.ids[1] == 0 && o.ranks[0] == 3 && std::isnan(o.values[0]));
  Status st;
  run({0.0f, 1.0f}, 1, 2, {2}, 1, &st);
  CHECK(!st.is_ok() && st.message.find("vocabulary") != std::string::npos);
  run({0.0f, 1.0f}, 1, 2, {0}, 3, &st);
  CHECK(!st.is_ok() && st.message.find("invalid sizes") != std::string::npos);
}

int main() { return pagedcore_test::run_all(); }
