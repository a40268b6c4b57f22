#include "launch/rank_environment.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <vector>

#include "common/errors.h"
#include "common/net.h"
#include "common/params.h"
#include "launch/scheduler_environment.h"
#include "store/tcp_store.h"

namespace hetra::launch {
namespace {

const Param kRank("HETRA_RANK", "", "This process's rank in the job (set by the launcher).");
const Param kWorldSize("HETRA_WORLD_SIZE", "", "Number of ranks in the job (set by the launcher).");
const Param kLocalRank("HETRA_LOCAL_RANK", "0", "This process's rank among the ranks of its host.");
const Param kStore("HETRA_STORE", "", "host:port of the job's TCP store; rank 0 serves it.");
const Param kMasterAddr("HETRA_MASTER_ADDR", "",
                        "Rank 0's host when HETRA_STORE is not set (else MASTER_ADDR is used).");
const Param kMasterPort("HETRA_MASTER_PORT", "",
                        "Store port with HETRA_MASTER_ADDR or MASTER_ADDR (else MASTER_PORT + 1, "
                        "since MASTER_PORT is torch's own store; else 29431).");
const Param kStoreExternal("HETRA_STORE_EXTERNAL", "0",
                           "1 when the launcher serves the store (rank 0 then only connects).");
const Param kJobId("HETRA_JOB_ID", "job", "Prefix of this job's keys in the store.");

// Variables of other launchers: read, never declared (they are not hetra's to document).
constexpr const char* kTorchMasterAddr = "MASTER_ADDR";
constexpr const char* kTorchMasterPort = "MASTER_PORT";

constexpr int kDefaultMasterPort = 29431;

// The variables of each launcher that describe a rank, in order of precedence.
struct Flavour {
  const char* launcher;
  const char* rank;
  const char* size;
  std::vector<const char*> localRank;  // the first one set counts
};

const std::vector<Flavour>& flavours() {
  static const std::vector<Flavour> all = {
      {"hetra", "HETRA_RANK", "HETRA_WORLD_SIZE", {"HETRA_LOCAL_RANK"}},
      {"torchrun", "RANK", "WORLD_SIZE", {"LOCAL_RANK"}},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", {"OMPI_COMM_WORLD_LOCAL_RANK"}},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", {"SLURM_LOCALID"}},
      {"pmi", "PMI_RANK", "PMI_SIZE", {"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}},
  };
  return all;
}

int parseNumber(const char* name, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != 0)
    throw ConfigError(str(name, "='", text, "' is not an integer"));
  if (value < 0 || value > 1 << 20)
    throw ConfigError(str(name, "=", value, " is out of range; allowed: 0 to 1048576"));
  return int(value);
}

int parsePort(const char* name, const std::string& text) {
  const int port = parseNumber(name, text);
  if (port < 1 || port > 65535) throw ConfigError(str(name, "=", port, " is not a TCP port"));
  return port;
}

// torch's store port, when the environment names one.
std::optional<int> torchPort() {
  if (auto text = environmentValue(kTorchMasterPort)) return parsePort(kTorchMasterPort, *text);
  return std::nullopt;
}

// The port of hetra's store next to rank 0's host: never torch's MASTER_PORT.
int masterPort() {
  const auto torch = torchPort();
  if (auto text = environmentValue(kMasterPort.env())) {
    const int port = parsePort(kMasterPort.env().c_str(), *text);
    if (torch && port == *torch)
      throw ConfigError(str(kMasterPort.env(), "=", port, " is MASTER_PORT, the port of torch's ",
                            "store; give hetra's store another port (or leave ", kMasterPort.env(),
                            " unset: MASTER_PORT + 1)"));
    return port;
  }
  if (torch) return *torch < 65535 ? *torch + 1 : *torch - 1;
  return kDefaultMasterPort;
}

// `rankVariable` names the launcher's rank variable in errors; `rankZeroHost`, when the launcher
// names every rank's host, serves the store unless a variable says otherwise.
std::string storeFromEnvironment(const RankContext& context, const char* rankVariable,
                                 const std::string& rankZeroHost = "") {
  if (auto store = environmentValue(kStore.env())) {
    const auto torch = torchPort();
    if (torch && !context.storeExternal && store::parseHostPort(*store).port == *torch)
      throw ConfigError(str(kStore.env(), "=", *store, " has MASTER_PORT=", *torch,
                            ", the port of torch's store; rank 0 would bind it: give hetra's ",
                            "store another port"));
    return *store;
  }
  auto host = environmentValue(kMasterAddr.env());
  if (!host) host = environmentValue(kTorchMasterAddr);
  if (!host && !rankZeroHost.empty()) host = rankZeroHost;
  if (host) return str(*host, ":", masterPort());
  if (context.worldSize > 1)
    throw ConfigError(str(rankVariable,
                          " is set but HETRA_STORE (host:port of the job's store) is ",
                          "not; set it, or HETRA_MASTER_ADDR (or MASTER_ADDR) to rank 0's host"));
  return "";
}

// One rank per pod; ranks that share a host (an emulated job) count as its local ranks.
RankContext volcanoContext(const VolcanoRank& volcano) {
  RankContext context;
  context.launcher = "volcano";
  context.rank = volcano.rank;
  context.worldSize = int(volcano.hosts.size());
  const auto& hosts = volcano.hosts;
  context.localRank =
      int(std::count(hosts.begin(), hosts.begin() + volcano.rank, hosts[size_t(volcano.rank)]));
  context.storeExternal = kStoreExternal.flag();
  context.storeAddress = storeFromEnvironment(context, "VC_TASK_INDEX", hosts.front());
  context.jobId = kJobId.str();
  return context;
}

}  // namespace

std::optional<RankContext> rankFromEnvironment() {
  const Flavour* found = nullptr;
  for (const auto& flavour : flavours()) {
    if (environmentValue(flavour.rank)) {
      found = &flavour;
      break;
    }
  }
  if (found == nullptr) {
    if (auto volcano = volcanoRank()) return volcanoContext(*volcano);
    // A world size alone is a half-written hetra environment, not "no launcher".
    if (environmentValue(kWorldSize.env()))
      throw ConfigError("HETRA_WORLD_SIZE is set but HETRA_RANK is not");
    return std::nullopt;
  }
  const Flavour& flavour = *found;
  RankContext context;
  context.launcher =
      flavour.launcher == std::string("torchrun") ? torchVariablesLauncher() : flavour.launcher;
  context.rank = parseNumber(flavour.rank, *environmentValue(flavour.rank));
  const auto size = environmentValue(flavour.size);
  if (!size) throw ConfigError(str(flavour.rank, " is set but ", flavour.size, " is not"));
  context.worldSize = parseNumber(flavour.size, *size);
  if (context.worldSize < 1)
    throw ConfigError(str(flavour.size, "=", context.worldSize, " is not a number of ranks"));
  if (context.rank >= context.worldSize)
    throw ConfigError(str(flavour.rank, "=", context.rank, " is not below ", flavour.size, "=",
                          context.worldSize));
  for (const char* name : flavour.localRank) {
    if (auto local = environmentValue(name)) {
      context.localRank = parseNumber(name, *local);
      if (context.localRank >= context.worldSize)
        throw ConfigError(str(name, "=", context.localRank, " is not below ", flavour.size, "=",
                              context.worldSize));
      break;
    }
  }
  context.storeExternal = kStoreExternal.flag();
  context.storeAddress = storeFromEnvironment(context, flavour.rank);
  context.jobId = kJobId.str();
  return context;
}

std::string listenAddressFor(const RankContext& context) {
  if (auto iface = net::chosenInterfaceAddress()) return *iface;
  const std::string host = store::parseHostPort(context.storeAddress).host;
  if (host == "localhost" || host.rfind("127.", 0) == 0) return "127.0.0.1";
  return routeAddressTo(host);
}

std::string routeAddressTo(const std::string& host) {
  // Without a resolver entry for it (a bare chroot has no /etc/hosts), localhost is still loopback.
  if (host == "localhost") return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr)
    throw ConfigError(str("cannot resolve host '", host, "'; give --store-addr"));
  std::string address;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  // Connecting a UDP socket only chooses the route and the source address.
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t length = sizeof local;
    char text[INET_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof text))
      address = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  if (address.empty()) throw ConfigError(str("no route to host '", host, "'; give --store-addr"));
  return address;
}

std::shared_ptr<store::Store> connectJobStore(const RankContext& context, Millis timeout,
                                              std::shared_ptr<void>* server) {
  std::shared_ptr<store::Store> base;
  if (context.worldSize == 1 && context.storeAddress.empty()) {
    base = std::make_shared<store::MemoryStore>();
  } else if (context.storeExternal) {
    const auto address = store::parseHostPort(context.storeAddress);
    base = std::make_shared<store::TcpStore>(address.host, address.port, timeout);
  } else {  // rank 0 serves
    std::unique_ptr<store::TcpStoreServer> served;
    base = store::connectStore(context.storeAddress, context.rank, timeout, &served);
    if (served) *server = std::shared_ptr<store::TcpStoreServer>(std::move(served));
  }
  return std::make_shared<store::PrefixStore>(context.jobId, base);
}

std::map<std::string, std::string> jobEnvironment(const std::string& storeAddress,
                                                  const std::string& jobId) {
  return {{kStore.env(), storeAddress}, {kStoreExternal.env(), "1"}, {kJobId.env(), jobId}};
}

std::map<std::string, std::string> rankEnvironment(int rank, int worldSize, int localRank) {
  return {{kRank.env(), std::to_string(rank)},
          {kWorldSize.env(), std::to_string(worldSize)},
          {kLocalRank.env(), std::to_string(localRank)}};
}

}  // namespace hetra::launch
