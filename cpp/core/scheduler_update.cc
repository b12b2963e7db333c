// Scheduler: the sequence lifecycle around schedule(): add, fork, append / remove tokens, abort, finish.
// update() itself, which accepts a step's tokens, lives in scheduler_accept.cc.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/scheduler.h"

namespace pagedcore {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

Sequence* Scheduler::get(SeqId seq_id, const char* what) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || it->second->finished()) {
    throw std::invalid_argument(std::string(what) + ": no unfinished sequence with id " + str(seq_id));
  }
  return it->second.get();
}

const Sequence* Scheduler::find(SeqId seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void Scheduler::add_sequence(SeqId seq_id, const std::vector<TokenId>& prompt_token_ids,
                             const StoppingParams& params) {
  const int64_t num_prompt = static_cast<int64_t>(prompt_token_ids.size());
  auto reject = [&](const std::string& why) {
    if (trace_ptr_) trace_.add(TraceEventType::kReject, seq_id, num_prompt, 0);
    throw std::invalid_argument(why);
  };
  if (seqs_.count(seq_id)) reject("sequence id " + str(seq_id) + " is already in use; use a fresh id");
  if (num_prompt == 0) reject("the prompt is empty; give at least one token");
  if (num_prompt > config_.max_model_len) {
    reject("prompt has " + str(num_prompt) + " tokens but max_model_len is " + str(config_.max_model_len) +
           "; shorten the prompt or raise max_model_len (--max-model-len)");
  }
  const int64_t num_blocks = kv_.blocks_for(static_cast<int>(num_prompt));
  if (num_blocks > config_.num_gpu_blocks) {
    reject("prompt needs " + str(num_blocks) + " KV blocks (" + str(num_prompt) + " tokens) but the whole cache holds " +
           str(config_.num_gpu_blocks) + "; give the KV cache more memory (--kv-cache-memory) or shorten the prompt");
  }
  if (params.max_tokens < 1) reject("max_tokens must be >= 1, got " + str(params.max_tokens));
  if (params.min_tokens < 0 || params.min_tokens > params.max_tokens) {
    reject("min_tokens must be in [0, max_tokens=" + str(params.max_tokens) + "], got " + str(params.min_tokens));
  }
  for (TokenId t : prompt_token_ids) {
    if (t < 0) reject("prompt token ids must be >= 0, got " + str(t));
  }
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = seq_id;
  seq->arrival = next_arrival_++;
  seq->params = params;
  seq->token_ids = prompt_token_ids;
  seq->num_prompt_tokens = static_cast<int32_t>(num_prompt);
  seq->status = SeqStatus::kWaiting;
  if (trace_ptr_) trace_.add(TraceEventType::kQueueMove, seq_id, -1, static_cast<int64_t>(SeqStatus::kWaiting));
  waiting_.insert(seq.get());
  seqs_.emplace(seq_id, std::move(seq));
}

void Scheduler::fork_sequence(SeqId parent_id, SeqId child_id, TokenId last_token_id) {
  if (step_in_flight_) throw std::logic_error("fork_sequence() between schedule() and update(); call it after update()");
  Sequence* parent = get(parent_id, "fork_sequence");
  if (parent->status != SeqStatus::kRunning) {
    throw std::invalid_argument("fork_sequence: parent " + str(parent_id) + " is not running");
  }
  if (seqs_.count(child_id)) throw std::invalid_argument("fork_sequence: id " + str(child_id) + " is already in use");
  // Only a last token without KV yet may differ (the blocks up to it are shared), and never a draft.
  if (last_token_id >= 0 &&
      (parent->num_draft_tokens > 0 || parent->num_computed_tokens != parent->num_tokens() - 1)) {
    throw std::invalid_argument("fork_sequence: parent " + str(parent_id) +
                                " has draft tokens or its last token is already computed; fork right after "
                                "update() or pass last_token_id=-1 to copy it as it is");
  }
  Sequence* child = make_child(*parent, child_id);
  if (last_token_id >= 0) {
    child->token_ids.back() = last_token_id;
    child->block_hashes.resize(std::min<size_t>(child->block_hashes.size(), child->num_computed_tokens / config_.block_size));
  }
}

Sequence* Scheduler::make_child(const Sequence& parent, SeqId child_id) {
  auto child = std::make_unique<Sequence>(parent);
  child->seq_id = child_id;
  child->num_scheduled_tokens = 0;
  child->num_preemptions = 0;
  child->block_table.clear();
  kv_.fork(parent, *child);
  if (trace_ptr_) trace_.add(TraceEventType::kFork, child_id, parent.seq_id, 0);
  Sequence* raw = child.get();
  running_.insert(raw);
  seqs_.emplace(child_id, std::move(child));
  return raw;
}

void Scheduler::append_tokens(SeqId seq_id, const std::vector<TokenId>& token_ids, bool draft) {
  if (step_in_flight_) throw std::logic_error("append_tokens() between schedule() and update(); call it after update()");
  Sequence* seq = get(seq_id, "append_tokens");
  const int64_t num_new = static_cast<int64_t>(token_ids.size());
  if (!draft && seq->num_draft_tokens > 0 && num_new > 0) {
    throw std::invalid_argument("append_tokens: sequence " + str(seq_id) + " ends in " + str(seq->num_draft_tokens) +
                                " draft tokens and known tokens cannot follow drafts; append them with draft=True "
                                "or remove_tail_tokens(" + str(seq_id) + ", " + str(seq->num_draft_tokens) + ") first");
  }
  if (seq->num_tokens() + num_new > max_seq_len_) {
    throw std::invalid_argument("append_tokens: sequence " + str(seq_id) + " would exceed " + str(max_seq_len_) + " tokens");
  }
  if (draft && seq->num_draft_tokens + num_new + 1 > config_.max_num_batched_tokens) {
    throw std::invalid_argument("append_tokens: " + str(seq->num_draft_tokens + num_new) +
                                " drafts are verified in one step of that many tokens + 1, more than "
                                "max_num_batched_tokens (" + str(config_.max_num_batched_tokens) +
                                "); propose fewer drafts or raise max_num_batched_tokens");
  }
  for (TokenId t : token_ids) {
    if (t < 0) throw std::invalid_argument("append_tokens: token ids must be >= 0, got " + str(t));
  }
  seq->token_ids.insert(seq->token_ids.end(), token_ids.begin(), token_ids.end());
  if (draft) seq->num_draft_tokens += static_cast<int32_t>(num_new);
}

void Scheduler::remove_tail_tokens(SeqId seq_id, int32_t num_tokens) {
  if (step_in_flight_) {
    throw std::logic_error("remove_tail_tokens() between schedule() and update(); call it after update()");
  }
  Sequence* seq = get(seq_id, "remove_tail_tokens");
  //   token_ids: [ prompt | outputs with KV ... | next to compute | appended ......... ]
  //                                               ^ num_computed     removable: the tail after it
  const int32_t num_removable =
      seq->num_tokens() - std::max(seq->num_computed_tokens + 1, seq->num_prompt_tokens);
  if (num_tokens < 0 || num_tokens > num_removable) {
    throw std::invalid_argument("remove_tail_tokens: sequence " + str(seq_id) + " can drop 0.." + str(num_removable) +
                                " tokens (appended, without KV, past the prompt, leaving one to compute), not " +
                                str(num_tokens) + "; pass a count in that range");
  }
  if (num_tokens == 0) return;
  const int32_t new_len = seq->num_tokens() - num_tokens;
  seq->token_ids.resize(new_len);
  seq->num_draft_tokens = std::max(0, seq->num_draft_tokens - num_tokens);
  // Hashes of blocks that held a removed token no longer name this sequence's content.
  seq->block_hashes.resize(std::min<size_t>(seq->block_hashes.size(), new_len / config_.block_size));
  if (seq->status == SeqStatus::kRunning) kv_.truncate(*seq, kv_.blocks_for(new_len));
}

void Scheduler::set_draft_tokens(SeqId seq_id, const std::vector<TokenId>& token_ids) {
  Sequence* seq = get(seq_id, "set_draft_tokens");
  if (static_cast<int64_t>(token_ids.size()) != seq->num_draft_tokens) {
    throw std::invalid_argument("set_draft_tokens: sequence " + str(seq_id) + " has " + str(seq->num_draft_tokens) +
                                " drafts, got " + str(static_cast<int64_t>(token_ids.size())) +
                                " tokens; pass one per draft");
  }
  for (TokenId t : token_ids) {
    if (t < 0) throw std::invalid_argument("set_draft_tokens: token ids must be >= 0, got " + str(t));
  }
  //   token_ids: [ kept ........ | d1 .. dk ]  ->  [ kept ........ | t1 .. tk ]
  const int32_t first = seq->num_tokens() - seq->num_draft_tokens;
  std::copy(token_ids.begin(), token_ids.end(), seq->token_ids.begin() + first);
  seq->block_hashes.resize(std::min<size_t>(seq->block_hashes.size(), first / config_.block_size));
}

bool Scheduler::abort_sequence(SeqId seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || it->second->finished()) return false;
  Sequence& seq = *it->second;
  switch (seq.status) {
    case SeqStatus::kRunning:
      running_.erase(&seq);
      kv_.free(seq);
      break;
    case SeqStatus::kSwapped:
      swapped_.erase(&seq);
      kv_.free_swapped(seq);
      break;
    case SeqStatus::kWaiting:
      waiting_.erase(&seq);
      break;
    case SeqStatus::kFinished:
      break;
  }
  finish(seq, FinishReason::kAbort, -1);
  return true;
}

void Scheduler::finish(Sequence& seq, FinishReason reason, TokenId stop_token_id) {
  seq.finish_reason = reason;
  seq.stop_token_id = stop_token_id;
  if (trace_ptr_) trace_.add(TraceEventType::kFinish, seq.seq_id, static_cast<int64_t>(reason), seq.num_output_tokens());
  move(seq, SeqStatus::kFinished);
  finished_.push_back(&seq);  // erased when no step in flight can still point at it
}

void Scheduler::flush_finished() {
  for (Sequence* seq : finished_) seqs_.erase(seq->seq_id);
  finished_.clear();
}

bool Scheduler::should_stop(Sequence& seq, TokenId token, FinishReason* reason) const {
  const StoppingParams& p = seq.params;
  if (seq.num_output_tokens() >= p.min_tokens) {
    const bool is_eos = !p.ignore_eos && std::find(p.eos_token_ids.begin(), p.eos_token_ids.end(), token) != p.eos_token_ids.end();
    const bool is_stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
    if (is_eos || is_stop) {
      *reason = FinishReason::kStop;
      return true;
    }
  }
  if (seq.num_output_tokens() >= p.max_tokens || seq.num_tokens() >= max_seq_len_) {
    *reason = FinishReason::kLength;
    return true;
  }
  return false;
}

void Scheduler::cancel_step() {
  if (!step_in_flight_) return;
  for (Sequence* seq : scheduled_) seq->num_scheduled_tokens = 0;
  scheduled_.clear();
  sampled_.clear();
  step_in_flight_ = false;
  if (trace_ptr_) trace_.take();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.num_waiting = static_cast<int32_t>(waiting_.size());
  s.num_running = static_cast<int32_t>(running_.size());
  s.num_swapped = static_cast<int32_t>(swapped_.size());
  s.num_free_blocks = kv_.gpu_pool().num_free_blocks();
  s.num_cached_free_blocks = kv_.gpu_pool().num_cached_free_blocks();
  s.num_free_cpu_blocks = kv_.cpu_pool().num_free_blocks();
  s.kv_cache_usage = kv_.usage();
  s.prefix_query_tokens = kv_.prefix_query_tokens();
  s.prefix_hit_tokens = kv_.prefix_hit_tokens();
  s.num_preemptions = num_preemptions_;
  s.num_evictions = kv_.gpu_pool().num_evictions();
  s.num_steps = num_steps_;
  return s;
}

std::vector<SeqId> Scheduler::ids_of(const SequenceQueue& queue) {
  std::vector<SeqId> ids;
  ids.reserve(queue.size());
  for (const Sequence* s : queue.items()) ids.push_back(s->seq_id);
  return ids;
}

}  // namespace pagedcore
