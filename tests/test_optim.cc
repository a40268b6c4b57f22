// Optimizers (exact first steps), learning-rate schedules, gradient clipping and checkpoints: a run
// restored from a checkpoint continues bit-identically to one that never stopped.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/errors.h"
#include "train/datasets.h"
#include "train/fused_optim.h"
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
  return (fs::temp_directory_path() / ("hetra_optim_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// One parameter of value `value` whose gradient is `grad`, after one step of `spec`.
double afterOneStep(const OptimSpec& spec, double value, double grad) {
  auto p = torch::full({1}, value, torch::requires_grad());
  auto optimizer = makeOptimizer({p}, spec);
  p.mutable_grad() = torch::full({1}, grad);
  optimizer->step();
  return p.item<double>();
}

TEST(Optimizers, FirstStepsFollowTheirDefinitions) {
  OptimSpec sgd;
  sgd.lr = 0.1;
  sgd.weightDecay = 0.5;
  EXPECT_NEAR(afterOneStep(sgd, 2.0, 1.0), 2.0 - 0.1 * (1.0 + 0.5 * 2.0), 1e-7);
  // Adam's first step moves by lr whatever the gradient's size; L2 decay enters the gradient...
  OptimSpec adam;
  adam.name = "adam";
  adam.lr = 0.1;
  adam.weightDecay = 0.5;
  EXPECT_NEAR(afterOneStep(adam, 2.0, 1.0), 2.0 - 0.1, 1e-6);
  // ...while AdamW's is decoupled: the parameter shrinks by lr * wd first.
  adam.name = "adamw";
  EXPECT_NEAR(afterOneStep(adam, 2.0, 1.0), 2.0 * (1 - 0.1 * 0.5) - 0.1, 1e-6);
  // Nesterov with momentum 0.9: buffer = g, update = g + 0.9 * buffer.
  OptimSpec nesterov;
  nesterov.lr = 0.1;
  nesterov.momentum = 0.9;
  nesterov.nesterov = true;
  EXPECT_NEAR(afterOneStep(nesterov, 2.0, 1.0), 2.0 - 0.1 * 1.9, 1e-7);
}

// The one-pass optimizers against LibTorch's own, over several steps of changing gradients, for
// every option that changes the loop: same trajectory to float rounding (LibTorch fuses some
// multiply-adds, we may not), including a parameter of odd size and one that skips a step.
TEST(FusedOptimizers, FollowLibTorchStepForStep) {
  struct Case {
    std::string name;
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)> reference,
        fused;
  };
  std::vector<Case> cases;
  for (double momentum : {0.0, 0.9})
    for (bool nesterov : {false, true})
      for (double decay : {0.0, 0.03})
        for (double dampening : {0.0, 0.2}) {
          if (nesterov && (momentum == 0 || dampening != 0)) continue;  // LibTorch refuses these
          auto options = torch::optim::SGDOptions(0.05)
                             .momentum(momentum)
                             .nesterov(nesterov)
                             .weight_decay(decay)
                             .dampening(dampening);
          cases.push_back(
              {"sgd m=" + std::to_string(momentum) + " nesterov=" + std::to_string(nesterov) +
                   " wd=" + std::to_string(decay) + " damp=" + std::to_string(dampening),
               [=](auto p) { return std::make_unique<torch::optim::SGD>(p, options); },
               [=](auto p) { return std::make_unique<FusedSgd>(p, options); }});
        }
  for (double decay : {0.0, 0.03}) {
    auto adam = torch::optim::AdamOptions(0.01).betas({0.8, 0.95}).eps(1e-6).weight_decay(decay);
    cases.push_back({"adam wd=" + std::to_string(decay),
                     [=](auto p) { return std::make_unique<torch::optim::Adam>(p, adam); },
                     [=](auto p) { return std::make_unique<FusedAdam>(p, adam); }});
    auto adamw = torch::optim::AdamWOptions(0.01).betas({0.8, 0.95}).eps(1e-6).weight_decay(decay);
    cases.push_back({"adamw wd=" + std::to_string(decay),
                     [=](auto p) { return std::make_unique<torch::optim::AdamW>(p, adamw); },
                     [=](auto p) { return std::make_unique<FusedAdamW>(p, adamw); }});
  }
  for (const auto& c : cases) {
    torch::manual_seed(7);
    const std::vector<torch::Tensor> init = {torch::randn({33, 17}), torch::randn({1001}),
                                             torch::randn({5})};
    std::vector<torch::Tensor> ref, mine;
    for (const auto& t : init) {
      ref.push_back(t.clone().requires_grad_());
      mine.push_back(t.clone().requires_grad_());
    }
    auto reference = c.reference(ref);
    auto fused = c.fused(mine);
    for (int step = 0; step < 6; ++step) {
      for (size_t k = 0; k < init.size(); ++k) {
        // The last parameter has no gradient in step 2: both must leave it (and its state) alone.
        const bool skip = k == 2 && step == 2;
        auto grad = torch::randn(init[k].sizes()) * (1.0 + step);
        ref[k].mutable_grad() = skip ? torch::Tensor() : grad.clone();
        mine[k].mutable_grad() = skip ? torch::Tensor() : grad.clone();
      }
      reference->step();
      fused->step();
      if (step == 3) {
        // Same state layout and keys: LibTorch's optimizer continues from the fused one's state
        // (lost momentum or moments would show as a different trajectory from here on).
        torch::serialize::OutputArchive out;
        fused->save(out);
        std::ostringstream bytes;
        out.save_to(bytes);
        std::istringstream back(bytes.str());
        torch::serialize::InputArchive in;
        in.load_from(back);
        reference = c.reference(ref);  // a fresh one: all its state must come from the archive
        reference->load(in);
      }
      for (size_t k = 0; k < init.size(); ++k) {
        const double scale = ref[k].abs().max().item<double>() + 1.0;
        EXPECT_LE((ref[k] - mine[k]).abs().max().item<double>(), 2e-6 * scale)
            << c.name << " step " << step << " parameter " << k;
      }
    }
  }
}

// A parameter the loops cannot take (float64 here) sends the whole step through LibTorch's
// operations: still the right update.
TEST(FusedOptimizers, OtherTensorsFallBackToLibTorch) {
  auto p = torch::full({3}, 2.0, torch::dtype(torch::kFloat64).requires_grad(true));
  FusedSgd sgd({p}, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  p.mutable_grad() = torch::full({3}, 1.0, torch::kFloat64);
  sgd.step();
  EXPECT_NEAR(p[1].item<double>(), 2.0 - 0.1 * 1.9, 1e-12);
}

TEST(Optimizers, BadOptionsAreConfigErrors) {
  auto p = torch::zeros({2}, torch::requires_grad());
  auto bad = [&](OptimSpec s) { EXPECT_THROW(makeOptimizer({p}, s), ConfigError) << s.name; };
  OptimSpec s;
  s.name = "lamb";
  bad(s);
  s = {};
  s.nesterov = true;  // without momentum
  bad(s);
  s = {};
  s.lr = -1;
  bad(s);
  s = {};
  s.lr = std::nan("");
  bad(s);
  s = {};
  s.name = "adam";
  s.beta1 = 1.0;
  bad(s);
  s = {};
  s.name = "adamw";
  s.eps = -1e-8;
  bad(s);
}

TEST(LrSchedule, ConstantWarmupAndCosine) {
  LrScheduleSpec spec;
  spec.lr = 0.1;
  EXPECT_DOUBLE_EQ(LrSchedule(spec).lrAt(0), 0.1);
  EXPECT_DOUBLE_EQ(LrSchedule(spec).lrAt(12345), 0.1);
  spec.warmupSteps = 4;
  const LrSchedule warm(spec);
  EXPECT_DOUBLE_EQ(warm.lrAt(0), 0.025);
  EXPECT_DOUBLE_EQ(warm.lrAt(2), 0.075);
  EXPECT_DOUBLE_EQ(warm.lrAt(3), 0.1);
  EXPECT_DOUBLE_EQ(warm.lrAt(4), 0.1);

  spec = {};
  spec.kind = "cosine";
  spec.lr = 1.0;
  spec.totalSteps = 10;
  spec.warmupSteps = 2;
  const LrSchedule cosine(spec);
  EXPECT_DOUBLE_EQ(cosine.lrAt(0), 0.5);
  EXPECT_DOUBLE_EQ(cosine.lrAt(1), 1.0);
  EXPECT_DOUBLE_EQ(cosine.lrAt(2), 1.0);
  EXPECT_NEAR(cosine.lrAt(6), 0.5, 1e-15);
  EXPECT_NEAR(cosine.lrAt(9), 0.5 * (1 + std::cos(M_PI * 7 / 8)),
              1e-15);  // the last step still moves
  EXPECT_GT(cosine.lrAt(9), 0.0);
  EXPECT_EQ(cosine.lrAt(10), 0.0);
  EXPECT_EQ(cosine.lrAt(11), 0.0);
  for (int64_t s = 2; s < 10; ++s) EXPECT_LT(cosine.lrAt(s + 1), cosine.lrAt(s));

  spec.totalSteps = 2;  // no step left after warm-up
  EXPECT_THROW(LrSchedule{spec}, ConfigError);
  spec.kind = "step";
  spec.totalSteps = 10;
  EXPECT_THROW(LrSchedule{spec}, ConfigError);
  spec.kind = "constant";
  spec.warmupSteps = -1;
  EXPECT_THROW(LrSchedule{spec}, ConfigError);
}

TEST(LrSchedule, ApplyLrSetsEveryGroup) {
  auto a = torch::ones({1}, torch::requires_grad()), b = torch::ones({1}, torch::requires_grad());
  OptimSpec spec;
  spec.lr = 0.5;
  auto optimizer = makeOptimizer({a}, spec);
  optimizer->add_param_group(
      torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(0.7)));
  applyLr(*optimizer, 0.01);
  a.mutable_grad() = torch::ones({1});
  b.mutable_grad() = torch::full({1}, 2.0);
  optimizer->step();
  EXPECT_FLOAT_EQ(a.item<float>(), 0.99f);
  EXPECT_FLOAT_EQ(b.item<float>(), 0.98f);
}

TEST(Clipping, ScalesToTheGlobalNorm) {
  auto a = torch::zeros({1}, torch::requires_grad()), b = torch::zeros({1}, torch::requires_grad());
  auto noGrad = torch::zeros({3}, torch::requires_grad());
  a.mutable_grad() = torch::full({1}, 3.0);
  b.mutable_grad() = torch::full({1}, -4.0);
  EXPECT_NEAR(clipGradNorm({a, b, noGrad}, 10.0), 5.0, 1e-6);  // below the limit: unchanged
  EXPECT_FLOAT_EQ(a.grad().item<float>(), 3.0f);
  EXPECT_NEAR(clipGradNorm({a, b, noGrad}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(a.grad().item<double>(), 0.6, 1e-6);
  EXPECT_NEAR(b.grad().item<double>(), -0.8, 1e-6);
  EXPECT_THROW(clipGradNorm({a}, 0.0), EnforceError);
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
  ModelSpec m;
  m.sampleShape = {7};
  m.hidden = {5};
  auto model = makeModel(m);
  auto optimizer = makeOptimizer(model->parameters(), OptimSpec{});
  const fs::path root = tempPath("fallback");
  fs::remove_all(root);
  fs::create_directories(root);
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
  ModelSpec m;
  m.sampleShape = {5};
  m.hidden = {3};
  auto model = makeModel(m);
  auto optimizer = makeOptimizer(model->parameters(), OptimSpec{});
  const fs::path root = tempPath("crash");
  fs::remove_all(root);
  fs::create_directories(root);
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
  ModelSpec m;
  m.sampleShape = {3};
  m.hidden = {2};
  auto model = makeModel(m);
  auto optimizer = makeOptimizer(model->parameters(), OptimSpec{});
  const fs::path root = tempPath("prune");
  fs::remove_all(root);
  fs::create_directories(root);
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

}  // namespace
}  // namespace hetra::train
