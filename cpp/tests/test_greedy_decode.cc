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
#include "kernels/argmax_rows.h"
#include "kernels/decoder_stack.h"
#include "kernels/embedding_rows.h"
#include "kernels/greedy_decode.h"
#include "kernels/norm.h"
#include "kernels/sample_rows.h"

using namespace pagedcore::kernels;

namespace {

constexpr int64_t E = 32, H = 2, Hkv = 1, D = 16, I = 48, V = 300, kMaxPos = 64;
constexpr int64_t kBlocks = 8, kBlockSize = 4;

std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct TinyModel {
  std::mt19937 rng{7};
  std::vector<float> table = random_vector(V * E, rng, 1.0f);               // [V, E]
  std::vector<float> input_norm = random_vector(E, rng, 0.1f), post_norm = random_vector(E, rng, 0.1f);
  std::vector<float> qkv = random_vector((H + 2 * Hkv) * D * E, rng, 0.2f);  // [(H + 2 Hkv) D, E]
  std::vector<float> o_proj = random_vector(E * H * D, rng, 0.2f);          // [E, H D]
  std::vector<float> gate_up = random_vector(2 * I * E, rng, 0.2f);         // [2 I, E]
  std::vector<float> down = random_vector(E * I, rng, 0.2f);                // [E, I]
  std::vector<float> final_norm = random_vector(E, rng, 0.1f);
  std::vector<float> head = random_vector(V * E, rng, 0.3f);                // [V, E]
  std::vector<float> cos_sin = std::vector<float>(kMaxPos * D);             // [kMaxPos, D]
  DecoderStack stack;
  GreedyDecoder decoder;

  TinyModel() {
    for (float& w : input_norm) w += 1.0f;
    for (float& w : post_norm) w += 1.0f;
    for (float& w : final_norm) w += 1.0f;
    for (int64_t p = 0; p < kMaxPos; ++p)
      for (int64_t j = 0; j < D / 2; ++j) {
        const double angle = p / std::pow(10000.0, 2.0 * j / D);
        cos_sin[p * D + j] = static_cast<float>(std::cos(angle));
        cos_sin[p * D + D / 2 + j] = static_cast<float>(std::sin(angle));
      }
    DecoderLayerWeights layer;
    layer.input_norm = input_norm.data();
    layer.post_norm = post_norm.data();
    layer.qkv = qkv.data();
    layer.o_proj = o_proj.data();
    layer.gate_up = gate_up.data();
    layer.down = down.data();
    stack.layers.push_back(layer);
    stack.sizes.hidden_size = E;
    stack.sizes.num_heads = H;
    stack.sizes.num_kv_heads = Hkv;
    stack.sizes.head_dim = D;
    stack.sizes.intermediate_size = I;
    stack.sizes.attn_scale = 0.25f;
    stack.sizes.dtype = DType::kFloat32;
    decoder.embedding.table = table.data();
    decoder.embedding.num_rows = V;
    decoder.embedding.K = E;
    decoder.cos_sin_cache = cos_sin.data();
    decoder.max_position = kMaxPos;
    decoder.final_norm = final_norm.data();
    decoder.head.params.weight = head.data();
    decoder.head.params.N = V;
    decoder.head.params.K = E;
    decoder.head_max_rows = 16;
  }
};

// One step's arrays: sequences of (context already cached, new tokens); block table i = blocks 2i, 2i+1.
struct Step {
  std::vector<int64_t> input_ids, positions, slot_mapping;
  std::vector<int32_t> block_tables, seq_lens, query_start_loc{0};
  int64_t max_query_len = 0, max_seq_len = 0;

  Step(const std::vector<std::pair<int64_t, int64_t>>& seqs, int64_t first_token) {
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto [context, new_tokens] = seqs[s];
      for (int64_t t = 0; t < new_tokens; ++t) {
        const int64_t pos = context + t;
        input_ids.push_back((first_token + 37 * static_cast<int64_t>(input_ids.size())) % V);
        positions.push_back(pos);
        slot_mapping.push_back((2 * s + pos / kBlockSize) * kBlockSize + pos % kBlockSize);
      }
      block_tables.push_back(static_cast<int32_t>(2 * s));
      block_tables.push_back(static_cast<int32_t>(2 * s + 1));
      seq_lens.push_back(static_cast<int32_t>(context + new_tokens));
      query_start_loc.push_back(static_cast<int32_t>(input_ids.size()));
      max_query_len = std::max(max_query_len, new_tokens);
      max_seq_len = std::max(max_seq_len, context + new_tokens);
    }
  }

  DecoderStackParams params(std::vector<float>& kv_cache) const {
    DecoderStackParams p;
    p.num_tokens = static_cast<int64_t>(input_ids.size());
    p.kv_cache = kv_cache.data();
    p.num_blocks = kBlocks;
    p.block_size = kBlockSize;
    p.slot_mapping = slot_mapping.data();
    p.block_tables = block_tables.data();
    p.seq_lens = seq_lens.data();
    p.query_start_loc = query_start_loc.data();
    p.num_seqs = static_cast<int64_t>(seq_lens.size());
    p.max_blocks_per_seq = 2;
    p.max_query_len = max_query_len;
    p.max_seq_len = max_seq_len;
    return p;
  }
};

std::vector<float> empty_cache() { return std::vector<float>(2 * kBlocks * Hkv * kBlockSize * D, 0.0f); }

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

std::vector<int64_t> run(TinyModel& m, const Step& step, std::vector<float>& kv_cache, const std::vector<int64_t>& rows,
                         Status* status = nullptr, const SampleRowsParams* sampling = nullptr) {
  std::vector<int64_t> tokens(rows.size(), -1);
  const Status st = m.decoder.run(m.stack, step.params(kv_cache), step.input_ids.data(), step.positions.data(),
                                  rows.data(), static_cast<int64_t>(rows.size()), tokens.data(), sampling);
  if (status) *status = st;
  else CHECK(st.is_ok());
  return tokens;
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

TEST(greedy_decoder_samples_as_sample_rows_does) {
  TinyModel m;
  std::vector<float> cache_a = empty_cache(), cache_b = empty_cache();
  const Step prefill({{0, 4}, {0, 2}}, 5);
  const std::vector<int64_t> rows = {3, 5};
  std::vector<float> temperature = {0.9f, 0.0f}, top_p = {0.8f, 1.0f}, min_p = {0.0f, 0.0f};
  std::vector<int64_t> top_k = {V, V};
  const int64_t W = sample_noise_width(V);
  std::mt19937 rng(3);
  std::exponential_distribution<float> e(1.0f);
  std::vector<float> noise(2 * W);
  for (float& n : noise) n = e(rng);
  SampleRowsParams sampling;
  sampling.temperature = temperature.data();
  sampling.top_k = top_k.data();
  sampling.top_p = top_p.data();
  sampling.min_p = min_p.data();
  sampling.noise = noise.data();
  sampling.noise_width = W;
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

  temperature[0] = -1.0f;  // refused before the layers write the cache
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

TEST(run_steps_equals_single_decode_steps) {
  // Two sequences after a prefill (3 and 5 tokens): the first decodes 4 tokens in one call, the second 2
  // (it stops stepping after step 1); placeholders in the input must not matter.
  TinyModel m;
  std::vector<float> cache_a = empty_cache(), cache_b = empty_cache();
  const Step prefill({{0, 3}, {0, 5}}, 11);
  const std::vector<int64_t> last_rows = {2, 7};
  const std::vector<int64_t> first = run(m, prefill, cache_a, last_rows);
  CHECK(run(m, prefill, cache_b, last_rows) == first);
  Step multi({{3, 4}, {5, 2}}, 1);  // placeholders (V - 1) after each first token: never read
  multi.input_ids = {first[0], V - 1, V - 1, V - 1, first[1], V - 1};
  std::vector<int64_t> tokens(multi.input_ids.size(), -1);
  CHECK(m.decoder.run_steps(m.stack, multi.params(cache_a), multi.input_ids.data(), multi.positions.data(),
                            tokens.data()).is_ok());
  // The same, one decode step at a time with the running sequences only.
  std::vector<int64_t> next = first, single;
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<std::pair<int64_t, int64_t>> seqs = {{3 + i, 1}};
    if (i < 2) seqs.push_back({5 + i, 1});
    Step one(seqs, 0);
    one.input_ids.assign(next.begin(), next.begin() + static_cast<int64_t>(seqs.size()));
    const std::vector<int64_t> rows = seqs.size() == 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0};
    next = run(m, one, cache_b, rows);
    single.push_back(next[0]);
    if (seqs.size() == 2) single.push_back(next[1]);
  }
  // tokens: sequence 0 at [0, 4), sequence 1 at [4, 6); single: step-major (s0, s1, s0, s1, s0, s0)
  CHECK(tokens[0] == single[0] && tokens[4] == single[1] && tokens[1] == single[2] && tokens[5] == single[3]);
  CHECK(tokens[2] == single[4] && tokens[3] == single[5]);
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
  // As above, sequence 0 sampled (temperature 0.8, top-p 0.9) over 4 steps and sequence 1 greedy over 2; a
  // token's noise row is its step's: single steps given the same rows give the same tokens and cache.
  TinyModel m;
  std::vector<float> cache_a = empty_cache(), cache_b = empty_cache();
  const Step prefill({{0, 3}, {0, 5}}, 11);
  const std::vector<int64_t> last_rows = {2, 7};
  const std::vector<int64_t> first = run(m, prefill, cache_a, last_rows);
  run(m, prefill, cache_b, last_rows);
  const int64_t W = sample_noise_width(V);
  std::mt19937 rng(5);
  std::exponential_distribution<float> exponential(1.0f);
  std::vector<float> noise(6 * W);  // [num_tokens, W]: sequence 0's steps at rows 0-3, sequence 1's at 4-5
  for (float& x : noise) x = exponential(rng);
  const std::vector<float> temperature = {0.8f, 0.0f}, top_p = {0.9f, 1.0f}, min_p = {0.0f, 0.0f};
  const std::vector<int64_t> top_k = {V, V};
  SampleRowsParams sampling;
  sampling.temperature = temperature.data();
  sampling.top_k = top_k.data();
  sampling.top_p = top_p.data();
  sampling.min_p = min_p.data();
  sampling.noise = noise.data();
  sampling.noise_width = W;
  Step multi({{3, 4}, {5, 2}}, 1);
  multi.input_ids = {first[0], V - 1, V - 1, V - 1, first[1], V - 1};
  std::vector<int64_t> tokens(multi.input_ids.size(), -1);
  CHECK(m.decoder.run_steps(m.stack, multi.params(cache_a), multi.input_ids.data(), multi.positions.data(),
                            tokens.data(), &sampling).is_ok());
  std::vector<int64_t> next = first, single;
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<std::pair<int64_t, int64_t>> seqs = {{3 + i, 1}};
    if (i < 2) seqs.push_back({5 + i, 1});
    Step one(seqs, 0);
    one.input_ids.assign(next.begin(), next.begin() + static_cast<int64_t>(seqs.size()));
    const int64_t n = static_cast<int64_t>(seqs.size());
    std::vector<float> step_noise(noise.begin() + i * W, noise.begin() + (i + 1) * W);  // sequence 0, step i
    if (n == 2) step_noise.insert(step_noise.end(), noise.begin() + (4 + i) * W, noise.begin() + (5 + i) * W);
    SampleRowsParams rows_sampling = sampling;
    rows_sampling.noise = step_noise.data();
    const std::vector<int64_t> rows = n == 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0};
    next = run(m, one, cache_b, rows, nullptr, &rows_sampling);
    single.push_back(next[0]);
    if (n == 2) single.push_back(next[1]);
  }
  CHECK(tokens[0] == single[0] && tokens[4] == single[1] && tokens[1] == single[2] && tokens[5] == single[3]);
  CHECK(tokens[2] == single[4] && tokens[3] == single[5]);
  CHECK(cache_a == cache_b);
  // The greedy sequence's tokens are its argmaxes: the same as run_steps without sampling.
  std::vector<float> cache_c = empty_cache();
  run(m, prefill, cache_c, last_rows);
  std::vector<int64_t> greedy(multi.input_ids.size(), -1);
  CHECK(m.decoder.run_steps(m.stack, multi.params(cache_c), multi.input_ids.data(), multi.positions.data(),
                            greedy.data()).is_ok());
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
