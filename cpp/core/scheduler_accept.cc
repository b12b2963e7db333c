// Scheduler::update(): a step's sampled or accepted tokens join their sequences; unconfirmed
// drafts are rolled back (tokens, KV, block-table tail, block hashes); stops are checked per token.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/scheduler.h"

namespace pagedcore {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

UpdateResult Scheduler::update(const std::vector<TokenId>& sampled_token_ids, const std::vector<SampleFork>& forks) {
  AcceptedTokens accepted;
  accepted.token_ids = sampled_token_ids.data();
  accepted.num_tokens = sampled_token_ids.size();
  accepted.num_samples = sampled_token_ids.size();  // one token per sample row
  return apply_update(accepted, forks);
}

UpdateResult Scheduler::update_accepted(const std::vector<TokenId>& accepted_token_ids,
                                        const std::vector<int32_t>& num_accepted_tokens,
                                        const std::vector<SampleFork>& forks) {
  AcceptedTokens accepted;
  accepted.token_ids = accepted_token_ids.data();
  accepted.num_tokens = accepted_token_ids.size();
  accepted.num_accepted_tokens = num_accepted_tokens.data();
  accepted.num_samples = num_accepted_tokens.size();
  return apply_update(accepted, forks);
}

bool Scheduler::accept_tokens(Sequence& seq, const TokenId* token_ids, int num_accepted, FinishReason* reason) {
  //   after the forward:  token_ids = [ kept (P tokens) | d1 .. dk ]   KV for all P + k positions
  //   after accepting:    token_ids = [ kept (P tokens) | t1 .. tj ]   j <= num_accepted, cut after a stop
  //   KV stays valid for the P kept tokens and the leading t_i equal to d_i (num_matching);
  //   the last token never keeps it, so the next step computes it and yields its logits.
  const int num_drafts = seq.num_draft_tokens;
  const int num_kept = seq.num_tokens() - num_drafts;
  int num_matching = 0;
  if (num_drafts > 0) {
    const int limit = std::min(num_accepted, num_drafts);
    while (num_matching < limit && token_ids[num_matching] == seq.token_ids[num_kept + num_matching]) ++num_matching;
    seq.token_ids.resize(num_kept);  // shrinking keeps the capacity: no allocation
    seq.num_draft_tokens = 0;
  }
  bool stopped = false;
  for (int i = 0; i < num_accepted && !stopped; ++i) {
    seq.token_ids.push_back(token_ids[i]);
    stopped = should_stop(seq, token_ids[i], reason);
  }
  const int num_valid = num_kept + num_matching;
  seq.num_computed_tokens = std::min(std::min(seq.num_computed_tokens, num_valid), seq.num_tokens() - 1);
  if (num_drafts > 0 || num_accepted == 0) {
    // Roll back what the rejected drafts left: hashes of blocks holding a changed position, and
    // (unless the sequence ends now and frees everything) blocks past its last token. A kept
    // block's rejected slots are simply written again by the next step.
    seq.block_hashes.resize(std::min<size_t>(seq.block_hashes.size(), num_valid / config_.block_size));
    seq.num_registered_blocks = std::min(seq.num_registered_blocks, seq.num_computed_tokens / config_.block_size);
    if (!stopped) kv_.truncate(seq, kv_.blocks_for(seq.num_tokens()));
  }
  return stopped;
}

UpdateResult Scheduler::apply_update(const AcceptedTokens& accepted, const std::vector<SampleFork>& forks) {
  if (!step_in_flight_) throw std::logic_error("update() without a scheduled step: call schedule() first");
  const size_t num_samples = sampled_.size();
  if (accepted.num_accepted_tokens == nullptr) {
    if (accepted.num_tokens != num_samples) {
      throw std::invalid_argument("update() got " + str(static_cast<int64_t>(accepted.num_tokens)) +
                                  " sampled tokens for " + str(static_cast<int64_t>(num_samples)) +
                                  " sampled rows; pass one token per SchedulerOutput.sample_seq_ids entry "
                                  "(or num_accepted_tokens when verifying drafts)");
    }
  } else {
    if (accepted.num_samples != num_samples) {
      throw std::invalid_argument("update(): num_accepted_tokens has " + str(static_cast<int64_t>(accepted.num_samples)) +
                                  " entries for " + str(static_cast<int64_t>(num_samples)) +
                                  " sampled sequences; pass one count per SchedulerOutput.sample_seq_ids entry");
    }
    size_t total = 0;
    for (size_t j = 0; j < num_samples; ++j) {
      const int32_t m = accepted.num_accepted_tokens[j];
      const int32_t max_m = sampled_[j]->num_draft_tokens + 1;
      if (m < 0 || m > max_m) {
        throw std::invalid_argument("update(): sequence " + str(sampled_[j]->seq_id) + " can accept 0.." + str(max_m) +
                                    " tokens (its num_logits_rows), got " + str(m) +
                                    "; pass at most one token per logits row");
      }
      total += static_cast<size_t>(m);
    }
    if (total != accepted.num_tokens) {
      throw std::invalid_argument("update(): num_accepted_tokens sums to " + str(static_cast<int64_t>(total)) +
                                  " but " + str(static_cast<int64_t>(accepted.num_tokens)) +
                                  " accepted tokens were given; pass exactly the accepted tokens, concatenated in "
                                  "sample_seq_ids order");
    }
  }
  for (size_t i = 0; i < accepted.num_tokens; ++i) {
    if (accepted.token_ids[i] < 0) {
      throw std::invalid_argument("update(): sampled token ids must be >= 0, got " + str(accepted.token_ids[i]));
    }
  }
  // Check every fork before changing anything, so a bad call leaves the step intact.
  std::vector<Sequence*> fork_parents(forks.size());
  for (size_t f = 0; f < forks.size(); ++f) {
    auto it = seqs_.find(forks[f].parent_id);
    const bool sampled = it != seqs_.end() &&
                         std::find(sampled_.begin(), sampled_.end(), it->second.get()) != sampled_.end();
    if (!sampled) {
      throw std::invalid_argument("update(): fork parent " + str(forks[f].parent_id) + " was not sampled this step");
    }
    if (it->second->num_draft_tokens > 0) {
      throw std::invalid_argument("update(): fork parent " + str(forks[f].parent_id) +
                                  " verified draft tokens this step; fork it with fork_sequence() after update()");
    }
    if (forks[f].token_id < 0) throw std::invalid_argument("update(): fork token ids must be >= 0");
    const bool id_taken = seqs_.count(forks[f].child_id) > 0 ||
                          std::any_of(forks.begin(), forks.begin() + static_cast<std::ptrdiff_t>(f),
                                      [&](const SampleFork& g) { return g.child_id == forks[f].child_id; });
    if (id_taken) throw std::invalid_argument("update(): fork child id " + str(forks[f].child_id) + " is already in use");
    fork_parents[f] = it->second.get();
  }
  UpdateResult result;
  // Sequences aborted while the step ran are finished already and skipped throughout.
  for (Sequence* seq : scheduled_) {
    if (seq->finished()) continue;
    seq->num_computed_tokens += seq->num_scheduled_tokens;
    seq->num_scheduled_tokens = 0;
  }
  // Stops are decided token by token here and carried out after block registration below.
  struct Stop {
    Sequence* seq;
    FinishReason reason;
  };
  std::vector<Stop> stops;
  // Children copy the parent before it takes its own token: same KV, same shared blocks.
  for (size_t f = 0; f < forks.size(); ++f) {
    if (fork_parents[f]->finished()) continue;
    Sequence* child = make_child(*fork_parents[f], forks[f].child_id);
    FinishReason reason;
    if (accept_tokens(*child, &forks[f].token_id, 1, &reason)) stops.push_back({child, reason});
  }
  size_t offset = 0;
  for (size_t j = 0; j < num_samples; ++j) {
    const int num_accepted = accepted.num_accepted_tokens ? accepted.num_accepted_tokens[j] : 1;
    const TokenId* tokens = accepted.token_ids + offset;
    offset += static_cast<size_t>(num_accepted);
    if (sampled_[j]->finished()) continue;
    FinishReason reason;
    if (accept_tokens(*sampled_[j], tokens, num_accepted, &reason)) stops.push_back({sampled_[j], reason});
  }
  // Full computed blocks become findable before a finished sequence releases them.
  for (Sequence* seq : scheduled_) {
    if (!seq->finished()) kv_.register_computed_blocks(*seq);
  }
  for (const Stop& stop : stops) {
    Sequence& seq = *stop.seq;
    kv_.free(seq);
    finish(seq, stop.reason, stop.reason == FinishReason::kStop ? seq.token_ids.back() : -1);
    result.finished_seq_ids.push_back(seq.seq_id);
    result.finish_reasons.push_back(static_cast<int32_t>(stop.reason));
    result.stop_token_ids.push_back(seq.stop_token_id);
  }
  if (!stops.empty()) running_.erase_if([](const Sequence* s) { return s->finished(); });
  step_in_flight_ = false;
  scheduled_.clear();
  sampled_.clear();
  if (trace_ptr_) result.events = trace_.take();
  return result;
}

}  // namespace pagedcore
