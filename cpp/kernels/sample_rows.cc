// sample_rows (see sample_rows.h for what it computes and why). Per random row:
//   1. the maximum of the logits (NaNs skipped);
//   2. one pass per block of kSampleBlock tokens: w = exp((l - max) * (1 / T)) written over the
//      logits, and the block's sum and largest weight;
//   3. thresholds from candidates: the weights >= a bound, collected from the blocks whose largest
//      weight reaches it. top-k's bound is the k-th largest block maximum (k blocks each hold a
//      weight >= it), or a ladder (2^-8, 2^-20, 2^-40, 0) when k exceeds the blocks; top-p steps down
//      the ladder until the mass above the bound holds the nucleus, then walks the candidates from
//      the top (sorted when few, by bins of their fp32 bits when many). The answer depends only on
//      the row's weights, never on which bound found it;
//   4. the kept mass of each block (recomputed only when a threshold cut some tokens), the block race,
//      then the race inside the chosen block.
// Passes 1, 2 and the masked block sums of 4 are vector code, one unit per ISA (sample_rows_pass.h:
// bit-identical results on every ISA); the rest touches a few hundred tokens a row.
#include "kernels/sample_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernels/argmax_rows.h"
#include "kernels/parallel.h"
#include "kernels/sample_rows_pass.h"

namespace pagedcore {
namespace kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Bounds tried in turn for the candidates of top-k / top-p (weights are <= 1); 0 takes every token.
constexpr float kBounds[] = {0x1p-8f, 0x1p-20f, 0x1p-40f, 0.0f};
// Candidates up to this many are sorted for top-p; more go by bins (RowSampler::walk).
constexpr size_t kSortedWalkMax = 2048;

// Per-thread scratch, kept between calls (the engine samples from one thread at a time per row).
struct RowScratch {
  std::vector<float> block_sum, block_max, mass, candidates, block_maxima, bin_min, bin_values;
  std::vector<double> bin_mass;
};

RowScratch& scratch() {
  static thread_local RowScratch s;
  return s;
}

class RowSampler {
 public:
  RowSampler(float* w, int64_t vocab, const SamplePass& pass, RowScratch& s)
      : w_(w), vocab_(vocab), num_blocks_((vocab + kSampleBlock - 1) / kSampleBlock), pass_(pass), s_(s) {
    s_.block_sum.resize(num_blocks_);
    s_.block_max.resize(num_blocks_);
    s_.mass.resize(num_blocks_);
  }

  // Logits -> weights in place; false when the row has nothing above -inf (or T is subnormal).
  bool to_weights(float temperature) {
    const float m = pass_.row_max(w_, vocab_);
    if (m == -kInf) return false;
    if (m == kInf) {  // +inf logits share all the mass
      for (int64_t b = 0; b < num_blocks_; ++b) {
        float sum = 0.0f;
        for (int64_t i = begin(b); i < end(b); ++i) {
          w_[i] = w_[i] == kInf ? 1.0f : 0.0f;
          sum += w_[i];
        }
        s_.block_sum[b] = sum;
        s_.block_max[b] = sum > 0.0f ? 1.0f : 0.0f;
      }
      return true;
    }
    const float inv_t = 1.0f / temperature;
    if (std::isinf(inv_t)) return false;  // 0 * inf would weigh the maximum NaN: the argmax instead
    pass_.to_weights(w_, vocab_, m, inv_t, s_.block_sum.data(), s_.block_max.data());
    return true;
  }

  // The k-th largest weight (1 <= k < vocab). When k <= num_blocks, the k-th largest block maximum
  // bounds it from below (k blocks each hold a weight >= it): the candidates are few. Else the ladder.
  float top_k_threshold(int64_t k) {
    if (k <= num_blocks_) {
      std::vector<float>& maxima = s_.block_maxima;
      maxima.assign(s_.block_max.begin(), s_.block_max.end());
      std::nth_element(maxima.begin(), maxima.begin() + (k - 1), maxima.end(), std::greater<float>());
      collect(maxima[k - 1]);
    } else {
      for (float bound : kBounds) {
        collect(bound);
        if (static_cast<int64_t>(s_.candidates.size()) >= k || bound == 0.0f) break;
      }
    }
    std::vector<float>& c = s_.candidates;
    std::nth_element(c.begin(), c.begin() + (k - 1), c.end(), std::greater<float>());
    return c[k - 1];
  }

  // Block masses of the weights >= tau (into mass) and their total.
  double kept_mass(float tau) {
    double total = 0.0;
    for (int64_t b = 0; b < num_blocks_; ++b) {
      float mass = 0.0f;
      if (tau <= 0.0f) {
        mass = s_.block_sum[b];
      } else if (s_.block_max[b] >= tau) {
        mass = pass_.kept_sum(w_ + begin(b), end(b) - begin(b), tau);
      }
      s_.mass[b] = mass;
      total += mass;
    }
    return total;
  }

  // The lightest weight top-p keeps among the weights >= tau_k, whose total is `total`. Each bound
  // of the ladder is first tested by mass (a vector pass over the blocks that reach it); the
  // candidates are collected once their mass can hold the nucleus.
  float top_p_threshold(float top_p, float tau_k, double total) {
    const double target = static_cast<double>(top_p) * total;
    float kept = 1.0f;
    for (float bound : kBounds) {
      const float lower = std::max(bound, tau_k);
      const bool everything = lower <= tau_k;  // the candidates are every token top-k kept
      if (!everything && mass_at_least(lower) < target) continue;
      collect(lower);
      // Done when the nucleus closed inside the candidates, or they were every token >= tau_k.
      if (walk(target, &kept) || everything) return kept;
    }
    return kept;  // unreachable: the last bound is 0 <= tau_k
  }

  // The race over the weights >= tau; mass holds their block masses.
  int64_t race(float tau, const float* noise) const {
    int64_t block = -1;
    float best = -1.0f;
    for (int64_t b = 0; b < num_blocks_; ++b) {
      if (!(s_.mass[b] > 0.0f)) continue;
      const float score = s_.mass[b] / noise[b];  // noise +inf (a uniform draw of 0) scores 0: still a candidate
      if (score > best) best = score, block = b;
    }
    if (block < 0) return -1;  // nothing kept: cannot happen (the maximum weighs 1 >= every cut)
    const float* inside = noise + num_blocks_;
    int64_t token = -1;
    best = -1.0f;
    for (int64_t i = begin(block); i < end(block); ++i) {
      if (!(w_[i] > 0.0f) || w_[i] < tau) continue;
      const float score = w_[i] / inside[i - begin(block)];
      if (score > best) best = score, token = i;
    }
    return token;
  }

 private:
  int64_t begin(int64_t b) const { return b * kSampleBlock; }
  int64_t end(int64_t b) const { return std::min(vocab_, (b + 1) * kSampleBlock); }

  double mass_at_least(float bound) const {
    double mass = 0.0;
    for (int64_t b = 0; b < num_blocks_; ++b)
      if (s_.block_max[b] >= bound) mass += pass_.kept_sum(w_ + begin(b), end(b) - begin(b), bound);
    return mass;
  }

  // Walks the candidates from the heaviest weight down, keeping equal weights together while the
  // mass strictly above them is < target: the lightest kept weight into *kept; true when a weight
  // failed (every lighter one fails too). Few candidates are sorted; many go by bins of the top 16
  // bits of their fp32 encoding (monotone for weights >= 0; 1/128 of an octave wide), summed whole,
  // and only the bin where the mass crosses the target is sorted.
  bool walk(double target, float* kept) {
    std::vector<float>& c = s_.candidates;
    double above = 0.0;
    if (c.size() <= kSortedWalkMax) return sorted_walk(c.begin(), c.end(), target, &above, kept);
    const uint32_t top = bin_of(1.0f);
    const uint32_t bottom = bin_of(*std::min_element(c.begin(), c.end()));
    const size_t num_bins = top - bottom + 1;
    s_.bin_mass.assign(num_bins, 0.0);  // [bins] heaviest first
    s_.bin_min.assign(num_bins, kInf);
    for (float v : c) {
      const size_t j = top - bin_of(v);
      s_.bin_mass[j] += v;
      s_.bin_min[j] = std::min(s_.bin_min[j], v);
    }
    for (size_t j = 0; j < num_bins; ++j) {
      if (!(s_.bin_mass[j] > 0.0)) continue;  // empty (or zero weights: never kept)
      if (!(above < target)) return true;
      if (above + s_.bin_mass[j] < target) {  // even the bin's lightest weight stays
        above += s_.bin_mass[j];
        *kept = s_.bin_min[j];
        continue;
      }
      std::vector<float>& inside = s_.bin_values;  // the crossing bin
      inside.clear();
      for (float v : c)
        if (top - bin_of(v) == j) inside.push_back(v);
      if (sorted_walk(inside.begin(), inside.end(), target, &above, kept)) return true;
    }
    return false;
  }

  static bool sorted_walk(std::vector<float>::iterator first, std::vector<float>::iterator last, double target,
                          double* above, float* kept) {
    std::sort(first, last, std::greater<float>());
    while (first != last) {
      if (!(*above < target)) return true;
      const float v = *first;
      *kept = v;
      for (; first != last && *first == v; ++first) *above += v;
    }
    return false;
  }

  static uint32_t bin_of(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bits >> 16;
  }

  // Every weight >= bound into candidates (in token order).
  void collect(float bound) {
    std::vector<float>& c = s_.candidates;
    c.clear();
    for (int64_t b = 0; b < num_blocks_; ++b) {
      if (s_.block_max[b] < bound) continue;
      for (int64_t i = begin(b); i < end(b); ++i)
        if (w_[i] >= bound) c.push_back(w_[i]);
    }
  }

  float* w_;
  int64_t vocab_, num_blocks_;
  const SamplePass& pass_;
  RowScratch& s_;
};

int64_t argmax_of(const float* row, int64_t vocab) {
  ArgmaxRowsParams a;
  int64_t token = 0;
  a.logits = row;
  a.num_rows = 1;
  a.vocab = vocab;
  a.row_stride = vocab;
  a.out = &token;
  argmax_rows(a);
  return token;
}

int64_t sample_row(const SampleRowsParams& p, const SamplePass& pass, int64_t r) {
  float* row = p.logits + r * p.row_stride;  // [vocab]
  if (p.temperature[r] == 0.0f) return argmax_of(row, p.vocab);
  RowSampler sampler(row, p.vocab, pass, scratch());
  if (!sampler.to_weights(p.temperature[r])) return argmax_of(row, p.vocab);
  float tau = 0.0f;
  if (p.top_k[r] < p.vocab) tau = sampler.top_k_threshold(p.top_k[r]);
  double total = sampler.kept_mass(tau);
  float cut = tau;
  if (p.top_p[r] < 1.0f) cut = std::max(cut, sampler.top_p_threshold(p.top_p[r], tau, total));
  cut = std::max(cut, p.min_p[r]);
  if (cut > tau) sampler.kept_mass(cut);
  if (p.cuts) p.cuts[r] = cut;
  const int64_t token = sampler.race(cut, p.noise + r * p.noise_width);
  return token >= 0 ? token : argmax_of(row, p.vocab);
}

std::string str(double v) { return std::to_string(v); }

}  // namespace

const SamplePass& sample_pass(Isa isa) {
#if PAGEDCORE_KERNELS_X86
  switch (isa) {
    case Isa::kAvx2:
      return sample_avx2::pass();
    case Isa::kAvx512:
    case Isa::kAvx512Bf16:
    case Isa::kAvx512Vnni:
    case Isa::kAmxBf16:
    case Isa::kAmxInt8:
      return sample_avx512::pass();
    default:
      break;
  }
#endif
  return sample_generic::pass();
}

Status check_sample_inputs(const SampleRowsParams& p) {
  if (p.num_rows < 0 || p.vocab <= 0 || p.row_stride < p.vocab)
    return Status::invalid("sample_rows: invalid sizes (rows " + std::to_string(p.num_rows) + ", vocab " +
                           std::to_string(p.vocab) + ", row_stride " + std::to_string(p.row_stride) + ")");
  if (p.num_rows == 0) return Status::ok();
  if (!p.temperature || !p.top_k || !p.top_p || !p.min_p) return Status::invalid("sample_rows: a data pointer is null");
  bool any_random = false;
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const auto row = [r] { return "sample_rows: row " + std::to_string(r) + " has "; };
    if (!(p.temperature[r] >= 0.0f) || std::isinf(p.temperature[r]))
      return Status::invalid(row() + "temperature " + str(p.temperature[r]) + "; it must be finite and >= 0");
    if (p.temperature[r] == 0.0f) continue;
    any_random = true;
    if (p.top_k[r] < 1) return Status::invalid(row() + "top_k " + std::to_string(p.top_k[r]) + "; it must be >= 1");
    if (!(p.top_p[r] > 0.0f && p.top_p[r] <= 1.0f))
      return Status::invalid(row() + "top_p " + str(p.top_p[r]) + "; it must be in (0, 1]");
    if (!(p.min_p[r] >= 0.0f && p.min_p[r] <= 1.0f))
      return Status::invalid(row() + "min_p " + str(p.min_p[r]) + "; it must be in [0, 1]");
  }
  if (any_random && (!p.noise || p.noise_width != sample_noise_width(p.vocab)))
    return Status::invalid("sample_rows: noise must be [num_rows, " + std::to_string(sample_noise_width(p.vocab)) +
                           "] for a vocabulary of " + std::to_string(p.vocab) + ", got width " +
                           std::to_string(p.noise_width));
  return Status::ok();
}

Status sample_rows(const SampleRowsParams& p) {
  const Status checked = check_sample_inputs(p);
  if (!checked.is_ok() || p.num_rows == 0) return checked;
  if (!p.logits || !p.out) return Status::invalid("sample_rows: a data pointer is null");
  const SamplePass& pass = sample_pass(active_isa());
  if (p.num_rows == 1) {  // a single-stream step: no fork
    p.out[0] = sample_row(p, pass, 0);
    return Status::ok();
  }
  // Rows in parallel tasks. (Splitting one row's passes over the threads instead was tried: in-process
  // A/B of sampled single-stream Q4_1 tokens, 8 pairs, ratio 0.999 on the Zen 4: dropped.)
  parallel_for(static_cast<int>(p.num_rows), [&](int r, int) { p.out[r] = sample_row(p, pass, r); });
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
