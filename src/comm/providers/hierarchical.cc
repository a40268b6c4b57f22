// Provider "hierarchical": the island-aware allreduce, reduce-scatter and allgather of hierarchy.h,
// for groups of several islands. The operation's compression policy applies to the level between
// islands (and its island policy inside them), so it runs exact and compressed operations alike.
// Its cost is the hierarchy's own model of its two levels.
#include "comm/hierarchy.h"
#include "comm/providers/provider.h"

namespace hetra::comm {
namespace {

class HierarchicalProvider final : public Provider {
 public:
  const char* name() const override { return "hierarchical"; }
  ProviderTraits traits() const override {
    ProviderTraits t;
    t.ops = bitOf(OpKind::Allreduce) | bitOf(OpKind::ReduceScatter) | bitOf(OpKind::Allgather);
    t.needs = Needs::Hierarchy;
    t.compressed = true;
    return t;
  }
  double seconds(const Operation& op, const GroupFacts& group) const override {
    return group.hierarchy->seconds(op.kind, op.bytes, wireRatio(op));
  }
  void allreduce(const GroupFacts& g, const Operation& op, const AllreduceArgs& a) override {
    g.hierarchy->allreduce(a, *op.policy);
  }
  void reduceScatter(const GroupFacts& g, const Operation& op,
                     const ReduceScatterArgs& a) override {
    g.hierarchy->reduceScatter(a, *op.policy);
  }
  void allgather(const GroupFacts& g, const Operation& op, const AllgatherArgs& a) override {
    g.hierarchy->allgather(a, *op.policy);
  }
};

}  // namespace

std::shared_ptr<Provider> makeHierarchicalProvider() {
  return std::make_shared<HierarchicalProvider>();
}

}  // namespace hetra::comm
