// Topology of a job: what each rank runs on, which ranks form islands, and what the links between
// ranks cost. It is data (NCCL's discipline): measured once by `hetra probe --links`, written to a
// JSON file, read back by a run's [topology] section, and turned into the hierarchy's inputs
// (GroupOptions::islands, islandLink, crossLink).
//
// Vocabulary:
//   island      ranks on one host (same host identity) with one device vendor, unless the user
//               groups them otherwise; numbered 0.. in order of each island's lowest rank.
//   link        an unordered pair of ranks {a, b}, a < b, with its measured cost.
//   latency     half the round trip of a small message (8 bytes) between the two ranks, median.
//   bandwidth   bytes of a large message (16 MiB) over half the round trip of a ping-pong of it
//               (one message each way), median; GB/s = 1e9 bytes per second.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace hetra::comm {

struct RankInfo {
  int rank = 0;
  std::string host;            // hostname
  std::string hostIdentity;    // hostIdentity(): hostname, boot id, IPC namespace
  std::string vendor = "cpu";  // cpu | nvidia | amd
  std::string deviceKind;      // CPU model or GPU name
  int island = 0;
};

struct LinkMeasurement {
  int a = 0, b = 0;  // ranks, a < b
  double latencyUs = 0;
  double bandwidthGBs = 0;
};

struct Topology {
  std::vector<RankInfo> ranks;         // index = rank
  std::vector<LinkMeasurement> links;  // sorted by (a, b); empty until measured
  // How the links were measured (recorded in the file, so numbers can be compared).
  size_t latencyBytes = 0;
  size_t bandwidthBytes = 0;

  int islandCount() const;
  // The measurement of {a, b} in either order, or nullptr.
  const LinkMeasurement* link(int a, int b) const;
};

// Every rank's host, vendor and device kind, gathered over `world` (collective: every rank calls
// it), with islands assigned by assignIslands.
Topology gatherTopology(Communicator& world, const std::string& vendor,
                        const std::string& deviceKind);

// Islands by (host identity, vendor), numbered in order of each island's lowest rank, as
// GroupOptions::islands left empty does.
void assignIslands(Topology& topology);

// The island of each rank, for GroupOptions::islands.
std::vector<int> islandsOf(const Topology& topology);

struct LinkOptions {
  size_t latencyBytes = 8;
  size_t bandwidthBytes = size_t(16) << 20;
  int latencyIters = 100;
  int bandwidthIters = 10;
  // A pair's series stops early when it would take longer than this (slow links): the number of
  // iterations follows from the first one's time, at least one.
  double secondsPerSeries = 2.0;
  // Options of the per-host groups: pairs on one host are measured over a group of that host's
  // ranks (shared memory under "auto"), as the hierarchy's island groups would carry them; pairs
  // across hosts over `world`.
  GroupOptions hostGroup;
};

// Measures every pair in turn, the other ranks idle (waiting at a barrier), and fills
// topology.links on every rank. Collective over `world`; `topology` must come from
// gatherTopology on the same group.
void measureLinks(Communicator& world, Topology& topology, const LinkOptions& options = {});

// The hierarchy's cost-model inputs as "LATENCY,BANDWIDTH" (comm::parseLinkCost's form): island
// from the pairs inside islands, cross from the pairs between islands. Each takes the worst pair
// (largest latency, smallest bandwidth): a ring runs at the pace of its slowest link. Empty where
// there is no such measured pair (then the HETRA_* defaults apply).
struct LinkCosts {
  std::string island;
  std::string cross;
};
LinkCosts linkCostsOf(const Topology& topology);

// JSON text of the topology (format "hetra-topology", version 1), and back. fromJson throws
// ConfigError naming `source` and the field when the text is not such a file.
std::string topologyToJson(const Topology& topology);
Topology topologyFromJson(const std::string& text, const std::string& source);
// The same through a file; IoError when it cannot be written, ConfigError when it cannot be read.
void writeTopology(const Topology& topology, const std::string& path);
Topology readTopology(const std::string& path);

// Text for people: one line per rank (host, vendor, island, device); the latency and bandwidth
// matrices (nccl-tests style, "-" on the diagonal and where unmeasured); the islands with their
// ranks and the derived link costs.
std::string formatRanks(const Topology& topology);
std::string formatLinkMatrices(const Topology& topology);
std::string formatIslandMap(const Topology& topology);

}  // namespace hetra::comm
