// Provider "recursive-doubling": the tiny-message allreduce of algorithms/small_tcp.h over any
// Transport: ceil(log2 n) exchanges (two more when n is not a power of two) of one fixed-size
// envelope that carries the header beside the data, where the ring needs a header round and
// 2 (n-1) steps.
#include <bit>

#include "comm/algorithms/small_tcp.h"
#include "comm/providers/algorithm_provider.h"

namespace hetra::comm {
namespace {

class RecursiveDoublingProvider final : public AlgorithmProvider<Transport> {
 public:
  RecursiveDoublingProvider() : AlgorithmProvider({allreduceRecursiveDoubling}) {}
  const char* name() const override { return "recursive-doubling"; }
  const char* whyNot(const Operation& op, const GroupFacts&) const override {
    return op.bytes <= recursiveDoublingCapacity() ? nullptr
                                                   : "the operation does not fit its envelope";
  }
  double seconds(const Operation& op, const GroupFacts& group) const override {
    return recursiveDoublingSeconds(op.bytes, group.size, group.link.latencySeconds,
                                    group.link.bytesPerSecond);
  }
};

}  // namespace

std::shared_ptr<Provider> makeRecursiveDoublingProvider() {
  return std::make_shared<RecursiveDoublingProvider>();
}

}  // namespace hetra::comm
