// Checkpoints (train/checkpoint.h): a run restored from a model file continues bit-identically to
// one that never stopped; step directories are checksummed, committed atomically, pruned, owned by
// one run, and a corrupted or unfinished one is never resumed from.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/errors.h"
#include "train/checkpoint.h"
#include "train/datasets.h"
#include "train/models.h"
#include "train/optim.h"

namespace hetra::train {
namespace {

namespace fs = std::filesystem;

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

std::string tempPath(const std::string& name) {
  return (fs::temp_directory_path() / ("hetra_checkpoint_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// Trains `steps` steps from `first` on fixed batches of a synthetic task.
void train(Model& model, torch::optim::Optimizer& optimizer, const Dataset& data, int first,
           int steps) {
  for (int s = first; s < first + steps; ++s) {
    std::vector<int64_t> idx;
    for (int i = 0; i < 13; ++i) idx.push_back((s * 13 + i * 3) % data.size());
    auto batch = data.get(idx);
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(
        model.forward(batch.inputs), batch.targets,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
        .backward();
    optimizer.step();
  }
}

TEST(Checkpoint, RestoredRunContinuesBitIdentically) {
  Synthetic data(97, 12, 3, 5);
  ModelSpec m;
  m.sampleShape = {12};
  m.classes = 3;
  m.hidden = {9, 7};
  for (const char* name : {"sgd", "adam", "adamw"}) {
    OptimSpec o;
    o.name = name;
    o.lr = 0.01;
    o.momentum = 0.9;
    o.nesterov = true;
    o.weightDecay = 0.01;
    const std::string path = tempPath(std::string(name) + ".ckpt");

    auto model = makeModel(m);
    auto optimizer = makeOptimizer(model->parameters(), o);
    train(*model, *optimizer, data, 0, 3);
    saveCheckpoint(path, *model, *optimizer, {3, "text of the config"});
    EXPECT_FALSE(fs::exists(path + ".tmp"));
    train(*model, *optimizer, data, 3, 2);  // the run that did not stop

    // Another initialisation and learning rate: both come from the checkpoint.
    ModelSpec other = m;
    other.seed = 99;
    OptimSpec otherOptions = o;
    otherOptions.lr = 0.5;
    auto restored = makeModel(other);
    auto restoredOptimizer = makeOptimizer(restored->parameters(), otherOptions);
    const CheckpointInfo info = loadCheckpoint(path, *restored, *restoredOptimizer);
    EXPECT_EQ(info.step, 3);
    EXPECT_EQ(info.text, "text of the config");
    EXPECT_EQ(restoredOptimizer->param_groups()[0].options().get_lr(), 0.01);
    train(*restored, *restoredOptimizer, data, 3, 2);

    auto expected = model->parameters(), actual = restored->parameters();
    ASSERT_EQ(expected.size(), actual.size());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(torch::equal(expected[i], actual[i])) << name << " parameter " << i;
    fs::remove(path);
  }
}

TEST(Checkpoint, BadFilesAreIoErrors) {
  ModelSpec m;
  m.sampleShape = {6};
  m.hidden = {5};
  auto model = makeModel(m);
  auto optimizer = makeOptimizer(model->parameters(), OptimSpec{});
  EXPECT_THROW(loadCheckpoint(tempPath("missing"), *model, *optimizer), IoError);
  EXPECT_THROW(saveCheckpoint("/nonexistent-dir/x.ckpt", *model, *optimizer, {}), IoError);

  const std::string garbage = tempPath("garbage");
  std::ofstream(garbage) << "not a checkpoint";
  EXPECT_THROW(loadCheckpoint(garbage, *model, *optimizer), IoError);
  fs::remove(garbage);

  const std::string path = tempPath("other-model");
  saveCheckpoint(path, *model, *optimizer, {});
  m.hidden = {4};
  auto smaller = makeModel(m);
  auto smallerOptimizer = makeOptimizer(smaller->parameters(), OptimSpec{});
  try {
    loadCheckpoint(path, *smaller, *smallerOptimizer);
    ADD_FAILURE() << "a checkpoint of another model loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  fs::remove(path);
}

// A checkpoint directory as the trainer writes it: model.pt and state.json in step-<N>.tmp,
// committed to step-<N>. The state text differs per step so that files of two steps differ.
fs::path writeStep(const fs::path& root, int64_t step, torch::nn::Module& model,
                   torch::optim::Optimizer& optimizer, bool commit = true) {
  const fs::path tmp = root / ("step-" + std::to_string(step) + ".tmp");
  fs::create_directories(tmp);
  saveCheckpoint((tmp / "model.pt").string(), model, optimizer,
                 {step, "step " + std::to_string(step)});
  writeFileAtomically((tmp / "state.json").string(), "{\"step\": " + std::to_string(step) + "}");
  const fs::path dir = root / ("step-" + std::to_string(step));
  if (commit) commitCheckpoint(tmp.string(), dir.string());
  return commit ? dir : tmp;
}

std::string readAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A small model and its optimizer, for tests that need files of a real checkpoint.
struct Replica {
  std::shared_ptr<Model> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

Replica smallReplica(int64_t features = 4) {
  ModelSpec m;
  m.sampleShape = {features};
  m.hidden = {3};
  Replica r;
  r.model = makeModel(m);
  r.optimizer = makeOptimizer(r.model->parameters(), OptimSpec{});
  return r;
}

// An empty directory for one test.
fs::path freshRoot(const std::string& name) {
  const fs::path root = tempPath(name);
  fs::remove_all(root);
  fs::create_directories(root);
  return root;
}

TEST(CheckpointFiles, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(crc32c("", 0), 0u);
  // Continuing over a split equals one pass.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
}

TEST(CheckpointFiles, AtomicWriteReplacesAndLeavesNoTemporary) {
  const fs::path dir = tempPath("atomic");
  fs::create_directories(dir);
  writeFileAtomically((dir / "f").string(), "first");
  writeFileAtomically((dir / "f").string(), "second, longer");
  EXPECT_EQ(readAll(dir / "f"), "second, longer");
  EXPECT_FALSE(fs::exists(dir / "f.tmp"));
  EXPECT_THROW(writeFileAtomically((dir / "no-such-dir" / "f").string(), "x"), IoError);
  fs::remove_all(dir);
}

// The newest checkpoint is corrupted in place (one flipped byte), then truncated, then loses its
// MANIFEST: each time the previous one is chosen, and the reason names the file.
TEST(CheckpointFiles, CorruptedNewestFallsBackToThePreviousOne) {
  auto [model, optimizer] = smallReplica(7);
  const fs::path root = freshRoot("fallback");
  writeStep(root, 10, *model, *optimizer);
  writeStep(root, 20, *model, *optimizer);
  const fs::path newest = writeStep(root, 30, *model, *optimizer);
  EXPECT_EQ(checkCheckpoint(newest.string()), "");
  EXPECT_EQ(findCheckpoint(root.string()), newest.string());

  const fs::path file = newest / "model.pt";
  std::string bytes = readAll(file);
  const size_t middle = bytes.size() / 2 + 3;
  bytes[middle] = char(bytes[middle] ^ 0x10);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  const std::string flipped = checkCheckpoint(newest.string());
  EXPECT_NE(flipped.find("model.pt"), std::string::npos) << flipped;
  EXPECT_NE(flipped.find("corrupted"), std::string::npos) << flipped;
  EXPECT_EQ(findCheckpoint(root.string()), (root / "step-20").string());

  bytes[middle] = char(bytes[middle] ^ 0x10);  // repaired, then truncated
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_EQ(checkCheckpoint(newest.string()), "");
  fs::resize_file(file, bytes.size() - 5);
  const std::string truncated = checkCheckpoint(newest.string());
  EXPECT_NE(truncated.find("truncated"), std::string::npos) << truncated;
  EXPECT_EQ(findCheckpoint(root.string()), (root / "step-20").string());

  // The previous one is corrupted too: the one before it.
  const fs::path state = root / "step-20" / "state.json";
  std::ofstream(state, std::ios::binary | std::ios::app) << " ";
  EXPECT_EQ(findCheckpoint(root.string()), (root / "step-10").string());
  fs::remove(root / "step-10" / "MANIFEST");
  EXPECT_NE(checkCheckpoint((root / "step-10").string()).find("no MANIFEST"), std::string::npos);
  try {
    findCheckpoint(root.string());
    ADD_FAILURE() << "a root without a usable checkpoint was accepted";
  } catch (const ConfigError& e) {
    // Every skipped checkpoint is named with its reason.
    for (const char* name : {"step-30", "step-20", "step-10"})
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
  // A step directory named directly must verify.
  EXPECT_THROW(findCheckpoint(newest.string()), IoError);

  // The chosen checkpoint loads (checksums say nothing about the content otherwise).
  const fs::path good = writeStep(root, 40, *model, *optimizer);
  EXPECT_EQ(findCheckpoint(root.string()), good.string());
  EXPECT_EQ(loadCheckpoint((good / "model.pt").string(), *model, *optimizer).step, 40);
  fs::remove_all(root);
}

// A save that stopped between writing step-<N>.tmp and renaming it (a crash, kill -9), with or
// without its MANIFEST, leaves the previous checkpoint the one resumed from.
TEST(CheckpointFiles, CrashBeforeRenameLeavesThePreviousOne) {
  auto [model, optimizer] = smallReplica(5);
  const fs::path root = freshRoot("crash");
  const fs::path previous = writeStep(root, 6, *model, *optimizer);
  writeStep(root, 9, *model, *optimizer, /*commit=*/false);  // files written, never renamed
  EXPECT_EQ(findCheckpoint(root.string()), previous.string());

  // The crash hits a real process in the middle of commitCheckpoint's work: a child writes a
  // checkpoint and is killed before it renames (it stops itself where the rename would come).
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const fs::path tmp = root / "step-12.tmp";
    fs::create_directories(tmp);
    writeFileAtomically((tmp / "model.pt").string(), std::string(3 << 20, 'x'));
    ::raise(SIGKILL);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(fs::exists(root / "step-12.tmp"));
  EXPECT_EQ(findCheckpoint(root.string()), previous.string());
  EXPECT_EQ(loadCheckpoint((previous / "model.pt").string(), *model, *optimizer).step, 6);

  // The next successful save's pruning removes the stale temporaries.
  writeStep(root, 15, *model, *optimizer);
  pruneCheckpoints(root.string(), 3);
  EXPECT_FALSE(fs::exists(root / "step-9.tmp"));
  EXPECT_FALSE(fs::exists(root / "step-12.tmp"));
  EXPECT_TRUE(fs::exists(previous));
  fs::remove_all(root);
}

TEST(CheckpointFiles, PruningKeepsTheNewestK) {
  auto [model, optimizer] = smallReplica(3);
  const fs::path root = freshRoot("prune");
  // Steps out of name order (step-100 sorts before step-20 as text).
  for (int64_t step : {20, 100, 5, 60, 7}) writeStep(root, step, *model, *optimizer);
  fs::create_directories(root / "not-a-step");
  const auto removed = pruneCheckpoints(root.string(), 2);
  EXPECT_EQ(removed.size(), 3u);
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(root)) left.push_back(entry.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"not-a-step", "step-100", "step-60"}));
  EXPECT_TRUE(pruneCheckpoints(root.string(), 2).empty());
  EXPECT_EQ(pruneCheckpoints(root.string(), 1),
            std::vector<std::string>{(root / "step-60").string()});
  EXPECT_EQ(checkpointStep("step-12"), 12);
  EXPECT_EQ(checkpointStep("step-12.tmp"), -1);
  EXPECT_EQ(checkpointStep("step-"), -1);
  EXPECT_EQ(checkpointStep("step-1x"), -1);
  fs::remove_all(root);
}

// An own checkpoint is usable and was committed since the given time: older ones (another run's,
// whatever their step) and unusable newer ones (skipped) are not.
TEST(CheckpointFiles, NewestSinceTakesTheNewestUsableOneWrittenSince) {
  auto [model, optimizer] = smallReplica();
  const fs::path root = tempPath("since");
  fs::remove_all(root);
  EXPECT_EQ(newestCheckpointSince(root.string(), fs::file_time_type::clock::now()), "")
      << "no root yet";
  fs::create_directories(root);
  const auto since = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (int64_t step : {5, 10, 20, 40}) writeStep(root, step, *model, *optimizer);
  // step-5 and step-40 were committed before `since`: an earlier run's.
  for (int64_t step : {5, 40})
    fs::last_write_time(root / ("step-" + std::to_string(step)) / "MANIFEST",
                        since - std::chrono::minutes(1));
  EXPECT_EQ(newestCheckpointSince(root.string(), since), (root / "step-20").string());
  fs::resize_file(root / "step-20" / "state.json", 3);  // truncated after the fact
  EXPECT_EQ(newestCheckpointSince(root.string(), since), (root / "step-10").string());
  EXPECT_EQ(newestCheckpointSince(root.string(),
                                  fs::file_time_type::clock::now() + std::chrono::hours(1)),
            "")
      << "nothing was written since then";
  fs::remove_all(root);
}

// A fresh run may start in a root without step directories (anything else there is no run's);
// with some, the error names the key, the root, the oldest three and what to do.
TEST(CheckpointFiles, OwnershipRefusesARootWithStepDirectories) {
  auto [model, optimizer] = smallReplica();
  const fs::path root = tempPath("owner");
  fs::remove_all(root);
  EXPECT_NO_THROW(refuseForeignCheckpoints(root.string())) << "a root that does not exist yet";
  fs::create_directories(root / "not-a-step");
  fs::create_directories(root / "step-3.tmp");  // a save that crashed before its commit
  std::ofstream(root / "latest") << "step-3\n";
  EXPECT_NO_THROW(refuseForeignCheckpoints(root.string()));
  for (int64_t step : {100, 2, 10, 7}) writeStep(root, step, *model, *optimizer);
  try {
    refuseForeignCheckpoints(root.string());
    ADD_FAILURE() << "a root with another run's checkpoints was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train.checkpoint_dir = \"" + root.string() + "\""), std::string::npos)
        << what;
    EXPECT_NE(what.find("(step-2, step-7, step-10, ...)"), std::string::npos) << what;
    EXPECT_NE(what.find("--resume " + root.string()), std::string::npos) << what;
  }
  fs::remove_all(root);
}

TEST(CheckpointFiles, SavedStepIsTheStepOfTheState) {
  auto [model, optimizer] = smallReplica();
  const fs::path root = freshRoot("saved-step");
  const fs::path dir = writeStep(root, 37, *model, *optimizer);
  EXPECT_EQ(savedStep(dir.string()), 37);
  std::ofstream(dir / "state.json", std::ios::trunc) << "{\"balancer\": \"\"}";
  EXPECT_THROW(savedStep(dir.string()), IoError);
  fs::remove(dir / "state.json");
  EXPECT_THROW(savedStep(dir.string()), IoError);
  fs::remove_all(root);
}

}  // namespace
}  // namespace hetra::train
