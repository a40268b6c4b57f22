#include "launch_command.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>

#include "common/errors.h"
#include "common/params.h"
#include "launch/local_job.h"
#include "launch/rank_environment.h"
#include "launch/scheduler_environment.h"
#include "launch/supervision.h"
#include "store/tcp_store.h"

namespace hetra::cli {
namespace {

using launch::ChildProcess;
using launch::jobEnvironment;
using launch::LauncherSignals;
using launch::SuperviseOptions;

// Declared by common/auth: the variable the job's secret reaches the ranks in.
constexpr const char* kSecretVariable = "HETRA_JOB_SECRET";
// Declared where it is set; read by hetra.torch (python/hetra/torch/optimizer.py).
const Param kSlowdowns("HETRA_SLOWDOWNS", "",
                       "Set by hetra launch --slowdowns for its ranks: one emulated slowdown "
                       "factor >= 1 per rank (\"1,2,4\"), which hetra.torch applies.");
// torchrun's default port for torch's own store, when the launcher's environment names none.
constexpr const char* kDefaultTorchPort = "29500";

// mpirun gives every rank the same -x variables, so a rank's torchrun variables come from Open
// MPI's own, set by a shell in front of the program: an unchanged torchrun script then runs on
// the hosts as it does under torchrun (and hetra ranks read the same numbers either way).
constexpr const char* kTorchrunVariablesFromOpenMpi =
    "export RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE "
    "LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE; "
    "exec \"$@\"";

const char* kUsage =
    "Usage: hetra launch -np N [options] [--] PROGRAM ARGS...\n"
    "  -np, -n, --np N        number of ranks (default with hosts: their slots)\n"
    "  -H, --host LIST        hosts as host:slots,... (runs mpirun); none: local processes\n"
    "  --hostfile FILE        hosts as Open MPI's hostfile: 'host slots=N' per line\n"
    "  --dry-run              print the mpirun command instead of running it\n"
    "  --mpirun PATH          the mpirun to run (default: mpirun in PATH)\n"
    "  --mpi-arg ARG          pass ARG to mpirun (repeatable), e.g. --mpi-arg=--allow-run-as-root\n"
    "  --map-by X, --bind-to X, --oversubscribe   as mpirun's (default: slot, none)\n"
    "  --store-addr ADDR      the address ranks reach this launcher's store at\n"
    "                         (default: this host's address on the route to the first host)\n"
    "  --grace SECONDS        after a rank fails, the others get this long (default 5)\n"
    "  --slowdowns LIST       emulated slow devices, one factor >= 1 per rank (1,2,4): the ranks'\n"
    "                         HETRA_SLOWDOWNS, applied by hetra.torch; local ranks are bound to\n"
    "                         cores by duty cycle as hetra run binds them (HETRA_PIN=0: not)\n";

int parsePositive(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != 0 || value < 1 || value > 1 << 20)
    throw ConfigError(str(option, " ", text, ": expected a whole number from 1 to 1048576"));
  return int(value);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(str("--hostfile ", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string shellQuote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-+=/:.,@%") == std::string::npos)
    return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// "1,2,4": one factor >= 1 per rank; ConfigError naming the list otherwise.
std::vector<double> parseSlowdowns(const std::string& list, int np) {
  std::vector<double> factors;
  std::istringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    char* end = nullptr;
    const double factor = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != 0 || !(factor >= 1 && factor <= 1e6))
      throw ConfigError(str("--slowdowns ", list, ": '", item, "' is not a factor from 1 to 1e6"));
    factors.push_back(factor);
  }
  if (int(factors.size()) != np)
    throw ConfigError(str("--slowdowns ", list, ": ", factors.size(), " factors for -np ", np,
                          "; give one per rank"));
  return factors;
}

// The threads each rank computes with: OMP_NUM_THREADS as the ranks inherit it, else 1 (the
// emulation's rule, docs/benchmarks.md: a slowed rank's work is its computing thread's CPU time).
int rankThreads() {
  const char* text = std::getenv("OMP_NUM_THREADS");
  char* end = nullptr;
  const long threads = text ? std::strtol(text, &end, 10) : 0;
  return text && end != text && *end == 0 && threads >= 1 && threads <= 1024 ? int(threads) : 1;
}

int totalSlots(const std::vector<HostSlots>& hosts) {
  int total = 0;
  for (const auto& h : hosts) total += h.slots;
  return total;
}

}  // namespace

std::vector<HostSlots> parseHostList(const std::string& list) {
  std::vector<HostSlots> hosts;
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t end = list.find(',', begin);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) throw ConfigError(str("host list '", list, "' has an empty entry"));
    HostSlots h;
    const size_t colon = item.rfind(':');
    h.host = item.substr(0, colon);
    if (colon != std::string::npos)
      h.slots = parsePositive("slots of " + h.host, item.substr(colon + 1));
    if (h.host.empty()) throw ConfigError(str("host list '", list, "': '", item, "' has no host"));
    hosts.push_back(h);
  }
  return hosts;
}

std::vector<HostSlots> parseHostfile(const std::string& text, const std::string& source) {
  std::vector<HostSlots> hosts;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    HostSlots h;
    if (!(words >> h.host)) continue;
    std::string word;
    while (words >> word) {
      const size_t eq = word.find('=');
      const std::string key = word.substr(0, eq);
      if (eq == std::string::npos || (key != "slots" && key != "max_slots" && key != "max-slots"))
        throw ConfigError(str(source, ":", number, ": '", word,
                              "' is not slots=N or max_slots=N (Open MPI's hostfile format)"));
      const int value = parsePositive(str(source, ":", number, ": ", key), word.substr(eq + 1));
      if (key == "slots") h.slots = value;
    }
    hosts.push_back(h);
  }
  if (hosts.empty()) throw ConfigError(str(source, " names no host"));
  return hosts;
}

LaunchOptions parseLaunchArguments(const std::vector<std::string>& args) {
  LaunchOptions o;
  bool hostList = false, hostfile = false;
  size_t i = 0;
  auto value = [&](const std::string& option, const std::string& inlineValue,
                   bool hasInline) -> std::string {
    if (hasInline) return inlineValue;
    if (i + 1 >= args.size()) throw ConfigError(str(option, " needs a value\n", kUsage));
    return args[++i];
  };
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;
    const size_t eq = arg.find('=');
    const bool hasInline = arg.rfind("--", 0) == 0 && eq != std::string::npos;
    const std::string option = hasInline ? arg.substr(0, eq) : arg;
    const std::string inlineValue = hasInline ? arg.substr(eq + 1) : std::string();
    if (option == "-np" || option == "-n" || option == "--np") {
      o.np = parsePositive(option, value(option, inlineValue, hasInline));
    } else if (option == "-H" || option == "--host") {
      o.hosts = parseHostList(value(option, inlineValue, hasInline));
      hostList = true;
    } else if (option == "--hostfile") {
      const std::string path = value(option, inlineValue, hasInline);
      o.hosts = parseHostfile(readFile(path), path);
      hostfile = true;
    } else if (option == "--dry-run") {
      o.dryRun = true;
    } else if (option == "--oversubscribe") {
      o.oversubscribe = true;
    } else if (option == "--mpirun") {
      o.mpirun = value(option, inlineValue, hasInline);
    } else if (option == "--mpi-arg") {
      o.mpiArgs.push_back(value(option, inlineValue, hasInline));
    } else if (option == "--map-by") {
      o.mapBy = value(option, inlineValue, hasInline);
    } else if (option == "--bind-to") {
      o.bindTo = value(option, inlineValue, hasInline);
    } else if (option == "--store-addr") {
      o.storeAddr = value(option, inlineValue, hasInline);
    } else if (option == "--slowdowns") {
      o.slowdowns = value(option, inlineValue, hasInline);
    } else if (option == "--grace") {
      const std::string text = value(option, inlineValue, hasInline);
      char* end = nullptr;
      o.graceS = std::strtod(text.c_str(), &end);
      if (end == text.c_str() || *end != 0 || !(o.graceS >= 0 && o.graceS <= 3600))
        throw ConfigError(str("--grace ", text, ": expected seconds from 0 to 3600"));
    } else {
      throw ConfigError(str("launch: unknown option '", arg, "'\n", kUsage));
    }
  }
  o.program.assign(args.begin() + std::ptrdiff_t(std::min(i, args.size())), args.end());
  if (hostList && hostfile) throw ConfigError("launch: give -H or --hostfile, not both");
  // In a Kubeflow MPIJob's launcher pod, the operator's hostfile (as mpirun itself would take it).
  if (!hostList && !hostfile) {
    if (auto path = launch::operatorHostfile()) o.hosts = parseHostfile(readFile(*path), *path);
  }
  if (o.program.empty()) throw ConfigError(str("launch: no program to run\n", kUsage));
  if (o.hosts.empty() && o.np == 0)
    throw ConfigError(str("launch: -np N is required without hosts\n", kUsage));
  if (!o.hosts.empty()) {
    const int slots = totalSlots(o.hosts);
    if (o.np == 0) o.np = slots;
    if (o.np > slots && !o.oversubscribe)
      throw ConfigError(str("launch: -np ", o.np, " is more than the ", slots,
                            " slots of the hosts; add --oversubscribe to allow it"));
  }
  if (!o.slowdowns.empty()) parseSlowdowns(o.slowdowns, o.np);
  return o;
}

std::vector<std::string> mpirunCommand(const LaunchOptions& o,
                                       const std::map<std::string, std::string>& environment) {
  std::vector<std::string> argv = {o.mpirun, "-np", std::to_string(o.np)};
  std::string hosts;
  for (const auto& h : o.hosts) hosts += str(hosts.empty() ? "" : ",", h.host, ":", h.slots);
  argv.insert(argv.end(), {"-H", hosts, "--map-by", o.mapBy, "--bind-to", o.bindTo});
  if (o.oversubscribe) argv.push_back("--oversubscribe");
  for (const auto& [name, value] : environment) argv.insert(argv.end(), {"-x", name});
  // The job's secret travels in mpirun's environment (runLaunch puts it there), by name only.
  if (!environment.count(kSecretVariable)) argv.insert(argv.end(), {"-x", kSecretVariable});
  argv.insert(argv.end(), o.mpiArgs.begin(), o.mpiArgs.end());
  argv.insert(argv.end(), {"sh", "-c", kTorchrunVariablesFromOpenMpi, "hetra-rank"});
  argv.insert(argv.end(), o.program.begin(), o.program.end());
  return argv;
}

std::string shellCommand(const std::map<std::string, std::string>& environment,
                         const std::vector<std::string>& argv) {
  std::string line;
  for (const auto& [name, value] : environment) line += name + "=" + shellQuote(value) + " ";
  for (size_t i = 0; i < argv.size(); ++i) line += (i ? " " : "") + shellQuote(argv[i]);
  return line;
}

namespace {

// The variables every rank gets through mpirun: the job's, the options meant for the ranks, and
// torch's store on rank 0's host (the first host under --map-by slot or node) at MASTER_PORT as
// this launcher's environment names it, else torchrun's default.
std::map<std::string, std::string> mpirunEnvironment(const LaunchOptions& o,
                                                     const std::string& storeAddress,
                                                     const std::string& jobId) {
  auto environment = jobEnvironment(storeAddress, jobId);
  if (!o.slowdowns.empty()) environment[kSlowdowns.env()] = o.slowdowns;
  environment["MASTER_ADDR"] = o.hosts[0].host;
  const char* torchPort = std::getenv("MASTER_PORT");
  environment["MASTER_PORT"] = torchPort && *torchPort ? torchPort : kDefaultTorchPort;
  return environment;
}

}  // namespace

int runLaunch(const LaunchOptions& o) {
  if (o.hosts.empty()) {
    launch::LocalJob job;
    job.np = o.np;
    job.argv = o.program;
    job.failureGrace = Millis(int64_t(o.graceS * 1000));
    job.name = "hetra launch";
    // Any program: its failure message shows the rank's last lines. A rank linked with hetra
    // beats as well, so a stopped one is found within HETRA_HANG_TIMEOUT_S.
    job.captureStderr = true;
    if (!o.slowdowns.empty()) {
      job.environment[kSlowdowns.env()] = o.slowdowns;
      // Emulated devices are packed onto cores by duty cycle as hetra run packs them (a slowed
      // rank's sleeps leave room for another; the fast one keeps a core to itself), so that a
      // script under hetra launch and a config under hetra run see the same machine. Nothing is
      // pinned where the duty cycles do not fit the cores, or with HETRA_PIN=0.
      std::vector<double> duty;
      for (double factor : parseSlowdowns(o.slowdowns, o.np)) duty.push_back(1.0 / factor);
      job.cpuSets = launch::packByDuty(duty, std::vector<int>(duty.size(), rankThreads()));
    }
    return launch::runLocalJob(job).code;
  }
  const std::string address =
      o.storeAddr.empty() ? launch::routeAddressTo(o.hosts[0].host) : o.storeAddr;
  if (o.dryRun) {
    const auto environment = mpirunEnvironment(o, address + ":<port>", "<job id>");
    std::printf("%s\n", shellCommand(environment, mpirunCommand(o, environment)).c_str());
    return 0;
  }
  const LauncherSignals signals;  // before the store server's thread starts
  const launch::LauncherSecret secret = launch::launcherSecret();
  auth::AuthOptions auth;
  auth.secret = secret.secret;
  // Every interface: the ranks reach it at `address`, which may be on any of them.
  store::TcpStoreServer server("0.0.0.0", 0, auth);
  const auto environment =
      mpirunEnvironment(o, str(address, ":", server.port()), launch::randomJobId());
  ChildProcess mpirun;
  mpirun.label = "mpirun";
  mpirun.argv = mpirunCommand(o, environment);
  mpirun.path = launch::resolveProgram(o.mpirun);
  mpirun.environment = environment;
  mpirun.environment.insert(secret.environment.begin(), secret.environment.end());
  mpirun.unsetEnvironment = secret.unsetEnvironment;
  mpirun.stdinNull = false;      // mpirun forwards it to rank 0
  mpirun.deathSignal = SIGTERM;  // lets mpirun stop the remote ranks
  SuperviseOptions options;
  options.captureStderr = true;  // mpirun's stderr carries the ranks' (forwarded by mpirun)
  options.name = "hetra launch";
  options.failureGrace = Millis(int64_t(o.graceS * 1000));
  options.stopGrace = Millis(30000);  // mpirun stops its daemons on other hosts
  return launch::superviseChildren({mpirun}, options, signals);
}

CLI::App* addLaunchCommand(CLI::App& app) {
  auto* launch =
      app.add_subcommand("launch", "Start a program's ranks: locally, or on hosts through mpirun");
  launch->prefix_command();  // every argument is kept for parseLaunchArguments
  launch->footer(kUsage);
  return launch;
}

int runLaunchCommand(const CLI::App& launch) {
  return runLaunch(parseLaunchArguments(launch.remaining()));
}

}  // namespace hetra::cli
