// The tiny model and step arrays of the GreedyDecoder tests (test_greedy_decode.cc,
// test_greedy_decode_steps.cc): a one-layer fp32 model with random weights, its KV cache, one step's
// arrays, two sampled rows' inputs, and run() = GreedyDecoder::run of a step's rows.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "check.h"
#include "kernels/decoder_stack.h"
#include "kernels/greedy_decode.h"
#include "kernels/sample_rows.h"

namespace greedy_decode_test {

using namespace pagedcore::kernels;

constexpr int64_t E = 32, H = 2, Hkv = 1, D = 16, I = 48, V = 300, kMaxPos = 64;
constexpr int64_t kBlocks = 8, kBlockSize = 4;

inline std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale) {
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

// Row 0 sampled (temperature, top-p), row 1 greedy, and noise_rows rows of Exponential(1) noise from `seed`.
struct TwoRowSampling {
  std::vector<float> temperature, top_p, min_p = {0.0f, 0.0f}, noise;
  std::vector<int64_t> top_k = {V, V};
  SampleRowsParams params;

  TwoRowSampling(float temp, float p, int64_t noise_rows, unsigned seed)
      : temperature{temp, 0.0f}, top_p{p, 1.0f} {
    const int64_t W = sample_noise_width(V);
    std::mt19937 rng(seed);
    std::exponential_distribution<float> exponential(1.0f);
    noise.resize(noise_rows * W);
    for (float& x : noise) x = exponential(rng);
    params.temperature = temperature.data();
    params.top_k = top_k.data();
    params.top_p = top_p.data();
    params.min_p = min_p.data();
    params.noise = noise.data();
    params.noise_width = W;
  }
  TwoRowSampling(const TwoRowSampling&) = delete;  // params points into the vectors
};

inline std::vector<float> empty_cache() { return std::vector<float>(2 * kBlocks * Hkv * kBlockSize * D, 0.0f); }

inline std::vector<int64_t> run(TinyModel& m, const Step& step, std::vector<float>& kv_cache,
                                const std::vector<int64_t>& rows, Status* status = nullptr,
                                const SampleRowsParams* sampling = nullptr) {
  std::vector<int64_t> tokens(rows.size(), -1);
  const Status st = m.decoder.run(m.stack, step.params(kv_cache), step.input_ids.data(), step.positions.data(),
                                  rows.data(), static_cast<int64_t>(rows.size()), tokens.data(), sampling);
  if (status) *status = st;
  else CHECK(st.is_ok());
  return tokens;
}

}  // namespace greedy_decode_test
