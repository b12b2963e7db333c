#include "core/kv_cache_manager.h"

#include <algorithm>

#include "core/block_hash.h"

namespace pagedcore {

KVCacheManager::KVCacheManager(int num_gpu_blocks, int num_cpu_blocks, int block_size,
                               bool enable_prefix_caching)
    : block_size_(block_size),
      gpu_pool_(num_gpu_blocks, block_size, enable_prefix_caching),
      cpu_pool_(num_cpu_blocks, block_size, /*enable_prefix_caching=*/false) {}

void KVCacheManager::set_trace(StepTrace* trace) {
  trace_ = trace;
  gpu_pool_.set_trace(trace);
  // CPU blocks show up as kSwapOut / kSwapIn pairs; their own alloc/free would only be noise.
}

void KVCacheManager::extend_block_hashes(Sequence& seq, int num_full_blocks) const {
  //   token_ids: [ b0 (bs tokens) | b1 | b2 | ... | partial ]
  //   block_hashes[i] = H(block_hashes[i-1] or root, tokens of b_i, cache_key)
  for (int i = static_cast<int>(seq.block_hashes.size()); i < num_full_blocks; ++i) {
    const uint64_t parent = i == 0 ? kRootBlockHash : seq.block_hashes[i - 1];
    seq.block_hashes.push_back(hash_block_tokens(parent, &seq.token_ids[static_cast<size_t>(i) * block_size_],
                                                 block_size_, seq.params.cache_key));
  }
}

std::vector<BlockId> KVCacheManager::find_cached_prefix(Sequence& seq) {
  std::vector<BlockId> hits;
  if (!gpu_pool_.prefix_caching() || seq.num_tokens() == 0) return hits;
  // Keep the last token and the drafts to compute: they yield the logits rows.
  const int max_blocks = (seq.num_tokens() - seq.num_draft_tokens - 1) / block_size_;
  extend_block_hashes(seq, max_blocks);
  for (int i = 0; i < max_blocks; ++i) {
    const uint64_t parent = i == 0 ? kRootBlockHash : seq.block_hashes[i - 1];
    const BlockId b = gpu_pool_.lookup(seq.block_hashes[i], parent,
                                       &seq.token_ids[static_cast<size_t>(i) * block_size_], seq.params.cache_key);
    if (b == kNullBlock) break;
    hits.push_back(b);
  }
  return hits;
}

int KVCacheManager::num_cached_prefix_tokens(const std::vector<TokenId>& token_ids, const CacheKey& cache_key) const {
  if (!gpu_pool_.prefix_caching() || token_ids.empty()) return 0;
  // The same chain and cap as find_cached_prefix (the last token is always computed), hashed here
  // rather than into a Sequence: nothing is stored.
  const int max_blocks = (static_cast<int>(token_ids.size()) - 1) / block_size_;
  uint64_t parent = kRootBlockHash;
  int num_hit_blocks = 0;
  for (; num_hit_blocks < max_blocks; ++num_hit_blocks) {
    const TokenId* tokens = &token_ids[static_cast<size_t>(num_hit_blocks) * block_size_];
    const uint64_t hash = hash_block_tokens(parent, tokens, block_size_, cache_key);
    if (gpu_pool_.lookup(hash, parent, tokens, cache_key) == kNullBlock) break;
    parent = hash;
  }
  return num_hit_blocks * block_size_;
}

bool KVCacheManager::admit(Sequence& seq, const std::vector<BlockId>& cached_prefix, int num_new_tokens) {
  const int num_hit_tokens = static_cast<int>(cached_prefix.size()) * block_size_;
  const int num_needed = blocks_for(num_hit_tokens + num_new_tokens);
  const int num_fresh = num_needed - static_cast<int>(cached_prefix.size());
  // A hit on a free block takes it off the free list, so it cannot also serve as a fresh block.
  int num_hits_on_free = 0;
  for (BlockId b : cached_prefix) num_hits_on_free += gpu_pool_.is_free(b) ? 1 : 0;
  if (gpu_pool_.num_free_blocks() - num_hits_on_free < num_fresh) return false;

  seq.block_table.clear();
  for (BlockId b : cached_prefix) {
    gpu_pool_.retain(b);
    seq.block_table.push_back(b);
    if (trace_) trace_->add(TraceEventType::kPrefixHit, seq.seq_id, b, gpu_pool_.ref_count(b));
  }
  for (int i = 0; i < num_fresh; ++i) seq.block_table.push_back(gpu_pool_.allocate(seq.seq_id));
  seq.num_computed_tokens = num_hit_tokens;
  seq.num_registered_blocks = static_cast<int32_t>(cached_prefix.size());
  if (gpu_pool_.prefix_caching()) {
    prefix_query_tokens_ += seq.num_tokens();
    prefix_hit_tokens_ += num_hit_tokens;
  }
  return true;
}

int KVCacheManager::num_blocks_needed(const Sequence& seq, int num_new_tokens) const {
  const int held = static_cast<int>(seq.block_table.size());
  const int needed = blocks_for(seq.num_computed_tokens + num_new_tokens);
  int num_copies = 0;
  for (int i = seq.num_computed_tokens / block_size_; i < std::min(held, needed); ++i) {
    if (gpu_pool_.ref_count(seq.block_table[i]) > 1) ++num_copies;
  }
  return std::max(0, needed - held) + num_copies;
}

bool KVCacheManager::allocate_slots(Sequence& seq, int num_new_tokens, BlockPairs* copies) {
  //   block_table: [ full | full | partial* | (new) | (new) ]
  //                              ^ first block written = num_computed_tokens / block_size
  // Every held block from the first written one on that is shared (ref > 1) is swapped for a
  // private block; if it already holds this sequence's tokens (positions < num_computed_tokens)
  // their KV is copied (copy-on-write). Then blocks are appended up to the new length.
  if (gpu_pool_.num_free_blocks() < num_blocks_needed(seq, num_new_tokens)) return false;
  const int held = static_cast<int>(seq.block_table.size());
  const int needed = blocks_for(seq.num_computed_tokens + num_new_tokens);
  for (int i = seq.num_computed_tokens / block_size_; i < std::min(held, needed); ++i) {
    const BlockId shared = seq.block_table[i];
    if (gpu_pool_.ref_count(shared) <= 1) continue;
    const BlockId copy = gpu_pool_.allocate(seq.seq_id);
    if (i * block_size_ < seq.num_computed_tokens) {
      copies->push_back(shared);
      copies->push_back(copy);
      if (trace_) trace_->add(TraceEventType::kCopyOnWrite, seq.seq_id, shared, copy);
    }
    gpu_pool_.release(shared, seq.seq_id);
    seq.block_table[i] = copy;
  }
  for (int i = held; i < needed; ++i) seq.block_table.push_back(gpu_pool_.allocate(seq.seq_id));
  return true;
}

void KVCacheManager::free(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    gpu_pool_.release(*it, seq.seq_id);
  }
  seq.block_table.clear();
  seq.num_registered_blocks = 0;
}

void KVCacheManager::truncate(Sequence& seq, int num_blocks) {
  while (static_cast<int>(seq.block_table.size()) > num_blocks) {
    gpu_pool_.release(seq.block_table.back(), seq.seq_id);
    seq.block_table.pop_back();
  }
}

void KVCacheManager::fork(const Sequence& parent, Sequence& child) {
  child.block_table = parent.block_table;
  for (BlockId b : child.block_table) gpu_pool_.retain(b);
}

bool KVCacheManager::swap_out(Sequence& seq, BlockPairs* swaps) {
  const int n = static_cast<int>(seq.block_table.size());
  if (cpu_pool_.num_free_blocks() < n) return false;
  std::vector<BlockId> cpu_table(n);
  for (int i = 0; i < n; ++i) {
    cpu_table[i] = cpu_pool_.allocate(seq.seq_id);
    swaps->push_back(seq.block_table[i]);
    swaps->push_back(cpu_table[i]);
    if (trace_) trace_->add(TraceEventType::kSwapOut, seq.seq_id, seq.block_table[i], cpu_table[i]);
  }
  free(seq);
  seq.block_table = std::move(cpu_table);
  return true;
}

bool KVCacheManager::swap_in(Sequence& seq, int num_new_tokens, BlockPairs* swaps) {
  const int n = static_cast<int>(seq.block_table.size());
  const int needed = std::max(n, blocks_for(seq.num_computed_tokens + num_new_tokens));
  if (gpu_pool_.num_free_blocks() < needed) return false;
  std::vector<BlockId> gpu_table(needed);
  for (int i = 0; i < n; ++i) {
    gpu_table[i] = gpu_pool_.allocate(seq.seq_id);
    swaps->push_back(seq.block_table[i]);
    swaps->push_back(gpu_table[i]);
    if (trace_) trace_->add(TraceEventType::kSwapIn, seq.seq_id, seq.block_table[i], gpu_table[i]);
  }
  for (int i = n; i < needed; ++i) gpu_table[i] = gpu_pool_.allocate(seq.seq_id);
  free_swapped(seq);
  seq.block_table = std::move(gpu_table);
  seq.num_registered_blocks = 0;  // fresh device blocks: offer their full blocks to the index again
  return true;
}

void KVCacheManager::free_swapped(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    cpu_pool_.release(*it, seq.seq_id);
  }
  seq.block_table.clear();
}

void KVCacheManager::register_computed_blocks(Sequence& seq) {
  if (!gpu_pool_.prefix_caching()) return;
  const int num_full = std::min(seq.num_computed_tokens / block_size_, static_cast<int>(seq.block_table.size()));
  if (seq.num_registered_blocks >= num_full) return;
  extend_block_hashes(seq, num_full);
  for (int i = seq.num_registered_blocks; i < num_full; ++i) {
    const uint64_t parent = i == 0 ? kRootBlockHash : seq.block_hashes[i - 1];
    const BlockId b = seq.block_table[i];
    if (gpu_pool_.register_block(b, seq.block_hashes[i], parent,
                                 &seq.token_ids[static_cast<size_t>(i) * block_size_], seq.params.cache_key) &&
        trace_) {
      trace_->add(TraceEventType::kCacheRegister, seq.seq_id, b, 0);
    }
  }
  seq.num_registered_blocks = num_full;
}

}  // namespace pagedcore
