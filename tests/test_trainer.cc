// The training loop end to end with ranks as threads: a heterogeneous run follows the same
// optimisation as one device, and a resumed run ends where an uninterrupted one does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "harness.h"
#include "train/config.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/trainer.h"

namespace hetra::train {
namespace {

namespace fs = std::filesystem;

fs::path tempDir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("hetra-trainer-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

RunConfig tinyConfig(const std::vector<std::string>& sets) {
  std::ifstream in(std::string(HETRA_SOURCE_DIR) + "/examples/tiny_synthetic.toml");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> all = {"train.log_every=0", "train.eval_every=0"};
  all.insert(all.end(), sets.begin(), sets.end());
  return parseConfig(text, "tiny_synthetic.toml", all);
}

// Trains with one thread per device; returns the losses of the step records.
std::vector<double> trainAll(const RunConfig& config, const fs::path& metrics,
                             const std::string& resume = "") {
  auto store = std::make_shared<store::MemoryStore>();
  const int ranks = int(config.devices.size());
  test::runRanks(ranks, [&](int rank) {
    comm::GroupOptions group;
    group.timeout = Millis(30000);
    auto comm = comm::Communicator::create(store, rank, ranks, group);
    TrainerOptions options;
    options.metricsPath = metrics.string();
    options.resumeDir = resume;
    train(config, comm, options);
  });
  std::vector<double> losses;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "step") losses.push_back(record["loss"].get<double>());
  }
  return losses;
}

TEST(Trainer, UnevenThreeRankRunFollowsTheOneRankRun) {
  torch::set_num_threads(1);
  const auto dir = tempDir("losses");
  // Three devices of different speeds, the balancer free to move the split, against one device.
  const auto hetero = trainAll(tinyConfig({"train.steps=20"}), dir / "hetero.jsonl");
  const auto single =
      trainAll(tinyConfig({"train.steps=20", "devices=[{name=\"solo\"}]"}), dir / "single.jsonl");
  ASSERT_EQ(hetero.size(), 20u);
  ASSERT_EQ(single.size(), 20u);
  for (size_t s = 0; s < 20; ++s)
    EXPECT_NEAR(hetero[s], single[s], 1e-4 * std::abs(single[s])) << "step " << s + 1;
  fs::remove_all(dir);
}

TEST(Trainer, ResumedRunEndsWhereAnUninterruptedRunEnds) {
  torch::set_num_threads(1);
  const auto dir = tempDir("resume");
  const auto full = dir / "full", part = dir / "part";
  trainAll(tinyConfig({"train.steps=16", "train.checkpoint_every=16",
                       "train.checkpoint_dir=\"" + full.string() + "\""}),
           dir / "full.jsonl");
  // Stop at step 8, then resume to 16 from the checkpoint.
  trainAll(tinyConfig({"train.steps=8", "train.checkpoint_every=8",
                       "train.checkpoint_dir=\"" + part.string() + "\""}),
           dir / "part.jsonl");
  const auto resumedLosses =
      trainAll(tinyConfig({"train.steps=16", "train.checkpoint_every=16",
                           "train.checkpoint_dir=\"" + part.string() + "\""}),
               dir / "resumed.jsonl", part.string());
  EXPECT_EQ(resumedLosses.size(), 8u) << "the resumed run trains steps 9..16 only";

  // Compare the parameters saved at step 16 by both runs.
  ModelSpec spec;
  spec.sampleShape = {16};
  spec.classes = 4;
  spec.hidden = {32};
  auto a = makeModel(spec), b = makeModel(spec);
  auto optA = torch::optim::SGD(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto optB = torch::optim::SGD(b->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_EQ(loadCheckpoint((full / "step-16" / "model.pt").string(), *a, optA).step, 16);
  EXPECT_EQ(loadCheckpoint((part / "step-16" / "model.pt").string(), *b, optB).step, 16);
  const auto pa = a->parameters(), pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_LE((pa[i] - pb[i]).abs().max().item<double>(),
              1e-5 * (1.0 + pa[i].abs().max().item<double>()))
        << "parameter " << i;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hetra::train
