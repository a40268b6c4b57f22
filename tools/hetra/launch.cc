#include "launch.h"

#include "launch_command.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>

#include "common/auth.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/params.h"
#include "store/tcp_store.h"

extern char** environ;

namespace hetra::cli {
namespace {

const Param kRank("HETRA_RANK", "", "This process's rank in the job (set by the launcher).");
const Param kWorldSize("HETRA_WORLD_SIZE", "", "Number of ranks in the job (set by the launcher).");
const Param kLocalRank("HETRA_LOCAL_RANK", "0", "This process's rank among the ranks of its host.");
const Param kStore("HETRA_STORE", "", "host:port of the job's TCP store; rank 0 serves it.");
const Param kMasterAddr("HETRA_MASTER_ADDR", "",
                        "Rank 0's host when HETRA_STORE is not set (else MASTER_ADDR is used).");
const Param kMasterPort("HETRA_MASTER_PORT", "",
                        "Store port with HETRA_MASTER_ADDR (else MASTER_PORT, else 29431).");
const Param kStoreExternal("HETRA_STORE_EXTERNAL", "0",
                           "1 when the launcher serves the store (rank 0 then only connects).");
const Param kPin("HETRA_PIN", "1",
                 "Bind local ranks to one CPU each when there are enough CPUs (0: never).");
const Param kJobId("HETRA_JOB_ID", "job", "Prefix of this job's keys in the store.");

constexpr int kDefaultMasterPort = 29431;

// The variables of each launcher that describe a rank, in order of precedence.
struct Flavour {
  const char* launcher;
  const char* rank;
  const char* size;
  std::vector<const char*> localRank;  // the first one set counts
};

const std::vector<Flavour>& flavours() {
  static const std::vector<Flavour> all = {
      {"hetra", "HETRA_RANK", "HETRA_WORLD_SIZE", {"HETRA_LOCAL_RANK"}},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", {"OMPI_COMM_WORLD_LOCAL_RANK"}},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", {"SLURM_LOCALID"}},
      {"pmi", "PMI_RANK", "PMI_SIZE", {"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}},
  };
  return all;
}

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == 0) return std::nullopt;
  return std::string(value);
}

int parseRankNumber(const char* name, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != 0)
    throw ConfigError(str(name, "='", text, "' is not an integer"));
  if (value < 0 || value > 1 << 20)
    throw ConfigError(str(name, "=", value, " is out of range; allowed: 0 to 1048576"));
  return int(value);
}

std::string storeFromEnvironment(const RankContext& context, const Flavour& flavour) {
  if (auto store = variable(kStore.env().c_str())) return *store;
  auto host = variable(kMasterAddr.env().c_str());
  if (!host) host = variable("MASTER_ADDR");
  if (host) {
    int port = kDefaultMasterPort;
    for (const char* name : {kMasterPort.env().c_str(), "MASTER_PORT"}) {
      if (auto text = variable(name)) {
        port = parseRankNumber(name, *text);
        if (port < 1 || port > 65535) throw ConfigError(str(name, "=", port, " is not a TCP port"));
        break;
      }
    }
    return str(*host, ":", port);
  }
  if (context.worldSize > 1)
    throw ConfigError(str(flavour.rank,
                          " is set but HETRA_STORE (host:port of the job's store) is ",
                          "not; set it, or HETRA_MASTER_ADDR (or MASTER_ADDR) to rank 0's host"));
  return "";
}

}  // namespace

std::optional<RankContext> rankFromEnvironment() {
  const Flavour* found = nullptr;
  for (const auto& flavour : flavours()) {
    if (variable(flavour.rank)) {
      found = &flavour;
      break;
    }
  }
  if (found == nullptr) {
    // A world size alone is a half-written hetra environment, not "no launcher".
    if (variable(kWorldSize.env().c_str()))
      throw ConfigError("HETRA_WORLD_SIZE is set but HETRA_RANK is not");
    return std::nullopt;
  }
  const Flavour& flavour = *found;
  RankContext context;
  context.launcher = flavour.launcher;
  context.rank = parseRankNumber(flavour.rank, *variable(flavour.rank));
  const auto size = variable(flavour.size);
  if (!size) throw ConfigError(str(flavour.rank, " is set but ", flavour.size, " is not"));
  context.worldSize = parseRankNumber(flavour.size, *size);
  if (context.worldSize < 1)
    throw ConfigError(str(flavour.size, "=", context.worldSize, " is not a number of ranks"));
  if (context.rank >= context.worldSize)
    throw ConfigError(str(flavour.rank, "=", context.rank, " is not below ", flavour.size, "=",
                          context.worldSize));
  for (const char* name : flavour.localRank) {
    if (auto local = variable(name)) {
      context.localRank = parseRankNumber(name, *local);
      if (context.localRank >= context.worldSize)
        throw ConfigError(str(name, "=", context.localRank, " is not below ", flavour.size, "=",
                              context.worldSize));
      break;
    }
  }
  context.storeAddress = storeFromEnvironment(context, flavour);
  context.storeExternal = kStoreExternal.flag();
  context.jobId = kJobId.str();
  return context;
}

std::string listenAddressFor(const RankContext& context) {
  if (const char* iface = std::getenv("HETRA_IFACE_ADDR"); iface && *iface) return iface;
  const std::string host = store::parseHostPort(context.storeAddress).host;
  if (host == "localhost" || host.rfind("127.", 0) == 0) return "127.0.0.1";
  return routeAddressTo(host);
}

std::shared_ptr<store::Store> connectJobStore(const RankContext& context, Millis timeout,
                                              std::shared_ptr<void>* server) {
  std::shared_ptr<store::Store> base;
  if (context.worldSize == 1 && context.storeAddress.empty()) {
    base = std::make_shared<store::MemoryStore>();
  } else {
    if (context.storeExternal) {
      const auto address = store::parseHostPort(context.storeAddress);
      base = std::make_shared<store::TcpStore>(address.host, address.port, timeout);
    } else {  // rank 0 serves
      std::unique_ptr<store::TcpStoreServer> served;
      base = store::connectStore(context.storeAddress, context.rank, timeout, &served);
      if (served) *server = std::shared_ptr<store::TcpStoreServer>(std::move(served));
    }
  }
  return std::make_shared<store::PrefixStore>(context.jobId, base);
}

std::map<std::string, std::string> jobEnvironment(const std::string& storeAddress,
                                                  const std::string& jobId) {
  return {{kStore.env(), storeAddress}, {kStoreExternal.env(), "1"}, {kJobId.env(), jobId}};
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

LauncherSignals::LauncherSignals() {
  sigemptyset(&handled_);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&handled_, sig);
  pthread_sigmask(SIG_BLOCK, &handled_, &previous_);
}

LauncherSignals::~LauncherSignals() {
  // A SIGCHLD left pending would be ignored anyway; a late SIGINT then acts as usual.
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

std::string resolveProgram(const std::string& program) {
  if (program.empty()) throw ConfigError("no program to run");
  if (program.find('/') != std::string::npos) {
    if (access(program.c_str(), X_OK) != 0)
      throw ConfigError(str("cannot run '", program, "': ", std::strerror(errno)));
    return program;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t begin = 0;
  while (begin <= dirs.size()) {
    size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > begin ? dirs.substr(begin, end - begin) : ".";
    const std::string candidate = dir + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  throw ConfigError(str("program '", program, "' is not in PATH"));
}

std::string describeWaitStatus(int status) {
  if (WIFEXITED(status)) return str("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return str("was killed by signal ", sig, " (", name ? name : "unknown", ")");
  }
  return str("ended with wait status ", status);
}

int exitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

namespace {

// What a child needs, built before fork: after fork in a process with threads (the store server)
// only async-signal-safe calls are allowed, so no allocation happens in the child.
struct PreparedChild {
  std::vector<std::string> argvStorage, envStorage;
  std::vector<char*> argv, envp;
  cpu_set_t cpus;
  bool pin = false;
};

PreparedChild prepare(const ChildProcess& child) {
  PreparedChild p;
  p.argvStorage = child.argv;
  std::map<std::string, std::string> overrides = child.environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos && overrides.count(entry.substr(0, eq))) continue;
    p.envStorage.push_back(entry);
  }
  for (const auto& [name, value] : overrides) p.envStorage.push_back(name + "=" + value);
  for (auto& arg : p.argvStorage) p.argv.push_back(arg.data());
  p.argv.push_back(nullptr);
  for (auto& entry : p.envStorage) p.envp.push_back(entry.data());
  p.envp.push_back(nullptr);
  CPU_ZERO(&p.cpus);
  for (int cpu : child.cpus) CPU_SET(cpu, &p.cpus);
  p.pin = !child.cpus.empty();
  return p;
}

void writeAll(int fd, const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = write(fd, text, left);
    if (n <= 0) return;
    text += n;
    left -= size_t(n);
  }
}

// A child's stderr as the launcher reads it: complete lines are forwarded to the launcher's stderr
// and the last ones kept.
struct StderrTail {
  int fd = -1;  // read end; -1 when not captured or at end of file
  std::string partial;
  std::deque<std::string> lines;

  // Reads what is there without blocking; at end of file closes the pipe.
  void drain(size_t keep) {
    char buffer[4096];
    for (;;) {
      if (fd < 0) return;
      const ssize_t got = read(fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        if (got == 0 || errno != EAGAIN) {
          close(fd);
          fd = -1;
          if (!partial.empty()) keep1(partial + "\n", keep);
          partial.clear();
        }
        return;
      }
      partial.append(buffer, size_t(got));
      for (size_t nl; (nl = partial.find('\n')) != std::string::npos;) {
        keep1(partial.substr(0, nl + 1), keep);
        partial.erase(0, nl + 1);
      }
    }
  }

  void keep1(const std::string& line, size_t keep) {
    writeAll(STDERR_FILENO, line.c_str());
    lines.push_back(line.substr(0, line.size() - 1));
    while (lines.size() > keep) lines.pop_front();
  }
};

std::string thisHostName() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

[[noreturn]] void execChild(const ChildProcess& child, PreparedChild& p, pid_t launcher,
                            const sigset_t& mask, const char* failure, int stderrFd) {
  setpgid(0, 0);
  if (stderrFd >= 0) dup2(stderrFd, STDERR_FILENO);  // the pipe's ends close on exec
  // Dies with the launcher, even when the launcher is killed with SIGKILL; the launcher may have
  // died before this line, so check that it is still the parent.
  prctl(PR_SET_PDEATHSIG, child.deathSignal);
  if (getppid() != launcher) _exit(128 + child.deathSignal);
  if (p.pin) sched_setaffinity(0, sizeof p.cpus, &p.cpus);
  if (child.stdinNull) {
    const int null = open("/dev/null", O_RDONLY);
    if (null >= 0) {
      dup2(null, STDIN_FILENO);
      if (null != STDIN_FILENO) close(null);
    }
  }
  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  execve(child.path.c_str(), p.argv.data(), p.envp.data());
  writeAll(STDERR_FILENO, failure);
  _exit(127);
}

}  // namespace

int superviseChildren(const std::vector<ChildProcess>& children, const SuperviseOptions& options,
                      const LauncherSignals& signals) {
  const size_t n = children.size();
  std::vector<PreparedChild> prepared;
  std::vector<std::string> failures;
  for (const auto& child : children) {
    prepared.push_back(prepare(child));
    failures.push_back(
        str(options.name, ": cannot execute ", child.path, " for ", child.label, "\n"));
  }
  // Pipes for the children's stderr, made before any fork; the read ends are non-blocking.
  std::vector<StderrTail> tails(n);
  std::vector<int> writeEnds(n, -1);
  if (options.captureStderr)
    for (size_t i = 0; i < n; ++i) {
      int ends[2];
      if (pipe2(ends, O_CLOEXEC) != 0)
        throw IoError(str("pipe for ", children[i].label, "'s stderr: ", std::strerror(errno)));
      fcntl(ends[0], F_SETFL, fcntl(ends[0], F_GETFL) | O_NONBLOCK);
      tails[i].fd = ends[0];
      writeEnds[i] = ends[1];
    }
  auto closeWriteEnds = [&] {
    for (int& fd : writeEnds)
      if (fd >= 0) close(fd), fd = -1;
  };
  auto drainAll = [&] {
    for (auto& tail : tails) tail.drain(options.tailLines);
  };
  // The failed child's last lines, for its failure message.
  auto tailOf = [&](size_t i) {
    if (!options.captureStderr) return std::string();
    tails[i].drain(options.tailLines);
    if (tails[i].lines.empty()) return str("\n", options.name, ": it wrote nothing to stderr");
    std::string text =
        str("\n", options.name, ": its last ", tails[i].lines.size(), " lines on stderr:");
    for (const auto& line : tails[i].lines) text += "\n    " + line;
    return text;
  };
  const std::string host = thisHostName();
  std::vector<pid_t> pids(n, -1);
  std::vector<bool> running(n, false);
  size_t live = 0;
  const pid_t self = getpid();
  auto signalAll = [&](int sig) {
    for (size_t i = 0; i < n; ++i)
      if (running[i]) kill(-pids[i], sig);  // the child's whole process group
  };

  for (size_t i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      const int error = errno;
      signalAll(SIGKILL);
      for (size_t j = 0; j < i; ++j) waitpid(pids[j], nullptr, 0);
      throw IoError(str("fork failed for ", children[i].label, ": ", std::strerror(error)));
    }
    if (pid == 0)
      execChild(children[i], prepared[i], self, signals.previousMask(), failures[i].c_str(),
                writeEnds[i]);
    setpgid(pid, pid);  // also here, so that a signal sent right away reaches its group
    pids[i] = pid;
    running[i] = true;
    ++live;
  }
  closeWriteEnds();  // each pipe's end of file is then its child's (and its children's) exit

  int failedCode = 0;
  int forwarded = 0;
  bool killed = false;
  Deadline killAt = Deadline::max();  // max: nobody is to be killed
  auto killBy = [&](Deadline deadline) { killAt = std::min(killAt, deadline); };
  while (live > 0) {
    int status = 0;
    pid_t pid;
    while (live > 0 && (pid = waitpid(-1, &status, WNOHANG)) > 0) {
      const auto it = std::find(pids.begin(), pids.end(), pid);
      if (it == pids.end()) continue;
      const size_t i = size_t(it - pids.begin());
      running[i] = false;
      --live;
      // Its group may hold processes it started; they go with it.
      kill(-pid, SIGKILL);
      if (status == 0) continue;
      const std::string what =
          str(children[i].label, " (pid ", pid, ", host ", host, ") ", describeWaitStatus(status));
      if (killed || forwarded) {
        HETRA_INFO("cli", options.name, ": ", what);
      } else if (failedCode == 0) {
        failedCode = exitCodeOf(status);
        HETRA_ERROR("cli", options.name, ": ", what,
                    live > 0 ? str("; stopping the other ", live == 1 ? "process" : "processes",
                                   " in ", options.failureGrace.count(), " ms")
                             : std::string(),
                    tailOf(i));
        killBy(deadlineAfter(options.failureGrace));
      } else {
        HETRA_ERROR("cli", options.name, ": ", what);
      }
    }
    if (live == 0) break;
    if (Clock::now() >= killAt) {
      signalAll(SIGKILL);
      killed = true;
      killAt = Deadline::max();
    }
    // Sleep until a child ends or a signal arrives, at most until the next deadline. With pipes
    // to read, wait on them first (signals stay pending until sigtimedwait takes them).
    Millis wait(200);
    if (killAt != Deadline::max()) wait = std::clamp(remaining(killAt), Millis(1), wait);
    if (options.captureStderr) {
      std::vector<pollfd> fds;
      for (const auto& tail : tails)
        if (tail.fd >= 0) fds.push_back({tail.fd, POLLIN, 0});
      if (!fds.empty()) {
        poll(fds.data(), fds.size(), int(std::min<int64_t>(wait.count(), 50)));
        drainAll();
        wait = Millis(0);
      }
    }
    timespec timeout{time_t(wait.count() / 1000), long(wait.count() % 1000) * 1000000};
    siginfo_t info;
    const int sig = sigtimedwait(&signals.handled(), &info, &timeout);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (forwarded) {
        HETRA_ERROR("cli", options.name, ": second signal ", sig, "; killing every process");
        signalAll(SIGKILL);
        killed = true;
      } else {
        HETRA_WARN("cli", options.name, ": got signal ", sig, " (", strsignal(sig),
                   "); passing it on to ", live, " processes");
        forwarded = sig;
        signalAll(sig);
        killBy(deadlineAfter(options.stopGrace));
      }
    }
  }
  for (auto& tail : tails) {
    tail.drain(options.tailLines);
    if (tail.fd >= 0) close(tail.fd);  // a grandchild still holds the pipe: stop reading it
  }
  if (failedCode != 0) return failedCode;
  return forwarded ? 128 + forwarded : 0;
}

void ensureJobSecret() {
  if (std::getenv("HETRA_JOB_SECRET") || std::getenv("HETRA_JOB_SECRET_FILE")) return;
  setenv("HETRA_JOB_SECRET", auth::generateJobSecret().c_str(), 1);
}

int runLocalJob(const LocalJob& job) {
  HETRA_ENFORCE(job.np >= 1, "the number of ranks must be at least 1, got ", job.np);
  HETRA_ENFORCE(!job.argv.empty(), "no program to run");
  const bool pin = !job.cpuSets.empty() && kPin.flag();
  HETRA_ENFORCE(!pin || int(job.cpuSets.size()) == job.np, "one CPU set per rank");
  const std::string path = job.program.empty() ? resolveProgram(job.argv[0]) : job.program;
  const LauncherSignals signals;  // before the store server's thread starts
  ensureJobSecret();
  store::TcpStoreServer server("127.0.0.1", 0);
  const auto common = jobEnvironment(str("127.0.0.1:", server.port()), randomJobId());
  // A terminal's stdin stays with the launcher: a rank in its own process group reading it would
  // be stopped (SIGTTIN). A pipe or file goes to rank 0, as mpirun does.
  const bool stdinToRank0 = !isatty(STDIN_FILENO);
  std::vector<ChildProcess> children;
  for (int rank = 0; rank < job.np; ++rank) {
    ChildProcess child;
    child.label = str("rank ", rank);
    child.path = path;
    child.argv = job.argv;
    child.environment = common;
    child.environment[kRank.env()] = std::to_string(rank);
    child.environment[kWorldSize.env()] = std::to_string(job.np);
    child.environment[kLocalRank.env()] = std::to_string(rank);
    for (const auto& [name, value] : job.environment) child.environment[name] = value;
    if (pin) child.cpus = job.cpuSets[size_t(rank)];
    child.stdinNull = !(rank == 0 && stdinToRank0);
    children.push_back(std::move(child));
  }
  SuperviseOptions options;
  options.name = job.name;
  options.failureGrace = job.failureGrace;
  options.stopGrace = job.stopGrace;
  options.captureStderr = job.captureStderr;
  return superviseChildren(children, options, signals);
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
  return runLocalJob(job);
}

}  // namespace hetra::cli
