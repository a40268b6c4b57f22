// Hierarchical allreduce for groups whose ranks form islands (same host and vendor by default):
// reduce-scatter inside each island over its fast transport, allreduce of the shards across
// islands in parallel by corresponding ranks (over the slow transport, compressed if the group
// asks), allgather inside each island.
//
// Islands may differ in size. The buffer is cut into S shards, S the largest island's size; in an
// island of L ranks, local rank l holds the contiguous shards j with floor(j * L / S) = l. For
// each shard j the holders in every island form one cross group, so a rank of a smaller island
// takes part in several cross groups, whose allreduces run at once.
#pragma once

#include <memory>
#include <vector>

#include "comm/algorithms/args.h"
#include "comm/communicator.h"

namespace hetra::comm {

// Latency and bandwidth of one level of the hierarchy: the cost model's inputs.
struct LinkCost {
  double latencySeconds = 0;
  double bytesPerSecond = 0;
};

class Hierarchy {
 public:
  // Collective over every rank of `world`: islandOf[r] is rank r's island (0..islands-1, the
  // islands numbered in order of their lowest rank). `islandOptions` and `crossOptions` configure
  // the two levels' groups.
  Hierarchy(Communicator& world, const std::vector<int>& islandOf,
            const GroupOptions& islandOptions, const GroupOptions& crossOptions);

  // Blocking; called from the world group's own operation (its progress thread or waiter). op must
  // be Sum, Min or Max (the caller reduces Avg as Sum and divides).
  void allreduce(const AllreduceArgs& args);

  // Predicted seconds of a flat ring and of this hierarchy for `bytes`, from the levels' costs
  // (GroupOptions::islandLink and crossLink of the cross options, else HETRA_ISLAND_LINK and
  // HETRA_CROSS_LINK, read at construction) and the cross level's compression ratio.
  double flatSeconds(size_t bytes) const;
  double hierarchicalSeconds(size_t bytes) const;

  // Payload bytes of the island and cross groups.
  uint64_t bytesSent() const;
  uint64_t bytesReceived() const;

  int islands() const { return islandCount_; }
  int largestIsland() const { return shards_; }

 private:
  std::shared_ptr<Communicator> island_;
  // cross_[j]: the group of shard j's holders (null where this rank holds no shard j).
  std::vector<std::shared_ptr<Communicator>> cross_;
  int worldSize_ = 0;
  int islandCount_ = 0;
  int shards_ = 0;              // S
  int islandSize_ = 0;          // L of this rank's island
  int localRank_ = 0;           // l
  double crossRatio_ = 1;       // wire bytes per float32 byte on the cross level
  std::vector<uint8_t> shard_;  // this rank's reduced shards between the phases
  // The cost model's levels, parsed once (flatSeconds runs before every allreduce).
  LinkCost islandCost_, crossCost_;
};

// Parses "LATENCY,BANDWIDTH" such as "5us,5GB/s" or "50us,1gbit"; throws ConfigError naming it.
LinkCost parseLinkCost(const std::string& text);

}  // namespace hetra::comm
