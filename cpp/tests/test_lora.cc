// The multi-LoRA kernel (kernels/lora_kernel.h) against a naive double-precision loop: mixed
// slots and ranks, untargeted slices, base rows left alone, both ISAs and dtypes, bad arguments.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "check.h"
#include "kernels/lora_kernel.h"

using namespace pagedcore::kernels;

namespace {

struct Case {
  int64_t num_tokens = 11, in = 37, num_slots = 3, num_slices = 3, max_rank = 8;
  std::vector<int32_t> slice_starts{0, 16, 24, 40};       // out = 40 (q 16, k 8, v 16)
  std::vector<int32_t> ranks{8, 8, 8, 4, 0, 4, 2, 2, 2};  // [slots, slices]; slot 1 leaves k alone
  std::vector<int32_t> token_slot{0, -1, 1, 1, 2, 0, -1, 2, 2, 1, 0};  // -1: base model
  std::vector<float> x, a_t, b_t, y0;

  int64_t out() const { return slice_starts.back(); }
  int64_t sr() const { return num_slices * max_rank; }

  explicit Case(unsigned seed = 1) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, 1.f);
    auto fill = [&](std::vector<float>& v, size_t n) { v.resize(n); for (auto& e : v) e = d(rng); };
    fill(x, static_cast<size_t>(num_tokens * in));
    fill(a_t, static_cast<size_t>(num_slots * in * sr()));
    fill(b_t, static_cast<size_t>(num_slots * sr() * out()));
    fill(y0, static_cast<size_t>(num_tokens * out()));
  }

  // Grouped by slot, as the Python side builds them.
  void groups(std::vector<int32_t>& idx, std::vector<int32_t>& slots, std::vector<int32_t>& starts) const {
    starts.push_back(0);
    for (int32_t s = 0; s < num_slots; ++s) {
      const size_t before = idx.size();
      for (int32_t t = 0; t < num_tokens; ++t) if (token_slot[t] == s) idx.push_back(t);
      if (idx.size() > before) { slots.push_back(s); starts.push_back(static_cast<int32_t>(idx.size())); }
    }
  }

  std::vector<double> naive() const {
    std::vector<double> y(y0.begin(), y0.end());
    for (int64_t t = 0; t < num_tokens; ++t) {
      const int32_t a = token_slot[t];
      if (a < 0) continue;
      for (int64_t s = 0; s < num_slices; ++s) {
        for (int64_t k = s * max_rank; k < s * max_rank + ranks[a * num_slices + s]; ++k) {
          double u = 0;
          for (int64_t i = 0; i < in; ++i) u += double(x[t * in + i]) * a_t[(a * in + i) * sr() + k];
          for (int64_t o = slice_starts[s]; o < slice_starts[s + 1]; ++o) {
            y[t * out() + o] += u * b_t[(a * sr() + k) * out() + o];
          }
        }
      }
    }
    return y;
  }
};

LoRAParams params_of(const Case& c, const void* x, void* y, const std::vector<int32_t>& idx,
                     const std::vector<int32_t>& slots, const std::vector<int32_t>& starts, DType dtype) {
  LoRAParams p;
  p.x = x; p.y = y; p.a_t = c.a_t.data(); p.b_t = c.b_t.data(); p.ranks = c.ranks.data();
  p.slice_starts = c.slice_starts.data(); p.token_indices = idx.data(); p.segment_slots = slots.data();
  p.segment_starts = starts.data(); p.num_tokens = c.num_tokens; p.in_features = c.in;
  p.out_features = c.out(); p.x_stride = c.in; p.y_stride = c.out(); p.num_slots = c.num_slots;
  p.num_slices = c.num_slices; p.max_rank = c.max_rank; p.num_segments = static_cast<int64_t>(slots.size());
  p.dtype = dtype;
  return p;
}

}  // namespace

TEST(lora_matches_naive_loop_fp32_every_isa) {
  const Case c;
  std::vector<int32_t> idx, slots, starts;
  c.groups(idx, slots, starts);
  const std::vector<double> want = c.naive();
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> y = c.y0;
    const Status st = lora_shrink_expand(params_of(c, c.x.data(), y.data(), idx, slots, starts, DType::kFloat32), isa);
    CHECK(st.is_ok());
    for (size_t i = 0; i < y.size(); ++i) CHECK(std::fabs(y[i] - want[i]) < 1e-3 * (1 + std::fabs(want[i])));
    // Base rows are untouched bit for bit.
    for (int64_t o = 0; o < c.out(); ++o) CHECK_EQ(y[1 * c.out() + o], c.y0[1 * c.out() + o]);
  }
}

TEST(lora_bf16_activations) {
  const Case c(7);
  std::vector<int32_t> idx, slots, starts;
  c.groups(idx, slots, starts);
  std::vector<uint16_t> x(c.x.size()), y(c.y0.size());
  Case rounded = c;  // the reference sees the bf16-rounded inputs
  for (size_t i = 0; i < x.size(); ++i) { x[i] = float_to_bf16(c.x[i]); rounded.x[i] = bf16_to_float(x[i]); }
  for (size_t i = 0; i < y.size(); ++i) { y[i] = float_to_bf16(c.y0[i]); rounded.y0[i] = bf16_to_float(y[i]); }
  const std::vector<double> want = rounded.naive();
  CHECK(lora_shrink_expand(params_of(c, x.data(), y.data(), idx, slots, starts, DType::kBFloat16), active_isa()).is_ok());
  for (size_t i = 0; i < y.size(); ++i) CHECK(std::fabs(bf16_to_float(y[i]) - want[i]) < 1e-2 * (1 + std::fabs(want[i])));
}

TEST(lora_many_tokens_one_slot_spans_tiles) {
  Case c(3);
  c.num_tokens = 29;
  c.token_slot.assign(29, 2);
  c.token_slot[5] = -1;
  c.x.resize(static_cast<size_t>(c.num_tokens * c.in), 0.5f);
  c.y0.resize(static_cast<size_t>(c.num_tokens * c.out()), -0.25f);
  std::vector<int32_t> idx, slots, starts;
  c.groups(idx, slots, starts);
  const std::vector<double> want = c.naive();
  std::vector<float> y = c.y0;
  CHECK(lora_shrink_expand(params_of(c, c.x.data(), y.data(), idx, slots, starts, DType::kFloat32), active_isa()).is_ok());
  for (size_t i = 0; i < y.size(); ++i) CHECK(std::fabs(y[i] - want[i]) < 1e-3 * (1 + std::fabs(want[i])));
}

TEST(lora_errors_write_nothing) {
  const Case c;
  std::vector<int32_t> idx, slots, starts;
  c.groups(idx, slots, starts);
  std::vector<float> y = c.y0;
  auto p = params_of(c, c.x.data(), y.data(), idx, slots, starts, DType::kFloat32);
  std::vector<int32_t> bad_slots = slots;
  bad_slots[0] = 3;
  auto q = p;
  q.segment_slots = bad_slots.data();
  CHECK(lora_shrink_expand(q, Isa::kGeneric).code == Status::kOutOfRange);
  std::vector<int32_t> dup = idx;
  dup[1] = dup[0];
  q = p;
  q.token_indices = dup.data();
  CHECK(lora_shrink_expand(q, Isa::kGeneric).code == Status::kInvalidArgument);
  std::vector<int32_t> big = idx;
  big.back() = static_cast<int32_t>(c.num_tokens);
  q = p;
  q.token_indices = big.data();
  CHECK(lora_shrink_expand(q, Isa::kGeneric).code == Status::kOutOfRange);
  std::vector<int32_t> ranks = c.ranks;
  ranks[0] = 9;
  q = p;
  q.ranks = ranks.data();
  CHECK(lora_shrink_expand(q, Isa::kGeneric).code == Status::kOutOfRange);
  for (size_t i = 0; i < y.size(); ++i) CHECK_EQ(y[i], c.y0[i]);
}

int main() { return pagedcore_test::run_all(); }
