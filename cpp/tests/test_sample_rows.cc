// sample_rows.h: the weights against std::exp, bit-identical weights and tokens on every ISA the CPU
// runs, the kept sets of top-k / top-p / min-p against a sorted double-precision reference (ties
// included), sampled frequencies against the kept distribution, the special rows and argument errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "check.h"
#include "kernels/cpu_isa.h"
#include "kernels/sample_rows.h"

using namespace pagedcore::kernels;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

struct Row {
  float temperature = 1.0f;
  int64_t top_k;
  float top_p = 1.0f, min_p = 0.0f;
};

// Samples `rows` copies of one logits row with the given settings; noise from rng. Returns tokens and,
// in weights, the first copy's weights as the kernel left them.
std::vector<int64_t> sample(const std::vector<float>& logits, const Row& s, int64_t rows, std::mt19937& rng,
                            std::vector<float>* weights = nullptr, Status* status = nullptr) {
  const int64_t V = static_cast<int64_t>(logits.size()), W = sample_noise_width(V);
  std::vector<float> x(rows * V);
  for (int64_t r = 0; r < rows; ++r) std::copy(logits.begin(), logits.end(), x.begin() + r * V);
  std::vector<float> t(rows, s.temperature), tp(rows, s.top_p), mp(rows, s.min_p), noise(rows * W);
  std::vector<int64_t> k(rows, s.top_k), out(rows, -1);
  std::exponential_distribution<float> e(1.0f);
  for (float& n : noise) n = e(rng);
  SampleRowsParams p;
  p.logits = x.data();
  p.num_rows = rows;
  p.vocab = V;
  p.row_stride = V;
  p.temperature = t.data();
  p.top_k = k.data();
  p.top_p = tp.data();
  p.min_p = mp.data();
  p.noise = noise.data();
  p.noise_width = W;
  p.out = out.data();
  const Status st = sample_rows(p);
  if (status) *status = st;
  else CHECK(st.is_ok());
  if (weights) weights->assign(x.begin(), x.begin() + V);
  return out;
}

// The kept set by the definitions of sample_rows.h, in double over the kernel's own weights.
std::vector<bool> reference_kept(const std::vector<float>& w, const Row& s) {
  const int64_t V = static_cast<int64_t>(w.size());
  std::vector<float> sorted(w);
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  const float tau_k = s.top_k < V ? sorted[s.top_k - 1] : 0.0f;
  double total = 0.0;
  for (float v : w) total += v >= tau_k ? v : 0.0;
  float tau_p = 0.0f;
  if (s.top_p < 1.0f) {
    double above = 0.0;
    for (size_t i = 0; i < sorted.size() && sorted[i] >= tau_k;) {
      if (!(above < s.top_p * total)) break;
      tau_p = sorted[i];
      const float v = sorted[i];
      for (; i < sorted.size() && sorted[i] == v; ++i) above += v;
    }
  }
  const float cut = std::max({tau_k, tau_p, s.min_p});
  std::vector<bool> kept(V);
  for (int64_t i = 0; i < V; ++i) kept[i] = w[i] > 0.0f && w[i] >= cut;
  return kept;
}

std::vector<float> random_logits(int64_t V, float scale, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> l(V);
  for (float& v : l) v = n(rng);
  return l;
}

}  // namespace

TEST(sample_rows_weights_match_exp) {
  std::mt19937 rng(1);
  for (int64_t V : {1, 7, 16, 255, 256, 257, 1000}) {
    std::vector<float> logits = random_logits(V, 8.0f, rng), w;
    Row s;
    s.temperature = 0.7f;
    s.top_k = V;
    sample(logits, s, 1, rng, &w);
    const float m = *std::max_element(logits.begin(), logits.end());
    for (int64_t i = 0; i < V; ++i) {
      const double x = static_cast<double>((logits[i] - m) * (1.0f / 0.7f));
      const double expect = x < -87.0 ? 0.0 : std::exp(x);
      CHECK(std::fabs(w[i] - expect) <= 3e-7 * expect + 1e-38);
    }
    CHECK(*std::max_element(w.begin(), w.end()) == 1.0f);  // the maximum weighs exactly 1
  }
}

TEST(sample_rows_bit_identical_on_every_isa) {
  const Isa before = active_isa();
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<int64_t>> tokens;
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) {
      std::printf("  (ISA %s not on this CPU: skipped)\n", isa_name(isa));
      continue;
    }
    CHECK(set_active_isa(isa));
    std::mt19937 rng(5);
    std::vector<float> logits = random_logits(4099, 3.0f, rng), w;
    Row s;
    s.temperature = 0.9f;
    s.top_k = 300;
    s.top_p = 0.9f;
    tokens.push_back(sample(logits, s, 64, rng, &w));
    weights.push_back(w);
    std::printf("  ISA %s ran\n", isa_name(isa));
  }
  set_active_isa(before);
  for (size_t i = 1; i < tokens.size(); ++i) {
    CHECK(tokens[i] == tokens[0]);
    CHECK(weights[i] == weights[0]);
  }
}

TEST(sample_rows_kept_sets_match_reference) {
  std::mt19937 rng(2);
  const Row settings[] = {{1.0f, 5, 1.0f, 0.0f},   {0.8f, 1000, 0.9f, 0.0f}, {1.2f, 1000, 0.5f, 0.0f},
                          {1.0f, 1000, 1.0f, 0.3f}, {0.7f, 40, 0.8f, 0.05f}, {2.0f, 1000, 0.99f, 0.0f}};
  for (const Row& base : settings) {
    for (int trial = 0; trial < 4; ++trial) {
      // Coarse logits make ties at every threshold; a large scale makes a peaked row, a small one a flat one.
      std::vector<float> logits = random_logits(1000, trial % 2 ? 0.5f : 4.0f, rng);
      if (trial >= 2)
        for (float& v : logits) v = std::round(v * 2.0f) / 2.0f;
      Row s = base;
      s.top_k = std::min<int64_t>(s.top_k, 1000);
      std::vector<float> w;
      const std::vector<int64_t> tokens = sample(logits, s, 4000, rng, &w);
      const std::vector<bool> kept = reference_kept(w, s);
      std::set<int64_t> seen(tokens.begin(), tokens.end());
      for (int64_t t : seen) CHECK(kept[t]);  // never a token outside the kept set
      const int64_t num_kept = std::count(kept.begin(), kept.end(), true);
      if (num_kept <= 20) {  // small kept sets: each token of weight >= 5% of the top one shows up
        for (int64_t i = 0; i < 1000; ++i)
          if (kept[i] && w[i] >= 0.05f) CHECK(seen.count(i) == 1);
      }
    }
  }
}

TEST(sample_rows_frequencies_follow_the_weights) {
  std::mt19937 rng(3);
  std::vector<float> logits = random_logits(600, 1.5f, rng), w;  // 3 blocks, the last one short
  Row s;
  s.temperature = 1.0f;
  s.top_k = 600;
  s.top_p = 0.7f;
  const int64_t draws = 60000;
  const std::vector<int64_t> tokens = sample(logits, s, draws, rng, &w);
  const std::vector<bool> kept = reference_kept(w, s);
  double total = 0.0;
  for (int64_t i = 0; i < 600; ++i) total += kept[i] ? w[i] : 0.0;
  std::vector<int64_t> counts(600, 0);
  for (int64_t t : tokens) ++counts[t];
  double chi2 = 0.0;
  int64_t df = -1;
  for (int64_t i = 0; i < 600; ++i) {
    if (!kept[i]) {
      CHECK(counts[i] == 0);
      continue;
    }
    const double expect = draws * w[i] / total;
    chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
    ++df;
  }
  // chi2 of df degrees has mean df and sd sqrt(2 df): 6 sd above the mean would be a broken sampler.
  CHECK(chi2 < df + 6.0 * std::sqrt(2.0 * df));
}

TEST(sample_rows_special_rows) {
  std::mt19937 rng(4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Row s;
  s.top_k = 8;
  CHECK(sample({-kInf, -kInf, -kInf}, s, 1, rng)[0] == 0);  // nothing above -inf: the argmax (torch: 0)
  s.top_k = 5;
  for (int64_t t : sample({0.0f, nan, 1.0f, nan, 0.5f}, s, 200, rng)) CHECK(t != 1 && t != 3);  // NaN weighs 0
  for (int64_t t : sample({0.0f, kInf, 1.0f, kInf, 0.5f}, s, 200, rng)) CHECK(t == 1 || t == 3);
  s.temperature = 0.0f;  // greedy: torch's argmax (the first maximum)
  CHECK(sample({1.0f, 3.0f, 3.0f, 2.0f, -1.0f}, s, 3, rng) == std::vector<int64_t>({1, 1, 1}));
  s.temperature = 1e-40f;  // subnormal: 1 / T is inf, so the argmax
  CHECK(sample({1.0f, 3.0f, 3.0f, 2.0f, -1.0f}, s, 1, rng)[0] == 1);
  s.temperature = 1.0f;
  s.top_k = 1;  // top_k 1 is the argmax too
  for (int64_t t : sample({1.0f, 3.0f, 2.0f}, s, 50, rng)) CHECK(t == 1);
}

TEST(sample_rows_rejects_bad_arguments) {
  std::mt19937 rng(6);
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  Status st;
  Row s;
  s.top_k = 3;
  s.temperature = -1.0f;
  sample(logits, s, 1, rng, nullptr, &st);
  CHECK(!st.is_ok() && st.message.find("temperature") != std::string::npos);
  s.temperature = 1.0f;
  s.top_p = 0.0f;
  sample(logits, s, 1, rng, nullptr, &st);
  CHECK(!st.is_ok() && st.message.find("top_p") != std::string::npos);
  s.top_p = 1.0f;
  s.min_p = 1.5f;
  sample(logits, s, 1, rng, nullptr, &st);
  CHECK(!st.is_ok() && st.message.find("min_p") != std::string::npos);
  s.min_p = 0.0f;
  s.top_k = 0;
  sample(logits, s, 1, rng, nullptr, &st);
  CHECK(!st.is_ok() && st.message.find("top_k") != std::string::npos);

  float t = 1.0f, tp = 1.0f, mp = 0.0f, noise[8] = {};
  int64_t k = 3, out = 0;
  std::vector<float> x(logits);
  SampleRowsParams p;
  p.logits = x.data();
  p.num_rows = 1;
  p.vocab = 3;
  p.row_stride = 3;
  p.temperature = &t;
  p.top_k = &k;
  p.top_p = &tp;
  p.min_p = &mp;
  p.noise = noise;
  p.noise_width = 8;  // the width is 1 block + 256
  p.out = &out;
  st = sample_rows(p);
  CHECK(!st.is_ok() && st.message.find("noise") != std::string::npos);
  p.row_stride = 2;
  CHECK(!sample_rows(p).is_ok());
}

int main() { return pagedcore_test::run_all(); }
