// The linear kernel against a naive double loop: every ISA this CPU runs (the AVX-512 tilings and
// the AVX512-BF16 dot products through their portable emulations), fp32 and bf16 x / weights /
// bias / out, K and N not multiples of the vector width, strided rows, many tasks, the SwiGLU
// epilogue; fp16 weights (rows and x16) bit for bit against their fp32 copy; and the launcher's error
// statuses (nothing written on error). norm.h: test_norm.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "check.h"
#include "kernel_buffers.h"
#include "kernels/linear.h"

using namespace pagedcore::kernels;
using pagedcore_test::all_isas;
using pagedcore_test::Buf;
using pagedcore_test::make;
using pagedcore_test::pack_x16;
using pagedcore_test::round_bf16;
using pagedcore_test::supported_isas;
using pagedcore_test::zeros;

namespace {

double silu(double g) { return g / (1.0 + std::exp(-g)); }

struct Case {
  int64_t M, N, K;
  DType x, w, bias, out;
  bool has_bias;
  LinearEpilogue epilogue;
  int64_t x_pad, out_pad;  // extra elements per row (strided rows)
};

std::string describe(const Case& c, Isa isa) {
  auto d = [](DType t) { return t == DType::kFloat32 ? "f32" : "bf16"; };
  return std::string(isa_name(isa)) + " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
         " K=" + std::to_string(c.K) + " x=" + d(c.x) + " w=" + d(c.w) + " out=" + d(c.out) +
         (c.has_bias ? std::string(" bias=") + d(c.bias) : "") +
         (c.epilogue == LinearEpilogue::kSiluMul ? " silu_mul" : "") + " x_pad=" + std::to_string(c.x_pad) +
         " out_pad=" + std::to_string(c.out_pad);
}

void run_case(const Case& c, Isa isa, uint32_t seed) {
  std::mt19937 rng(seed);
  const bool silu_mul = c.epilogue == LinearEpilogue::kSiluMul;
  const int64_t cols = silu_mul ? c.N / 2 : c.N;
  const int64_t xs = c.K + c.x_pad, os = cols + c.out_pad;
  Buf x = make(c.x, c.M * xs, rng);
  Buf w = make(c.w, c.N * c.K, rng, 1.f / std::sqrt(static_cast<float>(std::max<int64_t>(c.K, 1))));
  Buf bias = make(c.bias, c.N, rng, 0.5f);
  Buf out = zeros(c.out, c.M * os, -7.f);  // padding must stay -7
  LinearParams p;
  p.out = out.mut();
  p.x = x.data();
  p.weight = w.data();
  p.bias = c.has_bias ? bias.data() : nullptr;
  p.M = c.M;
  p.N = c.N;
  p.K = c.K;
  p.x_stride = xs;
  p.out_stride = os;
  p.x_dtype = c.x;
  p.weight_format = dense_weight_format(c.w);
  p.bias_dtype = c.bias;
  p.out_dtype = c.out;
  p.epilogue = c.epilogue;
  Status st = linear(p, isa);
  CHECK(st.is_ok());
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < cols; ++n) {
      auto dot = [&](int64_t row, double* mag) {
        double s = c.has_bias ? bias.values[row] : 0.0, a = c.has_bias ? std::fabs(bias.values[row]) : 0.0;
        for (int64_t k = 0; k < c.K; ++k) {
          s += static_cast<double>(x.values[m * xs + k]) * w.values[row * c.K + k];
          a += std::fabs(static_cast<double>(x.values[m * xs + k]) * w.values[row * c.K + k]);
        }
        *mag = a;
        return s;
      };
      double mag_g = 0, mag_u = 0;
      const double g = dot(n, &mag_g);
      double expect = g, tol = 2e-6 * mag_g + 1e-6;
      if (silu_mul) {
        const double u = dot(cols + n, &mag_u);
        if (c.out == DType::kBFloat16) {
          expect = static_cast<double>(round_bf16(static_cast<float>(silu(round_bf16(static_cast<float>(g)))))) *
                   round_bf16(static_cast<float>(u));
          tol = 3 * std::ldexp(std::fabs(expect), -8) + 2e-6 * (mag_g + mag_u) * (1 + std::fabs(u) + std::fabs(g)) + 1e-6;
        } else {
          expect = silu(g) * u;
          tol = 2e-6 * (mag_g * std::fabs(u) + mag_u * (std::fabs(g) + 1)) + 1e-6;
        }
      } else if (c.out == DType::kBFloat16) {
        tol = std::ldexp(std::fabs(expect), -8) + 2e-6 * mag_g + 1e-6;
      }
      const double got = out.at(m * os + n);
      if (!(std::fabs(got - expect) <= tol)) {
        throw pagedcore_test::Failure(describe(c, isa) + ": out[" + std::to_string(m) + ", " + std::to_string(n) +
                                      "] = " + std::to_string(got) + ", expected " + std::to_string(expect) +
                                      " (tol " + std::to_string(tol) + ")");
      }
    }
    for (int64_t n = cols; n < os; ++n) CHECK_EQ(out.at(m * os + n), -7.f);
  }
}

}  // namespace

TEST(linear_matches_naive_loop_for_every_isa_and_dtype) {
  const DType f = DType::kFloat32, b = DType::kBFloat16;
  const int64_t shapes[][3] = {{1, 1, 1}, {1, 7, 13}, {1, 64, 576}, {2, 33, 40}, {3, 17, 33},
                               {4, 24, 64}, {5, 40, 100}, {7, 9, 31}, {16, 96, 70}, {1, 130, 48}};
  uint32_t seed = 1;
  for (Isa isa : supported_isas())
    for (auto& s : shapes)
      for (DType xd : {f, b})
        for (DType wd : {f, b})
          for (DType od : {f, b}) {
            const bool bias = (seed % 3) == 0;
            run_case({s[0], s[1], s[2], xd, wd, (seed % 2) ? f : b, od, bias, LinearEpilogue::kNone,
                      static_cast<int64_t>(seed % 4), static_cast<int64_t>((seed / 2) % 3)},
                     isa, seed);
            ++seed;
          }
}

TEST(linear_silu_mul_epilogue) {
  const DType f = DType::kFloat32, b = DType::kBFloat16;
  uint32_t seed = 100;
  for (Isa isa : supported_isas())
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 2, 8}, {1, 96, 64}, {3, 50, 37}, {6, 34, 96}})
      for (DType d : {f, b})
        for (bool bias : {false, true}) {
          run_case({M, N, K, d, d, d, d, bias, LinearEpilogue::kSiluMul, 1, 2}, isa, seed);
          ++seed;
        }
}

TEST(linear_many_tasks_and_row_blocks) {
  const DType f = DType::kFloat32, b = DType::kBFloat16;
  for (Isa isa : supported_isas()) {
    set_linear_tuning({8, 12});  // 8 output columns x 12 rows per task: many tasks, ragged edges
    run_case({37, 61, 45, f, f, f, f, true, LinearEpilogue::kNone, 3, 1}, isa, 7);
    run_case({37, 61, 45, b, b, b, b, false, LinearEpilogue::kNone, 0, 0}, isa, 8);
    run_case({29, 42, 64, b, b, b, b, true, LinearEpilogue::kSiluMul, 0, 5}, isa, 9);
    set_linear_tuning({});
    run_case({300, 20, 100, b, b, f, b, false, LinearEpilogue::kNone, 0, 0}, isa, 10);  // parallel x conversion
    run_case({64, 200, 576, f, f, f, f, false, LinearEpilogue::kNone, 0, 0}, isa, 11);
  }
}

// Random IEEE fp16 bits: normals of magnitude ~2^-6 .. 2^2 and, one in eight, subnormals (no inf / NaN).
uint16_t random_f16(std::mt19937& rng) {
  const uint32_t r = rng();
  const uint32_t exp = (r & 7u) == 0 ? 0u : 9u + (r >> 3) % 9u, man = (r >> 8) & 0x3ffu;
  return static_cast<uint16_t>(((r >> 20) & 1u) << 15 | exp << 10 | man);
}


// fp16 weights widen exactly: every output equals, bit for bit, the fp32 kernel's on the widened copy in the
// same layout (checkpoint rows against dense_f32, x16 against f32x16), for every ISA, with bias and SwiGLU.
TEST(linear_f16_weights_equal_their_fp32_copy_bit_for_bit) {
  uint32_t seed = 500;
  for (Isa isa : supported_isas())
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 16, 1}, {1, 48, 576}, {3, 32, 37},
                           {5, 64, 100}, {9, 96, 70}, {40, 80, 64}, {1, 160, 1536}})
      for (bool x16 : {false, true})
        for (int variant = 0; variant < 2; ++variant) {  // 0: plain, fp32 out; 1: bias, SwiGLU, bf16 out
          std::mt19937 rng(seed++);
          std::vector<uint16_t> w16(N * K);
          std::vector<float> w32(N * K), x(M * K), bias(N);
          for (int64_t i = 0; i < N * K; ++i) w32[i] = fp16_to_float(w16[i] = random_f16(rng));
          std::normal_distribution<float> normal(0.f, 1.f);
          for (float& v : x) v = normal(rng);
          for (float& v : bias) v = normal(rng);
          const std::vector<uint16_t> wf16 = x16 ? pack_x16(w16, N, K) : w16;
          const std::vector<float> wf32 = x16 ? pack_x16(w32, N, K) : w32;
          const bool silu = variant == 1;
          if (silu && x16 && N % 32) continue;  // x16 SwiGLU halves are whole 16-column groups
          const int64_t cols = silu ? N / 2 : N;
          std::vector<float> out16(M * cols, -1.f), out32(M * cols, -2.f);
          LinearParams p;
          p.x = x.data();
          p.bias = silu ? bias.data() : nullptr;
          p.M = M;
          p.N = N;
          p.K = K;
          p.x_stride = K;
          p.out_stride = cols;
          p.out_dtype = DType::kFloat32;
          p.epilogue = silu ? LinearEpilogue::kSiluMul : LinearEpilogue::kNone;
          p.out = out16.data();
          p.weight = wf16.data();
          p.weight_format = x16 ? WeightFormat::kDenseF16x16 : WeightFormat::kDenseF16;
          const Status st = linear(p, isa);
          if (!st.is_ok()) throw pagedcore_test::Failure(std::string(isa_name(isa)) + ": " + st.message);
          p.out = out32.data();
          p.weight = wf32.data();
          p.weight_format = x16 ? WeightFormat::kDenseF32x16 : WeightFormat::kDenseF32;
          CHECK(linear(p, isa).is_ok());
          for (int64_t i = 0; i < M * cols; ++i)
            if (std::memcmp(&out16[i], &out32[i], 4) != 0)
              throw pagedcore_test::Failure(std::string(isa_name(isa)) + (x16 ? " f16x16" : " dense_f16") + " M=" +
                                            std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                            ": out[" + std::to_string(i) + "] = " + std::to_string(out16[i]) +
                                            ", the fp32 copy gives " + std::to_string(out32[i]));
          // ...and the sums are right (against a double loop, plain variant).
          if (!silu)
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n) {
                double s = 0, a = 0;
                for (int64_t k = 0; k < K; ++k) {
                  s += static_cast<double>(x[m * K + k]) * w32[n * K + k];
                  a += std::fabs(static_cast<double>(x[m * K + k]) * w32[n * K + k]);
                }
                CHECK(std::fabs(out16[m * N + n] - s) <= 2e-6 * a + 1e-6);
              }
        }
}

TEST(linear_k_zero_gives_bias) {
  std::vector<float> out(6, -1.f), bias = {1, 2, 3};
  LinearParams p;
  p.out = out.data();
  p.bias = bias.data();
  p.M = 2;
  p.N = 3;
  p.K = 0;
  p.x_stride = 0;
  p.out_stride = 3;
  CHECK(linear(p).is_ok());
  CHECK_EQ(out, (std::vector<float>{1, 2, 3, 1, 2, 3}));
}

TEST(linear_errors_write_nothing) {
  std::vector<float> x(4 * 8, 1.f), w(6 * 8, 1.f), out(4 * 6, -3.f);
  auto base = [&] {
    LinearParams p;
    p.out = out.data();
    p.x = x.data();
    p.weight = w.data();
    p.M = 4;
    p.N = 6;
    p.K = 8;
    p.x_stride = 8;
    p.out_stride = 6;
    return p;
  };
  auto expect_invalid = [&](LinearParams p, const char* what) {
    Status st = linear(p);
    if (st.is_ok()) throw pagedcore_test::Failure(std::string("accepted: ") + what);
    CHECK(st.code == Status::kInvalidArgument);
    for (float v : out) CHECK_EQ(v, -3.f);
  };
  LinearParams p = base();
  p.x = nullptr;
  expect_invalid(p, "null x");
  p = base();
  p.x_stride = 7;
  expect_invalid(p, "x_stride < K");
  p = base();
  p.out_stride = 5;
  expect_invalid(p, "out_stride < N");
  p = base();
  p.N = 5;
  p.epilogue = LinearEpilogue::kSiluMul;
  expect_invalid(p, "odd N with silu_mul");
  p = base();
  p.out = x.data();
  expect_invalid(p, "out overlapping x");
  p = base();
  p.M = -1;
  expect_invalid(p, "negative M");
  p = base();
  p.x_dtype = static_cast<DType>(7);
  expect_invalid(p, "unknown dtype");
  for (WeightFormat f : {WeightFormat::kInt8PerChannel, WeightFormat::kQ4_0, WeightFormat::kQ4_1, WeightFormat::kQ8_0}) {
    p = base();
    p.weight_format = f;
    expect_invalid(p, weight_format_name(f));  // named room: no kernel yet
  }
  for (Isa isa : all_isas())
    if (!isa_supported(isa)) {
      Status st = linear(base(), isa);
      CHECK(!st.is_ok());
    }
  CHECK(linear(base()).is_ok());
  CHECK_EQ(out[0], 8.f);
}

TEST(read_probe_sums_the_buffer) {
  std::vector<float> data(1000 * 16 + 5, 0.5f);
  for (Isa isa : supported_isas())
    for (int threads : {1, 2}) {
      const float s = read_probe(data.data(), static_cast<int64_t>(data.size() * 4), threads, isa);
      CHECK(std::fabs(s - 0.5f * data.size()) < 1e-2f);
    }
}

int main() { return pagedcore_test::run_all(); }
