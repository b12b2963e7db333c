// The one pybind11 file: exposes the C++ core as pagedcore._core.
// Arrays leave as numpy views on C++-owned buffers (no copies); C++ exceptions become Python
// exceptions (std::invalid_argument -> ValueError, std::out_of_range -> IndexError,
// std::logic_error -> RuntimeError).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/block_pool.h"
#ifdef PAGEDCORE_HAS_CUDA
#include "device_info.h"
#endif

namespace py = pybind11;
using namespace pagedcore;

namespace {

void bind_block_pool(py::module_& m) {
  py::class_<BlockPool>(m, "BlockPool")
      .def(py::init<int, int, bool>(), py::arg("num_blocks"), py::arg("block_size") = 16,
           py::arg("enable_prefix_caching") = false)
      .def_property_readonly("num_blocks", &BlockPool::num_blocks)
      .def_property_readonly("block_size", &BlockPool::block_size)
      .def_property_readonly("num_free_blocks", &BlockPool::num_free_blocks)
      .def_property_readonly("num_used_blocks", &BlockPool::num_used_blocks)
      .def_property_readonly("num_cached_blocks", &BlockPool::num_cached_blocks)
      .def_property_readonly("num_cached_free_blocks", &BlockPool::num_cached_free_blocks)
      .def_property_readonly("num_evictions", &BlockPool::num_evictions)
      .def("allocate", &BlockPool::allocate, py::arg("owner") = -1)
      .def("retain", &BlockPool::retain, py::arg("block_id"))
      .def("release", &BlockPool::release, py::arg("block_id"), py::arg("owner") = -1)
      .def("ref_count", &BlockPool::ref_count, py::arg("block_id"))
      .def("is_free", &BlockPool::is_free, py::arg("block_id"))
      .def("free_block_ids", &BlockPool::free_block_ids);
}

// ---- kernels: begin (CPU attention / cache kernels; see cpp/kernels/) ----
void bind_kernels(py::module_& m) {}
// ---- kernels: end ----

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "pagedcore C++ core: block pool, scheduler and CPU kernels";
#ifdef PAGEDCORE_HAS_CUDA
  m.attr("has_cuda") = true;
  m.def("cuda_device_count", &cuda::device_count, "Visible CUDA devices (0 without a driver or GPU).");
#else
  m.def("cuda_device_count", []() { return 0; }, "Visible CUDA devices (0: built without CUDA).");
  m.attr("has_cuda") = false;
#endif
  m.attr("NULL_BLOCK") = kNullBlock;
  m.attr("PAD_SLOT") = kPadSlot;
  bind_block_pool(m);
  bind_kernels(m);
}
