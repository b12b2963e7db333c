// Every decoder layer of a Llama-family model in one call: the small-batch forward path.
//
// At a few tokens a step is a pass over the weights, and a Python forward that dispatches ~15 torch
// ops per layer spends as long between the ops as in them. This runs the same ops, in the same
// order and rounding, from C++: the linear kernel (linear.h), the fused RMSNorm and rotary
// embedding (norm.h), reshape_and_cache and paged_attention (cache_kernels.h, paged_attention.h).
//
// One layer (T tokens, H query heads, Hkv kv heads of D, hidden size E, intermediate size I):
//
//   first layer:  residual = hidden;              h = rms_norm(hidden)          (input_layernorm)
//   later layers: residual = residual + hidden;   h = rms_norm(residual)
//   qkv  [T, (H + 2 Hkv) D] = h . Wqkv^T (+ bias)         q | k | v per token row
//   (Qwen3) q, k heads: per-head rms_norm (q_norm, k_norm)
//   q, k rotated (rotate-half RoPE, cos_sin rows)
//   k, v -> the layer's paged cache at slot_mapping;  attn [T, H D] = paged_attention(q)
//   residual = residual + attn . Wo^T;                h = rms_norm(residual)    (post_attention_layernorm)
//   act  [T, I] = silu(h . Wgate^T) * (h . Wup^T)      (gate_up, SwiGLU in the kernel's epilogue)
//   hidden [T, E] = act . Wdown^T                       (added into residual by the next layer)
//
// Multi-LoRA (a step with adapter rows: step.lora.num_segments > 0): after each of the four linears
// the listed rows get their adapter's terms, y[t] += B_a A_a x[t] (lora_kernel.h, the call the
// Python layers' LoRA hooks make), before anything reads y. gate_up then runs without its fused
// epilogue: gu [T, 2 I] = h . Wgate_up^T, gu += LoRA, act = silu_mul(gu) (silu_mul.h, the same
// epilogue code on the stored values; the layer loop's LoRA branch calls it too).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/kernel_types.h"
#include "kernels/linear.h"
#include "kernels/lora_kernel.h"

namespace pagedcore {
namespace kernels {

// The four linear layers of a decoder layer, in the order of DecoderLayerWeights' format / scales.
enum StackLinear { kStackQkvProj = 0, kStackOProjLinear, kStackGateUpProj, kStackDownProj, kNumStackLinears };

// A linear whose rows come in runs of different formats (a GGUF that mixes block types inside one fused layer: a
// small model's Q4_K_M file holds some layers' q / k in Q5_0 and v in Q8_0, gate in Q5_0 and up in Q4_K): the runs
// after the first, in row order. The first run is DecoderLayerWeights' own fields for the linear (weight, format,
// scales) over the rows the later runs leave. Each run is one kernel call writing its columns of the output, as
// the layer loop runs the layer's parts; a gate_up with later runs writes gate | up, then the SwiGLU (silu_mul.h,
// the layer loop's call for such a layer too).
struct StackLinearRun {
  const void* weight = nullptr;                   // the run's rows, in `format`
  WeightFormat format = WeightFormat::kDenseF32;
  const float* scales = nullptr;                  // [rows] fp32 (int8 per channel, fp8), else nullptr
  int64_t rows = 0;
};
constexpr int kMaxStackLinearRuns = 3;  // later runs per linear (a fused layer has at most 3 shards)

// One layer's weights, bound once at load. Norms and biases are contiguous in the stack's dtype;
// each linear weight is stored as its `format` says: unset, dense rows of the stack's dtype;
// otherwise a quantized format of linear.h (GGUF blocks as stored, or int8 per channel with its
// fp32 per-row `scales`), run by the same quantized kernels the Python layers call, a dense x16
// repack, (fp32 stacks) a checkpoint's bf16 / fp16 tensor held as stored (rows or x16), or fp8 e4m3
// bytes (rows or x16) with their fp32 per-row `scales` (the dense kernels: x widened, never quantized).
struct DecoderLayerWeights {
  const void* input_norm = nullptr;  // [E]
  const void* post_norm = nullptr;   // [E]
  const void* q_norm = nullptr;      // [D] or nullptr (both or neither)
  const void* k_norm = nullptr;      // [D] or nullptr
  const void* qkv = nullptr;         // [(H + 2 Hkv) D, E]: q rows, then k, then v
  const void* qkv_bias = nullptr;    // [(H + 2 Hkv) D] or nullptr
  const void* o_proj = nullptr;      // [E, H D]
  const void* gate_up = nullptr;     // [2 I, E]: gate rows, then up rows
  const void* down = nullptr;        // [E, I]
  std::optional<WeightFormat> format[kNumStackLinears];  // unset: dense_weight_format(dtype)
  const float* scales[kNumStackLinears] = {};           // [N] fp32 for int8 per channel and fp8, else nullptr
  // fp8x16 with block-wise scales: inputs per scale block, `scales` then fp32 [N/16][ceil(K / block_k)]; 0: none
  int64_t block_k[kNumStackLinears] = {};
  // [K] int64 or nullptr: an act-order GPTQ layer multiplies x[:, input_perm] (its inputs sorted by group
  // at load, loader/int4_checkpoint.py); the stack gathers them before the kernel (LoRA terms read x as is).
  const int64_t* input_perm[kNumStackLinears] = {};
  // Each linear's LoRA slot stacks (in: its K, out: its N); a_t == nullptr: no adapter terms there.
  LoRAStacks lora[kNumStackLinears];
  // Rows of another format after the first run (above); none in the usual layer.
  StackLinearRun later_runs[kNumStackLinears][kMaxStackLinearRuns];
  int num_later_runs[kNumStackLinears] = {};
};

struct DecoderStackParams {
  const DecoderLayerWeights* layers = nullptr;  // [num_layers]
  int64_t num_layers = 0;
  int64_t hidden_size = 0;         // E
  int64_t num_heads = 0;           // H
  int64_t num_kv_heads = 0;        // Hkv, divides H
  int64_t head_dim = 0;            // D, even
  int64_t intermediate_size = 0;   // I
  float rms_norm_eps = 1e-6f;
  float attn_scale = 1.f;
  DType dtype = DType::kFloat32;   // weights and activations

  int64_t num_tokens = 0;          // T
  void* hidden = nullptr;          // [T, E] contiguous: in the embeddings, out the last layer's output
  void* residual = nullptr;        // [T, E] contiguous: out the residual stream (hidden not yet added)
  const void* cos_sin = nullptr;   // [T, D] contiguous, dtype: [cos | sin] of each token's position
  // [num_layers, 2, num_blocks, Hkv, block_size, D], cache_dtype; [Hkv, block_size, D] contiguous, the
  // outer dims kv_stride_{layer,kv,block} elements apart. All three 0: contiguous (layer-major). The CPU
  // engine's cache is block-major (kv_cache.py): strides 2 * P, P, num_layers * 2 * P with P = Hkv * block_size * D.
  void* kv_cache = nullptr;
  DType cache_dtype = DType::kFloat32;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t kv_stride_layer = 0;
  int64_t kv_stride_kv = 0;
  int64_t kv_stride_block = 0;
  // The step's attention metadata, as paged_attention.h / cache_kernels.h define them.
  const int64_t* slot_mapping = nullptr;     // [T], -1 = padding
  const int32_t* block_tables = nullptr;     // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens = nullptr;         // [num_seqs]
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1]
  int64_t num_seqs = 0;
  int64_t max_blocks_per_seq = 0;
  int64_t max_query_len = -1;
  int64_t max_seq_len = -1;
  int64_t num_actual_tokens = -1;            // rows past it are padding (attention rows zero); -1 = T
  // The step's adapter rows, grouped by slot (num_segments 0: none; every linear then runs as without LoRA).
  LoRASegments lora;

  // Optional: seconds spent per op are added to op_seconds[StackOp] (a profile for benchmarks;
  // two clock reads per op, ~1 us a step for 30 layers). A linear's adapter terms (and gate_up's
  // separate SwiGLU in a LoRA step) count in that linear's op.
  double* op_seconds = nullptr;
};

enum StackOp { kStackNorms = 0, kStackQkv, kStackRope, kStackCacheWrite, kStackAttention, kStackOProj,
               kStackGateUp, kStackDown, kNumStackOps };
const char* stack_op_name(int op);

// Runs every layer. The first layer's attention checks the metadata before anything is written
// to the cache; on an error later (only a bug could cause one) hidden, residual and this step's
// cache slots are left partly updated.
// The first form runs the kernels of active_isa(), the second those of `isa` (every op).
Status decoder_stack(const DecoderStackParams& p);
Status decoder_stack(const DecoderStackParams& p, Isa isa);

// Every layer's weights and the model's sizes, bound once at load (pagedcore.layers.decoder_stack
// builds one); run() takes one step's buffers and metadata.
struct DecoderStack {
  std::vector<DecoderLayerWeights> layers;
  DecoderStackParams sizes;  // the model's sizes, eps, scale and dtype; the per-step fields unused
  std::optional<Isa> isa;    // unset: active_isa() at each step
  bool profiling = false;    // accumulate seconds per op into op_seconds
  std::vector<double> op_seconds = std::vector<double>(kNumStackOps, 0.0);  // [kNumStackOps]
  int64_t lora_steps = 0;    // steps run with adapter rows (tests and benchmarks see the stack took them)

  // step: the per-step fields of DecoderStackParams (num_tokens .. lora); the layers, sizes and
  // profile pointer come from here.
  Status run(const DecoderStackParams& step);
};

}  // namespace kernels
}  // namespace pagedcore
