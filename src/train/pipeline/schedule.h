// The 1F1B schedule of one pipeline stage as a list of actions, the order in which the stage
// computes and exchanges (no LibTorch: the runtime in pipeline_trainer.cc walks the list).
//
// Vocabulary (also balance/pipeline_partition.h):
//   stage i of P    holds a contiguous run of the model's blocks; receives activations from
//                   stage i - 1 and gradients from stage i + 1.
//   chunk k of M    one micro-batch of the step; forwards and backwards run in chunk order.
//   warm-up         stage i first runs min(P - 1 - i, M) forwards, then alternates one forward and
//                   one backward (steady 1F1B), then runs the backwards left (cool-down): at most
//                   P - i chunks are in flight on it.
//
// Send and receive complete only together (the communicator's MPI_Ssend semantics) and a stage's
// messages run one at a time, so the two stages of each link must list that link's messages in
// the same order, or both wait. In the steady phase stage i would send chunk k's activation while
// stage i + 1 sends back chunk j's gradient; here stage i first receives that gradient, then sends
// the activation, which stage i + 1 needs only after sending the gradient anyway. With every link
// in one order on both sides, no stage of the chain can wait forever (pipeline tests simulate it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hetra::train::pipeline {

enum class Action {
  kReceiveActivation,  // from stage i - 1: the input of this stage's first block
  kForward,
  kSendActivation,   // to stage i + 1: the output of this stage's last block
  kReceiveGradient,  // from stage i + 1: the gradient of that output
  kBackward,
  kSendGradient,  // to stage i - 1: the gradient of this stage's input
};

struct Step {
  Action action;
  int64_t chunk;
  bool operator==(const Step&) const = default;
};

// Stage `stage` of `stages` for `chunks` chunks; the first stage neither receives activations
// nor sends gradients, the last neither sends activations nor receives gradients.
std::vector<Step> oneFOneB(int stage, int stages, int64_t chunks);

// "forward 3" etc., for messages and tests.
std::string describe(const Step& step);

}  // namespace hetra::train::pipeline
