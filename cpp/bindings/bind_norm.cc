// pagedcore._core's fused elementwise entries (cpp/kernels/norm.h): RMSNorm with the residual add,
// and the rotary embedding; and the greedy argmax over logit rows (cpp/kernels/argmax_rows.h).
// Raw-pointer entries of pagedcore.ops.elementwise and pagedcore.ops.argmax (see bind_common.h).
#include <pybind11/pybind11.h>

#include "bindings/bind_common.h"
#include "kernels/argmax_rows.h"
#include "kernels/norm.h"

namespace pagedcore {
namespace bindings {

void bind_norm(py::module_& m) {
  m.def(
      "argmax_rows_cpu",
      [](uintptr_t logits, int64_t num_rows, int64_t vocab, int64_t row_stride, uintptr_t out) {
        kernels::ArgmaxRowsParams p;
        p.logits = ptr<const float>(logits);
        p.num_rows = num_rows;
        p.vocab = vocab;
        p.row_stride = row_stride;
        p.out = ptr<int64_t>(out);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::argmax_rows(p);
        }
        raise_if_error(status);
      },
      py::arg("logits"), py::arg("num_rows"), py::arg("vocab"), py::arg("row_stride"), py::arg("out"),
      "Raw-pointer entry of pagedcore.ops.argmax.argmax_rows (call that instead).");
  m.def(
      "rms_norm_cpu",
      [](uintptr_t out, uintptr_t residual, uintptr_t x, uintptr_t weight, int64_t rows, int64_t n,
         int64_t x_stride, int64_t out_stride, int64_t residual_stride, double eps, int32_t dtype, int32_t isa) {
        kernels::RmsNormParams p;
        p.out = ptr<void>(out);
        p.residual = ptr<void>(residual);
        p.x = ptr<const void>(x);
        p.weight = ptr<const void>(weight);
        p.rows = rows;
        p.n = n;
        p.x_stride = x_stride;
        p.out_stride = out_stride;
        p.residual_stride = residual_stride;
        p.eps = static_cast<float>(eps);
        p.dtype = to_dtype(dtype);
        const kernels::Isa chosen = isa_or_active(isa);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::rms_norm(p, chosen);
        }
        raise_if_error(status);
      },
      py::arg("out"), py::arg("residual"), py::arg("x"), py::arg("weight"), py::arg("rows"), py::arg("n"),
      py::arg("x_stride"), py::arg("out_stride"), py::arg("residual_stride"), py::arg("eps"), py::arg("dtype"),
      py::arg("isa") = -1,
      "Raw-pointer entry of pagedcore.ops.elementwise.rms_norm (call that instead).");
  m.def(
      "rotary_embedding_cpu",
      [](uintptr_t x, uintptr_t cos_sin, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
         int64_t x_stride_token, int64_t x_stride_head, int64_t cos_sin_stride, int32_t dtype, int32_t isa) {
        kernels::RotaryParams p;
        p.x = ptr<void>(x);
        p.cos_sin = ptr<const void>(cos_sin);
        p.num_tokens = num_tokens;
        p.num_heads = num_heads;
        p.head_dim = head_dim;
        p.x_stride_token = x_stride_token;
        p.x_stride_head = x_stride_head;
        p.cos_sin_stride = cos_sin_stride;
        p.dtype = to_dtype(dtype);
        const kernels::Isa chosen = isa_or_active(isa);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::rotary_embedding(p, chosen);
        }
        raise_if_error(status);
      },
      py::arg("x"), py::arg("cos_sin"), py::arg("num_tokens"), py::arg("num_heads"), py::arg("head_dim"),
      py::arg("x_stride_token"), py::arg("x_stride_head"), py::arg("cos_sin_stride"), py::arg("dtype"),
      py::arg("isa") = -1,
      "Raw-pointer entry of pagedcore.ops.elementwise.rotary_embedding (call that instead).");
}

}  // namespace bindings
}  // namespace pagedcore
