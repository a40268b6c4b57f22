// SharedArena: memory that every rank of a group maps, with counters the ranks use to signal each
// other. The shm transport builds it over its segment; the algorithms of algorithms/shared.cc use
// only this interface.
//
// Vocabulary:
//   slot         slotBytes() of memory owned by one rank: only its owner writes it, every rank
//                may read it once the owner has posted the step that published the writes.
//   step         a per-rank counter that only its owner advances (post()), once per sync point.
//                All ranks of a well-formed collective pass the same sequence of sync points, so
//                "rank k reached step s" is a monotonic fact both sides can name by number.
//                post() publishes (release) every write its owner made before it; waitFor()
//                acquires them.
//   header area  two OpHeaders per rank, used by alternate operations (by the parity of the
//                operation number), so a rank may write the next operation's header while a slow
//                peer still reads this one.
//
// Waiting spins for a few microseconds, then keeps checking between sched_yield calls for a while
// (which hands the CPU to the awaited rank when both share one, and costs little when the CPU has
// nothing else to run), then sleeps on a futex in short slices; a poster makes the wake system
// call only when a waiter has said that it sleeps. Between slices a waiter checks its deadline,
// the group's abort word and whether the peers' processes are still alive.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "comm/algorithms/args.h"
#include "comm/transport/futex.h"
#include "common/timing.h"

namespace hetra::comm {

class SharedArena {
 public:
  // Pauses a waiter spins before it first reads the clock (waitSlow() and the small-slot waits).
  static constexpr int kPausesBeforeClock = 32;

  // One per rank, alone on its cache line: the owner's step and the number of ranks asleep on it.
  struct alignas(64) StepWord {
    std::atomic<uint64_t> value{0};
    std::atomic<uint32_t> sleepers{0};
  };

  // Checks a waiter makes between sleeps; implemented by the transport that owns the memory.
  class Monitor {
   public:
    virtual ~Monitor() = default;
    // Throws PeerAbortedError when some rank aborted the group (cheap: one load).
    virtual void checkAborted() = 0;
    // Throws PeerAbortedError when the process of a rank of the group died (reads /proc: call it
    // rarely).
    virtual void checkPeersAlive() = 0;
  };

  struct Layout {
    int rank = 0;
    int size = 1;
    StepWord* steps = nullptr;    // size entries
    OpHeader* headers = nullptr;  // 2 * size entries: rank r's areas are [2r] and [2r + 1]
    uint8_t* slots = nullptr;     // size slots, slotStride bytes apart
    size_t slotBytes = 0;
    size_t slotStride = 0;
    uint64_t spinNs = 0;          // how long a waiter spins before it yields or sleeps
    uint64_t yieldNs = 0;         // then how long it calls sched_yield before it sleeps
    bool oversubscribed = false;  // more ranks than CPUs: a rank may be preempted at any point
    Monitor* monitor = nullptr;
    uint8_t* smallSlots = nullptr;  // 2 * size small slots, kSmallSlotBytes each; see smallSlot()
  };

  // Small slots (algorithms/small_shared.cc): two per rank, used by alternate operations like the
  // header areas, each holding a rank's header and payload together so that a reader finds both
  // in the same cache lines. Separate from the slots, which the other algorithms lay out.
  static constexpr size_t kSmallSlotBytes = size_t(16) << 10;

  // One thread of control per rank uses an arena at a time (the communicator's progress thread).
  // A collective that threw leaves the ranks at different steps: the group must not be used again.
  explicit SharedArena(const Layout& layout) : l_(layout) {}
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  int rank() const { return l_.rank; }
  int size() const { return l_.size; }

  uint8_t* slot(int rank) const { return l_.slots + size_t(rank) * l_.slotStride; }
  size_t slotBytes() const { return l_.slotBytes; }
  bool hasSmallSlots() const { return l_.smallSlots != nullptr; }
  uint8_t* smallSlot(int rank, uint64_t op) const {
    return l_.smallSlots + (2 * size_t(rank) + (op & 1)) * kSmallSlotBytes;
  }

  // Numbers this rank's collectives on the arena (0, 1, ...): the header area parity. Throws
  // PeerAbortedError when the group was aborted, so no new collective starts on a failed group.
  uint64_t beginOp() {
    l_.monitor->checkAborted();
    return ops_++;
  }
  OpHeader& header(int rank, uint64_t op) const { return l_.headers[2 * rank + (op & 1)]; }

  // The last step this rank posted.
  uint64_t step() const { return step_; }

  // How long waitFor() spins before it yields: for callers that spin on a word of their own.
  uint64_t spinNs() const { return l_.spinNs; }
  bool oversubscribed() const { return l_.oversubscribed; }

  // Advances this rank's step, publishing every write made before it.
  void post() {
    StepWord& word = l_.steps[l_.rank];
    word.value.store(++step_, std::memory_order_seq_cst);
    // seq_cst store then load pairs with the waiter's seq_cst increment of `sleepers` then load of
    // `value`: at least one of the two sees the other, so a sleeper is never missed.
    if (word.sleepers.load(std::memory_order_seq_cst) != 0)
      futex::wakeAll(futex::lowHalf(&word.value));
  }

  // Waits until `peer` has posted step `target`. `what` names the awaited event in error messages.
  // Throws TimeoutError past the deadline, PeerAbortedError on abort or a dead peer.
  void waitFor(int peer, uint64_t target, Deadline deadline, const char* what) {
    if (l_.steps[peer].value.load(std::memory_order_acquire) >= target) return;
    waitSlow(peer, target, deadline, what);
  }

  // Waits until every other rank has posted step `target`.
  void waitAll(uint64_t target, Deadline deadline, const char* what) {
    for (int peer = 0; peer < l_.size; ++peer)
      if (peer != l_.rank) waitFor(peer, target, deadline, what);
  }

  // Payload accounting for the transport's byte counters (only this rank's thread of control
  // writes).
  void account(uint64_t sent, uint64_t received) {
    sent_.fetch_add(sent, std::memory_order_relaxed);
    received_.fetch_add(received, std::memory_order_relaxed);
  }
  uint64_t bytesSent() const { return sent_.load(std::memory_order_relaxed); }
  uint64_t bytesReceived() const { return received_.load(std::memory_order_relaxed); }

 private:
  void waitSlow(int peer, uint64_t target, Deadline deadline,
                const char* what);  // shm_transport.cc

  Layout l_;
  uint64_t step_ = 0;
  uint64_t ops_ = 0;
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> received_{0};
};

}  // namespace hetra::comm
