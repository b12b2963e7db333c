// fp8 e4m3 weights with one fp32 scale per row (linear.h kDenseFp8E4M3, kDenseFp8E4M3x16) on every ISA this
// CPU runs: against a double loop of weight_scales[n] * x[m] . fp8_to_float(W[n]) (+ bias, SwiGLU, bf16 out),
// and bit for bit against the fp32 kernel on the widened copy in the same layout times the scale (the raw
// sums are that kernel's; the scale one multiply). Against bf16 x on the ISAs with the bf16 pair dot (K % 4 == 0),
// the x16 layout's raw sums are instead bf16x16's pair-dot sums on the weights' bf16 copy, bit for bit. Odd K (the
// scalar tail), N off the tile sizes, M 1 .. 20; the launcher's refusals (no scales, x16 rows not in groups of 16).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "kernel_buffers.h"
#include "kernels/fp8.h"
#include "kernels/linear.h"

using namespace pagedcore::kernels;
using pagedcore_test::pack_pairs_x16;
using pagedcore_test::pack_x16;
using pagedcore_test::round_bf16;
using pagedcore_test::supported_isas;

namespace {

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// A random e4m3 byte, any code but the NaN ones (0x7f, 0xff), which quantizers never write.
uint8_t random_e4m3(std::mt19937& rng) {
  for (;;) {
    const uint8_t b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) != 0x7f) return b;
  }
}


// One layer: fp8 bytes, their fp32 values, per-row scales, a bias, x in fp32 (and as bf16 bits).
struct Layer {
  int64_t M, N, K;
  std::vector<uint8_t> w8;   // [N, K] bytes
  std::vector<float> w32;    // [N, K] fp8_to_float of w8 (unscaled)
  std::vector<float> scales;  // [N]
  std::vector<float> bias;   // [N]
  std::vector<float> x;      // [M, K] fp32 (bf16-exact values when bf16 x is tested)
  std::vector<uint16_t> x16;  // [M, K] bf16 bits of x
};

Layer make_layer(int64_t M, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> scale(1e-3f, 4e-3f);
  Layer l{M, N, K, std::vector<uint8_t>(N * K), std::vector<float>(N * K), std::vector<float>(N),
          std::vector<float>(N), std::vector<float>(M * K), std::vector<uint16_t>(M * K)};
  for (int64_t i = 0; i < N * K; ++i) l.w32[i] = fp8_to_float<true>(l.w8[i] = random_e4m3(rng));
  for (int64_t n = 0; n < N; ++n) {
    l.scales[n] = (n % 5 == 3 ? -1.f : 1.f) * scale(rng);
    l.bias[n] = normal(rng);
  }
  for (int64_t i = 0; i < M * K; ++i) {
    l.x[i] = round_bf16(normal(rng));
    l.x16[i] = float_to_bf16(l.x[i]);
  }
  return l;
}

// A plain call's parameters over the layer (fp32 x, fp32 out, no bias, no epilogue).
LinearParams params(const Layer& l, const void* weight, WeightFormat format, void* out) {
  LinearParams p;
  p.out = out;
  p.x = l.x.data();
  p.weight = weight;
  p.weight_scales = l.scales.data();
  p.M = l.M;
  p.N = l.N;
  p.K = l.K;
  p.x_stride = l.K;
  p.out_stride = l.N;
  p.weight_format = format;
  return p;
}

void run(const LinearParams& p, Isa isa, const std::string& what) {
  const Status st = linear(p, isa);
  if (!st.is_ok()) throw pagedcore_test::Failure(what + ": " + st.message);
}

std::string name(Isa isa, bool x16, const Layer& l) {
  return std::string(isa_name(isa)) + (x16 ? " fp8_e4m3x16" : " fp8_e4m3") + " M=" + std::to_string(l.M) +
         " N=" + std::to_string(l.N) + " K=" + std::to_string(l.K);
}

// The shapes: odd K (a scalar tail on every ISA), N off the tile widths (x16: multiples of 16), M 1 .. 20.
struct Shape {
  int64_t M, N, K;
};
const Shape kRowShapes[] = {{1, 1, 1}, {1, 7, 13}, {2, 33, 37}, {3, 50, 64}, {4, 18, 101}, {5, 9, 576},
                            {7, 66, 45}, {13, 30, 17}, {20, 41, 130}, {1, 90, 1537}};
const Shape kX16Shapes[] = {{1, 16, 1}, {1, 48, 13}, {2, 32, 37}, {3, 64, 64}, {5, 80, 101}, {8, 16, 576},
                            {9, 96, 45}, {13, 32, 17}, {20, 160, 130}, {1, 48, 1537},
                            {6, 48, 128}, {11, 96, 36}, {1, 48, 1536}, {4, 144, 4}};  // (K % 4 == 0: the pair dot)

std::vector<Shape> shapes(bool x16) {
  return x16 ? std::vector<Shape>(std::begin(kX16Shapes), std::end(kX16Shapes))
             : std::vector<Shape>(std::begin(kRowShapes), std::end(kRowShapes));
}

// The ISAs whose fp8x16 kernel multiplies bf16 x on the bf16 pair dot (vdpbf16ps or its emulation).
bool pair_dot(Isa isa) { return isa == Isa::kAvx512Bf16 || isa == Isa::kGeneric16Bf16; }

}  // namespace

// kNone, fp32 out, fp32 or bf16 x: out[m, n] == float(raw[m, n] * scale[n]) bit for bit, raw the fp32 kernel's
// sums on the widened copy (checkpoint rows against dense_f32, x16 against f32x16); and with a bias
// (one more rounding, + bias[n]); and the values right against a double loop.
TEST(linear_fp8_sums_are_the_fp32_copys_times_the_scale) {
  uint32_t seed = 1;
  for (Isa isa : supported_isas())
    for (bool x16 : {false, true})
      for (const Shape& s : shapes(x16)) {
        const Layer l = make_layer(s.M, s.N, s.K, seed++);
        const std::vector<uint8_t> w8 = x16 ? pack_x16(l.w8, l.N, l.K) : l.w8;
        const std::vector<float> w32 = x16 ? pack_x16(l.w32, l.N, l.K) : l.w32;
        const WeightFormat f8 = x16 ? WeightFormat::kDenseFp8E4M3x16 : WeightFormat::kDenseFp8E4M3;
        const WeightFormat f32 = x16 ? WeightFormat::kDenseF32x16 : WeightFormat::kDenseF32;
        for (bool bf16_x : {false, true})
          for (bool bias : {false, true}) {
            const std::string what = name(isa, x16, l) + (bf16_x ? " bf16 x" : "") + (bias ? " bias" : "");
            std::vector<float> got(l.M * l.N, -1.f), raw(l.M * l.N, -2.f);
            LinearParams p = params(l, w8.data(), f8, got.data());
            if (bf16_x) {
              p.x = l.x16.data();
              p.x_dtype = DType::kBFloat16;
            }
            p.bias = bias ? l.bias.data() : nullptr;
            run(p, isa, what);
            LinearParams q = p;
            q.out = raw.data();
            q.weight = w32.data();
            q.weight_format = f32;
            q.weight_scales = nullptr;
            q.bias = nullptr;
            std::vector<uint16_t> w16;  // the bf16 copy in bf16x16's layout (the pair dot's reference)
            if (x16 && bf16_x && pair_dot(isa) && l.K % 4 == 0) {
              w16.resize(l.N * l.K);
              for (int64_t i = 0; i < l.N * l.K; ++i) w16[i] = float_to_bf16(l.w32[i]);  // (exact)
              w16 = pack_pairs_x16(w16, l.N, l.K);
              q.weight = w16.data();
              q.weight_format = WeightFormat::kDenseBf16x16;
            }
            run(q, isa, what + (w16.empty() ? " (fp32 copy)" : " (bf16x16 copy)"));
            for (int64_t m = 0; m < l.M; ++m)
              for (int64_t n = 0; n < l.N; ++n) {
                volatile float scaled = raw[m * l.N + n] * l.scales[n];  // (volatile: no fused multiply-add)
                const float want = bias ? scaled + l.bias[n] : scaled;
                const float have = got[m * l.N + n];
                if (std::memcmp(&have, &want, 4) != 0)
                  throw pagedcore_test::Failure(what + ": out[" + std::to_string(m) + ", " + std::to_string(n) +
                                                "] = " + std::to_string(have) + ", the fp32 copy's sum times the "
                                                "scale gives " + std::to_string(want));
                double dot = 0, mag = 0;
                for (int64_t k = 0; k < l.K; ++k) {
                  const double t = static_cast<double>(l.x[m * l.K + k]) * l.w32[n * l.K + k];
                  dot += t;
                  mag += std::fabs(t);
                }
                const double expect = dot * l.scales[n] + (bias ? l.bias[n] : 0.0);
                const double tol = 2e-6 * mag * std::fabs(l.scales[n]) + 2e-6 * std::fabs(expect) + 1e-6;
                if (!(std::fabs(have - expect) <= tol))
                  throw pagedcore_test::Failure(what + ": out = " + std::to_string(have) + ", expected " +
                                                std::to_string(expect));
              }
          }
      }
}

// The SwiGLU epilogue, each half scaled by its own rows' scales before the bias, fp32 and bf16 out, against a
// double loop (bf16 out rounds as torch does op by op).
TEST(linear_fp8_silu_mul_bias_and_bf16_out) {
  uint32_t seed = 1000;
  for (Isa isa : supported_isas())
    for (bool x16 : {false, true})
      for (const Shape& s : shapes(x16)) {
        const int64_t N = x16 ? (s.N % 32 ? s.N + 16 : s.N) : (s.N % 2 ? s.N + 1 : s.N);  // whole halves
        const Layer l = make_layer(s.M, N, s.K, seed++);
        const std::vector<uint8_t> w8 = x16 ? pack_x16(l.w8, N, l.K) : l.w8;
        const int64_t cols = N / 2;
        for (DType out_dtype : {DType::kFloat32, DType::kBFloat16}) {
          const bool bf16_out = out_dtype == DType::kBFloat16;
          const std::string what = name(isa, x16, l) + " silu_mul bias" + (bf16_out ? " bf16 out" : "");
          std::vector<float> out32(l.M * cols, -1.f);
          std::vector<uint16_t> out16(l.M * cols, 0);
          LinearParams p = params(l, w8.data(), x16 ? WeightFormat::kDenseFp8E4M3x16 : WeightFormat::kDenseFp8E4M3,
                                  bf16_out ? static_cast<void*>(out16.data()) : static_cast<void*>(out32.data()));
          p.bias = l.bias.data();
          p.epilogue = LinearEpilogue::kSiluMul;
          p.out_stride = cols;
          p.out_dtype = out_dtype;
          run(p, isa, what);
          for (int64_t m = 0; m < l.M; ++m)
            for (int64_t n = 0; n < cols; ++n) {
              auto row = [&](int64_t r, double* mag) {
                double dot = 0, a = 0;
                for (int64_t k = 0; k < l.K; ++k) {
                  const double t = static_cast<double>(l.x[m * l.K + k]) * l.w32[r * l.K + k];
                  dot += t;
                  a += std::fabs(t);
                }
                *mag = a * std::fabs(l.scales[r]) + std::fabs(l.bias[r]);
                return dot * l.scales[r] + l.bias[r];
              };
              double mag_g = 0, mag_u = 0;
              const double g = row(n, &mag_g), u = row(cols + n, &mag_u);
              double expect = silu(g) * u;
              double tol = 2e-6 * (mag_g * std::fabs(u) + mag_u * (std::fabs(g) + 1)) + 1e-6;
              if (bf16_out) {
                expect = static_cast<double>(round_bf16(static_cast<float>(silu(round_bf16(static_cast<float>(g)))))) *
                         round_bf16(static_cast<float>(u));
                tol = 3 * std::ldexp(std::fabs(expect), -8) +
                      2e-6 * (mag_g + mag_u) * (1 + std::fabs(u) + std::fabs(g)) + 1e-6;
              }
              const double got = bf16_out ? bf16_to_float(out16[m * cols + n]) : out32[m * cols + n];
              if (!(std::fabs(got - expect) <= tol))
                throw pagedcore_test::Failure(what + ": out[" + std::to_string(m) + ", " + std::to_string(n) +
                                              "] = " + std::to_string(got) + ", expected " + std::to_string(expect) +
                                              " (tol " + std::to_string(tol) + ")");
            }
        }
      }
}

// Every e4m3 code but NaN widens exactly (one weight row holding each code in turn, x = 1, scale = 1):
// subnormals, zeros of both signs, the largest finite 448, through the vector part and the scalar tail.
TEST(linear_fp8_widens_every_code_exactly) {
  for (Isa isa : supported_isas())
    for (int64_t K : {int64_t{1}, int64_t{16}, int64_t{23}})  // the tail, a whole vector, both
      for (int code = 0; code < 256; ++code) {
        if ((code & 0x7f) == 0x7f) continue;
        const std::vector<uint8_t> w(K, static_cast<uint8_t>(code));
        const std::vector<float> x(K, 1.f), scale = {1.f};
        float out = -1.f;
        LinearParams p;
        p.out = &out;
        p.x = x.data();
        p.weight = w.data();
        p.weight_scales = scale.data();
        p.M = p.N = 1;
        p.K = K;
        p.x_stride = K;
        p.out_stride = 1;
        p.weight_format = WeightFormat::kDenseFp8E4M3;
        run(p, isa, std::string(isa_name(isa)) + " code " + std::to_string(code));
        CHECK_EQ(out, static_cast<float>(K) * fp8_to_float<true>(static_cast<uint8_t>(code)));
      }
}

// The same through the x16 layout's bf16 conversion (the pair dot's, where the ISA has it; else the widening):
// 256 rows, row n holding code n at each of K = 4 (one conversion of 64 bytes per group), x = 1 in bf16.
TEST(linear_fp8_x16_converts_every_code_exactly_for_bf16_x) {
  constexpr int64_t N = 256, K = 4;
  std::vector<uint8_t> w(N * K);
  std::vector<float> scales(N, 1.f), out(N, -1.f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w[n * K + k] = (n & 0x7f) == 0x7f ? 0 : static_cast<uint8_t>(n);
  const std::vector<uint8_t> packed = pack_x16(w, N, K);
  const std::vector<uint16_t> x(K, float_to_bf16(1.f));
  for (Isa isa : supported_isas()) {
    LinearParams p;
    p.out = out.data();
    p.x = x.data();
    p.x_dtype = DType::kBFloat16;
    p.weight = packed.data();
    p.weight_scales = scales.data();
    p.M = 1;
    p.N = N;
    p.K = K;
    p.x_stride = K;
    p.out_stride = N;
    p.weight_format = WeightFormat::kDenseFp8E4M3x16;
    run(p, isa, std::string(isa_name(isa)) + " every code, bf16 x");
    for (int64_t n = 0; n < N; ++n) CHECK_EQ(out[n], 4.f * fp8_to_float<true>(w[n * K]));
  }
}

TEST(linear_fp8_refusals_write_nothing) {
  const Layer l = make_layer(3, 32, 8, 7);
  std::vector<float> out(3 * 32, -3.f);
  auto expect_invalid = [&](const LinearParams& p, const std::string& what, const std::string& says) {
    const Status st = linear(p);
    if (st.is_ok()) throw pagedcore_test::Failure("accepted: " + what);
    CHECK(st.code == Status::kInvalidArgument);
    if (st.message.find(says) == std::string::npos)
      throw pagedcore_test::Failure(what + ": the message does not say " + says + ": " + st.message);
    for (float v : out) CHECK_EQ(v, -3.f);
  };
  for (WeightFormat f : {WeightFormat::kDenseFp8E4M3, WeightFormat::kDenseFp8E4M3x16}) {
    LinearParams p = params(l, l.w8.data(), f, out.data());
    p.weight_scales = nullptr;
    expect_invalid(p, std::string(weight_format_name(f)) + " without scales", "weight_scales");
    p.M = 0;  // even a call with nothing to compute: the layer is mis-built
    expect_invalid(p, std::string(weight_format_name(f)) + " without scales, M = 0", "weight_scales");
    p = params(l, l.w8.data(), f, out.data());
    p.weight_scales = out.data() + 4;
    expect_invalid(p, std::string(weight_format_name(f)) + " with scales inside out", "weight_scales");
  }
  LinearParams p = params(l, l.w8.data(), WeightFormat::kDenseFp8E4M3x16, out.data());
  p.N = p.out_stride = 24;
  expect_invalid(p, "fp8_e4m3x16 with N = 24", "groups of 16");
  p.N = 48;  // (groups of 16, but SwiGLU halves of 24 outputs)
  p.out_stride = 24;
  p.epilogue = LinearEpilogue::kSiluMul;
  expect_invalid(p, "fp8_e4m3x16 SwiGLU halves of 24 columns", "multiple of 16");
}

TEST(linear_fp8_names_and_kernels) {
  CHECK_EQ(std::string(weight_format_name(WeightFormat::kDenseFp8E4M3)), std::string("fp8_e4m3"));
  CHECK_EQ(std::string(weight_format_name(WeightFormat::kDenseFp8E4M3x16)), std::string("fp8_e4m3x16"));
  CHECK(is_fp8_format(WeightFormat::kDenseFp8E4M3) && is_fp8_format(WeightFormat::kDenseFp8E4M3x16));
  CHECK(!is_fp8_format(WeightFormat::kDenseF16) && !is_fp8_format(WeightFormat::kInt8PerChannel));
  for (Isa isa : supported_isas()) {
    CHECK(has_dense_kernel(WeightFormat::kDenseFp8E4M3, isa));
    CHECK(has_dense_kernel(WeightFormat::kDenseFp8E4M3x16, isa));
    CHECK(!has_dense_kernel(WeightFormat::kQ4_0, isa));
  }
}

int main() { return pagedcore_test::run_all(); }
