// PeriodicSync: local SGD with model averaging every H steps (post-local SGD), weighted by the
// samples each rank processed, and FedNova's normalisation when ranks take unequal local steps.
//
// Vocabulary:
//   local step   an optimizer step on this rank's own gradient (the mean over its share of the
//                step's global batch), without any communication.
//   round        the local steps between two averagings. Rounds end at every multiple of H
//                (train.sync_every), at the last step, and at evaluation and checkpoint steps, so
//                that evaluating and saving always see one model, the same on every rank.
//   anchor       the model at the start of a round: identical on every rank.
//   delta        anchor - local model, what the rank's local steps moved.
//   weight p_i   this rank's share of the round: samples processed / all ranks' samples
//                (PyTorch's PeriodicModelAverager weighs every rank 1/n, which on unequal shares
//                optimises another objective; `uniform` keeps it, for comparison only).
//   tau_i        the local steps rank i took in the round; in "steps" mode every rank takes all of
//                them, in "time" mode a rank stops once the round has lasted the time budget on it
//                (at least one step, at most H).
//
// Averaging (one exact allreduce of three float64 scalars, then one allreduce of the model-sized
// vector through the communicator, which takes the hierarchy on a group of islands and the
// configured compression, with error feedback on the delta where the provider keeps it):
//   plain     x = anchor - sum_i p_i delta_i
//   FedNova   x = anchor - tau_eff sum_i p_i delta_i / tau_i,  tau_eff = sum_i p_i tau_i
// Plain averaging with unequal tau_i converges to the minimiser of sum_i p_i tau_i F_i (fast ranks
// count more); dividing each delta by its steps restores sum_i p_i F_i (Wang et al., NeurIPS 2020).
// With equal tau_i both are the same. FedNova's normaliser for momentum SGD is ||a_i||_1, which
// with the momentum buffer kept across rounds grows as tau_i / (1 - momentum): proportional to
// tau_i, and the common factor cancels against tau_eff, so tau_i is used for every optimizer.
//
// Optimizer state across averaging: averaged with the same weights p_i, in the same vector (SGD's
// momentum buffers; Adam's and AdamW's first and second moments; Adam's step count becomes the
// weighted mean, rounded). Float32 model buffers are averaged likewise. So after every round all
// ranks hold one model and one optimizer state, and H = 1 is synchronous data parallelism exactly:
// sum_i p_i (anchor - x_i) = lr (momentum * m + the global batch's mean gradient). A checkpoint,
// always at a round's end, saves rank 0's model and optimizer as with synchronous training plus
// every rank's error-feedback residual (residuals()).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/timing.h"
#include "train/config.h"

namespace hetra::train {

enum class SyncMode { kSteps, kTime };

// "steps" | "time"; ConfigError naming train.sync_mode otherwise.
SyncMode parseSyncMode(const std::string& text);

struct PeriodicSyncOptions {
  int64_t every = 1;  // H: steps of a round (time mode: at most)
  SyncMode mode = SyncMode::kSteps;
  double roundSeconds = 0;  // time mode: a round's budget on each rank
  int64_t warmupSteps = 0;  // steps [0, warmupSteps) are synchronous: no rounds
  int64_t totalSteps = 0;   // the run's last step ends a round
  int64_t evalEvery = 0;    // > 0: steps that are multiples end a round
  int64_t checkpointEvery = 0;
  bool uniform = false;  // weigh every rank 1/n instead of by samples (comparisons only)
  // FedNova's normalisation by local steps; time mode always normalises.
  bool normalizeBySteps = false;
  // The model-sized allreduce: as DataParallelOptions.
  comm::CompressionPolicy compression;
  bool errorFeedback = false;
};

struct DataParallelOptions;  // train/data_parallel.h

// The options train.sync_* ask for, with the gradients' compression and error feedback.
PeriodicSyncOptions periodicSyncOptionsOf(const RunConfig& config, int64_t totalSteps,
                                          const DataParallelOptions& gradients);

class PeriodicSync {
 public:
  PeriodicSync(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
               std::shared_ptr<comm::Communicator> comm, PeriodicSyncOptions options);

  // Whether `step` is a local step of some round (else synchronous data parallelism).
  bool localAt(int64_t step) const;
  // Whether `step` is the last of its round: the model is averaged after it.
  bool endsRound(int64_t step) const;
  // Before local step `step`: whether this rank computes it (time mode: false once its round's
  // budget is spent). The first local step of a round takes the anchor.
  bool takesStep(int64_t step);
  // After this rank's local optimizer step on `samples` samples.
  void tookStep(int64_t samples);
  // Collective, after the last step of a round on every rank: averages the models and the optimizer
  // state; returns the seconds spent in communication.
  double average();

  // The round just averaged, for tests and logs.
  int64_t lastLocalSteps() const { return lastLocalSteps_; }
  double lastWeight() const { return lastWeight_; }

  // Error feedback on the delta (this rank's own), residualElements() floats, zeros where none is
  // owed yet; saved with checkpoints. loadResiduals of an undefined tensor resets it.
  int64_t residualElements() const { return vectorElements_; }
  torch::Tensor residuals() const;
  void loadResiduals(const torch::Tensor& flat);
  bool feedsBackErrors() const { return options_.errorFeedback && options_.compression.enabled(); }

 private:
  // The optimizer's state that is averaged, created (zeros, as before a first step) where a
  // parameter has none yet, so every rank lays out the same vector.
  struct OptimizerState {
    std::vector<torch::Tensor> tensors;
    std::vector<std::function<void(int64_t)>> setStep;  // Adam's step count, per parameter
    int64_t step = 0;                                   // Adam: the first parameter's
  };
  OptimizerState optimizerState();
  int64_t stateElements() const;
  void beginRound();

  std::shared_ptr<torch::nn::Module> model_;
  torch::optim::Optimizer& optimizer_;
  std::shared_ptr<comm::Communicator> comm_;
  PeriodicSyncOptions options_;
  std::vector<torch::Tensor> params_;   // float32 parameters, in registration order
  std::vector<torch::Tensor> buffers_;  // float32 model buffers
  int64_t paramElements_ = 0, vectorElements_ = 0;
  torch::Tensor anchor_;    // float32, paramElements_
  torch::Tensor vector_;    // what is all-reduced, vectorElements_
  torch::Tensor residual_;  // error feedback on vector_, this rank's
  bool inRound_ = false;
  Clock::time_point roundStart_;
  int64_t localSteps_ = 0, samples_ = 0;
  int64_t lastLocalSteps_ = 0;
  double lastWeight_ = 0;
};

}  // namespace hetra::train
