// AlgorithmProvider: a provider made of free functions over one group capability (a Transport or
// a SharedArena), the algorithms of comm/algorithms/. A provider file then says only what is its
// own: its name, its traits beyond the operations, when it cannot run, and its cost.
#pragma once

#include "comm/providers/provider.h"
#include "comm/transport/shared_arena.h"
#include "comm/transport/transport.h"

namespace hetra::comm {

// One function per collective; null where the provider has none.
template <typename Capability>
struct AlgorithmSet {
  void (*allreduce)(Capability&, const AllreduceArgs&) = nullptr;
  void (*reduceScatter)(Capability&, const ReduceScatterArgs&) = nullptr;
  void (*allgather)(Capability&, const AllgatherArgs&) = nullptr;
  void (*broadcast)(Capability&, const BroadcastArgs&) = nullptr;
  void (*barrier)(Capability&, const BarrierArgs&) = nullptr;

  // The operations this set has, as ProviderTraits::ops.
  uint32_t ops() const {
    return (allreduce ? bitOf(OpKind::Allreduce) : 0) |
           (reduceScatter ? bitOf(OpKind::ReduceScatter) : 0) |
           (allgather ? bitOf(OpKind::Allgather) : 0) | (broadcast ? bitOf(OpKind::Broadcast) : 0) |
           (barrier ? bitOf(OpKind::Barrier) : 0);
  }
};

template <typename Capability>
class AlgorithmProvider : public Provider {
 public:
  explicit AlgorithmProvider(AlgorithmSet<Capability> set) : set_(set) {}

  // The traits every provider of this capability has; a provider adjusts them.
  ProviderTraits traits() const override {
    ProviderTraits t;
    t.ops = set_.ops();
    if constexpr (std::is_same_v<Capability, SharedArena>) t.needs = Needs::SharedArena;
    return t;
  }

  void allreduce(const GroupFacts& g, const Operation&, const AllreduceArgs& a) override {
    set_.allreduce(capability(g), a);
  }
  void reduceScatter(const GroupFacts& g, const Operation&, const ReduceScatterArgs& a) override {
    set_.reduceScatter(capability(g), a);
  }
  void allgather(const GroupFacts& g, const Operation&, const AllgatherArgs& a) override {
    set_.allgather(capability(g), a);
  }
  void broadcast(const GroupFacts& g, const Operation&, const BroadcastArgs& a) override {
    set_.broadcast(capability(g), a);
  }
  void barrier(const GroupFacts& g, const Operation&, const BarrierArgs& a) override {
    set_.barrier(capability(g), a);
  }

 private:
  static Capability& capability(const GroupFacts& g) {
    if constexpr (std::is_same_v<Capability, SharedArena>)
      return *g.arena;
    else
      return *g.transport;
  }

  AlgorithmSet<Capability> set_;
};

}  // namespace hetra::comm
