// greedy_decode.h: GreedyDecoder::run on a one-layer fp32 model with random weights against the same
// kernels called one by one (lookup, rotary rows, decoder_stack, rms_norm, the head, argmax_rows or
// sample_rows): the same tokens and the same KV cache bytes, for an all-decode step (no gather), a
// prefill step that samples some rows (gathered) and one that samples none; and every refused input
// (position, token id, logits row, row count, sampling value) leaves the cache as it was.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "greedy_decode_fixture.h"
#include "kernels/argmax_rows.h"
#include "kernels/decoder_stack.h"
#include "kernels/embedding_rows.h"
#include "kernels/greedy_decode.h"
#include "kernels/norm.h"
#include "kernels/parallel.h"
#include "kernels/sample_rows.h"

using namespace pagedcore::kernels;
using namespace greedy_decode_test;

namespace {

// The same step, kernel by kernel: fp32 logits [rows.size(), V].
std::vector<float> reference_logits(TinyModel& m, const Step& step, std::vector<float>& kv_cache,
                                    const std::vector<int64_t>& rows) {
  const int64_t T = static_cast<int64_t>(step.input_ids.size());
  std::vector<float> hidden(T * E), residual(T * E), cos_sin(T * D), normed(T * E);
  EmbeddingRowsParams lookup = m.decoder.embedding;
  lookup.out = hidden.data();
  lookup.ids = step.input_ids.data();
  lookup.num_ids = T;
  lookup.out_stride = E;
  CHECK(embedding_rows(lookup).is_ok());
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(&cos_sin[t * D], &m.cos_sin[step.positions[t] * D], D * sizeof(float));
  DecoderStackParams p = step.params(kv_cache);
  p.hidden = hidden.data();
  p.residual = residual.data();
  p.cos_sin = cos_sin.data();
  CHECK(m.stack.run(p).is_ok());
  RmsNormParams norm;
  norm.out = normed.data();
  norm.residual = residual.data();
  norm.x = hidden.data();
  norm.weight = m.final_norm.data();
  norm.rows = T;
  norm.n = E;
  norm.x_stride = norm.out_stride = norm.residual_stride = E;
  CHECK(rms_norm(norm).is_ok());
  std::vector<float> gathered(rows.size() * E), logits(rows.size() * V);
  for (size_t r = 0; r < rows.size(); ++r) std::memcpy(&gathered[r * E], &normed[rows[r] * E], E * sizeof(float));
  CHECK(m.decoder.head.run(logits.data(), gathered.data(), static_cast<int64_t>(rows.size()), E, V).is_ok());
  return logits;
}

std::vector<int64_t> argmax_of(const std::vector<float>& logits, int64_t rows) {
  std::vector<int64_t> out(rows);
  ArgmaxRowsParams a;
  a.logits = logits.data();
  a.num_rows = rows;
  a.vocab = V;
  a.row_stride = V;
  a.out = out.data();
  CHECK(argmax_rows(a).is_ok());
  return out;
}


}  // namespace

TEST(greedy_decoder_equals_the_kernels_one_by_one) {
  TinyModel m;
  std::vector<float> cache_a = empty_cache(), cache_b = empty_cache();
  // Prefill: 3 tokens and 5 tokens, the last of each sampled (gathered rows).
  const Step prefill({{0, 3}, {0, 5}}, 11);
  const std::vector<int64_t> last_rows = {2, 7};
  CHECK(run(m, prefill, cache_a, last_rows) == argmax_of(reference_logits(m, prefill, cache_b, last_rows), 2));
  CHECK(cache_a == cache_b);
  // Decode: one token each, every row sampled in order (no gather).
  const Step decode({{3, 1}, {5, 1}}, 4);
  const std::vector<int64_t> all_rows = {0, 1};
  CHECK(run(m, decode, cache_a, all_rows) == argmax_of(reference_logits(m, decode, cache_b, all_rows), 2));
  CHECK(cache_a == cache_b);
  // A prompt chunk that samples nothing: the layers run, the cache fills, no token.
  const Step chunk({{4, 2}}, 9);
  CHECK(run(m, chunk, cache_a, {}).empty());
  reference_logits(m, chunk, cache_b, {});
  CHECK(cache_a == cache_b);
}

// A linear held in runs (a GGUF mixing block types inside one fused layer): each run is its own kernel call over its
// columns, gate_up's SwiGLU after both. Split into runs of the same format, the layer computes what one run does.
TEST(a_linear_split_into_runs_equals_the_one_run_layer) {
  TinyModel whole, split;
  DecoderLayerWeights& w = split.stack.layers[0];
  const int64_t v_rows = Hkv * D, qk_rows = (H + Hkv) * D;
  w.num_later_runs[kStackQkvProj] = 1;  // q | k, then v
  w.later_runs[kStackQkvProj][0] = {split.qkv.data() + qk_rows * E, WeightFormat::kDenseF32, nullptr, v_rows};
  w.num_later_runs[kStackGateUpProj] = 1;  // gate, then up: the SwiGLU runs on the stored gate | up
  w.later_runs[kStackGateUpProj][0] = {split.gate_up.data() + I * E, WeightFormat::kDenseF32, nullptr, I};
  std::vector<float> cache_whole = empty_cache(), cache_split = empty_cache();
  for (const Step& step : {Step({{0, 3}, {0, 5}}, 11), Step({{3, 1}, {5, 1}}, 4)}) {
    const std::vector<int64_t> rows = {0, 1};
    CHECK(reference_logits(split, step, cache_split, rows) == reference_logits(whole, step, cache_whole, rows));
    CHECK(cache_split == cache_whole);
  }
  w.later_runs[kStackGateUpProj][0].rows = 2 * I;  // the first run would have no rows
  const Step step({{0, 1}}, 3);
  std::vector<float> cache = empty_cache();
  DecoderStackParams p = step.params(cache);
  std::vector<float> hidden(E, 0.5f), residual(E), cos_sin(D, 1.f);
  p.hidden = hidden.data(), p.residual = residual.data(), p.cos_sin = cos_sin.data();
  const Status st = split.stack.run(p);
  CHECK(!st.is_ok() && st.message.find("the first run needs some") != std::string::npos);
}

TEST(decode_threading_changes_threads_not_tokens) {
  TinyModel m;
  const Threading before = active_threading();
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<float>> caches;
  const DecodeThreading saved = decode_threading();
  for (DecodeThreading t : {DecodeThreading::kInherit, DecodeThreading::kPool, DecodeThreading::kOpenMP,
                            DecodeThreading::kAuto}) {
    set_decode_threading(t);
    std::vector<float> cache = empty_cache();
    std::vector<int64_t> got = run(m, Step({{0, 3}, {0, 5}}, 11), cache, {2, 7});
    const std::vector<int64_t> next = run(m, Step({{3, 1}, {5, 1}}, 4), cache, {0, 1});
    got.insert(got.end(), next.begin(), next.end());
    tokens.push_back(got);
    caches.push_back(cache);
    CHECK(active_threading() == before);  // the scope restored the kernels' threading
  }
  set_decode_threading(saved);
  for (size_t i = 1; i < tokens.size(); ++i) CHECK(tokens[i] == tokens[0] && caches[i] == caches[0]);
  {
    const ThreadingScope scope(DecodeThreading::kPool, 1000);
    CHECK(active_threading() == Threading::kPool);
    CHECK(max_threads() >= 1);
  }
  CHECK(active_threading() == before);
  {
    const ThreadingScope small(DecodeThreading::kAuto, kAutoPoolMaxTokens);
    CHECK(active_threading() == Threading::kPool);
  }
  {
    const ThreadingScope large(DecodeThreading::kAuto, kAutoPoolMaxTokens + 1);
    CHECK(active_threading() == before);
  }
  CHECK(active_threading() == before);
}

TEST(greedy_decoder_samples_as_sample_rows_does) {
  TinyModel m;
  std::vector<float> cache_a = empty_cache(), cache_b = empty_cache();
  const Step prefill({{0, 4}, {0, 2}}, 5);
  const std::vector<int64_t> rows = {3, 5};
  TwoRowSampling sample_rows_in(0.9f, 0.8f, 2, 3);
  SampleRowsParams& sampling = sample_rows_in.params;
  const std::vector<int64_t> got = run(m, prefill, cache_a, rows, nullptr, &sampling);

  std::vector<float> logits = reference_logits(m, prefill, cache_b, rows);
  std::vector<int64_t> want(2);
  SampleRowsParams p = sampling;
  p.logits = logits.data();
  p.num_rows = 2;
  p.vocab = p.row_stride = V;
  p.out = want.data();
  CHECK(sample_rows(p).is_ok());
  CHECK(got == want);
  CHECK(cache_a == cache_b);

  sample_rows_in.temperature[0] = -1.0f;  // refused before the layers write the cache
  const std::vector<float> before = cache_a;
  Status st;
  run(m, Step({{6, 1}}, 3), cache_a, {0}, &st, &sampling);
  CHECK(!st.is_ok() && st.message.find("temperature") != std::string::npos);
  CHECK(cache_a == before);
}

TEST(greedy_decoder_edits_and_copies_raw_rows_as_the_kernels_do) {
  TinyModel m;
  std::vector<float> cache_a = empty_cache(), cache_b = empty_cache();
  const Step prefill({{0, 3}, {0, 4}}, 6);
  const std::vector<int64_t> rows = {2, 6};
  // Row 1's argmax pushed off by a ban and row 0's pulled to token 1 by a bias; penalties on both.
  std::vector<float> plain = reference_logits(m, prefill, cache_b, rows);
  cache_b = empty_cache();
  const std::vector<int64_t> plain_tokens = argmax_of(plain, 2);
  std::vector<int32_t> bias_rows = {0}, bias_tokens = {1}, ban_rows = {1},
                       ban_tokens = {static_cast<int32_t>(plain_tokens[1])}, rep_rows = {0, 1}, rep_tokens = {2, 3},
                       counted_rows = {1}, counted_tokens = {4}, counts = {2};
  std::vector<float> bias_values = {50.0f}, rep_penalty = {1.3f, 0.8f}, presence = {0.0f, 0.2f},
                     frequency = {0.0f, 0.1f};
  LogitEditsParams edits;
  edits.bias_rows = bias_rows.data();
  edits.bias_tokens = bias_tokens.data();
  edits.bias_values = bias_values.data();
  edits.num_bias = 1;
  edits.ban_rows = ban_rows.data();
  edits.ban_tokens = ban_tokens.data();
  edits.num_bans = 1;
  edits.repetition_rows = rep_rows.data();
  edits.repetition_tokens = rep_tokens.data();
  edits.num_repetition = 2;
  edits.repetition_penalty = rep_penalty.data();
  edits.counted_rows = counted_rows.data();
  edits.counted_tokens = counted_tokens.data();
  edits.counts = counts.data();
  edits.num_counted = 1;
  edits.presence_penalty = presence.data();
  edits.frequency_penalty = frequency.data();
  const std::vector<int64_t> raw_rows = {1, 0};
  std::vector<float> raw(2 * V, -1.0f);
  std::vector<int64_t> got(2, -1);
  CHECK(m.decoder
            .run(m.stack, prefill.params(cache_a), prefill.input_ids.data(), prefill.positions.data(), rows.data(), 2,
                 got.data(), nullptr, &edits, raw_rows.data(), 2, raw.data())
            .is_ok());
  std::vector<float> logits = reference_logits(m, prefill, cache_b, rows);
  CHECK(std::equal(raw.begin(), raw.begin() + V, logits.begin() + V));  // raw row 0 = logits row 1, unedited
  CHECK(std::equal(raw.begin() + V, raw.end(), logits.begin()));
  CHECK(apply_logit_edits(edits, logits.data(), 2, V, V).is_ok());
  CHECK(got == argmax_of(logits, 2));
  CHECK(got[0] == 1 && got[1] != plain_tokens[1]);
  CHECK(cache_a == cache_b);
  // A raw row past the step's rows and an edit past the vocabulary: refused before the cache is written.
  const std::vector<float> before = cache_a;
  const std::vector<int64_t> bad_raw = {1}, one_row = {0};
  const Step next({{7, 1}}, 2);
  Status st = m.decoder.run(m.stack, next.params(cache_a), next.input_ids.data(), next.positions.data(), one_row.data(),
                            1, got.data(), nullptr, nullptr, bad_raw.data(), 1, raw.data());
  CHECK(!st.is_ok() && st.message.find("raw logits row 1") != std::string::npos);
  bias_tokens[0] = V;
  edits.num_bans = edits.num_repetition = edits.num_counted = 0;  // (their rows would be past this step's one)
  st = m.decoder.run(m.stack, next.params(cache_a), next.input_ids.data(), next.positions.data(), one_row.data(), 1,
                     got.data(), nullptr, &edits);
  CHECK(!st.is_ok() && st.message.find("vocabulary") != std::string::npos);
  CHECK(cache_a == before);
}

TEST(greedy_decoder_refuses_bad_indices_before_writing_the_cache) {
  TinyModel m;
  std::vector<float> cache = empty_cache();
  const std::vector<float> before = cache;
  Status st;
  Step bad_position({{0, 2}}, 1);
  bad_position.positions[1] = kMaxPos;
  run(m, bad_position, cache, {1}, &st);
  CHECK(!st.is_ok() && st.message.find("rotary table") != std::string::npos);
  Step bad_token({{0, 2}}, 1);
  bad_token.input_ids[0] = V;
  run(m, bad_token, cache, {1}, &st);
  CHECK(!st.is_ok() && st.message.find("vocabulary") != std::string::npos);
  run(m, Step({{0, 2}}, 1), cache, {2}, &st);  // a logits row past the step's tokens
  CHECK(!st.is_ok() && st.message.find("logits row") != std::string::npos);
  m.decoder.head_max_rows = 1;  // more sampled rows than the head's kernel takes
  run(m, Step({{0, 1}, {0, 1}}, 1), cache, {0, 1}, &st);
  CHECK(!st.is_ok() && st.message.find("at most 1") != std::string::npos);
  CHECK(cache == before);
}

int main() { return pagedcore_test::run_all(); }
