// GreedyDecoder::run: embedding -> decoder stack -> final norm -> LM head -> argmax or sampling in one call
// (greedy_decode.h says why and what it must equal).
#include "kernels/greedy_decode.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "kernels/argmax_rows.h"
#include "kernels/cpu_isa.h"
#include "kernels/norm.h"
#include "kernels/parallel.h"

namespace pagedcore {
namespace kernels {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

void* grow(std::vector<char>& v, int64_t bytes) {
  if (v.size() < static_cast<size_t>(bytes)) v.resize(bytes);
  return v.data();
}

}  // namespace

Status GreedyDecoder::run(DecoderStack& stack, const DecoderStackParams& step, const int64_t* input_ids,
                          const int64_t* positions, const int64_t* logits_indices, int64_t num_rows,
                          int64_t* tokens, const SampleRowsParams* sampling, const LogitEditsParams* edits,
                          const int64_t* raw_rows, int64_t num_raw, float* raw_out) {
  const ThreadingScope threading(decode_threading(), step.num_tokens);  // parallel.h: the pool's cheaper fork/joins
  const int64_t T = step.num_tokens, E = stack.sizes.hidden_size, D = stack.sizes.head_dim;
  const DType dtype = stack.sizes.dtype;
  const int64_t es = dtype_size(dtype);
  if (T <= 0) return Status::invalid("greedy_decode: a step of " + str(T) + " tokens");
  if (num_rows < 0 || num_rows > T)
    return Status::invalid("greedy_decode: " + str(num_rows) + " logits rows for " + str(T) + " tokens");
  if (num_rows > head_max_rows)
    return Status::invalid("greedy_decode: " + str(num_rows) + " logits rows; the head's kernel takes at most " +
                           str(head_max_rows));
  if (!input_ids || !positions || !cos_sin_cache || !final_norm || (num_rows > 0 && (!logits_indices || !tokens)))
    return Status::invalid("greedy_decode: a pointer is null");
  if (embedding.K != E || head.params.K != E || head.params.out_dtype != DType::kFloat32 ||
      head.params.epilogue != LinearEpilogue::kNone || embedding.out_dtype != dtype)
    return Status::invalid("greedy_decode: the embedding table, the head and the stack disagree on the hidden "
                           "size or the dtypes");
  // Every index is checked before anything runs: the stack writes this step's K/V into the cache.
  for (int64_t t = 0; t < T; ++t) {
    if (positions[t] < 0 || positions[t] >= max_position)
      return Status::out_of_range("greedy_decode: position " + str(positions[t]) + " of token " + str(t) +
                                  " is outside the rotary table [0, " + str(max_position) + ")");
    if (input_ids[t] < 0 || input_ids[t] >= embedding.num_rows)
      return Status::out_of_range("greedy_decode: token id " + str(input_ids[t]) + " is outside the vocabulary [0, " +
                                  str(embedding.num_rows) + ")");
  }
  bool identity = num_rows == T;  // every token sampled, in order: no gather (the Python path skips it too)
  for (int64_t r = 0; r < num_rows; ++r) {
    if (logits_indices[r] < 0 || logits_indices[r] >= T)
      return Status::out_of_range("greedy_decode: logits row " + str(logits_indices[r]) + " of a step of " +
                                  str(T) + " tokens");
    identity = identity && logits_indices[r] == r;
  }

  const int64_t V = head.params.N;
  SampleRowsParams sample;
  if (sampling) {  // the sampling inputs are checked now too: a bad value must not leave a written cache
    sample = *sampling;
    sample.num_rows = num_rows;
    sample.vocab = sample.row_stride = V;
    sample.out = tokens;
    sample.logits = nullptr;
    const Status checked = check_sample_inputs(sample);
    if (!checked.is_ok()) return checked;
  }
  if (edits) {  // likewise
    const Status checked = check_logit_edits(*edits, num_rows, V);
    if (!checked.is_ok()) return checked;
  }
  if (num_raw < 0 || (num_raw > 0 && (!raw_rows || !raw_out)))
    return Status::invalid("greedy_decode: " + str(num_raw) + " raw logits rows without their indices or output");
  for (int64_t i = 0; i < num_raw; ++i)
    if (raw_rows[i] < 0 || raw_rows[i] >= num_rows)
      return Status::out_of_range("greedy_decode: raw logits row " + str(raw_rows[i]) + " of a step that samples " +
                                  str(num_rows) + " rows");

  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = timing ? Clock::now() : Clock::time_point();
  void* hidden = grow(hidden_, T * E * es);      // [T, E]
  void* residual = grow(residual_, T * E * es);  // [T, E]
  char* cos_sin = static_cast<char*>(grow(cos_sin_, T * D * es));  // [T, D]
  void* normed = grow(normed_, T * E * es);      // [T, E]

  EmbeddingRowsParams lookup = embedding;
  lookup.out = hidden;
  lookup.ids = input_ids;
  lookup.num_ids = T;
  lookup.out_stride = E;
  Status st = embedding_rows(lookup);
  if (!st.is_ok()) return st;
  const char* table = static_cast<const char*>(cos_sin_cache);
  for (int64_t t = 0; t < T; ++t) std::memcpy(cos_sin + t * D * es, table + positions[t] * D * es, D * es);

  DecoderStackParams p = step;
  p.hidden = hidden;
  p.residual = residual;
  p.cos_sin = cos_sin;
  st = stack.run(p);
  const Clock::time_point t1 = timing ? Clock::now() : Clock::time_point();
  if (timing) layer_seconds += std::chrono::duration<double>(t1 - t0).count();
  if (!st.is_ok() || num_rows == 0) return st;  // (a prompt chunk that samples nothing: its K/V are all it leaves)

  RmsNormParams norm;
  norm.out = normed;
  norm.residual = residual;
  norm.x = hidden;
  norm.weight = final_norm;
  norm.rows = T;
  norm.n = E;
  norm.x_stride = norm.out_stride = norm.residual_stride = E;
  norm.eps = final_norm_eps;
  norm.dtype = dtype;
  st = rms_norm(norm);
  if (!st.is_ok()) return st;

  const void* head_x = normed;  // [num_rows, E]
  if (!identity) {
    char* rows = static_cast<char*>(grow(rows_, num_rows * E * es));
    for (int64_t r = 0; r < num_rows; ++r)
      std::memcpy(rows + r * E * es, static_cast<const char*>(normed) + logits_indices[r] * E * es, E * es);
    head_x = rows;
  }
  if (logits_.size() < static_cast<size_t>(num_rows * V)) logits_.resize(num_rows * V);
  st = head.run(logits_.data(), head_x, num_rows, E, V);  // fp32 [num_rows, V]
  if (!st.is_ok()) return st;
  for (int64_t i = 0; i < num_raw; ++i)  // before any edit: logprobs describe the model
    std::memcpy(raw_out + i * V, logits_.data() + raw_rows[i] * V, V * sizeof(float));
  if (edits && !(st = apply_logit_edits(*edits, logits_.data(), num_rows, V, V)).is_ok()) return st;

  if (sampling) {
    sample.logits = logits_.data();
    st = sample_rows(sample);
    if (timing) head_seconds += std::chrono::duration<double>(Clock::now() - t1).count();
    return st;
  }
  ArgmaxRowsParams argmax;
  argmax.logits = logits_.data();
  argmax.num_rows = num_rows;
  argmax.vocab = V;
  argmax.row_stride = V;
  argmax.out = tokens;
  st = argmax_rows(argmax);
  if (timing) head_seconds += std::chrono::duration<double>(Clock::now() - t1).count();
  return st;
}

Status GreedyDecoder::run_steps(DecoderStack& stack, const DecoderStackParams& step, const int64_t* input_ids,
                                const int64_t* positions, int64_t* tokens, const SampleRowsParams* sampling,
                                const LogitEditsParams* edits, const int32_t* ban_steps, const uint8_t* raw_seqs,
                                float* raw_out) {
  const ThreadingScope threading(decode_threading(), step.num_seqs);  // each forward: a token a sequence
  const int64_t T = step.num_tokens, S = step.num_seqs, B = step.max_blocks_per_seq;
  if (T <= 0 || S <= 0)
    return Status::invalid("greedy_decode: run_steps of " + str(T) + " tokens, " + str(S) + " sequences");
  if (!input_ids || !positions || !tokens || !step.query_start_loc || !step.seq_lens || !step.slot_mapping ||
      !step.block_tables)
    return Status::invalid("greedy_decode: run_steps: a pointer is null");
  const int32_t* qsl = step.query_start_loc;
  if (qsl[0] != 0 || qsl[S] != T)
    return Status::invalid("greedy_decode: run_steps: query_start_loc must run from 0 to num_tokens (" + str(T) + ")");
  const int64_t num_slots = step.num_blocks * step.block_size;
  int64_t num_steps = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t begin = qsl[s], q_len = qsl[s + 1] - begin;
    if (q_len < 1) return Status::invalid("greedy_decode: run_steps: sequence " + str(s) + " has no token");
    if (step.seq_lens[s] != positions[begin] + q_len)
      return Status::invalid("greedy_decode: run_steps: sequence " + str(s) + " ends at " + str(step.seq_lens[s]) +
                             " but its tokens start at position " + str(positions[begin]));
    for (int64_t i = 0; i < q_len; ++i) {
      if (positions[begin + i] != positions[begin] + i || positions[begin + i] < 0 ||
          positions[begin + i] >= max_position)
        return Status::out_of_range("greedy_decode: run_steps: sequence " + str(s) +
                                    "'s positions are not consecutive inside the rotary table [0, " +
                                    str(max_position) + ")");
      if (step.slot_mapping[begin + i] < 0 || step.slot_mapping[begin + i] >= num_slots)
        return Status::out_of_range("greedy_decode: run_steps: slot " + str(step.slot_mapping[begin + i]) +
                                    " is outside the cache's " + str(num_slots));
    }
    num_steps = std::max(num_steps, q_len);
  }
  const int64_t W = sampling ? sampling->noise_width : 0;
  if (W < 0) return Status::invalid("greedy_decode: run_steps: a noise width of " + str(W));
  if (sampling) {  // every sequence's values, checked before the first step writes the cache
    SampleRowsParams all = *sampling;
    all.num_rows = S;
    all.vocab = all.row_stride = head.params.N;
    all.logits = nullptr;
    all.out = tokens;
    const Status checked = check_sample_inputs(all);
    if (!checked.is_ok()) return checked;
    step_temperature_.resize(S);
    step_top_k_.resize(S);
    step_top_p_.resize(S);
    step_min_p_.resize(S);
    step_noise_.resize(S * W);
  }
  const int64_t V = head.params.N;
  if (raw_seqs) {  // raw_out's row of each flagged sequence's first token
    if (!raw_out) return Status::invalid("greedy_decode: run_steps: raw_seqs without raw_out");
    raw_start_.assign(S, -1);
    int64_t rows = 0;
    for (int64_t s = 0; s < S; ++s)
      if (raw_seqs[s]) raw_start_[s] = rows, rows += qsl[s + 1] - qsl[s];
  }
  if (edits) {  // likewise: every pair checked now
    const Status checked = step_edits_.init(*edits, ban_steps, S, V);
    if (!checked.is_ok()) return checked;
  }
  step_seqs_.resize(S);
  step_ids_.resize(S);
  step_positions_.resize(S);
  step_slots_.resize(S);
  step_rows_.resize(S);
  step_tokens_.resize(S);
  step_seq_lens_.resize(S);
  step_query_start_.resize(S + 1);
  step_tables_.resize(S * B);
  for (int64_t r = 0; r < S; ++r) step_rows_[r] = r;  // every row of a one-token step is sampled, in order
  for (int64_t i = 0; i < num_steps; ++i) {
    // The sequences still stepping, in order: n of them, one token each.
    int64_t n = 0, max_seq_len = 0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t begin = qsl[s];
      if (qsl[s + 1] - begin <= i) continue;
      step_seqs_[n] = s;
      step_ids_[n] = i == 0 ? input_ids[begin] : tokens[begin + i - 1];
      step_positions_[n] = positions[begin + i];
      step_slots_[n] = step.slot_mapping[begin + i];
      step_seq_lens_[n] = static_cast<int32_t>(positions[begin + i] + 1);
      step_query_start_[n] = static_cast<int32_t>(n);
      max_seq_len = std::max<int64_t>(max_seq_len, step_seq_lens_[n]);
      if (sampling) {  // the sequence's values and its noise row for step i
        step_temperature_[n] = sampling->temperature[s];
        step_top_k_[n] = sampling->top_k[s];
        step_top_p_[n] = sampling->top_p[s];
        step_min_p_[n] = sampling->min_p[s];
        if (W > 0 && sampling->noise)  // (all-greedy sequences may come without noise)
          std::memcpy(step_noise_.data() + n * W, sampling->noise + (begin + i) * W, W * sizeof(float));
      }
      ++n;
    }
    step_query_start_[n] = static_cast<int32_t>(n);
    DecoderStackParams one = step;
    one.num_tokens = n;
    one.num_actual_tokens = -1;
    one.num_seqs = n;
    one.slot_mapping = step_slots_.data();
    one.seq_lens = step_seq_lens_.data();
    one.query_start_loc = step_query_start_.data();
    // The step's own table while every sequence steps; after one stops, the rows of those still stepping.
    one.block_tables = step.block_tables;
    if (n != S) {
      for (int64_t j = 0; j < n; ++j)
        std::memcpy(step_tables_.data() + j * B, step.block_tables + step_seqs_[j] * B, B * sizeof(int32_t));
      one.block_tables = step_tables_.data();
    }
    one.max_query_len = 1;
    one.max_seq_len = max_seq_len;
    SampleRowsParams rows;
    if (sampling) {
      rows = *sampling;
      rows.temperature = step_temperature_.data();
      rows.top_k = step_top_k_.data();
      rows.top_p = step_top_p_.data();
      rows.min_p = step_min_p_.data();
      rows.noise = step_noise_.data();
    }
    const LogitEditsParams* step_edits = edits ? &step_edits_.at_step(i, step_seqs_.data(), n) : nullptr;
    step_raw_rows_.clear();
    if (raw_seqs)
      for (int64_t j = 0; j < n; ++j)
        if (raw_seqs[step_seqs_[j]]) step_raw_rows_.push_back(j);
    const int64_t num_raw = static_cast<int64_t>(step_raw_rows_.size());
    if (step_raw_.size() < static_cast<size_t>(num_raw * V)) step_raw_.resize(num_raw * V);
    const Status st = run(stack, one, step_ids_.data(), step_positions_.data(), step_rows_.data(), n,
                          step_tokens_.data(), sampling ? &rows : nullptr, step_edits,
                          num_raw ? step_raw_rows_.data() : nullptr, num_raw, num_raw ? step_raw_.data() : nullptr);
    if (!st.is_ok()) return st;
    for (int64_t k = 0; k < num_raw; ++k)  // each flagged sequence's row of step i to its token's raw row
      std::memcpy(raw_out + (raw_start_[step_seqs_[step_raw_rows_[k]]] + i) * V, step_raw_.data() + k * V,
                  V * sizeof(float));
    for (int64_t j = 0; j < n; ++j) {
      tokens[qsl[step_seqs_[j]] + i] = step_tokens_[j];
      if (edits) step_edits_.chose(step_seqs_[j], static_cast<int32_t>(step_tokens_[j]));
    }
  }
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
