// A local job: N ranks of one program on this host, started with their rank environment, watched
// (heartbeats, stderr, exit codes) and stopped together when one fails.
//
// Every rank's settings are in its environment object (ChildProcess::environment), built before
// the ranks start: the store the launcher serves, the job id, the secret, the rank's numbers and
// heartbeat channel, and whatever the caller adds (LocalJob::environment). The launcher's own
// environment is never changed.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/timing.h"
#include "launch/heartbeat.h"

namespace hetra::launch {

// N ranks of one job on this host.
struct LocalJob {
  int np = 1;
  // argv[0] is the program: run as `program` when set (e.g. /proc/self/exe), else searched in PATH.
  std::vector<std::string> argv;
  std::string program;
  // cpuSets[r], when given, are the CPUs rank r is bound to (unless HETRA_PIN=0).
  std::vector<std::vector<int>> cpuSets;
  // After the first failure, the others get this long to report their own error, then are killed.
  Millis failureGrace{5000};
  // After a forwarded SIGINT/SIGTERM, ranks still running this long later are killed.
  Millis stopGrace{10000};
  // Added to (or overriding) each rank's environment after jobEnvironment().
  std::map<std::string, std::string> environment;
  // What the launcher's messages start with ("hetra launch").
  std::string name = "hetra";
  // The launcher reads each rank's stderr itself (any program: its failure message quotes the
  // rank's last lines). Off: a rank linked with hetra sends its stderr through its heartbeat
  // channel, and LocalJobEnd::failure quotes it.
  bool captureStderr = false;
};

struct LocalJobEnd {
  int code = 0;                // the failed rank's exit code (128 + signal), or 0
  RankWatch::Failure failure;  // the first rank that failed, as the heartbeat watch saw it
};

// Runs the job: serves its store on 127.0.0.1, starts each rank with HETRA_RANK, HETRA_WORLD_SIZE,
// HETRA_LOCAL_RANK (rankEnvironment), jobEnvironment(), the job's secret and its heartbeat channel,
// each in its own process group and killed if the launcher dies. SIGINT and SIGTERM sent to the
// launcher go to every rank. A rank linked with hetra beats; one silent for HETRA_HANG_TIMEOUT_S
// (stopped, frozen) is named and killed, so that its peers fail at once. When a rank fails, names
// it and its status, stops the others after failureGrace and returns its exit code; 0 when every
// rank succeeds.
LocalJobEnd runLocalJob(const LocalJob& job);

// runLocalJob of this program itself (`argv` are its own arguments), as `--np` does.
int spawnLocalRanks(int np, const std::vector<std::string>& argv,
                    const std::vector<std::vector<int>>& cpuSets = {},
                    Millis failureGrace = Millis(5000));

// The job's secret as a launcher holds it: for the store it serves, and the variables that give it
// to the ranks (never a command line). The environment's secret (HETRA_JOB_SECRET or
// HETRA_JOB_SECRET_FILE) when it names one, else a new random one.
struct LauncherSecret {
  auth::JobSecret secret;
  std::map<std::string, std::string> environment;  // HETRA_JOB_SECRET
  std::vector<std::string> unsetEnvironment;       // HETRA_JOB_SECRET_FILE: one source only
};
LauncherSecret launcherSecret();

// A new random job id (the prefix of the job's keys in the store).
std::string randomJobId();

// The CPUs this process may run on.
std::vector<int> allowedCpus();

// One CPU per rank, as mpirun binds by default; empty when there are fewer CPUs than ranks.
std::vector<std::vector<int>> onePerCore(int np);

// Places ranks that each use `threads[r]` threads for a fraction `duty[r]` of the time (an emulated
// device of slowdown s has duty 1/s) on the allowed CPUs so that no CPU is asked for more than it
// has: first-fit by decreasing duty. Empty when they do not fit (then the ranks are not bound).
std::vector<std::vector<int>> packByDuty(const std::vector<double>& duty,
                                         const std::vector<int>& threads);

}  // namespace hetra::launch
