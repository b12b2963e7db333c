// Types shared by the CPU kernels and their callers: dtype codes, the status a launcher returns,
// scalar bf16 and fp16 conversions. Torch-free and Python-free.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace pagedcore {
namespace kernels {

// Element type of an activation or cache buffer. The codes are shared with python/pagedcore/ops/dtypes.py
// (2 is fp16, which only the CUDA kernels take). The fp8 formats (fp8.h) are KV cache types only.
enum class DType : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat8E4M3 = 3, kFloat8E5M2 = 4 };

inline bool valid_dtype(int32_t code) { return code == 0 || code == 1; }                // activations
inline bool valid_cache_dtype(int32_t code) { return valid_dtype(code) || code == 3 || code == 4; }
inline bool is_fp8(DType t) { return t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2; }
inline int64_t dtype_size(DType t) { return t == DType::kFloat32 ? 4 : is_fp8(t) ? 1 : 2; }

// What a launcher returns: ok, or which argument is wrong and how. Nothing has been written when a
// launcher returns an error: all checks run before any store.
struct Status {
  enum Code { kOk = 0, kInvalidArgument = 1, kOutOfRange = 2 };
  Code code = kOk;
  std::string message;

  static Status ok() { return {}; }
  static Status invalid(std::string msg) { return {kInvalidArgument, std::move(msg)}; }
  static Status out_of_range(std::string msg) { return {kOutOfRange, std::move(msg)}; }
  bool is_ok() const { return code == kOk; }
};

// bf16 is stored as the high 16 bits of an IEEE float32 (uint16_t in memory).
inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE fp16 (as stored in GGUF blocks) -> fp32, exactly (subnormals, inf and NaN included).
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while (!(man & 0x400u));
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest, ties to even (what torch's .to(torch.bfloat16) does); NaN stays a quiet NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace kernels
}  // namespace pagedcore
