// The parts of the module hetra._core, each bound by its own file (module.cc calls them in order).
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "common/errors.h"
#include "common/timing.h"

namespace hetra::python {

// Exceptions: hetra's typed errors as Python classes under one base, hetra._core.Error.
void bindErrors(pybind11::module_& module);
// The store, rank discovery and the job's store (runtime_binding.cc).
void bindRuntime(pybind11::module_& module);
// The communicator on raw buffers and its async handles (comm_binding.cc).
void bindComm(pybind11::module_& module);
// The global sampler, the balancer, the slow-device emulation and the kept host heap
// (runtime_binding.cc).
void bindTraining(pybind11::module_& module);
// The optimizers' one-pass updates on raw float32 buffers (optim_binding.cc).
void bindOptimizers(pybind11::module_& module);

// Seconds as Python gives them (float) to hetra's milliseconds; negative or NaN is a ConfigError
// naming `what`.
Millis millisFromSeconds(double seconds, const char* what);

// A buffer's address as Python passes it (an int); 0 only with no elements.
template <typename T>
T* address(uintptr_t value, size_t count, const char* what) {
  if (value == 0 && count > 0)
    throw ConfigError(str(what, " is a null address for ", count, " elements"));
  return reinterpret_cast<T*>(value);
}

}  // namespace hetra::python
