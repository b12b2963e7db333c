// Each ISA unit's activation quantizer (QuantIsaKernels::quantize_rows) against the portable
// quantize_x_rows, byte for byte: q, the block scales d, the 32-sums s and the 16-sums bsum, for fp32
// and bf16 rows, blocks of 32, 256 and a whole row (int8 per channel, K not a multiple of 8 or 16),
// with values on rounding ties, zero rows, outliers and NaNs.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "check.h"
#include "kernels/cpu_isa.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_linear.h"

using namespace pagedcore::kernels;

namespace {

struct Quantized {  // QuantizedX's buffers
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int16_t> bsum;
  QuantizedX qx;
  Quantized(int64_t M, int64_t K, int64_t block) {
    qx.q_stride = (K + 32 + 63) / 64 * 64;
    qx.d_stride = std::max<int64_t>(1, K / block);
    q.assign(M * qx.q_stride, 99);  // not zero: the padding must be written
    d.assign(M * qx.d_stride, -1.f);
    qx.q = q.data();
    qx.d = d.data();
    if (block == kBlock32) {
      qx.s_stride = K / kBlock32;
      s.assign(M * qx.s_stride, -1.f);
      qx.s = s.data();
    } else if (block == kBlockK) {
      qx.bsum_stride = K / 16;
      bsum.assign(M * qx.bsum_stride, -1);
      qx.bsum = bsum.data();
    }
  }
};

uint16_t to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// Rows of x with the awkward values: ties at the scale's half steps, a zero row, one huge outlier, a NaN.
std::vector<float> rows(int64_t M, int64_t K, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(M * K);
  for (auto& v : x) v = normal(rng);
  for (int64_t k = 0; k < K; ++k) x[1 * K + k] = 0.f;                         // row 1: zeros
  for (int64_t k = 0; k < K; ++k) x[2 * K + k] = 0.5f * static_cast<float>(static_cast<int>(k % 255) - 127);
  x[3 * K + K / 2] = 3.0e4f;                                                  // row 3: an outlier
  x[4 * K + 1] = std::numeric_limits<float>::quiet_NaN();                    // row 4: a NaN
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {  // (memcmp takes no null pointer)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_same(const Quantized& a, const Quantized& b) {
  CHECK(a.q == b.q);
  CHECK(same_bits(a.d, b.d));
  CHECK(same_bits(a.s, b.s));
  CHECK(a.bsum == b.bsum);
}

}  // namespace

TEST(each_unit_quantizes_as_the_portable_reference) {
  std::mt19937 rng(7);
  const Isa isas[] = {Isa::kGeneric, Isa::kGeneric16, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni};
  const QuantIsaKernels* units[] = {&quant_generic::quant_kernels(), &quant_generic16::quant_kernels(),
                                    &quant_avx2::quant_kernels(), &quant_avx512::quant_kernels(),
                                    &quant_avx512_vnni::quant_kernels()};
  struct Case { int64_t K, block; };
  const Case cases[] = {{576, 32}, {1536, 32}, {512, 256}, {1536, 256}, {576, 576}, {100, 100}, {37, 37}, {8, 8}};
  int ran = 0;
  for (int u = 0; u < 5; ++u) {
    if (!isa_supported(isas[u])) {
      std::printf("  %s: skipped (this CPU or build lacks it)\n", isa_name(isas[u]));
      continue;
    }
    ++ran;
    for (const Case& c : cases) {
      const int64_t M = 7;
      const std::vector<float> x32 = rows(M, c.K, rng);
      std::vector<uint16_t> x16(x32.size());
      for (size_t i = 0; i < x32.size(); ++i) x16[i] = to_bf16(x32[i]);
      for (int bf16 = 0; bf16 < 2; ++bf16) {
        const void* x = bf16 ? static_cast<const void*>(x16.data()) : static_cast<const void*>(x32.data());
        const DType dt = bf16 ? DType::kBFloat16 : DType::kFloat32;
        Quantized want(M, c.K, c.block), got(M, c.K, c.block);
        quantize_x_rows(x, dt, c.K, c.K, c.block, 0, M, want.qx);
        units[u]->quantize_rows(x, dt, c.K, c.K, c.block, 0, M, got.qx);
        expect_same(want, got);
        // a sub-range of rows writes only those rows
        Quantized part(M, c.K, c.block);
        units[u]->quantize_rows(x, dt, c.K, c.K, c.block, 2, 5, part.qx);
        CHECK(std::memcmp(part.q.data() + 2 * part.qx.q_stride, want.q.data() + 2 * want.qx.q_stride,
                          3 * part.qx.q_stride) == 0);
        CHECK(part.q[0] == 99);
      }
    }
    std::printf("  %s: ran\n", isa_name(isas[u]));
  }
  CHECK(ran >= 2);  // the portable units always run
}

int main() { return pagedcore_test::run_all(); }
