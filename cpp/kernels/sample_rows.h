// sample_rows: one token per row of fp32 logits, drawn from softmax(logits / temperature) truncated
// by top-k, top-p and min-p (vLLM's request fields), or the row's argmax where temperature is 0.
//
// Why in C++: the torch sampler took ~130 us for one plainly sampled 49,152-wide row and ~0.3-1 ms
// for a top-k / top-p row (AMD EPYC Zen 4, 2026-12-03: a dozen torch ops, topk over the vocabulary,
// a sort when the nucleus is wide): a sampled single-stream Q4_1 token of the default model ran
// 20-34% slower than a greedy one. Here a row costs two passes over its logits (the maximum, then one
// exp pass that also sums and bounds each block) plus work on the few tokens near the top.
//
// Semantics of a row with temperature T > 0 (sample_rows.cc says how each is computed):
//   w_i   = exp((l_i - max) * (1 / T))   weights; the largest is exactly 1; a NaN logit weighs 0,
//                                        and weights under exp(-87) count as 0
//   tau_k = the k-th largest w when top_k < vocab (tokens tied with it are kept), else 0
//   tau_p = the lightest weight top-p keeps when top_p < 1, else 0: among the tokens w >= tau_k, a
//           token stays while the mass of those strictly heavier than it is < top_p * their total
//           (equal weights stay or go together, whatever order a sort would give them)
//   kept  = { i : w_i >= max(tau_k, tau_p, min_p) }   (min-p: prob >= min_p * max prob)
//   token ~ w over kept, by two exponential races (argmax of mass / noise picks with probability
//           mass / total): a block of kSampleBlock tokens by its kept mass against
//           noise[0, num_blocks), then a token of that block by w_i / noise[num_blocks + i - start]
// noise holds Exponential(1) draws the caller makes (pagedcore.sampling.noise: per-request torch
// generators, so a seeded row draws the same noise in any batch); noise_width = num_blocks +
// kSampleBlock with num_blocks = ceil(vocab / kSampleBlock). A row whose logits hold nothing above
// -inf (all -inf or NaN) is given its argmax. Random rows' logits are overwritten with their weights.
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"

namespace pagedcore {
namespace kernels {

constexpr int64_t kSampleBlock = 256;  // tokens per block of the race: ~sqrt(vocab) for real vocabularies

inline int64_t sample_noise_width(int64_t vocab) {
  return (vocab + kSampleBlock - 1) / kSampleBlock + kSampleBlock;
}

struct SampleRowsParams {
  float* logits = nullptr;              // [num_rows, vocab], rows row_stride floats apart; consumed
  int64_t num_rows = 0;
  int64_t vocab = 0;                    // > 0
  int64_t row_stride = 0;               // >= vocab
  const float* temperature = nullptr;   // [num_rows] >= 0; 0 = greedy (the argmax, torch's rules)
  const int64_t* top_k = nullptr;       // [num_rows] >= 1; >= vocab = off
  const float* top_p = nullptr;         // [num_rows] in (0, 1]; 1 = off
  const float* min_p = nullptr;         // [num_rows] in [0, 1]; 0 = off
  const float* noise = nullptr;         // [num_rows, noise_width] Exponential(1) (greedy rows: unread)
  int64_t noise_width = 0;              // == sample_noise_width(vocab)
  int64_t* out = nullptr;               // [num_rows] token ids
  float* cuts = nullptr;                // optional [num_rows]: each random row's max(tau_k, tau_p, min_p) (tests)
};

Status sample_rows(const SampleRowsParams& p);

// The checks sample_rows makes before it reads a row (sizes; temperature, top_k, top_p and min_p
// values; the noise width), without logits or out: a caller that computes the logits later checks first.
Status check_sample_inputs(const SampleRowsParams& p);

}  // namespace kernels
}  // namespace pagedcore
