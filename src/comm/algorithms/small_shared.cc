// Small-slot layout: the first cache line ends with a SlotHead (the writer's OpHeader and a stamp
// naming the operation, 40 bytes); a payload of up to 24 bytes fills the rest of that line, so the
// reader's one wait brings header and data together; a larger payload starts on the next line, so
// that the vectorised reduction reads whole lines.
//
// A reader spins on a peer's stamp (the last word written; its store releases the payload and
// header) and falls back to the arena's wait on the peer's step, which sleeps, checks the deadline
// and the abort word, and which peers on the other path also post.
//
// A rank posts its step after it has seen every peer's stamp, or just before it falls back to
// waiting on a step (so two ranks never wait on each other's steps unposted), and before it throws
// (a peer on the other path waits for that step). Posting first, as the other algorithms do, made
// every rank wait for its seq_cst store, i.e. for its own payload's stores to drain, before it
// could read a peer's: 2 KiB took 1.86 us instead of 1.57 (2 ranks, hetra bench, 2026-12-02).
//
// Why one sync point is safe: small slot parity p of operation k is written again at operation
// k + 2, and a rank starts operation k + 2 only after it saw every rank's stamp (or step) of
// operation k + 1, which each rank writes only after it finished reading operation k.
#include "comm/algorithms/small_shared.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <vector>

#include "common/errors.h"

namespace hetra::comm {
namespace {

struct SlotHead {
  OpHeader header;
  uint64_t stamp;  // arena operation number + 1: which operation the slot holds
};
constexpr size_t kLine = 64;
constexpr size_t kInlineBytes = kLine - sizeof(SlotHead);
static_assert(kInlineBytes == 24);

SlotHead& headOf(const SharedArena& arena, int rank, uint64_t op) {
  return *reinterpret_cast<SlotHead*>(arena.smallSlot(rank, op) + kInlineBytes);
}

uint8_t* payloadOf(const SharedArena& arena, int rank, uint64_t op, size_t bytes) {
  return arena.smallSlot(rank, op) + (bytes <= kInlineBytes ? 0 : kLine);
}

std::atomic_ref<uint64_t> stampOf(const SharedArena& arena, int rank, uint64_t op) {
  return std::atomic_ref<uint64_t>(headOf(arena, rank, op).stamp);
}

// Waits until `peer` has published operation `op`: spins on its stamp, then waits on its step.
void waitForPeer(SharedArena& arena, int peer, uint64_t op, Deadline deadline, bool& posted) {
  const auto stamp = stampOf(arena, peer, op);
  for (int i = 0; i < SharedArena::kPausesBeforeClock && arena.spinNs() > 0; ++i) {
    if (stamp.load(std::memory_order_acquire) == op + 1) return;
    _mm_pause();
  }
  const auto spinUntil = Clock::now() + std::chrono::nanoseconds(arena.spinNs());
  do {
    for (int i = 0; i < 16; ++i) {
      if (stamp.load(std::memory_order_acquire) == op + 1) return;
      _mm_pause();
    }
  } while (Clock::now() < spinUntil);
  if (!posted) arena.post();
  posted = true;
  arena.waitFor(peer, arena.step(), deadline, "the small-message collective");
}

// Writes this rank's header and payload, posts, waits for every peer and checks each peer's
// header. Returns the arena operation number, which names the slots to read.
uint64_t exchange(SharedArena& arena, const OpHeader& mine, const void* payload, size_t bytes,
                  Deadline deadline) {
  HETRA_ENFORCE(arena.hasSmallSlots(), "small-message collective on an arena without small slots");
  HETRA_ENFORCE(bytes <= smallSharedCapacity(), "small-message collective of ", bytes,
                " bytes per rank; the small slot holds ", smallSharedCapacity());
  const int me = arena.rank();
  const uint64_t op = arena.beginOp();
  if (bytes > 0) std::memcpy(payloadOf(arena, me, op, bytes), payload, bytes);
  headOf(arena, me, op).header = mine;
  stampOf(arena, me, op).store(op + 1, std::memory_order_release);
  arena.header(me, op) = mine;  // for a peer that took the algorithms of shared.h
  // With more ranks than CPUs a rank can be preempted between its stamp and a late post, and the
  // peers that sleep on its step would wait for it to run again: post at once.
  bool posted = arena.oversubscribed();
  if (posted) arena.post();
  try {
    for (int r = 0; r < arena.size(); ++r) {
      if (r == me) continue;
      waitForPeer(arena, r, op, deadline, posted);
      if (stampOf(arena, r, op).load(std::memory_order_acquire) != op + 1)
        throw MismatchError(str("mismatched collective: rank ", me, " called ", mine.describe(),
                                " on the small-message path, but rank ", r,
                                " did not (it called a collective of another size or kind)"));
      checkHeaders(mine, me, headOf(arena, r, op).header, r);
    }
  } catch (...) {
    // A peer on the algorithms of shared.h waits for this rank's step to read its header.
    if (!posted) arena.post();
    throw;
  }
  if (!posted) arena.post();
  return op;
}

// Source pointers: on the stack for up to 64 ranks, which keeps the fast path off the heap.
class SlotPointers {
 public:
  SlotPointers(const SharedArena& arena, uint64_t op, size_t bytes) {
    const int n = arena.size();
    if (n > int(stack_.size())) heap_.resize(size_t(n));
    pointers_ = heap_.empty() ? stack_.data() : heap_.data();
    for (int k = 0; k < n; ++k) pointers_[k] = payloadOf(arena, k, op, bytes);
  }
  const void* const* data() const { return pointers_; }
  void set(int rank, const void* source) { pointers_[rank] = source; }

 private:
  std::array<const void*, 64> stack_;
  std::vector<const void*> heap_;
  const void** pointers_;
};

}  // namespace

size_t smallSharedCapacity() {
  return SharedArena::kSmallSlotBytes - kLine;
}

bool smallSharedFits(const SharedArena& arena, size_t bytesPerRank) {
  return arena.hasSmallSlots() && bytesPerRank <= smallSharedCapacity();
}

void allreduceSmallShared(SharedArena& arena, const AllreduceArgs& args) {
  const int me = arena.rank();
  const size_t bytes = args.count * dtypeSize(args.dtype);
  const uint64_t op = exchange(arena, OpHeader::of(args), args.in, bytes, args.deadline);
  if (bytes == 0) return;
  // Every rank reduces the contributions in rank order, so all ranks get the same bits. Its own
  // comes from `in` rather than its slot, which peers are reading at the same time; but where
  // `out` aliases `in`, a rank after the second would read `in` after the first pass overwrote it.
  // (4 KiB on 2 ranks: 2.6 us from the slot, 2.0 from `in`.)
  SlotPointers sources(arena, op, bytes);
  if (args.in != args.out || me <= 1) sources.set(me, args.in);
  reduceMany(args.op, args.dtype, args.out, sources.data(), arena.size(), args.count);
  arena.account(bytes, bytes * size_t(arena.size() - 1));
}

void allgatherSmallShared(SharedArena& arena, const AllgatherArgs& args) {
  const int n = arena.size(), me = arena.rank();
  if (int(args.counts.size()) != n)
    throw ConfigError(
        str("allgather: counts has ", args.counts.size(), " entries; the group has ", n, " ranks"));
  const size_t es = dtypeSize(args.dtype);
  const uint64_t op =
      exchange(arena, OpHeader::of(args), args.in, args.counts[me] * es, args.deadline);
  auto* out = static_cast<uint8_t*>(args.out);
  size_t received = 0;
  for (int k = 0; k < n; ++k) {
    const size_t bytes = args.counts[k] * es;
    // memmove: `in` may be this rank's block of `out`.
    if (bytes > 0) std::memmove(out, k == me ? args.in : payloadOf(arena, k, op, bytes), bytes);
    if (k != me) received += bytes;
    out += bytes;
  }
  arena.account(args.counts[me] * es, received);
}

void broadcastSmallShared(SharedArena& arena, const BroadcastArgs& args) {
  const int me = arena.rank();
  if (args.root < 0 || args.root >= arena.size())
    throw ConfigError(
        str("broadcast: root ", args.root, " is not a rank of this group of ", arena.size()));
  const size_t bytes = args.count * dtypeSize(args.dtype);
  const uint64_t op =
      exchange(arena, OpHeader::of(args), args.buf, me == args.root ? bytes : 0, args.deadline);
  if (me == args.root || bytes == 0) {
    arena.account(me == args.root ? bytes : 0, 0);
    return;
  }
  std::memcpy(args.buf, payloadOf(arena, args.root, op, bytes), bytes);
  arena.account(0, bytes);
}

void barrierSmallShared(SharedArena& arena, const BarrierArgs& args) {
  exchange(arena, OpHeader::of(args), nullptr, 0, args.deadline);
}

// Measured on 2 ranks (processes pinned to the 2 cores of a KVM guest, AMD EPYC, ops back to back
// after a barrier, median over 1000 ops of the slower rank, 3 runs, 8 B to 16 KiB): 0.46 us at 8 B
// to 4.6 us at 16 KiB; a least-squares line gives 0.25 ns per byte read from a peer (4 GB/s) and
// alpha is the small-size plateau. Untested above 2 ranks (more ranks than cores only measure the
// scheduler); the (size - 1) factor counts the bytes each rank reads.
double smallSharedSeconds(size_t bytes, int size) {
  constexpr double kAlpha = 0.5e-6;
  constexpr double kBeta = 4.0e9;
  if (size <= 1) return double(bytes) / kBeta;  // no peer to wait for: the copies remain
  return kAlpha + double(size - 1) * double(bytes) / kBeta;
}

}  // namespace hetra::comm
