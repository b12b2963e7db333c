// Exact bookkeeping of the scheduler and KV cache manager with fake sampled tokens.
#include <algorithm>
#include <numeric>

#include "check.h"
#include "core/scheduler.h"
#include "scheduler_fixtures.h"

using namespace pagedcore;
using namespace pagedcore_test;

TEST(prefill_then_decode_arrays) {
  Scheduler s(small_config(16));
  s.add_sequence(1, range_tokens(6), max_tokens(3));
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{1}));
  CHECK_EQ(out.num_scheduled_tokens, (std::vector<int32_t>{6}));
  CHECK_EQ(out.positions, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  CHECK_EQ(out.slot_mapping, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));  // blocks 0, 1
  CHECK_EQ(out.query_start_loc, (std::vector<int32_t>{0, 6}));
  CHECK_EQ(out.seq_lens, (std::vector<int32_t>{6}));
  CHECK_EQ(out.block_tables, (std::vector<int32_t>{0, 1}));
  CHECK_EQ(out.logits_indices, (std::vector<int64_t>{5}));
  CHECK_EQ(out.num_prefill_tokens, 6);
  s.update({42});
  out = s.schedule();
  CHECK_EQ(out.input_ids, (std::vector<int64_t>{42}));
  CHECK_EQ(out.positions, (std::vector<int64_t>{6}));
  CHECK_EQ(out.slot_mapping, (std::vector<int64_t>{6}));
  CHECK_EQ(out.num_decode_tokens, 1);
  s.update({43});
  UpdateResult r;
  step(s, 44, &r);
  CHECK_EQ(r.finished_seq_ids, (std::vector<SeqId>{1}));
  CHECK_EQ(r.finish_reasons, (std::vector<int32_t>{static_cast<int32_t>(FinishReason::kLength)}));
  CHECK(!s.has_unfinished());
  CHECK_EQ(s.kv_cache().gpu_pool().num_free_blocks(), 16);
}

TEST(chunked_prefill_under_budget_decode_first) {
  Scheduler s(small_config(32, /*budget=*/8));
  s.add_sequence(1, range_tokens(3), max_tokens(10));
  step(s);                                      // seq 1 prefilled (3 tokens)
  s.add_sequence(2, range_tokens(20), max_tokens(2));
  SchedulerOutput out = step(s);
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{1, 2}));
  CHECK_EQ(out.num_scheduled_tokens, (std::vector<int32_t>{1, 7}));  // decode first, then 7 of 20
  CHECK_EQ(out.sample_seq_ids, (std::vector<SeqId>{1}));             // a partial chunk is not sampled
  out = step(s);
  CHECK_EQ(out.num_scheduled_tokens, (std::vector<int32_t>{1, 7}));
  out = step(s);
  CHECK_EQ(out.num_scheduled_tokens, (std::vector<int32_t>{1, 6}));
  CHECK_EQ(out.sample_seq_ids, (std::vector<SeqId>{1, 2}));
  CHECK_EQ(out.positions.back(), 19);
}

TEST(prefix_hit_skips_cached_blocks_and_shares_them) {
  Scheduler s(small_config(16));
  std::vector<TokenId> prompt = range_tokens(10);  // blocks of 4: two full + 2 tokens
  s.add_sequence(1, prompt, max_tokens(1));
  step(s);                                          // finishes; its full blocks stay cached
  CHECK_EQ(s.kv_cache().gpu_pool().num_cached_blocks(), 2);
  s.add_sequence(2, prompt, max_tokens(1));
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.num_computed_tokens, (std::vector<int32_t>{8}));
  CHECK_EQ(out.num_scheduled_tokens, (std::vector<int32_t>{2}));
  CHECK_EQ(s.find(2)->num_cached_tokens, 8);
  s.update({1});
  CHECK_EQ(s.stats().prefix_hit_tokens, 8);
  CHECK_EQ(s.stats().prefix_query_tokens, 20);
}

TEST(fully_cached_block_aligned_prompt_recomputes_last_block) {
  Scheduler s(small_config(16));
  std::vector<TokenId> prompt = range_tokens(8);
  s.add_sequence(1, prompt, max_tokens(1));
  step(s);
  s.add_sequence(2, prompt, max_tokens(1));
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.num_computed_tokens, (std::vector<int32_t>{4}));  // never the whole prompt
  CHECK_EQ(out.num_scheduled_tokens, (std::vector<int32_t>{4}));
  s.update({1});
}

TEST(different_cache_salt_never_hits) {
  Scheduler s(small_config(16));
  std::vector<TokenId> prompt = range_tokens(10);
  StoppingParams a = max_tokens(1), b = max_tokens(1);
  b.cache_key.cache_salt = 99;
  s.add_sequence(1, prompt, a);
  step(s);
  s.add_sequence(2, prompt, b);
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.num_computed_tokens, (std::vector<int32_t>{0}));
  s.update({1});
}

TEST(preempt_latest_by_recompute_and_resume) {
  SchedulerConfig c = small_config(4);
  Scheduler s(c);
  s.add_sequence(1, range_tokens(7), max_tokens(20));  // 2 blocks
  s.add_sequence(2, range_tokens(7, 500), max_tokens(20));  // 2 blocks
  step(s);  // both prefilled, cache full
  CHECK_EQ(s.kv_cache().gpu_pool().num_free_blocks(), 0);
  SchedulerOutput out = step(s);  // both at 8 tokens: position 7 still fits in block 2
  out = s.schedule();             // position 8 needs a third block each: seq 2 (latest) is preempted
  CHECK_EQ(out.preempted_seq_ids, (std::vector<SeqId>{2}));
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{1}));
  CHECK_EQ(s.waiting_ids(), (std::vector<SeqId>{2}));
  CHECK_EQ(s.find(2)->num_computed_tokens, 0);
  s.update({7});
}

TEST(preempt_by_swap_round_trip) {
  SchedulerConfig c = small_config(4);
  c.num_cpu_blocks = 8;
  c.preemption_mode = PreemptionMode::kSwap;
  Scheduler s(c);
  s.add_sequence(1, range_tokens(7), max_tokens(6));
  s.add_sequence(2, range_tokens(7, 500), max_tokens(20));
  step(s);
  step(s);
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.preempted_seq_ids, (std::vector<SeqId>{2}));
  CHECK_EQ(out.blocks_to_swap_out.size(), size_t{4});  // two (gpu, cpu) pairs
  CHECK_EQ(s.swapped_ids(), (std::vector<SeqId>{2}));
  CHECK_EQ(s.find(2)->num_computed_tokens, 8);          // KV kept in CPU memory
  s.update({7});
  UpdateResult r;
  int guard = 0;
  while (s.find(1) && !s.find(1)->finished() && guard++ < 20) step(s, 7, &r);
  out = s.schedule();                                   // room again: seq 2 swaps back in
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{2}));
  CHECK_EQ(out.blocks_to_swap_in.size(), size_t{4});
  CHECK_EQ(out.num_computed_tokens, (std::vector<int32_t>{8}));
  CHECK_EQ(s.kv_cache().cpu_pool().num_free_blocks(), 8);
  s.update({7});
}

TEST(swap_falls_back_to_recompute_without_cpu_space) {
  SchedulerConfig c = small_config(4);
  c.num_cpu_blocks = 1;
  c.preemption_mode = PreemptionMode::kSwap;
  Scheduler s(c);
  s.add_sequence(1, range_tokens(7), max_tokens(20));
  s.add_sequence(2, range_tokens(7, 500), max_tokens(20));
  step(s);
  step(s);
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.preempted_seq_ids, (std::vector<SeqId>{2}));
  CHECK(out.blocks_to_swap_out.empty());
  CHECK_EQ(s.waiting_ids(), (std::vector<SeqId>{2}));
  s.update({7});
}

TEST(fork_shares_blocks_and_copies_on_write) {
  Scheduler s(small_config(16));
  s.add_sequence(1, range_tokens(6), max_tokens(5));
  step(s, 50);  // 7 tokens, blocks {0, 1}; block 1 is partial
  s.fork_sequence(1, 2, 60);
  CHECK_EQ(s.kv_cache().gpu_pool().ref_count(0), 2);
  CHECK_EQ(s.kv_cache().gpu_pool().ref_count(1), 2);
  CHECK_EQ(s.find(2)->token_ids.back(), 60);
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{1, 2}));
  // Seq 1 writes position 6 into shared block 1: copied to block 2; seq 2 then owns block 1 alone.
  CHECK_EQ(out.blocks_to_copy, (std::vector<int32_t>{1, 2}));
  CHECK_EQ(out.block_tables, (std::vector<int32_t>{0, 2, 0, 1}));
  CHECK_EQ(s.kv_cache().gpu_pool().ref_count(1), 1);
  CHECK_EQ(s.kv_cache().gpu_pool().ref_count(0), 2);  // full block stays shared
  s.update({51, 61});
}

TEST(stop_token_min_tokens_and_ignore_eos) {
  Scheduler s(small_config(16));
  StoppingParams p = max_tokens(10);
  p.eos_token_ids = {2};
  p.min_tokens = 2;
  s.add_sequence(1, range_tokens(3), p);
  UpdateResult r;
  step(s, 2, &r);                   // EOS as first output: below min_tokens, ignored
  CHECK(r.finished_seq_ids.empty());
  step(s, 2, &r);
  CHECK_EQ(r.finished_seq_ids, (std::vector<SeqId>{1}));
  CHECK_EQ(r.stop_token_ids, (std::vector<TokenId>{2}));
  StoppingParams q = max_tokens(3);
  q.eos_token_ids = {2};
  q.ignore_eos = true;
  q.stop_token_ids = {9};
  s.add_sequence(2, range_tokens(3), q);
  step(s, 2, &r);
  CHECK(r.finished_seq_ids.empty());  // EOS ignored
  step(s, 9, &r);
  CHECK_EQ(r.finished_seq_ids, (std::vector<SeqId>{2}));  // stop ids still apply
}

TEST(rejects_what_can_never_run) {
  SchedulerConfig c = small_config(4);
  c.max_model_len = 64;
  Scheduler s(c);
  CHECK_THROWS(s.add_sequence(1, {}, max_tokens(1)));
  CHECK_THROWS(s.add_sequence(1, range_tokens(65), max_tokens(1)));   // > max_model_len
  CHECK_THROWS(s.add_sequence(1, range_tokens(17), max_tokens(1)));   // > whole cache (16 tokens)
  s.add_sequence(1, range_tokens(4), max_tokens(1));
  CHECK_THROWS(s.add_sequence(1, range_tokens(4), max_tokens(1)));    // duplicate id
  CHECK_THROWS(s.update({1}));                                        // update before schedule
  s.schedule();
  CHECK_THROWS(s.schedule());                                         // schedule twice
  CHECK_THROWS(s.update({1, 2}));                                     // wrong count
  s.update({1});
}

TEST(sequence_longer_than_cache_stops_with_length) {
  SchedulerConfig c = small_config(2);  // 8 tokens of cache
  Scheduler s(c);
  s.add_sequence(1, range_tokens(6), max_tokens(100));
  UpdateResult r;
  for (int i = 0; i < 3 && r.finished_seq_ids.empty(); ++i) step(s, 7, &r);
  CHECK_EQ(r.finished_seq_ids, (std::vector<SeqId>{1}));
  CHECK_EQ(r.finish_reasons, (std::vector<int32_t>{static_cast<int32_t>(FinishReason::kLength)}));
}

TEST(abort_frees_blocks_in_every_state) {
  Scheduler s(small_config(8));
  s.add_sequence(1, range_tokens(5), max_tokens(10));
  s.add_sequence(2, range_tokens(5, 300), max_tokens(10));
  step(s);
  CHECK(s.abort_sequence(1));
  CHECK(!s.abort_sequence(1));
  CHECK(s.abort_sequence(2));
  CHECK_EQ(s.kv_cache().gpu_pool().num_free_blocks(), 8);
  s.add_sequence(3, range_tokens(5), max_tokens(10));
  CHECK(s.abort_sequence(3));  // while waiting
  CHECK(!s.has_unfinished());
}

TEST(priority_policy_orders_and_preempts_lowest) {
  SchedulerConfig c = small_config(4);
  c.policy = SchedulingPolicy::kPriority;
  Scheduler s(c);
  StoppingParams low = max_tokens(20), high = max_tokens(20);
  low.priority = 5;
  high.priority = 0;
  s.add_sequence(1, range_tokens(7), low);
  s.add_sequence(2, range_tokens(7, 500), high);
  SchedulerOutput out = step(s);
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{2, 1}));  // high priority first despite arriving later
  step(s);
  out = s.schedule();
  CHECK_EQ(out.preempted_seq_ids, (std::vector<SeqId>{1}));
  s.update({7});
}

TEST(tail_blocks_are_evicted_first) {
  Scheduler s(small_config(4));
  s.add_sequence(1, range_tokens(12), max_tokens(1));  // blocks 0,1,2 (+3 for the sampled token? no: 12 tokens = 3 blocks)
  step(s);
  // Freed tail first: the free list ends with the first block, so it is evicted last.
  std::vector<BlockId> free_ids = s.kv_cache().gpu_pool().free_block_ids();
  CHECK_EQ(free_ids, (std::vector<BlockId>{3, 2, 1, 0}));
}


int main() { return pagedcore_test::run_all(); }
