// Staging: moving a device buffer over a host transport through pinned host memory, in pieces,
// so that copying one piece between the device and the host overlaps sending another.
//
// Vocabulary:
//   piece   - a contiguous byte range [offset, offset + bytes) of the buffer being moved; every
//             piece but the last is pieceBytes long (a multiple of `alignment`, so a piece of an
//             encoded FP8 buffer or of float elements never splits an element);
//   slot    - one of `slots` pinned host buffers of pieceBytes each; piece i uses slot i % slots;
//   copy    - the device<->slot copy of a piece (cudaMemcpyAsync on the device side);
//   transfer- the network send or receive of a piece from or into its slot.
//
// This file is the plan and the schedule, free of CUDA, so that it is tested on any machine
// (tests/test_comm_staging.cc drives it with memcpy as the copy and a real transport);
// cuda/staging.cc plugs in pinned buffers, cudaMemcpyAsync and events.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace hetra::comm {

struct StagingPiece {
  size_t index = 0;
  size_t offset = 0;  // into the buffer being moved
  size_t bytes = 0;
  int slot = 0;
};

class StagingPlan {
 public:
  // totalBytes may be 0 (no pieces). pieceBytes is rounded down to a multiple of alignment
  // (at least one alignment unit); slots >= 1 (2 for double buffering). Throws ConfigError on
  // alignment 0, pieceBytes 0 or slots < 1.
  StagingPlan(size_t totalBytes, size_t pieceBytes, int slots = 2, size_t alignment = 1);

  size_t totalBytes() const { return totalBytes_; }
  size_t pieceBytes() const { return pieceBytes_; }
  int slots() const { return slots_; }
  size_t pieces() const { return pieces_; }
  StagingPiece piece(size_t index) const;
  // Host bytes the plan needs: min(slots, pieces) slots of pieceBytes (what is worth pinning).
  size_t stagingBytes() const;

 private:
  size_t totalBytes_;
  size_t pieceBytes_;
  int slots_;
  size_t pieces_;
};

// The steps of a staged move. start* begin an asynchronous step; wait* block until it is done (and
// throw on failure or past the caller's deadline, which the steps carry themselves).
struct StagingSteps {
  std::function<void(const StagingPiece&)> startCopy;
  std::function<void(const StagingPiece&)> waitCopy;
  std::function<void(const StagingPiece&)> startTransfer;
  std::function<void(const StagingPiece&)> waitTransfer;
};

// Sending: copy (device -> slot), then transfer (slot -> network). The copy of piece i + 1 runs
// while piece i is sent; a slot is refilled only after the transfer that last used it completed.
// Every started step is waited for before returning, also when a step throws (so no asynchronous
// operation outlives the buffers), and the first exception is rethrown.
void runStagedSend(const StagingPlan& plan, const StagingSteps& steps);
// Receiving: transfer (network -> slot), then copy (slot -> device). Receives are posted into all
// slots at once; a slot is posted again only after its copy to the device completed.
void runStagedRecv(const StagingPlan& plan, const StagingSteps& steps);

}  // namespace hetra::comm
