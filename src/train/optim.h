// Optimizers, learning-rate schedules, gradient clipping and checkpoints of model + optimizer.
//
// Vocabulary:
//   step        0-based index of an optimizer step; lrAt(step) is the rate that step uses.
//   warm-up     steps [0, warmupSteps): the rate rises linearly, lr * (step + 1) / warmupSteps,
//               so the first step already moves and step warmupSteps - 1 uses the full rate.
//   cosine      after warm-up the rate is lr * (1 + cos(pi * p)) / 2 with
//               p = (step - warmupSteps) / (totalSteps - warmupSteps): it reaches 0 at step
//               totalSteps, one past the last step, so every step of the run still moves.
//   checkpoint  one file: the model's parameters and buffers, the optimizer's state (moments,
//               step counts), the learning rate of each parameter group, the step and a free
//               text (e.g. the effective config). Other options (momentum, betas...) come from
//               the caller's spec. Written to <path>.tmp, flushed to disk, then renamed, so a
//               crash while saving leaves the previous checkpoint intact.
//   checkpoint directory
//               ROOT/step-<N>/: the files of the checkpoint of step N and a MANIFEST naming
//               each file with its size and CRC32C. The files are written into step-<N>.tmp,
//               the MANIFEST last, everything is fsynced, then the directory is renamed: a
//               step-<N> without a MANIFEST, or whose files do not match it, was truncated or
//               corrupted after the fact (disk, copy, a full file system).
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace hetra::train {

struct OptimSpec {
  std::string name = "sgd";  // sgd | adam | adamw
  double lr = 0.1;
  double momentum = 0.0;     // sgd
  bool nesterov = false;     // sgd, needs momentum > 0
  double weightDecay = 0.0;  // sgd, adam: L2 added to the gradient; adamw: decoupled
  double beta1 = 0.9;        // adam, adamw
  double beta2 = 0.999;      // adam, adamw
  double eps = 1e-8;         // adam, adamw
};

// Throws ConfigError naming the option for a value the optimizer does not allow.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimSpec& spec);

struct LrScheduleSpec {
  std::string kind = "constant";  // constant | cosine
  double lr = 0.1;
  int64_t totalSteps = 0;  // cosine: steps of the run
  int64_t warmupSteps = 0;
};

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleSpec& spec);  // ConfigError for a bad spec
  double lrAt(int64_t step) const;

 private:
  LrScheduleSpec spec_;
};

// Sets the learning rate of every parameter group.
void applyLr(torch::optim::Optimizer& optimizer, double lr);

// Scales all gradients so that their global L2 norm is at most maxNorm; returns the norm before
// scaling. Parameters without a gradient are skipped.
double clipGradNorm(const std::vector<torch::Tensor>& params, double maxNorm);

struct CheckpointInfo {
  int64_t step = 0;
  std::string text;
};

// Throws IoError naming the path when the file cannot be written or read, or does not fit the model
// or the optimizer (then the model may be partly overwritten: do not train on).
void saveCheckpoint(const std::string& path, const torch::nn::Module& model,
                    const torch::optim::Optimizer& optimizer, const CheckpointInfo& info);
CheckpointInfo loadCheckpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer);

// Writes `bytes` to `path` durably and atomically: a temporary file in the same directory,
// fsync, rename, fsync of the directory. A reader sees the old content or the new, never a mix,
// also after a power loss. Throws IoError naming the path.
void writeFileAtomically(const std::string& path, const std::string& bytes);

// CRC32C (Castagnoli) of `size` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// Checkpoint directories (see the vocabulary above). commitCheckpoint writes `tmpDir`'s MANIFEST
// over the regular files in it, fsyncs them, renames `tmpDir` to `finalDir` (replacing an older
// one of that name) and fsyncs the parent. Throws IoError.
void commitCheckpoint(const std::string& tmpDir, const std::string& finalDir);

// Why the checkpoint directory `dir` cannot be used ("" when it can): no MANIFEST, a file listed
// there missing, shorter or longer than listed, or with another checksum.
std::string checkCheckpoint(const std::string& dir);

// The step of a directory named step-<N>, or -1 for any other name.
int64_t checkpointStep(const std::string& name);

// The checkpoint `--resume path` means: `path` itself when it is a step directory (IoError with the
// reason when it is unusable), otherwise the newest usable step-<N> under it. Each newer one that
// is unusable is skipped with a WARN naming it and why. ConfigError when there is none.
std::string findCheckpoint(const std::string& path);

// Removes all but the `keep` newest step-<N> directories under `root`, and stale step-<N>.tmp
// directories (a save that crashed). Returns the removed paths.
std::vector<std::string> pruneCheckpoints(const std::string& root, int64_t keep);

}  // namespace hetra::train
