#include "comm/staging_plan.h"

#include <algorithm>
#include <exception>

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

// Tracks which steps were started and not yet waited for, so that a failure waits for the rest
// (the buffers must outlive every asynchronous step) and rethrows the first error.
class Drain {
 public:
  Drain(const StagingPlan& plan, const StagingSteps& steps)
      : plan_(plan), steps_(steps), copying_(plan.pieces()), transferring_(plan.pieces()) {}

  void startCopy(size_t i) {
    steps_.startCopy(plan_.piece(i));
    copying_[i] = true;
  }
  void waitCopy(size_t i) {
    copying_[i] = false;
    steps_.waitCopy(plan_.piece(i));
  }
  void startTransfer(size_t i) {
    steps_.startTransfer(plan_.piece(i));
    transferring_[i] = true;
  }
  void waitTransfer(size_t i) {
    transferring_[i] = false;
    steps_.waitTransfer(plan_.piece(i));
  }

  // After a failure: waits for every step still pending, swallowing their errors (the first
  // error is the one the caller rethrows).
  void waitPending() noexcept {
    for (size_t i = 0; i < copying_.size(); ++i) {
      if (copying_[i]) try {
          waitCopy(i);
        } catch (...) {
        }
      if (transferring_[i]) try {
          waitTransfer(i);
        } catch (...) {
        }
    }
  }

 private:
  const StagingPlan& plan_;
  const StagingSteps& steps_;
  std::vector<bool> copying_;
  std::vector<bool> transferring_;
};

}  // namespace

void runStagedSend(const StagingPlan& plan, const StagingSteps& steps) {
  const size_t n = plan.pieces();
  const size_t slots = size_t(plan.slots());
  Drain drain(plan, steps);
  try {
    if (n > 0) drain.startCopy(0);
    for (size_t i = 0; i < n; ++i) {
      drain.waitCopy(i);
      drain.startTransfer(i);
      const size_t next = i + 1;
      if (next < n) {
        // The next piece's slot last held piece next - slots; its send must be done.
        if (next >= slots) drain.waitTransfer(next - slots);
        drain.startCopy(next);
      }
    }
    for (size_t i = n > slots ? n - slots : 0; i < n; ++i) drain.waitTransfer(i);
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
    for (size_t i = 0; i < std::min(n, slots); ++i) drain.startTransfer(i);
    for (size_t i = 0; i < n; ++i) {
      drain.waitTransfer(i);
      drain.startCopy(i);
      const size_t next = i + slots;
      if (next < n) {
        // The slot is free once its piece reached the device.
        drain.waitCopy(i);
        drain.startTransfer(next);
      }
    }
    for (size_t i = n > slots ? n - slots : 0; i < n; ++i) drain.waitCopy(i);
  } catch (...) {
    drain.waitPending();
    throw;
  }
}

}  // namespace hetra::comm
