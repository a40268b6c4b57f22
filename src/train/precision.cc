#include "train/precision.h"

#include <ATen/autocast_mode.h>

#include "common/errors.h"

namespace hetra::train {

ForwardPrecision::ForwardPrecision(const std::string& precision) {
  if (precision == "fp32") return;
  HETRA_ENFORCE(precision == "bf16", "train.precision = \"", precision, "\"");
  HETRA_ENFORCE(!at::autocast::is_cpu_enabled(), "ForwardPrecision scopes do not nest");
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::autocast::set_cpu_enabled(true);
  enabled_ = true;
}

ForwardPrecision::~ForwardPrecision() {
  if (!enabled_) return;
  at::autocast::set_cpu_enabled(false);
  // The casts autocast cached for this forward (the parameters in bfloat16) are not reused by the
  // next one: the optimizer changes the parameters in between.
  at::autocast::clear_cache();
}

}  // namespace hetra::train
