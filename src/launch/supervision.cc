// Vocabulary: see supervision.h.
#include "launch/supervision.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <set>

#include "common/errors.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/params.h"

extern char** environ;

namespace hetra::launch {

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
  const std::string dirs = environmentValue("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
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
  const std::map<std::string, std::string>& overrides = child.environment;
  const std::set<std::string> removed(child.unsetEnvironment.begin(), child.unsetEnvironment.end());
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (overrides.count(name) || removed.count(name)) continue;
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

[[noreturn]] void execChild(const ChildProcess& child, PreparedChild& p, pid_t launcher,
                            const sigset_t& mask, const char* failure, int stderrFd) {
  setpgid(0, 0);
  if (stderrFd >= 0) dup2(stderrFd, STDERR_FILENO);  // the pipe's ends close on exec
  for (int fd : child.closeFds) close(fd);
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
  const std::string host = net::hostName();
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
      if (options.onReaped) options.onReaped(i, status);
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
      if (options.onKillingTheRest) options.onKillingTheRest();
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

}  // namespace hetra::launch
