// fp8 e4m3 x16 weights with block-wise scales (linear.h: weight_block_scales [N/16][KB], DeepSeek / Qwen3 FP8's
// 128 x 128 blocks) on every ISA this CPU runs, fp32 and bf16 x (the bf16 pair dot where the ISA has it, K % 4 == 0):
// against a double loop of sum_k x[m, k] * fp8_to_float(W[n, k]) * scale[n / 16][k / block_k]; each k-block's sum
// scaled as it ends, so the bound is float rounding of the sums. K off the block size (a short last block), blocks
// of 4 .. 256 inputs, row groups whose blocks differ; the SwiGLU epilogue with a bias and bf16 out; a layer whose
// blocks all share its rows' scale equals the per-row-scaled kernel; the launcher's refusals.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "kernel_buffers.h"
#include "kernels/fp8.h"
#include "kernels/linear.h"

using namespace pagedcore::kernels;
using pagedcore_test::pack_x16;
using pagedcore_test::round_bf16;
using pagedcore_test::supported_isas;

namespace {

struct BlockLayer {
  int64_t M, N, K, block_k, k_blocks;
  std::vector<uint8_t> w8;       // [N/16][K][16] e4m3 bytes (x16)
  std::vector<float> w32;        // [N, K] fp8_to_float, checkpoint order (unscaled)
  std::vector<float> scales;     // [N/16][k_blocks]
  std::vector<float> bias;       // [N]
  std::vector<float> x;          // [M, K] bf16-exact fp32 values
  std::vector<uint16_t> x16;     // [M, K] their bf16 bits
};

BlockLayer make_layer(int64_t M, int64_t N, int64_t K, int64_t block_k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> scale(1e-3f, 4e-3f);
  const int64_t k_blocks = (K + block_k - 1) / block_k;
  BlockLayer l{M, N, K, block_k, k_blocks, {}, std::vector<float>(N * K), std::vector<float>(N / 16 * k_blocks),
               std::vector<float>(N), std::vector<float>(M * K), std::vector<uint16_t>(M * K)};
  std::vector<uint8_t> rows(N * K);
  for (int64_t i = 0; i < N * K; ++i) {
    uint8_t b;
    do b = static_cast<uint8_t>(rng()); while ((b & 0x7f) == 0x7f);  // (not the NaN codes)
    l.w32[i] = fp8_to_float<true>(rows[i] = b);
  }
  l.w8 = pack_x16(rows, N, K);
  for (size_t i = 0; i < l.scales.size(); ++i) l.scales[i] = (i % 7 == 2 ? -1.f : 1.f) * scale(rng);
  for (float& b : l.bias) b = normal(rng);
  for (int64_t i = 0; i < M * K; ++i) l.x16[i] = float_to_bf16(l.x[i] = round_bf16(normal(rng)));
  return l;
}

LinearParams params(const BlockLayer& l, void* out, bool bf16_x) {
  LinearParams p;
  p.out = out;
  p.x = bf16_x ? static_cast<const void*>(l.x16.data()) : static_cast<const void*>(l.x.data());
  p.x_dtype = bf16_x ? DType::kBFloat16 : DType::kFloat32;
  p.weight = l.w8.data();
  p.weight_format = WeightFormat::kDenseFp8E4M3x16;
  p.weight_block_scales = l.scales.data();
  p.weight_block_k = l.block_k;
  p.M = l.M;
  p.N = l.N;
  p.K = l.K;
  p.x_stride = l.K;
  p.out_stride = l.N;
  return p;
}

// (sum over k of x * w * its block's scale, sum of the terms' magnitudes) in double.
void reference(const BlockLayer& l, int64_t m, int64_t n, double& dot, double& mag) {
  dot = 0;
  mag = 0;
  for (int64_t k = 0; k < l.K; ++k) {
    const double t = static_cast<double>(l.x[m * l.K + k]) * l.w32[n * l.K + k] *
                     l.scales[(n / 16) * l.k_blocks + k / l.block_k];
    dot += t;
    mag += std::fabs(t);
  }
}

void run(const LinearParams& p, Isa isa, const std::string& what) {
  const Status st = linear(p, isa);
  if (!st.is_ok()) throw pagedcore_test::Failure(what + ": " + st.message);
}

struct Shape {
  int64_t M, N, K, block_k;
};
// K a multiple of the block, K off it (a short last block), one block longer than K, blocks of 4 .. 256.
const Shape kShapes[] = {{1, 16, 128, 128}, {1, 48, 384, 128}, {3, 64, 300, 128}, {7, 32, 64, 256},
                         {2, 80, 36, 4},    {9, 96, 260, 64},  {1, 160, 1536, 128}, {13, 48, 37, 8},
                         {20, 32, 256, 128}, {6, 48, 130, 128}};

std::string name(Isa isa, const Shape& s, bool bf16_x) {
  return std::string(isa_name(isa)) + " M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" +
         std::to_string(s.K) + " block_k=" + std::to_string(s.block_k) + (bf16_x ? " bf16 x" : "");
}

}  // namespace

TEST(linear_fp8_block_scales_match_the_double_loop) {
  uint32_t seed = 1;
  for (Isa isa : supported_isas())
    for (const Shape& s : kShapes)
      for (bool bf16_x : {false, true})
        for (bool bias : {false, true}) {
          const BlockLayer l = make_layer(s.M, s.N, s.K, s.block_k, seed++);
          const std::string what = name(isa, s, bf16_x) + (bias ? " bias" : "");
          std::vector<float> got(l.M * l.N, -1.f);
          LinearParams p = params(l, got.data(), bf16_x);
          p.bias = bias ? l.bias.data() : nullptr;
          run(p, isa, what);
          for (int64_t m = 0; m < l.M; ++m)
            for (int64_t n = 0; n < l.N; ++n) {
              double dot, mag;
              reference(l, m, n, dot, mag);
              const double expect = dot + (bias ? l.bias[n] : 0.0);
              const double have = got[m * l.N + n];
              if (!(std::fabs(have - expect) <= 4e-6 * mag + 2e-6 * std::fabs(expect) + 1e-6))
                throw pagedcore_test::Failure(what + ": out[" + std::to_string(m) + ", " + std::to_string(n) +
                                              "] = " + std::to_string(have) + ", expected " + std::to_string(expect));
            }
        }
}

// Gate rows then up rows, each k-block scaled with its own rows' group, SiLU(g) * u + bias, fp32 and bf16 out.
TEST(linear_fp8_block_scales_silu_mul_bias_and_bf16_out) {
  uint32_t seed = 500;
  for (Isa isa : supported_isas())
    for (const Shape& s : kShapes) {
      const int64_t N = s.N % 32 ? s.N + 16 : s.N;  // whole 16-row groups in each half
      const BlockLayer l = make_layer(s.M, N, s.K, s.block_k, seed++);
      const int64_t cols = N / 2;
      for (DType out_dtype : {DType::kFloat32, DType::kBFloat16}) {
        const bool bf16_out = out_dtype == DType::kBFloat16;
        const std::string what = name(isa, s, false) + " silu_mul" + (bf16_out ? " bf16 out" : "");
        std::vector<float> out32(l.M * cols, -1.f);
        std::vector<uint16_t> out16(l.M * cols, 0);
        LinearParams p = params(l, bf16_out ? static_cast<void*>(out16.data()) : static_cast<void*>(out32.data()),
                                false);
        p.bias = l.bias.data();
        p.epilogue = LinearEpilogue::kSiluMul;
        p.out_stride = cols;
        p.out_dtype = out_dtype;
        run(p, isa, what);
        for (int64_t m = 0; m < l.M; ++m)
          for (int64_t c = 0; c < cols; ++c) {
            double g, gm, u, um;
            reference(l, m, c, g, gm);
            reference(l, m, cols + c, u, um);
            g += l.bias[c];
            u += l.bias[cols + c];
            const double expect = g / (1.0 + std::exp(-g)) * u;
            const double have = bf16_out ? bf16_to_float(out16[m * cols + c]) : out32[m * cols + c];
            const double tol = (bf16_out ? 1.6e-2 : 1e-5) * std::fabs(expect) + 1e-4 * (gm + um) + 1e-5;
            if (!(std::fabs(have - expect) <= tol))
              throw pagedcore_test::Failure(what + ": out[" + std::to_string(m) + ", " + std::to_string(c) + "] = " +
                                            std::to_string(have) + ", expected " + std::to_string(expect));
          }
      }
    }
}

// Every block of a row group at the group's one scale: the per-row-scaled kernel's values (within rounding: the
// block form scales each block's sum, the row form the whole sum once).
TEST(linear_fp8_uniform_block_scales_equal_row_scales) {
  for (Isa isa : supported_isas()) {
    BlockLayer l = make_layer(5, 64, 512, 128, 77);
    std::vector<float> row_scales(l.N);
    for (int64_t n = 0; n < l.N; ++n) row_scales[n] = l.scales[(n / 16) * l.k_blocks];
    for (int64_t g = 0; g < l.N / 16; ++g)
      for (int64_t kb = 0; kb < l.k_blocks; ++kb) l.scales[g * l.k_blocks + kb] = l.scales[g * l.k_blocks];
    std::vector<float> blocks(l.M * l.N), rows(l.M * l.N);
    LinearParams p = params(l, blocks.data(), false);
    run(p, isa, std::string(isa_name(isa)) + " block scales");
    p.out = rows.data();
    p.weight_block_scales = nullptr;
    p.weight_scales = row_scales.data();
    run(p, isa, std::string(isa_name(isa)) + " row scales");
    for (int64_t i = 0; i < l.M * l.N; ++i)
      CHECK(std::fabs(blocks[i] - rows[i]) <= 1e-5f * (std::fabs(rows[i]) + 1.f));
  }
}

TEST(linear_fp8_block_scales_refusals) {
  BlockLayer l = make_layer(2, 32, 64, 32, 9);
  std::vector<float> out(l.M * l.N);
  auto refused = [&](LinearParams p, const char* needle, const std::string& what) {
    const Status st = linear(p);
    CHECK(!st.is_ok());
    if (st.message.find(needle) == std::string::npos)
      throw pagedcore_test::Failure(what + ": the message '" + st.message + "' does not name " + needle);
  };
  LinearParams p = params(l, out.data(), false);
  p.weight_format = WeightFormat::kDenseFp8E4M3;  // the row layout has no block-scaled kernel
  refused(p, "fp8_e4m3x16 weights only", "row layout");
  p = params(l, out.data(), false);
  p.weight_block_k = 6;
  refused(p, "multiple of 4", "block_k 6");
  p.weight_block_k = 0;
  refused(p, "multiple of 4", "block_k 0");
  p = params(l, out.data(), false);
  p.weight_block_scales = nullptr;
  refused(p, "weight_scales", "no scales at all");
  p = params(l, out.data(), false);
  p.weight_block_scales = out.data();
  refused(p, "overlaps", "block scales inside out");
}

int main() { return pagedcore_test::run_all(); }
