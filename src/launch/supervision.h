// Local supervision: a launcher starts child processes (ranks, or mpirun), forwards signals to
// them, reads their stderr, and when one fails names it, stops the others and returns its code.
//
// Vocabulary:
//   environment  what a child starts with: the launcher's own environment with the child's
//                changes applied, built before fork and passed to execve; the launcher never
//                changes its own environment to pass a setting on.
//   group        each child runs in its own process group, so that a signal reaches whatever it
//                started; a child dies with the launcher (PR_SET_PDEATHSIG).
//   tail         the last lines a child wrote to stderr, forwarded as they come and quoted in its
//                failure message.
#pragma once

#include <signal.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/timing.h"

namespace hetra::launch {

// The launcher's side of SIGINT, SIGTERM, SIGHUP and SIGCHLD: blocked from construction (so that
// threads started afterwards, like the store server's, never take them) and read synchronously by
// superviseChildren; the previous mask is restored on destruction. Create it before any thread.
class LauncherSignals {
 public:
  LauncherSignals();
  ~LauncherSignals();
  LauncherSignals(const LauncherSignals&) = delete;
  LauncherSignals& operator=(const LauncherSignals&) = delete;
  const sigset_t& previousMask() const { return previous_; }
  const sigset_t& handled() const { return handled_; }

 private:
  sigset_t previous_;
  sigset_t handled_;
};

// One process a launcher starts and watches.
struct ChildProcess {
  std::string label;                               // "rank 2", "mpirun": how messages name it
  std::string path;                                // what to execute (see resolveProgram)
  std::vector<std::string> argv;                   // argv[0] included
  std::map<std::string, std::string> environment;  // set on top of the launcher's environment
  std::vector<std::string> unsetEnvironment;       // removed from it
  std::vector<int> closeFds;                       // inherited descriptors it must not keep
  std::vector<int> cpus;                           // bind to these when not empty
  bool stdinNull = true;                           // else it shares the launcher's stdin
  int deathSignal = SIGKILL;                       // sent to it if the launcher dies
};

struct SuperviseOptions {
  std::string name = "hetra";  // what messages start with
  Millis failureGrace{5000};
  Millis stopGrace{10000};
  // Read each child's stderr through a pipe: forwarded line by line as it comes, and the last
  // tailLines of the child that failed are part of the failure message (with the host's name).
  bool captureStderr = false;
  size_t tailLines = 20;
  // Called (on the supervising thread) as each child is reaped, with its index and wait status.
  std::function<void(size_t child, int status)> onReaped;
  // Called (on the supervising thread) just before the children still running are killed at the
  // end of a grace period: how they end from then on is the launcher's doing, not a failure.
  std::function<void()> onKillingTheRest;
};

// Starts every child in its own process group and waits for all of them. SIGINT, SIGTERM and
// SIGHUP go to every running child's group (a second one kills them). When a child fails, names it
// and its status, kills the rest after failureGrace and returns its exit code; after a forwarded
// signal returns 128 + that signal; else 0.
int superviseChildren(const std::vector<ChildProcess>& children, const SuperviseOptions& options,
                      const LauncherSignals& signals);

// The file `program` names: itself when it has a slash, else the first executable of that name in
// PATH. Throws ConfigError naming it when there is none.
std::string resolveProgram(const std::string& program);

// "exited with status 3", "was killed by signal 9 (Killed)" for a waitpid status.
std::string describeWaitStatus(int status);
// The exit code a shell would report for a waitpid status: the status, or 128 + signal.
int exitCodeOf(int status);

}  // namespace hetra::launch
