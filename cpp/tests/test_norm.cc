// norm.h's RMSNorm (with and without the residual add, in place, many rows) and rotary embedding
// against scalar loops, on every ISA this CPU runs, fp32 and bf16; and their argument errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "check.h"
#include "kernel_buffers.h"
#include "kernels/norm.h"

using namespace pagedcore::kernels;
using pagedcore_test::Buf;
using pagedcore_test::make;
using pagedcore_test::round_bf16;
using pagedcore_test::supported_isas;
using pagedcore_test::zeros;

TEST(rms_norm_matches_scalar_loop) {
  for (Isa isa : supported_isas())
    for (DType t : {DType::kFloat32, DType::kBFloat16})
      for (int64_t n : {1, 7, 64, 100, 576})
        for (bool with_residual : {false, true}) {
          std::mt19937 rng(static_cast<uint32_t>(n * 2 + with_residual));
          const int64_t rows = 5, xs = n + 3, rs = n + 1, os = n + 2;
          Buf x = make(t, rows * xs, rng), res = make(t, rows * rs, rng), w = make(t, n, rng);
          Buf out = zeros(t, rows * os, -9.f);
          std::vector<float> res_before = res.values;
          RmsNormParams p;
          p.out = out.mut();
          p.residual = with_residual ? res.mut() : nullptr;
          p.x = x.data();
          p.weight = w.data();
          p.rows = rows;
          p.n = n;
          p.x_stride = xs;
          p.out_stride = os;
          p.residual_stride = rs;
          p.eps = 1e-5f;
          p.dtype = t;
          CHECK(rms_norm(p, isa).is_ok());
          const bool bf = t == DType::kBFloat16;
          for (int64_t r = 0; r < rows; ++r) {
            std::vector<float> v(n);
            double ss = 0;
            for (int64_t c = 0; c < n; ++c) {
              float a = x.values[r * xs + c];
              if (with_residual) {
                a = res_before[r * rs + c] + a;
                if (bf) a = round_bf16(a);
                CHECK_EQ(res.at(r * rs + c), a);  // the residual holds the rounded sum
              }
              v[c] = a;
              ss += static_cast<double>(a) * a;
            }
            const float rinv = static_cast<float>(1.0 / std::sqrt(ss / n + 1e-5));
            for (int64_t c = 0; c < n; ++c) {
              float y = v[c] * rinv;
              if (bf) y = round_bf16(y);
              const float want = bf ? round_bf16(y * w.values[c]) : y * w.values[c];
              const float got = out.at(r * os + c);
              const float tol = bf ? std::ldexp(std::fabs(want), -7) + 1e-30f : 4e-6f * std::fabs(want) + 1e-30f;
              if (!(std::fabs(got - want) <= tol))
                throw pagedcore_test::Failure(std::string("rms_norm ") + isa_name(isa) + " n=" +
                                              std::to_string(n) + ": got " + std::to_string(got) + " want " +
                                              std::to_string(want));
            }
            for (int64_t c = n; c < os; ++c) CHECK_EQ(out.at(r * os + c), -9.f);
          }
        }
}

TEST(rms_norm_in_place_and_many_rows) {
  for (Isa isa : supported_isas()) {
    std::mt19937 rng(3);
    const int64_t rows = 300, n = 96;  // several tasks
    Buf x = make(DType::kFloat32, rows * n, rng), w = make(DType::kFloat32, n, rng);
    Buf copy = x;
    RmsNormParams p;
    p.out = x.mut();  // out == x
    p.x = x.data();
    p.weight = w.data();
    p.rows = rows;
    p.n = n;
    p.x_stride = p.out_stride = n;
    CHECK(rms_norm(p, isa).is_ok());
    for (int64_t r = 0; r < rows; r += 37) {
      double ss = 0;
      for (int64_t c = 0; c < n; ++c) ss += static_cast<double>(copy.values[r * n + c]) * copy.values[r * n + c];
      const float rinv = static_cast<float>(1.0 / std::sqrt(ss / n + 1e-6));
      for (int64_t c = 0; c < n; ++c) {
        const float want = copy.values[r * n + c] * rinv * w.values[c];
        CHECK(std::fabs(x.at(r * n + c) - want) <= 4e-6f * std::fabs(want) + 1e-30f);
      }
    }
  }
}

TEST(rotary_embedding_matches_scalar_loop) {
  for (Isa isa : supported_isas())
    for (DType t : {DType::kFloat32, DType::kBFloat16})
      for (int64_t head_dim : {2, 10, 32, 64, 128}) {
        std::mt19937 rng(static_cast<uint32_t>(head_dim));
        const int64_t tokens = 3, heads = 5, sh = head_dim + 2, st = heads * sh + 7, cs_stride = head_dim + 1;
        Buf x = make(t, tokens * st, rng), cs = make(t, tokens * cs_stride, rng);
        Buf before = x;
        RotaryParams p;
        p.x = x.mut();
        p.cos_sin = cs.data();
        p.num_tokens = tokens;
        p.num_heads = heads;
        p.head_dim = head_dim;
        p.x_stride_token = st;
        p.x_stride_head = sh;
        p.cos_sin_stride = cs_stride;
        p.dtype = t;
        CHECK(rotary_embedding(p, isa).is_ok());
        const bool bf = t == DType::kBFloat16;
        auto rnd = [&](float v) { return bf ? round_bf16(v) : v; };
        const int64_t half = head_dim / 2;
        for (int64_t tok = 0; tok < tokens; ++tok)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < half; ++i) {
              const int64_t at = tok * st + h * sh;
              const float a = before.values[at + i], b = before.values[at + half + i];
              const float c = cs.values[tok * cs_stride + i], s = cs.values[tok * cs_stride + half + i];
              const float want1 = rnd(rnd(a * c) - rnd(b * s)), want2 = rnd(rnd(b * c) + rnd(a * s));
              const float tol1 = bf ? 0.f : 1e-6f * (std::fabs(a * c) + std::fabs(b * s));
              const float tol2 = bf ? 0.f : 1e-6f * (std::fabs(b * c) + std::fabs(a * s));
              CHECK(std::fabs(x.at(at + i) - want1) <= tol1);
              CHECK(std::fabs(x.at(at + half + i) - want2) <= tol2);
            }
        // untouched: the gaps between heads and tokens
        for (int64_t tok = 0; tok < tokens; ++tok)
          for (int64_t g = heads * sh - 2; g < st; ++g) CHECK_EQ(x.at(tok * st + g), before.values[tok * st + g]);
      }
}

TEST(norm_ops_reject_bad_arguments) {
  std::vector<float> x(16, 1.f), w(8, 1.f), out(16, 0.f);
  RmsNormParams p;
  p.out = out.data();
  p.x = x.data();
  p.weight = w.data();
  p.rows = 2;
  p.n = 8;
  p.x_stride = 4;  // overlapping rows
  p.out_stride = 8;
  CHECK(!rms_norm(p).is_ok());
  p.x_stride = 8;
  p.weight = nullptr;
  CHECK(!rms_norm(p).is_ok());
  p.weight = w.data();
  CHECK(rms_norm(p).is_ok());
  RotaryParams r;
  r.x = x.data();
  r.cos_sin = w.data();
  r.num_tokens = 1;
  r.num_heads = 2;
  r.head_dim = 3;  // odd
  r.x_stride_head = 8;
  CHECK(!rotary_embedding(r).is_ok());
  r.head_dim = 4;
  r.x_stride_head = 2;  // heads overlap
  CHECK(!rotary_embedding(r).is_ok());
}

int main() { return pagedcore_test::run_all(); }
