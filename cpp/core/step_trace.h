// The per-step event record: what the pool and the scheduler did during one schedule()/update().
// Off by default; when off, every recording site is one predictable branch on a null pointer.
#pragma once

#include <cstdint>
#include <vector>

#include "core/common.h"

namespace pagedcore {

// The kind of one event; `a` and `b` hold the kind's arguments.
enum class TraceEventType : int32_t {
  kAllocate = 0,       // a = block id                         (seq_id = owner)
  kFree = 1,           // a = block id, b = ref count after    (seq_id = former owner)
  kPrefixHit = 2,      // a = block id, b = ref count after    (the block is now shared)
  kCopyOnWrite = 3,    // a = src block, b = dst block
  kSwapOut = 4,        // a = gpu block, b = cpu block
  kSwapIn = 5,         // a = cpu block, b = gpu block
  kEvict = 6,          // a = block id whose cached hash was dropped on reuse
  kPreempt = 7,        // a = PreemptionMode
  kQueueMove = 8,      // a = from SeqStatus, b = to SeqStatus
  kFinish = 9,         // a = FinishReason, b = number of output tokens
  kReject = 10,        // a = number of prompt tokens
  kSchedule = 11,      // a = tokens scheduled this step, b = num_computed_tokens before the step
  kFork = 12,          // a = parent seq id
  kCacheRegister = 13  // a = block id now reachable by its hash
};

struct TraceEvent {
  int64_t type;    // TraceEventType
  int64_t seq_id;  // the sequence it concerns, or -1
  int64_t a;
  int64_t b;
};
static_assert(sizeof(TraceEvent) == 4 * sizeof(int64_t), "TraceEvent is exported as int64[4]");

// Appends events when attached; every producer holds a `StepTrace*` that is null when tracing is off.
class StepTrace {
 public:
  void add(TraceEventType type, SeqId seq_id, int64_t a, int64_t b) {
    events_.push_back(TraceEvent{static_cast<int64_t>(type), seq_id, a, b});
  }
  std::vector<TraceEvent> take() {
    std::vector<TraceEvent> out;
    out.swap(events_);
    return out;
  }

 private:
  std::vector<TraceEvent> events_;
};

}  // namespace pagedcore
