// The one-pass updates of SGD, Adam and AdamW on raw float32 arrays: one loop over each
// parameter's memory instead of a chain of tensor operations. No LibTorch here: the training
// layer's fused optimizers (train/fused_optim.h) and ZeRO's shards call them, and so does the
// Python module, which must not link LibTorch (python/src: one build for any torch).
#pragma once

#include <cstdint>

namespace hetra::train {

// One update of n contiguous float32 values whose state the caller keeps, with LibTorch's
// arithmetic on float tensors (FusedSgd's and FusedAdam's step, ZeRO's shards, hetra.torch's
// optimizers), element for element, so a parameter updated in pieces ends bitwise where the whole
// one does; but denormal values count as zero (one_pass_update.cc says why).
struct SgdUpdate {
  double lr = 0, weightDecay = 0, momentum = 0, dampening = 0;
  bool nesterov = false;
  bool firstStep = false;  // the momentum buffer starts as a copy of the first update
};
void sgdUpdate(float* params, const float* grads, float* momentumBuffer, int64_t n,
               const SgdUpdate& update);

struct AdamUpdate {
  double lr = 0, weightDecay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t step = 1;        // 1-based: the bias corrections of this step
  bool decoupled = false;  // AdamW: the parameter shrinks by lr * weightDecay
};
void adamUpdate(float* params, const float* grads, float* expAvg, float* expAvgSq, int64_t n,
                const AdamUpdate& update);

}  // namespace hetra::train
