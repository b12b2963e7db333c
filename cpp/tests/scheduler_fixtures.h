// Helpers shared by the scheduler tests: a small config, token ranges, stopping params, one step.
#pragma once

#include <numeric>
#include <vector>

#include "core/scheduler.h"

namespace pagedcore_test {

using namespace pagedcore;

inline SchedulerConfig small_config(int num_blocks, int budget = 64, int block_size = 4) {
  SchedulerConfig c;
  c.num_gpu_blocks = num_blocks;
  c.block_size = block_size;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = 8;
  c.max_model_len = 256;
  c.enable_prefix_caching = true;
  return c;
}

inline std::vector<TokenId> range_tokens(int n, int start = 100) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

inline StoppingParams max_tokens(int n) {
  StoppingParams p;
  p.max_tokens = n;
  return p;
}

// One step with every sampled row answered by `token`.
inline SchedulerOutput step(Scheduler& s, TokenId token = 7, UpdateResult* result = nullptr) {
  SchedulerOutput out = s.schedule();
  UpdateResult r = s.update(std::vector<TokenId>(out.sample_seq_ids.size(), token));
  if (result) *result = r;
  return out;
}

}  // namespace pagedcore_test
