#include "train/pipeline/schedule.h"

#include <algorithm>

#include "common/errors.h"

namespace hetra::train::pipeline {

std::vector<Step> oneFOneB(int stage, int stages, int64_t chunks) {
  HETRA_ENFORCE(stage >= 0 && stage < stages, "stage ", stage, " of ", stages);
  HETRA_ENFORCE_GE(chunks, 1, "a step has at least one chunk");
  const bool first = stage == 0, last = stage + 1 == stages;
  const int64_t warmup = std::min<int64_t>(stages - 1 - stage, chunks);
  std::vector<Step> steps;
  auto add = [&](bool when, Action action, int64_t chunk) {
    if (when) steps.push_back({action, chunk});
  };
  auto forward = [&](int64_t k) {
    add(!first, Action::kReceiveActivation, k);
    add(true, Action::kForward, k);
  };
  auto backward = [&](int64_t j) {
    add(true, Action::kBackward, j);
    add(!first, Action::kSendGradient, j);
  };
  for (int64_t k = 0; k < warmup; ++k) {
    forward(k);
    add(!last, Action::kSendActivation, k);
  }
  for (int64_t j = 0; j < chunks - warmup; ++j) {
    forward(warmup + j);
    add(!last, Action::kReceiveGradient, j);  // before the send: see the header
    add(!last, Action::kSendActivation, warmup + j);
    backward(j);
  }
  for (int64_t j = chunks - warmup; j < chunks; ++j) {
    add(!last, Action::kReceiveGradient, j);
    backward(j);
  }
  return steps;
}

std::string describe(const Step& step) {
  static const char* const kNames[] = {"receive activation", "forward",  "send activation",
                                       "receive gradient",   "backward", "send gradient"};
  return str(kNames[int(step.action)], " ", step.chunk);
}

}  // namespace hetra::train::pipeline
