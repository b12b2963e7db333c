// pagedcore._core's linear-layer entries (cpp/kernels/linear.h): the weight formats, LinearHandle
// (a layer's weight-side arguments bound once at load, so a decode call passes five numbers), the
// task-size knobs, the read-bandwidth probe and the embedding-row decoder (kernels/embedding_rows.h). pagedcore.ops.linear checks the tensors.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "bindings/bind_common.h"
#include "kernels/embedding_rows.h"
#include "kernels/linear.h"
#include "kernels/quant_linear.h"

namespace pagedcore {
namespace bindings {

void bind_linear(py::module_& m) {
  py::enum_<kernels::WeightFormat>(m, "WeightFormat", "How a linear layer's weight [N, K] is stored.")
      .value("DENSE_F32", kernels::WeightFormat::kDenseF32)
      .value("DENSE_BF16", kernels::WeightFormat::kDenseBf16)
      .value("INT8_PER_CHANNEL", kernels::WeightFormat::kInt8PerChannel)
      .value("Q4_0", kernels::WeightFormat::kQ4_0)
      .value("Q4_1", kernels::WeightFormat::kQ4_1)
      .value("Q8_0", kernels::WeightFormat::kQ8_0)
      .value("Q4_K", kernels::WeightFormat::kQ4_K)
      .value("Q5_K", kernels::WeightFormat::kQ5_K)
      .value("Q6_K", kernels::WeightFormat::kQ6_K)
      .value("Q4_0X16", kernels::WeightFormat::kQ4_0x16)
      .value("Q4_1X16", kernels::WeightFormat::kQ4_1x16)
      .value("Q8_0X16", kernels::WeightFormat::kQ8_0x16)
      .value("Q4_KX16", kernels::WeightFormat::kQ4_Kx16)
      .value("Q5_KX16", kernels::WeightFormat::kQ5_Kx16)
      .value("Q6_KX16", kernels::WeightFormat::kQ6_Kx16)
      .value("INT8_PER_CHANNEL_X16", kernels::WeightFormat::kInt8PerChannelX16)
      .value("F32X16", kernels::WeightFormat::kDenseF32x16)
      .value("BF16X16", kernels::WeightFormat::kDenseBf16x16)
      .value("DENSE_F16", kernels::WeightFormat::kDenseF16)
      .value("F16X16", kernels::WeightFormat::kDenseF16x16)
      .value("FP8_E4M3", kernels::WeightFormat::kDenseFp8E4M3)
      .value("FP8_E4M3X16", kernels::WeightFormat::kDenseFp8E4M3x16)
      .value("Q5_0", kernels::WeightFormat::kQ5_0)
      .value("Q5_1", kernels::WeightFormat::kQ5_1)
      .value("Q5_0X16", kernels::WeightFormat::kQ5_0x16)
      .value("Q5_1X16", kernels::WeightFormat::kQ5_1x16);
  py::class_<kernels::LinearLayer>(m, "LinearHandle",
                                   "Weight-side arguments of one linear layer (pagedcore.ops.linear builds it).")
      .def(py::init([](uintptr_t weight, uintptr_t bias, int64_t N, int64_t K, int32_t x_dtype,
                       kernels::WeightFormat weight_format, int32_t bias_dtype, int32_t out_dtype, int32_t epilogue,
                       int32_t isa, uintptr_t weight_scales, uintptr_t weight_block_scales,
                       int64_t weight_block_k) {
             if (epilogue != 0 && epilogue != 1) throw py::value_error("unknown epilogue code");
             kernels::LinearLayer layer;
             layer.params.weight = ptr<const void>(weight);
             layer.params.bias = ptr<const void>(bias);
             layer.params.weight_scales = ptr<const void>(weight_scales);
             layer.params.weight_block_scales = ptr<const float>(weight_block_scales);
             layer.params.weight_block_k = weight_block_k;
             layer.params.N = N;
             layer.params.K = K;
             layer.params.x_dtype = to_dtype(x_dtype);
             layer.params.weight_format = weight_format;
             layer.params.bias_dtype = to_dtype(bias_dtype);
             layer.params.out_dtype = to_dtype(out_dtype);
             layer.params.epilogue = static_cast<kernels::LinearEpilogue>(epilogue);
             layer.isa = to_isa(isa);
             return layer;
           }),
           py::kw_only(), py::arg("weight"), py::arg("bias"), py::arg("N"), py::arg("K"), py::arg("x_dtype"),
           py::arg("weight_format"), py::arg("bias_dtype"), py::arg("out_dtype"), py::arg("epilogue"),
           py::arg("isa") = -1, py::arg("weight_scales") = 0, py::arg("weight_block_scales") = 0,
           py::arg("weight_block_k") = 0)
      .def(
          "__call__",
          [](const kernels::LinearLayer& layer, uintptr_t out, uintptr_t x, int64_t M, int64_t x_stride,
             int64_t out_stride) {
            kernels::Status status;
            {
              py::gil_scoped_release release;
              status = layer.run(ptr<void>(out), ptr<const void>(x), M, x_stride, out_stride);
            }
            raise_if_error(status);
          },
          py::arg("out"), py::arg("x"), py::arg("M"), py::arg("x_stride"), py::arg("out_stride"),
          "out[M, :] = epilogue(x[M, K] . W^T + bias) (raw pointers; checked by the caller).");
  m.def(
      "set_linear_tuning",
      [](int64_t n_chunk, int64_t m_chunk) { kernels::set_linear_tuning({n_chunk, m_chunk}); },
      py::arg("n_chunk") = 0, py::arg("m_chunk") = 0,
      "Task sizes of the linear kernel (tests, benchmarks); 0 restores a default.");
  m.def(
      "quant_kernel_isa_for",
      [](kernels::WeightFormat format, int32_t isa) -> std::optional<std::string> {
        const kernels::Isa mapped = kernels::quant_kernel_isa(isa_or_active(isa), isa < 0);
        if (!kernels::has_quant_kernel(format, mapped)) return std::nullopt;
        return std::string(kernels::isa_name(mapped));
      },
      py::arg("weight_format"), py::arg("isa") = -1,
      "The ISA whose quantized kernels run weight_format for isa (-1: the active one), or None.");
  m.def(
      "dense_kernel_isa_for",
      [](kernels::WeightFormat format, int32_t isa) -> std::optional<std::string> {
        const kernels::Isa chosen = isa_or_active(isa);
        if (!kernels::has_dense_kernel(format, chosen)) return std::nullopt;
        return std::string(kernels::isa_name(chosen));
      },
      py::arg("weight_format"), py::arg("isa") = -1,
      "The ISA whose dense kernels run weight_format for isa (-1: the active one), or None.");
  m.def(
      "has_embedding_rows", [](kernels::WeightFormat format) { return kernels::has_embedding_rows(format); },
      py::arg("weight_format"), "Whether embedding_rows_cpu decodes tables of weight_format.");
  m.def(
      "embedding_rows_cpu",
      [](uintptr_t out, uintptr_t table, uintptr_t ids, int64_t num_ids, int64_t num_rows, int64_t K,
         int64_t out_stride, kernels::WeightFormat format, int32_t out_dtype) {
        kernels::EmbeddingRowsParams p;
        p.out = ptr<void>(out);
        p.table = ptr<const void>(table);
        p.ids = ptr<const int64_t>(ids);
        p.num_ids = num_ids;
        p.num_rows = num_rows;
        p.K = K;
        p.out_stride = out_stride;
        p.format = format;
        p.out_dtype = to_dtype(out_dtype);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::embedding_rows(p);
        }
        raise_if_error(status);
      },
      py::arg("out"), py::arg("table"), py::arg("ids"), py::arg("num_ids"), py::arg("num_rows"), py::arg("K"),
      py::arg("out_stride"), py::arg("weight_format"), py::arg("out_dtype"),
      "Raw-pointer entry of pagedcore.ops.embedding_rows.embedding_rows (call that instead).");
  m.def(
      "linear_read_probe",
      [](uintptr_t data, int64_t bytes, int threads, int32_t isa) {
        const kernels::Isa chosen = isa_or_active(isa);
        py::gil_scoped_release release;
        return kernels::read_probe(ptr<const void>(data), bytes, threads, chosen);
      },
      py::arg("data"), py::arg("bytes"), py::arg("threads"), py::arg("isa") = -1,
      "Streams bytes from data on threads threads (the bandwidth probe of bench/bench_decode.py).");
}

}  // namespace bindings
}  // namespace pagedcore
