// Checkpoints: the format of a saved run, its checksums, atomic writes, pruning, which run owns a
// checkpoint directory, and resuming from one.
//
// Vocabulary:
//   model file     one file (model.pt): the model's parameters and buffers, the optimizer's state
//                  (moments, step counts), the learning rate of each parameter group, the step and
//                  a free text. Other optimizer options (momentum, betas...) come from the caller's
//                  spec. LibTorch's archive format.
//   atomic write   the bytes go to <path>.tmp, which is fsynced and renamed over <path>, then the
//                  directory is fsynced: a reader sees the old content or the new, never a mix,
//                  also after a power loss or a crash while saving.
//   root           a run's checkpoint directory (train.checkpoint_dir).
//   step directory ROOT/step-<N>/, the checkpoint after N steps: model.pt, state.json (step,
//                  balancer state, device names, effective config), residuals.pt (one row of
//                  error-feedback residuals per rank, when the run compresses with error feedback),
//                  sync_residuals.pt (the same for periodic averaging's model deltas) and the
//                  MANIFEST. A sharded run (zero.stage >= 1) has no model.pt: each rank writes
//                  its shard-<r>.bin, and state.json holds the partition plan
//                  (train/zero_checkpoint.h).
//   MANIFEST       "hetra-checkpoint 1", then "file NAME SIZE CRC32C" (hex) per file. Written last.
//   commit         the files are written into ROOT/step-<N>.tmp, each fsynced, the MANIFEST last,
//                  then the directory is renamed to step-<N> and ROOT fsynced. ROOT/latest then
//                  names it, as a hint for people only: a crash between the two leaves it stale.
//   usable         a step directory with a MANIFEST whose files are all there with the listed sizes
//                  and checksums. Anything else was truncated or corrupted after the fact (disk,
//                  copy, a full file system) or never finished.
//   pruning        after each commit all but the train.keep_checkpoints newest step directories go,
//                  and every stale step-<N>.tmp (a save that crashed).
//   ownership      a fresh run refuses a root that already holds step directories: those belong to
//                  another run, pruning by step number would delete them, and a later --resume
//                  could pick the wrong run. Resuming is the way to write into such a root.
//   own checkpoint a usable step directory whose MANIFEST was written since a given time: one this
//                  run wrote (what an elastic restart resumes from).
//   resume         --resume PATH: PATH itself when it is a step directory, otherwise the newest
//                  usable step directory under it (newer unusable ones are skipped with a WARN).
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "train/config.h"

namespace torch::nn {
class Module;
}
namespace hetra::comm {
class Communicator;
}
namespace hetra::balance {
class Balancer;
}

namespace hetra::train {

class DataParallel;  // train/data_parallel.h
class PeriodicSync;  // train/periodic_sync.h
class ZeroParallel;  // train/zero_parallel.h
class Model;         // train/models.h

// --- Files -------------------------------------------------------------------------------------

// CRC32C (Castagnoli) of `size` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// Writes `bytes` to `path` with an atomic write. Throws IoError naming the path.
void writeFileAtomically(const std::string& path, const std::string& bytes);
// The same for the concatenation of `pieces`, without copying them into one buffer.
void writeFileAtomically(const std::string& path, const std::vector<std::string_view>& pieces);

// A file's MANIFEST entry, as its writer computed it.
struct FileChecksum {
  std::string name;  // in the step directory
  uint64_t size = 0;
  uint32_t crc = 0;
};

struct CheckpointInfo {
  int64_t step = 0;
  std::string text;
};

// The model file, written atomically. Throws IoError naming the path when the file cannot be
// written or read, or does not fit the model or the optimizer (then the model may be partly
// overwritten: do not train on).
void saveCheckpoint(const std::string& path, const torch::nn::Module& model,
                    const torch::optim::Optimizer& optimizer, const CheckpointInfo& info);
CheckpointInfo loadCheckpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer);

// --- Step directories --------------------------------------------------------------------------

// Commits `tmpDir` as `finalDir` (replacing an older one of that name): writes the MANIFEST over
// the regular files in it, fsyncs them, renames, fsyncs the parent. Throws IoError. The files of
// `written` (synced and checksummed by the ranks that wrote them) are listed as given, not read.
void commitCheckpoint(const std::string& tmpDir, const std::string& finalDir,
                      const std::vector<FileChecksum>& written = {});

// Why the step directory `dir` is not usable ("" when it is): no MANIFEST, a file listed there
// missing, shorter or longer than listed, or with another checksum. With shardContents false,
// the shard files of a sharded run (shard-<r>.bin) are checked for their size only: the ranks
// that resume verify the chunks they read (train/zero_checkpoint.h), and no rank reads them all.
std::string checkCheckpoint(const std::string& dir, bool shardContents = true);

// The step of a directory named step-<N>, or -1 for any other name.
int64_t checkpointStep(const std::string& name);

// The step directory `--resume path` means (see resume above; shard files checked by size): IoError
// with the reason when `path` is a step directory that is not usable, ConfigError when there is no
// usable one under it.
std::string findCheckpoint(const std::string& path);

// The step a usable step directory continues from (its state.json). Throws IoError.
int64_t savedStep(const std::string& stepDir);

// The newest own checkpoint under `root` (shard files checked by size): usable, MANIFEST written at
// or after `since` ("" when there is none). Newer unusable ones are skipped with a WARN naming them
// and why.
std::string newestCheckpointSince(const std::string& root, std::filesystem::file_time_type since);

// Removes all but the `keep` newest step directories under `root`, and stale step-<N>.tmp
// directories. Returns the removed paths.
std::vector<std::string> pruneCheckpoints(const std::string& root, int64_t keep);

// Ownership: throws ConfigError naming train.checkpoint_dir when `root` holds step directories.
void refuseForeignCheckpoints(const std::string& root);

// --- A run's checkpoints -----------------------------------------------------------------------

// What a training run saves and restores. The references must outlive this object.
struct TrainingParts {
  torch::nn::Module& model;
  torch::optim::Optimizer& optimizer;
  balance::Balancer& balancer;
  DataParallel* parallel;  // its error-feedback residuals; nullptr in a sharded run
  // A sharded run's engine (zero.stage >= 1): its shards and the plan are saved instead of the
  // model file, and resumed with resharding (train/zero_checkpoint.h).
  ZeroParallel* zero = nullptr;
  // A sharded run: builds a whole model like `model` (in host memory), which a data-parallel
  // checkpoint is loaded into before its shards are taken from it.
  std::function<std::shared_ptr<Model>()> makeReplica = nullptr;
  // Periodic averaging's error feedback on the model delta (sync_residuals.pt, rows as
  // residuals.pt's); saves happen at a round's end, where the rest is one model on every rank.
  PeriodicSync* periodic = nullptr;
};

// The checkpoints of the run `config` describes, seen from one rank of `comm`.
class RunCheckpoints {
 public:
  RunCheckpoints(const RunConfig& config, comm::Communicator& comm, TrainingParts parts);

  struct Resumed {
    std::string dir;   // the step directory resumed from
    int64_t step = 0;  // the steps it holds
  };
  // Where the run starts. A fresh run (resumePath "") that saves checkpoints claims the root
  // (ownership: ConfigError). A resumed run loads the checkpoint `--resume resumePath` means into
  // the parts. A sharded checkpoint reshards (train/zero_checkpoint.h): a sharded run reads its
  // new shard from the saved ones (a collective under stages 1 and 2), a data-parallel run all of
  // them; one of another model or optimizer is refused with ConfigError naming what differs. A
  // data-parallel checkpoint in a sharded run is loaded into a replica (makeReplica), and each
  // rank takes its shard from it. The balancer's state and the error-feedback
  // residuals are per rank: they are restored only when the checkpoint was written by the same
  // devices in the same order; otherwise the balancer starts afresh and the residuals at zero
  // (rank 0 WARNs). Each rank reads the files itself. Returns {"", 0} for a fresh run.
  Resumed start(const std::string& resumePath);

  // Collective, after `step` steps, on every rank: gathers every rank's residuals (a sharded run:
  // each rank writes its shard file), rank 0 commits the step directory, updates `latest` and
  // prunes. The balancer must have seen every step.
  void save(int64_t step);

 private:
  bool feedsBackErrors() const;
  std::vector<std::string> deviceNames() const;

  const RunConfig& config_;
  comm::Communicator& comm_;
  TrainingParts parts_;
};

}  // namespace hetra::train
