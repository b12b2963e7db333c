// pagedcore._core's multi-LoRA entries: the kernel (cpp/kernels/lora_kernel.h), a raw-pointer entry of
// pagedcore.lora.kernel.lora_shrink_expand, which checks the tensors (see bind_common.h); and the
// stand-alone SwiGLU a LoRA step runs after gate_up's adapter terms (cpp/kernels/silu_mul.h), a
// raw-pointer entry of pagedcore.layers.activation.silu_mul.
#include <pybind11/pybind11.h>

#include "bindings/bind_common.h"
#include "kernels/lora_kernel.h"
#include "kernels/silu_mul.h"

namespace pagedcore {
namespace bindings {

void bind_lora(py::module_& m) {
  m.def(
      "lora_shrink_expand_cpu",
      [](uintptr_t x, uintptr_t y, uintptr_t a_t, uintptr_t b_t, uintptr_t ranks, uintptr_t slice_starts,
         uintptr_t token_indices, uintptr_t segment_slots, uintptr_t segment_starts, int64_t num_tokens,
         int64_t in_features, int64_t out_features, int64_t x_stride, int64_t y_stride, int64_t num_slots,
         int64_t num_slices, int64_t max_rank, int64_t num_segments, int32_t dtype, int32_t isa) {
        kernels::LoRAParams p;
        p.x = ptr<const void>(x);
        p.y = ptr<void>(y);
        p.a_t = ptr<const float>(a_t);
        p.b_t = ptr<const float>(b_t);
        p.ranks = ptr<const int32_t>(ranks);
        p.slice_starts = ptr<const int32_t>(slice_starts);
        p.token_indices = ptr<const int32_t>(token_indices);
        p.segment_slots = ptr<const int32_t>(segment_slots);
        p.segment_starts = ptr<const int32_t>(segment_starts);
        p.num_tokens = num_tokens;
        p.in_features = in_features;
        p.out_features = out_features;
        p.x_stride = x_stride;
        p.y_stride = y_stride;
        p.num_slots = num_slots;
        p.num_slices = num_slices;
        p.max_rank = max_rank;
        p.num_segments = num_segments;
        p.dtype = to_dtype(dtype);
        const kernels::Isa chosen = isa_or_active(isa);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::lora_shrink_expand(p, chosen);
        }
        raise_if_error(status);
      },
      py::arg("x"), py::arg("y"), py::arg("a_t"), py::arg("b_t"), py::arg("ranks"), py::arg("slice_starts"),
      py::arg("token_indices"), py::arg("segment_slots"), py::arg("segment_starts"), py::arg("num_tokens"),
      py::arg("in_features"), py::arg("out_features"), py::arg("x_stride"), py::arg("y_stride"),
      py::arg("num_slots"), py::arg("num_slices"), py::arg("max_rank"), py::arg("num_segments"), py::arg("dtype"),
      py::arg("isa") = -1,
      "Raw-pointer entry of pagedcore.lora.kernel.lora_shrink_expand (call that instead).");
  m.def(
      "silu_mul_cpu",
      [](uintptr_t gate_up, uintptr_t out, int64_t rows, int64_t cols, int64_t in_stride, int64_t out_stride,
         int32_t dtype, int32_t isa) {
        kernels::SiluMulParams p;
        p.gate_up = ptr<const void>(gate_up);
        p.out = ptr<void>(out);
        p.rows = rows;
        p.cols = cols;
        p.in_stride = in_stride;
        p.out_stride = out_stride;
        p.dtype = to_dtype(dtype);
        const kernels::Isa chosen = isa_or_active(isa);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::silu_mul(p, chosen);
        }
        raise_if_error(status);
      },
      py::arg("gate_up"), py::arg("out"), py::arg("rows"), py::arg("cols"), py::arg("in_stride"),
      py::arg("out_stride"), py::arg("dtype"), py::arg("isa") = -1,
      "Raw-pointer entry of pagedcore.layers.activation.silu_mul (call that instead).");
}

}  // namespace bindings
}  // namespace pagedcore
