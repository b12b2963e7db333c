// What the binding files of pagedcore._core share: the bind_* entry points module.cc calls, and the
// conversions of the CPU kernel entries (raw pointers as ints, dtype and ISA codes, Status ->
// Python exception).
//
// The kernel entries only forward: pagedcore.ops.* checks the tensors and passes data_ptr() ints,
// sizes and strides; the launchers check indices and return a Status, raised here. The GIL is
// released while a kernel runs.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cpu_isa.h"
#include "kernels/kernel_types.h"

namespace pagedcore {
namespace bindings {

namespace py = pybind11;

void bind_block_pool(py::module_& m);
void bind_scheduler(py::module_& m);
void bind_cpu_config(py::module_& m);  // ISA and threads of the CPU kernels
void bind_attention(py::module_& m);   // paged attention and the KV-cache ops
void bind_linear(py::module_& m);
void bind_norm(py::module_& m);        // RMSNorm and the rotary embedding
void bind_decoder_stack(py::module_& m);
void bind_greedy_decode(py::module_& m);  // embedding -> stack -> head -> argmax in one call
void bind_sampling(py::module_& m);       // temperature / top-k / top-p / min-p sampling of logit rows
void bind_cuda(py::module_& m);        // has_cuda, cuda_device_count, and the CUDA entries when built

// Status -> exception: an out-of-range index IndexError, any other error ValueError.
inline void raise_if_error(const kernels::Status& status) {
  if (status.code == kernels::Status::kOutOfRange) throw py::index_error(status.message);
  if (status.code != kernels::Status::kOk) throw py::value_error(status.message);
}

inline kernels::DType to_dtype(int32_t code) {
  if (!kernels::valid_dtype(code)) throw py::value_error("unknown dtype code " + std::to_string(code));
  return static_cast<kernels::DType>(code);
}

// A KV cache's dtype code: an activation dtype or one of the fp8 formats (kernels/fp8.h).
inline kernels::DType to_cache_dtype(int32_t code) {
  if (!kernels::valid_cache_dtype(code)) throw py::value_error("unknown KV cache dtype code " + std::to_string(code));
  return static_cast<kernels::DType>(code);
}

// An ISA code of _core.kernel_isa_names() (its index), or -1: the active ISA at each call (nullopt).
inline std::optional<kernels::Isa> to_isa(int32_t code) {
  if (code == -1) return std::nullopt;
  if (code < 0 || code >= kernels::kNumIsas)
    throw py::value_error("unknown ISA code " + std::to_string(code) + "; see _core.kernel_isa_names()");
  return static_cast<kernels::Isa>(code);
}
inline kernels::Isa isa_or_active(int32_t code) {
  const std::optional<kernels::Isa> isa = to_isa(code);
  return isa ? *isa : kernels::active_isa();
}

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

}  // namespace bindings
}  // namespace pagedcore
