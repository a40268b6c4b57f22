#include "comm/staging_plan.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <vector>

#include "common/errors.h"

namespace hetra::comm {

StagingPlan::StagingPlan(size_t totalBytes, size_t pieceBytes, int slots, size_t alignment)
    : totalBytes_(totalBytes), slots_(slots) {
  if (alignment == 0) throw ConfigError("staging: alignment 0; it must be at least 1 byte");
  if (pieceBytes == 0) throw ConfigError("staging: piece size 0; it must be at least 1 byte");
  if (slots < 1) throw ConfigError(str("staging: ", slots, " slots; at least 1 is needed"));
  pieceBytes_ = std::max(alignment, pieceBytes / alignment * alignment);
  pieces_ = (totalBytes + pieceBytes_ - 1) / pieceBytes_;
}

StagingPiece StagingPlan::piece(size_t index) const {
  HETRA_ENFORCE_LT(index, pieces_, "staging: piece index out of range");
  StagingPiece p;
  p.index = index;
  p.offset = index * pieceBytes_;
  p.bytes = std::min(pieceBytes_, totalBytes_ - p.offset);
  p.slot = int(index % size_t(slots_));
  return p;
}

size_t StagingPlan::stagingBytes() const {
  return std::min(size_t(slots_), pieces_) * pieceBytes_;
}

namespace {

// One kind of asynchronous step (the copies, or the transfers) of the plan's pieces: which were
// started and not yet waited for, so that a failure can wait for the rest (the buffers must outlive
// every asynchronous step).
class PendingSteps {
 public:
  using Step = std::function<void(const StagingPiece&)>;
  PendingSteps(const StagingPlan& plan, const Step& start, const Step& wait)
      : plan_(plan), start_(start), wait_(wait), started_(plan.pieces()) {}

  void start(size_t i) {
    start_(plan_.piece(i));
    started_[i] = true;
  }
  void wait(size_t i) {
    started_[i] = false;
    wait_(plan_.piece(i));
  }
  // After a failure: waits for piece i's step if it is still pending, swallowing its error (the
  // first error is the one the caller rethrows).
  void waitQuietly(size_t i) noexcept {
    if (started_[i]) try {
        wait(i);
      } catch (...) {
      }
  }

 private:
  const StagingPlan& plan_;
  const Step& start_;
  const Step& wait_;
  std::vector<bool> started_;
};

// The copies and transfers of one staged send or receive; waitPending() after a failure waits for
// every step still pending.
struct Drain {
  Drain(const StagingPlan& plan, const StagingSteps& steps)
      : copies(plan, steps.startCopy, steps.waitCopy),
        transfers(plan, steps.startTransfer, steps.waitTransfer),
        pieces(plan.pieces()) {}
  void waitPending() noexcept {
    for (size_t i = 0; i < pieces; ++i) {
      copies.waitQuietly(i);
      transfers.waitQuietly(i);
    }
  }
  PendingSteps copies;
  PendingSteps transfers;
  size_t pieces;
};

}  // namespace

void runStagedSend(const StagingPlan& plan, const StagingSteps& steps) {
  const size_t n = plan.pieces();
  const size_t slots = size_t(plan.slots());
  Drain drain(plan, steps);
  try {
    if (n > 0) drain.copies.start(0);
    for (size_t i = 0; i < n; ++i) {
      drain.copies.wait(i);
      drain.transfers.start(i);
      const size_t next = i + 1;
      if (next < n) {
        // The next piece's slot last held piece next - slots; its send must be done.
        if (next >= slots) drain.transfers.wait(next - slots);
        drain.copies.start(next);
      }
    }
    for (size_t i = n > slots ? n - slots : 0; i < n; ++i) drain.transfers.wait(i);
  } catch (...) {
    drain.waitPending();
    throw;
  }
}

void runStagedRecv(const StagingPlan& plan, const StagingSteps& steps) {
  const size_t n = plan.pieces();
  const size_t slots = size_t(plan.slots());
  Drain drain(plan, steps);
  try {
    for (size_t i = 0; i < std::min(n, slots); ++i) drain.transfers.start(i);
    for (size_t i = 0; i < n; ++i) {
      drain.transfers.wait(i);
      drain.copies.start(i);
      const size_t next = i + slots;
      if (next < n) {
        // The slot is free once its piece reached the device.
        drain.copies.wait(i);
        drain.transfers.start(next);
      }
    }
    for (size_t i = n > slots ? n - slots : 0; i < n; ++i) drain.copies.wait(i);
  } catch (...) {
    drain.waitPending();
    throw;
  }
}

}  // namespace hetra::comm
