// The linear launcher: checks the call, lays x out for the chosen inner loop, cuts the output into
// tasks (rows of x x rows of W) and runs them on the threads of parallel.h, each task's raw sums
// going through the epilogue (bias, SwiGLU, bf16 rounding) unless they can land in out directly.
#include "kernels/linear.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "kernels/linear_kernel.h"
#include "kernels/parallel.h"
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace kernels {
namespace {

// Up to this many rows of x, each thread takes one contiguous run of weight rows and streams it
// once (weight tiles outer, rows inner). Measured on 2 cores (bench/bench_linear.py): one run per
// thread reaches the read bandwidth (41 GB/s bf16, 37 fp32 at M = 1), where cache-sized tasks
// handed out in turn reach 26-30: each new run restarts the prefetchers.
constexpr int64_t kStreamRows = 32;
// Past it, tasks of rows x weight rows: the task's weight rows stay in L2 while its rows pass.
constexpr int64_t kTaskWeightBytes = 96 << 10;
// Bytes of fp32 x rows per task (an L2-sized share).
constexpr int64_t kTaskXBytes = 256 << 10;
// Tasks per thread wanted for load balance when the weights alone would give fewer.
constexpr int64_t kTasksPerThread = 4;

std::atomic<int64_t> g_n_chunk{0};
std::atomic<int64_t> g_m_chunk{0};

std::string str(int64_t v) { return std::to_string(v); }
int64_t elem_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }
bool valid(DType t) { return t == DType::kFloat32 || t == DType::kBFloat16; }

bool dense(WeightFormat f) {
  return f == WeightFormat::kDenseF32 || f == WeightFormat::kDenseBf16 || f == WeightFormat::kDenseF16 ||
         f == WeightFormat::kDenseF32x16 || f == WeightFormat::kDenseBf16x16 || f == WeightFormat::kDenseF16x16 ||
         is_fp8_format(f);
}
bool x16(WeightFormat f) {
  return f == WeightFormat::kDenseF32x16 || f == WeightFormat::kDenseBf16x16 || f == WeightFormat::kDenseF16x16 ||
         f == WeightFormat::kDenseFp8E4M3x16;
}
constexpr int64_t kX16Cols = 16;  // output columns per group of the x16 layouts
constexpr int64_t kX16TaskCols = 48;  // columns of the AVX-512 x16 register tile (dense_x16_impl.h)
// Bytes of one weight row of K elements in a dense format (the x16 layouts hold the same bytes).
int64_t weight_row_bytes(WeightFormat f, int64_t K) {
  if (is_fp8_format(f)) return K;
  return K * (f == WeightFormat::kDenseF32 || f == WeightFormat::kDenseF32x16 ? 4 : 2);
}

// [begin, end) byte ranges of two strided row sets overlap.
bool overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

// Entries of an fp8x16 layer's block-scale table: [N/16][ceil(K / weight_block_k)].
int64_t block_scale_count(const LinearParams& p) {
  return p.N / kX16Cols * ((p.K + p.weight_block_k - 1) / p.weight_block_k);
}

Status check(const LinearParams& p, int64_t out_cols) {
  if (p.M < 0 || p.N < 0 || p.K < 0) return Status::invalid("linear: negative size");
  if (!valid(p.x_dtype) || !valid(p.out_dtype) || !valid(p.bias_dtype))
    return Status::invalid("linear: unknown dtype");
  if (!dense(p.weight_format))
    return Status::invalid("linear: unknown weight format code " + str(static_cast<int>(p.weight_format)));
  if (p.epilogue != LinearEpilogue::kNone && p.epilogue != LinearEpilogue::kSiluMul)
    return Status::invalid("linear: unknown epilogue");
  if (p.epilogue == LinearEpilogue::kSiluMul && p.N % 2 != 0)
    return Status::invalid("linear: the SiLU-and-multiply epilogue needs an even number of weight rows "
                           "(gate rows then up rows); got N = " + str(p.N));
  if (x16(p.weight_format) && (p.N % kX16Cols != 0 || out_cols % kX16Cols != 0))
    return Status::invalid("linear: " + std::string(weight_format_name(p.weight_format)) +
                           " weights are repacked in groups of 16 rows; N = " + str(p.N) +
                           (out_cols != p.N ? " (" + str(out_cols) + " outputs per half)" : "") +
                           " is not a multiple of 16; keep the checkpoint layout");
  if (p.weight_format == WeightFormat::kDenseBf16x16 && p.K % 2 != 0)
    return Status::invalid("linear: bf16x16 weights hold pairs along K; K = " + str(p.K) +
                           " is odd; keep the checkpoint layout");
  if (p.weight_block_scales && p.weight_format != WeightFormat::kDenseFp8E4M3x16)
    return Status::invalid("linear: block-wise weight scales go with fp8_e4m3x16 weights only, not " +
                           std::string(weight_format_name(p.weight_format)) + "; repack the fp8 rows (x16)");
  if (p.weight_block_scales && (p.weight_block_k <= 0 || p.weight_block_k % 4 != 0))
    return Status::invalid("linear: weight_block_k " + str(p.weight_block_k) +
                           " must be a positive multiple of 4 (inputs per scale block)");
  if (is_fp8_format(p.weight_format) && !p.weight_scales && !p.weight_block_scales)
    return Status::invalid("linear: " + std::string(weight_format_name(p.weight_format)) +
                           " weights need weight_scales (fp32 [N], one per weight row); got a null pointer");
  if (p.M == 0 || out_cols == 0) return Status::ok();
  if (!p.out || (p.K > 0 && (!p.x || !p.weight)))
    return Status::invalid("linear: a data pointer is null");
  if (p.M > 1 && p.x_stride < p.K)
    return Status::invalid("linear: x_stride " + str(p.x_stride) + " < K " + str(p.K) + "; rows of x overlap");
  if (p.M > 1 && p.out_stride < out_cols)
    return Status::invalid("linear: out_stride " + str(p.out_stride) + " < the " + str(out_cols) +
                           " output columns; rows of out overlap");
  const int64_t out_bytes = ((p.M - 1) * p.out_stride + out_cols) * elem_size(p.out_dtype);
  const int64_t x_bytes = p.K > 0 ? ((p.M - 1) * p.x_stride + p.K) * elem_size(p.x_dtype) : 0;
  const int64_t w_bytes = p.N * weight_row_bytes(p.weight_format, p.K);
  const int64_t b_bytes = p.bias ? p.N * elem_size(p.bias_dtype) : 0;
  // (other formats ignore the scales)
  const int64_t s_bytes = is_fp8_format(p.weight_format) && !p.weight_block_scales ? p.N * 4 : 0;
  const int64_t bs_bytes = p.weight_block_scales ? block_scale_count(p) * 4 : 0;
  if (overlaps(p.out, out_bytes, p.x, x_bytes) || overlaps(p.out, out_bytes, p.weight, w_bytes) ||
      overlaps(p.out, out_bytes, p.bias, b_bytes) || overlaps(p.out, out_bytes, p.weight_scales, s_bytes) ||
      overlaps(p.out, out_bytes, p.weight_block_scales, bs_bytes))
    return Status::invalid("linear: out overlaps x, weight, bias or weight_scales; write to a new tensor");
  return Status::ok();
}

// Per calling thread, reused across calls (no allocation once warm).
struct Workspace {
  std::vector<float> x32;   // [M, K] x in the layout the block function reads
  std::vector<float> sums;  // per worker thread: [m_chunk, n_chunk] (x 2 for kSiluMul) raw sums
};
Workspace& workspace() {
  static thread_local Workspace ws;
  return ws;
}

float x_value(const LinearParams& p, int64_t m, int64_t k) {
  if (p.x_dtype == DType::kFloat32) return static_cast<const float*>(p.x)[m * p.x_stride + k];
  return bf16_to_float(static_cast<const uint16_t*>(p.x)[m * p.x_stride + k]);
}

// Row m of x into dst (K floats): natural order, or pair order in chunks of `chunk` (linear_kernel.h).
void convert_row(const LinearParams& p, int64_t m, int64_t chunk, float* dst) {
  const int64_t K = p.K;
  if (chunk == 0) {
    if (p.x_dtype == DType::kBFloat16) {
      const uint16_t* src = static_cast<const uint16_t*>(p.x) + m * p.x_stride;
      for (int64_t k = 0; k < K; ++k) dst[k] = bf16_to_float(src[k]);
    } else {
      const float* src = static_cast<const float*>(p.x) + m * p.x_stride;
      std::copy(src, src + K, dst);
    }
    return;
  }
  const int64_t half = chunk / 2, k_vec = K - K % chunk;
  for (int64_t k = 0; k < k_vec; k += chunk)
    for (int64_t i = 0; i < half; ++i) {
      dst[k + i] = x_value(p, m, k + 2 * i);
      dst[k + half + i] = x_value(p, m, k + 2 * i + 1);
    }
  for (int64_t k = k_vec; k < K; ++k) dst[k] = x_value(p, m, k);
}

struct Plan {
  const LinearIsaKernels* kern;
  LinearBlockFn block;
  LinearBlockArgs args;
  int64_t out_cols, n_chunk, m_chunk, n_tasks, m_tasks;
  bool direct;          // raw sums straight into out (fp32, no scales, no bias, no SwiGLU)
  const float* scales;  // [N] fp32 per-row weight scales (fp8), else nullptr
  int64_t sums_stride;  // row stride of a thread's raw-sum scratch
  int64_t sums_per_thread;
  float* sums;
};

void run_task(const LinearParams& p, const Plan& plan, int64_t task, int thread) {
  const int64_t mt = task / plan.n_tasks, nt = task % plan.n_tasks;
  const int64_t m0 = mt * plan.m_chunk, m1 = std::min(p.M, m0 + plan.m_chunk);
  const int64_t c0 = nt * plan.n_chunk, c1 = std::min(plan.out_cols, c0 + plan.n_chunk);
  if (plan.direct) {
    float* out = static_cast<float*>(p.out) + m0 * p.out_stride + c0;
    plan.block(plan.args, m0, m1, c0, c1, out, p.out_stride);
    return;
  }
  float* g = plan.sums + thread * plan.sums_per_thread;
  const bool silu = p.epilogue == LinearEpilogue::kSiluMul;
  float* u = silu ? g + plan.m_chunk * plan.sums_stride : nullptr;
  plan.block(plan.args, m0, m1, c0, c1, g, plan.sums_stride);
  if (silu) plan.block(plan.args, m0, m1, plan.out_cols + c0, plan.out_cols + c1, u, plan.sums_stride);
  LinearEpilogueArgs e;
  e.g = g;
  e.u = u;
  e.sum_stride = plan.sums_stride;
  const int64_t bsize = elem_size(p.bias_dtype);
  if (p.bias) {
    e.bias_g = static_cast<const char*>(p.bias) + c0 * bsize;
    if (silu) e.bias_u = static_cast<const char*>(p.bias) + (plan.out_cols + c0) * bsize;
  }
  if (plan.scales) {  // [N] fp32: the task's gate (or only) rows, then its up rows
    e.scale_g = plan.scales + c0;
    if (silu) e.scale_u = plan.scales + plan.out_cols + c0;
  }
  e.out = static_cast<char*>(p.out) + (m0 * p.out_stride + c0) * elem_size(p.out_dtype);
  e.out_stride = p.out_stride;
  e.rows = m1 - m0;
  e.cols = c1 - c0;
  e.bias_dtype = p.bias_dtype;
  e.out_dtype = p.out_dtype;
  e.kind = p.epilogue;
  plan.kern->epilogue(e);
}

}  // namespace

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kDenseF32: return "dense_f32";
    case WeightFormat::kDenseBf16: return "dense_bf16";
    case WeightFormat::kInt8PerChannel: return "int8_per_channel";
    case WeightFormat::kQ4_0: return "q4_0";
    case WeightFormat::kQ4_1: return "q4_1";
    case WeightFormat::kQ8_0: return "q8_0";
    case WeightFormat::kQ4_K: return "q4_k";
    case WeightFormat::kQ5_K: return "q5_k";
    case WeightFormat::kQ6_K: return "q6_k";
    case WeightFormat::kQ4_0x16: return "q4_0x16";
    case WeightFormat::kQ4_1x16: return "q4_1x16";
    case WeightFormat::kQ8_0x16: return "q8_0x16";
    case WeightFormat::kQ4_Kx16: return "q4_kx16";
    case WeightFormat::kQ5_Kx16: return "q5_kx16";
    case WeightFormat::kQ6_Kx16: return "q6_kx16";
    case WeightFormat::kDenseF32x16: return "f32x16";
    case WeightFormat::kDenseBf16x16: return "bf16x16";
    case WeightFormat::kInt8PerChannelX16: return "int8_per_channelx16";
    case WeightFormat::kDenseF16: return "dense_f16";
    case WeightFormat::kDenseF16x16: return "f16x16";
    case WeightFormat::kDenseFp8E4M3: return "fp8_e4m3";
    case WeightFormat::kDenseFp8E4M3x16: return "fp8_e4m3x16";
    case WeightFormat::kQ5_0: return "q5_0";
    case WeightFormat::kQ5_1: return "q5_1";
    case WeightFormat::kQ5_0x16: return "q5_0x16";
    case WeightFormat::kQ5_1x16: return "q5_1x16";
  }
  return "unknown";
}

WeightFormat dense_weight_format(DType dtype) {
  return dtype == DType::kBFloat16 ? WeightFormat::kDenseBf16 : WeightFormat::kDenseF32;
}

WeightFormat dense_x16_weight_format(DType dtype) {
  return dtype == DType::kBFloat16 ? WeightFormat::kDenseBf16x16 : WeightFormat::kDenseF32x16;
}

bool is_dense_format_of(WeightFormat format, DType dtype) {
  return format == dense_weight_format(dtype) || format == dense_x16_weight_format(dtype);
}

bool is_fp8_format(WeightFormat f) { return f == WeightFormat::kDenseFp8E4M3 || f == WeightFormat::kDenseFp8E4M3x16; }

bool has_dense_kernel(WeightFormat format, Isa isa) {
  return dense(format) && isa_supported(isa) && linear_isa_kernels(isa).formats[static_cast<int>(format)].block;
}

const LinearIsaKernels& linear_isa_kernels(Isa isa) {
  switch (isa) {
    case Isa::kGeneric16: return linear_generic16::linear_kernels();
    case Isa::kGeneric16Bf16: return linear_generic16_bf16dot::linear_kernels();
    case Isa::kAvx2: return linear_avx2::linear_kernels();
    case Isa::kAvx512: return linear_avx512::linear_kernels();
    case Isa::kAvx512Bf16: return linear_avx512_bf16dot::linear_kernels();
    case Isa::kAvx512Vnni: return linear_avx512::linear_kernels();  // (int8 dots are the quantized family's)
    case Isa::kGeneric:
    default: return linear_generic8::linear_kernels();  // (unsupported ones never get here)
  }
}


void set_linear_tuning(const LinearTuning& tuning) {
  g_n_chunk.store(tuning.n_chunk > 0 ? tuning.n_chunk : 0);
  g_m_chunk.store(tuning.m_chunk > 0 ? tuning.m_chunk : 0);
}

Status linear(const LinearParams& p) {
  if (is_quantized_format(p.weight_format)) return quant_linear(p, quant_kernel_isa(active_isa(), true));
  return linear(p, active_isa());
}

Status LinearLayer::run(void* out, const void* x, int64_t M, int64_t x_stride, int64_t out_stride) const {
  LinearParams p = params;
  p.out = out;
  p.x = x;
  p.M = M;
  p.x_stride = x_stride;
  p.out_stride = out_stride;
  return isa ? linear(p, *isa) : linear(p);
}

Status linear(const LinearParams& p, Isa isa) {
  if (is_quantized_format(p.weight_format)) return quant_linear(p, quant_kernel_isa(isa, false));
  const bool silu = p.epilogue == LinearEpilogue::kSiluMul;
  const int64_t out_cols = silu ? p.N / 2 : p.N;
  Status status = check(p, out_cols);
  if (!status.is_ok() || p.M == 0 || out_cols == 0) return status;
  if (!isa_supported(isa))
    return Status::invalid(std::string("linear: this CPU (or build) cannot run the ") + isa_name(isa) +
                           " kernel");
  Plan plan;
  plan.kern = &linear_isa_kernels(isa);
  plan.out_cols = out_cols;
  plan.args.w = p.weight;
  plan.args.K = p.K;

  // x as the inner loop reads it: in place when it already is in that layout.
  Workspace& ws = workspace();
  int64_t chunk = -1;  // -1: x used in place; 0: natural fp32 copy; 2W: pair-order copy
  const LinearFormatKernels& row = plan.kern->formats[static_cast<int>(p.weight_format)];
  if (!row.block)
    return Status::invalid(std::string("linear: the ") + isa_name(isa) + " kernels have no " +
                           weight_format_name(p.weight_format) + " weight kernel");
  // (fp8x16 against bf16 x converts 4 k at a time: another K widens the weights to fp32 instead)
  const bool bf16_dot = row.block_bf16_x && p.x_dtype == DType::kBFloat16 &&
                        (p.weight_format != WeightFormat::kDenseFp8E4M3x16 || p.K % 4 == 0);
  if (bf16_dot) {
    plan.block = row.block_bf16_x;
    plan.args.x16 = static_cast<const uint16_t*>(p.x);
    plan.args.x_stride = p.x_stride;
  } else {
    plan.block = row.block;
    if (row.x_layout == LinearXLayout::kF32PairOrder) chunk = 2 * plan.kern->lanes;
    else chunk = p.x_dtype == DType::kFloat32 ? -1 : 0;
  }
  if (chunk == -1) {
    plan.args.x32 = static_cast<const float*>(p.x);
    plan.args.x_stride = p.x_stride;
  } else if (chunk >= 0) {
    if (ws.x32.size() < static_cast<size_t>(p.M * p.K)) ws.x32.resize(p.M * p.K);
    float* x32 = ws.x32.data();
    if (p.M * p.K >= (1 << 16)) {
      const int64_t rows_per_task = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(p.K, 1));
      const int64_t tasks = (p.M + rows_per_task - 1) / rows_per_task;
      parallel_for(static_cast<int>(tasks), [&](int t, int) {
        const int64_t end = std::min(p.M, (t + 1) * rows_per_task);
        for (int64_t m = t * rows_per_task; m < end; ++m) convert_row(p, m, chunk, x32 + m * p.K);
      });
    } else {
      for (int64_t m = 0; m < p.M; ++m) convert_row(p, m, chunk, x32 + m * p.K);
    }
    plan.args.x32 = x32;
    plan.args.x_stride = p.K;
  }

  // Tasks: m_chunk rows of x x n_chunk output columns.
  const int threads = std::max(1, max_threads());
  const int64_t row_bytes = std::max<int64_t>(1, weight_row_bytes(p.weight_format, p.K) * (silu ? 2 : 1));
  const bool stream = p.M <= kStreamRows;
  plan.args.n_outer = stream;
  int64_t n_chunk = g_n_chunk.load();
  if (n_chunk <= 0) {
    if (stream) {
      n_chunk = (out_cols + threads - 1) / threads;
    } else {
      const int64_t balance = (out_cols + kTasksPerThread * threads - 1) / (kTasksPerThread * threads);
      n_chunk = std::min(balance, std::max<int64_t>(8, kTaskWeightBytes / row_bytes));
    }
    // x16: whole column groups per task, and at least one full 3-group register tile when many rows
    // share the task (a 1-group tile loads a weight vector per 8 FMAs instead of per 24).
    if (x16(p.weight_format) && !stream) n_chunk = std::max(n_chunk, kX16TaskCols);
    const int64_t align = x16(p.weight_format) ? kX16Cols : 8;
    n_chunk = std::max<int64_t>(align, (n_chunk + align - 1) / align * align);
  }
  if (x16(p.weight_format) && n_chunk % kX16Cols != 0)
    return Status::invalid("linear: an n_chunk tuning of " + str(n_chunk) + " splits the 16-column groups of " +
                           weight_format_name(p.weight_format) + " weights; use a multiple of 16");
  int64_t m_chunk = g_m_chunk.load();
  if (m_chunk <= 0) {
    m_chunk = stream ? p.M : std::max<int64_t>(12, kTaskXBytes / std::max<int64_t>(1, p.K * 4) / 12 * 12);
    if (m_chunk >= p.M) m_chunk = p.M;
  }
  plan.n_chunk = n_chunk;
  plan.m_chunk = m_chunk;
  plan.n_tasks = (out_cols + n_chunk - 1) / n_chunk;
  plan.m_tasks = (p.M + m_chunk - 1) / m_chunk;
  // Block-wise scales are applied inside the kernel, per k-block; per-row scales by the epilogue.
  plan.scales = is_fp8_format(p.weight_format) && !p.weight_block_scales
                    ? static_cast<const float*>(p.weight_scales) : nullptr;
  if (p.weight_block_scales) {
    plan.args.block_scales = p.weight_block_scales;
    plan.args.block_k = p.weight_block_k;
    plan.args.k_blocks = (p.K + p.weight_block_k - 1) / p.weight_block_k;
  }
  plan.direct = p.out_dtype == DType::kFloat32 && !p.bias && !silu && !plan.scales;
  plan.sums_stride = n_chunk;
  plan.sums_per_thread = std::min(m_chunk, p.M) * n_chunk * (silu ? 2 : 1);
  plan.sums = nullptr;
  if (!plan.direct) {
    const size_t need = static_cast<size_t>(plan.sums_per_thread) * threads;
    if (ws.sums.size() < need) ws.sums.resize(need);
    plan.sums = ws.sums.data();
  }
  const int64_t num_tasks = plan.n_tasks * plan.m_tasks;
  if (num_tasks > (int64_t{1} << 30)) return Status::invalid("linear: too many tasks; raise the chunk sizes");
  parallel_for(static_cast<int>(num_tasks), [&](int task, int thread) { run_task(p, plan, task, thread); });
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
