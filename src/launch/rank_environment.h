// Rank-environment discovery: which launcher started this process and what it says about the
// rank's place in the job.
//
// A rank is described by the environment of whichever launcher started it (first match wins):
//   hetra (hetra launch, hetra run, --np):  HETRA_RANK, HETRA_WORLD_SIZE, HETRA_LOCAL_RANK
//   torchrun (and torch.distributed):       RANK, WORLD_SIZE, LOCAL_RANK
//   Open MPI (mpirun):                      OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK
//   Slurm (srun):                           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//   PMI (MPICH's hydra, others):            PMI_RANK, PMI_SIZE (local rank MPI_LOCALRANKID)
// torchrun goes before Open MPI and Slurm: torchrun started under srun sees both, and its RANK is
// the rank of the process (SLURM_PROCID is the agent's).
//   Volcano (VC_TASK_INDEX and the svc plugin's hosts; launcher "volcano") comes last: a pod's
// variables describe the pod, and a launcher started inside it describes its processes. A
// Kubeflow PyTorchJob's RANK reads as torchrun's (launcher "pytorchjob"); scheduler_environment.h
// says what each operator sets and the global rank order of a Volcano job.
//
// The store is HETRA_STORE=host:port. Without it, HETRA_MASTER_ADDR or MASTER_ADDR names rank 0's
// host, and the port is HETRA_MASTER_PORT; else MASTER_PORT + 1 (MASTER_PORT - 1 for 65535); else
// 29431. MASTER_PORT itself is torch's: torchrun's agent, or torch.distributed in the same
// process, serves its own store there, so hetra's store never binds it (asking for it explicitly
// is a ConfigError). Rank 0 serves hetra's store unless HETRA_STORE_EXTERNAL=1 says the launcher
// already does.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/timing.h"
#include "store/store.h"

namespace hetra::launch {

struct RankContext {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  std::string storeAddress;    // host:port
  bool storeExternal = false;  // the launcher serves the store
  std::string jobId;           // keys of this job live under this prefix of the store
  std::string launcher;        // whose variables described the rank: hetra, torchrun, openmpi, ...
};

// The rank described by the environment, or nullopt when no launcher's variables are set. Throws
// ConfigError naming the variables when the description is incomplete or inconsistent.
std::optional<RankContext> rankFromEnvironment();

// The address this rank's tcp transport listens on: HETRA_IFACE_ADDR when set; else the loopback
// address when the store is on this host's loopback; else the local address routed to the store's
// host (the interface the other hosts reach us on).
std::string listenAddressFor(const RankContext& context);

// The local address the kernel would use to reach `host` (no packet is sent). ConfigError naming
// the host when it cannot be resolved or reached.
std::string routeAddressTo(const std::string& host);

// Connects this rank to the job's store (serving it first when this is rank 0 and nobody else does)
// and returns a store prefixed with the job id. `server` keeps the served store alive.
std::shared_ptr<store::Store> connectJobStore(const RankContext& context, Millis timeout,
                                              std::shared_ptr<void>* server);

// The variables every rank of a job gets from its launcher, whatever starts the processes (local
// fork or mpirun -x): the store the launcher serves and the job id. The one place to add a
// job-wide variable.
std::map<std::string, std::string> jobEnvironment(const std::string& storeAddress,
                                                  const std::string& jobId);

// The variables by which a hetra launcher describes one rank (rankFromEnvironment reads them back).
std::map<std::string, std::string> rankEnvironment(int rank, int worldSize, int localRank);

}  // namespace hetra::launch
