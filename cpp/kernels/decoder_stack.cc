// decoder_stack: every decoder layer of a step in one call (see decoder_stack.h for the op order).
// This file only sequences the kernels; each op checks its own arguments and returns a Status.
#include "kernels/decoder_stack.h"

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cache_kernels.h"
#include "kernels/norm.h"
#include "kernels/paged_attention.h"
#include "kernels/quant_linear.h"
#include "kernels/silu_mul.h"

namespace pagedcore {
namespace kernels {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Activation buffers of a step, per calling thread, reused across calls.
struct StackWorkspace {
  std::vector<char> h, qkv, attn, tmp, act, gate_up, gathered;
  static void* get(std::vector<char>& v, int64_t bytes) {
    if (v.size() < static_cast<size_t>(bytes)) v.resize(bytes);
    return v.data();
  }
};
// dst[t, k] = src[t, perm[k]]: src, dst [T, K] of 16- or 32-bit values (the bits moved as they are).
template <typename Bits>
void gather_columns(const Bits* src, const int64_t* perm, int64_t T, int64_t K, Bits* dst) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) dst[t * K + k] = src[t * K + perm[k]];
}

StackWorkspace& workspace() {
  static thread_local StackWorkspace ws;
  return ws;
}

Status check(const DecoderStackParams& p) {
  if (!p.layers || p.num_layers <= 0) return Status::invalid("decoder_stack: no layers");
  if (p.hidden_size <= 0 || p.num_heads <= 0 || p.num_kv_heads <= 0 || p.head_dim <= 0 ||
      p.intermediate_size <= 0 || p.num_heads % p.num_kv_heads != 0 || p.head_dim % 2 != 0)
    return Status::invalid("decoder_stack: invalid model sizes (hidden " + str(p.hidden_size) + ", heads " +
                           str(p.num_heads) + "/" + str(p.num_kv_heads) + ", head_dim " + str(p.head_dim) +
                           ", intermediate " + str(p.intermediate_size) + ")");
  if (p.num_tokens < 0) return Status::invalid("decoder_stack: negative num_tokens");
  if (p.num_tokens > 0 && (!p.hidden || !p.residual || !p.cos_sin || !p.kv_cache))
    return Status::invalid("decoder_stack: a data pointer is null");
  const bool kv_strided = p.kv_stride_layer != 0 || p.kv_stride_kv != 0 || p.kv_stride_block != 0;
  if (kv_strided && (p.kv_stride_layer <= 0 || p.kv_stride_kv <= 0 ||
                     p.kv_stride_block < p.num_kv_heads * p.block_size * p.head_dim))
    return Status::invalid("decoder_stack: kv_stride_layer / kv_stride_kv / kv_stride_block must all be 0 "
                           "(a contiguous cache) or positive, with blocks at least num_kv_heads * block_size * "
                           "head_dim elements apart");
  if (p.num_actual_tokens > p.num_tokens)
    return Status::invalid("decoder_stack: num_actual_tokens " + str(p.num_actual_tokens) + " > num_tokens " +
                           str(p.num_tokens));
  for (int64_t l = 0; l < p.num_layers; ++l) {
    const DecoderLayerWeights& w = p.layers[l];
    if (!w.input_norm || !w.post_norm || !w.qkv || !w.o_proj || !w.gate_up || !w.down ||
        (w.q_norm == nullptr) != (w.k_norm == nullptr))
      return Status::invalid("decoder_stack: layer " + str(l) + " misses a weight");
    // A dense weight is read as the activations' dtype; the quantized formats carry their own. Under fp32
    // activations a dense weight may also be bf16 or fp16, a checkpoint's 16-bit tensor held as stored
    // (the kernels widen it exactly). fp8 weights take either activation dtype (x widened to fp32).
    auto weight_problem = [&](WeightFormat f, const float* scales) -> std::string {
      const bool held_16bit = p.dtype == DType::kFloat32 &&
                              (is_dense_format_of(f, DType::kBFloat16) || f == WeightFormat::kDenseF16 ||
                               f == WeightFormat::kDenseF16x16);
      if (!is_quantized_format(f) && !is_dense_format_of(f, p.dtype) && !held_16bit &&  // (checkpoint or x16)
          !is_fp8_format(f))
        return std::string(" has a ") + weight_format_name(f) + " weight in a stack of " +
               (p.dtype == DType::kFloat32 ? "float32" : "bfloat16") + " activations";
      if ((is_int8_per_channel(f) || is_fp8_format(f)) != (scales != nullptr))
        return ": per-row scales go with int8_per_channel and fp8 weights, and only with them";
      return "";
    };
    const int64_t rows_of[kNumStackLinears] = {(p.num_heads + 2 * p.num_kv_heads) * p.head_dim, p.hidden_size,
                                               2 * p.intermediate_size, p.hidden_size};
    for (int i = 0; i < kNumStackLinears; ++i) {
      std::string problem = weight_problem(w.format[i].value_or(dense_weight_format(p.dtype)), w.scales[i]);
      if (!problem.empty()) return Status::invalid("decoder_stack: layer " + str(l) + problem);
      const int runs = w.num_later_runs[i];
      if (runs < 0 || runs > kMaxStackLinearRuns || (runs > 0 && w.block_k[i] > 0))
        return Status::invalid("decoder_stack: layer " + str(l) + " has " + str(runs) + " later weight runs in a " +
                               "linear (0 .. " + str(kMaxStackLinearRuns) + ", and none with fp8 block scales)");
      int64_t later_rows = 0;
      for (int r = 0; r < runs; ++r) {
        const StackLinearRun& run = w.later_runs[i][r];
        if (!run.weight || run.rows <= 0)
          return Status::invalid("decoder_stack: layer " + str(l) + ": a later weight run has no weight or rows");
        problem = weight_problem(run.format, run.scales);
        if (!problem.empty()) return Status::invalid("decoder_stack: layer " + str(l) + problem);
        later_rows += run.rows;
      }
      if (later_rows >= rows_of[i])
        return Status::invalid("decoder_stack: layer " + str(l) + ": the later weight runs hold " + str(later_rows) +
                               " of the linear's " + str(rows_of[i]) + " rows; the first run needs some");
    }
  }
  return Status::ok();
}

int64_t esize(DType t) { return dtype_size(t); }

char* at(void* base, int64_t elements, DType t) { return static_cast<char*>(base) + elements * esize(t); }

// Adds the time since the last mark to op_seconds[op] when profiling.
class OpClock {
 public:
  explicit OpClock(double* seconds) : seconds_(seconds) {
    if (seconds_) last_ = std::chrono::steady_clock::now();
  }
  void mark(int op) {
    if (!seconds_) return;
    const auto now = std::chrono::steady_clock::now();
    seconds_[op] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  double* seconds_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace

const char* stack_op_name(int op) {
  static const char* const names[kNumStackOps] = {"norms", "qkv", "rope", "cache_write", "attention",
                                                  "o_proj", "gate_up", "down"};
  return op >= 0 && op < kNumStackOps ? names[op] : "unknown";
}

Status decoder_stack(const DecoderStackParams& p) { return decoder_stack(p, active_isa()); }

Status DecoderStack::run(const DecoderStackParams& step) {
  DecoderStackParams p = step;
  p.layers = layers.data();
  p.num_layers = static_cast<int64_t>(layers.size());
  p.hidden_size = sizes.hidden_size;
  p.num_heads = sizes.num_heads;
  p.num_kv_heads = sizes.num_kv_heads;
  p.head_dim = sizes.head_dim;
  p.intermediate_size = sizes.intermediate_size;
  p.rms_norm_eps = sizes.rms_norm_eps;
  p.attn_scale = sizes.attn_scale;
  p.dtype = sizes.dtype;
  p.op_seconds = profiling ? op_seconds.data() : nullptr;
  const Status st = decoder_stack(p, isa ? *isa : active_isa());
  if (st.is_ok() && p.num_tokens > 0 && p.lora.num_segments > 0) ++lora_steps;
  return st;
}

Status decoder_stack(const DecoderStackParams& p, Isa isa) {
  Status st = check(p);
  if (!st.is_ok() || p.num_tokens == 0) return st;
  const int64_t T = p.num_tokens, E = p.hidden_size, H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const int64_t I = p.intermediate_size, q_size = H * D, kv_size = Hkv * D, qkv_size = q_size + 2 * kv_size;
  const int64_t num_actual = p.num_actual_tokens < 0 ? T : p.num_actual_tokens;
  const DType t = p.dtype;
  const int64_t es = esize(t);

  StackWorkspace& ws = workspace();
  void* h = StackWorkspace::get(ws.h, T * E * es);           // [T, E] normalised input of a block
  void* qkv = StackWorkspace::get(ws.qkv, T * qkv_size * es);  // [T, q | k | v]
  void* attn = StackWorkspace::get(ws.attn, T * q_size * es);  // [T, H D]
  void* tmp = StackWorkspace::get(ws.tmp, T * E * es);       // [T, E] attention block output
  void* act = StackWorkspace::get(ws.act, T * I * es);       // [T, I] SwiGLU output
  const bool lora_step = p.lora.num_segments > 0;
  // [T, 2 I] gate | up before the SwiGLU: a LoRA step, whose adapter terms go in between, or a gate_up of several
  // weight runs (layers that need it)
  void* gate_up = nullptr;

  // Linear calls differ in weights, sizes and epilogue only (and an act-order layer's input gather).
  auto linear_call = [&](const DecoderLayerWeights& w, StackLinear which, const void* weight, const void* bias,
                         int64_t N, int64_t K, const void* x, void* out, LinearEpilogue epilogue) {
    if (const int64_t* perm = w.input_perm[which]) {  // x [T, K] -> x[:, perm] [T, K], as the layer loop
      void* dst = StackWorkspace::get(ws.gathered, T * K * es);
      if (es == 4) gather_columns(static_cast<const uint32_t*>(x), perm, T, K, static_cast<uint32_t*>(dst));
      else gather_columns(static_cast<const uint16_t*>(x), perm, T, K, static_cast<uint16_t*>(dst));
      x = dst;
    }
    LinearParams lp;
    lp.out = out;
    lp.x = x;
    lp.weight = weight;
    if (w.block_k[which] > 0) {  // fp8x16 block-wise scales (linear.h)
      lp.weight_block_scales = w.scales[which];
      lp.weight_block_k = w.block_k[which];
    } else {
      lp.weight_scales = w.scales[which];
    }
    lp.bias = bias;
    lp.M = T;
    lp.N = N;
    lp.K = K;
    lp.x_stride = K;
    lp.out_stride = epilogue == LinearEpilogue::kSiluMul ? N / 2 : N;
    lp.x_dtype = lp.bias_dtype = lp.out_dtype = t;
    lp.weight_format = w.format[which].value_or(dense_weight_format(t));
    lp.epilogue = epilogue;
    const int runs = w.num_later_runs[which];
    if (runs == 0) return linear(lp, isa);
    // Runs of different formats (no SwiGLU epilogue: the caller runs it after): each writes its columns.
    int64_t first_rows = N;
    for (int r = 0; r < runs; ++r) first_rows -= w.later_runs[which][r].rows;
    lp.N = first_rows;
    Status run_status = linear(lp, isa);
    int64_t col = first_rows;
    for (int r = 0; r < runs && run_status.is_ok(); ++r) {
      const StackLinearRun& run = w.later_runs[which][r];
      lp.out = at(out, col, t);
      lp.weight = run.weight;
      lp.weight_scales = run.scales;
      lp.weight_format = run.format;
      lp.bias = bias ? at(const_cast<void*>(bias), col, t) : nullptr;
      lp.N = run.rows;
      run_status = linear(lp, isa);
      col += run.rows;
    }
    return run_status;
  };
  // A LoRA step's adapter terms of one linear (x [T, K] -> y [T, N], rows contiguous); else nothing.
  auto lora_call = [&](const DecoderLayerWeights& w, StackLinear which, const void* x, int64_t K, void* y,
                       int64_t N) {
    const LoRAStacks& stacks = w.lora[which];
    if (!lora_step || !stacks.a_t) return Status::ok();
    return lora_apply(stacks, p.lora, x, K, y, N, T, K, N, t, isa);
  };
  auto norm_call = [&](const void* weight, const void* x, void* residual, void* out, int64_t rows, int64_t n,
                       int64_t stride) {
    RmsNormParams np;
    np.out = out;
    np.residual = residual;
    np.x = x;
    np.weight = weight;
    np.rows = rows;
    np.n = n;
    np.x_stride = np.out_stride = np.residual_stride = stride;
    np.eps = p.rms_norm_eps;
    np.dtype = t;
    return rms_norm(np, isa);
  };

  // One layer's K/V: kv_cache[l, 0] and kv_cache[l, 1], each [num_blocks, Hkv, block_size, D] with its
  // blocks kv_block_stride apart.
  const int64_t block_elems = Hkv * p.block_size * D;
  const bool kv_strided = p.kv_stride_block > 0;
  const int64_t kv_layer_stride = kv_strided ? p.kv_stride_layer : 2 * p.num_blocks * block_elems;
  const int64_t kv_value_offset = kv_strided ? p.kv_stride_kv : p.num_blocks * block_elems;
  const int64_t kv_block_stride = kv_strided ? p.kv_stride_block : block_elems;
  OpClock clock(p.op_seconds);
  for (int64_t l = 0; l < p.num_layers; ++l) {
    const DecoderLayerWeights& w = p.layers[l];
    // input_layernorm (with the previous layer's residual add)
    if (l == 0) {
      std::memcpy(p.residual, p.hidden, T * E * es);
      st = norm_call(w.input_norm, p.hidden, nullptr, h, T, E, E);
    } else {
      st = norm_call(w.input_norm, p.hidden, p.residual, h, T, E, E);
    }
    if (!st.is_ok()) return st;
    clock.mark(kStackNorms);
    // q | k | v
    if (!(st = linear_call(w, kStackQkvProj, w.qkv, w.qkv_bias, qkv_size, E, h, qkv, LinearEpilogue::kNone)).is_ok()) return st;
    if (!(st = lora_call(w, kStackQkvProj, h, E, qkv, qkv_size)).is_ok()) return st;
    clock.mark(kStackQkv);
    if (w.q_norm) {  // Qwen3: each head normalised over D, in place
      for (int64_t tok = 0; tok < T; ++tok) {
        void* row = at(qkv, tok * qkv_size, t);
        if (!(st = norm_call(w.q_norm, row, nullptr, row, H, D, D)).is_ok()) return st;
        void* krow = at(qkv, tok * qkv_size + q_size, t);
        if (!(st = norm_call(w.k_norm, krow, nullptr, krow, Hkv, D, D)).is_ok()) return st;
      }
    }
    RotaryParams rp;
    rp.x = qkv;
    rp.cos_sin = p.cos_sin;
    rp.num_tokens = T;
    rp.num_heads = H + Hkv;  // q and k heads are adjacent in each row
    rp.head_dim = D;
    rp.x_stride_token = qkv_size;
    rp.x_stride_head = D;
    rp.cos_sin_stride = D;
    rp.dtype = t;
    if (!(st = rotary_embedding(rp, isa)).is_ok()) return st;
    clock.mark(kStackRope);
    // this step's K/V into the cache, then attention
    void* key_cache = at(p.kv_cache, l * kv_layer_stride, p.cache_dtype);
    void* value_cache = at(p.kv_cache, l * kv_layer_stride + kv_value_offset, p.cache_dtype);
    ReshapeAndCacheParams cp;
    cp.key = at(qkv, q_size, t);
    cp.value = at(qkv, q_size + kv_size, t);
    cp.key_cache = key_cache;
    cp.value_cache = value_cache;
    cp.slot_mapping = p.slot_mapping;
    cp.num_tokens = T;
    cp.num_kv_heads = Hkv;
    cp.head_size = D;
    cp.num_blocks = p.num_blocks;
    cp.kv_block_stride = kv_block_stride;
    cp.block_size = p.block_size;
    cp.key_stride_token = cp.value_stride_token = qkv_size;
    cp.key_stride_head = cp.value_stride_head = D;
    cp.src_dtype = t;
    cp.cache_dtype = p.cache_dtype;
    if (!(st = reshape_and_cache(cp)).is_ok()) return st;
    clock.mark(kStackCacheWrite);
    PagedAttentionParams ap;
    ap.out = attn;
    ap.query = qkv;
    ap.key_cache = key_cache;
    ap.value_cache = value_cache;
    ap.block_tables = p.block_tables;
    ap.seq_lens = p.seq_lens;
    ap.query_start_loc = p.query_start_loc;
    ap.num_seqs = p.num_seqs;
    ap.num_tokens = num_actual;
    ap.num_heads = H;
    ap.num_kv_heads = Hkv;
    ap.head_size = D;
    ap.num_blocks = p.num_blocks;
    ap.kv_block_stride = kv_block_stride;
    ap.block_size = p.block_size;
    ap.max_blocks_per_seq = p.max_blocks_per_seq;
    ap.q_stride_token = qkv_size;
    ap.q_stride_head = D;
    ap.out_stride_token = q_size;
    ap.out_stride_head = D;
    ap.q_dtype = t;
    ap.cache_dtype = p.cache_dtype;
    ap.scale = p.attn_scale;
    ap.max_query_len = p.max_query_len;
    ap.max_seq_len = p.max_seq_len;
    if (!(st = paged_attention(ap, isa)).is_ok()) return st;
    if (num_actual < T) std::memset(at(attn, num_actual * q_size, t), 0, (T - num_actual) * q_size * es);
    clock.mark(kStackAttention);
    // o_proj, then post_attention_layernorm with the residual add
    if (!(st = linear_call(w, kStackOProjLinear, w.o_proj, nullptr, E, q_size, attn, tmp, LinearEpilogue::kNone)).is_ok()) return st;
    if (!(st = lora_call(w, kStackOProjLinear, attn, q_size, tmp, E)).is_ok()) return st;
    clock.mark(kStackOProj);
    if (!(st = norm_call(w.post_norm, tmp, p.residual, h, T, E, E)).is_ok()) return st;
    clock.mark(kStackNorms);
    // MLP
    if ((lora_step && w.lora[kStackGateUpProj].a_t) || w.num_later_runs[kStackGateUpProj] > 0) {
      // gate | up (their adapter terms), then the SwiGLU
      gate_up = StackWorkspace::get(ws.gate_up, T * 2 * I * es);
      if (!(st = linear_call(w, kStackGateUpProj, w.gate_up, nullptr, 2 * I, E, h, gate_up, LinearEpilogue::kNone)).is_ok()) return st;
      if (!(st = lora_call(w, kStackGateUpProj, h, E, gate_up, 2 * I)).is_ok()) return st;
      SiluMulParams sp;
      sp.gate_up = gate_up;
      sp.out = act;
      sp.rows = T;
      sp.cols = I;
      sp.in_stride = 2 * I;
      sp.out_stride = I;
      sp.dtype = t;
      if (!(st = silu_mul(sp, isa)).is_ok()) return st;
    } else {
      if (!(st = linear_call(w, kStackGateUpProj, w.gate_up, nullptr, 2 * I, E, h, act, LinearEpilogue::kSiluMul)).is_ok()) return st;
    }
    clock.mark(kStackGateUp);
    if (!(st = linear_call(w, kStackDownProj, w.down, nullptr, E, I, act, p.hidden, LinearEpilogue::kNone)).is_ok()) return st;
    if (!(st = lora_call(w, kStackDownProj, act, I, p.hidden, E)).is_ok()) return st;
    clock.mark(kStackDown);
  }
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
