// Draft tokens (speculative decoding) in the scheduler: k + 1 logits rows per sampled sequence,
// accept j of them, roll back the rest (tokens, KV, block-table tail, block hashes).
#include <algorithm>
#include <numeric>

#include "check.h"
#include "core/scheduler.h"
#include "scheduler_fixtures.h"

using namespace pagedcore;
using namespace pagedcore_test;

namespace {

// Seq 1: a 6-token prompt (100..105) prefilled and sampled 50: 7 tokens, 6 computed, blocks {0, 1}.
Scheduler& prefilled(Scheduler& s, StoppingParams p = max_tokens(20)) {
  s.add_sequence(1, range_tokens(6), p);
  step(s, 50);
  return s;
}

std::vector<TokenId> tail(const Sequence* seq, int n) {
  return std::vector<TokenId>(seq->token_ids.end() - n, seq->token_ids.end());
}

}  // namespace

TEST(drafts_get_k_plus_one_logits_rows_and_accepting_all_keeps_every_block) {
  Scheduler s(small_config(16));
  prefilled(s);
  s.append_tokens(1, {60, 61, 62}, /*draft=*/true);
  CHECK_EQ(s.find(1)->num_draft_tokens, 3);
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.num_scheduled_tokens, (std::vector<int32_t>{4}));   // 50 and three drafts
  CHECK_EQ(out.input_ids, (std::vector<int64_t>{50, 60, 61, 62}));
  CHECK_EQ(out.slot_mapping, (std::vector<int64_t>{6, 7, 8, 9}));  // block 2 joins for positions 8, 9
  CHECK_EQ(out.block_tables, (std::vector<int32_t>{0, 1, 2}));
  CHECK_EQ(out.num_logits_rows, (std::vector<int32_t>{4}));
  CHECK_EQ(out.logits_start_loc, (std::vector<int32_t>{0, 4}));
  CHECK_EQ(out.logits_indices, (std::vector<int64_t>{0, 1, 2, 3}));
  CHECK_EQ(out.sample_seq_ids, (std::vector<SeqId>{1}));
  CHECK_EQ(out.num_draft_tokens, 3);
  CHECK_EQ(out.num_decode_tokens, 0);
  CHECK_EQ(out.num_prefill_tokens, 4);
  UpdateResult r = s.update_accepted({60, 61, 62, 63}, {4});      // every draft plus the bonus token
  CHECK(r.finished_seq_ids.empty());
  const Sequence* seq = s.find(1);
  CHECK_EQ(tail(seq, 5), (std::vector<TokenId>{50, 60, 61, 62, 63}));
  CHECK_EQ(seq->num_draft_tokens, 0);
  CHECK_EQ(seq->num_computed_tokens, 10);
  CHECK_EQ(seq->block_table, (std::vector<BlockId>{0, 1, 2}));
  const BlockPool& pool = s.kv_cache().gpu_pool();
  CHECK(pool.block_has_hash(0));
  CHECK(pool.block_has_hash(1));                                   // [104 105 50 60]: accepted, hashed
  CHECK(!pool.block_has_hash(2));                                  // not full
  CHECK_EQ(pool.num_cached_blocks(), 2);
  out = s.schedule();                                              // plain decode again
  CHECK_EQ(out.positions, (std::vector<int64_t>{10}));
  CHECK_EQ(out.num_logits_rows, (std::vector<int32_t>{1}));
  s.update({64});
}

TEST(rejected_drafts_roll_back_tokens_kv_block_tail_and_hashes) {
  Scheduler s(small_config(16));
  prefilled(s);
  s.append_tokens(1, {60, 61, 62, 63, 64, 65, 66, 67, 68}, /*draft=*/true);  // 16 tokens: 4 blocks
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.block_tables, (std::vector<int32_t>{0, 1, 2, 3}));
  CHECK_EQ(out.num_logits_rows, (std::vector<int32_t>{10}));
  CHECK_EQ(out.logits_indices.front(), 0);
  CHECK_EQ(out.logits_indices.back(), 9);
  const BlockPool& pool = s.kv_cache().gpu_pool();
  CHECK_EQ(pool.free_block_ids(), range_tokens(12, 4));            // 4..15
  // Keep d1 = 60; the target says 70 where the draft said 61; the rest is rejected.
  s.update_accepted({60, 70}, {2});
  const Sequence* seq = s.find(1);
  CHECK_EQ(seq->num_tokens(), 9);
  CHECK_EQ(tail(seq, 3), (std::vector<TokenId>{50, 60, 70}));
  CHECK_EQ(seq->num_computed_tokens, 8);                           // 50 and 60 keep their KV; 70 has none
  CHECK_EQ(seq->block_table, (std::vector<BlockId>{0, 1, 2}));     // block 3 held only rejected drafts
  CHECK_EQ(pool.ref_count(3), 0);
  CHECK(pool.is_free(3));
  std::vector<BlockId> free_ids = range_tokens(12, 4);
  free_ids.push_back(3);
  CHECK_EQ(pool.free_block_ids(), free_ids);                       // freed to the tail of the free list
  CHECK_EQ(pool.num_free_blocks(), 13);
  CHECK(pool.block_has_hash(1));                                   // [104 105 50 60]: all accepted
  CHECK(!pool.block_has_hash(2));                                  // held rejected 61..64
  CHECK(!pool.block_has_hash(3));
  CHECK_EQ(pool.num_cached_blocks(), 2);
  // The next step writes 70 into the slot the rejected draft 61 had.
  out = s.schedule();
  CHECK_EQ(out.input_ids, (std::vector<int64_t>{70}));
  CHECK_EQ(out.positions, (std::vector<int64_t>{8}));
  CHECK_EQ(out.slot_mapping, (std::vector<int64_t>{8}));
  CHECK_EQ(out.num_decode_tokens, 1);
  s.update({71});
  step(s, 72);
  step(s, 73);
  step(s, 74);                                                     // block 2 = [70 71 72 73], computed
  CHECK(pool.block_has_hash(2));
  CHECK_EQ(pool.num_cached_blocks(), 3);
  // A prompt with the accepted tokens hits all three blocks; one with the rejected drafts only two.
  std::vector<TokenId> accepted = range_tokens(6);
  for (TokenId t : {50, 60, 70, 71, 72, 73, 999}) accepted.push_back(t);
  std::vector<TokenId> rejected = range_tokens(6);
  for (TokenId t : {50, 60, 61, 62, 63, 64, 999}) rejected.push_back(t);
  s.add_sequence(2, accepted, max_tokens(1));
  s.add_sequence(3, rejected, max_tokens(1));
  out = s.schedule();
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{1, 2, 3}));
  CHECK_EQ(out.num_computed_tokens, (std::vector<int32_t>{12, 12, 8}));
  s.update({1, 1, 1});
}

TEST(accepting_nothing_recomputes_the_last_token) {
  Scheduler s(small_config(16));
  prefilled(s);
  s.append_tokens(1, {60, 61, 62, 63, 64, 65}, /*draft=*/true);    // 13 tokens: blocks 0..3
  s.schedule();
  s.update_accepted({}, {0});
  const Sequence* seq = s.find(1);
  CHECK_EQ(seq->num_tokens(), 7);
  CHECK_EQ(seq->num_computed_tokens, 6);
  CHECK_EQ(seq->block_table, (std::vector<BlockId>{0, 1}));
  CHECK_EQ(s.kv_cache().gpu_pool().free_block_ids(), (std::vector<BlockId>{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 3, 2}));
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.positions, (std::vector<int64_t>{6}));
  CHECK_EQ(out.input_ids, (std::vector<int64_t>{50}));
  CHECK_EQ(out.logits_indices, (std::vector<int64_t>{0}));
  s.update({51});
  CHECK_EQ(tail(s.find(1), 2), (std::vector<TokenId>{50, 51}));
}

TEST(stop_at_a_middle_accepted_token_drops_the_rest) {
  Scheduler s(small_config(16));
  StoppingParams p = max_tokens(20);
  p.eos_token_ids = {2};
  prefilled(s, p);
  s.append_tokens(1, {60, 2, 62}, /*draft=*/true);
  s.schedule();
  UpdateResult r = s.update_accepted({60, 2, 62, 63}, {4});
  CHECK_EQ(r.finished_seq_ids, (std::vector<SeqId>{1}));
  CHECK_EQ(r.finish_reasons, (std::vector<int32_t>{static_cast<int32_t>(FinishReason::kStop)}));
  CHECK_EQ(r.stop_token_ids, (std::vector<TokenId>{2}));
  const Sequence* seq = s.find(1);
  CHECK_EQ(tail(seq, 3), (std::vector<TokenId>{50, 60, 2}));      // 62 and 63 dropped
  CHECK_EQ(seq->num_output_tokens(), 3);
  const BlockPool& pool = s.kv_cache().gpu_pool();
  CHECK_EQ(pool.num_free_blocks(), 16);
  CHECK(pool.block_has_hash(1));                                   // [104 105 50 60] registered before the free
  CHECK(!pool.block_has_hash(2));
  CHECK_EQ(pool.num_cached_blocks(), 2);
}

TEST(max_tokens_min_tokens_and_max_model_len_checked_at_every_accepted_token) {
  {  // max_tokens = 3: 50 is output 1, the window reaches output 3 at its second token
    Scheduler s(small_config(16));
    prefilled(s, max_tokens(3));
    s.append_tokens(1, {60, 61, 62, 63}, true);
    s.schedule();
    UpdateResult r = s.update_accepted({60, 61, 62, 63, 64}, {5});
    CHECK_EQ(r.finish_reasons, (std::vector<int32_t>{static_cast<int32_t>(FinishReason::kLength)}));
    CHECK_EQ(tail(s.find(1), 3), (std::vector<TokenId>{50, 60, 61}));
    CHECK_EQ(s.find(1)->num_output_tokens(), 3);
  }
  {  // min_tokens = 3: EOS as outputs 2 and 3; the first is ignored, the second stops
    Scheduler s(small_config(16));
    StoppingParams p = max_tokens(20);
    p.eos_token_ids = {2};
    p.min_tokens = 3;
    prefilled(s, p);
    s.append_tokens(1, {2, 2, 2}, true);
    s.schedule();
    UpdateResult r = s.update_accepted({2, 2, 2, 2}, {4});
    CHECK_EQ(r.stop_token_ids, (std::vector<TokenId>{2}));
    CHECK_EQ(s.find(1)->num_output_tokens(), 3);
  }
  {  // max_model_len = 12: the bonus token past it is dropped
    SchedulerConfig c = small_config(16);
    c.max_model_len = 12;
    Scheduler s(c);
    prefilled(s);
    CHECK_THROWS(s.append_tokens(1, range_tokens(6, 60), true));  // 13 > 12 tokens
    s.append_tokens(1, range_tokens(5, 60), true);
    s.schedule();
    UpdateResult r = s.update_accepted({60, 61, 62, 63, 64, 65}, {6});
    CHECK_EQ(r.finish_reasons, (std::vector<int32_t>{static_cast<int32_t>(FinishReason::kLength)}));
    CHECK_EQ(s.find(1)->num_tokens(), 12);
    CHECK_EQ(s.find(1)->token_ids.back(), 64);
  }
}

TEST(update_accepted_rejects_bad_counts_and_leaves_the_step_intact) {
  Scheduler s(small_config(16));
  prefilled(s);
  s.add_sequence(2, range_tokens(3, 300), max_tokens(20));
  s.append_tokens(1, {60, 61}, true);
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.sample_seq_ids, (std::vector<SeqId>{1, 2}));
  CHECK_EQ(out.num_logits_rows, (std::vector<int32_t>{3, 1}));
  CHECK_EQ(out.logits_start_loc, (std::vector<int32_t>{0, 3, 4}));
  CHECK_EQ(out.logits_indices, (std::vector<int64_t>{0, 1, 2, 5}));  // seq 2's 3-token prompt ends at row 5
  CHECK_THROWS(s.update_accepted({60}, {1}));                      // one count for two samples
  CHECK_THROWS(s.update_accepted({60, 61, 62, 63, 7}, {4, 1}));    // 4 > 3 rows
  CHECK_THROWS(s.update_accepted({60, 7}, {1, 2}));                // 2 > 1 row
  CHECK_THROWS(s.update_accepted({60, 61, 7}, {1, 1}));            // sums to 2, three tokens given
  CHECK_THROWS(s.update_accepted({60, -1}, {1, 1}));               // not a token id
  CHECK_THROWS(s.update({60, 7}, {SampleFork{1, 9, 5}}));          // forks of a verifying parent
  CHECK(s.step_in_flight());
  CHECK_EQ(s.find(1)->num_tokens(), 9);
  s.update_accepted({60, 61, 80, 7}, {3, 1});
  CHECK_EQ(tail(s.find(1), 4), (std::vector<TokenId>{50, 60, 61, 80}));
  CHECK_EQ(s.find(2)->token_ids.back(), 7);
}

TEST(one_token_update_with_drafts_accepts_the_first_row_only) {
  Scheduler s(small_config(16));
  prefilled(s);
  s.append_tokens(1, {60, 61}, true);
  s.schedule();
  s.update({60});                                                  // the k = 0 form: one token per sample
  CHECK_EQ(tail(s.find(1), 2), (std::vector<TokenId>{50, 60}));
  CHECK_EQ(s.find(1)->num_computed_tokens, 7);
}

TEST(a_window_is_never_split_by_the_budget) {
  Scheduler s(small_config(32, /*budget=*/5));
  s.add_sequence(1, range_tokens(2), max_tokens(3));
  s.add_sequence(2, range_tokens(2, 300), max_tokens(20));
  step(s);                                                         // both prefilled: 3 tokens, 2 computed
  CHECK_THROWS(s.append_tokens(2, {1, 2, 3, 4, 5}, true));         // 6-token window > budget 5
  s.append_tokens(2, {60, 61, 62, 63}, true);                      // 5-token window
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{1}));                  // 1 decode leaves 4 < 5: seq 2 waits
  s.update({7});
  out = step(s);                                                   // seq 1 ends with this token
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{1}));
  out = s.schedule();
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{2}));
  CHECK_EQ(out.num_scheduled_tokens, (std::vector<int32_t>{5}));
  CHECK_EQ(out.num_logits_rows, (std::vector<int32_t>{5}));
  s.update_accepted({60, 9}, {2});
}

TEST(prefix_hit_stops_before_the_verify_window) {
  Scheduler s(small_config(16));
  s.add_sequence(1, range_tokens(12), max_tokens(1));
  step(s);                                                         // 3 full blocks cached
  CHECK_EQ(s.kv_cache().gpu_pool().num_cached_blocks(), 3);
  s.add_sequence(2, range_tokens(12), max_tokens(5));
  s.append_tokens(2, {1, 2, 3, 4}, true);                          // window = positions 11..15
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.num_computed_tokens, (std::vector<int32_t>{8}));    // not 12: position 11 yields a row
  CHECK_EQ(out.num_logits_rows, (std::vector<int32_t>{5}));
  CHECK_EQ(out.logits_indices, (std::vector<int64_t>{3, 4, 5, 6, 7}));
  s.update_accepted({1, 2, 3, 4, 5}, {5});
}

TEST(remove_tail_tokens_is_the_inverse_of_append_tokens) {
  Scheduler s(small_config(16));
  prefilled(s);
  s.append_tokens(1, {60, 61}, true);
  CHECK_THROWS(s.append_tokens(1, {80}));                          // known tokens after drafts
  s.remove_tail_tokens(1, 1);
  CHECK_EQ(s.find(1)->num_draft_tokens, 1);
  s.remove_tail_tokens(1, 1);
  CHECK_EQ(s.find(1)->num_draft_tokens, 0);
  CHECK_EQ(s.find(1)->num_tokens(), 7);
  CHECK_THROWS(s.remove_tail_tokens(1, 1));                        // 50 is the token the next step computes
  CHECK_THROWS(s.remove_tail_tokens(1, -1));
  s.append_tokens(1, {80, 81});                                    // known tokens
  s.remove_tail_tokens(1, 2);
  CHECK_EQ(tail(s.find(1), 1), (std::vector<TokenId>{50}));
  s.add_sequence(2, range_tokens(5, 300), max_tokens(20));
  CHECK_THROWS(s.remove_tail_tokens(2, 1));                        // never into the prompt
  // Blocks taken for a step that was cancelled go back, tail first.
  s.append_tokens(1, range_tokens(9, 60), true);                   // 16 tokens: blocks 2, 3 (seq 2 takes 4, 5)
  s.schedule();
  CHECK_THROWS(s.remove_tail_tokens(1, 9));                        // not while a step is in flight
  s.cancel_step();
  CHECK_EQ(s.find(1)->block_table, (std::vector<BlockId>{0, 1, 2, 3}));
  s.remove_tail_tokens(1, 9);
  CHECK_EQ(s.find(1)->block_table, (std::vector<BlockId>{0, 1}));
  const std::vector<BlockId> free_ids = s.kv_cache().gpu_pool().free_block_ids();
  CHECK_EQ(std::vector<BlockId>(free_ids.end() - 2, free_ids.end()), (std::vector<BlockId>{3, 2}));
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.num_logits_rows, (std::vector<int32_t>{1, 1}));
  s.update({7, 7});
}

TEST(fork_mid_generation_shares_drafts_and_each_child_accepts_its_own) {
  Scheduler s(small_config(16));
  prefilled(s);
  s.append_tokens(1, {60, 61, 62}, true);
  CHECK_THROWS(s.fork_sequence(1, 3, 77));                         // a draft cannot be the new last token
  CHECK(s.find(3) == nullptr);                                     // and nothing was created
  s.fork_sequence(1, 2, -1);
  const BlockPool& pool = s.kv_cache().gpu_pool();
  CHECK_EQ(pool.ref_count(0), 2);
  CHECK_EQ(pool.ref_count(1), 2);
  CHECK_EQ(s.find(2)->num_draft_tokens, 3);
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{1, 2}));
  CHECK_EQ(out.blocks_to_copy, (std::vector<int32_t>{1, 2}));      // seq 1 writes position 6 of shared block 1
  CHECK_EQ(out.block_tables, (std::vector<int32_t>{0, 2, 3, 0, 1, 4}));
  CHECK_EQ(out.logits_indices, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  s.update_accepted({60, 61, 62, 63, 70}, {4, 1});
  CHECK_EQ(s.find(1)->num_computed_tokens, 10);
  CHECK_EQ(s.find(1)->block_table, (std::vector<BlockId>{0, 2, 3}));
  CHECK_EQ(s.find(2)->num_computed_tokens, 7);
  CHECK_EQ(tail(s.find(2), 2), (std::vector<TokenId>{50, 70}));
  CHECK_EQ(s.find(2)->block_table, (std::vector<BlockId>{0, 1}));  // block 4 held only drafts
  CHECK_EQ(pool.ref_count(4), 0);
  CHECK_EQ(pool.ref_count(0), 2);
  CHECK(pool.block_has_hash(2));                                   // seq 1's copy [104 105 50 60]: accepted
  CHECK(!pool.block_has_hash(1));                                  // seq 2's [104 105 50 d1=60]: 60 rejected
}

int main() { return pagedcore_test::run_all(); }
