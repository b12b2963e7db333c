// The chained hash that names a full KV block for the prefix cache:
//   hash(block i) = H(hash(block i-1), tokens of block i, cache_key.adapter_id, cache_key.cache_salt)
// so equal hashes mean equal prefixes up to and including the block (modulo 64-bit collisions,
// which the pool guards against by comparing the stored tokens of the block itself).
#pragma once

#include <cstdint>

#include "core/cache_key.h"
#include "core/common.h"

namespace pagedcore {

// Hash of the (empty) parent of the first block of a sequence.
constexpr uint64_t kRootBlockHash = 0x9e3779b97f4a7c15ULL;

inline uint64_t mix64(uint64_t x) {
  // splitmix64 finaliser: a full-avalanche 64-bit bijection.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

inline uint64_t hash_block_tokens(uint64_t parent_hash, const TokenId* tokens, int num_tokens,
                                  const CacheKey& cache_key) {
  // Each key part enters through its own odd constant, so (adapter a, salt b) and (b, a) differ.
  uint64_t h = mix64(parent_hash ^ mix64(cache_key.adapter_id + 0x632be59bd9b4e019ULL));
  h = mix64(h ^ mix64(cache_key.cache_salt + 0x8cb92ba72f3d8dd7ULL));
  for (int i = 0; i < num_tokens; ++i) {
    h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) + 0x9e3779b97f4a7c15ULL));
  }
  return mix64(h ^ static_cast<uint64_t>(num_tokens));
}

}  // namespace pagedcore
