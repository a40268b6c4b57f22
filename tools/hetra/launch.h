// How a hetra process learns its place in a job, and how a launcher starts the ranks of a job on
// this host.
//
// A rank is described by the environment, by whichever launcher started it (first match wins):
//   hetra (hetra launch, --np, or by hand): HETRA_RANK, HETRA_WORLD_SIZE, HETRA_LOCAL_RANK
//   Open MPI (mpirun):                      OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK
//   Slurm (srun):                           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//   PMI (MPICH's hydra, others):            PMI_RANK, PMI_SIZE (local rank MPI_LOCALRANKID)
// The store is HETRA_STORE=host:port; without it (under mpirun or srun), HETRA_MASTER_ADDR or
// MASTER_ADDR names rank 0's host and HETRA_MASTER_PORT or MASTER_PORT the port (default 29431).
// Rank 0 serves the store unless HETRA_STORE_EXTERNAL=1 says the launcher already does.
#pragma once

#include <signal.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/timing.h"
#include "store/store.h"

namespace hetra::cli {

struct RankContext {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  std::string storeAddress;    // host:port
  bool storeExternal = false;  // the launcher serves the store
  std::string jobId;           // keys of this job live under this prefix of the store
  std::string launcher;        // whose variables described the rank: hetra, openmpi, slurm, pmi
};

// The rank described by the environment, or nullopt when no launcher's variables are set. Throws
// ConfigError naming the variables when the description is incomplete or inconsistent.
std::optional<RankContext> rankFromEnvironment();

// The address this rank's tcp transport listens on: HETRA_IFACE_ADDR when set; else the loopback
// address when the store is on this host's loopback; else the local address routed to the store's
// host (the interface the other hosts reach us on).
std::string listenAddressFor(const RankContext& context);

// Connects this rank to the job's store (serving it first when this is rank 0 and nobody else does)
// and returns a store prefixed with the job id. `server` keeps the served store alive.
std::shared_ptr<store::Store> connectJobStore(const RankContext& context, Millis timeout,
                                              std::shared_ptr<void>* server);

// The variables every rank of a job gets from its launcher, whatever starts the processes (local
// fork or mpirun -x): the store the launcher serves and the job id. The one place to add a
// job-wide variable.
std::map<std::string, std::string> jobEnvironment(const std::string& storeAddress,
                                                  const std::string& jobId);

// Makes sure this process's environment names the job's secret (common/auth.h), generating a new
// one into HETRA_JOB_SECRET unless HETRA_JOB_SECRET or HETRA_JOB_SECRET_FILE is already set. Ranks
// and the store server read it from there; it never goes on a command line.
void ensureJobSecret();

// A new random job id (the prefix of the job's keys in the store).
std::string randomJobId();

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
  // See SuperviseOptions::captureStderr (off for ranks that report through RankWatch).
  bool captureStderr = false;
};

// Runs the job: serves its store on 127.0.0.1, starts each rank with HETRA_RANK, HETRA_WORLD_SIZE,
// HETRA_LOCAL_RANK and jobEnvironment(), each in its own process group and killed if the launcher
// dies. SIGINT and SIGTERM sent to the launcher go to every rank. When a rank fails, names it and
// its status, stops the others after failureGrace and returns its exit code (128 + signal for a
// rank killed by a signal); 0 when every rank succeeds.
int runLocalJob(const LocalJob& job);

// runLocalJob of this program itself (`argv` are its own arguments), as `--np` does.
int spawnLocalRanks(int np, const std::vector<std::string>& argv,
                    const std::vector<std::vector<int>>& cpuSets = {},
                    Millis failureGrace = Millis(5000));

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
  std::map<std::string, std::string> environment;  // on top of the launcher's environment
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

// The CPUs this process may run on.
std::vector<int> allowedCpus();

// One CPU per rank, as mpirun binds by default; empty when there are fewer CPUs than ranks.
std::vector<std::vector<int>> onePerCore(int np);

// Places ranks that each use `threads[r]` threads for a fraction `duty[r]` of the time (an emulated
// device of slowdown s has duty 1/s) on the allowed CPUs so that no CPU is asked for more than it
// has: first-fit by decreasing duty. Empty when they do not fit (then the ranks are not bound).
std::vector<std::vector<int>> packByDuty(const std::vector<double>& duty,
                                         const std::vector<int>& threads);

}  // namespace hetra::cli
