// Continuous batching on one token budget per step: running sequences first, then swapped-in
// ones, then waiting ones; chunked prefill, prefix-cache hits and preemption fall out of
// num_computed_tokens chasing num_tokens under that budget.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/kv_cache_manager.h"
#include "core/scheduler_config.h"
#include "core/scheduler_output.h"
#include "core/sequence.h"
#include "core/sequence_queue.h"
#include "core/step_trace.h"

namespace pagedcore {

struct SchedulerStats {
  int32_t num_waiting = 0;
  int32_t num_running = 0;
  int32_t num_swapped = 0;
  int32_t num_free_blocks = 0;
  int32_t num_cached_free_blocks = 0;
  int32_t num_free_cpu_blocks = 0;
  double kv_cache_usage = 0.0;           // used device blocks / all device blocks
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_evictions = 0;
  int64_t num_steps = 0;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  const SchedulerConfig& config() const { return config_; }

  // Queues a new sequence. Throws std::invalid_argument, naming the fix, when it could never run
  // (empty, longer than max_model_len, more blocks than the whole cache, duplicate id).
  void add_sequence(SeqId seq_id, const std::vector<TokenId>& prompt_token_ids, const StoppingParams& params);
  // After update(): a new running sequence sharing every block of a running parent (n > 1
  // sampling, beam search). Its last, not yet computed token is replaced by last_token_id
  // (-1 keeps the parent's).
  void fork_sequence(SeqId parent_id, SeqId child_id, TokenId last_token_id);
  // Appends tokens to an unfinished sequence; the next step schedules them. Known tokens (draft =
  // false) are kept as given. Drafts (draft = true) are proposals to verify: the step computing
  // them yields num_draft_tokens + 1 logits rows and update_accepted() keeps what is accepted.
  // Known tokens cannot follow drafts.
  void append_tokens(SeqId seq_id, const std::vector<TokenId>& token_ids, bool draft = false);
  // The inverse of append_tokens: drops the last num_tokens tokens, which must all be without KV
  // (at most num_tokens - num_computed_tokens - 1, so one token is left for the next step to
  // compute) and past the prompt. Drafts among them are dropped from num_draft_tokens.
  void remove_tail_tokens(SeqId seq_id, int32_t num_tokens);
  // Gives a sequence's drafts other values (num_draft_tokens of them), also between schedule() and
  // update(): multi-step decoding (pagedcore/engine/multi_step.py) schedules placeholder drafts for
  // their KV slots, computes the real tokens in those slots, then names them here so that update()
  // keeps the KV. Block hashes over a draft position are dropped (registration recomputes them).
  void set_draft_tokens(SeqId seq_id, const std::vector<TokenId>& token_ids);
  // Ends a sequence in any state and frees its blocks at once. False when unknown or finished.
  bool abort_sequence(SeqId seq_id);

  // Decides this step. Must be followed by update() before the next schedule().
  SchedulerOutput schedule();
  // Advances every scheduled sequence by its granted tokens and appends one sampled token per
  // sample row (SchedulerOutput::sample_seq_ids order); `forks` add children of sampled
  // sequences that share their blocks (n > 1). Reports the sequences that finished.
  UpdateResult update(const std::vector<TokenId>& sampled_token_ids, const std::vector<SampleFork>& forks = {});
  // The general form: sample row j (sample_seq_ids order) appends num_accepted_tokens[j] tokens,
  // 0 .. num_logits_rows[j], taken in order from the flat accepted_token_ids (layout in
  // scheduler_output.h). Draft tokens not confirmed are rolled back: token ids, KV
  // (num_computed_tokens), block-table tail and block hashes. Stop conditions are checked at every
  // accepted token; tokens after a stop are dropped. update() is this form with every count 1.
  UpdateResult update_accepted(const std::vector<TokenId>& accepted_token_ids,
                               const std::vector<int32_t>& num_accepted_tokens,
                               const std::vector<SampleFork>& forks = {});

  // Forgets the step in flight (the forward failed): nothing advances, the same tokens are
  // scheduled again next time. No-op when no step is in flight.
  void cancel_step();
  bool step_in_flight() const { return step_in_flight_; }

  // Read-only prefix-cache probe for a prompt not (yet) added here: the leading tokens an admission
  // would find cached under cache_key (KVCacheManager::num_cached_prefix_tokens). Not thread-safe
  // against the mutating calls: the caller serialises (the Python binding holds the GIL throughout).
  int num_cached_prefix_tokens(const std::vector<TokenId>& prompt_token_ids, const CacheKey& cache_key) const {
    return kv_.num_cached_prefix_tokens(prompt_token_ids, cache_key);
  }

  bool has_unfinished() const { return !waiting_.empty() || !running_.empty() || !swapped_.empty(); }
  const Sequence* find(SeqId seq_id) const;
  SchedulerStats stats() const;
  std::vector<SeqId> waiting_ids() const { return ids_of(waiting_); }
  std::vector<SeqId> running_ids() const { return ids_of(running_); }
  std::vector<SeqId> swapped_ids() const { return ids_of(swapped_); }
  KVCacheManager& kv_cache() { return kv_; }
  const KVCacheManager& kv_cache() const { return kv_; }

 private:
  Sequence* get(SeqId seq_id, const char* what);
  static std::vector<SeqId> ids_of(const SequenceQueue& queue);
  int fit_grant(const Sequence& seq, int num_computed, int num_new_tokens) const;
  void grant(Sequence& seq, int num_new_tokens, SchedulerOutput& out);
  UpdateResult apply_update(const AcceptedTokens& accepted, const std::vector<SampleFork>& forks);
  bool accept_tokens(Sequence& seq, const TokenId* token_ids, int num_accepted, FinishReason* reason);
  void preempt(Sequence& victim, SchedulerOutput& out);
  void finish(Sequence& seq, FinishReason reason, TokenId stop_token_id);
  bool should_stop(Sequence& seq, TokenId token, FinishReason* reason) const;
  Sequence* make_child(const Sequence& parent, SeqId child_id);
  void move(Sequence& seq, SeqStatus to);
  void flush_finished();
  void fill_block_tables(SchedulerOutput& out) const;

  SchedulerConfig config_;
  int32_t max_seq_len_;  // min(max_model_len, whole cache): a sequence stops (length) there
  KVCacheManager kv_;
  StepTrace trace_;
  StepTrace* trace_ptr_ = nullptr;  // &trace_ when tracing, else null

  std::unordered_map<SeqId, std::unique_ptr<Sequence>> seqs_;
  SequenceQueue waiting_;
  SequenceQueue running_;
  SequenceQueue swapped_;
  std::vector<Sequence*> finished_;   // erased once no step refers to them

  // The step in flight between schedule() and update().
  bool step_in_flight_ = false;
  std::vector<Sequence*> scheduled_;  // [S] batch order
  std::vector<Sequence*> sampled_;    // [num_samples]
  std::vector<uint64_t> step_adapters_;  // distinct adapters granted this step (<= max_loras)
  bool fits_adapter(const Sequence& seq) const;

  int64_t next_arrival_ = 0;
  int64_t num_steps_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace pagedcore
