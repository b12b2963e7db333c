// The scheduler's LoRA constraint: at most max_loras distinct adapters per step, base rows free,
// blocked waiting sequences passed over (not waited on), and each step's adapter_ids.
#include <algorithm>
#include <set>
#include <vector>

#include "check.h"
#include "scheduler_fixtures.h"

using namespace pagedcore_test;

namespace {

StoppingParams with_adapter(uint64_t adapter, int max_new = 4) {
  StoppingParams p = max_tokens(max_new);
  p.cache_key.adapter_id = adapter;
  return p;
}

std::set<uint64_t> distinct_adapters(const SchedulerOutput& out) {
  std::set<uint64_t> ids;
  for (uint64_t a : out.adapter_ids) if (a != 0) ids.insert(a);
  return ids;
}

}  // namespace

TEST(max_loras_caps_distinct_adapters_and_passes_blocked_ones_over) {
  SchedulerConfig c = small_config(64);
  c.max_loras = 2;
  Scheduler s(c);
  s.add_sequence(0, range_tokens(5), with_adapter(1));
  s.add_sequence(1, range_tokens(5), with_adapter(2));
  s.add_sequence(2, range_tokens(5), with_adapter(3));  // no room: passed over
  s.add_sequence(3, range_tokens(5), with_adapter(0));  // base: always fits
  s.add_sequence(4, range_tokens(5), with_adapter(1));  // adapter 1 is already in the step
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{0, 1, 3, 4}));
  CHECK_EQ(out.adapter_ids, (std::vector<uint64_t>{1, 2, 0, 1}));
  CHECK_EQ(s.waiting_ids(), (std::vector<SeqId>{2}));
  s.update(std::vector<TokenId>(out.sample_seq_ids.size(), 7));
  // Running sequences keep their adapters' room: 2 waits until one of them finishes.
  int steps = 0;
  while (s.has_unfinished() && steps < 50) {
    out = s.schedule();
    CHECK(distinct_adapters(out).size() <= 2u);
    s.update(std::vector<TokenId>(out.sample_seq_ids.size(), 7));
    ++steps;
  }
  CHECK(!s.has_unfinished());
  CHECK_EQ(s.kv_cache().gpu_pool().num_free_blocks(), 64);
}

TEST(max_loras_zero_means_no_cap) {
  Scheduler s(small_config(64));
  for (int i = 0; i < 6; ++i) s.add_sequence(i, range_tokens(3), with_adapter(static_cast<uint64_t>(i + 1)));
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.num_seqs(), 6);
  CHECK_EQ(distinct_adapters(out).size(), 6u);
}

TEST(running_sequence_over_the_cap_is_skipped_not_preempted) {
  SchedulerConfig c = small_config(64);
  c.max_loras = 1;
  Scheduler s(c);
  s.add_sequence(0, range_tokens(4), with_adapter(5, 8));
  step(s);
  // A fork-free way to have two running adapters: admit the second when the first is not scheduled.
  s.add_sequence(1, range_tokens(4), with_adapter(6, 8));
  SchedulerOutput out = s.schedule();
  CHECK_EQ(out.seq_ids, (std::vector<SeqId>{0}));  // 1 waits: adapter 5 holds the only room
  CHECK(out.preempted_seq_ids.empty());
  s.update(std::vector<TokenId>(out.sample_seq_ids.size(), 7));
}

TEST(max_loras_validated) {
  SchedulerConfig c = small_config(8);
  c.max_loras = -1;
  bool threw = false;
  try {
    c.validate();
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

int main() { return pagedcore_test::run_all(); }
