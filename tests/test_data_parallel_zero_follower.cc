// ZeRO's shards that follow measured speed (train/shard_follower.h): the water-filled sizes and
// when the follower proposes a move. The move itself, and a run that makes it, are in
// test_data_parallel_zero.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "train/shard_follower.h"
#include "train/zero_layout.h"

namespace hetra::train {
namespace {

int64_t sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t(0));
}

// The slowest rank's update: what the shards are sized to shorten.
double slowestUpdate(const std::vector<int64_t>& sizes, const std::vector<double>& perElement) {
  double slowest = 0;
  for (size_t r = 0; r < sizes.size(); ++r)
    slowest = std::max(slowest, double(sizes[r]) * perElement[r]);
  return slowest;
}

TEST(SpeedShards, UnboundedShardsAreInverseToTheSecondsPerElement) {
  const std::vector<double> perElement = {1e-9, 2e-9, 4e-9};  // speeds 1, 1/2, 1/4
  const auto sizes = speedShards(70000, perElement, std::vector<int64_t>(3, kUnboundedShard));
  ASSERT_TRUE(sizes.has_value());
  EXPECT_EQ(sum(*sizes), 70000);
  // 4/7, 2/7 and 1/7 of 70000, each boundary rounded to kShardAlign.
  const std::vector<double> exact = {40000, 20000, 10000};
  for (size_t r = 0; r < 3; ++r)
    EXPECT_NEAR(double((*sizes)[r]), exact[r], double(kShardAlign)) << "rank " << r;
  EXPECT_EQ((*sizes)[0] % kShardAlign, 0);
  EXPECT_EQ(((*sizes)[0] + (*sizes)[1]) % kShardAlign, 0);
  // Equal updates: 40000 ns each, give or take one alignment of the slowest.
  EXPECT_NEAR(slowestUpdate(*sizes, perElement), 40000e-9, 4e-9 * kShardAlign);
}

// Rank 0, the fastest, may hold at most 30000 elements: it stays within that, and the other two
// share the rest 2:1 by their speeds.
TEST(SpeedShards, ABoundedRankKeepsWithinItsBoundAndTheOthersShareTheRest) {
  const std::vector<double> perElement = {1e-9, 2e-9, 4e-9};
  const auto sizes = speedShards(70000, perElement, {30000, kUnboundedShard, kUnboundedShard});
  ASSERT_TRUE(sizes.has_value());
  EXPECT_EQ(sum(*sizes), 70000);
  EXPECT_LE((*sizes)[0], 30000);
  EXPECT_GE((*sizes)[0], 30000 - 2 * kShardAlign);
  const double rest = double(70000 - (*sizes)[0]);
  EXPECT_NEAR(double((*sizes)[1]), rest * 2 / 3, double(kShardAlign));
  EXPECT_NEAR(double((*sizes)[2]), rest / 3, double(kShardAlign));
}

TEST(SpeedShards, BoundsThatCannotHoldTheSpaceGiveNothing) {
  EXPECT_FALSE(speedShards(70000, {1e-9, 2e-9, 4e-9}, {30000, 20000, 20000}).has_value());
  // A rank without a measurement (an empty shard) takes nothing, and only its bound would hold
  // the rest.
  EXPECT_FALSE(speedShards(70000, {1e-9, 0.0, 4e-9}, {30000, kUnboundedShard, 20000}).has_value());
  const auto sizes = speedShards(7008, {1e-9, 0.0, 4e-9}, std::vector<int64_t>(3, kUnboundedShard));
  ASSERT_TRUE(sizes.has_value());
  EXPECT_EQ((*sizes)[1], 0);
  EXPECT_NEAR(double((*sizes)[0]), 7008 * 0.8, double(kShardAlign));
}

// Measurements of ranks with speeds 1, 1/2, 1/4 on even shards of 3 x 16000 elements.
void observeEvenShards(ShardFollower& follower, int steps) {
  for (int s = 0; s < steps; ++s)
    for (int r = 0; r < 3; ++r) follower.observe(r, 16000, 16000 * 1e-9 * double(1 << r));
}

TEST(ShardFollower, ProposesOnlyOnceEveryRankHasAWindowOfMeasurements) {
  ShardFollower follower(std::vector<int64_t>(3, kUnboundedShard), 3, 0.1);
  const std::vector<int64_t> even = {16000, 16000, 16000};
  EXPECT_FALSE(follower.proposal(even).has_value());
  observeEvenShards(follower, 2);
  EXPECT_FALSE(follower.proposal(even).has_value());
  observeEvenShards(follower, 1);
  const auto next = follower.proposal(even);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(sum(*next), 48000);
  EXPECT_GT((*next)[0], (*next)[1]);
  EXPECT_GT((*next)[1], (*next)[2]);
  // The slowest update drops from 64 us (rank 2: 16000 x 4 ns) to about 27 us.
  EXPECT_LT(slowestUpdate(*next, {1e-9, 2e-9, 4e-9}), 0.5 * 64e-6);
}

TEST(ShardFollower, KeepsShardsWhoseUpdatesAreAlreadyAboutEqual) {
  ShardFollower follower(std::vector<int64_t>(3, kUnboundedShard), 3, 0.1);
  observeEvenShards(follower, 3);
  // 4/7, 2/7, 1/7 of 48000, aligned: within the 10% the move must gain.
  const auto balanced =
      speedShards(48000, {1e-9, 2e-9, 4e-9}, {kUnboundedShard, kUnboundedShard, kUnboundedShard});
  ASSERT_TRUE(balanced.has_value());
  EXPECT_FALSE(follower.proposal(*balanced).has_value());
  // Rank 2 slightly larger than balanced (5% longer update): still kept.
  auto near = *balanced;
  near[2] += 336;
  near[0] -= 336;
  EXPECT_FALSE(follower.proposal(near).has_value());
}

TEST(ShardFollower, TheMedianIgnoresAnOutlierAndOneMoveIsTheLast) {
  ShardFollower follower(std::vector<int64_t>(3, kUnboundedShard), 3, 0.1);
  observeEvenShards(follower, 3);
  follower.observe(2, 16000, 1.0);  // one step of rank 2 was descheduled for a second
  EXPECT_NEAR(follower.secondsPerElement(2), 4e-9, 1e-15);
  ASSERT_TRUE(follower.proposal({16000, 16000, 16000}).has_value());
  follower.resharded();
  observeEvenShards(follower, 3);
  EXPECT_FALSE(follower.proposal({16000, 16000, 16000}).has_value());
  // Empty shards and non-positive times measure nothing.
  ShardFollower fresh(std::vector<int64_t>(3, kUnboundedShard), 1, 0.1);
  fresh.observe(0, 0, 1e-3);
  fresh.observe(1, 100, 0);
  EXPECT_EQ(fresh.secondsPerElement(0), 0.0);
  EXPECT_EQ(fresh.secondsPerElement(1), 0.0);
}

// Every device capped at its memory plan: nothing can move.
TEST(ShardFollower, ShardsBoundByMemoryStay) {
  ShardFollower follower({16000, 16000, 16000}, 3, 0.1);
  observeEvenShards(follower, 3);
  EXPECT_FALSE(follower.proposal({16000, 16000, 16000}).has_value());
}

}  // namespace
}  // namespace hetra::train
