// The quantized linear kernels (linear() with a quantized WeightFormat) against a double-precision
// reference on every ISA path this CPU runs: x quantized by the kernels' own quantize_x_rows, W
// dequantised by a scalar transcription of ggml's formulas (quant_blocks.h; the Python test checks
// the same kernels against the gguf package's dequantizers), random blocks, odd M, N not a multiple
// of the tiles, bias, SwiGLU, bf16 x and out. Then the launcher's error statuses.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/linear.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_linear.h"

using namespace pagedcore::kernels;

namespace {

const WeightFormat kFormats[] = {WeightFormat::kQ8_0, WeightFormat::kQ4_0, WeightFormat::kQ4_1, WeightFormat::kQ5_0,
                                 WeightFormat::kQ5_1, WeightFormat::kQ4_K, WeightFormat::kQ5_K, WeightFormat::kQ6_K,
                                 WeightFormat::kInt8PerChannel};
const Isa kQuantIsas[] = {Isa::kGeneric, Isa::kGeneric16, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni,
                          Isa::kAvx512Bf16};

double half(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double v = e == 0 ? m * std::ldexp(1.0, -24) : (1024 + m) * std::ldexp(1.0, e - 25);
  return h & 0x8000 ? -v : v;
}
uint16_t read16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// ggml's dequantisation of one row (K weights) from its bytes.
std::vector<double> dequant_row(WeightFormat f, const uint8_t* row, int64_t K, float scale) {
  std::vector<double> w(K);
  if (f == WeightFormat::kInt8PerChannel) {
    for (int64_t k = 0; k < K; ++k) w[k] = static_cast<int8_t>(row[k]) * static_cast<double>(scale);
    return w;
  }
  const int64_t bs = quant_block_size(f), bb = quant_row_bytes(f, bs);
  for (int64_t b = 0; b < K / bs; ++b) {
    const uint8_t* p = row + b * bb;
    double* y = w.data() + b * bs;
    if (f == WeightFormat::kQ8_0) {
      for (int j = 0; j < 32; ++j) y[j] = half(read16(p)) * static_cast<int8_t>(p[2 + j]);
    } else if (f == WeightFormat::kQ4_0 || f == WeightFormat::kQ4_1) {
      const bool one = f == WeightFormat::kQ4_1;
      const uint8_t* qs = p + (one ? 4 : 2);
      const double d = half(read16(p)), m = one ? half(read16(p + 2)) : -8 * d;
      for (int j = 0; j < 16; ++j) {
        y[j] = d * (qs[j] & 15) + m;
        y[j + 16] = d * (qs[j] >> 4) + m;
      }
    } else if (f == WeightFormat::kQ5_0 || f == WeightFormat::kQ5_1) {
      const bool one = f == WeightFormat::kQ5_1;
      const uint8_t* qh = p + (one ? 4 : 2);
      const uint8_t* qs = qh + 4;
      const double d = half(read16(p)), m = one ? half(read16(p + 2)) : -16 * d;
      for (int j = 0; j < 16; ++j) {
        y[j] = d * ((qs[j] & 15) | ((qh[j / 8] >> (j % 8) & 1) << 4)) + m;
        y[j + 16] = d * ((qs[j] >> 4) | ((qh[2 + j / 8] >> (j % 8) & 1) << 4)) + m;
      }
    } else if (f == WeightFormat::kQ4_K || f == WeightFormat::kQ5_K) {
      const double d = half(read16(p)), dmin = half(read16(p + 2));
      const uint8_t* sc = p + 4;
      const uint8_t* qh = p + 16;
      const uint8_t* qs = p + (f == WeightFormat::kQ5_K ? 48 : 16);
      for (int s = 0; s < 8; ++s) {
        const int scale = s < 4 ? sc[s] & 63 : (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        const int min = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
        for (int l = 0; l < 32; ++l) {
          int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
          if (f == WeightFormat::kQ5_K) q += ((qh[l] >> s) & 1) << 4;
          y[32 * s + l] = d * scale * q - dmin * min;
        }
      }
    } else {  // Q6_K
      const uint8_t* ql = p;
      const uint8_t* qh = p + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
      const double d = half(read16(p + 208));
      for (int i = 0; i < 256; ++i) {
        const int h = i / 128, t = (i % 128) / 32, l = i % 32;
        const int lo = (ql[64 * h + 32 * (t & 1) + l] >> (4 * (t >> 1))) & 15;
        const int hi = (qh[32 * h + l] >> (2 * t)) & 3;
        y[i] = d * sc[i / 16] * ((lo | (hi << 4)) - 32);
      }
    }
  }
  return w;
}

// Random blocks: random bytes, then fp16 scales of both signs around 2^-6 .. 2^-9 (tiny for Q6_K
// whose int8 scales are large) written over each block's fp16 fields.
std::vector<uint8_t> random_weight(WeightFormat f, int64_t N, int64_t K, std::mt19937& rng) {
  const int64_t rb = quant_row_bytes(f, K);
  std::vector<uint8_t> w(N * rb);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  if (f == WeightFormat::kInt8PerChannel) return w;
  const int64_t bs = quant_block_size(f), bb = quant_row_bytes(f, bs);
  std::vector<int> fields;
  int exp = 9;
  switch (f) {
    case WeightFormat::kQ8_0: fields = {0}; break;
    case WeightFormat::kQ4_0: fields = {0}; break;
    case WeightFormat::kQ4_1: fields = {0, 2}; break;
    case WeightFormat::kQ5_0: fields = {0}; break;
    case WeightFormat::kQ5_1: fields = {0, 2}; break;
    case WeightFormat::kQ6_K: fields = {208}; exp = 3; break;
    default: fields = {0, 2}; exp = 5; break;
  }
  for (int64_t b = 0; b < N * K / bs; ++b)
    for (int off : fields) {
      const uint16_t h = static_cast<uint16_t>((rng() & 0x8000) | ((exp + rng() % 3) << 10) | (rng() & 1023));
      std::memcpy(&w[b * bb + off], &h, 2);
    }
  return w;
}

void check_format(WeightFormat f, Isa isa, int64_t M, int64_t N, int64_t K, DType x_dtype, DType out_dtype,
                  bool bias, bool silu, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const std::vector<uint8_t> w = random_weight(f, N, K, rng);
  std::vector<float> scales(N), bias_v(N);
  for (auto& s : scales) s = 0.01f + 0.001f * (rng() % 16);
  for (auto& b : bias_v) b = normal(rng);
  std::vector<float> x32(M * K);
  for (auto& v : x32) v = normal(rng);
  std::vector<uint16_t> x16(M * K);
  for (int64_t i = 0; i < M * K; ++i) {
    x16[i] = float_to_bf16(x32[i]);
    if (x_dtype == DType::kBFloat16) x32[i] = bf16_to_float(x16[i]);
  }
  // Reference: the kernels' activation quantization, dequantised W, float64 sums.
  const int64_t block = f == WeightFormat::kInt8PerChannel ? K : quant_block_size(f);
  const int64_t qs = (K + 63) / 64 * 64;
  std::vector<int8_t> q(M * qs);
  std::vector<float> d(M * (K / block)), s(M * (K / 32) + 1);
  std::vector<int16_t> bsum(M * (K / 16) + 1);
  QuantizedX qx{q.data(), qs, d.data(), K / block, s.data(), K / 32, bsum.data(), K / 16};
  quantize_x_rows(x32.data(), DType::kFloat32, K, K, block, 0, M, qx);
  const int64_t out_cols = silu ? N / 2 : N;
  std::vector<double> ref(M * N), mag(M * N);
  for (int64_t n = 0; n < N; ++n) {
    const std::vector<double> wr = dequant_row(f, w.data() + n * quant_row_bytes(f, K), K, scales[n]);
    for (int64_t m = 0; m < M; ++m) {
      double acc = bias ? bias_v[n] : 0.0, a = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double xv = q[m * qs + k] * static_cast<double>(d[m * (K / block) + k / block]);
        acc += xv * wr[k];
        a += std::fabs(xv * wr[k]);
      }
      ref[m * N + n] = acc;
      mag[m * N + n] = a + (bias ? std::fabs(bias_v[n]) : 0.0);
    }
  }
  LinearParams p;
  std::vector<float> out32(M * out_cols, -7.f);
  std::vector<uint16_t> out16(M * out_cols, 0);
  p.out = out_dtype == DType::kFloat32 ? static_cast<void*>(out32.data()) : static_cast<void*>(out16.data());
  p.x = x_dtype == DType::kFloat32 ? static_cast<const void*>(x32.data()) : static_cast<const void*>(x16.data());
  p.weight = w.data();
  p.weight_scales = f == WeightFormat::kInt8PerChannel ? scales.data() : nullptr;
  p.bias = bias ? bias_v.data() : nullptr;
  p.M = M, p.N = N, p.K = K, p.x_stride = K, p.out_stride = out_cols;
  p.x_dtype = x_dtype, p.out_dtype = out_dtype, p.weight_format = f;
  p.epilogue = silu ? LinearEpilogue::kSiluMul : LinearEpilogue::kNone;
  const Status st = linear(p, isa);
  CHECK(st.is_ok());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < out_cols; ++c) {
      double want = ref[m * N + c], tol = 2e-5 * mag[m * N + c] + 1e-6;
      if (silu) {
        const double g = ref[m * N + c], u = ref[m * N + out_cols + c];
        want = g / (1 + std::exp(-g)) * u;
        tol = 2e-5 * (mag[m * N + c] * (std::fabs(u) + 1) + mag[m * N + out_cols + c] * (std::fabs(g) + 1)) + 1e-6;
      }
      const double got = out_dtype == DType::kFloat32 ? out32[m * out_cols + c] : bf16_to_float(out16[m * out_cols + c]);
      if (out_dtype == DType::kBFloat16) tol += std::fabs(want) * (silu ? 3.0 : 1.0) / 256;
      if (!(std::fabs(got - want) <= tol))
        throw pagedcore_test::Failure(std::string(weight_format_name(f)) + " on " + isa_name(isa) + ": out[" +
                                      std::to_string(m) + "," + std::to_string(c) + "] = " + std::to_string(got) +
                                      ", want " + std::to_string(want) + " +- " + std::to_string(tol));
    }
}

int64_t test_k(WeightFormat f) {
  if (f == WeightFormat::kInt8PerChannel) return 100;  // not a multiple of 32: the scalar tail
  return quant_block_size(f) == 256 ? 512 : 352;       // 2 super-blocks; 11 blocks (a group of 8 + 3)
}

}  // namespace

TEST(quant_linear_matches_reference_on_every_isa) {
  const DType f32 = DType::kFloat32, b16 = DType::kBFloat16;
  int ran = 0;
  for (Isa isa : kQuantIsas) {
    if (!isa_supported(isa)) {
      std::printf("  quant_linear: %s SKIPPED (this CPU or build lacks it)\n", isa_name(isa));
      continue;
    }
    ++ran;
    for (WeightFormat f : kFormats) {
      const int64_t K = test_k(f);
      check_format(f, isa, 1, 22, K, f32, f32, false, false, 1);
      check_format(f, isa, 5, 22, K, b16, b16, true, false, 2);
      check_format(f, isa, 7, 26, K, b16, f32, true, true, 3);
      check_format(f, isa, 70, 38, K, f32, f32, false, false, 4);   // past the streaming rows: tasks
      check_format(f, isa, 37, 18, K, f32, b16, false, true, 5);
    }
  }
  CHECK(ran >= 2);  // the portable paths always run
}

TEST(quant_linear_refuses_bad_calls) {
  std::vector<uint8_t> w(4 * 34 * 2, 0);
  std::vector<float> x(64, 1.f), out(8, -7.f);
  LinearParams p;
  p.out = out.data(), p.x = x.data(), p.weight = w.data();
  p.M = 1, p.N = 4, p.K = 48, p.x_stride = 48, p.out_stride = 4;
  p.weight_format = WeightFormat::kQ8_0;
  Status st = linear(p, Isa::kGeneric);
  CHECK(!st.is_ok());
  CHECK(st.message.find("blocks of 32") != std::string::npos);
  p.K = 64;
  p.weight_format = WeightFormat::kInt8PerChannel;
  st = linear(p, Isa::kGeneric);
  CHECK(st.message.find("weight_scales") != std::string::npos);
  p.weight_format = WeightFormat::kQ4_K;
  st = linear(p, Isa::kGeneric);
  CHECK(st.message.find("blocks of 256") != std::string::npos);
  p.weight_format = WeightFormat::kQ8_0;
  st = linear(p, Isa::kAmxInt8);
  CHECK(st.message.find("amx_int8") != std::string::npos);
  for (float v : out) CHECK_EQ(v, -7.f);  // nothing written on error
  CHECK(linear(p, Isa::kGeneric).is_ok());
  for (int i = 0; i < 4; ++i) CHECK_EQ(out[i], 0.f);  // all-zero blocks
}

TEST(quant_isa_rule) {
  CHECK(quant_kernel_isa(Isa::kGeneric16Bf16, false) == Isa::kGeneric16);
  if (isa_supported(Isa::kAvx512Vnni)) {
    CHECK(quant_kernel_isa(Isa::kAvx512, true) == Isa::kAvx512Vnni);
    CHECK(quant_kernel_isa(Isa::kAvx512, false) == Isa::kAvx512);
  }
  if (isa_supported(Isa::kAvx512Bf16))
    CHECK(quant_kernel_isa(Isa::kAvx512Bf16, false) ==
          (isa_supported(Isa::kAvx512Vnni) ? Isa::kAvx512Vnni : Isa::kAvx512));
  CHECK(!isa_supported(Isa::kAmxInt8));
}

int main() { return pagedcore_test::run_all(); }
