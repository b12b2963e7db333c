// Per-sequence KV block management over two pools (the device pool and a CPU swap pool):
// prefix-cache lookup, slot allocation with copy-on-write, fork, free, swap out and in.
#pragma once

#include <cstdint>
#include <vector>

#include "core/block_pool.h"
#include "core/sequence.h"
#include "core/step_trace.h"

namespace pagedcore {

// Flattened (src, dst) block pairs: [num_pairs * 2].
using BlockPairs = std::vector<int32_t>;

class KVCacheManager {
 public:
  KVCacheManager(int num_gpu_blocks, int num_cpu_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return block_size_; }
  BlockPool& gpu_pool() { return gpu_pool_; }
  const BlockPool& gpu_pool() const { return gpu_pool_; }
  BlockPool& cpu_pool() { return cpu_pool_; }
  const BlockPool& cpu_pool() const { return cpu_pool_; }
  void set_trace(StepTrace* trace);

  int blocks_for(int num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // The cached blocks holding a prefix of seq.token_ids (at most num_tokens - num_draft_tokens - 1
  // tokens, so every position that yields a logits row is computed, and drafts are never hashed).
  // Changes nothing but seq.block_hashes.
  std::vector<BlockId> find_cached_prefix(Sequence& seq);
  // Read-only: the leading tokens of `token_ids` (whole blocks, at most num_tokens - 1 tokens, as an
  // admission would hit) whose blocks the prefix index holds under cache_key, free or in use. Changes
  // nothing, not even the counters: the data-parallel router asks every replica before choosing one.
  int num_cached_prefix_tokens(const std::vector<TokenId>& token_ids, const CacheKey& cache_key) const;
  // Admits a sequence with no blocks: takes the hit blocks, sets num_computed_tokens to the hit
  // length and allocates blocks for num_new_tokens after it. False, with nothing changed, when
  // the pool is short.
  bool admit(Sequence& seq, const std::vector<BlockId>& cached_prefix, int num_new_tokens);
  // Blocks for num_new_tokens after seq.num_computed_tokens; a shared block about to be written
  // is replaced by a private copy, reported in `copies`. False, nothing changed, when short.
  bool allocate_slots(Sequence& seq, int num_new_tokens, BlockPairs* copies);
  // Blocks allocate_slots would need (new + copy-on-write); 0 means it cannot fail.
  int num_blocks_needed(const Sequence& seq, int num_new_tokens) const;
  // Releases the sequence's device blocks, last block first (chain tails are evicted first).
  void free(Sequence& seq);
  // Releases the blocks past the first num_blocks, last first (a rolled-back tail is reused first).
  void truncate(Sequence& seq, int num_blocks);
  // The child shares every block of the parent (one more reference each).
  void fork(const Sequence& parent, Sequence& child);
  // Device -> CPU: copies reported as (gpu, cpu). False, nothing changed, when the CPU pool is short.
  bool swap_out(Sequence& seq, BlockPairs* swaps);
  // CPU -> device, plus blocks for num_new_tokens: copies reported as (cpu, gpu). False when short.
  bool swap_in(Sequence& seq, int num_new_tokens, BlockPairs* swaps);
  // Releases a swapped sequence's CPU blocks (abort while swapped).
  void free_swapped(Sequence& seq);
  // Offers newly completed full blocks to the prefix index.
  void register_computed_blocks(Sequence& seq);

  // Prefix-cache counters, in tokens, counted once per admission.
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  double usage() const {
    return gpu_pool_.num_blocks() == 0 ? 0.0
                                       : static_cast<double>(gpu_pool_.num_used_blocks()) / gpu_pool_.num_blocks();
  }

 private:
  void extend_block_hashes(Sequence& seq, int num_full_blocks) const;

  int block_size_;
  BlockPool gpu_pool_;
  BlockPool cpu_pool_;
  StepTrace* trace_ = nullptr;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace pagedcore
