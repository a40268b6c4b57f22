// The staging plan and schedule (comm/staging_plan.h) that cuda/staging.cc runs with pinned
// buffers and cudaMemcpyAsync: piece layout, the order of copies and transfers (no slot reused
// while in use, copies overlapping transfers), cleanup after a failing step, and a real staged
// move between two ranks over the tcp transport with memcpy standing in for the device copies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/staging_plan.h"
#include "comm/transport/tcp_transport.h"
#include "common/errors.h"
#include "harness.h"
#include "store/store.h"

namespace hetra::comm {
namespace {

TEST(StagingPlan, PiecesCoverTheBufferExactly) {
  for (size_t total : {size_t(0), size_t(1), size_t(7), size_t(1001), size_t(4096), size_t(12289)})
    for (size_t piece : {size_t(1), size_t(5), size_t(64), size_t(1000), size_t(1 << 20)})
      for (size_t alignment : {size_t(1), size_t(4), size_t(260)})
        for (int slots : {1, 2, 3}) {
          const StagingPlan plan(total, piece, slots, alignment);
          const size_t expectPiece = std::max(alignment, piece / alignment * alignment);
          ASSERT_EQ(plan.pieceBytes(), expectPiece);
          ASSERT_EQ(plan.pieces(), (total + expectPiece - 1) / expectPiece);
          size_t next = 0;
          for (size_t i = 0; i < plan.pieces(); ++i) {
            const StagingPiece p = plan.piece(i);
            ASSERT_EQ(p.index, i);
            ASSERT_EQ(p.offset, next);
            ASSERT_GT(p.bytes, 0u);
            ASSERT_EQ(p.slot, int(i % size_t(slots)));
            if (i + 1 < plan.pieces()) {
              ASSERT_EQ(p.bytes % alignment, 0u);
            }
            ASSERT_LE(p.bytes, expectPiece);
            next += p.bytes;
          }
          ASSERT_EQ(next, total);
          ASSERT_EQ(plan.stagingBytes(), std::min(size_t(slots), plan.pieces()) * expectPiece);
        }
  EXPECT_THROW(StagingPlan(10, 0, 2, 1), ConfigError);
  EXPECT_THROW(StagingPlan(10, 4, 0, 1), ConfigError);
  EXPECT_THROW(StagingPlan(10, 4, 2, 0), ConfigError);
  EXPECT_THROW(StagingPlan(10, 4, 2, 1).piece(3), EnforceError);
}

// Records the steps and checks the schedule's rules as they happen.
struct Recorder {
  explicit Recorder(const StagingPlan& plan, bool sending) : plan(plan), sending(sending) {}

  StagingSteps steps() {
    StagingSteps s;
    s.startCopy = [this](const StagingPiece& p) { start("copy", p); };
    s.waitCopy = [this](const StagingPiece& p) { finish("copy", p); };
    s.startTransfer = [this](const StagingPiece& p) { start("transfer", p); };
    s.waitTransfer = [this](const StagingPiece& p) { finish("transfer", p); };
    return s;
  }

  void start(const std::string& kind, const StagingPiece& p) {
    if (log.size() >= failAt) {
      failAt = SIZE_MAX;
      throw IoError("injected failure at step " + std::to_string(log.size()));
    }
    log.push_back("start " + kind + " " + std::to_string(p.index));
    const bool first = sending ? kind == "copy" : kind == "transfer";
    if (first) {
      // A slot is reused only after the previous piece in it finished both its steps.
      auto it = busy.find(p.slot);
      ASSERT_TRUE(it == busy.end()) << "slot " << p.slot << " reused by piece " << p.index
                                    << " while piece " << it->second << " holds it";
      busy[p.slot] = p.index;
    } else {
      // The second step of a piece starts only after its first step completed.
      ASSERT_TRUE(done.count((sending ? "copy " : "transfer ") + std::to_string(p.index)))
          << kind << " of piece " << p.index << " before its first step completed";
    }
    running.insert(kind + " " + std::to_string(p.index));
    maxRunning = std::max(maxRunning, running.size());
  }

  void finish(const std::string& kind, const StagingPiece& p) {
    const std::string key = kind + " " + std::to_string(p.index);
    log.push_back("wait " + key);
    ASSERT_EQ(running.erase(key), 1u) << "waited for " << key << " that was not started";
    done.insert(key);
    const bool last = sending ? kind == "transfer" : kind == "copy";
    if (last) busy.erase(p.slot);
  }

  const StagingPlan& plan;
  bool sending;
  size_t failAt = SIZE_MAX;
  std::vector<std::string> log;
  std::map<int, size_t> busy;  // slot -> piece holding it
  std::set<std::string> running, done;
  size_t maxRunning = 0;
};

TEST(StagingSchedule, SendAndReceiveRespectSlotsAndOverlap) {
  for (size_t total : {size_t(0), size_t(1), size_t(100), size_t(1001)})
    for (int slots : {1, 2, 3}) {
      const StagingPlan plan(total, 100, slots, 4);
      for (bool sending : {true, false}) {
        Recorder r(plan, sending);
        if (sending)
          runStagedSend(plan, r.steps());
        else
          runStagedRecv(plan, r.steps());
        ASSERT_TRUE(r.running.empty()) << "steps left running";
        ASSERT_EQ(r.done.size(), 2 * plan.pieces());
        // With two or more slots and several pieces, a copy and a transfer run at once.
        if (slots >= 2 && plan.pieces() >= 2) {
          ASSERT_GE(r.maxRunning, 2u);
        }
      }
    }
}

TEST(StagingSchedule, AFailingStepWaitsForEveryStartedStep) {
  const StagingPlan plan(1001, 100, 2, 4);
  for (bool sending : {true, false})
    for (size_t failAt : {size_t(0), size_t(3), size_t(7), size_t(20)}) {
      Recorder r(plan, sending);
      r.failAt = failAt;
      const auto run = [&] {
        sending ? runStagedSend(plan, r.steps()) : runStagedRecv(plan, r.steps());
      };
      EXPECT_THROW(run(), IoError) << failAt;
      EXPECT_TRUE(r.running.empty()) << "failure at step " << failAt << " left steps running";
    }
}

// Rank 0 stages its "device" buffer to rank 1 through two slots over a real tcp transport; the
// copies are memcpy (done at start, so a wrong slot order would corrupt the data).
TEST(StagingSchedule, StagedMoveOverTcpDeliversEveryByte) {
  for (size_t total : {size_t(0), size_t(1), size_t(4), size_t(1001), size_t(64 * 3 + 8)}) {
    auto shared = std::make_shared<store::PrefixStore>("staging" + std::to_string(total),
                                                       std::make_shared<store::MemoryStore>());
    TcpOptions options;
    options.timeout = Millis(10000);
    std::vector<std::unique_ptr<Transport>> ranks(2);
    test::runRanks(2, [&](int r) { ranks[size_t(r)] = createTcpTransport(shared, r, 2, options); });
    std::vector<uint8_t> source(total), received(total, 0xee);
    for (size_t i = 0; i < total; ++i) source[i] = uint8_t(i * 7 + 3);
    test::runRanks(2, [&](int r) {
      Transport& t = *ranks[size_t(r)];
      const StagingPlan plan(total, 64, 2, 4);
      std::vector<std::vector<uint8_t>> slots(2, std::vector<uint8_t>(plan.pieceBytes(), 0));
      std::vector<std::unique_ptr<Request>> requests(2);
      const Deadline deadline = deadlineAfter(Millis(10000));
      StagingSteps steps;
      steps.startTransfer = [&](const StagingPiece& p) {
        auto* slot = slots[size_t(p.slot)].data();
        requests[size_t(p.slot)] =
            r == 0 ? t.isend(1, 42, slot, p.bytes) : t.irecv(0, 42, slot, p.bytes);
      };
      steps.waitTransfer = [&](const StagingPiece& p) {
        auto request = std::move(requests[size_t(p.slot)]);
        request->wait(deadline);
      };
      steps.startCopy = [&](const StagingPiece& p) {
        if (r == 0)
          std::memcpy(slots[size_t(p.slot)].data(), source.data() + p.offset, p.bytes);
        else
          std::memcpy(received.data() + p.offset, slots[size_t(p.slot)].data(), p.bytes);
      };
      steps.waitCopy = [](const StagingPiece&) {};
      if (r == 0)
        runStagedSend(plan, steps);
      else
        runStagedRecv(plan, steps);
    });
    EXPECT_EQ(received, source) << total;
    EXPECT_EQ(ranks[0]->bytesSent(), total);
  }
}

}  // namespace
}  // namespace hetra::comm
