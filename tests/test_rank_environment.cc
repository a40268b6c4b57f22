// Rank-environment discovery (launch/rank_environment.h): the variables of each launcher flavour
// (hetra, torchrun, Open MPI, Slurm, PMI), their precedence and errors, and the port of hetra's
// store next to torch's MASTER_PORT, bound for real.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "launch_testing.h"

#include "common/errors.h"
#include "launch/rank_environment.h"
#include "store/tcp_store.h"

namespace {

using namespace hetra;
using namespace hetra::launch;

// Clears every variable a launcher may set for the duration of a test and restores them after.
class CleanEnvironment {
 public:
  CleanEnvironment() {
    for (const char* name : kNames) {
      if (const char* value = std::getenv(name)) saved_.emplace_back(name, value);
      unsetenv(name);
    }
  }
  ~CleanEnvironment() {
    for (const char* name : kNames) unsetenv(name);
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  void set(const char* name, const std::string& value) { setenv(name, value.c_str(), 1); }

 private:
  static constexpr const char* kNames[] = {"HETRA_RANK",
                                           "HETRA_WORLD_SIZE",
                                           "HETRA_LOCAL_RANK",
                                           "HETRA_STORE",
                                           "HETRA_STORE_EXTERNAL",
                                           "HETRA_JOB_ID",
                                           "HETRA_MASTER_ADDR",
                                           "HETRA_MASTER_PORT",
                                           "MASTER_ADDR",
                                           "MASTER_PORT",
                                           "HETRA_IFACE_ADDR",
                                           "RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_RANK",
                                           "OMPI_COMM_WORLD_RANK",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "SLURM_PROCID",
                                           "SLURM_NTASKS",
                                           "SLURM_LOCALID",
                                           "PMI_RANK",
                                           "PMI_SIZE",
                                           "MPI_LOCALRANKID",
                                           "PMI_LOCAL_RANK"};
  std::vector<std::pair<std::string, std::string>> saved_;
};

using hetra::test::configError;
using hetra::test::contains;

TEST(RankEnvironment, NoLauncherMeansNoRank) {
  CleanEnvironment env;
  EXPECT_FALSE(rankFromEnvironment().has_value());
}

// What one launcher's variables describe.
struct Flavour {
  std::vector<std::pair<const char*, const char*>> vars;
  RankContext expected;
};

TEST(RankEnvironment, EachLauncherFlavour) {
  auto context = [](const char* launcher, int rank, int size, int local, const char* store,
                    bool external = false, const char* jobId = "job") {
    return RankContext{rank, size, local, store, external, jobId, launcher};
  };
  const std::vector<Flavour> flavours = {
      {{{"HETRA_RANK", "2"},
        {"HETRA_WORLD_SIZE", "5"},
        {"HETRA_LOCAL_RANK", "1"},
        {"HETRA_STORE", "10.0.0.7:4100"},
        {"HETRA_STORE_EXTERNAL", "1"},
        {"HETRA_JOB_ID", "j7"}},
       context("hetra", 2, 5, 1, "10.0.0.7:4100", true, "j7")},
      {{{"RANK", "3"},
        {"WORLD_SIZE", "4"},
        {"LOCAL_RANK", "1"},
        {"MASTER_ADDR", "10.9.8.7"},
        {"MASTER_PORT", "29500"}},
       context("torchrun", 3, 4, 1, "10.9.8.7:29501")},  // MASTER_PORT is torch's: the next one
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "65535"}},
       context("torchrun", 0, 2, 0, "h:65534")},  // no port above it: the one below
      {{{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "29500"},
        {"HETRA_MASTER_PORT", "4100"}},
       context("torchrun", 1, 2, 0, "h:4100")},  // an explicit port wins
      {{{"OMPI_COMM_WORLD_RANK", "3"},
        {"OMPI_COMM_WORLD_SIZE", "7"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
        {"HETRA_STORE", "h0:4101"}},
       context("openmpi", 3, 7, 1, "h0:4101")},
      {{{"SLURM_PROCID", "4"},
        {"SLURM_NTASKS", "9"},
        {"SLURM_LOCALID", "2"},
        {"MASTER_ADDR", "10.1.2.3"},
        {"MASTER_PORT", "4242"}},
       context("slurm", 4, 9, 2, "10.1.2.3:4243")},
      {{{"PMI_RANK", "1"},
        {"PMI_SIZE", "3"},
        {"MPI_LOCALRANKID", "1"},
        {"HETRA_MASTER_ADDR", "node17"},
        {"MASTER_ADDR", "ignored"}},              // HETRA_MASTER_ADDR first
       context("pmi", 1, 3, 1, "node17:29431")},  // the documented default port
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}},
       context("slurm", 0, 1, 0, "")},  // one rank needs no store
  };
  for (const auto& flavour : flavours) {
    CleanEnvironment env;
    for (const auto& [name, value] : flavour.vars) env.set(name, value);
    const auto c = rankFromEnvironment();
    ASSERT_TRUE(c) << flavour.vars[0].first;
    const RankContext& e = flavour.expected;
    EXPECT_EQ(std::tie(c->launcher, c->rank, c->worldSize, c->localRank, c->storeAddress,
                       c->storeExternal, c->jobId),
              std::tie(e.launcher, e.rank, e.worldSize, e.localRank, e.storeAddress,
                       e.storeExternal, e.jobId))
        << flavour.vars[0].first;
  }
}

TEST(RankEnvironment, PrecedenceIsHetraThenTorchrunThenOpenMpiThenSlurm) {
  CleanEnvironment env;
  env.set("HETRA_STORE", "s:1");
  env.set("SLURM_PROCID", "5");
  env.set("SLURM_NTASKS", "6");
  env.set("OMPI_COMM_WORLD_RANK", "1");
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  EXPECT_EQ(rankFromEnvironment()->launcher, "openmpi");
  EXPECT_EQ(rankFromEnvironment()->rank, 1);
  env.set("RANK", "2");  // torchrun under srun or mpirun: its RANK is the process's
  env.set("WORLD_SIZE", "8");
  EXPECT_EQ(rankFromEnvironment()->launcher, "torchrun");
  EXPECT_EQ(rankFromEnvironment()->rank, 2);
  env.set("HETRA_RANK", "0");
  env.set("HETRA_WORLD_SIZE", "3");
  const auto c = rankFromEnvironment();
  EXPECT_EQ(c->launcher, "hetra");
  EXPECT_EQ(c->rank, 0);
  EXPECT_EQ(c->worldSize, 3);
}

TEST(RankEnvironment, IncompleteOrInconsistentIsRefusedByName) {
  struct Case {
    std::vector<std::pair<const char*, const char*>> vars;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      {{{"OMPI_COMM_WORLD_RANK", "1"}, {"HETRA_STORE", "s:1"}},
       {"OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"}},
      {{{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "6"}, {"HETRA_STORE", "s:1"}},
       {"SLURM_PROCID=6 is not below SLURM_NTASKS=6"}},
      {{{"HETRA_RANK", "1"},
        {"HETRA_WORLD_SIZE", "3"},
        {"HETRA_LOCAL_RANK", "3"},
        {"HETRA_STORE", "s:1"}},
       {"HETRA_LOCAL_RANK=3 is not below HETRA_WORLD_SIZE=3"}},
      {{{"PMI_RANK", "one"}, {"PMI_SIZE", "2"}}, {"PMI_RANK='one' is not an integer"}},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}, {"PMI_SIZE=0"}},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
       {"HETRA_STORE", "MASTER_ADDR"}},
      {{{"HETRA_WORLD_SIZE", "2"}}, {"HETRA_WORLD_SIZE is set but HETRA_RANK is not"}},
      {{{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "70000"}},
       {"MASTER_PORT=70000"}},
      {{{"HETRA_RANK", "-1"}, {"HETRA_WORLD_SIZE", "2"}, {"HETRA_STORE", "s:1"}},
       {"HETRA_RANK=-1 is out of range"}},
      {{{"RANK", "1"}, {"MASTER_ADDR", "h"}}, {"RANK is set but WORLD_SIZE is not"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "x"}, {"MASTER_ADDR", "h"}},
       {"LOCAL_RANK='x' is not an integer"}},
      // hetra's store asked to bind torch's port.
      {{{"RANK", "0"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "29500"},
        {"HETRA_MASTER_PORT", "29500"}},
       {"HETRA_MASTER_PORT=29500 is MASTER_PORT"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}, {"HETRA_STORE", "h:29500"}},
       {"HETRA_STORE=h:29500", "MASTER_PORT=29500"}},
  };
  for (const auto& c : cases) {
    CleanEnvironment env;
    for (const auto& [name, value] : c.vars) env.set(name, value);
    const std::string message = configError([] { rankFromEnvironment(); });
    ASSERT_FALSE(message.empty()) << "accepted: " << c.vars[0].first;
    for (const auto& part : c.mentions) EXPECT_TRUE(contains(message, part)) << message;
  }
}

// A socket listening on a free loopback port, as torch's store does on MASTER_PORT.
class Listener {
 public:
  Listener() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 || listen(fd_, 4) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      throw IoError("cannot listen on a loopback port");
    port_ = ntohs(address.sin_port);
  }
  ~Listener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

TEST(RankEnvironment, HetrasStoreNeverBindsTorchsMasterPort) {
  const Listener torch;  // torch's store, already serving on MASTER_PORT
  CleanEnvironment env;
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "2");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", std::to_string(torch.port()));
  const auto c = rankFromEnvironment();
  ASSERT_TRUE(c);
  const int port = store::parseHostPort(c->storeAddress).port;
  EXPECT_NE(port, torch.port());
  // Rank 0 serves hetra's store for real: binding MASTER_PORT would fail (torch holds it).
  std::shared_ptr<void> server;
  auto store = connectJobStore(*c, Millis(5000), &server);
  ASSERT_TRUE(server);
  store->set("k", {1, 2, 3});
  // Another rank reaches it at the derived address, not at torch's port.
  env.set("RANK", "1");
  const auto peer = rankFromEnvironment();
  EXPECT_EQ(peer->storeAddress, c->storeAddress);
  std::shared_ptr<void> none;
  EXPECT_EQ(connectJobStore(*peer, Millis(5000), &none)->get("k"), (store::Bytes{1, 2, 3}));
  EXPECT_FALSE(none);
}

TEST(RankEnvironment, EachRankIsDescribedAsDiscoveryReadsIt) {
  CleanEnvironment env;
  for (const auto& variables :
       {rankEnvironment(2, 3, 1), jobEnvironment("127.0.0.1:4000", "job-x")})
    for (const auto& [name, value] : variables) env.set(name.c_str(), value);
  const auto c = rankFromEnvironment();
  ASSERT_TRUE(c);
  EXPECT_EQ(std::tie(c->launcher, c->rank, c->worldSize, c->localRank, c->storeAddress,
                     c->storeExternal, c->jobId),
            std::make_tuple(std::string("hetra"), 2, 3, 1, std::string("127.0.0.1:4000"), true,
                            std::string("job-x")));
}

TEST(RankEnvironment, ListenAddress) {
  CleanEnvironment env;
  RankContext c;
  c.storeAddress = "127.0.0.1:5";
  EXPECT_EQ(listenAddressFor(c), "127.0.0.1");
  EXPECT_EQ(routeAddressTo("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(routeAddressTo("localhost"), "127.0.0.1");
}

TEST(RankEnvironment, ChosenInterfaceAddressWinsOverTheRouteToTheStore) {
  CleanEnvironment env;  // restores HETRA_IFACE_ADDR afterwards
  RankContext c;
  c.storeAddress = "127.0.0.1:5";
  setenv("HETRA_IFACE_ADDR", "10.9.8.7", 1);
  EXPECT_EQ(listenAddressFor(c), "10.9.8.7");
  setenv("HETRA_IFACE_ADDR", "", 1);  // empty: not chosen
  EXPECT_EQ(listenAddressFor(c), "127.0.0.1");
}

}  // namespace
