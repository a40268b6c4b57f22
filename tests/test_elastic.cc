// Elastic recovery of `hetra run` ([elastic] max_restarts): the [elastic] keys, and end to end a
// rank killed mid-run (kill -9) with the run finishing on the surviving devices from the last
// checkpoint, with the same final loss as an uninterrupted run, no process and no shared-memory
// segment left behind. Without restarts left, the run fails as before (tests/test_cli.cc).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "process_testing.h"

#include "common/errors.h"
#include "launch/elastic.h"
#include "train/config.h"

namespace {

namespace fs = std::filesystem;
using hetra::ConfigError;
using hetra::test::rankProcesses;
using hetra::test::shmSegmentsOf;
using hetra::test::slurp;
using hetra::train::Capabilities;
using hetra::train::parseConfig;
using hetra::train::RunConfig;

// ---- The [elastic] keys

const std::string kMinimal = R"(
[train]
checkpoint_every = 10
[[devices]]
[[devices]]
[[devices]]
)";

// The message of the ConfigError that parsing `text` with `sets` raises ("" when none).
std::string configError(const std::string& text, const std::vector<std::string>& sets) {
  try {
    parseConfig(text, "run.toml", sets, Capabilities{});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ElasticConfig, KeysAreReadPrintedAndValidated) {
  const RunConfig defaults = parseConfig(kMinimal, "run.toml", {}, Capabilities{});
  EXPECT_EQ(defaults.elastic.maxRestarts, 0);
  EXPECT_EQ(defaults.elastic.minDevices, 1);

  const RunConfig set = parseConfig(kMinimal + "[elastic]\nmax_restarts = 3\nmin_devices = 2\n",
                                    "run.toml", {}, Capabilities{});
  EXPECT_EQ(set.elastic.maxRestarts, 3);
  EXPECT_EQ(set.elastic.minDevices, 2);
  // Printed and read back equal; a --set overrides the file.
  const std::string printed = hetra::train::toToml(set);
  EXPECT_NE(printed.find("[elastic]"), std::string::npos) << printed;
  EXPECT_EQ(parseConfig(printed, "printed", {}, Capabilities{}), set);
  EXPECT_EQ(parseConfig(kMinimal, "run.toml", {"elastic.max_restarts=5"}, Capabilities{})
                .elastic.maxRestarts,
            5);

  struct Case {
    std::string text;
    std::vector<std::string> sets;
    std::vector<std::string> expect;  // every one in the message
  };
  const std::vector<Case> cases = {
      // Restarts resume from a checkpoint: none without checkpoints.
      {"[elastic]\nmax_restarts = 2\n[[devices]]\n",
       {},
       {"run.toml:2", "elastic.max_restarts = 2", "train.checkpoint_every"}},
      {kMinimal, {"elastic.max_restarts=-1"}, {"--set elastic.max_restarts=-1", "out of range"}},
      {kMinimal, {"elastic.max_restarts=1.5"}, {"elastic.max_restarts", "integer"}},
      {kMinimal + "[elastic]\nmin_devices = 4\n",
       {},
       {"run.toml:8", "elastic.min_devices = 4", "more than the 3 devices"}},
      {kMinimal, {"elastic.min_devices=0"}, {"elastic.min_devices", "out of range"}},
      {kMinimal + "[elastic]\nmax_restart = 1\n", {}, {"did you mean elastic.max_restarts?"}},
      {kMinimal + "[elastik]\nmax_restarts = 1\n", {}, {"did you mean elastic?"}},
  };
  for (const auto& c : cases) {
    const std::string message = configError(c.text, c.sets);
    ASSERT_FALSE(message.empty()) << c.text;
    for (const auto& part : c.expect)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

#ifdef HETRA_WITH_TORCH

// ---- hetra run with a rank killed

const std::string kHetra = HETRA_BINARY;

fs::path tempDir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("hetra-elastic-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// 3 devices of uneven (emulated) speed, 120 steps of ~15 ms, a checkpoint every 10. The problem is
// well conditioned (less than one epoch, moderate learning rate): two runs whose splits differ end
// within ~1e-5 relative of each other (rounding), so 1e-3 tells a continued optimisation from a
// different one (one step more or less changes the loss by ~1%).
fs::path writeConfig(const fs::path& dir, int maxRestarts, int minDevices) {
  const fs::path path = dir / "run.toml";
  std::ofstream out(path);
  out << "[model]\nname = \"mlp\"\nhidden = [256, 256]\n"
      << "[data]\nname = \"synthetic\"\nsamples = 32768\ntest_samples = 256\nfeatures = 128\n"
      << "classes = 4\n"
      << "[train]\nglobal_batch = 256\nsteps = 120\nlr = 0.05\nmomentum = 0.5\nseed = 11\n"
      << "eval_every = 0\nlog_every = 1\ncheckpoint_every = 10\n"
      << "checkpoint_dir = \"" << (dir / "ckpt").string() << "\"\n"
      << "[balance]\nprofile_steps = 3\n"
      << "[comm]\ntimeout_s = 30\n"
      << "[elastic]\nmax_restarts = " << maxRestarts << "\nmin_devices = " << minDevices << "\n"
      << "[[devices]]\nslowdown = 10\n[[devices]]\nslowdown = 20\n[[devices]]\nslowdown = 30\n";
  return path;
}

std::vector<nlohmann::json> readRecords(const fs::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

// The loss of the last step record for `step`.
double lossAt(const std::vector<nlohmann::json>& records, int64_t step) {
  double loss = NAN;
  for (const auto& r : records)
    if (r["event"] == "step" && r["step"] == step) loss = r["loss"].get<double>();
  return loss;
}

using Clock = std::chrono::steady_clock;

double secondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// `hetra run` in the background; a thread stamps each line of its stdout and stderr as it comes.
class Launched {
 public:
  struct Line {
    Clock::time_point at;
    std::string text;
  };

  explicit Launched(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(kHetra.c_str()));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(kHetra.c_str(), argv.data());
      _exit(127);
    }
    close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      std::string partial;
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) {
        const auto now = Clock::now();
        partial.append(buf, size_t(n));
        size_t eol;
        std::lock_guard<std::mutex> lock(mutex_);
        while ((eol = partial.find('\n')) != std::string::npos) {
          lines_.push_back({now, partial.substr(0, eol)});
          partial.erase(0, eol + 1);
        }
      }
      close(fd);
    });
  }

  ~Launched() {
    if (!done_) {  // never leave a run behind: its ranks die with it (PR_SET_PDEATHSIG)
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (reader_.joinable()) reader_.join();
  }

  pid_t pid() const { return pid_; }

  // The first line from index `from` on that contains `text`: its index, or -1 after `timeout`.
  long waitFor(const std::string& text, double timeout, size_t from = 0) {
    const auto end = Clock::now() + std::chrono::duration<double>(timeout);
    while (Clock::now() < end) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (size_t i = from; i < lines_.size(); ++i)
          if (lines_[i].text.find(text) != std::string::npos) return long(i);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
  }

  Line line(long index) {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_.at(size_t(index));
  }

  std::string output() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string text;
    for (const auto& l : lines_) text += l.text + "\n";
    return text;
  }

  // The exit status (128 + signal when killed), or -1 when it did not end within `timeout`.
  int wait(double timeout) {
    const int code = hetra::test::waitForExit(pid_, timeout);
    if (code == -1) return -1;
    done_ = true;
    reader_.join();  // the pipe's last writers are gone
    return code;
  }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  std::thread reader_;
  std::mutex mutex_;
  std::vector<Line> lines_;
};

TEST(Elastic, ARankKilledAtStep50IsLeftOutAndTheRunEndsAsIfUninterrupted) {
  const auto dir = tempDir("kill");
  const auto config = writeConfig(dir, /*maxRestarts=*/1, /*minDevices=*/1);
  const auto reference = dir / "reference.jsonl";
  const auto metrics = dir / "elastic.jsonl";

  // The uninterrupted run, elastic on as well (it changes nothing without a fault).
  {
    Launched run({"run", config.string(), "--metrics", reference.string(), "--set",
                  "train.checkpoint_dir=" + (dir / "reference-ckpt").string()});
    const int status = run.wait(90);
    ASSERT_EQ(status, 0) << run.output();
    EXPECT_EQ(run.output().find("restarting"), std::string::npos) << run.output();
  }
  const double expected = lossAt(readRecords(reference), 120);
  ASSERT_TRUE(std::isfinite(expected));

  Launched run({"run", config.string(), "--metrics", metrics.string()});
  const long at50 = run.waitFor("step 50/120", 90);
  ASSERT_GE(at50, 0) << run.output();
  const auto first = rankProcesses(run.pid(), 3);
  ASSERT_GT(first[1], 0) << run.output();
  const auto killed = Clock::now();
  ASSERT_EQ(kill(first[1], SIGKILL), 0);
  // The supervisor sees the rank die, the others end (they fail naming it), then it restarts.
  const long seen = run.waitFor("rank 1 (pid " + std::to_string(first[1]) + ") was killed", 30);
  const long restart = run.waitFor("restarting with 2 devices (cpu0, cpu2)", 30);
  ASSERT_GE(restart, 0) << run.output();
  const long resumed = run.waitFor("resumed from ", 60, size_t(restart));
  ASSERT_GE(resumed, 0) << run.output();
  // The first step the restarted ranks finish.
  const long stepped = run.waitFor("/120  epoch", 60, size_t(resumed));
  ASSERT_GE(stepped, 0) << run.output();
  const auto second = rankProcesses(run.pid(), 2);
  const int status = run.wait(90);
  ASSERT_EQ(status, 0) << run.output();
  const std::string output = run.output();

  // One message names the rank, its device, the step and the checkpoint; no FAILED.
  EXPECT_NE(output.find("hetra run: rank 1 (device cpu1) died at step ~"), std::string::npos)
      << output;
  EXPECT_NE(output.find("(restart 1 of 1)"), std::string::npos) << output;
  EXPECT_EQ(output.find("FAILED"), std::string::npos) << output;

  // The metrics continue: a restart record, then the steps after its checkpoint, once each.
  const auto records = readRecords(metrics);
  const nlohmann::json* record = nullptr;
  size_t recordIndex = 0;
  for (size_t i = 0; i < records.size(); ++i)
    if (records[i]["event"] == "restart") record = &records[i], recordIndex = i;
  ASSERT_NE(record, nullptr) << slurp(metrics);
  EXPECT_EQ((*record)["failed_rank"], 1);
  EXPECT_EQ((*record)["failed_device"], "cpu1");
  EXPECT_EQ((*record)["exit_status"], 128 + SIGKILL);
  EXPECT_EQ((*record)["devices"], nlohmann::json({"cpu0", "cpu2"}));
  const int64_t resumeStep = (*record)["resume_step"].get<int64_t>();
  const int64_t lastStep = (*record)["last_step"].get<int64_t>();
  // Killed once step 50 was reported: the checkpoint of step 50 (or of 40, when the kill came
  // while step 50's was written).
  EXPECT_TRUE(resumeStep == 50 || resumeStep == 40) << record->dump();
  EXPECT_GE(lastStep, 50) << record->dump();
  EXPECT_NE(output.find("resumed from " + (dir / "ckpt").string() + "/step-" +
                        std::to_string(resumeStep) + " at step " + std::to_string(resumeStep)),
            std::string::npos)
      << output;
  int64_t next = resumeStep + 1, after = 0;
  for (size_t i = recordIndex + 1; i < records.size(); ++i) {
    if (records[i]["event"] != "step") continue;
    EXPECT_EQ(records[i]["step"], next++) << records[i].dump();
    EXPECT_EQ(records[i]["ranks"].size(), 2u) << records[i].dump();
    ++after;
  }
  EXPECT_EQ(after, 120 - resumeStep);

  // The same optimisation: the final loss as uninterrupted, up to rounding.
  const double loss = lossAt(records, 120);
  EXPECT_NEAR(loss, expected, 1e-3 * std::fabs(expected)) << "uninterrupted " << expected;

  // Nothing left: no rank of either attempt, no shared-memory segment of theirs.
  std::vector<pid_t> all = first;
  all.insert(all.end(), second.begin(), second.end());
  for (pid_t pid : all)
    EXPECT_FALSE(pid > 0 && fs::exists("/proc/" + std::to_string(pid))) << "pid " << pid << " left";
  EXPECT_TRUE(shmSegmentsOf(all).empty());

  // The measurements of docs/reliability.md. Rank 0 prints a line per step, at once, so the last
  // one before the restart is the last step done (the metrics lag by up to a second).
  const auto atLine = [&](long index) { return run.line(index).at; };
  long lastDone = -1;
  for (long i = 0; i < restart; ++i)
    if (run.line(i).text.rfind("step ", 0) == 0) lastDone = std::atol(run.line(i).text.c_str() + 5);
  std::printf(
      "elastic: kill -9 after step 50: supervisor saw it %.3f s later, restart decided %.3f s, "
      "restarted ranks resumed (checkpoint loaded) %.3f s, first step done %.3f s; resumed "
      "from step %lld, last step done %ld (work lost %lld steps; last in the metrics %lld); "
      "final loss %.9g vs %.9g (relative %.2e)\n",
      seen >= 0 ? secondsBetween(killed, atLine(seen)) : -1.0,
      secondsBetween(killed, atLine(restart)), secondsBetween(killed, atLine(resumed)),
      secondsBetween(killed, atLine(stepped)), (long long)resumeStep, lastDone,
      (long long)(lastDone - resumeStep), (long long)lastStep, loss, expected,
      std::fabs(loss - expected) / expected);
  fs::remove_all(dir);
}

TEST(Elastic, NoRestartWhenTooFewDevicesWouldRemain) {
  const auto dir = tempDir("min");
  const auto config = writeConfig(dir, /*maxRestarts=*/1, /*minDevices=*/3);
  Launched run({"run", config.string(), "--set", "train.steps=100000"});
  ASSERT_GE(run.waitFor("step 20/100000", 90), 0) << run.output();
  const auto ranks = rankProcesses(run.pid(), 3);
  ASSERT_GT(ranks[1], 0) << run.output();
  const auto killed = Clock::now();
  kill(ranks[1], SIGKILL);
  const int status = run.wait(30);
  const double seconds = secondsBetween(killed, Clock::now());
  const std::string output = run.output();
  EXPECT_EQ(status, 128 + SIGKILL) << output;
  EXPECT_LT(seconds, 10.0) << output;
  EXPECT_NE(output.find("hetra run: FAILED: rank 1 (host "), std::string::npos) << output;
  EXPECT_NE(output.find("hetra run: only 2 devices would remain (elastic.min_devices = 3)"),
            std::string::npos)
      << output;
  EXPECT_EQ(output.find("restarting"), std::string::npos) << output;
  for (pid_t pid : ranks)
    EXPECT_FALSE(pid > 0 && fs::exists("/proc/" + std::to_string(pid))) << "pid " << pid << " left";
  EXPECT_TRUE(shmSegmentsOf(ranks).empty());
  fs::remove_all(dir);
}

#endif

// ---- The restart policy (launch/elastic.h), without processes

using hetra::launch::AttemptFailure;
using hetra::launch::ElasticAttempt;
using hetra::launch::ElasticPolicy;

TEST(ElasticPolicy, ARestartLeavesTheFailedDeviceOutAndResumes) {
  const ElasticAttempt first = hetra::launch::firstAttempt(4);
  EXPECT_EQ(first.restart, 0);
  EXPECT_EQ(first.devices, (std::vector<size_t>{0, 1, 2, 3}));
  const ElasticPolicy policy{/*maxRestarts=*/2, /*minDevices=*/2};
  EXPECT_EQ(whyNoRestart(policy, first, AttemptFailure{128 + SIGKILL, 1}), "");
  const ElasticAttempt second = nextAttempt(first, 1, "/ckpt/step-40");
  EXPECT_EQ(second.restart, 1);
  EXPECT_EQ(second.devices, (std::vector<size_t>{0, 2, 3}));
  EXPECT_EQ(second.resume, "/ckpt/step-40");
  // Rank 2 of the second attempt runs device 3.
  const ElasticAttempt third = nextAttempt(second, 2, "");
  EXPECT_EQ(third.devices, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(third.restart, 2);
}

TEST(ElasticPolicy, NoRestartSaysWhy) {
  const ElasticAttempt first = hetra::launch::firstAttempt(3);
  const ElasticPolicy policy{/*maxRestarts=*/1, /*minDevices=*/2};
  auto why = [&](const ElasticPolicy& p, const ElasticAttempt& a, int code, int rank) {
    return whyNoRestart(p, a, AttemptFailure{code, rank});
  };
  EXPECT_EQ(why(ElasticPolicy{0, 1}, first, 1, 0),
            "no elastic restart left (elastic.max_restarts = 0)");
  EXPECT_EQ(why(policy, nextAttempt(first, 0, ""), 1, 0),
            "no elastic restart left (elastic.max_restarts = 1)");
  EXPECT_EQ(why(policy, first, 1, -1), "no rank is known to have failed");
  EXPECT_EQ(why(policy, first, 1, 3), "no rank is known to have failed");
  EXPECT_EQ(why(policy, first, 128 + SIGTERM, 0), "the run was stopped by a signal");
  EXPECT_EQ(why(policy, first, 128 + SIGINT, 0), "the run was stopped by a signal");
  EXPECT_EQ(why(policy, first, 2, 0),
            "a configuration error is no device failure: a restart would fail the same way");
  EXPECT_EQ(why(ElasticPolicy{1, 3}, first, 1, 0),
            "only 2 devices would remain (elastic.min_devices = 3)");
}

TEST(ElasticPolicy, RanksReadTheirAttemptFromTheirEnvironment) {
  ElasticAttempt attempt;
  attempt.restart = 2;
  attempt.devices = {3, 0, 5};
  attempt.resume = "/ckpt/step-90";
  const auto variables = attempt.environment();
  for (const auto& [name, value] : variables) setenv(name.c_str(), value.c_str(), 1);
  const ElasticAttempt read = hetra::launch::attemptFromEnvironment(6);
  EXPECT_EQ(read.restart, 2);
  EXPECT_EQ(read.devices, attempt.devices);
  EXPECT_EQ(read.resume, "/ckpt/step-90");
  // An index the config does not have is refused by name.
  try {
    hetra::launch::attemptFromEnvironment(5);
    ADD_FAILURE() << "device 5 of 5 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("HETRA_ELASTIC_DEVICES=3,0,5: '5' is not an index of "
                                         "the config's 5 devices"),
              std::string::npos)
        << e.what();
  }
  // The first attempt's environment names every device.
  for (const auto& [name, value] : hetra::launch::firstAttempt(2).environment())
    setenv(name.c_str(), value.c_str(), 1);
  EXPECT_EQ(hetra::launch::attemptFromEnvironment(2).devices, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(hetra::launch::attemptFromEnvironment(2).restart, 0);
  for (const auto& [name, value] : variables) unsetenv(name.c_str());
}

}  // namespace
