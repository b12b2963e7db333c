// One step's schedule as flat arrays the model runner wraps without copying.
#pragma once

#include <cstdint>
#include <vector>

#include "core/common.h"
#include "core/step_trace.h"

namespace pagedcore {

// Batch layout (S scheduled sequences, T scheduled tokens, running ones first):
//
//   seq:              s0 (decode)  s1 (decode)  s2 (prefill chunk of 3)
//   query_start_loc:  0            1            2                        5   [S + 1]
//   input_ids:        t            t            t  t  t                      [T]
//   positions:        41           17           0  1  2                      [T]
//   slot_mapping:     block_table[pos / bs] * bs + pos % bs, kPadSlot = pad  [T]
//   seq_lens:         42           18           3                            [S]  cache length after this step
//   logits_indices:   0            1            4   rows sampled: chunks that reach the end of the known tokens
//
// Logits rows with draft tokens (speculative decoding). A sequence whose last k tokens are drafts
// (Sequence::num_draft_tokens) is scheduled only with all of its last k + 1 tokens in one chunk,
// and each of those positions yields one logits row: the row at the last accepted token `a`
// predicts d1, the row at d_i predicts d_{i+1}, the row at d_k predicts the bonus token.
//
//   seq:               s0 (decode)   s1 (a + 2 drafts)   s2 (partial prefill chunk)
//   query_start_loc:   0             1                   4             7             [S + 1]
//   input_ids:         t             a   d1  d2          p   p   p                   [T]
//   num_logits_rows:   1             3                   0                           [S]
//   sample_seq_ids:    s0            s1                                              [num_samples]
//   logits_start_loc:  0             1                   4                           [num_samples + 1]
//   logits_indices:    0             1   2   3                                       [num_logits]
//   row predicts:      next          d1  d2  bonus
//
// Rows of sample i: logits_indices[logits_start_loc[i] .. logits_start_loc[i + 1]); the last row
// of a sequence sits at query_start_loc[s + 1] - 1, so with no drafts anywhere (k = 0) every count
// is 1 and logits_indices is one row per sample_seq_ids entry, as before drafts existed.
// The drafts themselves are input_ids[logits_indices[r] + 1] for every row r but a sequence's last.
struct SchedulerOutput {
  int64_t step_id = 0;

  // Per scheduled sequence, batch order.
  std::vector<SeqId> seq_ids;                 // [S]
  std::vector<int32_t> num_scheduled_tokens;  // [S]
  std::vector<int32_t> num_computed_tokens;   // [S] tokens already in the cache before this step
  std::vector<int32_t> query_start_loc;       // [S + 1]
  std::vector<int32_t> seq_lens;              // [S] num_computed + num_scheduled
  std::vector<uint64_t> adapter_ids;          // [S] each sequence's LoRA adapter (CacheKey::adapter_id, 0: base)
  std::vector<int32_t> block_tables;          // [S, max_num_blocks_per_seq], padded with kNullBlock
  int32_t max_num_blocks_per_seq = 0;
  int32_t max_query_len = 0;
  int32_t max_seq_len = 0;

  // Per scheduled token.
  std::vector<int64_t> input_ids;             // [T]
  std::vector<int64_t> positions;             // [T]
  std::vector<int64_t> slot_mapping;          // [T]

  // Rows of the flat token batch whose logits are sampled, and whose rows they are (layout above).
  std::vector<int32_t> num_logits_rows;       // [S] num_draft_tokens + 1 when sampled, else 0
  std::vector<SeqId> sample_seq_ids;          // [num_samples] sequences with >= 1 logits row
  std::vector<int32_t> logits_start_loc;      // [num_samples + 1] offsets into logits_indices
  std::vector<int64_t> logits_indices;        // [num_logits] flat token rows, sample order

  // Block movements the runner performs before the forward: swap out, swap in, then copies.
  std::vector<int32_t> blocks_to_swap_out;    // [n, 2] (device block, cpu block)
  std::vector<int32_t> blocks_to_swap_in;     // [n, 2] (cpu block, device block)
  std::vector<int32_t> blocks_to_copy;        // [n, 2] (src, dst) copy-on-write

  std::vector<SeqId> preempted_seq_ids;       // preempted this step (recompute or swap)
  int32_t num_prefill_tokens = 0;             // tokens of sequences still short of their known tokens
  int32_t num_decode_tokens = 0;              // one-token steps of sequences at the end of their tokens
  int32_t num_draft_tokens = 0;               // draft tokens verified this step (counted in prefill tokens)

  std::vector<TraceEvent> events;             // [num_events] when tracing; exported as int64 [n, 4]

  int32_t num_seqs() const { return static_cast<int32_t>(seq_ids.size()); }
  int32_t num_tokens() const { return static_cast<int32_t>(input_ids.size()); }
  int32_t num_samples() const { return static_cast<int32_t>(sample_seq_ids.size()); }
  int32_t num_logits() const { return static_cast<int32_t>(logits_indices.size()); }
};

// A sample row drawn several times (n > 1): the child shares the parent's blocks and takes
// `token_id` as its first sampled token; the parent takes the row's token from sampled_token_ids.
struct SampleFork {
  SeqId parent_id;
  SeqId child_id;
  TokenId token_id;
};

// The tokens update() appends, per sample row of the step (SchedulerOutput::sample_seq_ids):
//
//   sample_seq_ids:       s0        s1              s2
//   num_accepted_tokens:  1         3               0         [num_samples], each in [0, num_logits_rows]
//   accepted_token_ids:   x         d1  d2' b                 [sum(num_accepted_tokens)]
//
// s1 had drafts d1 d2: it keeps d1, replaces d2 by d2' (the target's token) and drops the rest;
// the KV of d2 and after is rolled back. s2 takes nothing: its last token is computed again.
// Views, not owners: the caller keeps both arrays alive for the call.
struct AcceptedTokens {
  const TokenId* token_ids = nullptr;            // [num_tokens]
  size_t num_tokens = 0;
  const int32_t* num_accepted_tokens = nullptr;  // [num_samples]; null: one token per sample
  size_t num_samples = 0;
};

// What update() reports: sequences that finished with this step's tokens.
struct UpdateResult {
  std::vector<SeqId> finished_seq_ids;        // [F]
  std::vector<int32_t> finish_reasons;        // [F] FinishReason
  std::vector<TokenId> stop_token_ids;        // [F] the stopping token for kStop, else -1
  std::vector<TraceEvent> events;             // events of update() when tracing
};

}  // namespace pagedcore
