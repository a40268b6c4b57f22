// What a ZeRO rank keeps in host memory instead of on its device ([zero] offload, per device
// devices[i].offload; docs/zero.md "Offload").
#pragma once

#include <string>

namespace hetra::train {

enum class Offload {
  kNone,
  kOptimizer,   // the shard's optimizer state
  kParameters,  // stage 3: also the shard's parameters and gradients; the device keeps only the
                // gathered blocks and the activations
};

// "none", "optimizer", "parameters" (the config's values).
Offload parseOffload(const std::string& value);
const char* offloadName(Offload offload);

}  // namespace hetra::train
