// Linear layers on the CPU for few rows: y[M, N] = x[M, K] . W[N, K]^T (+ bias), fp32 accumulation,
// weights streamed once from memory in their checkpoint layout (no packing), both cores.
//
// Built for decode (M = 1 .. ~16 tokens), where a linear layer is a pass over its weights and
// torch's MKL GEMV reaches only a third of the memory bandwidth; it also serves bf16 weights at any
// M on CPUs without AVX512-BF16, where widening bf16 to fp32 in registers beats torch's bf16 GEMM.
#pragma once

#include <cstdint>
#include <optional>

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

// How the weight matrix W [N, K] is stored.
//   kDenseF32, kDenseBf16: N contiguous rows of K elements, the checkpoint layout (no packing); one
//                        row of each ISA's dense kernel table (linear_kernel.h).
// The quantized family (quant_linear.h; x is quantized per block to int8 at each call, as llama.cpp
// does, and the dot products are integer):
//   kInt8PerChannel: int8 rows [N, K] and one fp32 scale per output row (LinearParams.weight_scales):
//                    W8A8 with one dynamic scale per row of x.
//   kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K: GGUF blocks in ggml's exact byte layout
//                    (quant_blocks.h), N rows of K / block blocks (32 weights; 256 for the k-quants).
//   kQ4_0x16, kQ4_1x16, kQ5_0x16, kQ5_1x16, kQ8_0x16: the same blocks repacked once at load, 16 weight rows
//                    interleaved (quant_blocks.h BlockQ*x16; N a multiple of 16; the same bytes per weight), so
//                    one vector of integer products holds 16 output columns (quant_x16_impl.h).
//   kQ4_Kx16, kQ5_Kx16, kQ6_Kx16: the k-quants repacked the same way, their 6-bit sub-block scales
//                    unpacked to bytes (quant_blocks.h; 148 / 180 / 210 bytes per row and 256
//                    weights against ggml's 144 / 176 / 210; quant_kx16_impl.h).
//   kInt8PerChannelX16: kInt8PerChannel's rows repacked the same way (K a multiple of 32; bytes
//                    q + 128 of 4 weights x 16 rows per 64; scales as kInt8PerChannel's), the
//                    same bits as the row layout (quant_x16_impl.h i8block).
// The dense formats repacked once at load (dense_x16_impl.h; N a multiple of 16, the same bytes):
//   kDenseF32x16:  fp32 [N/16][K][16], 16 output columns per vector at one k.
//   kDenseBf16x16: bf16 [N/16][K/2][16][2] (K even), 16 columns x a pair of k per 64 bytes, as
//                  vdpbf16ps takes them against x[m, k:k+2] broadcast.
//   Outer-product kernels: x broadcast, no horizontal sums; a row's sums do not depend on the
//   other rows of the call, but they are summed in another order than the checkpoint-layout kernel.
// fp16 weights (a GPTQ / AWQ checkpoint's unquantized lm_head and token table, held as stored; x fp32):
//   kDenseF16:     N contiguous rows of K IEEE fp16, widened to fp32 in registers (F16C): the same
//                  sums, in the same order, as kDenseF32 on the fp32 copy.
//   kDenseF16x16:  fp16 [N/16][K][16] (kDenseF32x16's layout at half the bytes): the same sums as
//                  kDenseF32x16 on the fp32 copy.
// fp8 weights (vLLM's "fp8", compressed-tensors' float-quantized checkpoints: W8A16, x fp32 or bf16 widened
// to fp32, never quantized), OCP e4m3 bytes with one fp32 scale per weight row (LinearParams.weight_scales):
//   out[m, n] = weight_scales[n] * (x[m] . fp8_to_float(W[n]))  (+ bias[n]; kSiluMul: each of g and u times
//   its own row's scale before the bias and the SwiGLU). The raw sums are kDenseF32's (x16: kDenseF32x16's)
//   on the widened fp32 copy, bit for bit (the weights are widened at 2^-8 of their values and each sum
//   scaled back, exactly unless some product or partial sum is under 2^-118); the scale is one multiply of
//   each sum. The e4m3 NaN codes (0x7f, 0xff), which quantizers never write, are not handled: they read as
//   +-480.
//   kDenseFp8E4M3:    N contiguous rows of K bytes (the checkpoint layout).
//   kDenseFp8E4M3x16: bytes [N/16][K][16] (kDenseF32x16's layout at a byte per weight; N a multiple of 16).
//   Block-wise scales (DeepSeek / Qwen3 FP8 checkpoints: one scale per 128 x 128 block), x16 only: with
//   LinearParams.weight_block_scales set (weight_scales then unused), fp32 [N/16][KB] with KB = ceil(K / block_k)
//   (the checkpoint's [ceil(N/bn)][KB] table repeated for each 16-row group of a block: bn % 16 == 0),
//     out[m, n] = sum over kb of block_scales[n / 16][kb] * (x[m, kb block] . fp8_to_float(W[n, kb block]))
//   each k-block's raw sum (kDenseF32x16's order inside the block) times its scale, added in kb order.
enum class WeightFormat : int32_t {
  kDenseF32 = 0,
  kDenseBf16 = 1,
  kInt8PerChannel = 2,
  kQ4_0 = 3,
  kQ4_1 = 4,
  kQ8_0 = 5,
  kQ4_K = 6,
  kQ5_K = 7,
  kQ6_K = 8,
  kQ4_0x16 = 9,
  kQ4_1x16 = 10,
  kQ8_0x16 = 11,
  kQ4_Kx16 = 12,
  kQ5_Kx16 = 13,
  kQ6_Kx16 = 14,
  kDenseF32x16 = 15,
  kDenseBf16x16 = 16,
  kInt8PerChannelX16 = 17,
  kDenseF16 = 18,
  kDenseF16x16 = 19,
  kDenseFp8E4M3 = 20,
  kDenseFp8E4M3x16 = 21,
  kQ5_0 = 22,
  kQ5_1 = 23,
  kQ5_0x16 = 24,
  kQ5_1x16 = 25,
};
constexpr int kNumWeightFormats = 26;
const char* weight_format_name(WeightFormat format);
// The dense format of a dtype (kFloat32 -> kDenseF32, kBFloat16 -> kDenseBf16).
WeightFormat dense_weight_format(DType dtype);
// The repacked x16 format of a dtype (kFloat32 -> kDenseF32x16, kBFloat16 -> kDenseBf16x16).
WeightFormat dense_x16_weight_format(DType dtype);
// True for the float formats of `dtype`'s weights: its checkpoint layout or its x16 repack.
bool is_dense_format_of(WeightFormat format, DType dtype);
// True for kDenseFp8E4M3 and kDenseFp8E4M3x16 (dense kernels, fp32 per-row weight_scales).
bool is_fp8_format(WeightFormat format);
// Whether linear(p, isa) runs a dense (not quantized) `format` with the kernels of `isa`: the CPU (and
// build) has the ISA and its table a row for the format.
bool has_dense_kernel(WeightFormat format, Isa isa);

struct LinearParams {
  void* out = nullptr;           // [M, N] (kSiluMul: [M, N / 2]), row stride out_stride, out_dtype
  const void* x = nullptr;       // [M, K], row stride x_stride, x_dtype
  const void* weight = nullptr;  // [N, K] as weight_format stores it (dense: contiguous rows of K)
  const void* bias = nullptr;    // [N] or nullptr, bias_dtype
  const void* weight_scales = nullptr;  // [N] fp32 per-row scales (int8 per channel, fp8), else nullptr
  // fp8x16 with block-wise scales: fp32 [N/16][ceil(K / weight_block_k)] (see the formats above), else nullptr
  const float* weight_block_scales = nullptr;
  int64_t weight_block_k = 0;    // inputs per scale block (a multiple of 4) with weight_block_scales
  int64_t M = 0;                 // rows of x (tokens)
  int64_t N = 0;                 // rows of weight (output features; kSiluMul: 2 x outputs)
  int64_t K = 0;                 // input features
  int64_t x_stride = 0;          // elements between x[m] and x[m + 1], >= K (any when M == 1)
  int64_t out_stride = 0;        // elements between out[m] and out[m + 1], >= the out row length
  DType x_dtype = DType::kFloat32;
  WeightFormat weight_format = WeightFormat::kDenseF32;
  DType bias_dtype = DType::kFloat32;
  DType out_dtype = DType::kFloat32;
  LinearEpilogue epilogue = LinearEpilogue::kNone;
};

// Checks sizes, strides, dtypes and pointers, then computes out with the kernels of `isa` (the
// first form: active_isa()); with kAvx512Bf16 (or its emulation kGeneric16Bf16), bf16 x against
// bf16 weights runs on pairwise bf16 dot products. Quantized formats run the kernels cpu_isa.h's
// rule maps `isa` to (e.g. avx512_bf16 -> avx512_vnni). On error nothing is written. Output rows may not
// overlap x (out is written while x is still being read by other threads).
Status linear(const LinearParams& p);
Status linear(const LinearParams& p, Isa isa);

// A layer's weight-side arguments, bound once at load (pagedcore.ops.linear builds one per layer);
// run() adds one call's activations, so a decode call passes five numbers. isa unset: active_isa()
// at each call, so set_active_isa() applies to layers built before it.
struct LinearLayer {
  LinearParams params;  // weight, bias, N, K, dtypes, weight format, epilogue (out, x, M, strides unused)
  std::optional<Isa> isa;

  Status run(void* out, const void* x, int64_t M, int64_t x_stride, int64_t out_stride) const;
};

// Work planning knobs (tests, benchmarks; 0 = default): rows of W per task and rows of x per task.
struct LinearTuning {
  int64_t n_chunk = 0;
  int64_t m_chunk = 0;
};
void set_linear_tuning(const LinearTuning& tuning);

// Reads `bytes` bytes from `data` on up to `threads` threads (0 = max_threads()) with the widest
// loads of `isa`, returning a checksum so the reads cannot be elided: the bandwidth probe of
// bench/bench_decode.py (what the GEMV can stream at best).
float read_probe(const void* data, int64_t bytes, int threads);
float read_probe(const void* data, int64_t bytes, int threads, Isa isa);

}  // namespace kernels
}  // namespace pagedcore
