// The topology: gathering every rank's host and vendor into islands, measuring the links between
// ranks, the JSON file written and read back, and the hierarchy's cost-model inputs derived from
// it (and used by the hierarchy through GroupOptions).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "comm/communicator.h"
#include "comm/hierarchy.h"
#include "comm/topology.h"
#include "common/errors.h"
#include "harness.h"

namespace hetra::comm {
namespace {

using test::runRanks;

GroupOptions quick() {
  GroupOptions o;
  o.timeout = Millis(20000);
  return o;
}

TEST(Topology, GatherGroupsRanksOfOneHostByVendorNumberedByLowestRank) {
  // Rank 0 is nvidia, so the nvidia island is island 0 and the cpu island island 1.
  const std::vector<std::string> vendors = {"nvidia", "cpu", "cpu", "nvidia", "amd"};
  const int n = int(vendors.size());
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<Topology> seen(n);
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, quick());
    seen[r] =
        gatherTopology(*comm, vendors[r], str("device of rank ", r, " ", std::string(r, 'x')));
  });
  for (int r = 0; r < n; ++r) {
    const Topology& t = seen[r];
    ASSERT_EQ(t.ranks.size(), size_t(n)) << "on rank " << r;
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(t.ranks[q].rank, q);
      EXPECT_EQ(t.ranks[q].vendor, vendors[q]);
      EXPECT_EQ(t.ranks[q].deviceKind, str("device of rank ", q, " ", std::string(q, 'x')));
      EXPECT_EQ(t.ranks[q].hostIdentity, hostIdentity());
      EXPECT_FALSE(t.ranks[q].host.empty());
    }
    EXPECT_EQ(islandsOf(t), (std::vector<int>{0, 1, 1, 0, 2}));
    EXPECT_EQ(t.islandCount(), 3);
    EXPECT_TRUE(t.links.empty());
  }
}

TEST(Topology, GatherRefusesAnUnknownVendor) {
  const int n = 3;
  auto store = std::make_shared<store::MemoryStore>();
  auto errors = test::runRanksCollect(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, quick());
    gatherTopology(*comm, "intel", "x");
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    EXPECT_THROW(std::rethrow_exception(errors[r]), ConfigError);
  }
}

Topology handMade() {
  // Hosts A (ranks 0, 1, 4: two vendors) and B (ranks 2, 3).
  Topology t;
  const char* hosts[] = {"A", "A", "B", "B", "A"};
  const char* vendors[] = {"cpu", "cpu", "nvidia", "nvidia", "amd"};
  for (int r = 0; r < 5; ++r)
    t.ranks.push_back({r, hosts[r], str(hosts[r], "/boot/ipc"), vendors[r], str("kind", r), -1});
  assignIslands(t);
  return t;
}

TEST(Topology, IslandsAreHostAndVendor) {
  const Topology t = handMade();
  EXPECT_EQ(islandsOf(t), (std::vector<int>{0, 0, 1, 1, 2}));
  EXPECT_EQ(t.islandCount(), 3);
  Topology same = t;
  same.ranks[4].vendor = "cpu";
  assignIslands(same);
  EXPECT_EQ(islandsOf(same), (std::vector<int>{0, 0, 1, 1, 0}));
}

TEST(Topology, LinkCostsAreTheWorstPairInsideAndAcrossIslands) {
  Topology t = handMade();  // islands {0, 0, 1, 1, 2}
  t.links = {{0, 1, 3.0, 10.0},  {2, 3, 4.5, 7.25}, {0, 2, 40.0, 1.2},   {1, 3, 61.5, 1.1},
             {0, 4, 9.0, 2.5},   {1, 4, 8.0, 2.75}, {2, 4, 55.0, 0.875}, {3, 4, 50.0, 1.3},
             {0, 3, 45.0, 1.15}, {1, 2, 44.0, 1.25}};
  const LinkCosts costs = linkCostsOf(t);
  const LinkCost island = parseLinkCost(costs.island), cross = parseLinkCost(costs.cross);
  EXPECT_DOUBLE_EQ(island.latencySeconds, 4.5e-6) << costs.island;
  EXPECT_DOUBLE_EQ(island.bytesPerSecond, 7.25e9) << costs.island;
  EXPECT_DOUBLE_EQ(cross.latencySeconds, 61.5e-6) << costs.cross;
  EXPECT_DOUBLE_EQ(cross.bytesPerSecond, 0.875e9) << costs.cross;

  // No pair inside an island (every island one rank): no island cost; one island: no cross cost.
  Topology singles = t;
  for (int r = 0; r < 5; ++r) singles.ranks[r].island = r;
  EXPECT_EQ(linkCostsOf(singles).island, "");
  EXPECT_FALSE(linkCostsOf(singles).cross.empty());
  Topology one = t;
  for (auto& r : one.ranks) r.island = 0;
  EXPECT_EQ(linkCostsOf(one).cross, "");
  EXPECT_EQ(parseLinkCost(linkCostsOf(one).island).bytesPerSecond, 0.875e9);
  EXPECT_EQ(linkCostsOf(Topology{}).island, "");
}

TEST(Topology, JsonRoundTripThroughAFile) {
  Topology t = handMade();
  t.links = {{0, 1, 3.25, 10.5}, {1, 4, 7.0, 0.001}, {2, 3, 123.456, 2.5}};
  t.latencyBytes = 8;
  t.bandwidthBytes = 12345;
  t.ranks[3].deviceKind = "NVIDIA H200 \"quoted\" \\ name";
  const std::string path = str(::testing::TempDir(), "topology_", getpid(), ".json");
  writeTopology(t, path);
  const Topology back = readTopology(path);
  std::remove(path.c_str());
  ASSERT_EQ(back.ranks.size(), t.ranks.size());
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    EXPECT_EQ(back.ranks[r].rank, t.ranks[r].rank);
    EXPECT_EQ(back.ranks[r].host, t.ranks[r].host);
    EXPECT_EQ(back.ranks[r].hostIdentity, t.ranks[r].hostIdentity);
    EXPECT_EQ(back.ranks[r].vendor, t.ranks[r].vendor);
    EXPECT_EQ(back.ranks[r].deviceKind, t.ranks[r].deviceKind);
    EXPECT_EQ(back.ranks[r].island, t.ranks[r].island);
  }
  ASSERT_EQ(back.links.size(), t.links.size());
  for (size_t i = 0; i < t.links.size(); ++i) {
    EXPECT_EQ(back.links[i].a, t.links[i].a);
    EXPECT_EQ(back.links[i].b, t.links[i].b);
    EXPECT_EQ(back.links[i].latencyUs, t.links[i].latencyUs);
    EXPECT_EQ(back.links[i].bandwidthGBs, t.links[i].bandwidthGBs);
  }
  EXPECT_EQ(back.latencyBytes, 8u);
  EXPECT_EQ(back.bandwidthBytes, 12345u);
  EXPECT_EQ(islandsOf(back), islandsOf(t));
  EXPECT_EQ(linkCostsOf(back).cross, linkCostsOf(t).cross);
  // Text for people names every rank's device and every island.
  EXPECT_NE(formatRanks(back).find("NVIDIA H200"), std::string::npos);
  const std::string map = formatIslandMap(back);
  EXPECT_NE(map.find("island 2: host A, vendor amd, ranks 4"), std::string::npos) << map;
  const std::string matrices = formatLinkMatrices(back);
  EXPECT_NE(matrices.find(" 123.5 "), std::string::npos) << matrices;
  EXPECT_THROW(readTopology(path), ConfigError);  // removed
}

TEST(Topology, ReadingRefusesFilesThatAreNotTopologies) {
  const std::string good = topologyToJson([] {
    Topology t = handMade();
    t.links = {{0, 1, 3.0, 10.0}};
    return t;
  }());
  EXPECT_NO_THROW(topologyFromJson(good, "t.json"));
  auto refused = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at == std::string::npos) return std::string("(not found)");
    text.replace(at, from.size(), to);
    try {
      topologyFromJson(text, "t.json");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(refused("\"hetra-topology\"", "\"other\"").find("not a topology file"),
            std::string::npos);
  EXPECT_NE(refused("\"version\": 1", "\"version\": 2").find("version 2"), std::string::npos);
  EXPECT_NE(refused("\"rank\": 1", "\"rank\": 7").find("ranks[1].rank = 7"), std::string::npos);
  EXPECT_NE(refused("\"vendor\": \"amd\"", "\"vendor\": \"intel\"").find("ranks[4].vendor"),
            std::string::npos);
  EXPECT_NE(refused("\"island\": 2", "\"island\": -1").find("ranks[4].island = -1"),
            std::string::npos);
  EXPECT_NE(refused("\"b\": 1", "\"b\": 0").find("links[0]"), std::string::npos);
  EXPECT_NE(refused("\"b\": 1", "\"b\": 5").find("links[0]"), std::string::npos);
  EXPECT_NE(refused("\"bandwidth_gbs\": 10.0", "\"bandwidth_gbs\": 0").find("> 0"),
            std::string::npos);
  EXPECT_NE(refused("\"host\": \"B\"", "\"host\": 3").find("wrong type"), std::string::npos);
  EXPECT_NE(refused("{", "[").find("not"), std::string::npos);
  EXPECT_THROW(topologyFromJson("", "t.json"), ConfigError);
}

TEST(Topology, MeasuredLinksArePositiveFiniteAndAgreedOnEveryRank) {
  const int n = 3;
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<Topology> seen(n);
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, quick());
    Topology t = gatherTopology(*comm, "cpu", "cpu");
    LinkOptions o;
    o.bandwidthBytes = (size_t(4) << 20) + 3;
    o.latencyIters = 15;
    o.bandwidthIters = 5;
    o.secondsPerSeries = 0.5;
    measureLinks(*comm, t, o);
    seen[r] = t;
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(seen[r].links.size(), size_t(n * (n - 1) / 2)) << "rank " << r;
    EXPECT_EQ(seen[r].latencyBytes, 8u);
    EXPECT_EQ(seen[r].bandwidthBytes, (size_t(4) << 20) + 3);
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        const LinkMeasurement* l = seen[r].link(b, a);
        ASSERT_NE(l, nullptr) << a << "-" << b;
        EXPECT_TRUE(std::isfinite(l->latencyUs) && l->latencyUs > 0) << l->latencyUs;
        EXPECT_TRUE(std::isfinite(l->bandwidthGBs) && l->bandwidthGBs > 0) << l->bandwidthGBs;
        const LinkMeasurement* first = seen[0].link(a, b);
        EXPECT_EQ(l->latencyUs, first->latencyUs);
        EXPECT_EQ(l->bandwidthGBs, first->bandwidthGBs);
      }
  }
}

TEST(Topology, MeasuresPairsOfOneHostOverThatHostsGroup) {
  // Two pretend hosts: pairs on one go over a split group of its ranks, the others over world.
  const int n = 3;
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<Topology> seen(n);
  std::vector<uint64_t> worldSent(n);
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, quick());
    Topology t = gatherTopology(*comm, "cpu", "cpu");
    t.ranks[0].hostIdentity = t.ranks[2].hostIdentity = "host-x";
    t.ranks[1].hostIdentity = "host-y";
    assignIslands(t);
    LinkOptions o;
    o.bandwidthBytes = 65537;
    o.latencyIters = 9;
    o.bandwidthIters = 3;
    o.hostGroup = quick();
    const uint64_t worldBytes = comm->bytesSent();
    measureLinks(*comm, t, o);
    // Rank 1 measured both of its pairs over world; ranks 0 and 2 their own pair elsewhere, so
    // they put fewer bytes on world than rank 1 did.
    seen[r] = t;
    worldSent[r] = comm->bytesSent() - worldBytes;
  });
  EXPECT_EQ(islandsOf(seen[0]), (std::vector<int>{0, 1, 0}));
  for (int r = 0; r < n; ++r) ASSERT_EQ(seen[r].links.size(), 3u);
  // Each pair's series moves at least 2 x (warm-up + 1) x 65537 bytes per side.
  EXPECT_GE(worldSent[1], uint64_t(2) * 2 * 65537);
  EXPECT_LT(worldSent[0], worldSent[1]);
  EXPECT_LT(worldSent[2], worldSent[1]);
}

// Measured link costs (the [topology] keys a probe writes) decide between the flat ring and the
// hierarchy: islands slower than the links between them make the hierarchy the worse choice.
TEST(Topology, MeasuredCostsDriveTheHierarchysCostModel) {
  const int n = 4;
  struct Case {
    std::string islandLink, crossLink, expected;
  };
  for (const Case& c : {Case{"200us,0.05GB/s", "5us,10GB/s", "ring"},
                        Case{"2us,20GB/s", "100us,0.1GB/s", "hierarchical"}}) {
    auto store = std::make_shared<store::MemoryStore>();
    runRanks(n, [&](int r) {
      GroupOptions options = quick();
      options.transport = "tcp";
      options.islands = {0, 0, 1, 1};
      options.islandLink = c.islandLink;
      options.crossLink = c.crossLink;
      auto comm = Communicator::create(store, r, n, options);
      EXPECT_EQ(comm->providerFor(OpKind::Allreduce, DType::F32, ReduceOp::Sum, 16 << 20),
                c.expected)
          << c.islandLink << " inside, " << c.crossLink << " across";
    });
  }
  auto store = std::make_shared<store::MemoryStore>();
  GroupOptions bad = quick();
  bad.crossLink = "fast";
  EXPECT_THROW(Communicator::create(store, 0, 1, bad), ConfigError);
}

}  // namespace
}  // namespace hetra::comm
