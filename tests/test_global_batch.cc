// train.global_batch = 0, the global batch from memory (train/global_batch.h, docs/memory.md "The
// global batch from memory"): the sum over the devices of their micro-batch caps, one micro-batch
// each. Under data parallelism the caps come from the analytic footprint, under ZeRO-1 and ZeRO-3
// from the memory shard plan, within devices[i].max_micro_batch; the expected caps are computed
// here from the formulas of docs/memory.md and docs/zero.md, with the caps' memory chosen so each
// cap is a known number. Devices without a bound and pipelines are refused with ConfigError. End to
// end, `hetra run` with three rank processes prints and records the resolved batch and trains it
// without running out of device memory, and resumed with another cap resolves another batch.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "device/memory_accounting.h"
#include "train/config.h"
#include "train/dataset_geometry.h"
#include "train/device_memory.h"
#include "train/global_batch.h"
#include "train/models.h"
#include "train/specs.h"
#include "train/zero_plan.h"

namespace hetra::train {
namespace {

namespace fs = std::filesystem;

// A tiny MLP, 10 features -> 24 -> 12 -> 3 classes: blocks of (10+1)*24 = 264, (24+1)*12 = 300
// and (12+1)*3 = 39 parameters.
constexpr int64_t kBlocks[] = {264, 300, 39};
constexpr int64_t kPsi = 264 + 300 + 39;
constexpr int64_t kLargestBlock = 300;

std::string modelToml(const std::string& train) {
  return "[model]\nname = \"mlp\"\nhidden = [24, 12]\n"
         "[data]\nname = \"synthetic\"\nsamples = 2048\ntest_samples = 64\nfeatures = 10\n"
         "classes = 3\n[train]\nglobal_batch = 0\n" +
         train;
}

struct Device {
  int64_t memory = 0;  // 0: no cap
  int64_t maxMicroBatch = 0;
};

RunConfig configOf(const std::vector<Device>& devices, const std::string& train = "",
                   const std::string& extra = "") {
  std::string text = modelToml(train) + extra;
  for (const auto& d : devices) {
    text += "[[devices]]\n";
    if (d.memory > 0) text += "memory = " + std::to_string(d.memory) + "\n";
    if (d.maxMicroBatch > 0) text += "max_micro_batch = " + std::to_string(d.maxMicroBatch) + "\n";
  }
  return parseConfig(text, "test.toml", {});
}

MemoryFootprint footprintOf(const RunConfig& config) {
  return estimateFootprint(modelSpecOf(config, datasetGeometry(config.data)));
}

// The cap that gives a micro-batch cap of exactly `samples` over `fixed` bytes: half a sample
// more than `samples` samples need.
int64_t memoryFor(int64_t samples, int64_t fixed, int64_t bytesPerSample) {
  return fixed + samples * bytesPerSample + bytesPerSample / 2;
}

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

TEST(GlobalBatch, DataParallelSumsTheMemoryCaps) {
  RunConfig probe = configOf({{0, 1}});
  const MemoryFootprint footprint = footprintOf(probe);
  ASSERT_GT(footprint.bytesPerSample, 0);
  const int64_t fixed = footprint.fixedBytes, perSample = footprint.bytesPerSample;
  // Caps of 300, 56 and 57 samples from memory; the fourth device's memory allows 90 but its
  // max_micro_batch says 13; the fifth has only max_micro_batch = 6.
  const RunConfig config = configOf({{memoryFor(300, fixed, perSample), 0},
                                     {memoryFor(56, fixed, perSample), 0},
                                     {memoryFor(57, fixed, perSample), 0},
                                     {memoryFor(90, fixed, perSample), 13},
                                     {0, 6}});
  const GlobalBatch batch = resolveGlobalBatch(config);
  EXPECT_TRUE(batch.fromMemory);
  EXPECT_EQ(batch.caps, (std::vector<int64_t>{300, 56, 57, 13, 6}));
  EXPECT_EQ(batch.samples, 300 + 56 + 57 + 13 + 6);
  EXPECT_EQ(batch.text,
            "432 = sum of the devices' micro-batch caps (cpu0 300, cpu1 56, cpu2 57, cpu3 13, cpu4 "
            "6), one micro-batch each, from memory");
  // The trainer resolves from the balancer's caps: the same number.
  EXPECT_EQ(globalBatchOf(config, rankCapsOf(config, footprint)).samples, batch.samples);
  // A cap that holds less than one sample still trains one (the balancer's least micro-batch).
  const RunConfig tight = configOf({{fixed + perSample / 2, 0}, {0, 4}});
  EXPECT_EQ(resolveGlobalBatch(tight).samples, 1 + 4);
}

TEST(GlobalBatch, SetGlobalBatchIsKept) {
  RunConfig config = configOf({{0, 3}, {0, 5}});
  config.train.globalBatch = 77;
  const GlobalBatch batch = resolveGlobalBatch(config);
  EXPECT_FALSE(batch.fromMemory);
  EXPECT_EQ(batch.samples, 77);
  EXPECT_EQ(batch.text, "77");
}

// Under ZeRO the caps are what each device's cap leaves after its shard of the state (docs/zero.md
// "Memory: the formula"): fixed_i = replicated + buffers + perElement * shard_i, with Ψ = 603, K =
// 4 bytes of momentum per parameter, B = 300 the largest block and P = 264 + 300 the largest two
// adjacent blocks (stage 3 with zero.prefetch gathers the next block beside the current one).
TEST(GlobalBatch, ZeroSumsTheCapsOfTheMemoryShards) {
  const std::string train = "optimizer = \"sgd\"\nmomentum = 0.9\n";
  for (const auto& [stage, prefetch] :
       {std::pair{1, true}, std::pair{3, true}, std::pair{3, false}}) {
    SCOPED_TRACE(str("stage ", stage, ", prefetch ", prefetch));
    const std::string zero = "[zero]\nstage = " + std::to_string(stage) +
                             "\nshards = \"memory\"\nprefetch = " + (prefetch ? "true" : "false") +
                             "\n";
    RunConfig probe = configOf({{0, 1}}, train, zero);
    const MemoryFootprint footprint = footprintOf(probe);
    const int64_t perSample = footprint.bytesPerSample;
    ASSERT_GT(perSample, 0);
    const int64_t k = 4;
    const int64_t replicated = stage == 1 ? 8 * kPsi : 0;
    const int64_t largestPair = 264 + 300;
    const int64_t buffers = stage == 1 ? 0
                            : prefetch ? 4 * largestPair + 4 * kLargestBlock
                                       : 8 * kLargestBlock;
    const int64_t perElement = stage == 1 ? k : 8 + k;
    // Three capped devices of uneven memory, a fourth with max_micro_batch only (it counts with
    // the largest headroom of the capped ones for its shard).
    const std::vector<int64_t> memory = {replicated + buffers + 200 * perSample + 40000,
                                         replicated + buffers + 40 * perSample + 9000,
                                         replicated + buffers + 70 * perSample + 3000};
    RunConfig config =
        configOf({{memory[0], 0}, {memory[1], 0}, {memory[2], 0}, {0, 9}}, train, zero);
    auto model = makeModel(modelSpecOf(config, datasetGeometry(config.data)));
    ASSERT_EQ(parameterCount(*model), kPsi);
    ASSERT_EQ(std::accumulate(std::begin(kBlocks), std::end(kBlocks), int64_t(0)), kPsi);
    const ShardedBytes bytes = shardedBytesOf(config, *model);
    const auto shards = planShards(config, bytes, bytes.psi, perSample);
    ASSERT_EQ(shards.size(), 4u);
    EXPECT_EQ(std::accumulate(shards.begin(), shards.end(), int64_t(0)), kPsi);
    // Shards in proportion to the headroom, cap - replicated - buffers - one sample, within one
    // element; the uncapped device's headroom is the largest one's.
    std::vector<double> headroom;
    for (int64_t m : memory) headroom.push_back(double(m - replicated - buffers - perSample));
    headroom.push_back(headroom[0]);
    const double total = std::accumulate(headroom.begin(), headroom.end(), 0.0);
    int64_t expected = 9;  // the fourth device: its max_micro_batch
    std::vector<int64_t> caps;
    for (size_t r = 0; r < 3; ++r) {
      // (Shard boundaries are rounded to 16 elements, zero_layout.h.)
      EXPECT_NEAR(double(shards[r]), double(kPsi) * headroom[r] / total, 16.0) << r;
      const int64_t fixed = replicated + buffers + perElement * shards[r];
      caps.push_back(std::max<int64_t>(1, (memory[r] - fixed) / perSample));
      expected += caps.back();
    }
    caps.push_back(9);
    const GlobalBatch batch = resolveGlobalBatch(config);
    EXPECT_EQ(batch.caps, caps);
    EXPECT_EQ(batch.samples, expected);
    // Each capped device fits more than the samples the test gave it room for beside the state.
    EXPECT_GE(caps[0], 200);
    EXPECT_GE(caps[1], 40);
    EXPECT_GE(caps[2], 70);
    EXPECT_EQ(globalBatchOf(config, shardedRankCaps(config, bytes, shards, perSample)).samples,
              expected);
    // --print-config's predicted peaks (device_memory.h predictedMemory) are the plan's: each
    // device's fixed bytes and its micro-batch at an equal split of the batch, within its cap.
    RunConfig resolved = config;
    resolved.train.globalBatch = expected;
    const std::string predicted = predictedMemory(resolved);
    EXPECT_NE(predicted.find(str("ZeRO stage ", stage)), std::string::npos) << predicted;
    const int64_t equalShare = (expected + 3) / 4;
    for (size_t r = 0; r < 3; ++r) {
      const int64_t m = std::min(equalShare, caps[r]);
      const int64_t fixed = replicated + buffers + perElement * shards[r];
      const std::string line =
          str("devices[", r, "] cpu", r, ": ", device::readableBytes(fixed + m * perSample),
              " at micro-batch ", m);
      EXPECT_NE(predicted.find(line), std::string::npos) << line << "\n" << predicted;
    }
  }
}

TEST(GlobalBatch, DevicesWithoutABoundAreRefused) {
  // Built in code: validation (which refuses it too, test_config.cc) is not in the way.
  RunConfig config = configOf({{0, 3}, {0, 5}, {0, 7}});
  config.devices[1].maxMicroBatch = 0;
  config.devices[2].maxMicroBatch = 0;
  const std::string message = errorOf([&] { resolveGlobalBatch(config); });
  EXPECT_NE(message.find("train.global_batch = 0"), std::string::npos) << message;
  EXPECT_NE(message.find("devices have none: devices[1] (cpu1), devices[2] (cpu2)"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("devices[0]"), std::string::npos) << message;
  // A program's own model has no footprint: a memory cap alone bounds nothing before it runs.
  RunConfig custom = configOf({{1 << 26, 0}, {0, 4}});
  const std::string ofCustom =
      errorOf([&] { globalBatchOf(custom, rankCapsOf(custom, MemoryFootprint{})); });
  EXPECT_NE(ofCustom.find("devices have none: devices[0] (cpu0) ("), std::string::npos) << ofCustom;
  // Caps that sum past int64 are refused rather than wrapped.
  std::vector<balance::RankCaps> huge(2);
  huge[0].maxMicroBatch = huge[1].maxMicroBatch = std::numeric_limits<int64_t>::max() - 1;
  const std::string ofHuge = errorOf([&] { globalBatchOf(custom, huge); });
  EXPECT_NE(ofHuge.find("sum past what a step can hold"), std::string::npos) << ofHuge;
}

TEST(GlobalBatch, PipelinesAreRefused) {
  RunConfig config = configOf({{0, 3}, {0, 5}});
  config.parallel.pipeline = 2;
  const std::string message = errorOf([&] { resolveGlobalBatch(config); });
  EXPECT_NE(message.find("train.global_batch = 0"), std::string::npos) << message;
  EXPECT_NE(message.find("parallel.pipeline > 1"), std::string::npos) << message;
}

// `hetra run`, end to end.

struct Result {
  int status = -1;
  std::string output;  // stdout and stderr
};

Result run(const std::string& command) {
  Result r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

// Three rank processes with caps of 40, 9 and 13 samples (data parallelism) train 8 steps of the
// resolved 62: rank 0 prints where it came from, every step record's samples and the ranks'
// batches are 62, and no device runs out of memory (the balancer gives the small ones more than
// their cap at first, which they accumulate).
TEST(GlobalBatch, HetraRunTrainsTheBatchFromMemory) {
  const fs::path dir =
      fs::temp_directory_path() / ("hetra-global-batch-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string train =
      "steps = 8\nlr = 0.05\nseed = 3\nlog_every = 1\ncheckpoint_every = 4\n"
      "checkpoint_dir = \"" +
      (dir / "ckpt").string() + "\"\n";
  const MemoryFootprint footprint = footprintOf(configOf({{0, 1}}, train));
  const int64_t fixed = footprint.fixedBytes, perSample = footprint.bytesPerSample;
  const fs::path config = dir / "run.toml";
  {
    std::ofstream out(config);
    out << modelToml(train) << "[balance]\nprofile_steps = 2\n[comm]\ntimeout_s = 60\n";
    for (int64_t samples : {40, 9, 13})
      out << "[[devices]]\nmemory = " << memoryFor(samples, fixed, perSample) << "\n";
  }
  const fs::path metrics = dir / "metrics.jsonl";
  const Result r =
      run(std::string(HETRA_BINARY) + " run " + config.string() + " --metrics " + metrics.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("global batch 62 = sum of the devices' micro-batch caps (cpu0 40, cpu1 "
                          "9, cpu2 13), one micro-batch each, from memory"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(", global batch 62, 8 steps"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("out of memory"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] != "step") continue;
    ++steps;
    EXPECT_EQ(record["samples"].get<int64_t>(), 62) << line;
    int64_t batch = 0;
    for (const auto& rank : record["ranks"]) batch += rank["batch"].get<int64_t>();
    EXPECT_EQ(batch, 62) << line;
  }
  EXPECT_EQ(steps, 8);
  // --print-config says it too, and predicts the peaks at the resolved batch.
  const Result printed =
      run(std::string(HETRA_BINARY) + " run " + config.string() + " --print-config");
  ASSERT_EQ(printed.status, 0) << printed.output;
  EXPECT_NE(printed.output.find("global_batch = 0"), std::string::npos) << printed.output;
  EXPECT_NE(printed.output.find("# global batch 62 = sum of the devices' micro-batch caps"),
            std::string::npos)
      << printed.output;
  EXPECT_NE(printed.output.find("cpu1: "), std::string::npos) << printed.output;
  EXPECT_NE(printed.output.find("at micro-batch 9 "), std::string::npos) << printed.output;
  // Resumed from step 4 with cpu1's memory raised to 20 samples: the batch is resolved again
  // (73), and the saved split of 62 gives way to a fresh one.
  const Result resumed = run(std::string(HETRA_BINARY) + " run " + config.string() +
                             " --set train.checkpoint_every=0 --set devices.1.memory=" +
                             std::to_string(memoryFor(20, fixed, perSample)) + " --resume " +
                             (dir / "ckpt" / "step-4").string());
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("global batch 73 = sum of the devices' micro-batch caps (cpu0 40, "
                                "cpu1 20, cpu2 13)"),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("was written with a global batch of 62, this run's is 73"),
            std::string::npos)
      << resumed.output;
  fs::remove_all(dir);
}

// Under ZeRO-3 a rank that accumulates holds the whole gradient, which the shard plan does not
// reserve (docs/zero.md): the balancer keeps every share within its device's micro-batch cap, from
// the first (equal) plan on, so every rank of every step runs one micro-batch, though an equal
// split of the batch would give the smallest device more than its cap. (From the second step the
// cap follows the measured peak, which may let a share grow past the planned cap; the enforced
// cap then still holds: the run ends without running out of memory.)
TEST(GlobalBatch, HetraRunUnderZeroStage3RunsOneMicroBatchPerRank) {
  const fs::path dir =
      fs::temp_directory_path() / ("hetra-global-batch-z3-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string train = "steps = 8\nlr = 0.05\nseed = 3\nlog_every = 1\n";
  const MemoryFootprint footprint = footprintOf(configOf({{0, 1}}, train));
  const int64_t fixed = footprint.fixedBytes, perSample = footprint.bytesPerSample;
  const int64_t memories[3] = {memoryFor(400, fixed, perSample), memoryFor(90, fixed, perSample),
                               memoryFor(130, fixed, perSample)};
  const fs::path config = dir / "run.toml";
  {
    std::ofstream out(config);
    out << modelToml(train)
        << "[balance]\nprofile_steps = 2\n[comm]\ntimeout_s = 60\n[zero]\nstage = 3\n";
    for (int64_t memory : memories) out << "[[devices]]\nmemory = " << memory << "\n";
  }
  const fs::path metrics = dir / "metrics.jsonl";
  const Result r =
      run(std::string(HETRA_BINARY) + " run " + config.string() + " --metrics " + metrics.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("out of memory"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  int steps = 0;
  int64_t caps[3] = {0, 0, 0}, total = 0;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "zero_plan")
      for (size_t i = 0; i < 3; ++i) total += caps[i] = record["ranks"][i]["max_micro_batch"];
    if (record["event"] != "step") continue;
    ++steps;
    ASSERT_GT(total, 0) << "no zero_plan record before the steps";
    EXPECT_EQ(record["samples"].get<int64_t>(), total) << line;
    for (size_t i = 0; i < 3; ++i) {
      const auto& rank = record["ranks"][i];
      EXPECT_EQ(rank["accum"].get<int64_t>(), 1) << line;
      // The first split is the planned caps' (the measured bounds come in from step 2 on)...
      if (record["step"] == 1) EXPECT_LE(rank["batch"].get<int64_t>(), caps[i]) << line;
      // ...and every step's peak is the enforced allocator's (-1 when nothing is enforced).
      EXPECT_GT(rank["peak_bytes"].get<int64_t>(), 0) << line;
    }
  }
  EXPECT_EQ(steps, 8);
  EXPECT_GT((total + 2) / 3, caps[1]) << "an equal split would not fit the small device";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hetra::train
