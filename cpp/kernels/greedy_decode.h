// A plain step in one call: the step's token ids in, the next token of every sampled row out.
//
// When the engine needs nothing from a step's logits but a token drawn from each sampled row's own
// distribution (every sampled row greedy or sampled with temperature / top-k / top-p / min-p after
// its penalties, logit bias and min_tokens bans; logprobs from copies of the raw rows; no grammar,
// beams or drafts: the engine decides), the Python
// forward + sampling path is ~10 calls that each wrap tensors and check them: 5-9% of a single-stream
// greedy token of the default model on the 2-core AMD EPYC Zen 4 (bench/RESULTS.md). This runs the
// same kernels, in the same order and on the same rows, from C++:
//
//   hidden  [T, E] = embedding rows of input_ids                  (embedding_rows.h, the table as held)
//   cos_sin [T, D] = cos_sin_cache[positions]                      (row copies)
//   hidden, residual = every decoder layer                         (decoder_stack.h)
//   normed  [T, E] = rms_norm(residual + hidden)                   (the final norm, norm.h)
//   logits  [R, E] = normed[logits_indices] . Whead^T, fp32        (the LM head's linear.h layer)
//   raw            = copies of the logits rows that want logprobs  (when asked)
//   logits         = logit_bias, min_tokens bans, penalties        (logit_edits.h, when given)
//   tokens  [R]    = argmax of each logits row                     (argmax_rows.h), or with
//                    per-row sampling inputs, sample_rows            (sample_rows.h: the noise is the caller's)
//
// so the tokens are the ones the Python path would sample, bit for bit (tests/engine/test_greedy_decode.py).
// (The name predates the sampled rows: "greedy" is the argmax-only case.)
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/decoder_stack.h"
#include "kernels/embedding_rows.h"
#include "kernels/kernel_types.h"
#include "kernels/linear.h"
#include "kernels/logit_edits.h"
#include "kernels/multi_step_edits.h"
#include "kernels/sample_rows.h"

namespace pagedcore {
namespace kernels {

// The model's weight-side arguments, bound once at load (pagedcore.models.greedy_decode builds one).
struct GreedyDecoder {
  // The token table as held (table, num_rows, K = E, format, out_dtype = the stack's dtype); the
  // step fills out, ids and num_ids.
  EmbeddingRowsParams embedding;
  const void* cos_sin_cache = nullptr;  // [max_position, D] of the stack's dtype: [cos | sin] per position
  int64_t max_position = 0;
  const void* final_norm = nullptr;     // [E] of the stack's dtype
  float final_norm_eps = 1e-6f;
  LinearLayer head;                     // [V, E] -> fp32 logits (out_dtype kFloat32, no epilogue)
  int64_t head_max_rows = 0;            // rows the head's kernel takes in one call (larger: not this path)

  // Benchmarks' split of the call (StepProbe): seconds in the layers (lookup, rotary rows, stack) and
  // in the head (final norm, LM head, argmax), added up while `timing` is on.
  bool timing = false;
  double layer_seconds = 0.0, head_seconds = 0.0;

  // Workspaces, grown on demand and kept: one decoder per model, steps run one at a time.
  std::vector<char> hidden_, residual_, cos_sin_, normed_, rows_;
  std::vector<float> logits_;

  // step: DecoderStackParams' per-step fields except hidden, residual and cos_sin (this owns those);
  // input_ids and positions [step.num_tokens]; logits_indices [num_rows] in [0, num_tokens), each
  // row's token written to tokens[num_rows] (num_rows 0: the layers only, for a chunk that samples
  // nothing). Checks every index before the stack writes the cache. sampling: null for each row's
  // argmax, else its temperature, top_k, top_p, min_p, noise and noise_width per row (the rest is
  // filled here) for sample_rows; its values are checked before the stack runs too. edits: null, or
  // the rows' logit edits (logit_edits.h, rows numbered 0..num_rows-1), checked before the stack runs
  // and applied to the logits before the argmax or sampling. raw_rows [num_raw] (rows in
  // [0, num_rows), checked first too) and raw_out [num_raw, V]: those rows' logits as the head gave
  // them, before any edit (the caller's logprobs: pagedcore/sampling/logprobs.py).
  Status run(DecoderStack& stack, const DecoderStackParams& step, const int64_t* input_ids,
             const int64_t* positions, const int64_t* logits_indices, int64_t num_rows, int64_t* tokens,
             const SampleRowsParams* sampling = nullptr, const LogitEditsParams* edits = nullptr,
             const int64_t* raw_rows = nullptr, int64_t num_raw = 0, float* raw_out = nullptr);

  // Several decode steps in one call (vLLM's num_scheduler_steps; pagedcore/engine/multi_step.py).
  // step: a scheduled step whose num_seqs sequences each have q_len_s = query_start_loc[s + 1] -
  // query_start_loc[s] >= 1 tokens at consecutive positions ending at seq_lens[s] - 1: the first is the
  // sequence's next input, the others placeholders whose slots the scheduler allocated. Runs
  // max_s q_len_s one-token steps: step i gives every sequence with q_len_s > i the token step i - 1
  // chose for it (i = 0: input_ids[query_start_loc[s]]) at its i-th position and slot, and writes that
  // step's argmax to tokens[query_start_loc[s] + i] (tokens [num_tokens]). Each is the decode step
  // run() would run for those sequences, so the tokens are those of single steps, bit for bit. Every
  // index is checked before the first step writes the cache. sampling: null for each step's argmax, else
  // each SEQUENCE's temperature, top_k, top_p and min_p [num_seqs] and one noise row per TOKEN
  // (noise [num_tokens, noise_width]: row query_start_loc[s] + i is sequence s's step i, drawn as a
  // single step i would draw it); each step's rows then go through sample_rows (temperature 0: argmax).
  // edits: null, or the logit edits a single step would make before step 0 over the num_seqs sequences
  // (rows 0..num_seqs-1), with ban_steps [num_seqs] (how many steps each sequence's min_tokens bans
  // last); each later step's edits add the tokens chosen before it (multi_step_edits.h). raw_seqs:
  // null, or [num_seqs] flags: the logits of every step of a flagged sequence, before any edit, are
  // copied into raw_out [sum of the flagged sequences' q_len, V] (their tokens in token order: logprobs).
  Status run_steps(DecoderStack& stack, const DecoderStackParams& step, const int64_t* input_ids,
                   const int64_t* positions, int64_t* tokens, const SampleRowsParams* sampling = nullptr,
                   const LogitEditsParams* edits = nullptr, const int32_t* ban_steps = nullptr,
                   const uint8_t* raw_seqs = nullptr, float* raw_out = nullptr);

 private:
  // run_steps' per-step arrays, for the sequences still stepping (step_seqs_: their indices in the call).
  std::vector<int64_t> step_seqs_, step_ids_, step_positions_, step_slots_, step_rows_, step_tokens_;
  std::vector<int32_t> step_seq_lens_, step_query_start_, step_tables_;
  std::vector<float> step_temperature_, step_top_p_, step_min_p_, step_noise_;  // sampled steps' rows
  std::vector<int64_t> step_top_k_;
  MultiStepEdits step_edits_;
  std::vector<int64_t> raw_start_, step_raw_rows_;  // raw_out row of a flagged sequence's first token; a step's
  std::vector<float> step_raw_;                      // [raw rows of a step, V]
};

}  // namespace kernels
}  // namespace pagedcore
