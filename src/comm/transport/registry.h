// The transports a group can be built on, as a table tried in priority order (NCCL's canConnect
// discipline): each library that owns a transport registers a factory saying whether it can
// connect a group and how. The communicator asks for "auto" or a named transport and never names
// a concrete one.
//
// Registration is explicit, not by static initialisers (a static link or an installed package
// would drop them): the built-ins (shm, tcp, and mpi when built with it) are registered on first
// use of this table; other libraries expose a function the program calls, e.g.
// hetra::cuda::registerTransports().
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport/transport.h"
#include "common/timing.h"
#include "store/store.h"

namespace hetra::comm {

// What every rank of the group knows alike, so that every rank makes the same choice.
struct TransportRequest {
  // The group's store; each factory works under its own prefix of it.
  std::shared_ptr<store::Store> store;
  int rank = 0, size = 1;
  std::vector<std::string> hosts;  // host identity of every rank, indexed by rank
  Millis timeout{30000};
  std::string listenAddress;  // "" = the tcp default (HETRA_IFACE_ADDR)
};

struct TransportFactory {
  std::string name;  // "shm", "tcp", "mpi", "nccl"
  // Higher is tried first by "auto". Below 0: never chosen by "auto", only when named (mpi needs
  // every process started by mpirun; nccl needs device buffers).
  int priority = 0;
  // "" when it can connect the group of the request, else why not (shown when the user forced
  // this transport).
  std::function<std::string(const TransportRequest&)> whyNot;
  // Collective over the group, like the create*Transport functions.
  std::function<std::unique_ptr<Transport>(const TransportRequest&)> create;
};

// Adds a factory, replacing the one of the same name. Thread-safe.
void registerTransport(TransportFactory factory);

// `choice` "auto": the highest-priority factory (>= 0) that can connect the group. A name: that
// factory, or ConfigError saying why it cannot, or listing the registered names when there is none
// of that name. Collective over the group, like the factory's create.
std::unique_ptr<Transport> connectTransport(const std::string& choice,
                                            const TransportRequest& request);

// Registered names, highest priority first.
std::vector<std::string> transportNames();

}  // namespace hetra::comm
