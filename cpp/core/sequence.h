// One sequence: the tokens it holds, how many of them have KV in the cache, and its block table.
#pragma once

#include <cstdint>
#include <vector>

#include "core/cache_key.h"
#include "core/common.h"

namespace pagedcore {

enum class SeqStatus : int32_t { kWaiting = 0, kRunning = 1, kSwapped = 2, kFinished = 3 };

enum class FinishReason : int32_t {
  kNone = 0,
  kStop = 1,     // EOS or a stop token id
  kLength = 2,   // max_tokens, max_model_len or the whole KV cache reached
  kAbort = 3,    // aborted by the caller (client gone, stop string matched, ...)
};

// What ends a sequence, and how it may be scheduled; fixed at add time.
struct StoppingParams {
  int32_t max_tokens = 16;                  // output tokens, >= 1
  int32_t min_tokens = 0;                   // EOS / stop ids are ignored before this many outputs
  bool ignore_eos = false;
  std::vector<TokenId> eos_token_ids;       // the model's EOS ids (ignored when ignore_eos)
  std::vector<TokenId> stop_token_ids;      // extra stop ids (never ignored)
  int32_t priority = 0;                     // lower value = served first (priority policy)
  CacheKey cache_key;                       // prefix-cache key parts besides the tokens
};

struct Sequence {
  SeqId seq_id = -1;
  int64_t arrival = 0;             // admission order, ties of one request broken by seq_id
  StoppingParams params;

  std::vector<TokenId> token_ids;  // [num_tokens] prompt then outputs
  int32_t num_prompt_tokens = 0;
  int32_t num_computed_tokens = 0; // tokens whose KV is in the cache
  // The last num_draft_tokens of token_ids are proposals (speculative drafts) awaiting
  // verification: the step that computes them emits num_draft_tokens + 1 logits rows and update()
  // keeps only the tokens the caller accepts. 0 for plain decoding.
  int32_t num_draft_tokens = 0;
  int32_t num_cached_tokens = -1;  // prefix-cache hit at first admission (-1: not yet admitted)
  int32_t num_preemptions = 0;

  // [num_blocks_held] physical ids: GPU pool when running, CPU pool when swapped.
  std::vector<BlockId> block_table;
  // [num_full_blocks_of_token_ids] chained hashes of full blocks of token_ids (prefix caching).
  std::vector<uint64_t> block_hashes;
  int32_t num_registered_blocks = 0;  // leading blocks already offered to the prefix index

  SeqStatus status = SeqStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  TokenId stop_token_id = -1;         // the token that stopped it (kStop), else -1
  int32_t num_scheduled_tokens = 0;   // this step's grant; 0 when not scheduled

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  bool finished() const { return status == SeqStatus::kFinished; }
};

}  // namespace pagedcore
