// pagedcore._core's settings shared by every CPU kernel: the instruction set (cpp/kernels/cpu_isa.h:
// one Isa for attention, linear and norms) and how the kernels use threads (parallel.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings/bind_common.h"
#include "kernels/cpu_isa.h"
#include "kernels/parallel.h"

namespace pagedcore {
namespace bindings {
namespace {

kernels::Isa isa_named(const std::string& name) {
  kernels::Isa isa;
  if (kernels::isa_from_name(name.c_str(), &isa)) return isa;
  std::string known;
  for (int code = 0; code < kernels::kNumIsas; ++code)
    known += std::string(code ? ", " : "") + kernels::isa_name(static_cast<kernels::Isa>(code));
  throw py::value_error("unknown ISA '" + name + "'; use one of " + known);
}

}  // namespace

void bind_cpu_config(py::module_& m) {
  m.def("kernel_isa", []() { return std::string(kernels::isa_name(kernels::active_isa())); },
        "The instruction set every CPU kernel uses unless a call names one (one of kernel_isa_names()).");
  m.def(
      "set_kernel_isa", [](const std::string& name) { return kernels::set_active_isa(isa_named(name)); },
      py::arg("name"), "Selects the CPU kernels' ISA (tests, benchmarks); False if this CPU or build lacks it.");
  m.def(
      "kernel_isa_names",
      []() {
        std::vector<std::string> names;
        for (int code = 0; code < kernels::kNumIsas; ++code)
          names.emplace_back(kernels::isa_name(static_cast<kernels::Isa>(code)));
        return names;
      },
      "Every ISA name, in code order: the isa code a kernel entry takes is its index (-1: the active one).");
  m.def(
      "kernel_isa_supported", [](const std::string& name) { return kernels::isa_supported(isa_named(name)); },
      py::arg("name"), "True when this CPU and build run the kernels of that ISA.");
  m.def("kernel_threading",
        []() { return std::string(kernels::active_threading() == kernels::Threading::kOpenMP ? "openmp" : "pool"); },
        "How the CPU kernels use threads: openmp (shares torch's runtime) or pool.");
  m.def(
      "set_kernel_threading",
      [](const std::string& name) {
        if (name != "openmp" && name != "pool") throw py::value_error("use 'openmp' or 'pool'");
        kernels::set_active_threading(name == "openmp" ? kernels::Threading::kOpenMP : kernels::Threading::kPool);
      },
      py::arg("name"));
  m.def("kernel_max_threads", &kernels::max_threads, "Threads a CPU kernel call may use.");
  m.def(
      "decode_threading",
      []() {
        const kernels::DecodeThreading t = kernels::decode_threading();
        return std::string(t == kernels::DecodeThreading::kPool     ? "pool"
                           : t == kernels::DecodeThreading::kOpenMP ? "openmp"
                           : t == kernels::DecodeThreading::kAuto   ? "auto"
                                                                    : "inherit");
      },
      "The threading of the one-call decode (GreedyDecoder.run / run_steps): inherit (the kernels', the "
      "default), auto (the pool for forwards of a few tokens, else the kernels'), pool or openmp.");
  m.def(
      "set_decode_threading",
      [](const std::string& name) {
        if (name != "auto" && name != "inherit" && name != "openmp" && name != "pool")
          throw py::value_error("use 'auto', 'inherit', 'openmp' or 'pool'");
        kernels::set_decode_threading(name == "pool"     ? kernels::DecodeThreading::kPool
                                      : name == "openmp" ? kernels::DecodeThreading::kOpenMP
                                      : name == "auto"   ? kernels::DecodeThreading::kAuto
                                                         : kernels::DecodeThreading::kInherit);
      },
      py::arg("name"));
}

}  // namespace bindings
}  // namespace pagedcore
