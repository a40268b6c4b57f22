// Provider "shared": the collectives of algorithms/shared.h through the group's SharedArena. Its
// cost counts the arena's sync points and the bytes each rank copies: an allreduce copies its
// input into its slot, reduces its slice from every slot and copies every slice out (about three
// buffers of memory traffic), with a sync point to publish the header and two per piece after it.
// A small operation travels with the header's sync point and needs no other, but every rank reads
// every peer's small buffer and header.
#include <algorithm>
#include <cmath>

#include "comm/algorithms/shared.h"
#include "comm/providers/algorithm_provider.h"
#include "comm/transport/shared_arena.h"

namespace hetra::comm {
namespace {

class SharedProvider final : public AlgorithmProvider<SharedArena> {
 public:
  SharedProvider()
      : AlgorithmProvider({allreduceShared, reduceScatterShared, allgatherShared, broadcastShared,
                           barrierShared}) {}
  const char* name() const override { return "shared"; }
  ProviderTraits traits() const override {
    ProviderTraits t = AlgorithmProvider::traits();
    t.scalesInput = true;
    return t;
  }
  double seconds(const Operation& op, const GroupFacts& group) const override {
    if (group.size == 1) return 0;
    const double n = group.size, bytes = double(op.bytes);
    constexpr double kHeaderBytes = 64;  // one cache line per peer's header
    if (op.kind != OpKind::Barrier && op.bytes <= sharedSmallBytes(*group.arena))
      return group.arenaLink.seconds(1, (n + 1) * bytes + n * kHeaderBytes);
    // Pieces move one after another through a third of a slot each.
    const double piece = std::max<double>(1, double(group.arena->slotBytes()) / 3);
    const double pieces = std::ceil(bytes / piece);
    switch (op.kind) {
      case OpKind::Allreduce:
      case OpKind::ReduceScatter:
      case OpKind::Allgather:
        return group.arenaLink.seconds(1 + 2 * pieces, 3 * bytes);
      case OpKind::Broadcast:
        return group.arenaLink.seconds(1 + pieces, 2 * bytes);
      case OpKind::Barrier:  // its sync point, then every peer's header from another line
        return group.arenaLink.seconds(1, n * kHeaderBytes);
    }
    return 0;
  }
};

}  // namespace

std::shared_ptr<Provider> makeSharedProvider() {
  return std::make_shared<SharedProvider>();
}

}  // namespace hetra::comm
