// Provider "small-shared": the one-sync-point collectives of algorithms/small_shared.h, for
// operations that fit the arena's small slots. Its cost is one sync point and the bytes each rank
// moves: its own payload in, every peer's read, the result written (no piece pipeline, no
// separate header read: the header shares the payload's cache lines).
#include "comm/algorithms/small_shared.h"
#include "comm/providers/algorithm_provider.h"
#include "comm/transport/shared_arena.h"

namespace hetra::comm {
namespace {

class SmallSharedProvider final : public AlgorithmProvider<SharedArena> {
 public:
  SmallSharedProvider()
      : AlgorithmProvider({allreduceSmallShared, nullptr, allgatherSmallShared,
                           broadcastSmallShared, barrierSmallShared}) {}
  const char* name() const override { return "small-shared"; }
  // An allgather's blocks may be uneven and the operation names only its total, which every rank
  // knows alike: the total must fit (so the largest block does).
  const char* whyNot(const Operation& op, const GroupFacts& group) const override {
    return smallSharedFits(*group.arena, op.bytes) ? nullptr
                                                   : "the operation does not fit its small slots";
  }
  double seconds(const Operation& op, const GroupFacts& group) const override {
    const double n = group.size, bytes = double(op.bytes);
    if (op.kind == OpKind::Allgather) return group.arenaLink.seconds(1, 2 * bytes);
    return group.arenaLink.seconds(1, (n + 1) * bytes);
  }
};

}  // namespace

std::shared_ptr<Provider> makeSmallSharedProvider() {
  return std::make_shared<SmallSharedProvider>();
}

}  // namespace hetra::comm
