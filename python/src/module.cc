// hetra._core: hetra's runtime for Python, on raw buffers. It includes no framework header, so one
// build serves every torch version; hetra.torch (pure Python) adapts tensors to it.
#include <cmath>

#include "bindings.h"
#include "common/errors.h"

namespace py = pybind11;

namespace hetra::python {

Millis millisFromSeconds(double seconds, const char* what) {
  if (!(seconds >= 0) || !std::isfinite(seconds))
    throw ConfigError(str(what, "=", seconds, " is not a number of seconds; allowed: >= 0"));
  return Millis(int64_t(std::llround(seconds * 1000.0)));
}

void bindErrors(py::module_& module) {
  // Python classes for the typed faults, so that a script catches exactly what went wrong; every
  // one derives from hetra._core.Error.
  static py::exception<Error> base(module, "Error", PyExc_RuntimeError);
  static py::exception<TimeoutError> timeout(module, "TimeoutError", base.ptr());
  static py::exception<IoError> io(module, "IoError", base.ptr());
  static py::exception<PeerAbortedError> peer(module, "PeerAbortedError", base.ptr());
  static py::exception<MismatchError> mismatch(module, "MismatchError", base.ptr());
  static py::exception<ConfigError> config(module, "ConfigError", base.ptr());
  static py::exception<EnforceError> enforce(module, "EnforceError", base.ptr());
  // Most derived first: one translator, so the order of the checks is the order of this list.
  py::register_exception_translator([](std::exception_ptr pending) {
    try {
      if (pending) std::rethrow_exception(pending);
    } catch (const PeerAbortedError& e) {
      // The dead or aborting peer's rank travels as an attribute (-1 when unknown).
      py::object error = py::handle(peer.ptr())(e.what());
      error.attr("rank") = e.rank();
      PyErr_SetObject(peer.ptr(), error.ptr());
    } catch (const TimeoutError& e) {
      timeout(e.what());
    } catch (const IoError& e) {
      io(e.what());
    } catch (const MismatchError& e) {
      mismatch(e.what());
    } catch (const ConfigError& e) {
      config(e.what());
    } catch (const EnforceError& e) {
      enforce(e.what());
    } catch (const Error& e) {
      base(e.what());
    }
  });
}

}  // namespace hetra::python

PYBIND11_MODULE(_core, module) {
  module.doc() =
      "hetra's communicator, store, rank discovery, sampler, balancer and slow-device "
      "emulation on raw buffers (no torch header); hetra.torch builds on it.";
  hetra::python::bindErrors(module);
  hetra::python::bindRuntime(module);
  hetra::python::bindComm(module);
  hetra::python::bindTraining(module);
  hetra::python::bindOptimizers(module);
}
