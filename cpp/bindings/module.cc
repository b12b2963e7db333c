// pagedcore._core: the C++ core for Python, one bind_*.cc per noun. Arrays leave as numpy views on
// C++-owned buffers (no copies); C++ exceptions become Python exceptions (std::invalid_argument ->
// ValueError, std::out_of_range -> IndexError, std::logic_error -> RuntimeError).
#include <pybind11/pybind11.h>

#include "bindings/bind_common.h"
#include "core/block_pool.h"
#include "core/scheduler.h"

namespace pagedcore::bindings {
void bind_lora(py::module_& m);  // bind_lora.cc: the multi-LoRA kernel
void bind_distributed(py::module_& m);  // bind_distributed.cc: shared-memory all-reduce and channel ring
}

PYBIND11_MODULE(_core, m) {
  namespace bindings = pagedcore::bindings;
  m.doc() = "pagedcore C++ core: block pool, scheduler, CPU kernels (and CUDA kernels when built)";
  m.attr("NULL_BLOCK") = pagedcore::kNullBlock;
  m.attr("PAD_SLOT") = pagedcore::kPadSlot;
  bindings::bind_cuda(m);
  bindings::bind_block_pool(m);
  bindings::bind_scheduler(m);
  bindings::bind_cpu_config(m);
  bindings::bind_attention(m);
  bindings::bind_linear(m);
  bindings::bind_norm(m);
  bindings::bind_decoder_stack(m);
  bindings::bind_greedy_decode(m);
  bindings::bind_sampling(m);
  bindings::bind_lora(m);
  bindings::bind_distributed(m);
}
