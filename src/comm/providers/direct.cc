// Provider "direct": the one-round allreduce of algorithms/ring.h (allreduceDirect) over any
// Transport: a header exchange with every peer, then every rank's whole buffer to every other
// rank. Two latencies where the ring pays 2 (n-1), for n-1 buffers of traffic per rank where the
// ring sends 2 (n-1)/n of one: the cost model keeps it to small messages.
#include "comm/algorithms/ring.h"
#include "comm/link_cost.h"
#include "comm/providers/algorithm_provider.h"

namespace hetra::comm {
namespace {

// Every rank keeps n buffers in scratch and posts 2 (n-1) requests at once.
constexpr int kMaxRanks = 16;

class DirectProvider final : public AlgorithmProvider<Transport> {
 public:
  DirectProvider() : AlgorithmProvider({allreduceDirect}) {}
  const char* name() const override { return "direct"; }
  const char* whyNot(const Operation&, const GroupFacts& group) const override {
    return group.size <= kMaxRanks ? nullptr : "it takes groups of at most 16 ranks";
  }
  // The n-1 received buffers are reduced after they arrived, where the ring reduces each segment
  // while the next one travels: without that term two ranks, whose ring moves the same bytes with
  // one latency more, always chose direct (64 MiB over tcp: 126 ms, the ring 40).
  double seconds(const Operation& op, const GroupFacts& group) const override {
    if (group.size == 1) return 0;
    const double received = double(group.size - 1) * double(op.bytes);
    return group.link.seconds(2, received) + received / kHostReduceBytesPerSecond;
  }
};

}  // namespace

std::shared_ptr<Provider> makeDirectProvider() {
  return std::make_shared<DirectProvider>();
}

}  // namespace hetra::comm
