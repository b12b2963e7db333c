// An ordered queue of sequences: FCFS by arrival, or by (priority, arrival) under the priority policy.
#pragma once

#include <algorithm>
#include <tuple>
#include <vector>

#include "core/scheduler_config.h"
#include "core/sequence.h"

namespace pagedcore {

// Sorted vector: the front is served first, the back is the first preemption victim. Inserts are
// O(n) moves of pointers, which at a few hundred sequences costs less than a tree's allocations.
class SequenceQueue {
 public:
  explicit SequenceQueue(SchedulingPolicy policy) : policy_(policy) {}

  bool before(const Sequence* a, const Sequence* b) const {
    const int32_t pa = policy_ == SchedulingPolicy::kPriority ? a->params.priority : 0;
    const int32_t pb = policy_ == SchedulingPolicy::kPriority ? b->params.priority : 0;
    return std::tie(pa, a->arrival, a->seq_id) < std::tie(pb, b->arrival, b->seq_id);
  }
  void insert(Sequence* seq) {
    auto at = std::upper_bound(seqs_.begin(), seqs_.end(), seq,
                               [this](const Sequence* x, const Sequence* y) { return before(x, y); });
    seqs_.insert(at, seq);
  }
  bool erase(const Sequence* seq) {
    auto it = std::find(seqs_.begin(), seqs_.end(), seq);
    if (it == seqs_.end()) return false;
    seqs_.erase(it);
    return true;
  }
  template <typename Pred>
  void erase_if(Pred pred) {
    seqs_.erase(std::remove_if(seqs_.begin(), seqs_.end(), pred), seqs_.end());
  }
  Sequence* pop_back() {
    Sequence* seq = seqs_.back();
    seqs_.pop_back();
    return seq;
  }
  void erase_front(size_t n) { seqs_.erase(seqs_.begin(), seqs_.begin() + static_cast<std::ptrdiff_t>(n)); }

  size_t size() const { return seqs_.size(); }
  bool empty() const { return seqs_.empty(); }
  Sequence* operator[](size_t i) const { return seqs_[i]; }
  Sequence* back() const { return seqs_.back(); }
  const std::vector<Sequence*>& items() const { return seqs_; }

 private:
  SchedulingPolicy policy_;
  std::vector<Sequence*> seqs_;
};

}  // namespace pagedcore
