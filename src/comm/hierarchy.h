// Hierarchical collectives for groups whose ranks form islands (same host and vendor by default):
// each works inside the islands over their fast transport, across islands in parallel by
// corresponding ranks (over the slow transport, compressed where the operation's policy asks), and
// inside the islands again.
//
// Vocabulary:
//   island   the ranks joined by fast links; islands may differ in size. L: an island's size,
//            l: a rank's place in it, I: the number of islands, S: the largest island's size.
//   shard    the buffer is cut into S shards; in an island of L ranks, local rank l holds the
//            contiguous shards j with floor(j * L / S) = l. For each shard j the holders in every
//            island form one cross group, so a rank of a smaller island takes part in several cross
//            groups, whose operations run at once.
//   region   (reduce-scatter, allgather) the blocks of one island's ranks, in their local order.
//            Shard j of region k is part j of region k cut into S parts; the arrangement lists
//            these parts shard by shard: (j = 0, k = 0..I-1), (j = 1, k = 0..I-1), ... so that the
//            parts of one shard are contiguous (what a cross group exchanges) and a local rank's
//            shards are contiguous (what the island exchanges).
// Allreduce: reduce-scatter of the shards inside, allreduce of each shard across, allgather inside.
// Reduce-scatter: the arrangement reduce-scattered inside by shards, each shard reduce-scattered
// across by region (each island receives its region's part, fully reduced), the region allgathered
// inside, each rank keeping its block: the slow level carries (I-1)/I of the buffer, as a flat
// reduce-scatter would.
// Allgather: the region allgathered inside, each shard of every region allgathered across, the
// arrangement allgathered inside.
#pragma once

#include <memory>
#include <vector>

#include "comm/algorithms/args.h"
#include "comm/communicator.h"
#include "comm/link_cost.h"
#include "comm/policy.h"

namespace hetra::comm {

class Hierarchy {
 public:
  // Collective over every rank of `world`: islandOf[r] is rank r's island (0..islands-1, the
  // islands numbered in order of their lowest rank). `islandOptions` and `crossOptions` configure
  // the two levels' groups; the cost model's link costs come from `islandCost` and `crossCost`.
  Hierarchy(Communicator& world, const std::vector<int>& islandOf,
            const GroupOptions& islandOptions, const GroupOptions& crossOptions,
            LinkCost islandCost, LinkCost crossCost);

  // Blocking; called from the world group's own operation (its progress thread or waiter). op must
  // be Sum, Min or Max (the caller reduces Avg as Sum and divides). policy.compression applies
  // between islands, policy.islandCompression inside them.
  void allreduce(const AllreduceArgs& args, const OpPolicy& policy);
  void reduceScatter(const ReduceScatterArgs& args, const OpPolicy& policy);
  void allgather(const AllgatherArgs& args, const OpPolicy& policy);

  // Predicted seconds of this hierarchy's operation of `bytes` (the whole buffer), whose level
  // between islands carries `crossRatio` wire bytes per byte (1: exact).
  double seconds(OpKind kind, size_t bytes, double crossRatio) const;

  // Payload bytes of the island and cross groups.
  uint64_t bytesSent() const;
  uint64_t bytesReceived() const;

  int islands() const { return islandCount_; }
  int largestIsland() const { return shards_; }

 private:
  struct Segment;  // one part of the arrangement: shard j of region k
  std::vector<Segment> arrangement(const std::vector<size_t>& counts) const;
  void waitFor(const WorkPtr& work, Deadline deadline) const;

  std::shared_ptr<Communicator> island_;
  // cross_[j]: the group of shard j's holders (null where this rank holds no shard j).
  std::vector<std::shared_ptr<Communicator>> cross_;
  std::vector<int> islandOf_;
  int worldSize_ = 0;
  int worldRank_ = 0;
  int islandCount_ = 0;
  int shards_ = 0;      // S
  int islandSize_ = 0;  // L of this rank's island
  int localRank_ = 0;   // l
  int myIsland_ = 0;
  int firstShard_ = 0, endShard_ = 0;  // this rank's shards [first, end)
  std::vector<uint8_t> shard_;         // scratch between the phases
  std::vector<uint8_t> staging_;
  LinkCost islandCost_, crossCost_;
};

}  // namespace hetra::comm
