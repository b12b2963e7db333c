// pagedcore._core.sample_rows_cpu: the raw-pointer entry of pagedcore.ops.sample_rows (call that
// instead), which checks shapes and dtypes; this checks values (cpp/kernels/sample_rows.h).
#include <pybind11/pybind11.h>

#include <pybind11/numpy.h>

#include "bindings/bind_common.h"
#include "bindings/logit_edits_arg.h"
#include "kernels/logprobs_rows.h"
#include "kernels/sample_rows.h"

namespace pagedcore {
namespace bindings {

void bind_sampling(py::module_& m) {
  m.def(
      "sample_rows_cpu",
      [](uintptr_t logits, int64_t num_rows, int64_t vocab, int64_t row_stride, uintptr_t temperature,
         uintptr_t top_k, uintptr_t top_p, uintptr_t min_p, uintptr_t noise, int64_t noise_width, uintptr_t out, uintptr_t cuts) {
        kernels::SampleRowsParams p;
        p.logits = ptr<float>(logits);
        p.num_rows = num_rows;
        p.vocab = vocab;
        p.row_stride = row_stride;
        p.temperature = ptr<const float>(temperature);
        p.top_k = ptr<const int64_t>(top_k);
        p.top_p = ptr<const float>(top_p);
        p.min_p = ptr<const float>(min_p);
        p.noise = ptr<const float>(noise);
        p.noise_width = noise_width;
        p.out = ptr<int64_t>(out);
        p.cuts = ptr<float>(cuts);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::sample_rows(p);
        }
        raise_if_error(status);
      },
      py::arg("logits"), py::arg("num_rows"), py::arg("vocab"), py::arg("row_stride"), py::arg("temperature"),
      py::arg("top_k"), py::arg("top_p"), py::arg("min_p"), py::arg("noise"), py::arg("noise_width"), py::arg("out"),
      py::arg("cuts") = 0,
      "Raw-pointer entry of pagedcore.ops.sample_rows.sample_rows (call that instead).");
  m.def(
      "apply_logit_edits",
      [](py::array_t<float, py::array::c_style> logits, const py::object& edits) {
        if (logits.ndim() != 2) throw py::value_error("apply_logit_edits: logits must be [rows, vocab] float32");
        const int64_t rows = logits.shape(0), vocab = logits.shape(1);
        const LogitEditsArg arg(edits, rows);
        float* data = logits.mutable_data();
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::apply_logit_edits(arg.params(), data, rows, vocab, vocab);
        }
        raise_if_error(status);
      },
      py::arg("logits"), py::arg("edits"),
      "logits [rows, vocab] float32 numpy (C order), edited in place by a pagedcore.sampling.logit_edits.LogitEdits "
      "(logit_bias, min_tokens bans, repetition, presence and frequency penalties; cpp/kernels/logit_edits.h).");
  m.def(
      "logprobs_rows_cpu",
      [](uintptr_t logits, int64_t num_rows, int64_t vocab, int64_t row_stride, uintptr_t token_ids, int64_t num_top,
         uintptr_t out_ids, uintptr_t out_logprobs, uintptr_t out_ranks) {
        kernels::LogprobsRowsParams p;
        p.logits = ptr<float>(logits);
        p.num_rows = num_rows;
        p.vocab = vocab;
        p.row_stride = row_stride;
        p.token_ids = ptr<const int64_t>(token_ids);
        p.num_top = num_top;
        p.out_ids = ptr<int64_t>(out_ids);
        p.out_logprobs = ptr<float>(out_logprobs);
        p.out_ranks = ptr<int64_t>(out_ranks);
        kernels::Status status;
        {
          py::gil_scoped_release release;
          status = kernels::logprobs_rows(p);
        }
        raise_if_error(status);
      },
      py::arg("logits"), py::arg("num_rows"), py::arg("vocab"), py::arg("row_stride"), py::arg("token_ids"),
      py::arg("num_top"), py::arg("out_ids"), py::arg("out_logprobs"), py::arg("out_ranks"),
      "Raw-pointer entry of pagedcore.sampling.logprobs.gather_logprobs for CPU logits (call that instead).");
  m.def("sample_noise_width", &kernels::sample_noise_width, py::arg("vocab"),
        "Exponential(1) draws sample_rows reads a row: ceil(vocab / 256) blocks, then 256 for inside one.");
}

}  // namespace bindings
}  // namespace pagedcore
