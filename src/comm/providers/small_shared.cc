// Provider "small-shared": the one-sync-point collectives of algorithms/small_shared.h, for
// operations that fit the arena's small slots. Its cost is one sync point and the bytes each rank
// moves: its own payload in, every peer's read, the result written (no piece pipeline, no
// separate header read: the header shares the payload's cache lines).
#include "comm/algorithms/small_shared.h"
#include "comm/providers/provider.h"
#include "comm/transport/shared_arena.h"

namespace hetra::comm {
namespace {

class SmallSharedProvider final : public Provider {
 public:
  const char* name() const override { return "small-shared"; }
  ProviderTraits traits() const override {
    ProviderTraits t;
    t.ops = bitOf(OpKind::Allreduce) | bitOf(OpKind::Allgather) | bitOf(OpKind::Broadcast) |
            bitOf(OpKind::Barrier);
    t.needs = Needs::SharedArena;
    return t;
  }
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
  void allreduce(const GroupFacts& g, const Operation&, const AllreduceArgs& a) override {
    allreduceSmallShared(*g.arena, a);
  }
  void allgather(const GroupFacts& g, const Operation&, const AllgatherArgs& a) override {
    allgatherSmallShared(*g.arena, a);
  }
  void broadcast(const GroupFacts& g, const Operation&, const BroadcastArgs& a) override {
    broadcastSmallShared(*g.arena, a);
  }
  void barrier(const GroupFacts& g, const Operation&, const BarrierArgs& a) override {
    barrierSmallShared(*g.arena, a);
  }
};

}  // namespace

std::shared_ptr<Provider> makeSmallSharedProvider() {
  return std::make_shared<SmallSharedProvider>();
}

}  // namespace hetra::comm
