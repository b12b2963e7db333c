// greedy_decode.h: GreedyDecoder::run_steps (several decode steps in one call, engine/multi_step.py)
// against single decode steps through GreedyDecoder::run: the same tokens and KV cache bytes, argmax and
// sampled (a token's noise row is its step's); bad input refused before the cache is written.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "greedy_decode_fixture.h"

using namespace greedy_decode_test;

namespace {

// Two sequences after a prefill (3 and 5 tokens): the first decodes 4 tokens in one run_steps call, the
// second 2 (it stops stepping after step 1); the input's placeholders (V - 1) must not matter. single()
// runs the same as one decode step at a time with the running sequences only (a sampled run hands step i
// the noise rows run_steps reads for it), and returns its tokens in run_steps' layout (sequence 0 at
// [0, 4), sequence 1 at [4, 6)).
struct TwoSequenceSteps {
  TinyModel& m;
  const Step prefill{{{0, 3}, {0, 5}}, 11};
  const std::vector<int64_t> last_rows{2, 7};
  std::vector<int64_t> first;
  Step multi{{{3, 4}, {5, 2}}, 1};

  TwoSequenceSteps(TinyModel& model, std::vector<float>& cache) : m(model) {
    first = run(m, prefill, cache, last_rows);
    multi.input_ids = {first[0], V - 1, V - 1, V - 1, first[1], V - 1};
  }
  std::vector<int64_t> run_steps(std::vector<float>& cache, const SampleRowsParams* sampling = nullptr) {
    std::vector<int64_t> tokens(multi.input_ids.size(), -1);
    CHECK(m.decoder.run_steps(m.stack, multi.params(cache), multi.input_ids.data(), multi.positions.data(),
                              tokens.data(), sampling).is_ok());
    return tokens;
  }
  std::vector<int64_t> single(std::vector<float>& cache, const SampleRowsParams* sampling = nullptr) {
    CHECK(run(m, prefill, cache, last_rows) == first);
    std::vector<int64_t> next = first, tokens(6, -1);
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t n = i < 2 ? 2 : 1;
      std::vector<std::pair<int64_t, int64_t>> seqs = {{3 + i, 1}};
      if (n == 2) seqs.push_back({5 + i, 1});
      Step one(seqs, 0);
      one.input_ids.assign(next.begin(), next.begin() + n);
      SampleRowsParams rows_sampling;
      std::vector<float> step_noise;  // [n, W]: the noise rows of sequence 0's and 1's step i
      if (sampling) {
        const int64_t W = sampling->noise_width;
        for (int64_t row : {i, 4 + i})
          if (row == i || n == 2)
            step_noise.insert(step_noise.end(), sampling->noise + row * W, sampling->noise + (row + 1) * W);
        rows_sampling = *sampling;
        rows_sampling.noise = step_noise.data();
      }
      next = run(m, one, cache, n == 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0}, nullptr,
                 sampling ? &rows_sampling : nullptr);
      tokens[i] = next[0];
      if (n == 2) tokens[4 + i] = next[1];
    }
    return tokens;
  }
};

}  // namespace

TEST(run_steps_equals_single_decode_steps) {
  TinyModel m;
  std::vector<float> cache_a = empty_cache(), cache_b = empty_cache();
  TwoSequenceSteps steps(m, cache_a);
  std::vector<int64_t> tokens = steps.run_steps(cache_a);
  CHECK(tokens == steps.single(cache_b));
  CHECK(cache_a == cache_b);
  // Bad input is refused before the cache is written.
  const std::vector<float> before = cache_a;
  Step gap({{9, 3}}, 1);
  gap.positions[2] += 1;
  CHECK(!m.decoder.run_steps(m.stack, gap.params(cache_a), gap.input_ids.data(), gap.positions.data(),
                             tokens.data()).is_ok());
  CHECK(cache_a == before);
}

TEST(run_steps_samples_as_single_steps) {
  // As above, sequence 0 sampled (temperature 0.8, top-p 0.9) and sequence 1 greedy; a token's noise row
  // is its step's: single steps given the same rows give the same tokens and cache.
  TinyModel m;
  std::vector<float> cache_a = empty_cache(), cache_b = empty_cache();
  TwoSequenceSteps steps(m, cache_a);
  // noise [num_tokens, W]: sequence 0's steps at rows 0-3, sequence 1's at 4-5
  const TwoRowSampling rows(0.8f, 0.9f, 6, 5);
  const SampleRowsParams& sampling = rows.params;
  std::vector<int64_t> tokens = steps.run_steps(cache_a, &sampling);
  CHECK(tokens == steps.single(cache_b, &sampling));
  CHECK(cache_a == cache_b);
  // The greedy sequence's tokens are its argmaxes: the same as run_steps without sampling.
  std::vector<float> cache_c = empty_cache();
  run(m, steps.prefill, cache_c, steps.last_rows);
  const std::vector<int64_t> greedy = steps.run_steps(cache_c);
  CHECK(greedy[4] == tokens[4] && greedy[5] == tokens[5]);
  CHECK(!std::equal(greedy.begin(), greedy.begin() + 4, tokens.begin()));  // and the sampled one's were drawn
  // A bad sampling value of a sequence is refused before the cache is written.
  const std::vector<float> before = cache_a;
  const std::vector<float> bad_top_p = {1.5f, 1.0f};
  SampleRowsParams bad = sampling;
  bad.top_p = bad_top_p.data();
  Step again({{7, 2}, {7, 1}}, 1);
  const Status st = m.decoder.run_steps(m.stack, again.params(cache_a), again.input_ids.data(),
                                        again.positions.data(), tokens.data(), &bad);
  CHECK(!st.is_ok() && st.message.find("top_p") != std::string::npos);
  CHECK(cache_a == before);
}

int main() { return pagedcore_test::run_all(); }
