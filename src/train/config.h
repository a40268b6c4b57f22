// The configuration of `hetra run`: one TOML file, `--set key=value` overrides, defaults and
// validation, all done before any rank starts, so a typo fails in a second rather than after the
// ranks spawned. No LibTorch here: the training layer maps these plain values onto its objects.
//
// Vocabulary:
//   key          the dotted path of one setting: <section>.<name> (train.lr) or devices.<i>.<name>
//                (devices.1.slowdown, also accepted as devices[1].slowdown). Messages write device
//                keys as devices[i].<name>.
//   effective config  defaults, then the file, then every --set in order; toToml prints it and
//                parseConfig of that text gives an equal RunConfig (saved in checkpoints).
//   duty cycle   the share of its threads an emulated device keeps busy: threads / slowdown (it
//                sleeps (slowdown - 1) times its compute time, see docs/benchmarks.md).
//   capabilities what this build and machine offer (CUDA, ROCm, cores), a parameter of validation
//                so that a CUDA build or a test can allow what this build cannot.
//
// Every error is a ConfigError whose message starts with where the value came from ("run.toml:12"
// or "--set train.lr=x") and names the key, the value and what is allowed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device/slowdown.h"

namespace hetra::train {

struct ModelConfig {
  std::string name = "mlp";                  // mlp | cnn | transformer
  std::vector<int64_t> hidden = {256, 128};  // mlp: hidden layer widths (empty: a linear model)
  std::vector<int64_t> channels = {32, 64};  // cnn: output channels of each conv 3x3 + pool block
  int64_t layers = 2;                        // transformer: encoder layers
  int64_t heads = 4;                         // transformer: attention heads (divides dim)
  int64_t dim = 64;                          // transformer: model width
  int64_t seqLen =
      28;  // transformer: tokens per sample (a sample's features cut into seqLen tokens)
  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  std::string name = "fashion-mnist";                      // fashion-mnist | synthetic
  std::string path = "/usr/share/datasets/fashion-mnist";  // fashion-mnist: folder of IDX .gz files
  int64_t samples = 4096;                                  // synthetic: training samples
  int64_t testSamples = 1024;                              // synthetic: test samples
  int64_t features = 32;                                   // synthetic: features per sample
  int64_t classes = 10;                                    // synthetic: classes
  bool operator==(const DataConfig&) const = default;
};

struct TrainConfig {
  int64_t globalBatch = 256;  // B: samples per step over all devices
  double epochs = 1.0;        // passes over the training set (fractions allowed)
  int64_t steps = 0;          // > 0: train exactly this many steps, epochs ignored
  double lr = 0.1;
  std::string optimizer = "sgd";  // sgd | adam | adamw
  double momentum = 0.0;          // sgd
  bool nesterov = false;          // sgd, needs momentum > 0
  double weightDecay = 0.0;
  std::vector<double> betas = {0.9, 0.999};  // adam, adamw
  double eps = 1e-8;                         // adam, adamw
  std::string lrSchedule = "constant";  // constant | cosine (reaches 0 one step after the last)
  int64_t warmupSteps = 0;              // linear warm-up from 0 to lr over these steps
  double gradClip = 0.0;                // max global gradient L2 norm; 0 = off
  int64_t seed = 1;                     // model init, data order, synthetic data
  int64_t evalEvery = 0;                // evaluate every N steps; 0 = only at the end
  int64_t logEvery = 10;                // console line every N steps; 0 = none
  int64_t checkpointEvery = 0;          // save every N steps; 0 = off
  std::string checkpointDir = "checkpoints";
  int64_t keepCheckpoints = 3;  // the newest N checkpoints stay, older ones are removed
  double bucketMib = 25.0;      // gradient bucket size for the overlapped allreduce
  // zero.stage = 0: every N steps rank 0's parameters replace the other replicas' and the drift
  // between them is measured (adoptRootValues: data parallelism, each pipeline stage); 0 = never;
  // -1 = 100 where the devices are of more than one kind (their arithmetic differs), else never
  // (resyncEveryOf).
  int64_t resyncEvery = -1;
  // fp32 | bf16: a micro-batch's forward under autocast to bfloat16 (train/precision.h)
  std::string precision = "fp32";
  // none | blocks: recompute each block's activations in backward (docs/memory.md)
  std::string activationCheckpointing = "none";
  // Periodic model averaging (train/periodic_sync.h): H local steps per round; 1 = synchronous.
  int64_t syncEvery = 1;
  std::string syncMode = "steps";  // steps | time (a round ends after syncSeconds on each device)
  double syncSeconds = 0.0;        // time mode: a round's time budget per device
  int64_t syncWarmupSteps = 0;     // synchronous steps before the first round
  bool operator==(const TrainConfig&) const = default;
};

// Names and defaults as in balance::BalancerOptions.
struct BalanceConfig {
  std::string mode = "dynamic";  // dynamic | static | equal
  double threshold = 0.01;       // least sure relative gain worth a change of the split
  int64_t minStepsBetween = 3;   // steps on a plan before the next change
  int64_t persistSteps = 2;      // dynamic: steps in a row the gain must persist
  int64_t profileSteps = 5;      // steps measured on the equal split before the first decision
  // Leave out a device whose share cannot pay for its step cost and communication (data
  // parallelism; balance/balancer.h, "left out").
  bool leaveOut = true;
  bool operator==(const BalanceConfig&) const = default;
};

struct CommConfig {
  std::string transport = "auto";       // auto | shm | tcp | mpi
  double timeoutS = 60.0;               // deadline of every blocking communication call
  std::string compression = "none";     // none | fp16 | bf16 | fp8-e4m3 | fp8-e5m2
  bool errorFeedback = true;            // keep each bucket's compression error for the next step
  int64_t compressionBlock = 256;       // fp8: elements per fp32 scale
  int64_t compressionMinBytes = 65536;  // smaller gradient buckets travel as float32
  bool operator==(const CommConfig&) const = default;
};

// Elastic recovery by `hetra run` (docs/reliability.md): after a rank fails, restart from the
// newest checkpoint of this run with the surviving devices.
struct ElasticConfig {
  int64_t maxRestarts = 0;  // restarts allowed over the whole run; 0 = off (a failure ends the run)
  int64_t minDevices = 1;   // fewer surviving devices than this: no restart, the run fails
  bool operator==(const ElasticConfig&) const = default;
};

// ZeRO (docs/zero.md): what of the training state each rank keeps only its shard of.
struct ZeroConfig {
  int64_t stage = 0;  // 0: data parallel; 1: optimizer state; 2: + gradients; 3: + parameters
  std::string shards = "memory";  // memory: sized by each device's headroom | even
  // What stays in host memory, outside the device's cap: none | optimizer (its state) |
  // parameters (stage 3: also the shard's parameters and gradients). devices[i].offload overrides.
  std::string offload = "none";
  bool prefetch = true;  // stage 3: gather the next block while the current one runs
  // shards = "memory": once each device's optimizer step is measured, shards follow its speed
  // within what its memory plan allows (train/shard_follower.h).
  bool followSpeed = true;
  // Stage 1 without clipping: each group of tensors is updated and all-gathered as soon as its
  // reduce-scatters end (ZeroParallel::finishAndUpdate); false: after all of them, which measured
  // as fast on the emulated devices (docs/benchmarks.md).
  bool overlapUpdate = false;
  bool operator==(const ZeroConfig&) const = default;
};

// Islands of the hierarchical allreduce and the costs of its links (comm/topology.h). Empty values
// leave the choice to the communicator: islands by host and vendor, HETRA_ISLAND_LINK and
// HETRA_CROSS_LINK for the cost model.
struct TopologyConfig {
  std::string file;  // topology JSON written by `hetra probe --links`: its islands and link costs
  std::vector<int64_t> islands;    // island id of each [[devices]] entry; overrides the file's
  std::string algorithm = "auto";  // auto | ring | hierarchical
  std::string islandLink;          // "LATENCY,BANDWIDTH" inside islands; overrides the file's
  std::string crossLink;           // "LATENCY,BANDWIDTH" between islands; overrides the file's
  bool operator==(const TopologyConfig&) const = default;
};

// From step `step` on, the device runs `factor` times slower (until the next change).
using SlowdownChange = device::SlowdownChange;

// One [[devices]] entry: one rank.
struct DeviceConfig {
  std::string kind = "cpu";  // cpu | cuda | rocm
  std::string name;  // unique; default <kind><n>: cpu0, cpu1, ... (n counts that kind), cuda<index>
  int64_t threads = 1;    // intra-op threads of this rank
  double slowdown = 1.0;  // emulation: >= 1, 1 = full speed (docs/benchmarks.md)
  std::vector<SlowdownChange> slowdownSchedule;  // steps strictly increasing, factors >= 1
  int64_t memoryBytes = 0;  // memory cap bounding the micro-batch; 0 = unlimited
  // Most samples in one micro-batch, on top of what `memory` allows; 0 = no such cap. For a device
  // whose memory use the footprint model misjudges, and to measure a device alone at the
  // micro-batch it had in a cluster run (bench/compare_training.py).
  int64_t maxMicroBatch = 0;
  std::string offload;  // ZeRO: this device's [zero] offload; "" = the [zero] section's
  int64_t index = -1;   // cuda/rocm: GPU index (default: n-th device of that kind); -1 for cpu
  // The host this rank runs on ("" = this one). Naming hosts makes hetra run start the ranks
  // through mpirun ([launch]); the devices of one host are listed together.
  std::string host;
  bool operator==(const DeviceConfig&) const = default;
};

// How hetra run starts ranks on the hosts its devices name (mpirun, as hetra launch -H does).
struct LaunchConfig {
  std::string mpirun = "mpirun";
  std::vector<std::string> mpiArgs;  // passed to mpirun as they are
  bool operator==(const LaunchConfig&) const = default;
};

// Pipeline parallelism (train/pipeline/): the model's blocks in `pipeline` stages, stage i on
// devices[i], `chunks` micro-batches per step through them (1F1B). Tensor parallelism
// (train/tensor_parallel.h): the transformer's heads and MLP units split over `tensor` devices,
// devices[j * tensor .. (j + 1) * tensor) forming replica j, the replicas data-parallel.
struct ParallelConfig {
  int64_t pipeline = 1;                // stages; 1 = data parallelism over the devices
  std::string partition = "balanced";  // balanced (measured speeds and memory) | even
  int64_t chunks = 4;                  // micro-batches of a step ("micro_batch" names a size)
  bool repartition = true;             // balanced: re-partition on a persistent imbalance
  int64_t tensor = 1;                  // devices per tensor-parallel group; 1 = none
  std::string tensorSplit = "speed";   // speed (measured at start) | even
  bool operator==(const ParallelConfig&) const = default;
};

struct RunConfig {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  BalanceConfig balance;
  CommConfig comm;
  ElasticConfig elastic;
  TopologyConfig topology;
  LaunchConfig launch;
  ParallelConfig parallel;
  ZeroConfig zero;
  std::vector<DeviceConfig> devices;
  // Not part of the configuration (ignored by ==, not printed): what validation found questionable
  // but allowed, e.g. more busy threads than cores.
  std::vector<std::string> warnings;

  bool operator==(const RunConfig& o) const {
    return model == o.model && data == o.data && train == o.train && balance == o.balance &&
           comm == o.comm && elastic == o.elastic && topology == o.topology && launch == o.launch &&
           parallel == o.parallel && zero == o.zero && devices == o.devices;
  }
};

struct Capabilities {
  bool cuda = false;  // devices of kind "cuda" allowed: training runs on them
  // Built with CUDA (HETRA_WITH_CUDA). Without `cuda` a cuda device is then refused as "training on
  // CUDA is not implemented yet" rather than "rebuild with CUDA": the build has the NCCL transport
  // and the codec kernels, but the trainer computes on the CPU, so a cuda device would train there.
  bool cudaBuild = false;
  bool rocm = false;  // devices of kind "rocm" allowed
  int cores = 0;      // CPUs this process may use; 0 = unknown (no oversubscription warning)
  // What this build and this process's CPU affinity offer: cudaBuild in a CUDA build, never cuda
  // or rocm (no trainer runs on a GPU yet), the cores of the affinity mask.
  static Capabilities ofThisBuild();
};

// train.resync_every resolved: -1 (the default) is 100 steps where the devices are of more than one
// kind, else 0 (never).
int64_t resyncEveryOf(const RunConfig& config);

// Parses `tomlText` (named `sourceName` in messages), applies `sets` ("key=value", in order; the
// value is a TOML value, or a plain string when it does not parse as one, e.g. equal or /tmp/x),
// fills defaults and validates. Throws ConfigError. Warnings go to RunConfig::warnings.
RunConfig parseConfig(const std::string& tomlText, const std::string& sourceName,
                      const std::vector<std::string>& sets,
                      const Capabilities& caps = Capabilities::ofThisBuild());
// Reads the file at `path` (ConfigError when it cannot be read), then parseConfig.
RunConfig loadConfig(const std::string& path, const std::vector<std::string>& sets,
                     const Capabilities& caps = Capabilities::ofThisBuild());

// The checks between keys (devices vs global batch, device kinds vs capabilities, unique names,
// optimizer options...) on a config built in code; parseConfig runs them too. Throws ConfigError;
// returns the warnings.
std::vector<std::string> validateConfig(const RunConfig& config, const Capabilities& caps);

// The effective config as TOML, every key present, one comment per key saying what it does.
std::string toToml(const RunConfig& config);

// "512MiB", "2GiB", "1.5GB", "64 KiB", "1000" (bytes). Binary units KiB..TiB, decimal KB..TB, B;
// case-insensitive; the result must be a whole number of bytes. Throws ConfigError naming the text.
int64_t parseBytes(const std::string& text);
// The shortest exact form: "48MiB", "1500MB", or the plain number of bytes.
std::string formatBytes(int64_t bytes);

// Memory caps against the model's footprint: a device needs fixedBytes (parameters, gradients,
// optimizer state) + bytesPerSample per micro-batch sample (the arithmetic is
// balance/memory_caps.h's). Throws ConfigError naming devices[i].memory, its value and the minimum
// needed, when a cap cannot hold one sample.
void checkMemoryCaps(const RunConfig& config, int64_t fixedBytes, int64_t bytesPerSample);
// Most samples one micro-batch of `device` may hold (INT64_MAX when unlimited; 0 when too small):
// balance::maxMicroBatch of its memory cap.
int64_t maxMicroBatch(const DeviceConfig& device, int64_t fixedBytes, int64_t bytesPerSample);

// The slowdown factor in effect at `step` (slowdown before the schedule's first change):
// device::slowdownAt of the device's slowdown and schedule.
double slowdownAt(const DeviceConfig& device, int64_t step);

}  // namespace hetra::train
