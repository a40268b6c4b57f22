#include "train/zero_offload.h"

#include "common/errors.h"

namespace hetra::train {

Offload parseOffload(const std::string& value) {
  if (value == "none") return Offload::kNone;
  if (value == "optimizer") return Offload::kOptimizer;
  if (value == "parameters") return Offload::kParameters;
  throw ConfigError(str("offload = \"", value, "\"; allowed: none, optimizer, parameters"));
}

const char* offloadName(Offload offload) {
  switch (offload) {
    case Offload::kOptimizer:
      return "optimizer";
    case Offload::kParameters:
      return "parameters";
    default:
      return "none";
  }
}

}  // namespace hetra::train
