// `hetra launch`: starts the ranks of any program, on this host or, through mpirun, on others.
//
//   hetra launch -np N [options] [--] PROGRAM ARGS...
//     no hosts named:  N local processes, each given HETRA_RANK, HETRA_WORLD_SIZE,
//                      HETRA_LOCAL_RANK and the store the launcher serves (runLocalJob)
//     -H a:2,b:2 | --hostfile F:  runs mpirun (the real launcher) with that mapping; the ranks
//                      read OMPI_COMM_WORLD_* and the store (served by this launcher) from -x
// Signals (SIGINT, SIGTERM, SIGHUP) go to the ranks or to mpirun; the exit code is the failed
// rank's (or mpirun's).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace hetra::cli {

struct HostSlots {
  std::string host;
  int slots = 1;
};

struct LaunchOptions {
  int np = 0;  // 0: the number of slots of the hosts (required without hosts)
  std::vector<HostSlots> hosts;
  bool dryRun = false;
  std::string mpirun = "mpirun";
  std::vector<std::string> mpiArgs;  // passed to mpirun as they are
  std::string mapBy = "slot";
  std::string bindTo = "none";  // ranks pick their own threads and CPUs
  bool oversubscribe = false;
  std::string storeAddr;  // the address ranks reach this launcher at; "": the route to host 1
  double graceS = 5;      // after a failure, the others have this long before they are killed
  // --slowdowns: each rank's emulated slowdown, one factor per rank ("1,2,4"), given to the ranks
  // as HETRA_SLOWDOWNS (hetra.torch applies it); "": none.
  std::string slowdowns;
  std::vector<std::string> program;  // PROGRAM ARGS...
};

// Parses the arguments after `launch` (mpirun's spellings: -np, -n, --np, -H, --host, --hostfile).
// A hostfile is read here. Throws ConfigError naming the argument.
LaunchOptions parseLaunchArguments(const std::vector<std::string>& args);

// "a:2,b,c:4" (a host without a count has one slot).
std::vector<HostSlots> parseHostList(const std::string& list);
// Open MPI's hostfile: one "host [slots=N] [max_slots=M]" per line, # starts a comment.
// `source` names the file in errors.
std::vector<HostSlots> parseHostfile(const std::string& text, const std::string& source);

// The mpirun command line of a job: `environment` and the job's secret (HETRA_JOB_SECRET) are
// exported by name (-x NAME), their values come from mpirun's own environment, so that no value
// (the secret) shows on a command line.
std::vector<std::string> mpirunCommand(const LaunchOptions& options,
                                       const std::map<std::string, std::string>& environment);

// "NAME=value ... mpirun -np ..." quoted for a POSIX shell, as --dry-run prints it.
std::string shellCommand(const std::map<std::string, std::string>& environment,
                         const std::vector<std::string>& argv);

int runLaunch(const LaunchOptions& options);

// Registers `launch` on `app`; its arguments are kept raw (mpirun's -np is not CLI11's syntax).
// Returns the subcommand.
CLI::App* addLaunchCommand(CLI::App& app);
// Parses the subcommand's raw arguments and runs it.
int runLaunchCommand(const CLI::App& launch);

}  // namespace hetra::cli
