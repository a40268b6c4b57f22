// Checkpoints of sharded runs (ZeRO stages 1-3, docs/zero.md "Checkpoints"): every rank writes its
// own shard of the flat space (train/zero_layout.h) to a file of its own, so nothing is gathered to
// one rank; the step directory's state.json holds the plan. A resumed run reads, on each rank, only
// the byte ranges of the saved shards that overlap its new shard, whatever the old and the new
// shard sizes, rank counts and stages are.
//
// Vocabulary (besides checkpoint.h's):
//   shard file  step-<N>/shard-<r>.bin, written by rank r alone: its shard's fields one after the
//               other, each shard-size float32 values in the host's byte order; no header.
//   field       "parameters", then the optimizer's state: "momentum" (sgd with momentum), or
//               "exp_avg" and "exp_avg_sq" (adam, adamw). Stages 1 and 2 replicate the
//               parameters, yet each rank stores only its shard of them: one format for all stages.
//   chunk       kShardChunkBytes of a shard file (its last one may be shorter). The plan lists each
//               chunk's CRC32C, so a reader verifies exactly what it reads; the MANIFEST's
//               whole-file CRC32C serves checkCheckpoint's full verification.
//   plan        state.json's "zero": format (1), stage, optimizer, fields, elements (psi),
//               tensors (each tensor's elements, flat order), shards (elements per rank),
//               optimizer_steps, chunk_bytes, files [{name, bytes, crc32c: [one per chunk]}].
//   resharding  flat index i is the same parameter element in the saved run and the resumed one
//               (the same model), so rank r of the resumed run, shard [b, e), reads from every
//               saved shard [b_s, e_s) the range [max(b, b_s), min(e, e_s)) of each field.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/checkpoint.h"
#include "train/optim.h"

namespace hetra::comm {
class Communicator;
}

namespace hetra::train {

class Model;
class ZeroParallel;

constexpr size_t kShardChunkBytes = size_t(1) << 16;

struct WrittenShards {
  nlohmann::json plan;              // alike on every rank
  std::vector<FileChecksum> files;  // every rank's shard file, for the MANIFEST
};

// Collective: every rank writes its shard file into the directory `dir` (which exists), with an
// atomic write, and all-gathers the files' sizes and chunk checksums (a few numbers per rank).
// Throws IoError naming the file.
WrittenShards writeShards(ZeroParallel& zero, comm::Communicator& comm, const std::string& dir);

// Why `plan` cannot be resumed by a model of these tensors (their elements, in flat order) and
// this optimizer ("" when it can): what differs (the flat space's elements, a tensor's size, the
// optimizer or its state), the saved value and this run's. Stage, rank count and shard sizes may
// differ: that is resharding.
std::string planMismatch(const std::vector<int64_t>& tensorSizes, const OptimSpec& optimizer,
                         const nlohmann::json& plan);

// Reads this rank's shard of the step directory `dir` (whose state.json holds `plan`) into `zero`
// and restores it (a collective under stages 1 and 2). ConfigError from planMismatch's reason,
// naming `dir`; IoError for a shard file missing or shorter than the plan says, or a chunk whose
// CRC32C differs (naming the file and the chunk).
void readShards(ZeroParallel& zero, const nlohmann::json& plan, const std::string& dir);

// The same for a data-parallel run (zero.stage = 0), whose "shard" is the whole model: every
// parameter of `model`, and the state of `optimizer` (makeOptimizer's, of `spec`), from all the
// saved shards. No collective.
void readShardsIntoModel(Model& model, torch::optim::Optimizer& optimizer, const OptimSpec& spec,
                         const nlohmann::json& plan, const std::string& dir);

// The other way: a data-parallel run's model file (model.pt, checkpoint.h) loaded into a replica
// (makeReplica's: a whole model like zero's, built in host memory, with an optimizer of `spec`),
// and this rank's shard
// of its parameters and optimizer state taken into `zero`, which is then restored (a collective
// under stages 1 and 2). IoError (loadCheckpoint's) when the file does not fit the model or the
// optimizer.
void readModelFileIntoShards(ZeroParallel& zero,
                             const std::function<std::shared_ptr<Model>()>& makeReplica,
                             const OptimSpec& spec, const std::string& modelFile);

}  // namespace hetra::train
