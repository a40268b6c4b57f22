// hetra: one binary, one subcommand per job (run, launch, k8s, bench, probe, params).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_command.h"
#include "common/errors.h"
#include "common/params.h"
#include "device/probe.h"
#include "k8s_command.h"
#include "launch.h"
#include "launch/heartbeat.h"
#include "launch_command.h"
#include "probe_links.h"
#include "report_command.h"
#ifdef HETRA_WITH_TORCH
#include "run_command.h"
#endif
#ifdef HETRA_WITH_CUDA
#include "cuda/nccl_transport.h"
#endif

namespace {

using namespace hetra;

void addBenchCommand(CLI::App& app, cli::BenchOptions& o, int& np, bool& noCheck,
                     std::string& minSize, std::string& maxSize, std::string& dtype,
                     std::string& op) {
  auto* bench = app.add_subcommand("bench", "Collective benchmark in the style of nccl-tests");
  bench->add_option("collective", o.collective, "allreduce | reducescatter | allgather | broadcast")
      ->required()
      ->check(CLI::IsMember({"allreduce", "reducescatter", "allgather", "broadcast"}));
  bench->add_option("--np", np, "Start this many local ranks (unless HETRA_RANK is set)")
      ->check(CLI::Range(1, 1024));
  bench->add_option("-b,--minbytes", minSize, "Smallest size (bytes; K, M, G suffixes)");
  bench->add_option("-e,--maxbytes", maxSize, "Largest size");
  bench->add_option("-f,--stepfactor", o.factor, "Multiply the size by this factor each step")
      ->check(CLI::PositiveNumber);
  bench->add_option("-w,--warmup_iters", o.warmup, "Warm-up iterations per size")
      ->check(CLI::NonNegativeNumber);
  bench->add_option("-n,--iters", o.iters, "Timed iterations per size")
      ->check(CLI::Range(1, 1000000));
  bench->add_option("-c,--check", o.check,
                    "Check the result of the first iteration (1) or not (0)");
  bench->add_flag("--no-check", noCheck, "Same as -c 0");
  bench->add_option("--dtype,-d", dtype, "float32 float64 float16 bfloat16 int32 int64 uint8");
  bench->add_option("--op,-o", op, "sum avg min max");
  bench
      ->add_option("--compression", o.compression,
                   "Bytes on the wire: none | fp16 | bf16 | fp8-e4m3 | fp8-e5m2 (float32 sum/avg)")
      ->capture_default_str();
  bench->add_option("--algo", o.algo,
                    "Force providers as HETRA_ALGO does: auto, a provider's name (ring, shared, "
                    "compressed, hierarchical, ...) or OPERATION:PROVIDER,...");
  bench->add_option("--transport", o.transport, "shm | tcp | mpi (under mpirun) | auto")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "mpi"}));
  bench->add_option("--json", o.jsonPath, "Write the rows as JSON to this file");
  bench->add_option("--timeout-ms", o.timeoutMs, "Deadline of each operation")
      ->check(CLI::Range(100, 3600000));
}

int runProbe(bool json) {
  const auto info = device::probeHost();
  std::cout << (json ? device::hostInfoJson(info) : device::formatHostInfo(info)) << std::endl;
  return 0;
}

int runParams() {
  for (const auto& p : allParams())
    std::printf("%-24s default '%s'\n    %s\n", p.env.c_str(), p.defaultValue.c_str(),
                p.description.c_str());
  return 0;
}

// The command line's command; `error` gets the message of the error that ended it, and
// `reportsPeer` whether that error was another rank's failure (PeerAbortedError).
int runCommand(int argc, char** argv, std::string& error, bool& reportsPeer) {
  CLI::App app{"hetra: training across heterogeneous devices"};
  app.require_subcommand(1);
  cli::BenchOptions bench;
  int np = 0;
  bool noCheck = false;
  std::string minSize = "8", maxSize = "64M", dtype = "float32", op = "sum";
  addBenchCommand(app, bench, np, noCheck, minSize, maxSize, dtype, op);
  bool probeJson = false;
  auto* probe = app.add_subcommand(
      "probe", "Show this host's CPU, memory and GPUs; with --links, the links between ranks");
  probe->add_flag("--json", probeJson, "Print JSON");
  cli::ProbeLinksOptions probeLinks;
  cli::addProbeLinksOptions(*probe, probeLinks);
  auto* params = app.add_subcommand("params", "List every HETRA_* parameter with its default");
  auto* launch = cli::addLaunchCommand(app);
  cli::ReportCommandOptions report;
  auto* reportCommand = cli::addReportCommand(app, report);
  cli::K8sOptions k8sOptions;
  auto* k8s = cli::addK8sCommand(app, k8sOptions);
#ifdef HETRA_WITH_TORCH
  cli::RunOptions run;
  auto* runCommand =
      app.add_subcommand("run", "Train on the devices a TOML config lists (one rank each)");
  runCommand->add_option("config", run.configPath, "The run's TOML file (see examples/)")
      ->required();
  runCommand->add_option("--set", run.sets, "Override a key: --set train.lr=0.05 (repeatable)");
  runCommand->add_option("--metrics", run.metricsPath, "Write JSON Lines metrics here (rank 0)");
  runCommand->add_option("--resume", run.resumeDir,
                         "Continue from the checkpoint in this directory");
  runCommand->add_flag("--print-config", run.printConfig, "Print the effective config and exit");
  runCommand->add_option("--timeline", run.timelinePath,
                         "Write a Chrome trace of the run here (HETRA_TIMELINE)");
  runCommand->add_flag("--rank-from-env", run.rankFromEnv,
                       "Run only the rank the environment names (a pod, an srun step); fail "
                       "when none is named");
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (probe->parsed() && probeLinks.links) {
      probeLinks.json = probeJson;
      return cli::runProbeLinks(probeLinks, std::vector<std::string>(argv, argv + argc));
    }
    if (probe->parsed()) return runProbe(probeJson);
    if (params->parsed()) return runParams();
    if (launch->parsed()) return cli::runLaunchCommand(*launch);
    if (reportCommand->parsed()) return cli::runReport(report);
    if (k8s->parsed()) return cli::runK8sCommand(k8sOptions);
#ifdef HETRA_WITH_TORCH
    if (runCommand->parsed())
      return cli::runTraining(run, std::vector<std::string>(argv, argv + argc));
#endif
    bench.minBytes = cli::parseSize(minSize);
    bench.maxBytes = cli::parseSize(maxSize);
    bench.dtype = parseDType(dtype);
    bench.op = comm::parseReduceOp(op);
    if (noCheck) bench.check = false;
    if (bench.minBytes > bench.maxBytes)
      throw ConfigError(str("-b ", minSize, " is larger than -e ", maxSize));
    // --np means "start the ranks here", even inside another launcher's job (an salloc shell).
    const auto context = cli::rankFromEnvironment();
    if (context && (context->launcher == "hetra" || np == 0)) return cli::runBenchRank(bench);
    return cli::spawnLocalRanks(np > 0 ? np : 1, std::vector<std::string>(argv, argv + argc),
                                cli::onePerCore(np > 0 ? np : 1));
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "hetra: %s\n", e.what());
    error = e.what();
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hetra: error: %s\n", e.what());
    error = e.what();
    reportsPeer = dynamic_cast<const PeerAbortedError*>(&e) != nullptr;  // seen from here
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // As a local rank of hetra launch or hetra run, whatever the command: the heartbeat starts
  // before anything else (no thread runs yet), so a stopped rank is found by its launcher, which
  // also learns how the rank ended.
  std::unique_ptr<launch::RankChannel> channel;
  try {
    channel = launch::RankChannel::fromEnvironment();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hetra: %s\n", e.what());
    return 2;
  }
#ifdef HETRA_WITH_CUDA
  // hetra_comm does not link hetra_cuda: the program adds its transport ("nccl") to the table,
  // before any command forms a group.
  cuda::registerTransports();
#endif
  std::string error;
  bool reportsPeer = false;
  const int code = runCommand(argc, argv, error, reportsPeer);
  if (channel) channel->bye(code, error, reportsPeer);
  return code;
}
