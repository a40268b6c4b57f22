// comm/transport/registry: the transport table as the communicator uses it. Factories are added
// through the public registerTransport and build real transports (tcp over loopback).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport/registry.h"
#include "comm/transport/tcp_transport.h"
#include "common/errors.h"
#include "harness.h"
#include "store/store.h"

namespace hetra {
namespace {

using test::runRanks;

std::vector<comm::TransportRequest> requestsFor(int size, std::vector<std::string> hosts,
                                                const std::string& prefix) {
  auto shared =
      std::make_shared<store::PrefixStore>(prefix, std::make_shared<store::MemoryStore>());
  std::vector<comm::TransportRequest> requests(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    auto& request = requests[static_cast<size_t>(r)];
    request.store = shared;
    request.rank = r;
    request.size = size;
    request.hosts = hosts;
    request.timeout = Millis(20000);
    request.listenAddress = "127.0.0.1";
  }
  return requests;
}

// A factory named `name` that builds tcp transports (under its own prefix) and counts them.
comm::TransportFactory countingTcpFactory(const std::string& name, int priority, std::string whyNot,
                                          std::shared_ptr<std::atomic<int>> made) {
  return {name, priority, [whyNot](const comm::TransportRequest&) { return whyNot; },
          [name, made](const comm::TransportRequest& r) {
            ++*made;
            return comm::createTcpTransport(std::make_shared<store::PrefixStore>(name, r.store),
                                            r.rank, r.size, comm::TcpOptions{});
          }};
}

std::string configErrorOf(const std::string& choice, const comm::TransportRequest& request) {
  try {
    comm::connectTransport(choice, request);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "connectTransport(" << choice << ") did not throw ConfigError";
  return "";
}

TEST(TransportRegistry, BuiltinsAreListedHighestPriorityFirst) {
  const auto names = comm::transportNames();
  auto at = [&](const std::string& n) { return std::find(names.begin(), names.end(), n); };
  ASSERT_NE(at("shm"), names.end());
  ASSERT_NE(at("tcp"), names.end());
  EXPECT_LT(at("shm"), at("tcp"));
}

TEST(TransportRegistry, AutoPicksTheHighestPriorityFactoryThatCanConnect) {
  auto made = std::make_shared<std::atomic<int>>(0);
  comm::registerTransport(countingTcpFactory("loop-high", 1000, "", made));
  auto requests = requestsFor(2, {"a", "b"}, "high");
  std::vector<std::unique_ptr<comm::Transport>> transports(2);
  runRanks(2, [&](int r) {
    transports[size_t(r)] = comm::connectTransport("auto", requests[size_t(r)]);
  });
  EXPECT_EQ(made->load(), 2);
  // The chosen transport is usable: rank 1 sends distinct bytes to rank 0.
  std::vector<uint8_t> out{7, 1, 9, 4}, in(4, 0);
  runRanks(2, [&](int r) {
    if (r == 1)
      transports[1]->isend(0, 5, out.data(), out.size())->wait(deadlineAfter(Millis(20000)));
    else
      transports[0]->irecv(1, 5, in.data(), in.size())->wait(deadlineAfter(Millis(20000)));
  });
  EXPECT_EQ(in, out);
  // Replaced by a factory of the same name that cannot connect: auto passes it over (to shm or
  // tcp by the hosts; these differ, so shm refuses and tcp connects).
  comm::registerTransport(countingTcpFactory("loop-high", 1000, "never here", made));
  requests = requestsFor(2, {"a", "b"}, "fallback");
  runRanks(2, [&](int r) {
    transports[size_t(r)] = comm::connectTransport("auto", requests[size_t(r)]);
  });
  EXPECT_EQ(made->load(), 2);
  EXPECT_STREQ(transports[0]->name(), "tcp");
}

TEST(TransportRegistry, ForcedFactoryThatCannotConnectIsAConfigErrorSayingWhy) {
  auto made = std::make_shared<std::atomic<int>>(0);
  comm::registerTransport(countingTcpFactory("loop-refusing", 5, "the moon is not up", made));
  const auto requests = requestsFor(2, {"a", "b"}, "refuse");
  const std::string message = configErrorOf("loop-refusing", requests[0]);
  EXPECT_NE(message.find("loop-refusing"), std::string::npos) << message;
  EXPECT_NE(message.find("the moon is not up"), std::string::npos) << message;
  EXPECT_EQ(made->load(), 0);
  // The built-in shm refuses a group that spans hosts, and says so.
  const std::string shm = configErrorOf("shm", requests[0]);
  EXPECT_NE(shm.find("spans hosts"), std::string::npos) << shm;
}

TEST(TransportRegistry, UnknownNameListsTheRegisteredOnes) {
  const auto requests = requestsFor(1, {"a"}, "unknown");
  const std::string message = configErrorOf("carrier-pigeon", requests[0]);
  EXPECT_NE(message.find("carrier-pigeon"), std::string::npos) << message;
  for (const auto& name : comm::transportNames())
    EXPECT_NE(message.find(name), std::string::npos) << name << " missing from: " << message;
  EXPECT_NE(message.find("auto"), std::string::npos) << message;
}

TEST(TransportRegistry, NegativePriorityIsOnlyUsedWhenNamed) {
  auto made = std::make_shared<std::atomic<int>>(0);
  comm::registerTransport(countingTcpFactory("loop-forced-only", -5, "", made));
  auto requests = requestsFor(1, {"a"}, "forced");
  auto chosen = comm::connectTransport("auto", requests[0]);
  EXPECT_EQ(made->load(), 0);
  EXPECT_STREQ(chosen->name(), "shm");  // one host: shared memory
  requests = requestsFor(1, {"a"}, "forced2");
  chosen = comm::connectTransport("loop-forced-only", requests[0]);
  EXPECT_EQ(made->load(), 1);
  EXPECT_STREQ(chosen->name(), "tcp");
}

}  // namespace
}  // namespace hetra
