// The quantized linear launcher (quant_linear.h): checks the call, quantizes x per block, cuts the
// output into tasks (rows of x x weight rows) on the threads of parallel.h and finishes each task
// with the dense family's epilogue (bias, SwiGLU, bf16 rounding) unless the sums can land in out.
#include "kernels/quant_linear.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/parallel.h"
#include "kernels/quant_blocks.h"

namespace pagedcore {
namespace kernels {
namespace {

// Up to this many rows of x each thread streams one contiguous run of weight rows (as linear.cc).
constexpr int64_t kStreamRows = 32;
// Past it: tasks whose weight rows stay in L2 while the task's rows of x pass.
constexpr int64_t kTaskWeightBytes = 64 << 10;
// Rows of x per task past kStreamRows (a multiple of the kernels' 4-row tile).
constexpr int64_t kTaskRows = 64;
constexpr int64_t kTasksPerThread = 4;
// int8 per channel sums a whole row in int32 lanes: |w x| <= 128 * 127 per product.
constexpr int64_t kMaxInt8K = 65536;

std::string str(int64_t v) { return std::to_string(v); }
int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
bool valid(DType t) { return t == DType::kFloat32 || t == DType::kBFloat16; }

bool overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

const QuantIsaKernels& quant_isa_kernels(Isa isa) {
  switch (isa) {
    case Isa::kGeneric16: return quant_generic16::quant_kernels();
    case Isa::kAvx2: return quant_avx2::quant_kernels();
    case Isa::kAvx512: return quant_avx512::quant_kernels();
    case Isa::kAvx512Vnni: return quant_avx512_vnni::quant_kernels();
    default: return quant_generic::quant_kernels();
  }
}

Status check(const LinearParams& p, int64_t out_cols) {
  const std::string name = weight_format_name(p.weight_format);
  if (p.M < 0 || p.N < 0 || p.K < 0) return Status::invalid("linear: negative size");
  if (!valid(p.x_dtype) || !valid(p.out_dtype) || !valid(p.bias_dtype))
    return Status::invalid("linear: unknown dtype");
  if (p.epilogue != LinearEpilogue::kNone && p.epilogue != LinearEpilogue::kSiluMul)
    return Status::invalid("linear: unknown epilogue");
  if (p.epilogue == LinearEpilogue::kSiluMul && p.N % 2 != 0)
    return Status::invalid("linear: the SiLU-and-multiply epilogue needs an even number of weight rows "
                           "(gate rows then up rows); got N = " + str(p.N));
  const int64_t block = quant_block_size(p.weight_format);
  if (p.K % block != 0)
    return Status::invalid("linear: " + name + " weights come in blocks of " + str(block) +
                           " along K; K = " + str(p.K) + " is not a multiple");
  if (is_int8_per_channel(p.weight_format) && p.K > kMaxInt8K)
    return Status::invalid("linear: " + name + " supports K <= " + str(kMaxInt8K) + "; got " + str(p.K));
  if (is_x16_format(p.weight_format) && (p.N % kRowsX16 != 0 || out_cols % kRowsX16 != 0))
    return Status::invalid("linear: " + name + " weights are repacked in groups of 16 rows; N = " + str(p.N) +
                           (out_cols != p.N ? " (" + str(out_cols) + " outputs per half)" : "") +
                           " is not a multiple of 16");
  if (is_int8_per_channel(p.weight_format) && !p.weight_scales && p.N > 0)
    return Status::invalid("linear: " + name + " weights need weight_scales (fp32 [N])");
  if (p.M == 0 || out_cols == 0) return Status::ok();
  if (!p.out || (p.K > 0 && (!p.x || !p.weight))) return Status::invalid("linear: a data pointer is null");
  if (p.M > 1 && p.x_stride < p.K)
    return Status::invalid("linear: x_stride " + str(p.x_stride) + " < K " + str(p.K) + "; rows of x overlap");
  if (p.M > 1 && p.out_stride < out_cols)
    return Status::invalid("linear: out_stride " + str(p.out_stride) + " < the " + str(out_cols) +
                           " output columns; rows of out overlap");
  const int64_t out_bytes = ((p.M - 1) * p.out_stride + out_cols) * dtype_size(p.out_dtype);
  const int64_t x_bytes = p.K > 0 ? ((p.M - 1) * p.x_stride + p.K) * dtype_size(p.x_dtype) : 0;
  const int64_t w_bytes = p.N * quant_row_bytes(p.weight_format, p.K);
  const int64_t b_bytes = p.bias ? p.N * dtype_size(p.bias_dtype) : 0;
  const int64_t s_bytes = p.weight_scales ? p.N * 4 : 0;
  if (overlaps(p.out, out_bytes, p.x, x_bytes) || overlaps(p.out, out_bytes, p.weight, w_bytes) ||
      overlaps(p.out, out_bytes, p.bias, b_bytes) || overlaps(p.out, out_bytes, p.weight_scales, s_bytes))
    return Status::invalid("linear: out overlaps x, weight, bias or weight_scales; write to a new tensor");
  return Status::ok();
}

// Per calling thread, reused across calls (no allocation once warm).
struct Workspace {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int16_t> bsum;
  std::vector<float> sums;  // per worker thread: raw sums of one task (x 2 for kSiluMul)
};
Workspace& workspace() {
  static thread_local Workspace ws;
  return ws;
}

}  // namespace

bool is_quantized_format(WeightFormat f) { return quant_block_size(f) > 0; }

bool is_x16_format(WeightFormat f) {
  return f == WeightFormat::kQ4_0x16 || f == WeightFormat::kQ4_1x16 || f == WeightFormat::kQ8_0x16 ||
         f == WeightFormat::kQ5_0x16 || f == WeightFormat::kQ5_1x16 ||
         f == WeightFormat::kQ4_Kx16 || f == WeightFormat::kQ5_Kx16 || f == WeightFormat::kQ6_Kx16 ||
         f == WeightFormat::kInt8PerChannelX16;
}

bool is_int8_per_channel(WeightFormat f) {
  return f == WeightFormat::kInt8PerChannel || f == WeightFormat::kInt8PerChannelX16;
}

int64_t quant_block_size(WeightFormat f) {
  switch (f) {
    case WeightFormat::kInt8PerChannel: return 1;
    case WeightFormat::kInt8PerChannelX16: return 4;  // a 64-byte vector: 4 weights of 16 rows
    case WeightFormat::kQ4_0:
    case WeightFormat::kQ4_1:
    case WeightFormat::kQ8_0:
    case WeightFormat::kQ5_0:
    case WeightFormat::kQ5_1:
    case WeightFormat::kQ4_0x16:
    case WeightFormat::kQ4_1x16:
    case WeightFormat::kQ5_0x16:
    case WeightFormat::kQ5_1x16:
    case WeightFormat::kQ8_0x16: return kBlock32;
    case WeightFormat::kQ4_K:
    case WeightFormat::kQ5_K:
    case WeightFormat::kQ6_K:
    case WeightFormat::kQ4_Kx16:
    case WeightFormat::kQ5_Kx16:
    case WeightFormat::kQ6_Kx16: return kBlockK;
    default: return -1;
  }
}

int64_t quant_row_bytes(WeightFormat f, int64_t K) {
  switch (f) {
    case WeightFormat::kInt8PerChannel:
    case WeightFormat::kInt8PerChannelX16: return K;
    case WeightFormat::kQ4_0:
    case WeightFormat::kQ4_0x16: return K / kBlock32 * static_cast<int64_t>(sizeof(BlockQ4_0));
    case WeightFormat::kQ4_1:
    case WeightFormat::kQ4_1x16: return K / kBlock32 * static_cast<int64_t>(sizeof(BlockQ4_1));
    case WeightFormat::kQ8_0:
    case WeightFormat::kQ8_0x16: return K / kBlock32 * static_cast<int64_t>(sizeof(BlockQ8_0));
    case WeightFormat::kQ5_0:
    case WeightFormat::kQ5_0x16: return K / kBlock32 * static_cast<int64_t>(sizeof(BlockQ5_0));
    case WeightFormat::kQ5_1:
    case WeightFormat::kQ5_1x16: return K / kBlock32 * static_cast<int64_t>(sizeof(BlockQ5_1));
    case WeightFormat::kQ4_K: return K / kBlockK * static_cast<int64_t>(sizeof(BlockQ4_K));
    case WeightFormat::kQ5_K: return K / kBlockK * static_cast<int64_t>(sizeof(BlockQ5_K));
    case WeightFormat::kQ6_K:
    case WeightFormat::kQ6_Kx16: return K / kBlockK * static_cast<int64_t>(sizeof(BlockQ6_K));
    case WeightFormat::kQ4_Kx16: return K / kBlockK * static_cast<int64_t>(sizeof(BlockQ4_Kx16)) / kRowsX16;
    case WeightFormat::kQ5_Kx16: return K / kBlockK * static_cast<int64_t>(sizeof(BlockQ5_Kx16)) / kRowsX16;
    default: return -1;
  }
}

Isa quant_kernel_isa(Isa isa, bool from_active) {
  if (!isa_supported(isa)) return isa;  // refused by quant_linear, naming it
  switch (isa) {
    case Isa::kGeneric16Bf16: return Isa::kGeneric16;
    case Isa::kAvx512Bf16:
      return isa_supported(Isa::kAvx512Vnni) ? Isa::kAvx512Vnni : Isa::kAvx512;
    case Isa::kAvx512:
      return from_active && isa_supported(Isa::kAvx512Vnni) ? Isa::kAvx512Vnni : Isa::kAvx512;
    default: return isa;
  }
}

bool has_quant_kernel(WeightFormat format, Isa isa) {
  const int f = static_cast<int>(format);
  return isa_supported(isa) && f >= 0 && f < kNumWeightFormats && quant_isa_kernels(isa).formats[f] != nullptr;
}

Status quant_linear(const LinearParams& p, Isa isa) {
  const bool silu = p.epilogue == LinearEpilogue::kSiluMul;
  const int64_t out_cols = silu ? p.N / 2 : p.N;
  Status status = check(p, out_cols);
  if (!status.is_ok() || p.M == 0 || out_cols == 0) return status;
  if (!isa_supported(isa))
    return Status::invalid(std::string("linear: this CPU (or build) cannot run the ") + isa_name(isa) + " kernel");
  const QuantBlockFn fn = quant_isa_kernels(isa).formats[static_cast<int>(p.weight_format)];
  const QuantizeRowsFn quantize_rows = quant_isa_kernels(isa).quantize_rows;  // the ISA's (same bytes)
  if (!fn)
    return Status::invalid(std::string("linear: the ") + isa_name(isa) + " kernels have no " +
                           weight_format_name(p.weight_format) + " kernel (the repacked x16 formats run on "
                           "AVX2 and AVX-512 and on the portable generic path)");
  // The epilogue of the dense family of the same vector width (VNNI: AVX-512's).
  const LinearIsaKernels& dense = linear_isa_kernels(isa == Isa::kAvx512Vnni ? Isa::kAvx512 : isa);

  // x quantized per block: q rows zero-padded; one scale per block (or per row).
  const int64_t M = p.M, K = p.K;
  const int64_t block = is_int8_per_channel(p.weight_format) ? std::max<int64_t>(K, 1)
                                                              : quant_block_size(p.weight_format);
  Workspace& ws = workspace();
  QuantizedX qx;
  // (+ 32: a kernel with 64-byte vectors may read a lone last block's second half past K.)
  qx.q_stride = round_up(K + 32, 64);
  qx.d_stride = std::max<int64_t>(1, K / block);
  if (ws.q.size() < static_cast<size_t>(M * qx.q_stride)) ws.q.resize(M * qx.q_stride);
  if (ws.d.size() < static_cast<size_t>(M * qx.d_stride)) ws.d.resize(M * qx.d_stride);
  qx.q = ws.q.data();
  qx.d = ws.d.data();
  if (block == kBlock32) {
    qx.s_stride = K / kBlock32;
    if (ws.s.size() < static_cast<size_t>(M * qx.s_stride)) ws.s.resize(M * qx.s_stride);
    qx.s = ws.s.data();
  } else if (block == kBlockK) {
    qx.bsum_stride = K / 16;
    if (ws.bsum.size() < static_cast<size_t>(M * qx.bsum_stride)) ws.bsum.resize(M * qx.bsum_stride);
    qx.bsum = ws.bsum.data();
  }
  if (M * K >= (1 << 15)) {
    const int64_t rows_per_task = std::max<int64_t>(1, (1 << 13) / std::max<int64_t>(K, 1));
    const int64_t tasks = (M + rows_per_task - 1) / rows_per_task;
    parallel_for(static_cast<int>(tasks), [&](int t, int) {
      quantize_rows(p.x, p.x_dtype, p.x_stride, K, block, t * rows_per_task, std::min(M, (t + 1) * rows_per_task),
                    qx);
    });
  } else {
    quantize_rows(p.x, p.x_dtype, p.x_stride, K, block, 0, M, qx);
  }

  QuantBlockArgs args;
  args.x = qx;
  args.w = static_cast<const uint8_t*>(p.weight);
  args.row_bytes = quant_row_bytes(p.weight_format, K);
  args.w_scales = static_cast<const float*>(p.weight_scales);
  args.K = K;

  // Tasks: m_chunk rows of x x n_chunk output columns (as linear.cc plans them).
  const int threads = std::max(1, max_threads());
  const bool stream = M <= kStreamRows;
  args.n_outer = stream;
  int64_t n_chunk, m_chunk;
  if (stream) {
    n_chunk = (out_cols + threads - 1) / threads;
    m_chunk = M;
  } else {
    const int64_t row_bytes = std::max<int64_t>(1, args.row_bytes * (silu ? 2 : 1));
    const int64_t balance = (out_cols + kTasksPerThread * threads - 1) / (kTasksPerThread * threads);
    n_chunk = std::min(balance, std::max<int64_t>(8, kTaskWeightBytes / row_bytes));
    m_chunk = std::min(M, kTaskRows);
  }
  const int64_t n_align = is_x16_format(p.weight_format) ? kRowsX16 : 8;  // whole row groups per task
  n_chunk = std::max<int64_t>(n_align, round_up(n_chunk, n_align));
  const int64_t n_tasks = (out_cols + n_chunk - 1) / n_chunk;
  const int64_t m_tasks = (M + m_chunk - 1) / m_chunk;
  const bool direct = p.out_dtype == DType::kFloat32 && !p.bias && !silu;
  const int64_t sums_per_thread = m_chunk * n_chunk * (silu ? 2 : 1);
  if (!direct && ws.sums.size() < static_cast<size_t>(sums_per_thread * threads))
    ws.sums.resize(sums_per_thread * threads);
  float* sums = ws.sums.data();
  const int64_t num_tasks = n_tasks * m_tasks;
  if (num_tasks > (int64_t{1} << 30)) return Status::invalid("linear: too many tasks");

  parallel_for(static_cast<int>(num_tasks), [&](int task, int thread) {
    const int64_t mt = task / n_tasks, nt = task % n_tasks;
    const int64_t m0 = mt * m_chunk, m1 = std::min(M, m0 + m_chunk);
    const int64_t c0 = nt * n_chunk, c1 = std::min(out_cols, c0 + n_chunk);
    if (direct) {
      fn(args, m0, m1, c0, c1, static_cast<float*>(p.out) + m0 * p.out_stride + c0, p.out_stride);
      return;
    }
    float* g = sums + thread * sums_per_thread;
    float* u = silu ? g + m_chunk * n_chunk : nullptr;
    fn(args, m0, m1, c0, c1, g, n_chunk);
    if (silu) fn(args, m0, m1, out_cols + c0, out_cols + c1, u, n_chunk);
    LinearEpilogueArgs e;
    e.g = g;
    e.u = u;
    e.sum_stride = n_chunk;
    const int64_t bsize = dtype_size(p.bias_dtype);
    if (p.bias) {
      e.bias_g = static_cast<const char*>(p.bias) + c0 * bsize;
      if (silu) e.bias_u = static_cast<const char*>(p.bias) + (out_cols + c0) * bsize;
    }
    e.out = static_cast<char*>(p.out) + (m0 * p.out_stride + c0) * dtype_size(p.out_dtype);
    e.out_stride = p.out_stride;
    e.rows = m1 - m0;
    e.cols = c1 - c0;
    e.bias_dtype = p.bias_dtype;
    e.out_dtype = p.out_dtype;
    e.kind = p.epilogue;
    dense.epilogue(e);
  });
  return Status::ok();
}

}  // namespace kernels
}  // namespace pagedcore
