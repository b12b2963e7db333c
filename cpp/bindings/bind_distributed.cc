// pagedcore._core's shared-memory communication (cpp/distributed/): the all-reduce of a tensor-parallel
// group and the ring behind a Channel. pagedcore.distributed.shm_communicator / shm_channel wrap them
// (call those). The GIL is released during every wait; the optional is_alive callable is called
// (with the GIL) a few times a second. PeerDiedError -> pagedcore.distributed.errors.PeerDiedError,
// a deadline -> TimeoutError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bind_common.h"
#include "distributed/shm_all_reduce.h"
#include "distributed/shm_ring.h"

namespace pagedcore {
namespace bindings {
namespace {

using distributed::PeerDiedError;
using distributed::ShmAllReduce;
using distributed::ShmRing;
using distributed::WaitOptions;

// timeout_s < 0: no deadline. is_alive: None or a callable returning False once the peer is gone.
WaitOptions wait_options(double timeout_s, const py::object& is_alive, double spin_us) {
  WaitOptions o;
  o.timeout_s = timeout_s;
  if (spin_us >= 0) o.spin_us = spin_us;
  if (!is_alive.is_none()) {
    py::object check = is_alive;  // copied with the GIL held; destroyed with it held (after the wait)
    o.extra_check = [check]() {
      py::gil_scoped_acquire gil;
      if (!py::bool_(check())) throw PeerDiedError("is_alive() reports the peer gone");
    };
  }
  return o;
}

}  // namespace

void bind_distributed(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const distributed::PeerDiedError& e) {
      py::object cls = py::module_::import("pagedcore.distributed.errors").attr("PeerDiedError");
      PyErr_SetString(cls.ptr(), e.what());
    } catch (const distributed::WaitTimeoutError& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    }
  });

  m.def("shm_unlink", &distributed::SharedSegment::unlink, py::arg("name"),
        "Removes /dev/shm/<name>; False when it was already gone.");

  py::class_<ShmAllReduce>(m, "ShmAllReduce", "One rank's end of a shared-memory all-reduce group.")
      .def_static("create", &ShmAllReduce::create, py::arg("name"), py::arg("world_size"), py::arg("slot_bytes"),
                  "Creates the group's segment /dev/shm/<name> (the creator unlinks it).")
      .def(py::init<const std::string&, int>(), py::arg("name"), py::arg("rank"))
      .def(
          "all_reduce",
          [](ShmAllReduce& self, uintptr_t data, int64_t count, int32_t dtype, double timeout_s,
             const py::object& is_alive, double spin_us, int32_t isa) {
            const WaitOptions options = wait_options(timeout_s, is_alive, spin_us);
            const kernels::DType type = to_dtype(dtype);
            const kernels::Isa chosen = isa_or_active(isa);
            py::gil_scoped_release release;
            self.all_reduce_isa(ptr<void>(data), count, type, options, chosen);
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("timeout_s") = -1.0,
          py::arg("is_alive") = py::none(), py::arg("spin_us") = -1.0, py::arg("isa") = -1,
          "In-place sum over the group of `count` elements at address `data` (dtype code).")
      .def("close", &ShmAllReduce::close)
      .def_property_readonly("rank", &ShmAllReduce::rank)
      .def_property_readonly("world_size", &ShmAllReduce::world_size)
      .def_property_readonly("slot_bytes", &ShmAllReduce::slot_bytes);

  py::class_<ShmRing>(m, "ShmRing", "One end of a shared-memory ring: one writer, n readers.")
      .def_static("create", &ShmRing::create, py::arg("name"), py::arg("num_readers"), py::arg("capacity_bytes"),
                  "Creates the ring's segment /dev/shm/<name> (the creator unlinks it).")
      .def(py::init([](const std::string& name, int reader_index) {
             return std::make_unique<ShmRing>(name, reader_index < 0 ? ShmRing::kWriter
                                                                      : static_cast<uint32_t>(reader_index));
           }),
           py::arg("name"), py::arg("reader_index"), "reader_index -1 opens the writer's end.")
      .def(
          "write",
          [](ShmRing& self, const py::list& parts, double timeout_s, const py::object& is_alive) {
            std::vector<py::buffer_info> infos;  // hold the buffers for the copy
            std::vector<std::pair<const void*, size_t>> spans;
            infos.reserve(parts.size());
            for (const py::handle& part : parts) {
              infos.push_back(py::reinterpret_borrow<py::buffer>(part).request());
              const py::buffer_info& info = infos.back();
              const bool contiguous = info.ndim <= 1 && (info.ndim == 0 || info.strides[0] == info.itemsize);
              if (!contiguous) throw py::value_error("ShmRing.write: every part must be a contiguous buffer");
              spans.emplace_back(info.ptr, static_cast<size_t>(info.size * info.itemsize));
            }
            const WaitOptions options = wait_options(timeout_s, is_alive, -1);
            py::gil_scoped_release release;
            self.write(spans, options);
          },
          py::arg("parts"), py::arg("timeout_s") = -1.0, py::arg("is_alive") = py::none(),
          "Writes one frame: the concatenation of the 1-D contiguous buffers in `parts`.")
      .def(
          "read",
          [](ShmRing& self, double timeout_s, const py::object& is_alive) {
            const WaitOptions options = wait_options(timeout_s, is_alive, -1);
            uint64_t size = 0;
            {
              py::gil_scoped_release release;
              size = self.next_size(options);
            }
            py::object out = py::reinterpret_steal<py::object>(
                PyByteArray_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size)));
            if (!out) throw py::error_already_set();
            void* dst = PyByteArray_AsString(out.ptr());
            {
              py::gil_scoped_release release;
              self.read(dst, size, options);
            }
            return out;
          },
          py::arg("timeout_s") = -1.0, py::arg("is_alive") = py::none(), "The next frame as a bytearray.")
      .def("close", &ShmRing::close)
      .def_property_readonly("is_writer", &ShmRing::is_writer)
      .def_property_readonly("num_readers", &ShmRing::num_readers)
      .def_property_readonly("capacity", &ShmRing::capacity);
}

}  // namespace bindings
}  // namespace pagedcore
