// What the [[devices]] entries mean beyond their keys: default names and GPU indices.
#pragma once

#include "train/config.h"

namespace hetra::train::cfg {

// Default names and GPU indices: the n-th device of a kind gets name <kind>n and, for a GPU, the
// lowest index not taken by an explicit one.
void resolveDevices(RunConfig& config);

}  // namespace hetra::train::cfg
