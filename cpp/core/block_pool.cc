#include "core/block_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pagedcore {

BlockPool::BlockPool(int num_blocks, int block_size, bool enable_prefix_caching)
    : block_size_(block_size), enable_prefix_caching_(enable_prefix_caching) {
  if (num_blocks < 0) {
    throw std::invalid_argument("num_blocks must be >= 0, got " + std::to_string(num_blocks));
  }
  if (block_size <= 0) {
    throw std::invalid_argument("block_size must be > 0, got " + std::to_string(block_size));
  }
  blocks_.resize(num_blocks);
  if (enable_prefix_caching_) {
    block_tokens_.resize(static_cast<size_t>(num_blocks) * block_size);
    hash_to_block_.reserve(static_cast<size_t>(num_blocks) * 2);
  }
  // Initially free in id order, so a fresh pool hands out 0, 1, 2, ...
  for (BlockId b = 0; b < num_blocks; ++b) push_back_free(b);
}

BlockId BlockPool::check(BlockId block_id) const {
  if (block_id < 0 || block_id >= num_blocks()) {
    throw std::out_of_range("block id " + std::to_string(block_id) + " is outside the pool of " +
                            std::to_string(num_blocks()) + " blocks");
  }
  return block_id;
}

void BlockPool::push_back_free(BlockId b) {
  Block& block = blocks_[b];
  block.in_free_list = true;
  block.prev = tail_;
  block.next = kNullBlock;
  if (tail_ != kNullBlock) {
    blocks_[tail_].next = b;
  } else {
    head_ = b;
  }
  tail_ = b;
  ++num_free_;
  if (block.has_hash) ++num_cached_free_;
}

void BlockPool::unlink_free(BlockId b) {
  Block& block = blocks_[b];
  if (block.prev != kNullBlock) {
    blocks_[block.prev].next = block.next;
  } else {
    head_ = block.next;
  }
  if (block.next != kNullBlock) {
    blocks_[block.next].prev = block.prev;
  } else {
    tail_ = block.prev;
  }
  block.prev = block.next = kNullBlock;
  block.in_free_list = false;
  --num_free_;
  if (block.has_hash) --num_cached_free_;
}

void BlockPool::drop_hash(BlockId b) {
  Block& block = blocks_[b];
  auto it = hash_to_block_.find(block.hash);
  if (it != hash_to_block_.end() && it->second == b) hash_to_block_.erase(it);
  block.has_hash = false;
}

BlockId BlockPool::allocate(SeqId owner) {
  if (head_ == kNullBlock) return kNullBlock;
  const BlockId b = head_;
  unlink_free(b);
  Block& block = blocks_[b];
  if (block.has_hash) {  // lazy eviction: the cached prefix is overwritten from now on
    drop_hash(b);
    ++num_evictions_;
    if (trace_) trace_->add(TraceEventType::kEvict, owner, b, 0);
  }
  block.ref_count = 1;
  if (trace_) trace_->add(TraceEventType::kAllocate, owner, b, 1);
  return b;
}

void BlockPool::retain(BlockId block_id) {
  Block& block = blocks_[check(block_id)];
  if (block.ref_count == 0) unlink_free(block_id);
  ++block.ref_count;
}

void BlockPool::release(BlockId block_id, SeqId owner) {
  Block& block = blocks_[check(block_id)];
  if (block.ref_count <= 0) {
    throw std::logic_error("release of block " + std::to_string(block_id) +
                           " which has no references (double free)");
  }
  --block.ref_count;
  if (trace_) trace_->add(TraceEventType::kFree, owner, block_id, block.ref_count);
  if (block.ref_count == 0) push_back_free(block_id);
}

BlockId BlockPool::lookup(uint64_t hash, uint64_t parent_hash, const TokenId* tokens,
                          const CacheKey& cache_key) const {
  if (!enable_prefix_caching_) return kNullBlock;
  auto it = hash_to_block_.find(hash);
  if (it == hash_to_block_.end()) return kNullBlock;
  const BlockId b = it->second;
  const Block& block = blocks_[b];
  // Confirm: a 64-bit collision must not hand out another prefix's KV.
  if (block.parent_hash != parent_hash || block.cache_key != cache_key) return kNullBlock;
  const TokenId* stored = &block_tokens_[static_cast<size_t>(b) * block_size_];
  if (!std::equal(tokens, tokens + block_size_, stored)) return kNullBlock;
  return b;
}

bool BlockPool::register_block(BlockId block_id, uint64_t hash, uint64_t parent_hash,
                               const TokenId* tokens, const CacheKey& cache_key) {
  if (!enable_prefix_caching_) return false;
  Block& block = blocks_[check(block_id)];
  if (block.has_hash) return block.hash == hash;
  if (!hash_to_block_.emplace(hash, block_id).second) return false;  // a twin holds it already
  block.has_hash = true;
  block.hash = hash;
  block.parent_hash = parent_hash;
  block.cache_key = cache_key;
  std::copy(tokens, tokens + block_size_, &block_tokens_[static_cast<size_t>(block_id) * block_size_]);
  if (block.in_free_list) ++num_cached_free_;
  return true;
}

std::vector<BlockId> BlockPool::free_block_ids() const {
  std::vector<BlockId> ids;
  ids.reserve(num_free_);
  for (BlockId b = head_; b != kNullBlock; b = blocks_[b].next) ids.push_back(b);
  return ids;
}

}  // namespace pagedcore
