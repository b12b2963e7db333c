// argmax_rows.h against a scalar loop with torch.argmax's rules (first index of the maximum, the first
// NaN wins, -0.0 == +0.0): random rows with ties, every length path, strided rows, the parallel batch
// branch, and the argument errors.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "check.h"
#include "kernels/argmax_rows.h"

using namespace pagedcore::kernels;

namespace {

int64_t reference(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

std::vector<int64_t> run(const std::vector<float>& logits, int64_t rows, int64_t vocab, int64_t stride) {
  std::vector<int64_t> out(rows, -7);
  ArgmaxRowsParams p;
  p.logits = logits.data();
  p.num_rows = rows;
  p.vocab = vocab;
  p.row_stride = stride;
  p.out = out.data();
  CHECK(argmax_rows(p).is_ok());
  return out;
}

}  // namespace

TEST(argmax_rows_matches_scalar_rules) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float specials[] = {nan, inf, -inf, 0.f, -0.f, 3.f};
  for (int64_t vocab : {1, 5, 15, 16, 17, 31, 32, 33, 100, 4099}) {
    std::mt19937 rng(static_cast<uint32_t>(vocab));
    std::uniform_int_distribution<int> coarse(-3, 3);
    const int64_t rows = 9, stride = vocab + 5;
    std::vector<float> logits(rows * stride, 1e9f);  // the gap between rows must never be read
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < vocab; ++i) logits[r * stride + i] = static_cast<float>(coarse(rng));  // ties
      if (r < 6) logits[r * stride + rng() % vocab] = specials[r];
      if (r == 6) for (int64_t i = 0; i < vocab; ++i) logits[r * stride + i] = -inf;
      if (r == 7) logits[r * stride + vocab - 1] = 100.f;  // the maximum in the tail
    }
    const std::vector<int64_t> got = run(logits, rows, vocab, stride);
    for (int64_t r = 0; r < rows; ++r) CHECK_EQ(got[r], reference(logits.data() + r * stride, vocab));
  }
}

TEST(argmax_rows_batch_runs_in_tasks) {
  const int64_t rows = 600, vocab = 1000;  // > one task's 262 rows
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> coarse(-50, 50);
  std::vector<float> logits(rows * vocab);
  for (float& v : logits) v = static_cast<float>(coarse(rng));
  const std::vector<int64_t> got = run(logits, rows, vocab, vocab);
  for (int64_t r = 0; r < rows; ++r) CHECK_EQ(got[r], reference(logits.data() + r * vocab, vocab));
}

TEST(argmax_rows_rejects_bad_arguments) {
  std::vector<float> x(8, 0.f);
  int64_t out = 0;
  ArgmaxRowsParams p;
  p.logits = x.data();
  p.out = &out;
  p.num_rows = 1;
  p.vocab = 8;
  p.row_stride = 4;  // < vocab
  CHECK(!argmax_rows(p).is_ok());
  p.row_stride = 8;
  p.vocab = 0;
  CHECK(!argmax_rows(p).is_ok());
  p.vocab = 8;
  p.logits = nullptr;
  CHECK(!argmax_rows(p).is_ok());
  p.num_rows = 0;  // nothing to read: no pointer needed
  CHECK(argmax_rows(p).is_ok());
}

int main() { return pagedcore_test::run_all(); }
