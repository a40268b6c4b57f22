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

// The share of the room for activations (the cap less the fixed bytes) that the measured bound
// keeps free: a micro-batch's peak varies a little with the order in which the intra-op threads
// allocate and autograd frees, and the measurement is of the sizes run so far.
constexpr double kMeasuredHeadroom = 0.05;

// The bound from a measurement: a micro-batch of `microBatch` samples peaked at `activationBytes`
// of activations beside `fixedBytes` (parameters, gradients, optimizer state, buffers), so a sample
// costs activationBytes / microBatch, rounded up (the micro-batch's fixed part counted as samples
// errs safe, and shrinks as larger micro-batches are measured). Most samples whose activations fit
// in (1 - kMeasuredHeadroom) of capBytes - fixedBytes; at least 1 (fewer is no training: the device
// then fails with DeviceOutOfMemoryError, which says what would fit). INT64_MAX without a cap (0)
// or when samples cost nothing. EnforceError for negative sizes or microBatch < 1.
int64_t measuredMaxMicroBatch(int64_t capBytes, int64_t fixedBytes, int64_t activationBytes,
                              int64_t microBatch);

// The least cap that holds a micro-batch of one sample.
int64_t bytesForOneSample(int64_t fixedBytes, int64_t bytesPerSample);

}  // namespace hetra::balance
