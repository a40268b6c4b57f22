// Memory caps of devices, on plain numbers: a device training a model needs `fixedBytes`
// (parameters, gradients, optimizer state) once and `bytesPerSample` (activations of forward and
// backward) for each sample of its micro-batch, so a cap bounds the micro-batch the balancer may
// give it.
#pragma once

#include <cstdint>

namespace hetra::balance {

// Most samples one micro-batch may hold under `capBytes`: INT64_MAX when capBytes is 0 (no cap) or
// a sample costs nothing beyond the fixed bytes, 0 when the cap cannot hold one sample.
// EnforceError for negative sizes.
int64_t maxMicroBatch(int64_t capBytes, int64_t fixedBytes, int64_t bytesPerSample);

// The least cap that holds a micro-batch of one sample.
int64_t bytesForOneSample(int64_t fixedBytes, int64_t bytesPerSample);

}  // namespace hetra::balance
