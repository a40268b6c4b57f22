// Checkpoints of sharded runs (ZeRO stages 1-3, train/zero_checkpoint.h, docs/zero.md
// "Checkpoints"): `hetra run` with three rank processes of uneven memory shards (one of them
// empty) checkpoints at step 6 of 12; resumed on the same devices, on other caps (other shard
// sizes), on two devices under another stage, and under data parallelism, each run's final
// checkpoint holds the state of the uninterrupted run's, within 1e-5 relative, for SGD with
// momentum and for Adam. An elastic restart after a rank is killed reshards onto the survivors and
// ends the same way; so does a data-parallel checkpoint resumed under ZeRO. A checkpoint of another
// model or optimizer is refused with ConfigError naming what differs. A resumed rank reads and
// verifies only the saved shards that overlap its own, also where its ranges cross chunks and
// files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "common/errors.h"
#include "harness.h"
#include "process_testing.h"
#include "store/store.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/dataset_geometry.h"
#include "train/fused_optim.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/specs.h"
#include "train/trainer.h"
#include "train/zero_parallel.h"

namespace hetra::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

fs::path freshDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("hetra-zero-ckpt-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct Device {
  std::string name, memory;
  int slowdown = 1;
};

// 12 steps of a small MLP (tensors of 240, 24, 288, 12, 36 and 3 elements) on `devices`, a
// checkpoint every 6 steps (under zero.stage = 0 a data-parallel run). The devices' caps make
// memory shards uneven; a device of well under 1% of the headroom gets an empty shard.
fs::path writeConfig(const fs::path& dir, const std::string& name, int stage,
                     const std::string& optimizer, const std::vector<Device>& devices,
                     int steps = 12, int checkpointEvery = 6, const std::string& extra = "") {
  const fs::path path = dir / (name + ".toml");
  std::ofstream out(path);
  out << "[model]\nname = \"mlp\"\nhidden = [24, 12]\n"
      << "[data]\nname = \"synthetic\"\nsamples = 2048\ntest_samples = 64\nfeatures = 10\n"
      << "classes = 3\n"
      << "[train]\nglobal_batch = 24\nsteps = " << steps << "\noptimizer = \"" << optimizer
      << "\"\n"
      << (optimizer == "sgd" ? "lr = 0.05\nmomentum = 0.9\n" : "lr = 0.01\n")
      << "seed = 5\neval_every = 0\nlog_every = 1\ncheckpoint_every = " << checkpointEvery
      << "\nkeep_checkpoints = 100\ncheckpoint_dir = \"" << (dir / (name + "-ckpt")).string()
      << "\"\n[balance]\nmode = \"static\"\n[comm]\ntimeout_s = 60\n"
      << "[zero]\nstage = " << stage << "\nshards = \"memory\"\n"
      << extra;
  for (const auto& d : devices)
    out << "[[devices]]\nname = \"" << d.name << "\"\nmemory = \"" << d.memory
        << "\"\nslowdown = " << d.slowdown << "\n";
  return path;
}

// `hetra run` with its output in a file; killed when it runs past its deadline (a hang).
class HetraRun {
 public:
  HetraRun(const std::vector<std::string>& args, fs::path output) : output_(std::move(output)) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(output_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv{const_cast<char*>(HETRA_BINARY), const_cast<char*>("run")};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(HETRA_BINARY, argv.data());
      _exit(127);
    }
  }
  ~HetraRun() {
    if (!done_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::string output() const { return test::slurp(output_); }
  // Whether the output shows `text` within `seconds`.
  bool waitFor(const std::string& text, double seconds) const {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      if (output().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  // The exit code, or -1 after `seconds` (then the run is killed).
  int wait(double seconds) {
    const int code = test::waitForExit(pid_, seconds);
    done_ = code != -1;
    return code;
  }

 private:
  fs::path output_;
  pid_t pid_ = -1;
  bool done_ = false;
};

int runToEnd(const std::vector<std::string>& args, const fs::path& output) {
  HetraRun run(args, output);
  return run.wait(300);
}

json planOf(const fs::path& stepDir) {
  std::ifstream in(stepDir / "state.json");
  return json::parse(in).at("zero");
}

// A data-parallel checkpoint's (model.pt) parameters and optimizer state as flat fields, in the
// order of a sharded one's: LibTorch's own loading into the model `config` describes.
std::vector<std::vector<float>> dataParallelFields(const fs::path& stepDir, const RunConfig& c) {
  auto model = makeModel(modelSpecOf(c, datasetGeometry(c.data)));
  auto optimizer = makeOptimizer(model->parameters(), optimSpecOf(c.train));
  loadCheckpoint((stepDir / "model.pt").string(), *model, *optimizer);
  std::vector<std::vector<float>> out(c.train.optimizer == "sgd" ? 2 : 3);
  auto append = [](std::vector<float>& to, const torch::Tensor& t) {
    const auto flat = t.detach().contiguous().view({-1});
    to.insert(to.end(), flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
  };
  for (const auto& p : flatParameters(*model)) {
    append(out[0], p);
    auto& slot = paramStateSlot(*optimizer, p);
    if (!slot) continue;
    if (c.train.optimizer == "sgd") {
      append(out[1], static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer());
    } else {
      append(out[1], static_cast<torch::optim::AdamParamState&>(*slot).exp_avg());
      append(out[2], static_cast<torch::optim::AdamParamState&>(*slot).exp_avg_sq());
    }
  }
  return out;
}

// Each field of a sharded checkpoint over the whole flat space: the shard files' pieces in rank
// order, read back independently of the resume code. A data-parallel one's from its model file.
std::vector<std::vector<float>> flatFields(const fs::path& stepDir,
                                           const RunConfig* config = nullptr) {
  if (fs::exists(stepDir / "model.pt")) return dataParallelFields(stepDir, *config);
  const json plan = planOf(stepDir);
  const auto shards = plan.at("shards").get<std::vector<int64_t>>();
  const size_t fields = plan.at("fields").size();
  std::vector<std::vector<float>> out(fields);
  for (size_t r = 0; r < shards.size(); ++r) {
    std::ifstream in(stepDir / ("shard-" + std::to_string(r) + ".bin"), std::ios::binary);
    std::vector<float> values(size_t(shards[r]) * fields);
    in.read(reinterpret_cast<char*>(values.data()), std::streamsize(values.size() * 4));
    EXPECT_TRUE(in || values.empty()) << stepDir << " shard " << r;
    for (size_t f = 0; f < fields; ++f)
      out[f].insert(out[f].end(), values.begin() + long(f * size_t(shards[r])),
                    values.begin() + long((f + 1) * size_t(shards[r])));
  }
  return out;
}

// max |a - b| / max |b| of each field; the state must have moved from the start.
void expectSameState(const fs::path& got, const fs::path& want, const std::string& what,
                     const RunConfig* gotConfig = nullptr, const RunConfig* wantConfig = nullptr) {
  const auto a = flatFields(got, gotConfig), b = flatFields(want, wantConfig);
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t f = 0; f < a.size(); ++f) {
    ASSERT_EQ(a[f].size(), b[f].size()) << what << " field " << f;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a[f].size(); ++i) {
      diff = std::max(diff, double(std::fabs(a[f][i] - b[f][i])));
      scale = std::max(scale, double(std::fabs(b[f][i])));
    }
    EXPECT_GT(scale, 0) << what << " field " << f;
    EXPECT_LE(diff, 1e-5 * scale) << what << " field " << f << ": relative " << diff / scale;
    std::printf("%s, field %zu: max relative difference %.3g\n", what.c_str(), f, diff / scale);
  }
}

// Rank 0's headroom is under 1% of the sum: an empty shard; the boundary between ranks 1 and 2
// falls inside a tensor.
const std::vector<Device> kThree = {{"c", "1MiB"}, {"a", "96MiB"}, {"b", "20MiB"}};
const std::vector<Device> kOtherCaps = {{"a", "16MiB"}, {"b", "48MiB"}, {"c", "32MiB"}};
const std::vector<Device> kTwo = {{"x", "8MiB"}, {"y", "40MiB"}};

void expectResumesEndAsUninterrupted(int stage, const std::string& optimizer) {
  const std::string what = "stage " + std::to_string(stage) + " " + optimizer;
  const auto dir = freshDir(optimizer + std::to_string(stage));
  const auto reference = writeConfig(dir, "reference", stage, optimizer, kThree);
  ASSERT_EQ(runToEnd({reference.string()}, dir / "reference.out"), 0)
      << test::slurp(dir / "reference.out");
  const fs::path saved = dir / "reference-ckpt" / "step-6",
                 end = dir / "reference-ckpt" / "step-12";
  // The layout: one shard file per rank, no model file, the plan with one empty shard, and every
  // file verified by its full checksum.
  EXPECT_EQ(checkCheckpoint(saved.string()), "") << what;
  EXPECT_FALSE(fs::exists(saved / "model.pt")) << what;
  const json plan = planOf(saved);
  EXPECT_EQ(plan.at("stage"), stage);
  EXPECT_EQ(plan.at("elements"), 603);
  const auto shards = plan.at("shards").get<std::vector<int64_t>>();
  ASSERT_EQ(shards.size(), 3u) << plan.dump();
  EXPECT_EQ(shards[0], 0) << plan.dump();
  EXPECT_GT(shards[1], shards[2]) << plan.dump();
  EXPECT_GT(shards[2], 0) << plan.dump();
  EXPECT_EQ(plan.at("optimizer_steps"), 6);

  struct Resume {
    std::string name;
    int stage;
    std::vector<Device> devices;
  };
  const int otherStage = stage % 3 + 1;
  // Same devices; other caps; two devices under another stage; data parallelism (every rank
  // reads every shard: its shard is the whole model).
  for (const Resume& r : {Resume{"same", stage, kThree}, Resume{"caps", stage, kOtherCaps},
                          Resume{"two", otherStage, kTwo}, Resume{"dp", 0, kTwo}}) {
    const auto config = writeConfig(dir, r.name, r.stage, optimizer, r.devices);
    const auto out = dir / (r.name + ".out");
    ASSERT_EQ(runToEnd({config.string(), "--resume", saved.string()}, out), 0)
        << what << " " << r.name << ":\n"
        << test::slurp(out);
    EXPECT_NE(test::slurp(out).find("resumed from " + saved.string() + " at step 6"),
              std::string::npos)
        << test::slurp(out);
    const fs::path resumedEnd = dir / (r.name + "-ckpt") / "step-12";
    if (r.stage > 0) {
      const auto resumedShards = planOf(resumedEnd).at("shards").get<std::vector<int64_t>>();
      EXPECT_EQ(resumedShards.size(), r.devices.size());
      if (r.name != "same") {
        EXPECT_NE(resumedShards, shards) << what << " " << r.name;
      }
    }
    const RunConfig parsed = parseConfig(test::slurp(config), config.string(), {});
    expectSameState(resumedEnd, end, what + ", resumed on " + r.name, &parsed);
  }
  fs::remove_all(dir);
}

TEST(ZeroCheckpoint, Stage1ResumedOnSameOtherCapsAndFewerDevicesEndsAsUninterrupted) {
  expectResumesEndAsUninterrupted(1, "sgd");
  expectResumesEndAsUninterrupted(1, "adam");
}

TEST(ZeroCheckpoint, Stage2ResumedOnSameOtherCapsAndFewerDevicesEndsAsUninterrupted) {
  expectResumesEndAsUninterrupted(2, "sgd");
  expectResumesEndAsUninterrupted(2, "adam");
}

TEST(ZeroCheckpoint, Stage3ResumedOnSameOtherCapsAndFewerDevicesEndsAsUninterrupted) {
  expectResumesEndAsUninterrupted(3, "sgd");
  expectResumesEndAsUninterrupted(3, "adam");
}

// [elastic]: rank 1 killed after step 10 of 30; the survivors resume from the newest checkpoint,
// with their memory shards of the same flat space, and end where the uninterrupted run ends.
TEST(ZeroCheckpoint, AnElasticRestartReshardsOntoTheSurvivors) {
  const auto dir = freshDir("elastic");
  std::vector<Device> slow = kOtherCaps;
  for (auto& d : slow) d.slowdown = 20;  // steps long enough to kill a rank in the middle
  const std::string elastic = "[elastic]\nmax_restarts = 1\nmin_devices = 1\n";
  const auto reference = writeConfig(dir, "reference", 3, "adam", slow, 30, 5, elastic);
  ASSERT_EQ(runToEnd({reference.string()}, dir / "reference.out"), 0)
      << test::slurp(dir / "reference.out");
  const auto config = writeConfig(dir, "killed", 3, "adam", slow, 30, 5, elastic);
  HetraRun run({config.string()}, dir / "killed.out");
  ASSERT_TRUE(run.waitFor("step 11/30", 120)) << run.output();
  const auto ranks = test::rankProcesses(run.pid(), 3);
  ASSERT_GT(ranks[1], 0) << run.output();
  ASSERT_EQ(kill(ranks[1], SIGKILL), 0);
  ASSERT_EQ(run.wait(300), 0) << run.output();
  const std::string output = run.output();
  EXPECT_NE(output.find("restarting with 2 devices (a, c)"), std::string::npos) << output;
  // From a checkpoint before the end, with the survivors' new shards.
  const std::string resumed = "resumed from " + (dir / "killed-ckpt").string() + "/step-";
  const auto at = output.find(resumed);
  ASSERT_NE(at, std::string::npos) << output;
  const int resumeStep = std::atoi(output.c_str() + at + resumed.size());
  EXPECT_GE(resumeStep, 10) << output;
  EXPECT_LT(resumeStep, 30) << output;
  std::printf("elastic: resumed on 2 devices from step %d of 30\n", resumeStep);
  const fs::path end = dir / "killed-ckpt" / "step-30";
  EXPECT_EQ(planOf(end).at("shards").size(), 2u);
  expectSameState(end, dir / "reference-ckpt" / "step-30", "elastic restart, stage 3 adam");
  fs::remove_all(dir);
}

// ---- In-process: ranks as threads of this process, without caps (even shards)

RunConfig inProcessConfig(const fs::path& root, const std::vector<std::string>& sets,
                          int devices = 3) {
  const std::string text = R"(
[model]
name = "mlp"
hidden = [24, 12]
[data]
name = "synthetic"
samples = 512
test_samples = 24
features = 10
classes = 3
[train]
global_batch = 12
steps = 2
optimizer = "sgd"
momentum = 0.9
log_every = 0
eval_every = 0
checkpoint_every = 2
[balance]
mode = "static"
)";
  auto all = sets;
  all.push_back("train.checkpoint_dir=" + root.string());
  std::string deviceList;
  for (int d = 0; d < devices; ++d) deviceList += "[[devices]]\n";
  return parseConfig(text + deviceList, "zero-checkpoint-test", all);
}

std::vector<std::exception_ptr> trainRanks(const RunConfig& config, const std::string& resume,
                                           Millis timeout = Millis(20000)) {
  auto store = std::make_shared<store::MemoryStore>();
  const int ranks = int(config.devices.size());
  return test::runRanksCollect(ranks, [&](int rank) {
    comm::GroupOptions options;
    options.timeout = timeout;
    auto comm = comm::Communicator::create(store, rank, ranks, options);
    TrainerOptions trainer;
    trainer.resumeDir = resume;
    train(config, comm, trainer);
  });
}

// The ConfigError every rank throws when resuming `saved` with `sets`; its message.
std::string refusal(const fs::path& dir, const fs::path& saved,
                    const std::vector<std::string>& sets) {
  const auto errors = trainRanks(inProcessConfig(dir / "resumed", sets), saved.string());
  std::string message;
  for (int r = 0; r < 3; ++r) {
    if (!errors[size_t(r)]) {
      ADD_FAILURE() << "rank " << r << " resumed";
      continue;
    }
    try {
      std::rethrow_exception(errors[size_t(r)]);
    } catch (const ConfigError& e) {
      message = e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": not a ConfigError: " << e.what();
    }
  }
  return message;
}

TEST(ZeroCheckpoint, ACheckpointOfAnotherModelOrOptimizerIsRefusedNamingWhatDiffers) {
  const auto dir = freshDir("mismatch");
  for (const auto& e : trainRanks(inProcessConfig(dir / "sharded", {"zero.stage=2"}), ""))
    ASSERT_FALSE(e);
  const fs::path sharded = dir / "sharded" / "step-2";
  const std::string model = refusal(dir, sharded, {"zero.stage=2", "model.hidden=[24, 10]"});
  EXPECT_NE(model.find("does not fit this run"), std::string::npos) << model;
  EXPECT_NE(model.find("its flat space has 603 elements (trainable parameters), this model's 547"),
            std::string::npos)
      << model;
  const std::string optimizer = refusal(dir, sharded, {"zero.stage=3", "train.optimizer=adam"});
  EXPECT_NE(optimizer.find("its optimizer is train.optimizer = \"sgd\", this run's \"adam\""),
            std::string::npos)
      << optimizer;
  const std::string state = refusal(dir, sharded, {"zero.stage=1", "train.momentum=0"});
  EXPECT_NE(state.find("its optimizer state is [momentum], this run's [none]"), std::string::npos)
      << state;
  fs::remove_all(dir);
}

// A resumed rank reads only the saved shards that overlap its own, and verifies the chunks it
// reads: with one byte of shard-1.bin flipped, the rank whose shard it is (the same even shards
// again) fails naming the file, the others never open it. Resuming checks the shard files by size,
// the full check reads them.
TEST(ZeroCheckpoint, EachRankReadsAndVerifiesOnlyTheShardsOverlappingItsOwn) {
  const auto dir = freshDir("corrupt");
  const std::vector<std::string> sets = {"zero.stage=3", "zero.shards=even"};
  for (const auto& e : trainRanks(inProcessConfig(dir / "saved", sets), "")) ASSERT_FALSE(e);
  const fs::path saved = dir / "saved" / "step-2";
  {
    std::fstream file(saved / "shard-1.bin", std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(5);
    const char byte = char(file.get() ^ 0x10);
    file.seekp(5);
    file.put(byte);
  }
  EXPECT_NE(checkCheckpoint(saved.string()).find("shard-1.bin has CRC32C"), std::string::npos);
  EXPECT_EQ(findCheckpoint(saved.string()), saved.string());
  auto resumed = sets;
  resumed.push_back("train.steps=4");
  const auto errors =
      trainRanks(inProcessConfig(dir / "resumed", resumed), saved.string(), Millis(5000));
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[size_t(r)]) << "rank " << r << " trained without rank 1";
    try {
      std::rethrow_exception(errors[size_t(r)]);
    } catch (const IoError& e) {
      const std::string message = e.what();
      EXPECT_EQ(r, 1) << "rank " << r << " read another rank's shard: " << message;
      EXPECT_NE(message.find("shard-1.bin' bytes [0, "), std::string::npos) << message;
      EXPECT_NE(message.find("(corrupted)"), std::string::npos) << message;
    } catch (const std::exception& e) {
      EXPECT_NE(r, 1) << "rank 1: " << e.what();  // the others fail waiting for it
    }
  }
  fs::remove_all(dir);
}

// A data-parallel checkpoint (model.pt) resumed under ZeRO: each rank loads the model file into a
// replica in host memory and takes its shard of the parameters and the optimizer state.
TEST(ZeroCheckpoint, ADataParallelCheckpointResumesIntoShards) {
  for (const std::string optimizer : {"sgd", "adam"}) {
    const auto dir = freshDir("from-dp-" + optimizer);
    const std::vector<std::string> sets = {"train.optimizer=" + optimizer, "train.steps=4"};
    auto with = [&](const std::string& stage) {
      auto all = sets;
      all.push_back("zero.stage=" + stage);
      return all;
    };
    const RunConfig dp = inProcessConfig(dir / "dp", with("0"));
    for (const auto& e : trainRanks(dp, "")) ASSERT_FALSE(e);
    const fs::path saved = dir / "dp" / "step-2", end = dir / "dp" / "step-4";
    for (const auto& [stage, devices] : {std::pair{1, 3}, std::pair{3, 2}}) {
      const std::string name = "stage" + std::to_string(stage);
      const auto config = inProcessConfig(dir / name, with(std::to_string(stage)), devices);
      for (const auto& e : trainRanks(config, saved.string())) ASSERT_FALSE(e) << name;
      expectSameState(dir / name / "step-4", end,
                      "data parallel " + optimizer + " resumed under " + name, nullptr, &dp);
    }
    fs::remove_all(dir);
  }
}

// Shard files of several chunks (36099 parameters, Adam: 144 KiB per file of three ranks): resumed
// ranges start and end inside chunks and span the fields' boundaries, and a resumed rank reads from
// two or three saved files, or all of them when its shard is the whole model.
TEST(ZeroCheckpoint, RangesAcrossChunksAndFilesReshardExactly) {
  const auto dir = freshDir("chunks");
  const std::vector<std::string> model = {"model.hidden=[256, 128]", "train.optimizer=adam",
                                          "train.lr=0.01", "train.steps=4", "zero.shards=even"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.begin(), model.begin(), model.end());
    return sets;
  };
  for (const auto& e : trainRanks(inProcessConfig(dir / "reference", with({"zero.stage=1"})), ""))
    ASSERT_FALSE(e);
  const fs::path saved = dir / "reference" / "step-2", end = dir / "reference" / "step-4";
  const json plan = planOf(saved);
  ASSERT_EQ(plan.at("elements"), 36099);
  for (const auto& file : plan.at("files")) EXPECT_EQ(file.at("crc32c").size(), 3u) << file.dump();
  struct Resume {
    std::string name;
    int stage, devices;
  };
  for (const Resume& r : {Resume{"two", 3, 2}, Resume{"one", 2, 1}, Resume{"four", 1, 4}}) {
    const auto config =
        inProcessConfig(dir / r.name, with({"zero.stage=" + std::to_string(r.stage)}), r.devices);
    for (const auto& e : trainRanks(config, saved.string())) ASSERT_FALSE(e) << r.name;
    expectSameState(dir / r.name / "step-4", end, "chunks, resumed on " + r.name);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hetra::train
