#include "kernels/logprobs_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/parallel.h"
#include "kernels/sample_rows.h"
#include "kernels/sample_rows_pass.h"

namespace pagedcore {
namespace kernels {
namespace {

// a ranks before b: larger first, NaN largest, ties by the lower index (a total order for the heap).
struct Entry {
  float value;
  int64_t index;
};
inline bool before(const Entry& a, const Entry& b) {
  const bool an = std::isnan(a.value), bn = std::isnan(b.value);
  if (an != bn) return an;
  if (!an && a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

void one_row(const LogprobsRowsParams& p, const SamplePass& pass, int64_t r) {
  float* x = p.logits + r * p.row_stride;  // [vocab]
  const int64_t V = p.vocab, K = p.num_top, token = p.token_ids[r];
  const float chosen = x[token];
  // One pass in chunks: the rank count (tokens at least as likely; a NaN chosen value compares false
  // everywhere: rank 0) and each chunk's maximum and NaN flag, both vectorisable; the top-K heap (a
  // min-heap of the K best so far, its front the worst kept) only looks into a chunk that holds a
  // value above its cut or a NaN.
  constexpr int64_t kChunk = 64;
  int64_t rank = 0;
  std::vector<Entry> heap;
  heap.reserve(static_cast<size_t>(K));
  auto worse = [](const Entry& a, const Entry& b) { return before(a, b); };  // heap front = worst kept
  float cut = 0.0f;  // the worst kept value once the heap is full: a later token enters only above it
  float max = -std::numeric_limits<float>::infinity();  // the row's maximum, NaNs skipped (row_max's rule)
  for (int64_t c0 = 0; c0 < V; c0 += kChunk) {
    const int64_t c1 = std::min(V, c0 + kChunk);
    int32_t count = 0, nan = 0;
    float chunk_max = -std::numeric_limits<float>::infinity();
    for (int64_t i = c0; i < c1; ++i) {
      const float v = x[i];
      count += v >= chosen;
      nan |= v != v;
      chunk_max = v > chunk_max ? v : chunk_max;
    }
    rank += count;
    max = chunk_max > max ? chunk_max : max;
    const bool full = static_cast<int64_t>(heap.size()) == K;
    if (K == 0 || (full && !(chunk_max > cut) && !nan)) continue;
    for (int64_t i = c0; i < c1; ++i) {
      const float v = x[i];
      // (a later index loses a tie, so a value equal to the cut stays out; NaN counts as the largest)
      if (static_cast<int64_t>(heap.size()) == K && !(v > cut) && !std::isnan(v)) continue;
      const Entry e{v, i};
      if (static_cast<int64_t>(heap.size()) < K) {
        heap.push_back(e);
        std::push_heap(heap.begin(), heap.end(), worse);
      } else if (before(e, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), worse);
        heap.back() = e;
        std::push_heap(heap.begin(), heap.end(), worse);
      }
      cut = heap.front().value;
    }
  }
  std::sort(heap.begin(), heap.end(), before);
  // The normaliser: exp(l - max) summed by the sampler's pass (in place), blocks added in double.
  float log_normaliser;
  if (std::isinf(max) && max < 0) {  // nothing above -inf (or all NaN): no distribution
    log_normaliser = std::numeric_limits<float>::quiet_NaN();
  } else {
    const int64_t num_blocks = (V + kSampleBlock - 1) / kSampleBlock;
    std::vector<float> block_sum(num_blocks), block_max(num_blocks);
    pass.to_weights(x, V, max, 1.0f, block_sum.data(), block_max.data());  // (the top values are copies)
    double total = 0.0;
    for (float s : block_sum) total += s;
    log_normaliser = std::log(static_cast<float>(total)) + max;
  }
  int64_t* ids = p.out_ids + r * (K + 1);
  float* values = p.out_logprobs + r * (K + 1);
  ids[0] = token;
  values[0] = chosen - log_normaliser;
  for (int64_t k = 0; k < K; ++k) {
    ids[k + 1] = heap[k].index;
    values[k + 1] = heap[k].value - log_normaliser;
  }
  p.out_ranks[r] = rank;
}

}  // namespace

Status logprobs_rows(const LogprobsRowsParams& p) {
  if (p.num_rows < 0 || p.vocab <= 0 || p.row_stride < p.vocab || p.num_top < 0 || p.num_top > p.vocab)
    return Status::invalid("logprobs_rows: invalid sizes (rows " + std::to_string(p.num_rows) + ", vocab " +
                           std::to_string(p.vocab) + ", row_stride " + std::to_string(p.row_stride) + ", top " +
                           std::to_string(p.num_top) + ")");
  if (p.num_rows == 0) return Status::ok();
  if (!p.logits || !p.token_ids || !p.out_ids || !p.out_logprobs || !p.out_ranks)
    return Status::invalid("logprobs_rows: a data pointer is null");
  for (int64_t r = 0; r < p.num_rows; ++r)
    if (p.token_ids[r] < 0 || p.token_ids[r] >= p.vocab)
      return Status::out_of_range("logprobs_rows: row " + std::to_string(r) + " names token " +
                                  std::to_string(p.token_ids[r]) + ", outside the vocabulary [0, " +
                                  std::to_string(p.vocab) + ")");
  const SamplePass& pass = sample_pass(active_isa());
  if (p.num_rows == 1) {
    one_row(p, pass, 0);
    return Status::ok();
  }
  parallel_for(static_cast<int>(p.num_rows), [&](int r, int) { one_row(p, pass, r); });
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
