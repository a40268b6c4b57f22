#include "comm/hierarchy.h"

#include <algorithm>
#include <cctype>

#include "comm/algorithms/p2p.h"
#include "common/errors.h"
#include "common/params.h"
#include "common/units.h"

namespace hetra::comm {
namespace {

const Param kIslandLink("HETRA_ISLAND_LINK", "5us,5GB/s",
                        "Latency and bandwidth inside an island (the hierarchical allreduce's cost "
                        "model), e.g. \"5us,5GB/s\"; `hetra probe --links` measures them.");
const Param kCrossLink("HETRA_CROSS_LINK", "50us,1.25GB/s",
                       "Latency and bandwidth between islands (the hierarchical allreduce's cost "
                       "model), e.g. \"50us,1gbit\".");

// Shards held by local rank l of an island of L ranks, out of S: [first, end).
int firstShard(int l, int L, int S) {
  // The smallest j with floor(j * L / S) >= l.
  return (l * S + L - 1) / L;
}

double remainingMillis(Deadline deadline) {
  return std::max(0.0, std::chrono::duration<double, std::milli>(deadline - Clock::now()).count());
}

}  // namespace

LinkCost parseLinkCost(const std::string& text) {
  const size_t comma = text.find(',');
  if (comma == std::string::npos)
    throw ConfigError(str("link cost '", text,
                          "' is not understood; use LATENCY,BANDWIDTH such as \"5us,5GB/s\""));
  LinkCost cost;
  cost.latencySeconds = parseSeconds(text.substr(0, comma), "latency");
  cost.bytesPerSecond = parseRate(text.substr(comma + 1), "bandwidth", RateUnit::kRequired);
  if (cost.bytesPerSecond <= 0)
    throw ConfigError(str("link cost '", text, "': the bandwidth must be above 0"));
  return cost;
}

Hierarchy::Hierarchy(Communicator& world, const std::vector<int>& islandOf,
                     const GroupOptions& islandOptions, const GroupOptions& crossOptions)
    : worldSize_(world.size()) {
  HETRA_ENFORCE_EQ(islandOf.size(), size_t(worldSize_), "one island per rank");
  // Parsed before any group forms: a bad cost string fails on every rank alike, at once.
  islandCost_ =
      parseLinkCost(crossOptions.islandLink.empty() ? kIslandLink.str() : crossOptions.islandLink);
  crossCost_ =
      parseLinkCost(crossOptions.crossLink.empty() ? kCrossLink.str() : crossOptions.crossLink);
  const int me = world.rank();
  islandCount_ = *std::max_element(islandOf.begin(), islandOf.end()) + 1;
  std::vector<int> sizes(islandCount_, 0);
  for (int island : islandOf) ++sizes[island];
  shards_ = *std::max_element(sizes.begin(), sizes.end());
  islandSize_ = sizes[islandOf[me]];
  for (int r = 0; r < me; ++r) localRank_ += islandOf[r] == islandOf[me];

  island_ = world.split(islandOf[me], me, islandOptions);
  // One cross group per shard; every rank calls split for every shard, in the same order.
  cross_.resize(shards_);
  const int first = firstShard(localRank_, islandSize_, shards_);
  const int end = firstShard(localRank_ + 1, islandSize_, shards_);
  for (int j = 0; j < shards_; ++j)
    cross_[j] = world.split(j >= first && j < end ? j : -1, islandOf[me], crossOptions);

  if (crossOptions.compression != Compression::None) {
    const size_t probe = size_t(1) << 20;
    crossRatio_ = double(makeCodec(crossOptions.compression, crossOptions.compressionBlock)
                             ->encodedBytes(probe)) /
                  double(probe * sizeof(float));
  }
}

void Hierarchy::allreduce(const AllreduceArgs& args) {
  HETRA_ENFORCE(args.op != ReduceOp::Avg, "the hierarchy reduces avg as sum");
  const size_t es = dtypeSize(args.dtype);
  const std::vector<size_t> shardCounts = evenSplit(args.count, shards_);
  std::vector<size_t> islandCounts(islandSize_, 0);
  for (int j = 0; j < shards_; ++j)
    islandCounts[size_t(j) * islandSize_ / shards_] += shardCounts[j];
  const size_t mine = islandCounts[localRank_];
  shard_.resize(std::max<size_t>(1, mine * es));
  auto wait = [&](const WorkPtr& work) {
    work->wait(Millis(int64_t(remainingMillis(args.deadline)) + 1));
  };

  wait(island_->reduceScatter(args.in, shard_.data(), islandCounts, args.dtype, args.op));
  std::vector<WorkPtr> works;
  size_t offset = 0;
  for (int j = firstShard(localRank_, islandSize_, shards_);
       j < firstShard(localRank_ + 1, islandSize_, shards_); ++j) {
    uint8_t* piece = shard_.data() + offset * es;
    works.push_back(cross_[j]->allreduce(piece, piece, shardCounts[j], args.dtype, args.op));
    offset += shardCounts[j];
  }
  for (auto& work : works) wait(work);
  wait(island_->allgather(shard_.data(), args.out, islandCounts, args.dtype));
}

uint64_t Hierarchy::bytesSent() const {
  uint64_t total = island_->bytesSent();
  for (const auto& cross : cross_)
    if (cross) total += cross->bytesSent();
  return total;
}

uint64_t Hierarchy::bytesReceived() const {
  uint64_t total = island_->bytesReceived();
  for (const auto& cross : cross_)
    if (cross) total += cross->bytesReceived();
  return total;
}

double Hierarchy::flatSeconds(size_t bytes) const {
  const LinkCost& cross = crossCost_;
  const double n = worldSize_;
  return 2 * (n - 1) * cross.latencySeconds +
         2 * (n - 1) / n * double(bytes) / cross.bytesPerSecond;
}

double Hierarchy::hierarchicalSeconds(size_t bytes) const {
  const LinkCost &island = islandCost_, &cross = crossCost_;
  const double S = shards_, I = islandCount_;
  // Inside: reduce-scatter plus allgather over the largest island. Across: every island's link
  // carries all its ranks' shards, 2 (I-1)/I of the buffer in all, encoded.
  return 2 * (S - 1) * island.latencySeconds +
         2 * (S - 1) / S * double(bytes) / island.bytesPerSecond +
         2 * (I - 1) * cross.latencySeconds +
         2 * (I - 1) / I * double(bytes) * crossRatio_ / cross.bytesPerSecond;
}

}  // namespace hetra::comm
