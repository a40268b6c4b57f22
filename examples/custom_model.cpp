// custom_model: train your own model on your own data with hetra, from C++.
//
// A complete program to copy. It defines
//   ResidualMlp  the model: a subclass of hetra::train::BlockModel (a hetra::train::Model, i.e. a
//                torch::nn::Module whose forward maps inputs [N, sample shape...] to logits
//                [N, classes]) built from named blocks;
//   TwoSpirals   the data: a subclass of hetra::train::Dataset, two interleaved spirals in the
//                plane generated in code (no files), one class per spiral;
// builds a RunConfig in code (three CPU devices, one emulated three times slower, so the balancer
// gives it a smaller share of each batch; the model's state sharded over the three by ZeRO stage
// 3) and trains with hetra::train::train.
//
// The ranks here are THREADS OF ONE PROCESS: one thread per device, all meeting through one
// MemoryStore, each creating its own Communicator. A multi-process job (one process per device, as
// `hetra run` does) differs only in how a rank finds the others: it reads its rank from the
// environment and connects to a TcpStore; the call to train() is the same.
//
// Build against an installed hetra (see examples/custom_model/CMakeLists.txt):
//   cmake --install build --prefix /opt/hetra
//   cmake -S examples/custom_model -B build-example -DCMAKE_PREFIX_PATH=/opt/hetra
//   cmake --build build-example && build-example/custom_model
// It prints the test accuracy and exits with status 1 when that is below kMinAccuracy.
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>  // torch::manual_seed

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "common/errors.h"
#include "common/logging.h"
#include "store/store.h"
#include "train/config.h"
#include "train/datasets.h"
#include "train/models.h"
#include "train/trainer.h"

namespace {

constexpr int64_t kTrainSamples = 4096;
constexpr int64_t kTestSamples = 1024;
constexpr double kMinAccuracy = 0.90;  // working runs reach 0.99-1.0

// A residual MLP: x -> Linear -> [x + Linear(relu(Linear(x)))] * blocks -> Linear -> logits,
// built from named blocks (hetra::train::BlockModel): that is what lets ZeRO stage 3 shard it
// (each block's parameters are gathered just before the block runs and freed after it), and a
// pipeline cut it into stages. A block runs checkpointed under ZeRO-3 (and with
// setCheckpointing(true)): it keeps only its input for backward and recomputes the rest there
// (hetra/train/activation_checkpoint.h); the gradients are the same, the activations fewer.
// Like hetra's own models it has no BatchNorm and no dropout: with data parallelism a replica's
// result must not depend on how the batch is split between devices.
class ResidualMlp : public hetra::train::BlockModel {
 public:
  ResidualMlp(int64_t inputs, int64_t width, int64_t blocks, int64_t classes) {
    auto input = register_module("input", torch::nn::Linear(inputs, width));
    addBlock("input", input->parameters(),
             [input](const torch::Tensor& x) { return input->forward(x); });
    for (int64_t i = 0; i < blocks; ++i) {
      const std::string name = "block" + std::to_string(i);
      auto inner = register_module(name + "_inner", torch::nn::Linear(width, width));
      auto outer = register_module(name + "_outer", torch::nn::Linear(width, width));
      // A block names every parameter it reads: ZeRO-3 gathers exactly these.
      auto parameters = inner->parameters();
      for (const auto& p : outer->parameters()) parameters.push_back(p);
      addBlock(name, parameters, [inner, outer](const torch::Tensor& h) {
        return h + outer->forward(torch::relu(inner->forward(h)));
      });
    }
    auto output = register_module("output", torch::nn::Linear(width, classes));
    addBlock("output", output->parameters(),
             [output](const torch::Tensor& x) { return output->forward(torch::relu(x)); });
  }

 private:
  // Runs before the first block: the input checks and reshapes of a model (none needed here).
  torch::Tensor prologue(torch::Tensor x) override { return x; }
};

// Two spirals of 1.25 turns around the origin, the second rotated by half a turn; a sample is a
// point (x, y) of one spiral plus a little gaussian noise, its class the spiral. Even samples are
// on spiral 0, odd ones on spiral 1. The same seed gives the same samples on every rank, as it
// must: the sampler hands every rank global sample indices.
class TwoSpirals : public hetra::train::Dataset {
 public:
  TwoSpirals(int64_t samples, uint64_t seed)
      : inputs_(torch::empty({samples, 2}, torch::kFloat32)),
        targets_(torch::empty({samples}, torch::kInt64)) {
    constexpr double kTurns = 1.25, kNoise = 0.02, kPi = 3.14159265358979323846;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> along(0.1, 1.0);  // radius; the tangled centre left out
    std::normal_distribution<double> noise(0.0, kNoise);
    auto in = inputs_.accessor<float, 2>();
    auto out = targets_.accessor<int64_t, 1>();
    for (int64_t i = 0; i < samples; ++i) {
      const int64_t label = i % 2;
      const double r = along(rng);
      const double angle = 2 * kPi * kTurns * r + kPi * double(label);
      in[i][0] = float(r * std::cos(angle) + noise(rng));
      in[i][1] = float(r * std::sin(angle) + noise(rng));
      out[i] = label;
    }
  }

  // Called concurrently by the ranks (threads), so it must not modify anything.
  hetra::train::Batch get(const std::vector<int64_t>& indices) const override {
    for (int64_t i : indices)
      HETRA_ENFORCE(i >= 0 && i < size(), "sample ", i, " outside [0, ", size(), ")");
    // index_select copies the rows, so the index tensor may borrow the vector's memory.
    const auto index = torch::from_blob(const_cast<int64_t*>(indices.data()),
                                        {int64_t(indices.size())}, torch::kInt64);
    return {inputs_.index_select(0, index), targets_.index_select(0, index)};
  }
  int64_t size() const override { return inputs_.size(0); }
  std::vector<int64_t> inputShape() const override { return {2}; }
  int64_t classes() const override { return 2; }
  std::string name() const override { return "two-spirals"; }

 private:
  torch::Tensor inputs_, targets_;
};

// The run in code: what a TOML file gives `hetra run`. config.model and config.data stay at their
// defaults: TrainerOptions::makeModel and makeDataset below replace them.
hetra::train::RunConfig makeConfig() {
  hetra::train::RunConfig config;
  config.train.globalBatch = 512;  // samples per step over all devices
  config.train.steps = 120;
  config.train.optimizer = "adam";
  config.train.lr = 0.005;
  config.train.lrSchedule = "cosine";
  config.train.warmupSteps = 10;
  config.train.logEvery = 50;
  config.train.seed = 1;  // the sampler's order of samples
  config.comm.timeoutS = 30;
  // ZeRO stage 3: each rank keeps only its shard of the parameters, gradients and Adam's state
  // (docs/zero.md). Under `hetra run`, with one process per device and [[devices]] memory caps,
  // "memory" shards follow each device's free memory; ranks that are threads of one process share
  // one allocator, so no cap applies and the shards come out even.
  config.zero.stage = 3;
  config.zero.shards = "memory";
  // Name, slowdown: the third device emulates a device three times slower (it sleeps twice its
  // compute time, docs/benchmarks.md); memory caps do not apply to a custom model.
  const std::pair<const char*, double> devices[] = {{"fast0", 1.0}, {"fast1", 1.0}, {"slow", 3.0}};
  for (const auto& [name, slowdown] : devices) {
    hetra::train::DeviceConfig device;
    device.kind = "cpu";
    device.name = name;
    device.threads = 1;
    device.slowdown = slowdown;
    config.devices.push_back(device);
  }
  return config;
}

}  // namespace

int main() {
  using namespace hetra;
  const train::RunConfig config = makeConfig();
  // The checks `hetra run` does on a file (ConfigError when something is wrong).
  for (const auto& warning : train::validateConfig(config, train::Capabilities::ofThisBuild()))
    std::fprintf(stderr, "warning: %s\n", warning.c_str());

  // Every rank uses the same two datasets: threads may share them (Dataset::get is const).
  const auto trainSet = std::make_shared<const TwoSpirals>(kTrainSamples, /*seed=*/1);
  const auto testSet = std::make_shared<const TwoSpirals>(kTestSamples, /*seed=*/2);
  train::TrainerOptions options;
  options.makeDataset = [&](bool isTrain) -> std::shared_ptr<const train::Dataset> {
    return isTrain ? trainSet : testSet;
  };
  // Each rank builds its replica; rank 0's parameters are broadcast to the others before the first
  // step. Seeding LibTorch's global generator under a lock makes every run start the same.
  std::mutex initMutex;
  options.makeModel = [&]() -> std::shared_ptr<train::Model> {
    std::lock_guard<std::mutex> lock(initMutex);
    torch::manual_seed(1);
    return std::make_shared<ResidualMlp>(/*inputs=*/2, /*width=*/256, /*blocks=*/3, /*classes=*/2);
  };

  // One thread per device; rank r runs config.devices[r].
  const int world = int(config.devices.size());
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<train::TrainResult> results(config.devices.size());
  std::vector<std::exception_ptr> errors(config.devices.size());
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      log::setRank(rank);  // log lines name their rank
      std::shared_ptr<comm::Communicator> comm;
      try {
        comm::GroupOptions group;
        group.timeout = Millis(int64_t(config.comm.timeoutS * 1000));
        comm = comm::Communicator::create(store, rank, world, group);
        results[size_t(rank)] = train::train(config, comm, options);
        comm->barrier()->wait();
      } catch (...) {
        errors[size_t(rank)] = std::current_exception();
        // The other ranks get PeerAbortedError at once instead of waiting for a timeout.
        if (comm) comm->abort("rank " + std::to_string(rank) + " failed");
      }
    });
  }
  for (auto& thread : ranks) thread.join();
  for (int rank = 0; rank < world; ++rank) {
    if (!errors[size_t(rank)]) continue;
    try {
      std::rethrow_exception(errors[size_t(rank)]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "custom_model: rank %d failed: %s\n", rank, e.what());
    }
    return 1;
  }

  // The test accuracy is all-reduced, so every rank holds the same value.
  const train::TrainResult& result = results[0];
  std::printf("custom_model: test accuracy %.4f after %lld steps in %.1f s (need >= %.2f)\n",
              result.testAccuracy, (long long)result.steps, result.wallSeconds, kMinAccuracy);
  return result.testAccuracy >= kMinAccuracy ? 0 : 1;
}
