// comm/transport/group_join.h: the join every store-bootstrapped transport makes. Each rank's
// record comes back at its index, and ranks that never published are named in the timeout.
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/transport/group_join.h"
#include "common/errors.h"
#include "store/store.h"

namespace hetra::comm {
namespace {

TEST(GroupJoin, EveryRankGetsEveryRecordByRank) {
  constexpr int kSize = 5;
  store::MemoryStore store;
  std::vector<std::vector<std::string>> seen(kSize);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kSize; ++rank)
    ranks.emplace_back([&, rank] {
      seen[size_t(rank)] = joinGroup(store, "join", "host-" + std::to_string(rank * 7 + 3), rank,
                                     kSize, deadlineAfter(Millis(20000)), Millis(20000), "test");
    });
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_EQ(seen[size_t(rank)].size(), size_t(kSize));
    for (int r = 0; r < kSize; ++r)
      EXPECT_EQ(seen[size_t(rank)][size_t(r)], "host-" + std::to_string(r * 7 + 3));
  }
}

TEST(GroupJoin, MissingRanksAreNamedInTheTimeout) {
  store::MemoryStore store;
  store.setString("world/2", "record of rank 2");
  try {
    joinGroup(store, "world", "record of rank 0", 0, 4, deadlineAfter(Millis(50)), Millis(50),
              "mpi transport");
    FAIL() << "ranks 1 and 3 never joined";
  } catch (const TimeoutError& e) {
    EXPECT_STREQ(e.what(),
                 "mpi transport: ranks 1, 3 of a group of 4 did not join within 50 ms (this is "
                 "rank 0)");
  }
  try {
    joinGroup(store, "one", "only me", 1, 2, deadlineAfter(Millis(20)), Millis(20),
              "tcp transport");
    FAIL() << "rank 0 never joined";
  } catch (const TimeoutError& e) {
    EXPECT_STREQ(
        e.what(),
        "tcp transport: rank 0 of a group of 2 did not join within 20 ms (this is rank 1)");
  }
}

TEST(GroupJoin, ArgumentsOutsideTheGroupAreRefused) {
  store::MemoryStore store;
  EXPECT_NO_THROW(enforceGroupMember("tcp transport", &store, 0, 1));
  EXPECT_THROW(enforceGroupMember("tcp transport", nullptr, 0, 1), EnforceError);
  EXPECT_THROW(enforceGroupMember("tcp transport", &store, 2, 2), EnforceError);
  EXPECT_THROW(enforceGroupMember("tcp transport", &store, -1, 2), EnforceError);
  EXPECT_THROW(enforceGroupMember("tcp transport", &store, 0, 0), EnforceError);
  try {
    enforceGroupMember("nccl transport", &store, 3, 2);
    FAIL() << "rank 3 is outside a group of 2";
  } catch (const EnforceError& e) {
    EXPECT_NE(std::string(e.what()).find("nccl transport: rank 3 is outside a group of 2"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace hetra::comm
