#include "comm/hierarchy.h"

#include <algorithm>
#include <cstring>

#include "comm/algorithms/p2p.h"
#include "common/errors.h"

namespace hetra::comm {
namespace {

// Shards held by local rank l of an island of L ranks, out of S: [first, end).
int firstShard(int l, int L, int S) {
  // The smallest j with floor(j * L / S) >= l.
  return (l * S + L - 1) / L;
}

// The policies of the island level and of the level between islands (no error feedback: the
// residual's shape is the whole buffer's, not a level's).
std::pair<OpPolicy, OpPolicy> levelPolicies(const OpPolicy& policy) {
  OpPolicy inside, across;
  inside.compression = policy.islandCompression;
  across.compression = policy.compression;
  return {inside, across};
}

}  // namespace

struct Hierarchy::Segment {
  int shard = 0;
  int island = 0;
  size_t regionOffset = 0;  // elements into the island's region
  size_t count = 0;
  size_t offset = 0;  // elements into the arrangement
};

Hierarchy::Hierarchy(Communicator& world, const std::vector<int>& islandOf,
                     const GroupOptions& islandOptions, const GroupOptions& crossOptions,
                     LinkCost islandCost, LinkCost crossCost)
    : islandOf_(islandOf),
      worldSize_(world.size()),
      worldRank_(world.rank()),
      islandCost_(islandCost),
      crossCost_(crossCost) {
  HETRA_ENFORCE_EQ(islandOf.size(), size_t(worldSize_), "one island per rank");
  const int me = worldRank_;
  islandCount_ = *std::max_element(islandOf.begin(), islandOf.end()) + 1;
  std::vector<int> sizes(islandCount_, 0);
  for (int island : islandOf) ++sizes[island];
  shards_ = *std::max_element(sizes.begin(), sizes.end());
  myIsland_ = islandOf[me];
  islandSize_ = sizes[myIsland_];
  for (int r = 0; r < me; ++r) localRank_ += islandOf[r] == myIsland_;

  island_ = world.split(myIsland_, me, islandOptions);
  // One cross group per shard, its ranks in island order; every rank calls split for every shard,
  // in the same order.
  cross_.resize(shards_);
  firstShard_ = firstShard(localRank_, islandSize_, shards_);
  endShard_ = firstShard(localRank_ + 1, islandSize_, shards_);
  for (int j = 0; j < shards_; ++j)
    cross_[j] = world.split(j >= firstShard_ && j < endShard_ ? j : -1, myIsland_, crossOptions);
}

void Hierarchy::waitFor(const WorkPtr& work, Deadline deadline) const {
  work->wait(deadline);
}

void Hierarchy::allreduce(const AllreduceArgs& args, const OpPolicy& policy) {
  HETRA_ENFORCE(args.op != ReduceOp::Avg, "the hierarchy reduces avg as sum");
  const size_t es = dtypeSize(args.dtype);
  const std::vector<size_t> shardCounts = evenSplit(args.count, shards_);
  std::vector<size_t> islandCounts(islandSize_, 0);
  for (int j = 0; j < shards_; ++j)
    islandCounts[size_t(j) * islandSize_ / shards_] += shardCounts[j];
  const size_t mine = islandCounts[localRank_];
  shard_.resize(std::max<size_t>(1, mine * es));
  const auto [inside, across] = levelPolicies(policy);

  waitFor(island_->reduceScatter(args.in, shard_.data(), islandCounts, args.dtype, args.op, inside),
          args.deadline);
  std::vector<WorkPtr> works;
  size_t offset = 0;
  for (int j = firstShard_; j < endShard_; ++j) {
    uint8_t* piece = shard_.data() + offset * es;
    works.push_back(
        cross_[j]->allreduce(piece, piece, shardCounts[j], args.dtype, args.op, across));
    offset += shardCounts[j];
  }
  for (auto& work : works) waitFor(work, args.deadline);
  waitFor(island_->allgather(shard_.data(), args.out, islandCounts, args.dtype, inside),
          args.deadline);
}

// The arrangement of `counts` (one per world rank): shard j of region k for j = 0..S-1, k =
// 0..I-1.
std::vector<Hierarchy::Segment> Hierarchy::arrangement(const std::vector<size_t>& counts) const {
  std::vector<size_t> regionSize(islandCount_, 0);
  for (int r = 0; r < worldSize_; ++r) regionSize[islandOf_[r]] += counts[r];
  std::vector<std::vector<size_t>> parts(islandCount_);
  for (int k = 0; k < islandCount_; ++k) parts[k] = evenSplit(regionSize[k], shards_);
  std::vector<size_t> regionOffset(islandCount_, 0);
  std::vector<Segment> segments;
  size_t offset = 0;
  for (int j = 0; j < shards_; ++j)
    for (int k = 0; k < islandCount_; ++k) {
      segments.push_back({j, k, regionOffset[k], parts[k][j], offset});
      regionOffset[k] += parts[k][j];
      offset += parts[k][j];
    }
  return segments;
}

namespace {

// Where each world rank's block starts in a buffer laid out in world-rank order, and in its
// island's region.
struct BlockMap {
  std::vector<size_t> worldOffset, regionOffset;

  BlockMap(const std::vector<size_t>& counts, const std::vector<int>& islandOf) {
    const int n = int(counts.size());
    worldOffset.resize(n);
    regionOffset.resize(n);
    std::vector<size_t> regionFill(*std::max_element(islandOf.begin(), islandOf.end()) + 1, 0);
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      worldOffset[r] = at;
      at += counts[r];
      regionOffset[r] = regionFill[islandOf[r]];
      regionFill[islandOf[r]] += counts[r];
    }
  }
};

// Copies region k's elements [from, from + count) from `src` to `dst`: out of a buffer in
// world-rank order into a contiguous one (gather), or back (scatter), walking the blocks of island
// k's ranks.
enum class Direction { Gather, Scatter };
void copyRegionRange(const std::vector<size_t>& counts, const std::vector<int>& islandOf,
                     const BlockMap& map, int island, size_t from, size_t count, size_t es,
                     const uint8_t* src, uint8_t* dst, Direction direction) {
  for (int r = 0; r < int(counts.size()) && count > 0; ++r) {
    if (islandOf[r] != island) continue;
    const size_t begin = map.regionOffset[r], end = begin + counts[r];
    if (end <= from || begin >= from + count) continue;
    const size_t lo = std::max(begin, from), hi = std::min(end, from + count);
    const size_t world = (map.worldOffset[r] + (lo - begin)) * es, contiguous = (lo - from) * es;
    if (direction == Direction::Gather)
      std::memcpy(dst + contiguous, src + world, (hi - lo) * es);
    else
      std::memcpy(dst + world, src + contiguous, (hi - lo) * es);
  }
}

}  // namespace

void Hierarchy::reduceScatter(const ReduceScatterArgs& args, const OpPolicy& policy) {
  HETRA_ENFORCE(args.op != ReduceOp::Avg, "the hierarchy reduces avg as sum");
  const size_t es = dtypeSize(args.dtype);
  const std::vector<Segment> segments = arrangement(args.counts);
  const BlockMap map(args.counts, islandOf_);
  const size_t total = totalCount(args.counts);
  const auto [inside, across] = levelPolicies(policy);

  // The input in arrangement order.
  staging_.resize(std::max<size_t>(1, total * es));
  for (const Segment& s : segments)
    copyRegionRange(args.counts, islandOf_, map, s.island, s.regionOffset, s.count, es,
                    static_cast<const uint8_t*>(args.in), staging_.data() + s.offset * es,
                    Direction::Gather);

  // Inside: local rank l reduces its shards of every region.
  std::vector<size_t> islandCounts(islandSize_, 0);
  for (const Segment& s : segments)
    islandCounts[size_t(s.shard) * islandSize_ / shards_] += s.count;
  shard_.resize(std::max<size_t>(1, islandCounts[localRank_] * es));
  waitFor(island_->reduceScatter(staging_.data(), shard_.data(), islandCounts, args.dtype, args.op,
                                 inside),
          args.deadline);

  // Across: each shard's parts go to their regions' islands, fully reduced. The received parts of
  // this rank's shards follow one another in its region.
  std::vector<size_t> regionCounts(islandSize_, 0);  // what each local rank ends up holding
  for (const Segment& s : segments)
    if (s.island == myIsland_) regionCounts[size_t(s.shard) * islandSize_ / shards_] += s.count;
  std::vector<uint8_t> reduced(std::max<size_t>(1, regionCounts[localRank_] * es));
  std::vector<WorkPtr> works;
  size_t inOffset = 0, outOffset = 0;
  for (int j = firstShard_; j < endShard_; ++j) {
    std::vector<size_t> byIsland(islandCount_);
    for (int k = 0; k < islandCount_; ++k) byIsland[k] = segments[j * islandCount_ + k].count;
    works.push_back(cross_[j]->reduceScatter(shard_.data() + inOffset * es,
                                             reduced.data() + outOffset * es, byIsland, args.dtype,
                                             args.op, across));
    inOffset += totalCount(byIsland);
    outOffset += byIsland[myIsland_];
  }
  for (auto& work : works) waitFor(work, args.deadline);

  // Inside again: the reduced region to every rank of the island, each keeping its own block.
  const size_t regionSize = totalCount(regionCounts);
  staging_.resize(std::max<size_t>(1, regionSize * es));
  waitFor(island_->allgather(reduced.data(), staging_.data(), regionCounts, args.dtype, inside),
          args.deadline);
  std::memcpy(args.out, staging_.data() + map.regionOffset[worldRank_] * es,
              args.counts[worldRank_] * es);
}

void Hierarchy::allgather(const AllgatherArgs& args, const OpPolicy& policy) {
  const size_t es = dtypeSize(args.dtype);
  const std::vector<Segment> segments = arrangement(args.counts);
  const BlockMap map(args.counts, islandOf_);
  const size_t total = totalCount(args.counts);
  const auto [inside, across] = levelPolicies(policy);

  // Inside: the island's region (its ranks' blocks in local order) to every rank of it.
  std::vector<size_t> memberCounts;
  for (int r = 0; r < worldSize_; ++r)
    if (islandOf_[r] == myIsland_) memberCounts.push_back(args.counts[r]);
  std::vector<uint8_t> region(std::max<size_t>(1, totalCount(memberCounts) * es));
  waitFor(island_->allgather(args.in, region.data(), memberCounts, args.dtype, inside),
          args.deadline);

  // Across: for each of this rank's shards, that part of every region, into the arrangement.
  staging_.resize(std::max<size_t>(1, total * es));
  std::vector<WorkPtr> works;
  for (int j = firstShard_; j < endShard_; ++j) {
    std::vector<size_t> byIsland(islandCount_);
    for (int k = 0; k < islandCount_; ++k) byIsland[k] = segments[j * islandCount_ + k].count;
    const Segment& mine = segments[j * islandCount_ + myIsland_];
    works.push_back(cross_[j]->allgather(region.data() + mine.regionOffset * es,
                                         staging_.data() + segments[j * islandCount_].offset * es,
                                         byIsland, args.dtype, across));
  }
  for (auto& work : works) waitFor(work, args.deadline);

  // Inside again: every rank's shards of the arrangement (in place), then back to rank order.
  std::vector<size_t> islandCounts(islandSize_, 0);
  for (const Segment& s : segments)
    islandCounts[size_t(s.shard) * islandSize_ / shards_] += s.count;
  const size_t myFirst = firstShard_ < shards_ ? segments[firstShard_ * islandCount_].offset : 0;
  waitFor(island_->allgather(staging_.data() + myFirst * es, staging_.data(), islandCounts,
                             args.dtype, inside),
          args.deadline);
  for (const Segment& s : segments)
    copyRegionRange(args.counts, islandOf_, map, s.island, s.regionOffset, s.count, es,
                    staging_.data() + s.offset * es, static_cast<uint8_t*>(args.out),
                    Direction::Scatter);
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

double Hierarchy::seconds(OpKind kind, size_t size, double crossRatio) const {
  const double S = shards_, I = islandCount_, bytes = double(size);
  // Inside: a reduce-scatter or allgather over the largest island moves (S-1)/S of what it works
  // on. Across: every island's link carries its share of (I-1)/I of the buffer per phase, encoded.
  auto inside = [&](double b) { return islandCost_.seconds(S - 1, (S - 1) / S * b); };
  auto across = [&](double phases) {
    return crossCost_.seconds(phases * (I - 1), phases * (I - 1) / I * bytes * crossRatio);
  };
  switch (kind) {
    case OpKind::Allreduce:
      return 2 * inside(bytes) + across(2);
    case OpKind::ReduceScatter:
    case OpKind::Allgather:
      return inside(bytes) + across(1) + inside(bytes / I);
    default:
      return 0;
  }
}

}  // namespace hetra::comm
