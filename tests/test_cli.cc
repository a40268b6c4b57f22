// The hetra binary end to end, as a user runs it: bench in launcher mode and in per-rank
// environment mode, probe, run on a tiny config, and bad input refused with a message that names
// it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

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
#endif

}  // namespace
