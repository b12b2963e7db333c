// Scheduler::num_cached_prefix_tokens: the read-only probe the data-parallel router sends to every
// replica. It must agree with what an admission then hits, honour the cache key, and change nothing.
#include <vector>

#include "check.h"
#include "scheduler_fixtures.h"

using namespace pagedcore_test;

namespace {

// Runs a sequence to completion (fake tokens), leaving its full blocks cached in the free list.
void run_to_end(Scheduler& s, SeqId seq_id, const std::vector<TokenId>& prompt, StoppingParams p = max_tokens(2)) {
  s.add_sequence(seq_id, prompt, p);
  for (int i = 0; i < 50 && s.has_unfinished(); ++i) step(s);
  CHECK(!s.has_unfinished());
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(empty_cache_has_no_prefix) {
  Scheduler s(small_config(16));
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(10), CacheKey{}), 0);
  CHECK_EQ(s.num_cached_prefix_tokens({}, CacheKey{}), 0);
}

TEST(whole_blocks_of_a_computed_prompt_are_found_and_the_last_token_is_left) {
  Scheduler s(small_config(16));   // block_size 4
  run_to_end(s, 1, range_tokens(10));
  // 10 tokens: blocks [0,4) and [4,8) are full and computed.
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(10), CacheKey{}), 8);
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(12), CacheKey{}), 8);
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(9), CacheKey{}), 8);
  // 8 tokens: at most 7 may hit (the last one yields the logits row), so one block.
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(8), CacheKey{}), 4);
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(4), CacheKey{}), 0);
}

TEST(a_divergent_block_ends_the_prefix) {
  Scheduler s(small_config(16));
  run_to_end(s, 1, range_tokens(12));
  std::vector<TokenId> other = range_tokens(12);
  other[5] = 3;   // inside the second block
  CHECK_EQ(s.num_cached_prefix_tokens(other, CacheKey{}), 4);
  other[0] = 3;   // the first block: nothing after it can hit either (chained hashes)
  CHECK_EQ(s.num_cached_prefix_tokens(other, CacheKey{}), 0);
}

TEST(the_cache_key_separates_adapters_and_salts) {
  Scheduler s(small_config(16));
  StoppingParams p = max_tokens(2);
  p.cache_key.adapter_id = 3;
  run_to_end(s, 1, range_tokens(10), p);
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(10), CacheKey{}), 0);
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(10), CacheKey{3, 0}), 8);
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(10), CacheKey{0, 3}), 0);
}

TEST(the_probe_agrees_with_the_admission_that_follows) {
  Scheduler s(small_config(32));
  run_to_end(s, 1, range_tokens(14));
  const std::vector<TokenId> prompt = concat(range_tokens(9), range_tokens(7, 900));   // shares 2 blocks
  const int probed = s.num_cached_prefix_tokens(prompt, CacheKey{});
  CHECK_EQ(probed, 8);
  s.add_sequence(2, prompt, max_tokens(1));
  step(s);
  CHECK_EQ(s.find(2)->num_cached_tokens, probed);
}

TEST(the_probe_changes_nothing) {
  Scheduler s(small_config(16));
  run_to_end(s, 1, range_tokens(10));
  const SchedulerStats before = s.stats();
  const std::vector<BlockId> free_before = s.kv_cache().gpu_pool().free_block_ids();
  for (int i = 0; i < 3; ++i) s.num_cached_prefix_tokens(range_tokens(10), CacheKey{});
  const SchedulerStats after = s.stats();
  CHECK_EQ(after.prefix_query_tokens, before.prefix_query_tokens);
  CHECK_EQ(after.prefix_hit_tokens, before.prefix_hit_tokens);
  CHECK_EQ(after.num_free_blocks, before.num_free_blocks);
  CHECK_EQ(after.num_cached_free_blocks, before.num_cached_free_blocks);
  CHECK(s.kv_cache().gpu_pool().free_block_ids() == free_before);   // LRU order untouched
}

TEST(evicted_blocks_are_no_longer_found) {
  Scheduler s(small_config(4));    // 4 blocks of 4 tokens
  run_to_end(s, 1, range_tokens(10));
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(10), CacheKey{}), 8);
  // A prompt of other tokens needing every block evicts the cached ones.
  run_to_end(s, 2, range_tokens(13, 500), max_tokens(1));
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(10), CacheKey{}), 0);
}

TEST(prefix_caching_off_finds_nothing) {
  SchedulerConfig c = small_config(16);
  c.enable_prefix_caching = false;
  Scheduler s(c);
  run_to_end(s, 1, range_tokens(10));
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(10), CacheKey{}), 0);
}

TEST(blocks_of_a_running_sequence_count) {
  Scheduler s(small_config(16));
  s.add_sequence(1, range_tokens(10), max_tokens(20));
  step(s);   // the prompt is computed and its full blocks registered; the sequence keeps running
  CHECK(s.has_unfinished());
  CHECK_EQ(s.num_cached_prefix_tokens(range_tokens(10), CacheKey{}), 8);
}

int main() { return pagedcore_test::run_all(); }
