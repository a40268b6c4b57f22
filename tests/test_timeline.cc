// The timeline (common/timeline.h, tools/hetra/timeline_merge.h): the writer's events as strict
// JSON, the clock offsets through the store within their stated bound, the merge, the events of a
// cut file; end to end, `hetra run --timeline` of three ranks with every kind of event in a sane
// order on each rank, and a run killed mid-way leaving each rank's file readable up to the kill.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "process_testing.h"

#include "common/timeline.h"
#include "store/store.h"
#include "timeline_merge.h"

namespace {

namespace fs = std::filesystem;
using hetra::test::rankProcesses;
using hetra::test::slurp;
using nlohmann::json;
namespace timeline = hetra::timeline;

fs::path tempDir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("hetra-timeline-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A rank's file read as the Trace Event Format allows: strict JSON when it was closed, else the
// array without its "]" (the last comma dropped, the bracket added). Independent of the code
// under test's own reader.
json parseRankFile(const std::string& text) {
  if (text.size() >= 2 && text.substr(text.size() - 2) == "]\n") return json::parse(text);
  std::string cut = text.substr(0, text.rfind(",\n"));  // whole lines only
  return json::parse(cut + "]");
}

TEST(Timeline, WriterWritesStrictJsonWithEveryEventsArguments) {
  const auto dir = tempDir("writer");
  const auto path = (dir / "t.json").string();
  {
    timeline::Writer writer(path, 3, "rank 3 (\"gpu\\0\")");
    timeline::activate(&writer);
    {
      timeline::Span span(timeline::Lane::Compute, "compute", "forward");
      span.arg("samples", int64_t(17)).arg("slowdown", 2.5).arg("device", "a\"b\nc");
    }
    std::thread comm([] {
      timeline::Span span(timeline::Lane::Comm, "comm", "allreduce");
      span.arg("provider", "ring").arg("bytes", int64_t(4096));
    });
    comm.join();
    timeline::instant(timeline::Lane::Balance, "balance", "new split", R"("split":[3,5])");
    timeline::activate(nullptr);
    timeline::Span none(timeline::Lane::Compute, "compute", "after");  // no timeline: nothing
  }
  const json events = json::parse(slurp(path));  // closed: strict JSON
  std::map<std::string, json> byName;
  for (const json& e : events) byName[e["name"].get<std::string>()] = e;
  EXPECT_EQ(byName["process_name"]["args"]["name"], "rank 3 (\"gpu\\0\")");
  const json& forward = byName["forward"];
  EXPECT_EQ(forward["ph"], "X");
  EXPECT_EQ(forward["pid"], 3);
  EXPECT_EQ(forward["tid"], int(timeline::Lane::Compute));
  EXPECT_EQ(forward["args"]["samples"], 17);
  EXPECT_DOUBLE_EQ(forward["args"]["slowdown"].get<double>(), 2.5);
  EXPECT_EQ(forward["args"]["device"], "a\"b\nc");
  EXPECT_GE(forward["dur"].get<double>(), 0.0);
  const json& allreduce = byName["allreduce"];
  EXPECT_EQ(allreduce["tid"], int(timeline::Lane::Comm));
  EXPECT_EQ(allreduce["args"]["provider"], "ring");
  EXPECT_EQ(allreduce["args"]["bytes"], 4096);
  EXPECT_GE(allreduce["ts"].get<double>(),
            forward["ts"].get<double>() + forward["dur"].get<double>());
  EXPECT_EQ(byName["new split"]["ph"], "i");
  EXPECT_EQ(byName["new split"]["args"]["split"], json::array({3, 5}));
  EXPECT_EQ(byName.count("after"), 0u);
  fs::remove_all(dir);
}

TEST(Timeline, EventsOfACutFileAreItsWholeLines) {
  const std::string text =
      "[\n{\"ph\":\"X\",\"name\":\"a\",\"pid\":0,\"tid\":1,\"ts\":1.5,\"dur\":2},\n"
      "{\"ph\":\"X\",\"name\":\"b\",\"pid\":0,\"tid\":1,\"ts\":4,\"dur\":1},\n{\"ph\":\"X\",\"na";
  const auto events = hetra::cli::timelineEvents(text);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["name"], "a");
  EXPECT_EQ(events[1]["name"], "b");
}

// Threads share one steady clock, so every true offset is 0: each estimate must be within the
// error bound it states.
TEST(Timeline, ClockOffsetsThroughTheStoreAreWithinTheirStatedBound) {
  for (int size : {1, 2, 5}) {
    auto store = std::make_shared<hetra::store::MemoryStore>();
    std::vector<hetra::cli::ClockOffset> offsets(static_cast<size_t>(size));
    std::vector<std::thread> ranks;
    for (int r = 0; r < size; ++r)
      ranks.emplace_back([&, r] {
        offsets[size_t(r)] = hetra::cli::estimateClockOffset(
            *store, r, size, hetra::deadlineAfter(hetra::Millis(30000)));
      });
    for (auto& t : ranks) t.join();
    EXPECT_EQ(offsets[0].offsetUs, 0.0);
    for (int r = 1; r < size; ++r) {
      EXPECT_GT(offsets[size_t(r)].errorUs, 0.0) << "rank " << r;
      // The bound is half a round trip; 1 us for the decimal text the reply travels as.
      EXPECT_LE(std::abs(offsets[size_t(r)].offsetUs), offsets[size_t(r)].errorUs + 1.0)
          << "rank " << r << " of " << size;
    }
  }
}

TEST(Timeline, MergeMovesEachRanksEventsByItsOffsetAndStatesThem) {
  const std::string rank0 =
      "[\n{\"ph\":\"X\",\"name\":\"a\",\"pid\":0,\"tid\":1,\"ts\":100,\"dur\":5},\n";
  const std::string rank1 =
      "[\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"r\"}},\n"
      "{\"ph\":\"X\",\"name\":\"b\",\"pid\":1,\"tid\":2,\"ts\":250,\"dur\":7},\n"
      "{\"ph\":\"M\",\"name\":\"trace_end\",\"pid\":1,\"tid\":0,\"ts\":300}\n]\n";
  const json merged = hetra::cli::mergeTimelines({rank0, rank1}, {{0, 0}, {-120.5, 3}});
  std::map<std::string, double> ts;
  for (const json& e : merged["traceEvents"])
    if (e.contains("ts")) ts[e["name"].get<std::string>()] = e["ts"].get<double>();
  EXPECT_DOUBLE_EQ(ts["a"], 100);
  EXPECT_DOUBLE_EQ(ts["b"], 250 - 120.5);
  EXPECT_DOUBLE_EQ(ts["trace_end"], 300 - 120.5);
  const json& offsets = merged["otherData"]["clock_offsets"];
  ASSERT_EQ(offsets.size(), 2u);
  EXPECT_DOUBLE_EQ(offsets[1]["offset_us"].get<double>(), -120.5);
  EXPECT_DOUBLE_EQ(offsets[1]["error_us"].get<double>(), 3);
}

#ifdef HETRA_WITH_TORCH
const std::string kHetra = HETRA_BINARY;
const std::string kTiny = std::string(HETRA_SOURCE_DIR) + "/examples/tiny_synthetic.toml";

int runQuiet(const std::string& command) {
  const int status = std::system((command + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

double endOf(const json& e) {
  return e["ts"].get<double>() + e["dur"].get<double>();
}

// Spans of one lane nest or follow each other, never overlap partly.
void expectNested(std::vector<json> spans, const std::string& what) {
  std::sort(spans.begin(), spans.end(),
            [](const json& a, const json& b) { return a["ts"] < b["ts"]; });
  std::vector<double> open;  // ends of the enclosing spans
  for (const json& s : spans) {
    while (!open.empty() && open.back() <= s["ts"].get<double>()) open.pop_back();
    if (!open.empty()) {
      EXPECT_LE(endOf(s), open.back() + 0.01) << what << ": " << s.dump();
    }
    open.push_back(endOf(s));
  }
}

TEST(Timeline, RunWritesEveryRanksEventsInASaneOrderOnOneClock) {
  const auto dir = tempDir("run");
  const auto trace = dir / "trace.json";
  const auto metrics = dir / "metrics.jsonl";
  ASSERT_EQ(runQuiet(kHetra + " run " + kTiny + " --set train.steps=12 --set train.eval_every=5 " +
                     "--set train.checkpoint_every=6 --set train.checkpoint_dir=" +
                     (dir / "ckpt").string() + " --timeline " + trace.string() + " --metrics " +
                     metrics.string()),
            0);
  // Whether the balancer changes the split within 12 steps follows measured times (on a busy
  // machine it may keep the first split); every change it makes is one "new split" per rank.
  int splitChanges = 0;
  {
    std::istringstream lines(slurp(metrics));
    for (std::string line; std::getline(lines, line);)
      if (!line.empty() && json::parse(line)["event"] == "balance") ++splitChanges;
  }
  const json merged = json::parse(slurp(trace));
  ASSERT_EQ(merged["otherData"]["clock_offsets"].size(), 3u);
  std::map<int, std::vector<json>> byRank;
  for (const json& e : merged["traceEvents"]) byRank[e["pid"].get<int>()].push_back(e);
  ASSERT_EQ(byRank.size(), 3u);
  for (auto& [rank, events] : byRank) {
    const std::string who = "rank " + std::to_string(rank);
    // Each rank's own file is there too, closed, with the same events.
    const json own = json::parse(slurp(hetra::cli::rankTimelinePath(trace.string(), rank)));
    EXPECT_EQ(own.size(), events.size()) << who;
    std::map<std::string, int> count;
    std::vector<json> steps, compute, comm;
    for (const json& e : events) {
      const std::string name = e["name"];
      ++count[name];
      if (e["ph"] != "X") continue;
      (e["tid"] == int(timeline::Lane::Comm) ? comm : compute).push_back(e);
      if (name == "step") steps.push_back(e);
      if (e["tid"] == int(timeline::Lane::Comm)) {
        EXPECT_FALSE(e["args"]["provider"].get<std::string>().empty()) << who << e.dump();
        EXPECT_GE(e["args"]["bytes"].get<int64_t>(), e["name"] == "barrier" ? 0 : 1) << who;
      }
    }
    EXPECT_EQ(count["step"], 12) << who;
    // A rank the balancer gives no samples in a step runs no micro-batch in it.
    for (const char* name : {"data", "forward", "backward", "slowdown sleep"})
      EXPECT_GE(count[name], 1) << who << ": " << name;
    for (const char* name : {"wait for gradients", "optimizer step"})
      EXPECT_EQ(count[name], 12) << who << ": " << name;
    EXPECT_EQ(count["forward"], count["backward"]) << who;
    // Every compute segment, each micro-batch's and the optimizer step, ends in the emulation;
    // inside the backward that sends the gradients, each bucket settles it before it leaves.
    std::vector<json> backwards, sleeps;
    for (const json& e : compute) {
      if (e["name"] == "backward") backwards.push_back(e);
      if (e["name"] == "slowdown sleep") sleeps.push_back(e);
    }
    int sleepsInBackward = 0;
    for (const json& sleep : sleeps)
      for (const json& b : backwards)
        if (sleep["ts"] >= b["ts"] && endOf(sleep) <= endOf(b) + 0.01) {
          ++sleepsInBackward;
          break;
        }
    EXPECT_EQ(count["forward"] + count["optimizer step"],
              count["slowdown sleep"] - sleepsInBackward)
        << who;
    EXPECT_GE(sleepsInBackward, 1) << who;
    EXPECT_EQ(count["evaluate"], 3) << who;  // steps 5, 10 and the end
    EXPECT_EQ(count["checkpoint"], 2) << who;
    EXPECT_EQ(count["new split"], splitChanges) << who;
    EXPECT_GE(count["allreduce"], 12) << who;
    EXPECT_GE(count["allgather"], 12) << who;  // the step's timings
    expectNested(compute, who + " compute lane");
    // In every step: the micro-batches' forward before backward, then the wait for the
    // gradients, then the optimizer step.
    for (const json& step : steps) {
      std::vector<std::pair<double, std::string>> inside;
      for (const json& e : compute)
        if (e["ts"] >= step["ts"] && endOf(e) <= endOf(step) + 0.01 && e["name"] != "step")
          inside.emplace_back(e["ts"].get<double>(), e["name"].get<std::string>());
      std::sort(inside.begin(), inside.end());
      std::vector<std::string> order;
      for (const auto& [ts, name] : inside)
        if (name == "forward" || name == "backward" || name == "wait for gradients" ||
            name == "optimizer step")
          order.push_back(name);
      ASSERT_GE(order.size(), 2u) << who;
      ASSERT_EQ(order.size() % 2, 0u) << who;
      for (size_t i = 0; i + 2 < order.size(); i += 2) {
        EXPECT_EQ(order[i], "forward") << who;
        EXPECT_EQ(order[i + 1], "backward") << who;
      }
      EXPECT_EQ(order[order.size() - 2], "wait for gradients") << who;
      EXPECT_EQ(order.back(), "optimizer step") << who;
    }
  }
  // On one clock: every rank's step k begins before every rank's step k + 1 ends (a step's
  // gradients need every rank), within the stated clock errors.
  for (size_t k = 0; k + 1 < 12; ++k)
    for (auto& [a, eventsA] : byRank)
      for (auto& [b, eventsB] : byRank) {
        std::vector<json> stepsA, stepsB;
        for (const json& e : eventsA)
          if (e["name"] == "step") stepsA.push_back(e);
        for (const json& e : eventsB)
          if (e["name"] == "step") stepsB.push_back(e);
        EXPECT_LT(stepsA[k]["ts"].get<double>(), endOf(stepsB[k + 1]) + 1000)
            << "rank " << a << " step " << k << " vs rank " << b;
      }
  fs::remove_all(dir);
}

TEST(Timeline, AKilledRunLeavesEachRanksFileReadableUpToTheKill) {
  const auto dir = tempDir("kill");
  const auto trace = (dir / "trace.json").string();
  const pid_t launcher = fork();
  if (launcher == 0) {
    const int fd = ::open((dir / "out.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("HETRA_TIMELINE", trace.c_str(), 1);  // the variable, as a user would set it
    execl(kHetra.c_str(), kHetra.c_str(), "run", kTiny.c_str(), "--set", "train.steps=1000000",
          "--set", "train.eval_every=0", "--set", "train.log_every=0", nullptr);
    _exit(127);
  }
  // Wait for rank 1 to have written some steps (LibTorch may take a while to load).
  const auto rank1 = hetra::cli::rankTimelinePath(trace, 1);
  const auto start = std::chrono::steady_clock::now();
  auto stepsIn = [](const std::string& text) {
    size_t n = 0;
    for (size_t at = text.find("\"name\":\"step\""); at != std::string::npos;
         at = text.find("\"name\":\"step\"", at + 1))
      ++n;
    return n;
  };
  while (stepsIn(slurp(rank1)) < 20 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(90))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto ranks = rankProcesses(launcher, 3);
  ASSERT_GT(ranks[1], 0) << slurp(dir / "out.txt");
  kill(ranks[1], SIGKILL);
  const std::string atKill = slurp(rank1);
  int status = 0;
  waitpid(launcher, &status, 0);
  EXPECT_NE(status, 0);
  const std::string text = slurp(rank1);
  EXPECT_EQ(text.substr(0, atKill.size()), atKill);  // nothing of what it wrote was lost
  EXPECT_NE(text.substr(text.size() - 2), "]\n");    // it never closed its file
  const json events = parseRankFile(text);
  size_t steps = 0;
  for (const json& e : events) steps += e["name"] == "step" ? 1 : 0;
  EXPECT_GE(steps, 20u);
  EXPECT_EQ(steps, stepsIn(text));  // every step written is a whole event
  // The survivors' files are readable too, however they ended; no merged file was written.
  for (int r : {0, 2})
    EXPECT_FALSE(parseRankFile(slurp(hetra::cli::rankTimelinePath(trace, r))).empty()) << r;
  EXPECT_FALSE(fs::exists(trace));
  fs::remove_all(dir);
}
#endif

}  // namespace
