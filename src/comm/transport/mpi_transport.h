// MPI transport: point-to-point messages over MPI (Open MPI), as an alternative to tcp across
// hosts when the job is launched by mpirun. See mpi_transport.cc for the design. This header does
// not include mpi.h: only hetra_comm links MPI.
//
// Requirements and limits, for callers:
// - Every process of the mpirun job must initialise MPI (MPI_Init is collective over the job in
//   Open MPI): the world group of every rank uses the mpi transport, or the application calls
//   initMpi() early on every process.
// - MPI is initialised once per process with MPI_THREAD_MULTIPLE (a lower level is refused with a
//   ConfigError) and finalised at exit, unless the application initialised it itself (then it
//   finalises it too, after destroying every hetra group).
// - The ranks of a hetra group must be distinct processes of one MPI job; any subset, in any order
//   (the group becomes an MPI communicator through MPI_Comm_create_group, collective over the
//   group only).
// - Open MPI (without ULFM) has no recovery from a dead process: mpirun ends the whole job when a
//   rank dies. Faults that leave the processes alive (abort, timeouts, mismatched calls, a rank
//   that destroyed its group) fail the group as with tcp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/transport/transport.h"
#include "store/store.h"

namespace hetra::comm {

struct MpiOptions {
  Millis timeout{30000};  // for setting up the group
};

// This process in the MPI job (initialising MPI on first use).
struct MpiProcess {
  int worldRank = 0;
  int worldSize = 1;
  // Equal on every process of one MPI job, different between jobs (PMIx namespace or Open MPI job
  // id; "singleton:<host>:<pid>" for a process not started by mpirun).
  std::string job;
};

// Initialises MPI (MPI_THREAD_MULTIPLE) if this process has not yet; ConfigError when the library
// cannot provide that thread level, IoError when MPI_Init fails. Thread-safe, idempotent.
MpiProcess initMpi();

// Collective over the group: every rank calls it with the same (prefixed) store. Fails in about
// options.timeout with TimeoutError naming the ranks that did not join; with ConfigError when the
// ranks are not distinct processes of one MPI job. Once every rank joined, MPI_Comm_create_group
// itself has no timeout (MPI offers none): a rank that dies in between blocks the others until
// mpirun ends the job. A receive must name exactly the size of the matching send (a difference is
// a MismatchError on the receiving rank, and the group fails).
std::unique_ptr<Transport> createMpiTransport(std::shared_ptr<store::Store> store, int rank,
                                              int size, const MpiOptions& options);

}  // namespace hetra::comm
