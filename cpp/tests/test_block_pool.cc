// Exact bookkeeping of the block pool: ref counts, LRU free-list order, prefix-cache hits, eviction.
#include "check.h"
#include "core/block_hash.h"
#include "core/block_pool.h"

using namespace pagedcore;

TEST(fresh_pool_hands_out_ids_in_order) {
  BlockPool pool(4, 16, false);
  CHECK_EQ(pool.num_free_blocks(), 4);
  CHECK_EQ(pool.allocate(1), 0);
  CHECK_EQ(pool.allocate(1), 1);
  CHECK_EQ(pool.num_free_blocks(), 2);
  CHECK_EQ(pool.ref_count(0), 1);
  CHECK_EQ(pool.free_block_ids(), (std::vector<BlockId>{2, 3}));
}

TEST(release_appends_to_tail_lru_order) {
  BlockPool pool(4, 16, false);
  for (int i = 0; i < 4; ++i) pool.allocate(1);
  pool.release(2, 1);
  pool.release(0, 1);
  pool.release(3, 1);
  CHECK_EQ(pool.free_block_ids(), (std::vector<BlockId>{2, 0, 3}));
  CHECK_EQ(pool.allocate(2), 2);  // least recently freed first
  CHECK_EQ(pool.free_block_ids(), (std::vector<BlockId>{0, 3}));
}

TEST(exhausted_pool_returns_null) {
  BlockPool pool(1, 16, false);
  CHECK_EQ(pool.allocate(1), 0);
  CHECK_EQ(pool.allocate(1), kNullBlock);
}

TEST(shared_block_freed_on_last_release) {
  BlockPool pool(2, 16, false);
  BlockId b = pool.allocate(1);
  pool.retain(b);
  CHECK_EQ(pool.ref_count(b), 2);
  pool.release(b, 1);
  CHECK(!pool.is_free(b));
  pool.release(b, 2);
  CHECK(pool.is_free(b));
  CHECK_THROWS(pool.release(b, 2));  // double free is an error, not silent corruption
}

TEST(prefix_hit_on_free_block_unlinks_from_middle) {
  BlockPool pool(3, 4, true);
  const TokenId tokens[4] = {5, 6, 7, 8};
  const uint64_t h = hash_block_tokens(kRootBlockHash, tokens, 4, CacheKey{});
  BlockId a = pool.allocate(1), b = pool.allocate(1), c = pool.allocate(1);
  CHECK(pool.register_block(b, h, kRootBlockHash, tokens, CacheKey{}));
  pool.release(a, 1);
  pool.release(b, 1);
  pool.release(c, 1);
  CHECK_EQ(pool.free_block_ids(), (std::vector<BlockId>{a, b, c}));
  CHECK_EQ(pool.num_cached_free_blocks(), 1);
  CHECK_EQ(pool.lookup(h, kRootBlockHash, tokens, CacheKey{}), b);
  pool.retain(b);
  CHECK_EQ(pool.free_block_ids(), (std::vector<BlockId>{a, c}));
  CHECK_EQ(pool.num_cached_free_blocks(), 0);
  CHECK_EQ(pool.ref_count(b), 1);
}

TEST(lookup_confirms_tokens_and_cache_key) {
  BlockPool pool(2, 4, true);
  const TokenId tokens[4] = {1, 2, 3, 4};
  const TokenId other[4] = {1, 2, 3, 9};
  const CacheKey key{/*adapter_id=*/0, /*cache_salt=*/7};
  const uint64_t h = hash_block_tokens(kRootBlockHash, tokens, 4, key);
  BlockId b = pool.allocate(1);
  CHECK(pool.register_block(b, h, kRootBlockHash, tokens, key));
  CHECK_EQ(pool.lookup(h, kRootBlockHash, tokens, key), b);
  CHECK_EQ(pool.lookup(h, kRootBlockHash, other, key), kNullBlock);                 // forged collision
  CHECK_EQ(pool.lookup(h, kRootBlockHash, tokens, CacheKey{0, 8}), kNullBlock);     // other salt
  CHECK_EQ(pool.lookup(h, kRootBlockHash, tokens, CacheKey{7, 0}), kNullBlock);     // adapter 7 is not salt 7
  CHECK_EQ(pool.lookup(h, 12345, tokens, key), kNullBlock);                         // other parent
}

TEST(cache_key_parts_are_hashed_separately) {
  const TokenId tokens[4] = {1, 2, 3, 4};
  const uint64_t base = hash_block_tokens(kRootBlockHash, tokens, 4, CacheKey{});
  const uint64_t adapter = hash_block_tokens(kRootBlockHash, tokens, 4, CacheKey{3, 0});
  const uint64_t salt = hash_block_tokens(kRootBlockHash, tokens, 4, CacheKey{0, 3});
  const uint64_t swapped = hash_block_tokens(kRootBlockHash, tokens, 4, CacheKey{5, 3});
  const uint64_t both = hash_block_tokens(kRootBlockHash, tokens, 4, CacheKey{3, 5});
  CHECK(base != adapter);
  CHECK(base != salt);
  CHECK(adapter != salt);   // the same number in the other slot is another key
  CHECK(swapped != both);
}

TEST(eviction_is_lazy_and_happens_on_reuse) {
  BlockPool pool(1, 4, true);
  const TokenId tokens[4] = {1, 2, 3, 4};
  const uint64_t h = hash_block_tokens(kRootBlockHash, tokens, 4, CacheKey{});
  BlockId b = pool.allocate(1);
  pool.register_block(b, h, kRootBlockHash, tokens, CacheKey{});
  pool.release(b, 1);
  CHECK_EQ(pool.num_cached_blocks(), 1);  // still findable while free
  CHECK_EQ(pool.lookup(h, kRootBlockHash, tokens, CacheKey{}), b);
  CHECK_EQ(pool.allocate(2), b);          // reuse evicts
  CHECK_EQ(pool.num_cached_blocks(), 0);
  CHECK_EQ(pool.num_evictions(), 1);
  CHECK_EQ(pool.lookup(h, kRootBlockHash, tokens, CacheKey{}), kNullBlock);
}

TEST(duplicate_hash_is_not_registered_twice) {
  BlockPool pool(2, 4, true);
  const TokenId tokens[4] = {1, 2, 3, 4};
  const uint64_t h = hash_block_tokens(kRootBlockHash, tokens, 4, CacheKey{});
  BlockId a = pool.allocate(1), b = pool.allocate(2);
  CHECK(pool.register_block(a, h, kRootBlockHash, tokens, CacheKey{}));
  CHECK(!pool.register_block(b, h, kRootBlockHash, tokens, CacheKey{}));
  CHECK(!pool.block_has_hash(b));
}

TEST(bad_ids_throw) {
  BlockPool pool(2, 4, false);
  CHECK_THROWS(pool.retain(2));
  CHECK_THROWS(pool.release(-1, 0));
  CHECK_THROWS(BlockPool(2, 0, false));
}

int main() { return pagedcore_test::run_all(); }
