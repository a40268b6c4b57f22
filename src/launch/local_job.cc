#include "launch/local_job.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "common/errors.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/params.h"
#include "launch/rank_environment.h"
#include "launch/supervision.h"
#include "store/tcp_store.h"

namespace hetra::launch {
namespace {

const Param kPin("HETRA_PIN", "1",
                 "Bind local ranks to one CPU each when there are enough CPUs (0: never).");
const Param kHangTimeout("HETRA_HANG_TIMEOUT_S", "5",
                         "hetra launch, hetra run: a local rank linked with hetra without a "
                         "heartbeat for this many seconds (stopped, frozen) is hung; it is killed "
                         "so that its peers fail at once.");

// The variables a secret travels in (declared by common/auth).
constexpr const char* kSecretVariable = "HETRA_JOB_SECRET";
constexpr const char* kSecretFileVariable = "HETRA_JOB_SECRET_FILE";

std::string hexOf(const std::vector<uint8_t>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string text;
  for (uint8_t byte : bytes) {
    text += digits[byte >> 4];
    text += digits[byte & 15];
  }
  return text;
}

RankWatch::Options watchOptions(const LocalJob& job) {
  RankWatch::Options options;
  const double seconds = kHangTimeout.number();
  if (!(seconds > 0)) throw ConfigError(str(kHangTimeout.env(), "=", seconds, " must be positive"));
  options.hangTimeout = Millis(int64_t(seconds * 1000));
  options.captureStderr = !job.captureStderr;
  const std::string name = job.name;
  options.onHung = [name](int rank, int pid, const std::string& host, const std::string& how) {
    HETRA_ERROR("cli", name, ": rank ", rank, " (pid ", pid, ", host ", host, ") ", how);
  };
  return options;
}

// torchrun's variables for one local rank, so that a torch.distributed script (init_method
// env://) runs under hetra launch unchanged. MASTER_PORT is torch's own store, which the script's
// rank 0 serves: a port that was free when the launcher asked (hetra's store is HETRA_STORE's).
std::map<std::string, std::string> torchrunEnvironment(int rank, int np, int masterPort) {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(np)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(np)},
          {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(masterPort)}};
}

int freeLoopbackPort() {
  const net::Listener probe =
      net::listenOn("127.0.0.1", 0, false, "hetra launch: a port for MASTER_PORT");
  close(probe.fd);
  return probe.port;
}

}  // namespace

LauncherSecret launcherSecret() {
  LauncherSecret launcher;
  launcher.secret = auth::jobSecretFromEnvironment();
  if (launcher.secret.empty())
    launcher.secret = auth::JobSecret::fromHex(auth::generateJobSecret(), "a new secret");
  launcher.environment[kSecretVariable] = hexOf(launcher.secret.bytes());
  launcher.unsetEnvironment.push_back(kSecretFileVariable);
  return launcher;
}

std::string randomJobId() {
  std::random_device device;
  return str("job-", std::hex, device(), device());
}

std::vector<int> allowedCpus() {
  std::vector<int> cpus;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  return cpus;
}

std::vector<std::vector<int>> onePerCore(int np) {
  const auto cpus = allowedCpus();
  if (int(cpus.size()) < np) return {};
  std::vector<std::vector<int>> sets;
  for (int r = 0; r < np; ++r) sets.push_back({cpus[size_t(r)]});
  return sets;
}

std::vector<std::vector<int>> packByDuty(const std::vector<double>& duty,
                                         const std::vector<int>& threads) {
  const auto cpus = allowedCpus();
  std::vector<double> load(cpus.size(), 0.0);
  std::vector<size_t> order(duty.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return duty[a] * threads[a] > duty[b] * threads[b]; });
  std::vector<std::vector<int>> sets(duty.size());
  for (size_t r : order) {
    // A rank of t threads takes the t least loaded CPUs; each must still have room for its duty.
    std::vector<size_t> byLoad(cpus.size());
    for (size_t c = 0; c < byLoad.size(); ++c) byLoad[c] = c;
    std::stable_sort(byLoad.begin(), byLoad.end(),
                     [&](size_t a, size_t b) { return load[a] < load[b]; });
    if (size_t(threads[r]) > cpus.size()) return {};
    for (int t = 0; t < threads[r]; ++t) {
      const size_t c = byLoad[size_t(t)];
      load[c] += duty[r];
      if (load[c] > 1.0 + 1e-9) return {};
      sets[r].push_back(cpus[c]);
    }
  }
  return sets;
}

LocalJobEnd runLocalJob(const LocalJob& job) {
  HETRA_ENFORCE(job.np >= 1, "the number of ranks must be at least 1, got ", job.np);
  HETRA_ENFORCE(!job.argv.empty(), "no program to run");
  const bool pin = !job.cpuSets.empty() && kPin.flag();
  HETRA_ENFORCE(!pin || int(job.cpuSets.size()) == job.np, "one CPU set per rank");
  const std::string path = job.program.empty() ? resolveProgram(job.argv[0]) : job.program;
  const LauncherSignals signals;  // before the store server's and the watch's threads start
  const LauncherSecret secret = launcherSecret();
  auth::AuthOptions auth;
  auth.secret = secret.secret;
  store::TcpStoreServer server("127.0.0.1", 0, auth);
  const auto common = jobEnvironment(str("127.0.0.1:", server.port()), randomJobId());
  RankWatch watch(job.np, watchOptions(job));
  const int torchPort = freeLoopbackPort();
  // A terminal's stdin stays with the launcher: a rank in its own process group reading it would
  // be stopped (SIGTTIN). A pipe or file goes to rank 0, as mpirun does.
  const bool stdinToRank0 = !isatty(STDIN_FILENO);
  std::vector<ChildProcess> children;
  for (int rank = 0; rank < job.np; ++rank) {
    ChildProcess child;
    child.label = str("rank ", rank);
    child.path = path;
    child.argv = job.argv;
    // Later sources win: the caller's variables come last.
    for (const auto& variables :
         {common, rankEnvironment(rank, job.np, rank), torchrunEnvironment(rank, job.np, torchPort),
          watch.environment(rank), secret.environment, job.environment})
      for (const auto& [name, value] : variables) child.environment[name] = value;
    child.unsetEnvironment = secret.unsetEnvironment;
    child.closeFds = watch.closeInRank(rank);
    if (pin) child.cpus = job.cpuSets[size_t(rank)];
    child.stdinNull = !(rank == 0 && stdinToRank0);
    children.push_back(std::move(child));
  }
  SuperviseOptions options;
  options.name = job.name;
  options.failureGrace = job.failureGrace;
  options.stopGrace = job.stopGrace;
  options.captureStderr = job.captureStderr;
  options.onReaped = [&watch](size_t rank, int) { watch.rankReaped(int(rank)); };
  options.onKillingTheRest = [&watch] { watch.launcherKillsTheRest(); };
  LocalJobEnd end;
  end.code = superviseChildren(children, options, signals);
  watch.finish();
  if (end.code != 0) end.failure = watch.firstFailure();
  return end;
}

int spawnLocalRanks(int np, const std::vector<std::string>& argv,
                    const std::vector<std::vector<int>>& cpuSets, Millis failureGrace) {
  HETRA_ENFORCE(np >= 1, "--np must be at least 1, got ", np);
  LocalJob job;
  job.np = np;
  job.argv = argv;
  job.program = "/proc/self/exe";
  job.cpuSets = cpuSets;
  job.failureGrace = failureGrace;
  return runLocalJob(job).code;
}

}  // namespace hetra::launch
