// The checks between keys, one function per rule, in the order checkBetweenKeys runs them: the
// devices first (the other rules count them), then training, model, topology, hosts and elastic.
#include "train/config/validate.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/errors.h"
#include "train/config/schema.h"
#include "train/dataset_geometry.h"

namespace hetra::train::cfg {
namespace {

using Warnings = std::vector<std::string>;

// What the rules share: the config and where its keys came from.
struct Check {
  const RunConfig& c;
  const Locate& locate;

  [[noreturn]] void fail(const std::string& key, const std::string& value,
                         const std::string& what) const {
    throw ConfigError(str(prefixed(locate(key)), key, " = ", value, ": ", what));
  }
};

std::string deviceKey(size_t i, const std::string& leaf) {
  return str("devices[", i, "].", leaf);
}

void checkHasDevices(const RunConfig& c, const std::string& sourceName) {
  if (c.devices.empty())
    throw ConfigError(str(prefixed(sourceName),
                          "no devices: add one [[devices]] table per rank, e.g.\n  [[devices]]\n"
                          "  kind = \"cpu\"\n  threads = 1"));
}

// A device kind this build cannot train on is refused, never run on the CPU in its place.
void checkKindsAllowed(const Check& check, const Capabilities& caps) {
  for (size_t i = 0; i < check.c.devices.size(); ++i) {
    const std::string& kind = check.c.devices[i].kind;
    const std::string key = deviceKey(i, "kind");
    if (kind == "cuda" && !caps.cuda && caps.cudaBuild)
      check.fail(key, quote(kind),
                 "training on CUDA devices is not implemented yet: this CUDA build has the NCCL "
                 "transport and the codec kernels, but the trainer computes on the CPU (use "
                 "kind = \"cpu\")");
    if (kind == "cuda" && !caps.cuda)
      check.fail(key, quote(kind),
                 "this hetra was not built with CUDA support (build with -DHETRA_WITH_CUDA=ON)");
    if (kind == "rocm" && !caps.rocm)
      check.fail(key, quote(kind),
                 "ROCm devices are not supported yet: the ROCm build (HETRA_WITH_ROCM=ON) "
                 "compiles the codec kernels and the staging only, not training (use kind = "
                 "\"cpu\")");
  }
}

// Only GPUs have an index, and one rank uses a GPU.
void checkGpuIndices(const Check& check) {
  std::map<std::pair<std::string, int64_t>, size_t> gpus;
  for (size_t i = 0; i < check.c.devices.size(); ++i) {
    const DeviceConfig& d = check.c.devices[i];
    if (d.kind == "cpu" && d.index >= 0)
      check.fail(deviceKey(i, "index"), std::to_string(d.index),
                 "only cuda and rocm devices have an index (this one is kind = \"cpu\")");
    if (d.kind == "cpu") continue;
    auto [it, fresh] = gpus.insert({{d.kind, d.index}, i});
    if (!fresh)
      check.fail(deviceKey(i, "index"), std::to_string(d.index),
                 str("already used by devices[", it->second, "] (one rank per GPU)"));
  }
}

void checkUniqueNames(const Check& check) {
  std::map<std::string, size_t> names;
  for (size_t i = 0; i < check.c.devices.size(); ++i) {
    auto [it, fresh] = names.insert({check.c.devices[i].name, i});
    if (!fresh)
      check.fail(deviceKey(i, "name"), quote(check.c.devices[i].name),
                 str("already used by devices[", it->second, "]; names must be unique"));
  }
}

// The reader checks the range; a config built in code reaches here without it.
void checkSlowdowns(const Check& check) {
  for (size_t i = 0; i < check.c.devices.size(); ++i)
    if (check.c.devices[i].slowdown < 1)
      check.fail(deviceKey(i, "slowdown"), formatDouble(check.c.devices[i].slowdown),
                 "out of range: must be >= 1");
}

// An emulated cpu device keeps threads / slowdown cores busy (at its fastest over the schedule):
// more than the process may use skews the timings the balancer measures.
void warnOversubscription(const RunConfig& c, const Capabilities& caps, Warnings& warnings) {
  double dutyCycles = 0;
  for (const auto& d : c.devices) {
    if (d.kind != "cpu") continue;
    double fastest = d.slowdown;
    for (const auto& change : d.slowdownSchedule) fastest = std::min(fastest, change.factor);
    dutyCycles += double(d.threads) / std::max(1.0, fastest);
  }
  if (caps.cores > 0 && dutyCycles > caps.cores + 1e-9)
    warnings.push_back(str("the cpu devices keep about ",
                           formatBound(std::round(dutyCycles * 100) / 100),
                           " cores busy (sum of threads / slowdown) but this process may use ",
                           caps.cores, ": ranks will compete for CPU and timings will be skewed"));
}

// train.global_batch = 0 sums the devices' micro-batch caps (train/global_batch.h): each device
// needs a bound, a memory cap or max_micro_batch (the footprint that turns a cap into a micro-batch
// bound is the trainer's to compute). Once resolved the batch is at least one sample a device.
void checkGlobalBatchFromMemory(const Check& check) {
  const RunConfig& c = check.c;
  if (c.parallel.pipeline > 1)
    check.fail("train.global_batch", "0",
               "the global batch from memory is not supported with parallel.pipeline > 1 yet: "
               "set the global batch");
  std::string unbounded;
  for (size_t i = 0; i < c.devices.size(); ++i)
    if (c.devices[i].memoryBytes == 0 && c.devices[i].maxMicroBatch == 0)
      unbounded += str(unbounded.empty() ? "" : ", ", "devices[", i, "] (", c.devices[i].name, ")");
  if (!unbounded.empty())
    check.fail("train.global_batch", "0",
               str("the global batch from memory sums the devices' micro-batch caps, but these "
                   "devices have none: ",
                   unbounded,
                   "; set devices[i].memory or devices[i].max_micro_batch for each, or "
                   "train.global_batch > 0"));
}

void checkTrainLength(const Check& check) {
  const TrainConfig& t = check.c.train;
  if (t.globalBatch == 0)
    checkGlobalBatchFromMemory(check);
  else if (t.globalBatch < int64_t(check.c.devices.size()))
    check.fail("train.global_batch", std::to_string(t.globalBatch),
               str("below the number of devices (", check.c.devices.size(),
                   "): every device needs at least one sample per step"));
  if (t.steps == 0 && t.epochs <= 0)
    check.fail("train.epochs", formatDouble(t.epochs),
               "nothing to train: set train.epochs > 0 or train.steps > 0");
}

void checkOptimizerOptions(const Check& check, Warnings& warnings) {
  const TrainConfig& t = check.c.train;
  if (t.nesterov && (t.optimizer != "sgd" || t.momentum <= 0))
    check.fail("train.nesterov", "true",
               str("needs train.optimizer = \"sgd\" and train.momentum > 0 (they are ",
                   quote(t.optimizer), " and ", formatDouble(t.momentum), ")"));
  if (t.optimizer != "sgd" && t.momentum != 0)
    warnings.push_back(str("train.momentum = ", formatDouble(t.momentum), " is ignored by ",
                           "train.optimizer = ", quote(t.optimizer)));
  if (t.steps > 0 && t.warmupSteps >= t.steps)
    warnings.push_back(str("train.warmup_steps = ", t.warmupSteps,
                           " covers the whole run (train.steps = ", t.steps, ")"));
}

// bf16 autocasts the forward only: what runs a block's forward again in backward (activation
// checkpointing, ZeRO-3's recompute), or moves activations between ranks as float32 (tensor
// parallelism), would compute in another precision than the forward did.
void checkPrecision(const Check& check) {
  const RunConfig& c = check.c;
  if (c.train.precision == "fp32") return;
  const std::string value = quote(c.train.precision);
  if (c.train.activationCheckpointing != "none")
    check.fail("train.precision", value,
               "not supported with train.activation_checkpointing yet (the recompute in backward "
               "would run in float32)");
  if (c.zero.stage == 3)
    check.fail("train.precision", value,
               "not supported with zero.stage = 3 yet (its recompute in backward would run in "
               "float32)");
  if (c.parallel.tensor > 1)
    check.fail("train.precision", value,
               "not supported with parallel.tensor > 1 yet (its all-reduced activations are "
               "float32)");
}

// train.resync_every: the data-parallel, tensor-parallel and pipeline trainers re-synchronise their
// replicas; ZeRO has none that could drift, so there the key would silently do nothing.
void warnUnusedResync(const RunConfig& c, Warnings& warnings) {
  if (c.train.resyncEvery > 0 && c.zero.stage > 0)
    warnings.push_back(str("train.resync_every = ", c.train.resyncEvery,
                           " is ignored: ZeRO's replicas cannot drift (zero.stage > 0)"));
}

// The features of one sample, from the dataset itself (datasetGeometry); a dataset that cannot be
// read is named at data.path, since training could not start either.
int64_t sampleFeatures(const Check& check) {
  const DataConfig& data = check.c.data;
  try {
    return datasetGeometry(data).features();
  } catch (const IoError& e) {
    check.fail("data.path", quote(data.path),
               str("cannot read the shape of the ", data.name, " samples: ", e.what()));
  }
}

void checkModelFitsData(const Check& check) {
  const ModelConfig& m = check.c.model;
  if (m.name == "cnn" && m.channels.empty())
    check.fail("model.channels", "[]", "a cnn needs at least one conv block, e.g. [32, 64]");
  if (m.name != "transformer") return;
  if (m.dim % m.heads != 0)
    check.fail("model.heads", std::to_string(m.heads), str("must divide model.dim = ", m.dim));
  const int64_t features = sampleFeatures(check);
  if (features % m.seqLen != 0)
    check.fail("model.seq_len", std::to_string(m.seqLen),
               str("must divide the input features (", features,
                   " for data.name = ", quote(check.c.data.name), ")"));
}

void checkIslands(const Check& check) {
  const auto& islands = check.c.topology.islands;
  const size_t devices = check.c.devices.size();
  if (islands.empty() || islands.size() == devices) return;
  std::vector<std::string> ids;
  for (int64_t id : islands) ids.push_back(std::to_string(id));
  check.fail("topology.islands", "[" + join(ids, ", ") + "]",
             str("has ", ids.size(), ids.size() == 1 ? " entry" : " entries", " for ", devices,
                 " devices: give one island id per [[devices]] entry"));
}

// All devices name a host or none do, and a host's devices are listed together (mpirun's
// --map-by slot places ranks in order, filling one host before the next).
void checkHosts(const Check& check) {
  const auto& devices = check.c.devices;
  for (size_t i = 1; i < devices.size(); ++i) {
    const std::string key = deviceKey(i, "host");
    const std::string& host = devices[i].host;
    if (host.empty() != devices[0].host.empty())
      check.fail(key, quote(host),
                 "name a host for every device or for none (devices[0].host is " +
                     quote(devices[0].host) + ")");
    if (host == devices[i - 1].host) continue;
    for (size_t j = 0; j + 1 < i; ++j)
      if (devices[j].host == host)
        check.fail(key, quote(host),
                   str("list the devices of one host together (devices[", j,
                       "] is on it too, and devices[", i - 1, "] is not)"));
  }
}

// Periodic averaging: time mode needs its budget, and rounds of one step are synchronous training.
void checkPeriodicSync(const Check& check) {
  const TrainConfig& t = check.c.train;
  if (t.syncMode != "time") return;
  if (!(t.syncSeconds > 0))
    check.fail("train.sync_seconds", formatDouble(t.syncSeconds),
               "train.sync_mode = \"time\" needs a round's time budget > 0 seconds");
  if (t.syncEvery < 2)
    check.fail("train.sync_every", std::to_string(t.syncEvery),
               "train.sync_mode = \"time\" needs train.sync_every >= 2 (the most local steps of "
               "a round)");
}

void checkCheckpoints(const Check& check) {
  if (check.c.train.checkpointEvery > 0 && check.c.train.checkpointDir.empty())
    check.fail("train.checkpoint_dir", "\"\"", "needed when train.checkpoint_every > 0");
}

void checkElastic(const Check& check) {
  const RunConfig& c = check.c;
  const std::string restarts = std::to_string(c.elastic.maxRestarts);
  if (!c.devices.empty() && !c.devices[0].host.empty() && c.elastic.maxRestarts > 0)
    check.fail("elastic.max_restarts", restarts,
               "elastic restarts work for ranks on this host only, not with devices[i].host");
  // A restart continues from this run's newest checkpoint: without checkpoints it would start over.
  if (c.elastic.maxRestarts > 0 && c.train.checkpointEvery == 0)
    check.fail("elastic.max_restarts", restarts,
               "elastic restarts resume from a checkpoint: set train.checkpoint_every > 0 too");
  if (c.elastic.minDevices > int64_t(c.devices.size()))
    check.fail("elastic.min_devices", std::to_string(c.elastic.minDevices),
               str("more than the ", c.devices.size(), " devices listed"));
}

// The blocks of the built-in models (train/models.h): mlp fc0.. + out; cnn conv0.. + fc + out
// (its fully connected layer is always there); transformer embed + block0.. + head.
int64_t modelBlocks(const ModelConfig& m) {
  if (m.name == "mlp") return int64_t(m.hidden.size()) + 1;
  if (m.name == "cnn") return int64_t(m.channels.size()) + 2;
  return m.layers + 2;
}

// What the pipeline runtime supports today (train/pipeline/): pipelines of `pipeline` devices,
// as many as the devices make (several are data-parallel replicas), each stage at least one block
// and each chunk at least one sample; ZeRO-1 over a stage's replicas; none of the data-parallel
// features that assume a whole model per device.
void checkPipeline(const Check& check) {
  const RunConfig& c = check.c;
  const int64_t stages = c.parallel.pipeline;
  if (stages == 1) return;
  const std::string value = std::to_string(stages);
  const int64_t devices = int64_t(c.devices.size());
  if (devices % stages != 0)
    check.fail("parallel.pipeline", value,
               str("must divide the number of devices (", devices,
                   "): each group of that many consecutive devices is one pipeline, the "
                   "pipelines data-parallel replicas of each other"));
  const int64_t blocks = modelBlocks(c.model);
  if (blocks < stages)
    check.fail("parallel.pipeline", value,
               str("more stages than the ", blocks, " blocks of model.name = ", quote(c.model.name),
                   ": every stage needs at least one block"));
  if (c.parallel.chunks > c.train.globalBatch)
    check.fail("parallel.chunks", std::to_string(c.parallel.chunks),
               str("more chunks than train.global_batch = ", c.train.globalBatch,
                   ": every chunk needs at least one sample"));
  const int64_t pipelines = devices / stages;
  if (pipelines > c.train.globalBatch)
    check.fail("parallel.pipeline", value,
               str(pipelines, " pipelines for train.global_batch = ", c.train.globalBatch,
                   ": every pipeline needs at least one sample"));
  const auto refuse = [&](bool set, const std::string& key, const std::string& v) {
    if (set)
      check.fail(key, v,
                 "not supported with parallel.pipeline > 1 yet (each stage holds part of the "
                 "model)");
  };
  refuse(c.train.gradClip > 0, "train.grad_clip", formatDouble(c.train.gradClip));
  refuse(c.train.syncEvery > 1, "train.sync_every", std::to_string(c.train.syncEvery));
  refuse(c.train.precision != "fp32", "train.precision", quote(c.train.precision));
  refuse(c.train.checkpointEvery > 0, "train.checkpoint_every",
         std::to_string(c.train.checkpointEvery));
  refuse(c.comm.compression != "none", "comm.compression", quote(c.comm.compression));
  refuse(c.elastic.maxRestarts > 0, "elastic.max_restarts", std::to_string(c.elastic.maxRestarts));
  if (c.zero.stage > 1)
    check.fail("zero.stage", std::to_string(c.zero.stage),
               "with parallel.pipeline > 1, ZeRO shards a stage's optimizer state over the "
               "stage's replicas (zero.stage = 1); stages 2 and 3 are not supported there yet");
  const auto offloads = [&](const std::string& v) { return !v.empty() && v != "none"; };
  refuse(offloads(c.zero.offload), "zero.offload", quote(c.zero.offload));
  for (size_t i = 0; i < c.devices.size(); ++i)
    refuse(offloads(c.devices[i].offload), deviceKey(i, "offload"), quote(c.devices[i].offload));
}

// What tensor parallelism (train/tensor_parallel.h) runs today: the transformer, groups of
// `tensor` consecutive devices as data-parallel replicas, every device at least one head; none of
// the features that hold or save a whole model per device.
void checkTensor(const Check& check) {
  const RunConfig& c = check.c;
  const int64_t t = c.parallel.tensor;
  if (t == 1) return;
  const std::string value = std::to_string(t);
  const int64_t devices = int64_t(c.devices.size());
  if (c.model.name != "transformer")
    check.fail("parallel.tensor", value,
               str("splits the transformer's attention heads and MLP units; model.name = ",
                   quote(c.model.name), " has neither (use data or pipeline parallelism)"));
  if (devices % t != 0)
    check.fail("parallel.tensor", value,
               str("must divide the number of devices (", devices,
                   "): each group of that many consecutive devices is one replica"));
  if (c.model.heads < t)
    check.fail("parallel.tensor", value,
               str("more devices than model.heads = ", c.model.heads, ": each needs a head"));
  if (c.parallel.tensorSplit == "even" && c.model.heads % t != 0)
    check.fail("parallel.tensor_split", quote(c.parallel.tensorSplit),
               str("an even split needs model.heads = ", c.model.heads, " divisible by ", value));
  const auto refuse = [&](bool set, const std::string& key, const std::string& v) {
    if (set)
      check.fail(key, v,
                 "not supported with parallel.tensor > 1 yet (each device holds part of every "
                 "layer)");
  };
  refuse(c.parallel.pipeline > 1, "parallel.pipeline", std::to_string(c.parallel.pipeline));
  refuse(c.zero.stage > 0, "zero.stage", std::to_string(c.zero.stage));
  refuse(c.train.gradClip > 0, "train.grad_clip", formatDouble(c.train.gradClip));
  refuse(c.train.syncEvery > 1, "train.sync_every", std::to_string(c.train.syncEvery));
  refuse(c.train.checkpointEvery > 0, "train.checkpoint_every",
         std::to_string(c.train.checkpointEvery));
  refuse(c.train.globalBatch == 0, "train.global_batch", "0");
  refuse(c.elastic.maxRestarts > 0, "elastic.max_restarts", std::to_string(c.elastic.maxRestarts));
  for (size_t i = 0; i < c.devices.size(); ++i)
    refuse(c.devices[i].memoryBytes > 0, deviceKey(i, "memory"),
           std::to_string(c.devices[i].memoryBytes));
}

// What sharded training (train/zero_parallel.h) does not do yet is refused here, by name, rather
// than trained wrongly.
void checkZero(const Check& check) {
  const RunConfig& c = check.c;
  // Offload is of sharded state: data parallelism keeps no shard to move to the host, and only
  // stage 3 shards the parameters.
  auto checkOffload = [&](const std::string& key, const std::string& value) {
    if (value.empty() || value == "none") return;
    if (c.zero.stage == 0)
      check.fail(key, quote(value), "offload moves ZeRO's shards to the host: set zero.stage >= 1");
    if (value == "parameters" && c.zero.stage < 3)
      check.fail(key, quote(value),
                 "stages 1 and 2 keep every parameter on every device: set zero.stage = 3, or "
                 "offload = \"optimizer\"");
  };
  checkOffload("zero.offload", c.zero.offload);
  for (size_t i = 0; i < c.devices.size(); ++i)
    checkOffload(deviceKey(i, "offload"), c.devices[i].offload);
  if (c.zero.stage == 0) return;
  const std::string stage = std::to_string(c.zero.stage);
  if (c.train.syncEvery > 1)
    check.fail("zero.stage", stage,
               "periodic averaging (train.sync_every > 1) keeps whole replicas: set "
               "train.sync_every = 1, or zero.stage = 0");
}

}  // namespace

std::vector<std::string> checkBetweenKeys(const RunConfig& config, const Capabilities& caps,
                                          const Locate& locate, const std::string& sourceName) {
  Warnings warnings;
  const Check check{config, locate};
  checkHasDevices(config, sourceName);
  checkKindsAllowed(check, caps);
  checkGpuIndices(check);
  checkUniqueNames(check);
  checkSlowdowns(check);
  warnOversubscription(config, caps, warnings);
  checkTrainLength(check);
  checkOptimizerOptions(check, warnings);
  warnUnusedResync(config, warnings);
  checkPrecision(check);
  checkModelFitsData(check);
  checkIslands(check);
  checkHosts(check);
  checkCheckpoints(check);
  checkPeriodicSync(check);
  checkElastic(check);
  checkPipeline(check);
  checkTensor(check);
  checkZero(check);
  return warnings;
}

}  // namespace hetra::train::cfg
