// What, besides the tokens, decides whether two KV blocks are interchangeable in the prefix cache.
#pragma once

#include <cstdint>

namespace pagedcore {

// Two named parts, both hashed into every block hash and both compared on a hit, so one can never
// stand in for the other: a block computed under adapter 3 is not a block salted with 3.
struct CacheKey {
  uint64_t adapter_id = 0;  // the LoRA / adapter whose weights produced the KV (0: base model)
  uint64_t cache_salt = 0;  // isolates a request from others' cache (tenant, prompt-logprobs rows)

  bool operator==(const CacheKey& other) const {
    return adapter_id == other.adapter_id && cache_salt == other.cache_salt;
  }
  bool operator!=(const CacheKey& other) const { return !(*this == other); }
};

}  // namespace pagedcore
