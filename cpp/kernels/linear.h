// Linear layers on the CPU for few rows: y[M, N] = x[M, K] . W[N, K]^T (+ bias), fp32 accumulation,
// weights streamed once from memory in their checkpoint layout (no packing), both cores.
//
// Built for decode (M = 1 .. ~16 tokens), where a linear layer is a pass over its weights and
// torch's MKL GEMV reaches only a third of the memory bandwidth; it also serves bf16 weights at any
// M on CPUs without AVX512-BF16, where widening bf16 to fp32 in registers beats torch's bf16 GEMM.
#pragma once

#include <cstdint>

#include "kernels/cpu_isa.h"
#include "kernels/kernel_types.h"

namespace pagedcore {
namespace kernels {

// What the kernel writes after the dot products.
//   kNone:    out[m, n] = x[m] . W[n] (+ bias[n]),                       out [M, N]
//   kSiluMul: the SwiGLU of a fused gate/up projection: W rows [0, N/2) are gate, [N/2, N) up;
//             out[m, n] = silu(g) * u with g = x[m] . W[n] (+ bias[n]), u = x[m] . W[N/2 + n]
//             (+ bias[N/2 + n]), for n < N/2;                                   out [M, N/2]
//             bf16 out rounds as torch does op by op: g, u to bf16, silu(g) to bf16, then the product.
enum class LinearEpilogue : int32_t { kNone = 0, kSiluMul = 1 };

struct LinearParams {
  void* out = nullptr;           // [M, N] (kSiluMul: [M, N / 2]), row stride out_stride, out_dtype
  const void* x = nullptr;       // [M, K], row stride x_stride, x_dtype
  const void* weight = nullptr;  // [N, K], contiguous rows (row stride K), w_dtype
  const void* bias = nullptr;    // [N] or nullptr, bias_dtype
  int64_t M = 0;                 // rows of x (tokens)
  int64_t N = 0;                 // rows of weight (output features; kSiluMul: 2 x outputs)
  int64_t K = 0;                 // input features
  int64_t x_stride = 0;          // elements between x[m] and x[m + 1], >= K (any when M == 1)
  int64_t out_stride = 0;        // elements between out[m] and out[m + 1], >= the out row length
  DType x_dtype = DType::kFloat32;
  DType w_dtype = DType::kFloat32;
  DType bias_dtype = DType::kFloat32;
  DType out_dtype = DType::kFloat32;
  LinearEpilogue epilogue = LinearEpilogue::kNone;
};

// Which inner loop runs; chosen from active_isa() unless a test asks for one.
//   kAuto:       the best this CPU runs (AVX512-BF16 dot products for bf16 x and W when present)
//   kGeneric8, kGeneric16:      portable code with the 8- and 16-lane tiling of AVX2 / AVX-512
//   kGeneric16Bf16Dot:          portable emulation of the AVX512-BF16 path (vdpbf16ps pairs)
//   kAvx2, kAvx512, kAvx512Bf16Dot: the intrinsics versions
enum class LinearIsa : int32_t {
  kAuto = -1, kGeneric8 = 0, kGeneric16 = 1, kAvx2 = 2, kAvx512 = 3, kGeneric16Bf16Dot = 4, kAvx512Bf16Dot = 5
};
const char* linear_isa_name(LinearIsa isa);
bool linear_isa_supported(LinearIsa isa);
// The variant kAuto resolves to for bf16 x and weights (the fp32 path of that CPU otherwise).
LinearIsa linear_auto_isa();

// Checks sizes, strides, dtypes and pointers, then computes out. On error nothing is written.
// Output rows may not overlap x (out is written while x is still being read by other threads).
Status linear(const LinearParams& p, LinearIsa isa = LinearIsa::kAuto);

// Work planning knobs (tests, benchmarks; 0 = default): rows of W per task and rows of x per task.
struct LinearTuning {
  int64_t n_chunk = 0;
  int64_t m_chunk = 0;
};
void set_linear_tuning(const LinearTuning& tuning);

// Reads `bytes` bytes from `data` on up to `threads` threads (0 = max_threads()) with the widest
// loads of `isa`, returning a checksum so the reads cannot be elided: the bandwidth probe of
// bench/bench_decode.py (what the GEMV can stream at best).
float read_probe(const void* data, int64_t bytes, int threads, LinearIsa isa = LinearIsa::kAuto);

}  // namespace kernels
}  // namespace pagedcore
