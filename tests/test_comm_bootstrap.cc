// The store exchange that bootstraps a vendor communicator (comm/bootstrap.h; NCCL's unique id in
// cuda/nccl_transport.cc), with a fake id: every rank gets rank 0's bytes, odd world sizes, a
// clear TimeoutError when rank 0 never publishes, and size checks.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "common/errors.h"
#include "harness.h"
#include "store/store.h"

namespace hetra::comm {
namespace {

store::Bytes fakeId(uint8_t seed, size_t bytes) {
  store::Bytes id(bytes);
  for (size_t i = 0; i < bytes; ++i) id[i] = uint8_t(seed + i * 13);
  return id;
}

TEST(Bootstrap, EveryRankGetsRankZerosId) {
  for (int size : {1, 2, 3, 7}) {
    auto store = std::make_shared<store::MemoryStore>();
    store::PrefixStore group("job/world", store);
    std::atomic<int> made{0};
    std::vector<store::Bytes> got(static_cast<size_t>(size));
    test::runRanks(size, [&](int r) {
      got[size_t(r)] = exchangeRootId(
          group, "nccl-id", r,
          [&] {
            ++made;
            return fakeId(uint8_t(size), 128);
          },
          deadlineAfter(Millis(5000)), 128);
    });
    EXPECT_EQ(made.load(), 1) << "only rank 0 makes the id";
    for (int r = 0; r < size; ++r) EXPECT_EQ(got[size_t(r)], fakeId(uint8_t(size), 128)) << r;
    // Published under the group's prefix, nowhere else.
    EXPECT_TRUE(store->check({"job/world/nccl-id"}));
    EXPECT_FALSE(store->check({"nccl-id"}));
  }
}

TEST(Bootstrap, TwoGroupsOnOneStoreStayApart) {
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<store::Bytes> got(6);
  test::runRanks(6, [&](int r) {
    const int group = r % 2;  // two groups of three, interleaved
    store::PrefixStore prefixed("g" + std::to_string(group), store);
    got[size_t(r)] = exchangeRootId(
        prefixed, "id", r / 2, [&] { return fakeId(uint8_t(100 + group), 16); },
        deadlineAfter(Millis(5000)));
  });
  for (int r = 0; r < 6; ++r) EXPECT_EQ(got[size_t(r)], fakeId(uint8_t(100 + r % 2), 16)) << r;
}

TEST(Bootstrap, RankZeroNeverPublishingTimesOutClearly) {
  store::MemoryStore store;
  const auto start = Clock::now();
  try {
    exchangeRootId(
        store, "nccl-id", 2, [] { return store::Bytes(); }, deadlineAfter(Millis(300)), 128);
    FAIL() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 2"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
    EXPECT_NE(what.find("nccl-id"), std::string::npos) << what;
  }
  // It waited for its timeout (no upper bound: the TimeoutError shows the 300 ms ended it).
  EXPECT_GE(secondsSince(start), 0.25);
}

TEST(Bootstrap, WrongSizedIdsAreRefused) {
  store::MemoryStore store;
  EXPECT_THROW(exchangeRootId(
                   store, "a", 0, [] { return fakeId(1, 5); }, deadlineAfter(Millis(100)), 128),
               IoError);
  store.set("b", fakeId(1, 5));  // e.g. written by a different library version
  EXPECT_THROW(exchangeRootId(
                   store, "b", 1, [] { return store::Bytes(); }, deadlineAfter(Millis(1000)), 128),
               IoError);
}

}  // namespace
}  // namespace hetra::comm
