// Scheduler: construction and schedule(), the per-step decision.
#include "core/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pagedcore {

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_((config.validate(), config)),
      max_seq_len_(std::min<int64_t>(config.max_model_len,
                                     static_cast<int64_t>(config.num_gpu_blocks) * config.block_size)),
      kv_(config.num_gpu_blocks, config.num_cpu_blocks, config.block_size, config.enable_prefix_caching),
      waiting_(config.policy),
      running_(config.policy),
      swapped_(config.policy) {
  if (config_.enable_trace) trace_ptr_ = &trace_;
  kv_.set_trace(trace_ptr_);
}

void Scheduler::move(Sequence& seq, SeqStatus to) {
  if (trace_ptr_) {
    trace_.add(TraceEventType::kQueueMove, seq.seq_id, static_cast<int64_t>(seq.status), static_cast<int64_t>(to));
  }
  seq.status = to;
}

int Scheduler::fit_grant(const Sequence& seq, int num_computed, int num_new_tokens) const {
  // A sequence with k drafts yields its k + 1 logits rows from one forward, so a chunk never
  // ends inside that verify window:
  //
  //   token_ids: [ prompt / accepted ......... | a  d1 .. dk ]
  //                ^ num_computed               ^ window_start = num_tokens - k - 1
  //   chunk end:  <= window_start  or  == num_tokens
  //
  // 0 when the budget cannot reach either: the sequence waits for a step with more budget.
  if (seq.num_draft_tokens == 0) return num_new_tokens;
  const int end = num_computed + num_new_tokens;
  const int window_start = seq.num_tokens() - seq.num_draft_tokens - 1;
  if (end == seq.num_tokens() || end <= window_start) return num_new_tokens;
  return std::max(0, window_start - num_computed);
}

bool Scheduler::fits_adapter(const Sequence& seq) const {
  // At most max_loras distinct adapters per step (the LoRA weights resident for one forward);
  // base-model rows (adapter 0) never count.
  const uint64_t adapter = seq.params.cache_key.adapter_id;
  if (adapter == 0 || config_.max_loras == 0) return true;
  if (std::find(step_adapters_.begin(), step_adapters_.end(), adapter) != step_adapters_.end()) return true;
  return static_cast<int>(step_adapters_.size()) < config_.max_loras;
}

void Scheduler::grant(Sequence& seq, int num_new_tokens, SchedulerOutput& out) {
  //   token_ids:  [ computed ............ | granted this step | not yet ]
  //                0                      c                   c+n
  //   slot of position p = block_table[p / bs] * bs + p % bs
  const int bs = config_.block_size;
  const int c = seq.num_computed_tokens;
  const int end = c + num_new_tokens;
  seq.num_scheduled_tokens = num_new_tokens;
  out.seq_ids.push_back(seq.seq_id);
  out.num_scheduled_tokens.push_back(num_new_tokens);
  out.num_computed_tokens.push_back(c);
  out.seq_lens.push_back(end);
  const uint64_t adapter = seq.params.cache_key.adapter_id;
  out.adapter_ids.push_back(adapter);
  if (adapter != 0 && std::find(step_adapters_.begin(), step_adapters_.end(), adapter) == step_adapters_.end()) {
    step_adapters_.push_back(adapter);
  }
  out.query_start_loc.push_back(out.query_start_loc.back() + num_new_tokens);
  out.max_query_len = std::max(out.max_query_len, num_new_tokens);
  out.max_seq_len = std::max(out.max_seq_len, end);
  out.max_num_blocks_per_seq = std::max(out.max_num_blocks_per_seq, static_cast<int32_t>(seq.block_table.size()));
  for (int p = c; p < end; ++p) {
    out.input_ids.push_back(seq.token_ids[p]);
    out.positions.push_back(p);
    out.slot_mapping.push_back(static_cast<int64_t>(seq.block_table[p / bs]) * bs + p % bs);
  }
  out.num_logits_rows.push_back(0);
  if (end == seq.num_tokens()) {  // the chunk reaches the last known token: its logits are sampled
    // One row per draft plus the bonus row, the last rows of this sequence's query (see
    // scheduler_output.h); fit_grant() keeps the whole window in this chunk.
    const int num_rows = seq.num_draft_tokens + 1;
    if (num_rows > num_new_tokens) {
      throw std::logic_error("internal: sequence " + std::to_string(seq.seq_id) + " has " +
                             std::to_string(seq.num_draft_tokens) + " drafts but only " +
                             std::to_string(num_new_tokens) + " tokens scheduled");
    }
    const int64_t first_row = out.query_start_loc.back() - num_rows;
    for (int r = 0; r < num_rows; ++r) out.logits_indices.push_back(first_row + r);
    out.logits_start_loc.push_back(out.logits_start_loc.back() + num_rows);
    out.num_logits_rows.back() = num_rows;
    out.num_draft_tokens += seq.num_draft_tokens;
    out.sample_seq_ids.push_back(seq.seq_id);
    sampled_.push_back(&seq);
  }
  if (num_new_tokens == 1 && end == seq.num_tokens()) {
    out.num_decode_tokens += 1;
  } else {
    out.num_prefill_tokens += num_new_tokens;
  }
  scheduled_.push_back(&seq);
  if (trace_ptr_) trace_.add(TraceEventType::kSchedule, seq.seq_id, num_new_tokens, c);
}

void Scheduler::preempt(Sequence& victim, SchedulerOutput& out) {
  ++num_preemptions_;
  ++victim.num_preemptions;
  out.preempted_seq_ids.push_back(victim.seq_id);
  // Swap keeps the computed KV in CPU memory; when the CPU pool is short, fall back to recompute.
  const bool swapped = config_.preemption_mode == PreemptionMode::kSwap && kv_.swap_out(victim, &out.blocks_to_swap_out);
  if (trace_ptr_) {
    trace_.add(TraceEventType::kPreempt, victim.seq_id,
               static_cast<int64_t>(swapped ? PreemptionMode::kSwap : PreemptionMode::kRecompute), 0);
  }
  if (swapped) {
    move(victim, SeqStatus::kSwapped);
    swapped_.insert(&victim);
  } else {
    kv_.free(victim);
    victim.num_computed_tokens = 0;
    move(victim, SeqStatus::kWaiting);
    waiting_.insert(&victim);  // its early arrival puts it back at the front
  }
}

SchedulerOutput Scheduler::schedule() {
  if (step_in_flight_) {
    throw std::logic_error("schedule() called twice: call update() with the sampled tokens of step " +
                           std::to_string(num_steps_) + " first");
  }
  flush_finished();
  SchedulerOutput out;
  out.step_id = ++num_steps_;
  out.query_start_loc.push_back(0);
  out.logits_start_loc.push_back(0);
  scheduled_.clear();
  sampled_.clear();
  step_adapters_.clear();
  int budget = config_.max_num_batched_tokens;
  bool preempted = false;

  // 1. Running sequences, in order. A sequence that cannot get blocks preempts the last running
  //    one (lowest priority, latest arrival), possibly itself.
  //    Forks may leave more running sequences than max_num_seqs; the cap holds per step.
  for (size_t i = 0; i < running_.size() && budget > 0 && out.num_seqs() < config_.max_num_seqs; ++i) {
    Sequence* seq = running_[i];
    if (!fits_adapter(*seq)) continue;  // its adapter waits for a step with room (max_loras)
    const int num_new =
        fit_grant(*seq, seq->num_computed_tokens, std::min(seq->num_tokens() - seq->num_computed_tokens, budget));
    if (num_new <= 0) continue;
    bool preempted_self = false;
    while (!kv_.allocate_slots(*seq, num_new, &out.blocks_to_copy)) {
      Sequence* victim = running_.pop_back();
      preempt(*victim, out);
      preempted = true;
      if (victim == seq) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
    grant(*seq, num_new, out);
    budget -= num_new;
  }

  // 2. Swapped sequences come back before any new work, and only when nothing was preempted.
  size_t num_swapped_in = 0;
  if (!preempted) {
    for (; num_swapped_in < swapped_.size(); ++num_swapped_in) {
      Sequence* seq = swapped_[num_swapped_in];
      if (budget <= 0 || static_cast<int>(running_.size() + num_swapped_in) >= config_.max_num_seqs) break;
      if (!fits_adapter(*seq)) break;  // swapped sequences return in order
      const int num_new =
          fit_grant(*seq, seq->num_computed_tokens, std::min(seq->num_tokens() - seq->num_computed_tokens, budget));
      if (num_new <= 0 || !kv_.swap_in(*seq, num_new, &out.blocks_to_swap_in)) break;
      move(*seq, SeqStatus::kRunning);
      grant(*seq, num_new, out);
      budget -= num_new;
    }
  }

  // 3. Waiting sequences, in order, while budget, sequence cap and blocks allow (head-of-line
  //    blocking keeps FCFS fair: a large prompt is not starved by smaller ones behind it).
  //    A sequence whose adapter finds no room (max_loras) is passed over, not waited on: the
  //    ones behind it may use adapters already in the step (or none).
  size_t num_admitted = 0;
  if (!preempted && num_swapped_in == swapped_.size()) {
    for (size_t w = 0; w < waiting_.size(); ++w) {
      Sequence* seq = waiting_[w];
      if (budget <= 0 ||
          static_cast<int>(running_.size() + num_swapped_in + num_admitted) >= config_.max_num_seqs) {
        break;
      }
      if (!fits_adapter(*seq)) continue;
      const std::vector<BlockId> cached_prefix = kv_.find_cached_prefix(*seq);
      const int num_hit_tokens = static_cast<int>(cached_prefix.size()) * config_.block_size;
      const int num_remaining = seq->num_tokens() - num_hit_tokens;
      const int num_new = fit_grant(*seq, num_hit_tokens, std::min(num_remaining, budget));
      if (num_new <= 0 || (!config_.enable_chunked_prefill && num_new < num_remaining)) break;
      if (!kv_.admit(*seq, cached_prefix, num_new)) break;
      if (seq->num_cached_tokens < 0) seq->num_cached_tokens = seq->num_computed_tokens;
      move(*seq, SeqStatus::kRunning);
      grant(*seq, num_new, out);
      budget -= num_new;
      ++num_admitted;
    }
  }

  // Newcomers join the running queue in policy order.
  for (size_t i = 0; i < num_swapped_in; ++i) running_.insert(swapped_[i]);
  swapped_.erase_front(num_swapped_in);
  if (num_admitted > 0) {
    for (size_t i = 0; i < waiting_.size(); ++i) {
      if (waiting_[i]->status == SeqStatus::kRunning) running_.insert(waiting_[i]);
    }
    waiting_.erase_if([](const Sequence* s) { return s->status == SeqStatus::kRunning; });
  }

  fill_block_tables(out);
  if (trace_ptr_) out.events = trace_.take();
  step_in_flight_ = true;
  return out;
}

void Scheduler::fill_block_tables(SchedulerOutput& out) const {
  //   block_tables [S, max_num_blocks_per_seq]:
  //     s0: 7  2  9  -1 -1
  //     s1: 4  -1 -1 -1 -1     (-1 = kNullBlock padding)
  const size_t width = static_cast<size_t>(out.max_num_blocks_per_seq);
  out.block_tables.assign(scheduled_.size() * width, kNullBlock);
  for (size_t s = 0; s < scheduled_.size(); ++s) {
    const std::vector<BlockId>& table = scheduled_[s]->block_table;
    std::copy(table.begin(), table.end(), out.block_tables.begin() + static_cast<std::ptrdiff_t>(s * width));
  }
}

}  // namespace pagedcore
