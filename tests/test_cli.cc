// The hetra binary end to end, as a user runs it: bench in launcher mode and in per-rank
// environment mode, probe, run on a tiny config, and bad input refused with a message that names
// it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "process_testing.h"

namespace {

namespace fs = std::filesystem;
using hetra::test::rankProcesses;
using hetra::test::shmSegmentsOf;
using hetra::test::slurp;

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

const std::string kHetra = HETRA_BINARY;

fs::path tempDir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("hetra-cli-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

nlohmann::json readJson(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(Cli, BenchSpawnsRanksAndChecksEveryElement) {
  const auto dir = tempDir("bench");
  for (const std::string transport : {"shm", "tcp"}) {
    const auto json = dir / (transport + ".json");
    const auto r =
        run(kHetra + " bench allreduce --np 3 -b 8 -e 300K -f 7 -w 1 -n 2 -c 1 --transport " +
            transport + " --json " + json.string());
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("transport " + transport), std::string::npos) << r.output;
    const auto rows = readJson(json);
    ASSERT_GE(rows.size(), 4u);
    for (const auto& row : rows) {
      EXPECT_EQ(row["wrong"], 0) << row.dump();
      EXPECT_GT(row["time_us"].get<double>(), 0.0);
    }
  }
  for (const std::string collective : {"reducescatter", "allgather", "broadcast"}) {
    const auto r = run(kHetra + " bench " + collective +
                       " --np 3 -b 12 -e 64K -f 9 -w 0 -n 1 -c 1 --dtype bf16");
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("Out of bounds values : 0 OK"), std::string::npos) << r.output;
  }
  fs::remove_all(dir);
}

TEST(Cli, BenchRunsAsOneRankFromTheEnvironment) {
  // Two ranks started by hand, as on two hosts: rank 0 serves the store at the given port.
  const int port = 20000 + getpid() % 20000;
  const std::string env = "HETRA_WORLD_SIZE=2 HETRA_STORE=127.0.0.1:" + std::to_string(port) + " ";
  const std::string args = " bench allreduce -b 8 -e 4K -f 8 -w 1 -n 2 -c 1 --transport tcp";
  const auto r = run("(" + env + "HETRA_RANK=1 " + kHetra + args + " >/dev/null & " + env +
                     "HETRA_RANK=0 " + kHetra + args + "; wait)");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("2 ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Out of bounds values : 0 OK"), std::string::npos) << r.output;
}

TEST(Cli, BadInputIsRefusedWithItsName) {
  auto r = run(kHetra + " bench allreduce --np 2 --dtype float8");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("float8"), std::string::npos) << r.output;
  r = run(kHetra + " bench allreduce --np 2 -b 1X");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("1X"), std::string::npos) << r.output;
  r = run("HETRA_RANK=0 HETRA_WORLD_SIZE=2 " + kHetra + " bench allreduce");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("HETRA_STORE"), std::string::npos) << r.output;
}

TEST(Cli, ProbeReportsThisMachine) {
  const auto r = run(kHetra + " probe --json");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto info = nlohmann::json::parse(r.output);
  EXPECT_GE(info["logicalCores"].get<int>(), 1) << r.output;
}

#ifdef HETRA_WITH_TORCH
TEST(Cli, RunTrainsTheTinyConfigAndWritesMetrics) {
  const auto dir = tempDir("run");
  const auto metrics = dir / "metrics.jsonl";
  const auto r = run(
      kHetra + " run " + std::string(HETRA_SOURCE_DIR) +
      "/examples/tiny_synthetic.toml --set train.steps=12 --set train.checkpoint_every=6 " +
      "--set train.checkpoint_dir=" + (dir / "ckpt").string() + " --metrics " + metrics.string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(metrics);
  std::string line;
  int steps = 0;
  bool final = false;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "step") {
      ++steps;
      int64_t batch = 0;
      for (const auto& rank : record["ranks"]) batch += rank["batch"].get<int64_t>();
      EXPECT_EQ(batch, record["samples"].get<int64_t>()) << line;
    }
    if (record["event"] == "final") {
      final = true;
      EXPECT_EQ(record["steps"], 12);
      EXPECT_GT(record["test_accuracy"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(steps, 12);
  EXPECT_TRUE(final);
  EXPECT_TRUE(fs::exists(dir / "ckpt" / "latest"));
  fs::remove_all(dir);
}

// Three real processes, the middle one 300 times slower (its optimizer step alone outlasts the
// others' step): the balancer leaves it out and says why, the device table marks it, and the other
// two train every sample of each step from then on.
TEST(Cli, RunLeavesOutADeviceNoSharePaysForAndSaysSo) {
  const auto dir = tempDir("left-out");
  const auto metrics = dir / "metrics.jsonl";
  const auto r = run(kHetra + " run " + std::string(HETRA_SOURCE_DIR) +
                     "/examples/tiny_synthetic.toml --set train.steps=12 --set 'devices=["
                     "{name=\"fast\"}, {name=\"crawl\", slowdown=300}, {name=\"also-fast\"}]' "
                     "--metrics " +
                     metrics.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 left out: no share pays for it"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("crawl +out .*left out by the balancer")))
      << r.output;
  // From the plan that leaves it out on: it computes nothing, the others compute, and their bytes
  // include the gradients' all-reduce in their own group (the left-out rank's only the timings').
  std::vector<nlohmann::json> records;
  int64_t version = -1;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    records.push_back(nlohmann::json::parse(line));
    const auto& record = records.back();
    if (record["event"] == "balance" &&
        record["reason"].get<std::string>().find("left out") != std::string::npos)
      version = record["version"].get<int64_t>();
  }
  ASSERT_GE(version, 1);
  int stepsWithout = 0;
  for (const auto& record : records) {
    if (record["event"] != "step" || record["plan_version"].get<int64_t>() < version) continue;
    ++stepsWithout;
    const auto& ranks = record["ranks"];
    EXPECT_EQ(ranks[1]["batch"].get<int64_t>(), 0) << record.dump();
    EXPECT_EQ(ranks[1]["compute_s"].get<double>(), 0.0) << record.dump();
    for (int r : {0, 2}) {
      EXPECT_GT(ranks[r]["compute_s"].get<double>(), 0.0) << record.dump();
      EXPECT_GT(ranks[r]["bytes_sent"].get<int64_t>(), ranks[1]["bytes_sent"].get<int64_t>())
          << record.dump();
    }
  }
  EXPECT_GE(stepsWithout, 1);
  fs::remove_all(dir);
}

TEST(Cli, RunRefusesBadConfigsBeforeStarting) {
  const std::string config = std::string(HETRA_SOURCE_DIR) + "/examples/tiny_synthetic.toml";
  struct Case {
    std::string set, expect;
  };
  for (const auto& c : std::vector<Case>{{"train.global_bach=64", "train.global_bach"},
                                         {"train.global_batch=2", "global_batch"},
                                         {"devices.0.slowdown=0.5", "devices[0].slowdown"},
                                         {"devices.0.kind=cuda", "CUDA"},
                                         {"devices.1.memory=1KiB", "devices[1].memory"},
                                         {"balance.mode=fastest", "balance.mode"}}) {
    const auto r = run(kHetra + " run " + config + " --set " + c.set);
    EXPECT_EQ(r.status, 2) << c.set << ": " << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.set << ": " << r.output;
  }
}
// A rank of `hetra run` that dies (kill -9) or stops (SIGSTOP) mid-run: the run ends well before
// the peers' own deadline with one message naming that rank and how it ended, a non-zero status, no
// rank left running and no shared-memory segment of the job left behind.
struct FaultRun {
  int status = -1;
  double seconds = 0;  // from the signal to the launcher's exit
  std::string output;
  std::vector<pid_t> ranks;
};

// The peers' own deadline in these runs, far above the time a launcher takes to find a dead or
// stopped rank and stop the others (1-4 s; near 10 s for a stopped rank in a busy sanitizer
// build): a run that ends well before it was ended by the news of rank 1, not by a timeout.
constexpr int kPeersDeadlineSeconds = 120;

FaultRun runAndSignal(int sig, int victim) {
  const auto dir = tempDir("fault");
  const auto log = dir / "out.txt";
  FaultRun result;
  const pid_t launcher = fork();
  if (launcher == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("HETRA_LOG", "info", 1);  // every rank writes lines to stderr: the message shows them
    const std::string config = std::string(HETRA_SOURCE_DIR) + "/examples/tiny_synthetic.toml";
    execl(kHetra.c_str(), kHetra.c_str(), "run", config.c_str(), "--set", "train.steps=1000000",
          "--set", "train.eval_every=0", "--set", "train.log_every=20", "--set",
          ("comm.timeout_s=" + std::to_string(kPeersDeadlineSeconds)).c_str(), nullptr);
    _exit(127);
  }
  // Training runs once step lines appear (at most 60 s for LibTorch to load on a busy machine).
  const auto start = std::chrono::steady_clock::now();
  while (slurp(log).find("step 20/") == std::string::npos &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  result.ranks = rankProcesses(launcher, 3);
  EXPECT_GT(result.ranks[size_t(victim)], 0) << slurp(log);
  const auto signalled = std::chrono::steady_clock::now();
  if (result.ranks[size_t(victim)] > 0) kill(result.ranks[size_t(victim)], sig);
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(launcher, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - signalled <
             std::chrono::seconds(kPeersDeadlineSeconds + 30))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  if (done == 0) {  // never hang the test: take everything down
    for (pid_t pid : result.ranks)
      if (pid > 0) kill(pid, SIGKILL);
    kill(launcher, SIGKILL);
    waitpid(launcher, &status, 0);
  }
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  result.output = slurp(log);
  fs::remove_all(dir);
  return result;
}

void expectCleanFailure(const FaultRun& r, const std::string& how) {
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, kPeersDeadlineSeconds / 4) << r.output;
  // One final message naming the rank, its host and how it ended.
  const auto final = r.output.find("hetra run: FAILED: rank 1 (host ");
  ASSERT_NE(final, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("hetra run: FAILED", final + 1), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(how, final), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lines rank 1 wrote to stderr", final), std::string::npos) << r.output;
  // The peers failed naming rank 1 (PeerAbortedError), not at their own deadlines.
  EXPECT_NE(r.output.find("rank 1 (pid " + std::to_string(r.ranks[1]) + ") died"),
            std::string::npos)
      << r.output;
  for (pid_t pid : r.ranks)
    EXPECT_FALSE(pid > 0 && fs::exists("/proc/" + std::to_string(pid)))
        << "rank pid " << pid << " left";
  EXPECT_TRUE(shmSegmentsOf(r.ranks).empty());
}

TEST(Cli, RunReportsARankKilledMidRun) {
  const auto r = runAndSignal(SIGKILL, 1);
  expectCleanFailure(r, "killed by a signal");
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.output;
}

TEST(Cli, RunReportsAStoppedRankAsHung) {
  const auto r = runAndSignal(SIGSTOP, 1);
  expectCleanFailure(r, "hung: no heartbeat for");
  EXPECT_NE(r.output.find("T (stopped)"), std::string::npos) << r.output;
}

// ---- Device memory (docs/memory.md) through hetra run

// The tiny config with a small transformer (2 layers of width 16 over 16 tokens: one sample's
// activations outweigh the parameters' gradients) and Adam, two steps of an equal split, no
// evaluation to speak of (3 test samples).
const std::string kMemoryRun =
    kHetra + " run " + std::string(HETRA_SOURCE_DIR) +
    "/examples/tiny_synthetic.toml --set model.name=transformer --set model.layers=2 "
    "--set model.dim=16 --set model.heads=2 --set model.seq_len=16 --set data.features=64 "
    "--set train.optimizer=adam --set train.steps=2 --set train.eval_every=0 "
    "--set train.log_every=0 --set data.test_samples=3 --set balance.mode=equal";

// The last step record's entry of `rank` from a metrics file.
nlohmann::json lastStepOf(const fs::path& metrics, int rank) {
  nlohmann::json last;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "step") last = record["ranks"][rank];
  }
  return last;
}

// Device 2's memory, measured by an uncapped run with `sets` (its step record's entry).
nlohmann::json measuredRun(const fs::path& dir, const std::string& name, const std::string& sets) {
  const auto metrics = dir / (name + ".jsonl");
  const auto r = run(kMemoryRun + " --set devices.2.memory=unlimited " + sets + " --metrics " +
                     metrics.string());
  EXPECT_EQ(r.status, 0) << r.output;
  return lastStepOf(metrics, 2);
}

int64_t activationsOf(const nlohmann::json& rank) {
  return rank["memory"]["activations"].get<int64_t>();
}

// The first number the pattern's first group matches in `text`, or -1.
int64_t numberAfter(const std::string& text, const std::string& pattern, int group = 1) {
  std::smatch match;
  if (!std::regex_search(text, match, std::regex(pattern))) return -1;
  return std::stoll(match[group].str());
}

// A capped device that cannot hold its training fails the run with one message that names the
// device, its cap, the category, the bytes and the peak, and what would fit, predicted from the
// measured footprint: the numbers are checked against uncapped runs measured here, with the
// formula of docs/memory.md.
TEST(Cli, RunOutOfDeviceMemorySaysWhatWouldFit) {
  const auto dir = tempDir("oom");
  // Device 2's footprint without a cap, at micro-batches of 1 and 2.
  const auto one = measuredRun(dir, "one", "--set devices.2.max_micro_batch=1");
  const auto two = measuredRun(dir, "two", "--set devices.2.max_micro_batch=2");
  const std::string device = one["device"].get<std::string>();
  const int64_t parameters = one["memory"]["parameters"].get<int64_t>();
  const int64_t gradients = one["memory"]["gradients"].get<int64_t>();
  const int64_t state = 2 * gradients;  // Adam: two moments of every trainable parameter
  EXPECT_EQ(one["memory"]["optimizer_state"].get<int64_t>(), state);
  const int64_t communication = one["memory"]["communication"].get<int64_t>();
  const int64_t fixed = parameters + gradients + state + communication;
  // The cap falls short of the fixed part and one sample's activations by 7/6 of the gradients:
  // more than the gradients (so the run fails even where no gradient is live at the activations'
  // peak), less than the 4/3 of them that ZeRO stage 1 saves over 3 devices (2/3 of the state).
  const int64_t shortBy = gradients * 7 / 6;
  ASSERT_GT(activationsOf(one), shortBy) << "the fixed part alone must fit";
  const int64_t cap = fixed + activationsOf(one) - shortBy;

  const auto r = run(kMemoryRun + " --set devices.2.memory=" + std::to_string(cap));
  EXPECT_EQ(r.status, 1) << r.output;
  const std::string& out = r.output;
  // One message, from the launcher, instead of the rank's last lines.
  const size_t at = out.find("hetra run: FAILED: rank 2 (host ");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_NE(out.find("ran out of device memory", at), std::string::npos) << out;
  EXPECT_EQ(out.find("hetra run: FAILED", at + 1), std::string::npos) << out;
  EXPECT_EQ(out.find("wrote to stderr", at), std::string::npos) << out;
  const std::string message = out.substr(at);
  EXPECT_NE(message.find("device " + device + " is out of memory: "), std::string::npos) << message;
  EXPECT_EQ(numberAfter(message, R"(would pass its cap of [^(]*\((\d+) bytes\))"), cap) << message;
  EXPECT_NE(message.find("more for activations"), std::string::npos) << message;
  EXPECT_NE(message.find("peak so far"), std::string::npos) << message;

  // The rank measured two micro-batch sizes, s = max(1, m/2) and l = max(s + 1, m) for the failing
  // m; measured here too, they give the activations' base and bytes per sample.
  const int64_t m = numberAfter(message, R"(at the failing micro-batch of (\d+))");
  ASSERT_GE(m, 1) << message;
  const int64_t small = std::max<int64_t>(1, m / 2), large = std::max<int64_t>(small + 1, m);
  const auto sized = [&](int64_t samples) {
    if (samples <= 2) return samples == 1 ? activationsOf(one) : activationsOf(two);
    return activationsOf(measuredRun(dir, "m" + std::to_string(samples),
                                     "--set devices.2.max_micro_batch=" + std::to_string(samples)));
  };
  const int64_t atSmall = sized(small), atLarge = sized(large);
  const int64_t perSample = (atLarge - atSmall + (large - small) - 1) / (large - small);
  const int64_t base = atSmall - perSample * small;
  ASSERT_GT(perSample, 0);
  // A smaller micro-batch: none, since not one sample fits.
  ASSERT_GT(fixed + base + perSample, cap);
  EXPECT_NE(message.find("- no micro-batch: the fixed part and one sample's activations need"),
            std::string::npos)
      << message;
  // Checkpointing: the fixed part beside a checkpointed micro-batch of m, measured here.
  const auto checkpointed = measuredRun(dir, "checkpointed",
                                        "--set train.activation_checkpointing=blocks "
                                        "--set devices.2.max_micro_batch=" +
                                            std::to_string(m));
  const int64_t checkpointedPeak = fixed + activationsOf(checkpointed);
  const int64_t said = numberAfter(
      message,
      R"(train\.activation_checkpointing = "blocks": predicted peak [^(]*\((\d+) bytes\))");
  // Within 5%: the run's micro-batch also holds a few KiB the replica's does not (the trainer's
  // and DataParallel's own tensors), measured 4 KiB here.
  EXPECT_NEAR(double(said), double(checkpointedPeak), 0.05 * double(checkpointedPeak)) << message;
  // ZeRO over the 3 devices (docs/memory.md): stage 1 shards the optimizer state, a third each;
  // the least stage whose predicted peak at micro-batch m fits.
  const int64_t activations = base + perSample * m;
  const std::vector<int64_t> peaks = {
      fixed + activations, parameters + gradients + (state + 2) / 3 + communication + activations,
      parameters + (gradients + state + 2) / 3 + communication + activations};
  int stage = 0;
  while (stage < 3 && peaks[size_t(stage)] > cap) ++stage;
  ASSERT_GE(stage, 1);
  ASSERT_LE(stage, 2) << "the test's cap leaves stages 1 and 2 room";
  EXPECT_EQ(numberAfter(message, R"(- ZeRO stage (\d) over 3 devices)"), stage) << message;
  const int64_t zeroPeak = numberAfter(
      message, R"(- ZeRO stage \d over 3 devices [^\n]*predicted peak [^(]*\((\d+) bytes\))");
  EXPECT_NEAR(double(zeroPeak), double(peaks[size_t(stage)]), 0.05 * double(peaks[size_t(stage)]))
      << message;
  fs::remove_all(dir);
}

// HETRA_MEMORY_ACCOUNTING=0 turns the counting off: a capped config is refused before any rank
// starts (nothing could enforce the cap); without a cap the run trains and its memory is unknown.
TEST(Cli, RunWithTheAccountingOffRefusesCapsAndReportsNoMemory) {
  const auto dir = tempDir("accounting");
  auto r = run("HETRA_MEMORY_ACCOUNTING=0 " + kMemoryRun);  // tiny_synthetic caps devices[2]
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("devices[2].memory = \"256MiB\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("HETRA_MEMORY_ACCOUNTING=0"), std::string::npos) << r.output;
  const auto metrics = dir / "off.jsonl";
  r = run("HETRA_MEMORY_ACCOUNTING=0 " + kMemoryRun +
          " --set devices.2.memory=unlimited --metrics " + metrics.string());
  ASSERT_EQ(r.status, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const auto step = lastStepOf(metrics, rank);
    EXPECT_EQ(step["peak_bytes"], -1) << step.dump();
    EXPECT_TRUE(step["memory"].is_null()) << step.dump();
  }
  fs::remove_all(dir);
}
#endif

#ifdef HETRA_WITH_TORCH
// The pipeline example: --print-config shows the partition and its predicted step time; a short
// run trains through hetra run and reports each stage's time and idle fraction.
TEST(Cli, RunTrainsThePipelineExample) {
  const auto dir = tempDir("pipeline");
  const std::string example =
      std::string(HETRA_SOURCE_DIR) + "/examples/pipeline_three_devices.toml";
  const auto printed = run(kHetra + " run " + example + " --print-config");
  ASSERT_EQ(printed.status, 0) << printed.output;
  EXPECT_NE(printed.output.find("[parallel]"), std::string::npos) << printed.output;
  EXPECT_NE(printed.output.find("#   stage 2 on cpu2: blocks "), std::string::npos)
      << printed.output;
  EXPECT_NE(printed.output.find("#   predicted step time "), std::string::npos) << printed.output;
  const auto metrics = dir / "metrics.jsonl";
  const auto r = run(kHetra + " run " + example +
                     " --set train.steps=4 --set train.log_every=1 --set data.test_samples=64 " +
                     "--metrics " + metrics.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("pipeline of 3 stages"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("idle"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] != "pipeline_step") continue;
    ++steps;
    ASSERT_EQ(record["stages"].size(), 3u) << line;
    for (const auto& stage : record["stages"]) {
      EXPECT_GT(stage["stage_s"].get<double>(), 0.0) << line;
      EXPECT_GE(stage["idle_fraction"].get<double>(), 0.0) << line;
    }
  }
  EXPECT_EQ(steps, 4);
  fs::remove_all(dir);
}

// Devices of unequal memory listed small first, with a first block (the embedding of 3072
// features per token, its Adam state and 3 chunks of inputs: about 1.6 MiB) that only the 16 MiB
// device holds: the plan must reorder the devices and put that device at stage 0, says so, and
// trains within every cap (the ledger enforces them in the rank processes: a stage past its cap
// would fail the run). Memory alone decides the order here, so the profile's timings cannot
// change it; where both orders fit, the faster one wins (PipelinePartition tests).
TEST(Cli, PipelineReordersTheDevicesWhenOnlyTheLargestHoldsTheFirstStage) {
  const auto dir = tempDir("pipeline-order");
  const std::string example =
      std::string(HETRA_SOURCE_DIR) + "/examples/pipeline_three_devices.toml" +
      " --set data.features=24576 --set data.samples=512 --set data.test_samples=64";
  const std::string devices =
      " --set 'devices=[{name=\"a\",memory=\"1MiB\"},{name=\"b\",memory=\"1MiB\"},"
      "{name=\"c\",memory=\"16MiB\"}]'";
  const auto printed = run(kHetra + " run " + example + devices + " --print-config");
  ASSERT_EQ(printed.status, 0) << printed.output;
  EXPECT_NE(printed.output.find("#   stage 0 on c: blocks embed.."), std::string::npos)
      << printed.output;
  EXPECT_NE(printed.output.find("not in [[devices]] order"), std::string::npos) << printed.output;
  const auto metrics = dir / "metrics.jsonl";
  const auto r = run(kHetra + " run " + example + devices + " --set train.steps=4 --metrics " +
                     metrics.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("devices reordered"), std::string::npos) << r.output;
  std::ifstream in(metrics);
  std::string line;
  int steps = 0;
  const std::map<std::string, int64_t> caps{{"a", 1 << 20}, {"b", 1 << 20}, {"c", 16 << 20}};
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] == "pipeline") {
      EXPECT_EQ(record["stages"][0]["device"], "c") << line;
    }
    if (record["event"] != "pipeline_step") continue;
    ++steps;
    EXPECT_EQ(record["stages"][0]["device"], "c") << line;
    for (const auto& stage : record["stages"])
      EXPECT_LT(stage["activation_bytes"].get<int64_t>(),
                caps.at(stage["device"].get<std::string>()))
          << line;
  }
  EXPECT_EQ(steps, 4);
  fs::remove_all(dir);
}

// The DP x PP example: two pipelines of two stages through hetra run's rank processes. Its
// --print-config names each stage's devices in both pipelines and predicts each pipeline's step;
// its steps split the batch between the pipelines and report, per device, the chunks and the
// activation bytes in flight (counted: each rank is a process of its own) and the time spent
// with the stage's replica.
TEST(Cli, RunTrainsTheDataParallelPipelinesExample) {
  const auto dir = tempDir("pipeline-replicas");
  const std::string example = std::string(HETRA_SOURCE_DIR) + "/examples/pipeline_replicas.toml";
  const auto printed = run(kHetra + " run " + example + " --print-config");
  ASSERT_EQ(printed.status, 0) << printed.output;
  EXPECT_NE(printed.output.find("#   stage 1 on mid1, slow1: blocks "), std::string::npos)
      << printed.output;
  EXPECT_NE(printed.output.find("#   each pipeline alone with the whole batch: "),
            std::string::npos)
      << printed.output;
  EXPECT_EQ(printed.output.find("Predicted peak device memory"), std::string::npos)
      << "data parallelism's memory prediction does not apply to a pipeline\n"
      << printed.output;
  const auto metrics = dir / "metrics.jsonl";
  const auto r = run(kHetra + " run " + example +
                     " --set train.steps=6 --set train.log_every=1 --set data.test_samples=64 " +
                     "--set train.global_batch=64 --metrics " + metrics.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("2 pipelines of 2 stages as data-parallel replicas (zero.stage 1)"),
            std::string::npos)
      << r.output;
  std::ifstream in(metrics);
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record["event"] != "pipeline_step") continue;
    ++steps;
    const auto shares = record["shares"].get<std::vector<int64_t>>();
    ASSERT_EQ(shares.size(), 2u) << line;
    EXPECT_EQ(shares[0] + shares[1], 64) << line;
    ASSERT_EQ(record["stages"].size(), 4u) << line;
    for (size_t i = 0; i < 4; ++i) {
      const auto& stage = record["stages"][i];
      EXPECT_EQ(stage["replica"].get<int>(), int(i / 2)) << line;
      EXPECT_EQ(stage["stage"].get<int>(), int(i % 2)) << line;
      if (shares[i / 2] == 0) continue;
      // Stage 0 of two holds at most two chunks' activations, stage 1 one (4 chunks a step).
      EXPECT_EQ(stage["chunks_in_flight"].get<int>(), i % 2 == 0 ? 2 : 1) << line;
      EXPECT_GT(stage["activation_bytes"].get<int64_t>(), 0) << line;
      EXPECT_GT(stage["bytes_sent"].get<int64_t>(), 0) << line;
    }
  }
  EXPECT_EQ(steps, 6);
  fs::remove_all(dir);
}

// Tensor parallelism's --print-config: the split of heads and MLP units and its predicted step
// beside an even split's.
TEST(Cli, PrintConfigShowsTheTensorSplit) {
  const std::string example = std::string(HETRA_SOURCE_DIR) + "/examples/tensor_parallel.toml";
  const auto printed = run(kHetra + " run " + example + " --print-config");
  ASSERT_EQ(printed.status, 0) << printed.output;
  EXPECT_NE(printed.output.find("# Tensor parallelism: 1 replica(s) of 2 devices"),
            std::string::npos)
      << printed.output;
  EXPECT_NE(printed.output.find("heads 4/2, MLP units "), std::string::npos) << printed.output;
  EXPECT_NE(printed.output.find("predicted compute of a replica's step"), std::string::npos)
      << printed.output;
}
#endif

}  // namespace
