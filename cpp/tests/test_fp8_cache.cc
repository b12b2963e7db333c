// The fp8 KV cache (kernels/fp8.h, --kv-cache-dtype fp8_e4m3 / fp8_e5m2): the scalar formats against
// their definitions, reshape_and_cache's rounding, and paged attention over an fp8 cache on every ISA
// this CPU runs against the naive attention over the same values widened.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attention_batch.h"
#include "check.h"
#include "kernels/cache_kernels.h"
#include "kernels/fp8.h"
#include "kernels/paged_attention.h"

using namespace pagedcore::kernels;
using namespace pagedcore_test;

namespace {

// Every finite value of a format, by its definition: (-1)^s 2^(e - bias) (1 + m / 2^mant), or
// 2^(1 - bias) m / 2^mant for e = 0.
template <bool kE4M3>
double definition(uint8_t code) {
  const int mant = kE4M3 ? 3 : 2, bias = kE4M3 ? 7 : 15;
  const int e = (code & 0x7f) >> mant, m = code & ((1 << mant) - 1);
  const double v = e == 0 ? std::ldexp(m / double(1 << mant), 1 - bias)
                          : std::ldexp(1 + m / double(1 << mant), e - bias);
  return (code & 0x80) ? -v : v;
}

template <bool kE4M3>
void check_format() {
  const uint8_t max_code = kE4M3 ? 0x7e : 0x7b;
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    if ((code & 0x7f) > max_code) {  // NaN (e4m3), inf and NaN (e5m2)
      CHECK(kE4M3 ? std::isnan(fp8_to_float<kE4M3>(code)) : !std::isfinite(fp8_to_float<kE4M3>(code)));
      continue;
    }
    const float v = fp8_to_float<kE4M3>(code);
    CHECK_EQ(double(v), definition<kE4M3>(code));
    CHECK_EQ(int(float_to_fp8<kE4M3>(v)), c);  // -0 included: the sign survives
    if ((code & 0x7f) == max_code) continue;
    // Between this value and the next one up (same sign): below the midpoint rounds down, above it
    // up, at it to the even code.
    const float next = fp8_to_float<kE4M3>(static_cast<uint8_t>(code + 1));
    const float mid = static_cast<float>((double(v) + double(next)) / 2);
    const uint8_t even = (code & 1) ? static_cast<uint8_t>(code + 1) : code;
    CHECK_EQ(int(float_to_fp8<kE4M3>(mid)), int(even));
    CHECK_EQ(int(float_to_fp8<kE4M3>(std::nextafter(mid, 0.f))), c);
    CHECK_EQ(int(float_to_fp8<kE4M3>(std::nextafter(mid, (code & 0x80) ? -1e30f : 1e30f))), int(code + 1));
  }
  const float max_value = fp8_to_float<kE4M3>(max_code);
  CHECK_EQ(int(float_to_fp8<kE4M3>(max_value * 4)), int(max_code));  // saturates
  CHECK_EQ(int(float_to_fp8<kE4M3>(-std::numeric_limits<float>::infinity())), int(0x80 | max_code));
  CHECK(std::isnan(fp8_to_float<kE4M3>(float_to_fp8<kE4M3>(std::numeric_limits<float>::quiet_NaN()))));
}

// The batch's fp32 cache rounded to fp8: the codes, and the float cache holding their exact values.
Batch with_fp8_cache(Batch b, DType format) {
  const bool e4m3 = format == DType::kFloat8E4M3;
  auto round = [&](std::vector<float>& values, std::vector<uint8_t>& codes) {
    codes.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      codes[i] = e4m3 ? float_to_fp8<true>(values[i]) : float_to_fp8<false>(values[i]);
      values[i] = e4m3 ? fp8_to_float<true>(codes[i]) : fp8_to_float<false>(codes[i]);
    }
  };
  round(b.key_cache, b.key_cache_fp8);
  round(b.value_cache, b.value_cache_fp8);
  return b;
}

}  // namespace

TEST(fp8_e4m3_is_the_ocp_format) { check_format<true>(); }

TEST(fp8_e5m2_is_the_ocp_format) { check_format<false>(); }

TEST(reshape_and_cache_rounds_into_fp8) {
  const int64_t heads = 2, bs = 4, d = 16, tokens = 3, num_blocks = 2;
  std::vector<float> kv(tokens * heads * d);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::ldexp(static_cast<float>(i % 29) - 14.3f, int(i % 7) - 3);
  kv[5] = 1e6f;                                      // saturates
  const std::vector<int64_t> slots = {6, -1, 1};
  for (DType format : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    std::vector<uint8_t> kc(num_blocks * heads * bs * d, 0xAA), vc(kc.size(), 0xAA);
    ReshapeAndCacheParams p;
    p.key = p.value = kv.data();
    p.key_cache = kc.data();
    p.value_cache = vc.data();
    p.slot_mapping = slots.data();
    p.num_tokens = tokens;
    p.num_kv_heads = heads;
    p.head_size = d;
    p.num_blocks = num_blocks;
    p.block_size = bs;
    p.key_stride_token = p.value_stride_token = heads * d;
    p.key_stride_head = p.value_stride_head = d;
    p.cache_dtype = format;
    CHECK(reshape_and_cache(p).is_ok());
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < d; ++i) {
          const float x = kv[(t * heads + h) * d + i];
          const uint8_t want = slots[t] < 0 ? 0xAA
                               : format == DType::kFloat8E4M3 ? float_to_fp8<true>(x) : float_to_fp8<false>(x);
          const int64_t slot = slots[t] < 0 ? 0 : slots[t];  // padding: check block 0 offset 0 untouched
          CHECK_EQ(int(kc[((slot / bs * heads + h) * bs + slot % bs) * d + i]), int(want));
        }
  }
}

TEST(attention_over_an_fp8_cache_matches_naive_on_every_isa) {
  for (DType format : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    for (const Batch& raw : {make_batch(kMixed, 9, 3, 64, 16, 21), make_batch({{9, 1}, {20, 13}}, 4, 2, 72, 16, 22)}) {
      const Batch b = with_fp8_cache(raw, format);
      const float scale = 1.f / std::sqrt(static_cast<float>(b.head_size));
      const std::vector<float> want = naive_attention(b, scale);
      for (int code = 0; code < kNumIsas; ++code) {
        const Isa isa = static_cast<Isa>(code);
        if (!isa_supported(isa)) continue;
        std::vector<float> out(b.query.size(), std::numeric_limits<float>::quiet_NaN());
        CHECK(paged_attention(params_for(b, format, out.data(), scale), isa).is_ok());
        // fp8 widens exactly: as close as an fp32 cache, but on the pair-dot ISAs (planes widened to bf16 for
        // vdpbf16ps) the fp32 query and the probabilities are rounded to bf16, as over a bf16 cache.
        const bool pair_dot = b.head_size % 32 == 0 && (isa == Isa::kAvx512Bf16 || isa == Isa::kGeneric16Bf16 ||
                                                        isa == Isa::kAmxBf16 || isa == Isa::kAmxInt8);
        const float err = max_abs_diff(out, want);
        if (!(err < (pair_dot ? 8e-3f : 2e-5f)))
          throw pagedcore_test::Failure(std::string("isa ") + isa_name(isa) + " fp8 format " +
                                        std::to_string(int(format)) + ": max abs error " + std::to_string(err));
      }
    }
  }
}

int main() { return pagedcore_test::run_all(); }
