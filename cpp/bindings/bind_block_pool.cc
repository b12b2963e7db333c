// pagedcore._core.BlockPool: the KV-cache block pool (cpp/core/block_pool.h), bound for tests and
// tools; the engine reaches it through Scheduler.gpu_pool / cpu_pool.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bind_common.h"
#include "core/block_pool.h"

namespace pagedcore {
namespace bindings {

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

}  // namespace bindings
}  // namespace pagedcore
