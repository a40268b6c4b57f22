// How a hetra process learns its place in a job, and how `--np N` starts N local ranks.
//
// A rank is described by the environment: HETRA_RANK, HETRA_WORLD_SIZE, HETRA_LOCAL_RANK and
// HETRA_STORE=host:port. Rank 0 serves the store unless HETRA_STORE_EXTERNAL=1 says the launcher
// already does (as `--np` does).
#pragma once

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
};

// The rank described by the environment, or nullopt when HETRA_RANK is not set. Throws ConfigError
// naming the variable when the description is incomplete or inconsistent.
std::optional<RankContext> rankFromEnvironment();

// Connects this rank to the job's store (serving it first when this is rank 0 and nobody else does)
// and returns a store prefixed with the job id. `server` keeps the served store alive.
std::shared_ptr<store::Store> connectJobStore(const RankContext& context, Millis timeout,
                                              std::shared_ptr<void>* server);

// Runs `argv` (this program's own arguments) as `np` local ranks: serves their store, starts them
// with the rank environment, waits for all of them. If one fails, the others get a few seconds to
// report their own error and are then killed. Returns the first non-zero exit status, or 0.
// cpuSets[r], when given, are the CPUs rank r is bound to (unless HETRA_PIN=0): a rank that
// migrates, or shares a core with a peer it waits for, pays for it at every synchronisation.
int spawnLocalRanks(int np, const std::vector<std::string>& argv,
                    const std::vector<std::vector<int>>& cpuSets = {},
                    Millis failureGrace = Millis(5000));

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
