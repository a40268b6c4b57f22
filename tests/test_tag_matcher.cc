// comm/transport/tag_matcher.h: the receive matching the tcp and mpi transports share, tested on
// its own (the transports' tests cover it in place).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/transport/tag_matcher.h"
#include "common/errors.h"

namespace hetra::comm {
namespace {

// Receives are named by a number, messages by their text.
using Matcher = TagMatcher<int, std::string>;

// What a transport does with one arriving message: the oldest receive of its tag takes it, else it
// waits as unexpected. Returns the receive that took it, or -1.
int arrive(Matcher& m, uint64_t tag, const std::string& message) {
  if (m.oldestPosted(tag)) return m.takePosted(tag);
  m.addArrived(tag, message);
  return -1;
}

// What a transport does with one posted receive: the oldest unexpected message of its tag, else
// it waits as posted. Returns the message it took, or "".
std::string post(Matcher& m, uint64_t tag, int receive) {
  if (m.oldestArrived(tag)) return m.takeArrived(tag);
  m.post(tag, receive);
  return "";
}

TEST(TagMatcher, PostedBeforeArrivalTakesTheMessage) {
  Matcher m;
  EXPECT_EQ(post(m, 7, 1), "");
  EXPECT_EQ(m.postedCount(7), 1u);
  EXPECT_EQ(arrive(m, 7, "a"), 1);
  EXPECT_EQ(m.postedCount(7), 0u);
  EXPECT_EQ(m.oldestPosted(7), nullptr);
  EXPECT_EQ(m.oldestArrived(7), nullptr);
}

TEST(TagMatcher, UnexpectedBeforePostWaitsForItsReceive) {
  Matcher m;
  EXPECT_EQ(arrive(m, 3, "early"), -1);
  ASSERT_NE(m.oldestArrived(3), nullptr);
  EXPECT_EQ(*m.oldestArrived(3), "early");
  EXPECT_EQ(m.oldestArrived(4), nullptr);  // another tag does not see it
  EXPECT_EQ(post(m, 4, 10), "");
  EXPECT_EQ(post(m, 3, 11), "early");
  EXPECT_EQ(m.oldestArrived(3), nullptr);
  EXPECT_EQ(m.postedCount(4), 1u);
}

TEST(TagMatcher, KeepsOrderPerTagAcrossInterleavedTags) {
  Matcher m;
  // Messages of two tags interleaved, some before and some after their receives.
  EXPECT_EQ(arrive(m, 1, "1a"), -1);
  EXPECT_EQ(arrive(m, 2, "2a"), -1);
  EXPECT_EQ(arrive(m, 1, "1b"), -1);
  EXPECT_EQ(post(m, 2, 20), "2a");
  EXPECT_EQ(post(m, 2, 21), "");
  EXPECT_EQ(post(m, 2, 22), "");
  EXPECT_EQ(post(m, 1, 10), "1a");
  EXPECT_EQ(arrive(m, 2, "2b"), 21);
  EXPECT_EQ(arrive(m, 1, "1c"), -1);
  EXPECT_EQ(post(m, 1, 11), "1b");
  EXPECT_EQ(post(m, 1, 12), "1c");
  EXPECT_EQ(arrive(m, 2, "2c"), 22);
  EXPECT_EQ(m.anyPosted(), nullptr);
}

TEST(TagMatcher, CancelWithdrawsOnlyThatReceive) {
  Matcher m;
  m.post(5, 1);
  m.post(5, 2);
  m.post(5, 3);
  EXPECT_TRUE(m.cancel(5, 2));
  EXPECT_FALSE(m.cancel(5, 2));
  EXPECT_FALSE(m.cancel(6, 1));
  EXPECT_EQ(arrive(m, 5, "x"), 1);
  EXPECT_EQ(arrive(m, 5, "y"), 3);
  EXPECT_EQ(m.postedCount(5), 0u);
}

TEST(TagMatcher, AnyPostedNamesAStrandedReceive) {
  Matcher m;
  EXPECT_EQ(m.anyPosted(), nullptr);
  m.addArrived(9, "unclaimed");
  EXPECT_EQ(m.anyPosted(), nullptr);  // a message is not a receive
  m.post(8, 42);
  ASSERT_NE(m.anyPosted(), nullptr);
  EXPECT_EQ(*m.anyPosted(), 42);
  m.clear();
  EXPECT_EQ(m.anyPosted(), nullptr);
  EXPECT_EQ(m.oldestArrived(9), nullptr);
}

TEST(TagMatcher, TakingFromAnEmptyTagIsAnInvariantError) {
  Matcher m;
  EXPECT_THROW(m.takeArrived(1), EnforceError);
  EXPECT_THROW(m.takePosted(1), EnforceError);
}

TEST(TagMatcher, MismatchMessageNamesBothSides) {
  const std::string text = sizeMismatchMessage("tcp", "rank 2 (h)", 16, 77, 0, 8);
  EXPECT_EQ(text,
            "tcp: rank 2 (h) sent a message of 16 bytes with tag 77 but rank 0 posted a receive "
            "of 8 bytes for it");
}

}  // namespace
}  // namespace hetra::comm
