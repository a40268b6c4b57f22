// Provider "ring": the collectives of algorithms/ring.h over any Transport. Every group qualifies,
// so it is the table's fallback; its cost is the textbook ring's (Patarasuk and Yuan): a header
// round, then n-1 steps per phase, each carrying 1/n of the buffer.
#include <cmath>

#include "comm/algorithms/ring.h"
#include "comm/providers/algorithm_provider.h"

namespace hetra::comm {
namespace {

class RingProvider final : public AlgorithmProvider<Transport> {
 public:
  RingProvider()
      : AlgorithmProvider({allreduceRing, reduceScatterRing, allgatherRing, broadcastPipelined,
                           barrierDissemination}) {}
  const char* name() const override { return "ring"; }
  double seconds(const Operation& op, const GroupFacts& group) const override {
    const double n = group.size, bytes = double(op.bytes);
    if (group.size == 1) return 0;
    switch (op.kind) {
      case OpKind::Allreduce:
        return group.link.seconds(1 + 2 * (n - 1), 2 * (n - 1) / n * bytes);
      case OpKind::ReduceScatter:
      case OpKind::Allgather:
        return group.link.seconds(1 + (n - 1), (n - 1) / n * bytes);
      case OpKind::Broadcast:  // pipelined along the ring: the whole buffer crosses each link
        return group.link.seconds(1 + (n - 1), bytes);
      case OpKind::Barrier:  // dissemination: ceil(log2 n) rounds
        return group.link.seconds(std::ceil(std::log2(n)), 0);
    }
    return 0;
  }
};

}  // namespace

std::shared_ptr<Provider> makeRingProvider() {
  return std::make_shared<RingProvider>();
}

}  // namespace hetra::comm
