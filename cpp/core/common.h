// Types and sentinels shared by the whole C++ core. Each sentinel is defined once, here.
#pragma once

#include <cstdint>

namespace pagedcore {

using BlockId = int32_t;  // index of a physical KV block in a pool
using SeqId = int64_t;    // caller-chosen id of one sequence (one sample of a request)
using TokenId = int32_t;

// Padding in a block table row and "no block" everywhere else.
constexpr BlockId kNullBlock = -1;
// Padding in slot_mapping: reshape_and_cache writes nothing for such a token.
constexpr int64_t kPadSlot = -1;

}  // namespace pagedcore
