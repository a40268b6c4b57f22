// The optimizers' one-pass updates (train/one_pass_update.h) on raw float32 buffers, for
// hetra.torch.optim: one loop over each parameter's memory where torch's step chains several
// tensor operations. The GIL is released while a loop runs.
#include <cstdint>

#include "bindings.h"
#include "common/errors.h"
#include "train/one_pass_update.h"

namespace py = pybind11;

namespace hetra::python {
namespace {

float* floats(uintptr_t value, int64_t count, const char* what) {
  if (count < 0) throw ConfigError(str("count=", count, "; allowed: >= 0"));
  return address<float>(value, size_t(count), what);
}

}  // namespace

void bindOptimizers(py::module_& module) {
  module.def(
      "sgd_update",
      [](uintptr_t params, uintptr_t grads, uintptr_t momentumBuffer, int64_t count, double lr,
         double weightDecay, double momentum, double dampening, bool nesterov, bool firstStep) {
        train::SgdUpdate update;
        update.lr = lr;
        update.weightDecay = weightDecay;
        update.momentum = momentum;
        update.dampening = dampening;
        update.nesterov = nesterov;
        update.firstStep = firstStep;
        float* buffer = momentum != 0 ? floats(momentumBuffer, count, "momentum_buffer") : nullptr;
        train::sgdUpdate(floats(params, count, "params"), floats(grads, count, "grads"), buffer,
                         count, update);
      },
      py::arg("params"), py::arg("grads"), py::arg("momentum_buffer"), py::arg("count"),
      py::arg("lr"), py::arg("weight_decay"), py::arg("momentum"), py::arg("dampening"),
      py::arg("nesterov"), py::arg("first_step"), py::call_guard<py::gil_scoped_release>(),
      "One SGD step of `count` float32 values at these addresses, as torch.optim.SGD computes "
      "it (first_step: the momentum buffer starts as a copy of the update).");
  module.def(
      "adam_update",
      [](uintptr_t params, uintptr_t grads, uintptr_t expAvg, uintptr_t expAvgSq, int64_t count,
         double lr, double weightDecay, double beta1, double beta2, double eps, int64_t step,
         bool decoupled) {
        if (step < 1) throw ConfigError(str("step=", step, "; allowed: >= 1 (1-based)"));
        train::AdamUpdate update;
        update.lr = lr;
        update.weightDecay = weightDecay;
        update.beta1 = beta1;
        update.beta2 = beta2;
        update.eps = eps;
        update.step = step;
        update.decoupled = decoupled;
        train::adamUpdate(floats(params, count, "params"), floats(grads, count, "grads"),
                          floats(expAvg, count, "exp_avg"), floats(expAvgSq, count, "exp_avg_sq"),
                          count, update);
      },
      py::arg("params"), py::arg("grads"), py::arg("exp_avg"), py::arg("exp_avg_sq"),
      py::arg("count"), py::arg("lr"), py::arg("weight_decay"), py::arg("beta1"), py::arg("beta2"),
      py::arg("eps"), py::arg("step"), py::arg("decoupled"),
      py::call_guard<py::gil_scoped_release>(),
      "One Adam (decoupled: AdamW) step of `count` float32 values at these addresses, as "
      "torch.optim.Adam computes it; `step` is 1-based.");
}

}  // namespace hetra::python
