#include "comm/transport/registry.h"

#include <algorithm>
#include <mutex>

#include "comm/transport/shm_transport.h"
#include "comm/transport/tcp_transport.h"
#include "common/errors.h"
#include "common/net.h"
#include "store/store.h"
#ifdef HETRA_WITH_MPI
#include "comm/transport/mpi_transport.h"
#endif

namespace hetra::comm {
namespace {

// Shared memory when every rank is on one host: the fastest, so tried first.
TransportFactory shmFactory() {
  return {"shm", 200,
          [](const TransportRequest& r) -> std::string {
            if (int(r.hosts.size()) != r.size)
              return str("needs the host of every rank (", r.hosts.size(), " of ", r.size,
                         " known)");
            for (const auto& host : r.hosts)
              if (host != r.hosts.front())
                return "needs every rank of the group on one host; this group spans hosts";
            return "";
          },
          [](const TransportRequest& r) {
            store::PrefixStore shmStore("shm", r.store);
            ShmOptions options;
            options.timeout = r.timeout;
            return createShmTransport(shmStore, r.rank, r.size, options);
          }};
}

// Sockets connect any group whose hosts reach each other.
TransportFactory tcpFactory() {
  return {"tcp", 100, [](const TransportRequest&) { return std::string(); },
          [](const TransportRequest& r) {
            TcpOptions options;
            options.timeout = r.timeout;
            options.listenAddress = r.listenAddress.empty()
                                        ? net::chosenInterfaceAddress().value_or("127.0.0.1")
                                        : r.listenAddress;
            return createTcpTransport(std::make_shared<store::PrefixStore>("tcp", r.store), r.rank,
                                      r.size, options);
          }};
}

#ifdef HETRA_WITH_MPI
// Only when named: every process of the job must be an MPI process started by mpirun.
TransportFactory mpiFactory() {
  return {"mpi", -1, [](const TransportRequest&) { return std::string(); },
          [](const TransportRequest& r) {
            MpiOptions options;
            options.timeout = r.timeout;
            return createMpiTransport(std::make_shared<store::PrefixStore>("mpi", r.store), r.rank,
                                      r.size, options);
          }};
}
#endif

struct Table {
  std::mutex mutex;
  std::vector<TransportFactory> factories;  // highest priority first
};

void insertSorted(std::vector<TransportFactory>& factories, TransportFactory factory) {
  std::erase_if(factories, [&](const TransportFactory& f) { return f.name == factory.name; });
  // After every factory of at least its priority: equal priorities keep registration order.
  auto at = std::find_if(factories.begin(), factories.end(),
                         [&](const TransportFactory& f) { return f.priority < factory.priority; });
  factories.insert(at, std::move(factory));
}

// The one list of built-in transports, registered when the table is first used.
Table& table() {
  static Table* instance = [] {
    auto* t = new Table;
    insertSorted(t->factories, shmFactory());
    insertSorted(t->factories, tcpFactory());
#ifdef HETRA_WITH_MPI
    insertSorted(t->factories, mpiFactory());
#endif
    return t;
  }();
  return *instance;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

void registerTransport(TransportFactory factory) {
  HETRA_ENFORCE(!factory.name.empty() && factory.name != "auto" && factory.whyNot && factory.create,
                "a transport factory needs a name other than auto, whyNot and create");
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  insertSorted(t.factories, std::move(factory));
}

std::vector<std::string> transportNames() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<std::string> names;
  for (const auto& f : t.factories) names.push_back(f.name);
  return names;
}

std::unique_ptr<Transport> connectTransport(const std::string& choice,
                                            const TransportRequest& request) {
  // A copy, so that creating (collective, slow) holds no lock.
  std::vector<TransportFactory> factories;
  {
    Table& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    factories = t.factories;
  }
  if (choice == "auto") {
    std::vector<std::string> refusals;
    for (const auto& f : factories) {
      if (f.priority < 0) continue;
      const std::string why = f.whyNot(request);
      if (why.empty()) return f.create(request);
      refusals.push_back(str(f.name, ": ", why));
    }
    throw ConfigError(str("transport 'auto': no registered transport can connect this group (",
                          refusals.empty() ? "none registered" : joined(refusals), ")"));
  }
  for (const auto& f : factories) {
    if (f.name != choice) continue;
    const std::string why = f.whyNot(request);
    if (!why.empty()) throw ConfigError(str("transport '", choice, "': ", why));
    return f.create(request);
  }
  std::vector<std::string> names{"auto"};
  for (const auto& f : factories) names.push_back(f.name);
  // The transports a build can leave out say how to get them.
  const std::string hint = choice == "mpi"    ? " (this hetra was not built with MPI support: "
                                                "configure with -DHETRA_WITH_MPI=ON)"
                           : choice == "nccl" ? " (this hetra was not built with CUDA support, or "
                                                "the program did not call "
                                                "cuda::registerTransports())"
                                              : "";
  throw ConfigError(str("transport '", choice, "' is not registered in this hetra", hint,
                        "; allowed: ", joined(names)));
}

}  // namespace hetra::comm
