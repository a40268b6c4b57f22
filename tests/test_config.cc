// The `hetra run` configuration: examples, --set overrides, validation messages, round trips.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "balance/memory_caps.h"
#include "comm/hierarchy.h"
#include "common/errors.h"
#include "device/slowdown.h"
#include "idx_testing.h"
#include "train/config.h"
#include "train/dataset_geometry.h"
#include "train/idx.h"

namespace hetra::train {
namespace {

// The source tree's examples (tests/CMakeLists.txt defines HETRA_SOURCE_DIR): __FILE__ may be
// relative to the build directory, and ctest runs tests elsewhere.
const std::filesystem::path kExamples = std::filesystem::path(HETRA_SOURCE_DIR) / "examples";

// A CPU-only build on a machine with plenty of cores, so tests do not depend on where they run.
Capabilities cpuOnly() {
  Capabilities caps;
  caps.cores = 64;
  return caps;
}

const std::string kMinimal = R"(
[train]
global_batch = 32
steps = 10

[[devices]]

[[devices]]
slowdown = 2

[[devices]]
slowdown = 4
)";

RunConfig parse(const std::string& text, const std::vector<std::string>& sets = {},
                const Capabilities& caps = cpuOnly()) {
  return parseConfig(text, "run.toml", sets, caps);
}

// The ConfigError message of parsing `text` with `sets`; fails the test when it parses.
std::string errorOf(const std::string& text, const std::vector<std::string>& sets = {},
                    const Capabilities& caps = cpuOnly()) {
  try {
    parse(text, sets, caps);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for:\n" << text;
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "in: " << (haystack)

TEST(Config, ExamplesParseAndRoundTrip) {
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kExamples)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    ++seen;
    RunConfig config = loadConfig(entry.path().string(), {}, cpuOnly());
    EXPECT_FALSE(config.devices.empty());
    EXPECT_TRUE(config.warnings.empty()) << config.warnings.front();
    std::string printed = toToml(config);
    RunConfig again = parseConfig(printed, "printed", {}, cpuOnly());
    EXPECT_EQ(again, config) << printed;
    EXPECT_EQ(toToml(again), printed);
  }
  EXPECT_GE(seen, 4);
}

TEST(Config, HeteroExampleHasWhatItSays) {
  RunConfig c = loadConfig((kExamples / "fashion_mnist_hetero.toml").string(), {}, cpuOnly());
  EXPECT_EQ(c.model.name, "mlp");
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{512, 512}));
  EXPECT_EQ(c.data.name, "fashion-mnist");
  EXPECT_EQ(c.train.globalBatch, 512);
  EXPECT_EQ(c.train.lrSchedule, "cosine");
  ASSERT_EQ(c.devices.size(), 3u);
  EXPECT_EQ(c.devices[0].slowdown, 1.0);
  EXPECT_EQ(c.devices[1].slowdown, 2.0);
  EXPECT_EQ(c.devices[2].slowdown, 4.0);
  EXPECT_EQ(c.devices[2].memoryBytes, 48 << 20);
  // 1 + 1/2 + 1/4 cores busy: no warning on a 2-core machine.
  Capabilities twoCores = cpuOnly();
  twoCores.cores = 2;
  EXPECT_TRUE(loadConfig((kExamples / "fashion_mnist_hetero.toml").string(), {}, twoCores)
                  .warnings.empty());
}

TEST(Config, DefaultsAndDeviceNames) {
  RunConfig c = parse(kMinimal);
  EXPECT_EQ(c.model, ModelConfig{});
  EXPECT_EQ(c.data.path, "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(c.train.bucketMib, 25.0);
  EXPECT_EQ(c.balance.mode, "dynamic");
  EXPECT_EQ(c.comm.compression, "none");
  ASSERT_EQ(c.devices.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.devices[i].kind, "cpu");
    EXPECT_EQ(c.devices[i].name, "cpu" + std::to_string(i));
    EXPECT_EQ(c.devices[i].threads, 1);
    EXPECT_EQ(c.devices[i].memoryBytes, 0);
    EXPECT_EQ(c.devices[i].index, -1);
  }
}

TEST(Config, SetOverrides) {
  RunConfig c =
      parse(kMinimal, {"train.lr=0.05", "model.hidden=[256, 128, 7]", "devices.1.slowdown=3",
                       "balance.mode=equal", "devices[2].memory=1.5GB", "train.checkpoint_dir=2024",
                       "data.path=/tmp/fm data", "train.nesterov=true", "train.momentum=0.9",
                       "train.epochs=2"});
  EXPECT_EQ(c.train.lr, 0.05);
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{256, 128, 7}));
  EXPECT_EQ(c.devices[1].slowdown, 3.0);
  EXPECT_EQ(c.devices[0].slowdown, 1.0);
  EXPECT_EQ(c.balance.mode, "equal");
  EXPECT_EQ(c.devices[2].memoryBytes, 1500000000);
  EXPECT_EQ(c.train.checkpointDir, "2024");  // a string key takes the text verbatim
  EXPECT_EQ(c.data.path, "/tmp/fm data");
  EXPECT_TRUE(c.train.nesterov);
  EXPECT_EQ(c.train.epochs, 2.0);

  // Later sets win; a set may add a device (the next index) or a whole section.
  c = parse(kMinimal,
            {"train.lr=1", "train.lr=0.25", "devices.3.slowdown=8", "devices.3.name=slowest",
             "comm={ transport = \"tcp\", timeout_s = 5 }",
             "devices.0.slowdown_schedule=[[10, 2], [20, 1.5]]", "devices.3.max_micro_batch=48"});
  EXPECT_EQ(c.train.lr, 0.25);
  EXPECT_EQ(c.devices[3].maxMicroBatch, 48);
  EXPECT_EQ(c.devices[0].maxMicroBatch, 0);
  ASSERT_EQ(c.devices.size(), 4u);
  EXPECT_EQ(c.devices[3].slowdown, 8.0);
  EXPECT_EQ(c.devices[3].name, "slowest");
  EXPECT_EQ(c.comm.transport, "tcp");
  EXPECT_EQ(c.comm.timeoutS, 5.0);
  EXPECT_EQ(c.devices[0].slowdownSchedule, (std::vector<SlowdownChange>{{10, 2.0}, {20, 1.5}}));

  // Sets on an empty file build the whole config.
  c = parse("", {"devices=[{}, {slowdown = 2}]", "train.steps=5", "data.name=synthetic"});
  EXPECT_EQ(c.devices.size(), 2u);
  EXPECT_EQ(c.devices[1].slowdown, 2.0);
  EXPECT_EQ(c.data.name, "synthetic");
}

TEST(Config, SetErrorsNameTheSet) {
  EXPECT_CONTAINS(errorOf(kMinimal, {"train.lrr=0.1"}), "--set train.lrr=0.1: train.lrr = 0.1");
  EXPECT_CONTAINS(errorOf(kMinimal, {"train.lrr=0.1"}), "did you mean train.lr?");
  EXPECT_CONTAINS(errorOf(kMinimal, {"trian.lr=0.1"}), "--set trian.lr=0.1: unknown key trian.lr");
  EXPECT_CONTAINS(errorOf(kMinimal, {"trian.lr=0.1"}), "did you mean train?");
  EXPECT_CONTAINS(errorOf(kMinimal, {"train.lr=fast"}), "--set train.lr=fast: train.lr = \"fast\"");
  EXPECT_CONTAINS(errorOf(kMinimal, {"train.lr=fast"}), "expected a number > 0");
  EXPECT_CONTAINS(errorOf(kMinimal, {"devices.1.slowdown=0.5"}),
                  "--set devices.1.slowdown=0.5: devices[1].slowdown = 0.5");
  EXPECT_CONTAINS(errorOf(kMinimal, {"devices.7.slowdown=2"}), "devices has 3 entries");
  EXPECT_CONTAINS(errorOf(kMinimal, {"train.lr"}), "expected key=value");
  EXPECT_CONTAINS(errorOf(kMinimal, {"train..lr=1"}), "not a dotted key");
  EXPECT_CONTAINS(errorOf(kMinimal, {"train.steps.x=1"}), "train.steps is a single value");
  EXPECT_CONTAINS(errorOf(kMinimal, {"train.lr.x=1"}), "--set train.lr.x=1: train.lr = { x = 1 }");
  EXPECT_CONTAINS(errorOf(kMinimal, {"balance.mode=fastest"}),
                  "balance.mode = \"fastest\": must be one of \"dynamic\", \"static\", \"equal\"");
}

struct BadCase {
  std::string text;
  std::vector<std::string> sets;
  std::vector<std::string> expected;  // substrings of the message
};

TEST(Config, BadConfigsNameKeyValueAndWhatIsAllowed) {
  const std::vector<BadCase> cases = {
      // Unknown keys, with a suggestion when close, or the known keys.
      {"[train]\nglobal_bach = 64\n",
       {},
       {"run.toml:2: train.global_bach = 64", "did you mean train.global_batch?"}},
      {"[train]\nfoo = 1\n",
       {},
       {"train.foo = 1", "unknown key; the keys of [train] are global_batch"}},
      {"[[devices]]\nslowdwon = 2\n",
       {},
       {"devices[0].slowdwon = 2", "did you mean devices[0].slowdown?"}},
      {"lr = 0.1\n", {}, {"lr = 0.1", "did you mean train.lr?"}},
      {"[trian]\nlr = 0.1\n", {}, {"trian = { lr = 0.1 }", "did you mean train?"}},
      {"[[device]]\n", {}, {"did you mean devices?"}},
      {"[train]\nmode = \"equal\"\n", {}, {"train.mode = \"equal\"", "did you mean balance.mode?"}},
      // Wrong types.
      {"[train]\nlr = \"fast\"\n", {}, {"train.lr = \"fast\"", "expected a number > 0"}},
      {"[train]\nglobal_batch = 64.5\n",
       {},
       {"train.global_batch = 64.5", "expected an integer >= 0"}},
      {"[train]\nnesterov = 1\n", {}, {"train.nesterov = 1", "expected true or false"}},
      {"[model]\nhidden = 512\n", {}, {"model.hidden = 512", "expected a list of integers"}},
      {"[model]\nhidden = [512, \"x\"]\n",
       {},
       {"model.hidden[1] = \"x\"", "expected an integer >= 1"}},
      {"[model]\nname = 3\n", {}, {"model.name = 3", "\"mlp\", \"cnn\", \"transformer\""}},
      {"train = 3\n", {}, {"train = 3", "expected a table"}},
      {"[devices]\nkind = \"cpu\"\n", {}, {"devices = { kind = \"cpu\" }", "[[devices]]"}},
      {"devices = [1]\n", {}, {"devices[0] = 1", "expected a table"}},
      // Out of range and not allowed.
      {"[train]\nlr = -0.1\n", {}, {"train.lr = -0.1", "must be > 0"}},
      {"[train]\nlr = inf\n", {}, {"train.lr = inf", "must be > 0"}},
      {"[train]\nmomentum = 1.0\n", {}, {"train.momentum = 1.0", "in [0, 1)"}},
      {"[train]\noptimizer = \"lamb\"\n",
       {},
       {"train.optimizer = \"lamb\"", "\"sgd\", \"adam\", \"adamw\""}},
      {"[train]\nbetas = [0.9]\n", {}, {"train.betas = [0.9]", "list of 2 numbers"}},
      {"[model]\nhidden = [512, 0]\n", {}, {"model.hidden[1] = 0", ">= 1"}},
      {"[data]\nname = \"mnist\"\n",
       {},
       {"data.name = \"mnist\"", "\"fashion-mnist\", \"synthetic\""}},
      {"[data]\nclasses = 1\n", {}, {"data.classes = 1", "in [2, "}},
      {"[balance]\nmode = \"fair\"\n",
       {},
       {"balance.mode = \"fair\"", "\"dynamic\", \"static\", \"equal\""}},
      {"[balance]\nthreshold = 0\n", {}, {"balance.threshold = 0", "in (0, 1)"}},
      {"[comm]\ntransport = \"nccl\"\n",
       {},
       {"comm.transport = \"nccl\"", "\"auto\", \"shm\", \"tcp\", \"mpi\""}},
      {"[comm]\ncompression_block = 0\n", {}, {"comm.compression_block = 0", "in [1, "}},
      {"[comm]\ncompression = \"zip\"\n",
       {},
       {"comm.compression = \"zip\"", "must be one of \"none\""}},
      {"[comm]\ntimeout_s = 0\n", {}, {"comm.timeout_s = 0", "in [0.001, "}},
      {"[[devices]]\n[[devices]]\n[[devices]]\nslowdown = 0.5\n",
       {},
       {"run.toml:4: devices[2].slowdown = 0.5", "must be in [1, "}},
      {"[[devices]]\nthreads = 0\n", {}, {"devices[0].threads = 0", "in [1, 1024]"}},
      {"[[devices]]\nmax_micro_batch = 0\n", {}, {"devices[0].max_micro_batch = 0", "in [1, "}},
      {"[[devices]]\nmax_micro_batch = \"64\"\n", {}, {"devices[0].max_micro_batch", "integer"}},
      {"[[devices]]\nkind = \"tpu\"\n",
       {},
       {"devices[0].kind = \"tpu\"", "\"cpu\", \"cuda\", \"rocm\""}},
      {"[[devices]]\nmemory = \"lots\"\n", {}, {"devices[0].memory = \"lots\"", "\"512MiB\""}},
      {"[[devices]]\nmemory = 0\n", {}, {"devices[0].memory = 0", "bytes > 0"}},
      {"[[devices]]\nmemory = \"2G\"\n", {}, {"devices[0].memory = \"2G\"", "\"unlimited\""}},
      {"[[devices]]\nslowdown_schedule = [[10, 2], [5, 3]]\n",
       {},
       {"devices[0].slowdown_schedule[1] = [5, 3]", "steps must increase"}},
      {"[[devices]]\nslowdown_schedule = [[10, 0.5]]\n",
       {},
       {"devices[0].slowdown_schedule[0][1] = 0.5", "in [1, "}},
      {"[[devices]]\nslowdown_schedule = [10, 2]\n",
       {},
       {"devices[0].slowdown_schedule[0] = 10", "[step, factor] pair"}},
      {"[[devices]]\nslowdown_schedule = [[-1, 2]]\n",
       {},
       {"slowdown_schedule[0][0] = -1", ">= 0"}},
      // Checks between keys.
      {"", {}, {"run.toml: no devices", "[[devices]]"}},
      {"[[devices]]\nhost = \"a\"\n[[devices]]\n",
       {},
       {"devices[1].host = \"\"", "name a host for every device or for none"}},
      {"[[devices]]\nhost = \"a\"\n[[devices]]\nhost = \"b\"\n[[devices]]\nhost = \"a\"\n",
       {},
       {"devices[2].host = \"a\"", "list the devices of one host together"}},
      {"[train]\ncheckpoint_every = 5\n[elastic]\nmax_restarts = 1\n[[devices]]\nhost = \"a\"\n",
       {},
       {"elastic.max_restarts = 1", "ranks on this host only"}},
      {"[launch]\nmpi_args = \"--oversubscribe\"\n", {}, {"launch.mpi_args", "list of strings"}},
      {"devices = []\n", {}, {"no devices"}},
      {"[train]\nglobal_batch = 2\n[[devices]]\n[[devices]]\n[[devices]]\n",
       {},
       {"run.toml:2: train.global_batch = 2", "below the number of devices (3)"}},
      {"[train]\nglobal_batch = -1\n[[devices]]\n", {}, {"train.global_batch = -1", ">= 0"}},
      // The global batch from memory needs a bound on every device, and no pipeline.
      {"[train]\nglobal_batch = 0\n[[devices]]\nmemory = \"64MiB\"\n[[devices]]\n[[devices]]\n"
       "max_micro_batch = 8\n[[devices]]\nname = \"slow\"\n",
       {},
       {"run.toml:2: train.global_batch = 0",
        "devices have none: devices[1] (cpu1), devices[3] (slow);",
        "devices[i].memory or devices[i].max_micro_batch"}},
      {"[train]\nglobal_batch = 0\n[parallel]\npipeline = 2\n[[devices]]\nmax_micro_batch = 4\n"
       "[[devices]]\nmax_micro_batch = 4\n",
       {},
       {"run.toml:2: train.global_batch = 0", "not supported with parallel.pipeline > 1"}},
      {"[[devices]]\n[[devices]]\nkind = \"cuda\"\n",
       {},
       {"run.toml:3: devices[1].kind = \"cuda\": this hetra was not built with CUDA support (build "
        "with -DHETRA_WITH_CUDA=ON)"}},
      {"[[devices]]\nkind = \"rocm\"\n",
       {},
       {"devices[0].kind = \"rocm\"", "ROCm devices are not supported yet"}},
      {"[[devices]]\nindex = 1\n", {}, {"devices[0].index = 1", "only cuda and rocm"}},
      {"[[devices]]\nname = \"a\"\n[[devices]]\nname = \"a\"\n",
       {},
       {"run.toml:4: devices[1].name = \"a\"", "already used by devices[0]"}},
      {"[[devices]]\n[[devices]]\nname = \"cpu0\"\n", {}, {"devices[1].name = \"cpu0\"", "unique"}},
      {"[[devices]]\nname = \"\"\n", {}, {"devices[0].name = \"\"", "must not be empty"}},
      {"[train]\nepochs = 0\n[[devices]]\n", {}, {"train.epochs = 0.0", "nothing to train"}},
      {"[train]\nnesterov = true\n[[devices]]\n",
       {},
       {"train.nesterov = true", "train.momentum > 0"}},
      {"[model]\nname = \"transformer\"\nheads = 3\n[[devices]]\n",
       {},
       {"run.toml:3: model.heads = 3", "must divide model.dim = 64"}},
      {"[model]\nname = \"cnn\"\nchannels = []\n[[devices]]\n", {}, {"model.channels = []"}},
      // Syntax.
      {"[train]\nlr = = 1\n", {}, {"run.toml:2:", "not valid TOML"}},
      {"[train]\nlr = 1\nlr = 2\n", {}, {"run.toml:3:", "not valid TOML"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    std::string message = errorOf(c.text, c.sets);
    for (const auto& e : c.expected) EXPECT_CONTAINS(message, e);
  }
}

TEST(Config, CapabilitiesAllowGpus) {
  const std::string text =
      "[[devices]]\nkind = \"cuda\"\n[[devices]]\nkind = \"cuda\"\n"
      "[[devices]]\nkind = \"cuda\"\nindex = 0\n[[devices]]\n";
  Capabilities caps = cpuOnly();
  caps.cuda = true;
  RunConfig c = parse(text, {}, caps);
  // Explicit indices are kept; the others take the lowest free ones.
  EXPECT_EQ(c.devices[0].index, 1);
  EXPECT_EQ(c.devices[1].index, 2);
  EXPECT_EQ(c.devices[2].index, 0);
  EXPECT_EQ(c.devices[0].name, "cuda1");
  EXPECT_EQ(c.devices[3].name, "cpu0");
  EXPECT_EQ(c.devices[3].index, -1);
  EXPECT_EQ(parseConfig(toToml(c), "printed", {}, caps), c);
  EXPECT_CONTAINS(errorOf(text + "[[devices]]\nkind = \"cuda\"\nindex = 0\n", {}, caps),
                  "run.toml:11: devices[4].index = 0: already used by devices[2]");
  EXPECT_CONTAINS(errorOf(text, {}, cpuOnly()), "devices[0].kind = \"cuda\"");
}

TEST(Config, OversubscriptionIsAWarning) {
  Capabilities twoCores = cpuOnly();
  twoCores.cores = 2;
  const std::string three = "[[devices]]\n[[devices]]\n[[devices]]\n";
  RunConfig c = parse(three, {}, twoCores);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_CONTAINS(c.warnings[0], "3 cores busy");
  EXPECT_TRUE(
      parse(three, {"devices.1.slowdown=2", "devices.2.slowdown=4"}, twoCores).warnings.empty());
  // A schedule that speeds a device up counts at its fastest.
  EXPECT_EQ(parse(three,
                  {"devices.1.slowdown=2", "devices.2.slowdown=4",
                   "devices.2.slowdown_schedule=[[50, 1]]"},
                  twoCores)
                .warnings.size(),
            1u);
  EXPECT_EQ(parse("[[devices]]\nthreads = 3\n", {}, twoCores).warnings.size(), 1u);
  EXPECT_EQ(parse(three, {}, cpuOnly()).warnings.size(), 0u);
}

// train.resync_every re-synchronises data-parallel replicas; where no trainer does, it says so.
TEST(Config, ResyncEveryOutsideDataParallelismIsAWarning) {
  const std::string two = "[[devices]]\n[[devices]]\n";
  EXPECT_TRUE(parse(two, {"train.resync_every=10"}).warnings.empty());
  const RunConfig zero = parse(two, {"train.resync_every=10", "zero.stage=1"});
  ASSERT_EQ(zero.warnings.size(), 1u);
  EXPECT_CONTAINS(zero.warnings[0],
                  "train.resync_every = 10 is ignored: ZeRO's replicas cannot drift");
  EXPECT_TRUE(parse(two, {"zero.stage=1"}).warnings.empty());  // the default (-1) says nothing
  EXPECT_CONTAINS(errorOf(two, {"train.resync_every=-2"}), "train.resync_every");
}

// bf16 autocasts the forward only: what would compute another precision than the forward is
// refused, naming the key and why.
TEST(Config, Bf16PrecisionRefusesWhatWouldRecomputeInFloat32) {
  const std::string two = "[[devices]]\n[[devices]]\n";
  EXPECT_TRUE(parse(two, {"train.precision=bf16"}).warnings.empty());
  EXPECT_CONTAINS(errorOf(two, {"train.precision=bf16", "train.activation_checkpointing=blocks"}),
                  "train.precision = \"bf16\": not supported with train.activation_checkpointing");
  EXPECT_CONTAINS(errorOf(two, {"train.precision=bf16", "zero.stage=3"}),
                  "train.precision = \"bf16\": not supported with zero.stage = 3");
  EXPECT_CONTAINS(
      errorOf(two, {"train.precision=bf16", "parallel.tensor=2", "model.name=\"transformer\""}),
      "train.precision = \"bf16\": not supported with parallel.tensor > 1");
  EXPECT_CONTAINS(errorOf(two, {"train.precision=bf16", "parallel.pipeline=2"}),
                  "train.precision = \"bf16\": not supported with parallel.pipeline > 1");
  EXPECT_CONTAINS(errorOf(two, {"train.precision=fp16"}), "train.precision");
}

TEST(Config, RoundTripOfEveryNonDefault) {
  RunConfig c = parse(kMinimal);
  c.model = {"transformer", {7, 3}, {5}, 3, 2, 10, 7};
  c.data = {"synthetic", "/x/y \"q\"", 99, 33, 49, 3};
  c.train.globalBatch = 77;
  c.train.epochs = 2.5;
  c.train.steps = 123;
  c.train.lr = 0.1 + 0.2;  // not exactly representable as a short decimal
  c.train.optimizer = "adamw";
  c.train.momentum = 0.0;
  c.train.weightDecay = 1e-4;
  c.train.betas = {0.85, 0.995};
  c.train.eps = 1e-7;
  c.train.lrSchedule = "cosine";
  c.train.warmupSteps = 9;
  c.train.gradClip = 1.5;
  c.train.seed = 12345678901;
  c.train.evalEvery = 11;
  c.train.logEvery = 0;
  c.train.checkpointEvery = 50;
  c.train.checkpointDir = "ck";
  c.train.bucketMib = 0.5;
  c.train.resyncEvery = 25;
  c.train.precision = "bf16";
  c.balance = {"static", 0.1, 4, 3, 6};
  c.comm = {"shm", 12.5, "none"};
  c.devices[0].threads = 2;
  c.devices[0].name = "tab\tname";
  c.devices[1].slowdownSchedule = {{0, 1.25}, {100, 3.0}};
  c.devices[2].memoryBytes = 1000000001;
  c.devices.push_back(c.devices[1]);
  c.devices.back().name = "x";
  c.devices.back().memoryBytes = int64_t(3) << 30;
  ASSERT_TRUE(validateConfig(c, cpuOnly()).empty());
  std::string printed = toToml(c);
  RunConfig again = parseConfig(printed, "printed", {}, cpuOnly());
  EXPECT_EQ(again, c) << printed;
  EXPECT_EQ(again.train.lr, 0.1 + 0.2);
  EXPECT_CONTAINS(printed, "memory = \"3GiB\"");
  EXPECT_CONTAINS(printed, "memory = 1000000001");
  EXPECT_CONTAINS(printed, "memory = \"unlimited\"");
  EXPECT_EQ(printed.find("index ="), std::string::npos);  // cpu devices have none
}

TEST(Config, ValidateConfigBuiltInCode) {
  RunConfig c;
  EXPECT_THROW(validateConfig(c, cpuOnly()), ConfigError);  // no devices
  c.devices.resize(2);
  EXPECT_TRUE(validateConfig(c, cpuOnly()).empty());
  c.devices[1].slowdown = 0.5;
  try {
    validateConfig(c, cpuOnly());
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(e.what(), "devices[1].slowdown = 0.5");
  }
  c.devices[1].slowdown = 1;
  c.train.globalBatch = 1;
  EXPECT_THROW(validateConfig(c, cpuOnly()), ConfigError);
}

// train.global_batch = 0 (from memory, train/global_batch.h) is allowed when every device has a
// bound, whatever the number of devices, and stays 0 in the config: the trainer resolves it.
TEST(Config, GlobalBatchFromMemoryNeedsABoundOnEveryDevice) {
  const RunConfig c = parseConfig(
      "[train]\nglobal_batch = 0\n[[devices]]\nmemory = \"64MiB\"\n[[devices]]\n"
      "max_micro_batch = 1\n[[devices]]\nmax_micro_batch = 1\nmemory = \"32MiB\"\n",
      "run.toml", {}, cpuOnly());
  EXPECT_EQ(c.train.globalBatch, 0);
  EXPECT_EQ(parseConfig(toToml(c), "again", {}, cpuOnly()), c);
  RunConfig inCode;
  inCode.devices.resize(2);
  inCode.train.globalBatch = 0;
  inCode.devices[0].maxMicroBatch = 3;
  try {
    validateConfig(inCode, cpuOnly());
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(e.what(), "train.global_batch = 0");
    EXPECT_CONTAINS(e.what(), "devices have none: devices[1] (cpu1);");
  }
  inCode.devices[1].memoryBytes = 1 << 26;
  EXPECT_TRUE(validateConfig(inCode, cpuOnly()).empty());
}

TEST(Config, ParseBytes) {
  EXPECT_EQ(parseBytes("512MiB"), int64_t(512) << 20);
  EXPECT_EQ(parseBytes("2GiB"), int64_t(2) << 30);
  EXPECT_EQ(parseBytes("1.5GB"), 1500000000);
  EXPECT_EQ(parseBytes("1.5GiB"), int64_t(3) << 29);
  EXPECT_EQ(parseBytes(" 64 kib "), 65536);
  EXPECT_EQ(parseBytes("1000"), 1000);
  EXPECT_EQ(parseBytes("7B"), 7);
  EXPECT_EQ(parseBytes("0.001KB"), 1);
  EXPECT_EQ(parseBytes("8TiB"), int64_t(8) << 40);
  for (const char* bad : {"", "MiB", "1.5", "0.3B", "2G", "-1", "1e9", "1..5MB", "9999999999TiB",
                          "12 MiBs", "0.0001KB"}) {
    SCOPED_TRACE(bad);
    try {
      parseBytes(bad);
      ADD_FAILURE() << "parsed";
    } catch (const ConfigError& e) {
      EXPECT_CONTAINS(e.what(), std::string("\"") + bad + "\"");
      EXPECT_CONTAINS(e.what(), "MiB");
    }
  }
  EXPECT_EQ(formatBytes(48 << 20), "48MiB");
  EXPECT_EQ(formatBytes(1500000000), "1500MB");
  EXPECT_EQ(formatBytes(1536), "1536");  // 1.5 KiB: no exact unit
  EXPECT_EQ(formatBytes(1000000001), "1000000001");
  for (int64_t v : {int64_t(1), int64_t(1024), int64_t(1000), int64_t(3) << 40, int64_t(123456789)})
    EXPECT_EQ(parseBytes(formatBytes(v)), v);
}

TEST(Config, MemoryCaps) {
  RunConfig c = parse(kMinimal, {"devices.1.memory=10MiB", "devices.2.memory=\"48MiB\""});
  const int64_t mib = 1 << 20;
  EXPECT_NO_THROW(checkMemoryCaps(c, 8 * mib, mib));
  EXPECT_EQ(maxMicroBatch(c.devices[0], 8 * mib, mib), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(maxMicroBatch(c.devices[1], 8 * mib, mib), 2);
  EXPECT_EQ(maxMicroBatch(c.devices[2], 8 * mib, mib), 40);
  EXPECT_EQ(maxMicroBatch(c.devices[1], 20 * mib, mib), 0);
  try {
    checkMemoryCaps(c, 9 * mib + 1, mib);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(e.what(), "devices[1].memory = \"10MiB\"");
    EXPECT_CONTAINS(e.what(), std::to_string(10 * mib + 1));  // the minimum needed
  }
}

TEST(Config, SlowdownAt) {
  DeviceConfig d;
  d.slowdown = 2;
  d.slowdownSchedule = {{10, 4}, {20, 1}};
  EXPECT_EQ(slowdownAt(d, 0), 2.0);
  EXPECT_EQ(slowdownAt(d, 9), 2.0);
  EXPECT_EQ(slowdownAt(d, 10), 4.0);
  EXPECT_EQ(slowdownAt(d, 19), 4.0);
  EXPECT_EQ(slowdownAt(d, 20), 1.0);
  EXPECT_EQ(slowdownAt(d, 1000), 1.0);
}

// The schedule lookup of the device layer, on its own: values before, at and between the changes.
TEST(DeviceSlowdown, SlowdownAtFollowsTheSchedule) {
  const std::vector<device::SlowdownChange> schedule = {{5, 3.5}, {6, 1.25}, {40, 8}};
  EXPECT_EQ(device::slowdownAt(1.5, {}, 0), 1.5);
  EXPECT_EQ(device::slowdownAt(1.5, {}, 1 << 30), 1.5);
  EXPECT_EQ(device::slowdownAt(1.5, schedule, 4), 1.5);
  EXPECT_EQ(device::slowdownAt(1.5, schedule, 5), 3.5);
  EXPECT_EQ(device::slowdownAt(1.5, schedule, 6), 1.25);
  EXPECT_EQ(device::slowdownAt(1.5, schedule, 39), 1.25);
  EXPECT_EQ(device::slowdownAt(1.5, schedule, 40), 8.0);
}

// The memory-cap arithmetic of the balance layer, with the expected values worked out by hand.
TEST(BalanceMemoryCaps, MaxMicroBatch) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(balance::maxMicroBatch(0, 1000, 10), kMax);    // no cap
  EXPECT_EQ(balance::maxMicroBatch(1030, 1000, 10), 3);    // exactly three samples
  EXPECT_EQ(balance::maxMicroBatch(1029, 1000, 10), 2);    // one byte short of three
  EXPECT_EQ(balance::maxMicroBatch(1009, 1000, 10), 0);    // the fixed bytes fit, no sample
  EXPECT_EQ(balance::maxMicroBatch(999, 1000, 10), 0);     // not even the fixed bytes
  EXPECT_EQ(balance::maxMicroBatch(1000, 1000, 0), kMax);  // samples cost nothing
  EXPECT_EQ(balance::maxMicroBatch(int64_t(48) << 20, int64_t(8) << 20, 1 << 20), 40);
  EXPECT_EQ(balance::bytesForOneSample(1000, 10), 1010);
  EXPECT_THROW(balance::maxMicroBatch(-1, 0, 1), EnforceError);
  EXPECT_THROW(balance::maxMicroBatch(10, -1, 1), EnforceError);
  EXPECT_THROW(balance::maxMicroBatch(10, 0, -1), EnforceError);
  EXPECT_THROW(balance::bytesForOneSample(kMax, 1), EnforceError);
}

// A build with CUDA but no trainer on the GPU must refuse a cuda device, not train it on the CPU.
TEST(Config, CudaBuildRefusesCudaDevicesUntilTrainingRunsThere) {
  Capabilities cudaBuild = cpuOnly();
  cudaBuild.cudaBuild = true;
  const std::string text = "[[devices]]\n[[devices]]\nkind = \"cuda\"\n";
  const std::string e = errorOf(text, {}, cudaBuild);
  EXPECT_CONTAINS(e, "run.toml:3: devices[1].kind = \"cuda\"");
  EXPECT_CONTAINS(e, "training on CUDA devices is not implemented yet");
  EXPECT_EQ(e.find("-DHETRA_WITH_CUDA=ON"), std::string::npos) << e;
  EXPECT_CONTAINS(errorOf(text, {"devices.1.kind=cpu", "devices.0.kind=cuda"}, cudaBuild),
                  "--set devices.0.kind=cuda: devices[0].kind = \"cuda\": training on CUDA");
  // Whatever this build is, it offers no GPU to train on, so a cuda or rocm device is refused.
  const Capabilities here = Capabilities::ofThisBuild();
  EXPECT_FALSE(here.cuda);
  EXPECT_FALSE(here.rocm);
  EXPECT_THROW(parseConfig(text, "run.toml", {}, here), ConfigError);
  EXPECT_THROW(parseConfig("[[devices]]\nkind = \"rocm\"\n", "run.toml", {}, here), ConfigError);
}

// The IDX header alone gives the shape: a file of 5 images of 3 x 4 without its pixels.
TEST(DatasetGeometry, IdxShapeFromTheHeaderOnly) {
  hetra::testing::TempDir dir;
  hetra::testing::writeIdx(dir.file("images"), {5, 3, 4}, {});
  EXPECT_EQ(readIdxShape(dir.file("images")), (std::vector<int64_t>{5, 3, 4}));
  EXPECT_THROW(readIdx(dir.file("images")), IoError);  // the pixels are missing
  std::ofstream(dir.file("html"), std::ios::binary) << "<html>not found</html>";
  EXPECT_THROW(readIdxShape(dir.file("html")), IoError);
  EXPECT_THROW(readIdxShape(dir.file("absent")), IoError);
}

TEST(DatasetGeometry, FromTheFilesOfASmallDataset) {
  hetra::testing::TempDir dir;
  hetra::testing::writeFashionSplit(dir, "train", 5, 3, 4, {0, 1, 2, 3, 4});
  hetra::testing::writeFashionSplit(dir, "t10k", 2, 3, 4, {5, 6});
  DataConfig data;
  data.path = dir.path();
  const DatasetGeometry geometry = datasetGeometry(data);
  EXPECT_EQ(geometry.sampleShape, (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(geometry.classes, 10);
  EXPECT_EQ(geometry.features(), 12);

  // Validation checks the model against these 12 features, not against 28 x 28.
  const std::string transformer =
      "[model]\nname = \"transformer\"\n[data]\npath = \"" + dir.path() + "\"\n[[devices]]\n";
  EXPECT_EQ(parse(transformer, {"model.seq_len=4"}).model.seqLen, 4);
  EXPECT_CONTAINS(errorOf(transformer, {"model.seq_len=5"}),
                  "--set model.seq_len=5: model.seq_len = 5: must divide the input features (12 "
                  "for data.name = \"fashion-mnist\")");

  // Images and labels that disagree, and splits of different shapes.
  hetra::testing::writeFashionSplit(dir, "t10k", 2, 3, 4, {5, 6, 7});
  try {
    datasetGeometry(data);
    ADD_FAILURE() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_CONTAINS(e.what(), "(t10k split): 2 images but the labels file has shape [3]");
  }
  hetra::testing::writeFashionSplit(dir, "t10k", 2, 4, 3, {5, 6});
  try {
    datasetGeometry(data);
    ADD_FAILURE() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_CONTAINS(e.what(), "the train images are [1, 3, 4] but the test images [1, 4, 3]");
  }
}

TEST(DatasetGeometry, MissingFilesAndOtherDatasets) {
  hetra::testing::TempDir dir;
  DataConfig data;
  data.path = dir.path();
  try {
    datasetGeometry(data);
    ADD_FAILURE() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_CONTAINS(e.what(), dir.file("train-images-idx3-ubyte.gz"));
    EXPECT_CONTAINS(e.what(), "dataset-fashion-mnist");
  }
  // A transformer needs the shape: validation names data.path (a ConfigError, before any rank).
  const std::string e =
      errorOf("[model]\nname = \"transformer\"\n[[devices]]\n", {"data.path=" + dir.path()});
  EXPECT_CONTAINS(e, "--set data.path=" + dir.path() + ": data.path = \"" + dir.path() + "\"");
  EXPECT_CONTAINS(e, "dataset-fashion-mnist");
  // Other models do not read the files.
  EXPECT_NO_THROW(parse("[[devices]]\n", {"data.path=" + dir.path()}));

  DataConfig synthetic;
  synthetic.name = "synthetic";
  synthetic.features = 30;
  synthetic.classes = 7;
  EXPECT_EQ(datasetGeometry(synthetic), (DatasetGeometry{{30}, 7}));
  EXPECT_CONTAINS(errorOf("[model]\nname = \"transformer\"\n[[devices]]\n",
                          {"data.name=synthetic", "data.features=30", "model.seq_len=7"}),
                  "must divide the input features (30 for data.name = \"synthetic\")");
  DataConfig unknown;
  unknown.name = "imagenet";
  EXPECT_THROW(datasetGeometry(unknown), ConfigError);
}

TEST(DatasetGeometry, RealFashionMnist) {
  DataConfig data;  // the default folder
  if (!std::filesystem::exists(std::filesystem::path(data.path) / "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << data.path << " is missing: install the Debian package dataset-fashion-mnist";
  EXPECT_EQ(datasetGeometry(data), (DatasetGeometry{{1, 28, 28}, 10}));
  EXPECT_CONTAINS(errorOf("[model]\nname = \"transformer\"\nseq_len = 5\n[[devices]]\n"),
                  "run.toml:3: model.seq_len = 5: must divide the input features (784");
}

TEST(Config, LoadConfigOfAMissingFile) {
  try {
    loadConfig("/nonexistent/run.toml", {}, cpuOnly());
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(e.what(), "/nonexistent/run.toml");
  }
}

TEST(Config, TopologySection) {
  RunConfig c = parse(kMinimal);
  EXPECT_EQ(c.topology, TopologyConfig{});
  EXPECT_EQ(c.topology.algorithm, "auto");
  std::string printed = toToml(c);
  EXPECT_CONTAINS(printed, "[topology]");
  EXPECT_CONTAINS(printed, "algorithm = \"auto\"");
  EXPECT_EQ(printed.find("file ="), std::string::npos) << "unset keys are not printed";
  EXPECT_EQ(parse(printed), c);

  c = parse(kMinimal + R"(
[topology]
file = "/tmp/probe.json"
islands = [4, 4, 1]
algorithm = "hierarchical"
island_link = "3.5us,12GB/s"
cross_link = "40us,1gbit"
)");
  EXPECT_EQ(c.topology.file, "/tmp/probe.json");
  EXPECT_EQ(c.topology.islands, (std::vector<int64_t>{4, 4, 1}));
  EXPECT_EQ(c.topology.algorithm, "hierarchical");
  EXPECT_EQ(c.topology.islandLink, "3.5us,12GB/s");
  EXPECT_EQ(c.topology.crossLink, "40us,1gbit");
  printed = toToml(c);
  EXPECT_EQ(parse(printed), c) << printed;
  EXPECT_EQ(toToml(parse(printed)), printed);
  EXPECT_TRUE(validateConfig(c, cpuOnly()).empty());

  // A link cost through --set is text: its comma does not make it a TOML value.
  c = parse(kMinimal, {"topology.cross_link=20us,2.5GB/s", "topology.islands=[0, 1, 0]",
                       "topology.algorithm=ring", "topology.file=/tmp/x.json"});
  EXPECT_EQ(c.topology.crossLink, "20us,2.5GB/s");
  EXPECT_EQ(c.topology.islands, (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(c.topology.algorithm, "ring");
  EXPECT_EQ(c.topology.file, "/tmp/x.json");
}

TEST(Config, TopologyRefusesBadValues) {
  std::string e = errorOf(kMinimal + "\n[topology]\nislands = [0, 1]\n");
  EXPECT_CONTAINS(e, "run.toml:15: topology.islands = [0, 1]");
  EXPECT_CONTAINS(e, "2 entries for 3 devices");
  e = errorOf(kMinimal, {"topology.islands=[0, 0, 0, 1]"});
  EXPECT_CONTAINS(e, "--set topology.islands=[0, 0, 0, 1]: topology.islands = [0, 0, 0, 1]");
  EXPECT_CONTAINS(e, "4 entries for 3 devices");
  e = errorOf(kMinimal, {"topology.islands=[0, -1, 0]"});
  EXPECT_CONTAINS(e, "topology.islands[1] = -1: out of range: must be >= 0");
  e = errorOf(kMinimal, {"topology.islands=1"});
  EXPECT_CONTAINS(e, "expected a list of integers");
  e = errorOf(kMinimal, {"topology.algorithm=shared"});
  EXPECT_CONTAINS(e, "topology.algorithm = \"shared\": must be one of \"auto\", \"ring\"");
  for (const std::string bad :
       {"5us", "5us,", "fast,1gbit", "5us,0GB/s", "5 parsecs,1gbit", "-1us,1gbit", "5us,5GB"}) {
    e = errorOf(kMinimal, {"topology.island_link=" + bad});
    EXPECT_CONTAINS(e, "topology.island_link = \"" + bad + "\": expected \"LATENCY,BANDWIDTH\"");
  }
  e = errorOf(kMinimal + "\n[topology]\ncross_link = \"1s,1\"\n");
  EXPECT_CONTAINS(e, "run.toml:15: topology.cross_link");
  e = errorOf(kMinimal + "\n[topology]\nfile = \"\"\n");
  EXPECT_CONTAINS(e, "topology.file = \"\": must not be empty");
  e = errorOf(kMinimal, {"topology.island=[0, 0, 1]"});
  EXPECT_CONTAINS(e, "did you mean topology.islands?");
  e = errorOf(kMinimal + "\n[topolgy]\nislands = []\n");
  EXPECT_CONTAINS(e, "did you mean topology?");
  // Accepted forms, as comm::parseLinkCost reads them.
  for (const std::string good : {"0us,1gbit", "0.5ms,100MB/s", "2e-6s,1e3kb/s", "7NS,3GBIT"})
    EXPECT_EQ(parse(kMinimal, {"topology.island_link=" + good}).topology.islandLink, good);
}

// The config checks link costs itself (hetra_train_config does not link hetra_comm): it must accept
// exactly what the communicator will parse.
TEST(Config, TopologyLinkCostsAgreeWithTheCommParser) {
  for (const std::string text :
       {"5us,5GB/s",  "50us,1gbit", "0us,1gbit",  "0.5ms,100MB/s", "2e-6s,1e3kb/s",
        "7NS,3GBIT",  "1s,1b/s",    "3us,2mbit",  "1us,4kbit",     "5us",
        "5us,",       ",1gbit",     "fast,1gbit", "5us,0GB/s",     "5 parsecs,1gbit",
        "-1us,1gbit", "5us,5GB",    "5us,-2gbit", "nanus,1gbit",   "1us,1gbit,2",
        "us,gbit",    "1,1gbit"}) {
    bool commAccepts = true;
    try {
      comm::parseLinkCost(text);
    } catch (const ConfigError&) {
      commAccepts = false;
    }
    bool configAccepts = true;
    try {
      parse(kMinimal, {"topology.cross_link=" + text});
    } catch (const ConfigError&) {
      configAccepts = false;
    }
    EXPECT_EQ(configAccepts, commAccepts) << text;
  }
}

}  // namespace
}  // namespace hetra::train
