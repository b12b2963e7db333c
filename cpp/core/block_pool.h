// A pool of fixed-size KV blocks: ref counts, an O(1) LRU free list and the prefix-cache index.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/cache_key.h"
#include "core/common.h"
#include "core/step_trace.h"

namespace pagedcore {

// Free list (intrusive, doubly linked through the blocks themselves):
//
//   head_ -> [b7] <-> [b2] <-> [b9] <-> ... <-> [b4] <- tail_
//            least recently freed            most recently freed
//
// allocate() pops the head; release() of a last reference appends to the tail; a prefix-cache
// hit on a free block unlinks it from the middle. All three are O(1).
// A free block may still hold a cached prefix (has_hash); the hash entry is dropped lazily, only
// when allocate() hands the block out for new content (an eviction).
class BlockPool {
 public:
  BlockPool(int num_blocks, int block_size, bool enable_prefix_caching);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  bool prefix_caching() const { return enable_prefix_caching_; }
  int num_free_blocks() const { return num_free_; }
  int num_used_blocks() const { return num_blocks() - num_free_; }
  // Free blocks that still hold a cached prefix (reusable by a hit, evictable by allocate()).
  int num_cached_free_blocks() const { return num_cached_free_; }
  // Blocks reachable through the prefix-cache index (used or free).
  int num_cached_blocks() const { return static_cast<int>(hash_to_block_.size()); }
  int64_t num_evictions() const { return num_evictions_; }

  // Takes the least recently freed block, evicting its cached hash; kNullBlock when empty.
  BlockId allocate(SeqId owner);
  // Adds a reference; a block with no references leaves the free list (a prefix-cache hit).
  void retain(BlockId block_id);
  // Drops a reference; the last one puts the block at the tail of the free list.
  void release(BlockId block_id, SeqId owner);

  int ref_count(BlockId block_id) const { return blocks_.at(check(block_id)).ref_count; }
  bool is_free(BlockId block_id) const { return blocks_.at(check(block_id)).in_free_list; }

  // Prefix cache. lookup() returns the block holding exactly these tokens after this parent, or
  // kNullBlock; it changes nothing (retain() the result to use it).
  BlockId lookup(uint64_t hash, uint64_t parent_hash, const TokenId* tokens, const CacheKey& cache_key) const;
  // Indexes a full, computed block under its hash. False (and nothing changes) when prefix caching
  // is off or another block already holds that hash.
  bool register_block(BlockId block_id, uint64_t hash, uint64_t parent_hash, const TokenId* tokens,
                      const CacheKey& cache_key);
  bool block_has_hash(BlockId block_id) const { return blocks_.at(check(block_id)).has_hash; }

  // Free block ids from head (next to be allocated) to tail. O(num_free); for tests and traces.
  std::vector<BlockId> free_block_ids() const;

  void set_trace(StepTrace* trace) { trace_ = trace; }

 private:
  struct Block {
    int32_t ref_count = 0;
    BlockId prev = kNullBlock;  // free-list neighbours; meaningful only while in_free_list
    BlockId next = kNullBlock;
    bool in_free_list = false;
    bool has_hash = false;
    uint64_t hash = 0;
    uint64_t parent_hash = 0;  // stored to confirm a hit (with the tokens and cache_key)
    CacheKey cache_key;
  };

  BlockId check(BlockId block_id) const;
  void push_back_free(BlockId block_id);
  void unlink_free(BlockId block_id);
  void drop_hash(BlockId block_id);

  int block_size_;
  bool enable_prefix_caching_;
  std::vector<Block> blocks_;                   // [num_blocks]
  std::vector<TokenId> block_tokens_;           // [num_blocks * block_size], tokens of hashed blocks
  std::unordered_map<uint64_t, BlockId> hash_to_block_;
  BlockId head_ = kNullBlock;
  BlockId tail_ = kNullBlock;
  int num_free_ = 0;
  int num_cached_free_ = 0;
  int64_t num_evictions_ = 0;
  StepTrace* trace_ = nullptr;
};

}  // namespace pagedcore
