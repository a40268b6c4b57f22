#include "run_command.h"

#include <unistd.h>

#include <cstring>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "comm/topology.h"
#include "common/errors.h"
#include "common/logging.h"
#include "launch.h"
#include "launch/elastic.h"
#include "launch_command.h"
#include "rank_group.h"
#include "timeline_merge.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/device_memory.h"
#include "train/global_batch.h"
#include "train/pipeline/pipeline_trainer.h"
#include "train/report.h"
#include "train/tensor_parallel_trainer.h"
#include "train/trainer.h"

namespace hetra::cli {
namespace {

using launch::RankWatch;

// What DeviceOutOfMemoryError says (device/memory_accounting.cc); a rank's error with it is one.
constexpr const char* kOutOfMemory = " is out of memory: ";

// A rank's out-of-memory message with what would fit (train/device_memory.h, withWhatFits), from
// the line of its last stderr lines that starts it to the end, or its one-line end message when
// its stderr lost it; empty when the rank failed otherwise.
std::vector<std::string> outOfMemoryMessage(const RankWatch::Failure& failure) {
  const size_t said = failure.how.find(": device ");
  if (failure.how.find(kOutOfMemory) == std::string::npos || said == std::string::npos) return {};
  for (size_t i = failure.tail.size(); i-- > 0;) {
    const size_t at = failure.tail[i].find("device ");
    if (failure.tail[i].find(kOutOfMemory) == std::string::npos || at == std::string::npos)
      continue;
    std::vector<std::string> lines{failure.tail[i].substr(at)};
    lines.insert(lines.end(), failure.tail.begin() + long(i) + 1, failure.tail.end());
    return lines;
  }
  return {failure.how.substr(said + 2)};
}

// One message about a failed rank: which rank, where, how it ended, its last lines (or, for a
// rank out of device memory, that message alone: it says all). `head` is "FAILED: " at the end of
// a failed run, "" before an elastic restart.
void reportFailure(const RankWatch::Failure& failure, int code,
                   const std::string& head = "FAILED: ") {
  const std::string status =
      code > 128 ? str(code, " (signal ", code - 128, ", ", strsignal(code - 128), ")")
                 : std::to_string(code);
  if (failure.rank < 0) {
    std::fprintf(stderr, "hetra run: failed, exit status %s\n", status.c_str());
    return;
  }
  const std::vector<std::string> outOfMemory = outOfMemoryMessage(failure);
  if (!outOfMemory.empty()) {
    std::string text =
        str("hetra run: ", head, "rank ", failure.rank, " (host ", failure.host, ", pid ",
            failure.pid, ") ran out of device memory; exit status ", status, "\n");
    for (const auto& line : outOfMemory) text += "    " + line + "\n";
    std::fputs(text.c_str(), stderr);
    return;
  }
  std::string text = str("hetra run: ", head, "rank ", failure.rank, " (host ", failure.host,
                         ", pid ", failure.pid, ") ", failure.how, "; exit status ", status, "\n");
  if (failure.tail.empty()) {
    text += str("hetra run: rank ", failure.rank, " wrote nothing to stderr\n");
  } else {
    text += str("hetra run: the last ", failure.tail.size(), " lines rank ", failure.rank,
                " wrote to stderr:\n");
    for (const auto& line : failure.tail) text += "    " + line + "\n";
  }
  std::fputs(text.c_str(), stderr);
}

void runRank(const RunOptions& options, const train::RunConfig& config, const RankContext& context,
             bool appendMetrics);
train::TopologyConfig resolveTopology(const train::RunConfig& config);
int runOnHosts(const train::RunConfig& config, const std::vector<std::string>& argv);
int superviseElastic(const RunOptions& options, const train::RunConfig& config,
                     const std::vector<std::string>& argv);

}  // namespace

int runTraining(const RunOptions& options, const std::vector<std::string>& argv) {
  // Every rank parses the same file and overrides, so all hold the same config without sending it.
  const train::RunConfig config = train::loadConfig(options.configPath, options.sets);
  train::checkModelFits(config);
  auto context = rankFromEnvironment();
  if (!context && options.rankFromEnv)
    throw ConfigError(
        "--rank-from-env: no launcher's variables name a rank here (HETRA_RANK, "
        "RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, PMI_RANK, VC_TASK_INDEX; see "
        "docs/deployment.md)");
  if (!context) {
    // train.global_batch = 0 resolved as every rank will (train/global_batch.h): what cannot be
    // resolved fails here, before any rank starts, and the predictions use the resolved batch.
    const train::GlobalBatch batch = train::resolveGlobalBatch(config);
    train::RunConfig resolved = config;
    resolved.train.globalBatch = batch.samples;
    if (options.printConfig) {
      std::printf("%s", train::toToml(config).c_str());
      if (batch.fromMemory) std::printf("\n# global batch %s\n", batch.text.c_str());
      // The memory prediction is data parallelism's (a whole model per device); a pipeline's
      // lists each stage's bytes itself.
      if (config.parallel.pipeline > 1)
        std::printf("\n%s", train::pipeline::predictedPipeline(config).c_str());
      else if (config.parallel.tensor > 1)
        std::printf("\n%s", train::predictedTensorParallel(config).c_str());
      else
        std::printf("\n%s", train::predictedMemory(resolved).c_str());
      return 0;
    }
    for (const auto& warning : config.warnings)
      std::fprintf(stderr, "hetra: warning: %s\n", warning.c_str());
    resolveTopology(config);  // a bad topology file fails here, before any rank starts
    if (!config.devices.front().host.empty()) return runOnHosts(config, argv);
    return superviseElastic(options, config, argv);
  }
  // The ranks of an elastic restart run on the surviving devices only, from the restart's
  // checkpoint (set by the supervising hetra run, below).
  const launch::ElasticAttempt attempt = launch::attemptFromEnvironment(config.devices.size());
  train::RunConfig rankConfig = config;
  // The file's islands and link costs become explicit keys, so that they can follow the devices.
  const train::TopologyConfig topology = resolveTopology(config);
  rankConfig.topology = topology;
  RunOptions rankOptions = options;
  const bool restarted = attempt.restart > 0;
  if (restarted) rankOptions.resumeDir = attempt.resume;
  rankConfig.devices.clear();
  rankConfig.topology.islands.clear();
  for (size_t index : attempt.devices) {
    rankConfig.devices.push_back(config.devices[index]);
    if (!topology.islands.empty()) rankConfig.topology.islands.push_back(topology.islands[index]);
  }
  if (context->worldSize != int(rankConfig.devices.size()))
    throw ConfigError(str("the config lists ", rankConfig.devices.size(),
                          " devices but HETRA_WORLD_SIZE is ", context->worldSize,
                          "; run one rank per [[devices]] entry"));
  log::setRank(context->rank);
  if (options.rankFromEnv)
    HETRA_INFO("cli", "rank ", context->rank, " of ", context->worldSize, " from ",
               context->launcher, "'s environment, store ", context->storeAddress);
  runRank(rankOptions, rankConfig, *context, restarted);
  return 0;
}

namespace {

// The devices name hosts: mpirun starts one rank per device, in order, on its host (as `hetra
// launch -H` does: this process serves the store, the job's variables travel by name), each rank
// running this same command. The binary, the config and the data must be at the same paths on
// every host, as mpirun expects of any program.
int runOnHosts(const train::RunConfig& config, const std::vector<std::string>& argv) {
  LaunchOptions launch;
  for (const auto& device : config.devices) {
    if (!launch.hosts.empty() && launch.hosts.back().host == device.host)
      ++launch.hosts.back().slots;
    else
      launch.hosts.push_back({device.host, 1});
  }
  launch.np = int(config.devices.size());
  launch.mpirun = config.launch.mpirun;
  launch.mpiArgs = config.launch.mpiArgs;
  launch.program = {std::filesystem::read_symlink("/proc/self/exe").string()};
  launch.program.insert(launch.program.end(), argv.begin() + 1, argv.end());
  return runLaunch(launch);
}

// [topology] with its file's islands and link costs turned into explicit keys (the config's own
// keys win); ConfigError when the file cannot be read or does not describe this run's devices.
train::TopologyConfig resolveTopology(const train::RunConfig& config) {
  train::TopologyConfig topology = config.topology;
  if (topology.file.empty()) return topology;
  const comm::Topology measured = comm::readTopology(topology.file);
  if (measured.ranks.size() != config.devices.size())
    throw ConfigError(str("topology.file = \"", topology.file, "\" describes ",
                          measured.ranks.size(), " ranks, the config has ", config.devices.size(),
                          " devices; probe with one rank per device (hetra probe --links)"));
  if (topology.islands.empty())
    for (int island : comm::islandsOf(measured)) topology.islands.push_back(island);
  const comm::LinkCosts costs = comm::linkCostsOf(measured);
  if (topology.islandLink.empty()) topology.islandLink = costs.island;
  if (topology.crossLink.empty()) topology.crossLink = costs.cross;
  topology.file.clear();
  return topology;
}

void runRank(const RunOptions& options, const train::RunConfig& config, const RankContext& context,
             bool appendMetrics) {
  const Millis timeout(int64_t(config.comm.timeoutS * 1000));
  std::shared_ptr<void> server;
  auto store = connectJobStore(context, timeout, &server);
  comm::GroupOptions group = rankGroupOptions(context, config.comm.transport, timeout);
  // [topology] (already resolved: no file left): islands, algorithm, the cost model's links.
  const train::TopologyConfig& topology = config.topology;
  group.islands.assign(topology.islands.begin(), topology.islands.end());
  group.algorithm = topology.algorithm == "auto" ? "" : topology.algorithm;  // "": HETRA_ALGO
  group.islandLink = topology.islandLink;
  group.crossLink = topology.crossLink;
  const std::string& kind = config.devices[size_t(context.rank)].kind;
  group.vendor = kind == "cuda" ? "nvidia" : kind == "rocm" ? "amd" : "cpu";
  // Before the communicator, so that its operations end before the timeline goes.
  RunTimeline timeline(timelinePath(options.timelinePath), context.rank,
                       config.devices[size_t(context.rank)].name);
  auto comm = comm::Communicator::create(store, context.rank, context.worldSize, group);
  train::TrainerOptions trainer;
  trainer.metricsPath = options.metricsPath;
  trainer.resumeDir = options.resumeDir;
  trainer.appendMetrics = appendMetrics;
  trainer.progressBar = context.rank == 0 && isatty(STDOUT_FILENO);
  train::train(config, comm, trainer);
  comm->barrier()->wait();
  timeline.finish(*store, context.worldSize, timeout);
}

// ---- Elastic restarts
//
// Vocabulary (attempt, device: see launch/elastic.h, the restart policy):
//   own checkpoint  a usable step-N directory under train.checkpoint_dir whose MANIFEST was
//                   written after this `hetra run` started: a restart never continues another
//                   run's leftovers in the same directory.
// The optimisation does not depend on the number of devices: the global batch, the seed and the
// sample order are global (GlobalSampler), and the gradient is the mean over the global batch for
// any split. So a restart on fewer devices from step N's checkpoint continues the same run, up to
// rounding; the balancer re-profiles the survivors (trainer.cc, resume).

// Runs the ranks of one attempt (launch/elastic.h), each told its attempt through its environment.
launch::LocalJobEnd runAttempt(const train::RunConfig& config,
                               const launch::ElasticAttempt& attempt,
                               const std::vector<std::string>& argv) {
  const std::vector<size_t>& devices = attempt.devices;
  // Emulated devices are packed onto cores by duty cycle, so a slowed device's sleeps leave room
  // for another and the fast device keeps a core to itself; the PyTorch peer (bench/) does the
  // same.
  std::vector<double> duty;
  std::vector<int> threads;
  for (size_t d : devices) {
    const auto& device = config.devices[d];
    double fastest = device.slowdown;
    for (const auto& change : device.slowdownSchedule) fastest = std::min(fastest, change.factor);
    duty.push_back(1.0 / fastest);
    threads.push_back(int(device.threads));
  }
  // The job's watch forwards each rank's stderr, keeps its last lines and kills a rank that stops
  // beating, so that its peers fail at once (PeerAbortedError naming it) instead of at their
  // deadlines.
  launch::LocalJob job;
  job.np = int(devices.size());
  job.argv = argv;
  job.program = "/proc/self/exe";
  job.cpuSets = launch::packByDuty(duty, threads);
  job.environment = attempt.environment();
  return launch::runLocalJob(job);
}

// The last step rank 0 recorded in the metrics file (records are flushed about once a second, so
// the step the rank died at may be a little later), or -1.
int64_t lastRecordedStep(const std::string& path) {
  if (path.empty()) return -1;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return -1;
  // The tail is enough: a step record is well under 64 KiB.
  const std::streamoff size = in.tellg();
  in.seekg(std::max<std::streamoff>(0, size - 65536));
  std::string line;
  if (size > 65536) std::getline(in, line);  // a partial line
  int64_t step = -1;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.value("event", "") == "step" && record.contains("step"))
      step = record["step"].get<int64_t>();
  }
  return step;
}

std::string namesOf(const train::RunConfig& config, const std::vector<size_t>& devices) {
  std::string text;
  for (size_t i = 0; i < devices.size(); ++i)
    text += (i ? ", " : "") + config.devices[devices[i]].name;
  return text;
}

// Runs the job and, with [elastic] max_restarts > 0, restarts it after a rank fails: the failed
// rank's device is left out, the others resume from the newest own checkpoint.
int superviseElastic(const RunOptions& options, const train::RunConfig& config,
                     const std::vector<std::string>& argv) {
  namespace fs = std::filesystem;
  const auto& elastic = config.elastic;
  // MANIFEST times come from the file system's clock: a little slack for its coarse ticks.
  const auto started = fs::file_time_type::clock::now() - std::chrono::seconds(1);
  launch::ElasticAttempt attempt = launch::firstAttempt(config.devices.size());
  const launch::ElasticPolicy policy{elastic.maxRestarts, elastic.minDevices};
  for (;;) {
    const int64_t restart = attempt.restart;
    const auto attemptStart = Clock::now();
    const launch::LocalJobEnd end = runAttempt(config, attempt, argv);
    if (end.code == 0) return 0;
    const double attemptSeconds = secondsSince(attemptStart);
    const auto& failure = end.failure;

    // Whether to restart, and if not, why not (said only when elastic restarts are on).
    const std::string noRestart = launch::whyNoRestart(policy, attempt, {end.code, failure.rank});
    if (!noRestart.empty()) {
      reportFailure(failure, end.code);
      if (elastic.maxRestarts > 0) std::fprintf(stderr, "hetra run: %s\n", noRestart.c_str());
      return end.code;
    }

    const size_t failed = attempt.devices[size_t(failure.rank)];
    const std::string failedName = config.devices[failed].name;
    reportFailure(failure, end.code, /*head=*/"");
    const int64_t lastStep = lastRecordedStep(options.metricsPath);
    const std::string own = train::newestCheckpointSince(config.train.checkpointDir, started);
    // Before this run's first checkpoint, a restart begins where the first attempt did.
    attempt = launch::nextAttempt(attempt, failure.rank, own.empty() ? options.resumeDir : own);
    const std::vector<size_t>& devices = attempt.devices;
    const std::string& resume = attempt.resume;
    int64_t resumeStep = 0;
    if (!resume.empty()) resumeStep = train::savedStep(train::findCheckpoint(resume));
    const std::string from = resume.empty() ? std::string("from the start (no checkpoint yet)")
                                            : str("from checkpoint ", resume);
    std::fprintf(stderr,
                 "hetra run: rank %d (device %s) %s%s; restarting with %zu device%s (%s) %s "
                 "(restart %lld of %lld)\n",
                 failure.rank, failedName.c_str(), end.code > 128 ? "died" : "failed",
                 lastStep >= 0 ? str(" at step ~", lastStep).c_str() : "", devices.size(),
                 devices.size() == 1 ? "" : "s", namesOf(config, devices).c_str(), from.c_str(),
                 (long long)(restart + 1), (long long)elastic.maxRestarts);
    if (!options.metricsPath.empty()) {
      std::vector<std::string> names;
      for (size_t d : devices) names.push_back(config.devices[d].name);
      const nlohmann::json record = {
          {"restart", restart + 1},      {"max_restarts", elastic.maxRestarts},
          {"failed_rank", failure.rank}, {"failed_device", failedName},
          {"how", failure.how},          {"exit_status", end.code},
          {"last_step", lastStep},       {"resume_step", resumeStep},
          {"checkpoint", resume},        {"devices", names},
          {"attempt_s", attemptSeconds}};
      if (!train::appendMetricsRecord(options.metricsPath, "restart", record))
        HETRA_WARN("cli", "cannot append the restart record to ", options.metricsPath);
    }
  }
}

}  // namespace

}  // namespace hetra::cli
