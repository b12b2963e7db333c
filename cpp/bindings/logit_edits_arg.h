// The Python LogitEdits (pagedcore/sampling/logit_edits.py) as kernels::LogitEditsParams: its numpy
// arrays by attribute name, held for the call (no copies: a wrong dtype is a TypeError).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "kernels/logit_edits.h"

namespace pagedcore {
namespace bindings {

namespace py = pybind11;

class LogitEditsArg {
 public:
  // edits: an object with the attributes below; num_rows: the step's rows (the penalties' length).
  LogitEditsArg(const py::object& edits, int64_t num_rows) {
    p_.num_bias = pairs(edits, "bias_rows", "bias_tokens", bias_rows_, bias_tokens_);
    bias_values_ = array<float>(edits, "bias_values", p_.num_bias);
    p_.num_bans = pairs(edits, "ban_rows", "ban_tokens", ban_rows_, ban_tokens_);
    p_.num_repetition = pairs(edits, "repetition_rows", "repetition_tokens", repetition_rows_, repetition_tokens_);
    p_.num_counted = pairs(edits, "counted_rows", "counted_tokens", counted_rows_, counted_tokens_);
    counts_ = array<int32_t>(edits, "counts", p_.num_counted);
    repetition_penalty_ = array<float>(edits, "repetition_penalty", num_rows);
    presence_penalty_ = array<float>(edits, "presence_penalty", num_rows);
    frequency_penalty_ = array<float>(edits, "frequency_penalty", num_rows);
    p_.bias_rows = bias_rows_.data();
    p_.bias_tokens = bias_tokens_.data();
    p_.bias_values = bias_values_.data();
    p_.ban_rows = ban_rows_.data();
    p_.ban_tokens = ban_tokens_.data();
    p_.repetition_rows = repetition_rows_.data();
    p_.repetition_tokens = repetition_tokens_.data();
    p_.repetition_penalty = repetition_penalty_.data();
    p_.counted_rows = counted_rows_.data();
    p_.counted_tokens = counted_tokens_.data();
    p_.counts = counts_.data();
    p_.presence_penalty = presence_penalty_.data();
    p_.frequency_penalty = frequency_penalty_.data();
  }
  const kernels::LogitEditsParams& params() const { return p_; }

 private:
  template <typename T>
  using Array = py::array_t<T, py::array::c_style>;

  template <typename T>
  static Array<T> array(const py::object& edits, const char* name, int64_t size) {
    Array<T> a = edits.attr(name).cast<Array<T>>();
    if (a.ndim() != 1 || a.shape(0) != size)
      throw py::value_error(std::string("logit edits: ") + name + " must be 1-D of " + std::to_string(size) +
                            " entries, got " + std::to_string(a.ndim()) + "-D of " +
                            std::to_string(a.ndim() ? a.shape(0) : 0));
    return a;
  }
  static int64_t pairs(const py::object& edits, const char* rows_name, const char* tokens_name, Array<int32_t>& rows,
                       Array<int32_t>& tokens) {
    rows = edits.attr(rows_name).cast<Array<int32_t>>();
    if (rows.ndim() != 1) throw py::value_error(std::string("logit edits: ") + rows_name + " must be 1-D");
    tokens = array<int32_t>(edits, tokens_name, rows.shape(0));
    return rows.shape(0);
  }

  kernels::LogitEditsParams p_;
  Array<int32_t> bias_rows_, bias_tokens_, ban_rows_, ban_tokens_, repetition_rows_, repetition_tokens_, counted_rows_,
      counted_tokens_, counts_;
  Array<float> bias_values_, repetition_penalty_, presence_penalty_, frequency_penalty_;
};

}  // namespace bindings
}  // namespace pagedcore
