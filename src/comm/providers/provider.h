// Provider: one implementation of collectives (ring, shared memory, compressed, hierarchical, ...),
// as the communicator sees it. The communicator keeps one ordered table of providers
// (providers/registry.h) and runs, for each operation, the cheapest one that qualifies.
//
// Vocabulary:
//   operation    what a caller asked for: a kind (allreduce, ...), a dtype, a reduce op, a size in
//                bytes, where the buffers live and a compression policy. Equal on every rank of a
//                well-formed call.
//   group facts  what every rank of a group knows alike: its size, whether its transport offers a
//                shared arena, its hierarchy of islands, the link costs of its levels.
//   qualifies    the provider declares the operation's kind, dtype, reduce op and buffer place, the
//                group has the capability it needs, and (for a compressed policy) it implements
//                compression; then whyNot() has the last word.
//   cost         the provider's predicted seconds for the operation: its own count of
//                synchronisations and of bytes it moves, priced by the group's link costs (two
//                providers over one arena differ in synchronisations and copies, not in links).
// The choice depends only on the operation and the group facts, so every rank makes the same one;
// the provider's id also travels in the operation header, so ranks that disagree fail with a
// MismatchError where their providers meet in a header check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "comm/algorithms/args.h"
#include "comm/codec/codec.h"
#include "comm/link_cost.h"
#include "comm/policy.h"
#include "comm/reduce.h"
#include "common/dtype.h"

namespace hetra::comm {

class Transport;
class SharedArena;
class Hierarchy;

// Bit sets of what a provider declares.
constexpr uint32_t bitOf(OpKind kind) {
  return 1u << unsigned(kind);
}
constexpr uint32_t bitOf(DType dtype) {
  return 1u << unsigned(dtype);
}
constexpr uint32_t bitOf(ReduceOp op) {
  return 1u << unsigned(op);
}
constexpr uint32_t kAllOps = bitOf(OpKind::Allreduce) | bitOf(OpKind::ReduceScatter) |
                             bitOf(OpKind::Allgather) | bitOf(OpKind::Broadcast) |
                             bitOf(OpKind::Barrier);
constexpr uint32_t kAllDtypes = 0xffffffffu;
// Providers implement sum, min and max; the communicator reduces avg as sum and divides once.
constexpr uint32_t kAllReduceOps =
    bitOf(ReduceOp::Sum) | bitOf(ReduceOp::Min) | bitOf(ReduceOp::Max);

enum class BufferPlace : uint8_t { Host = 0, Cuda = 1, Rocm = 2 };
constexpr uint32_t bitOf(BufferPlace place) {
  return 1u << unsigned(place);
}

// The group capability a provider runs on.
enum class Needs : uint8_t {
  Transport,     // point-to-point messages (every group has them)
  SharedArena,   // memory every rank maps (Transport::sharedArena())
  Hierarchy,     // islands of fast links joined by slower ones
  NativeLibrary  // a library's own group (NCCL, RCCL): the transport is that library
};

struct ProviderTraits {
  uint32_t ops = 0;                            // bitOf(OpKind) set
  uint32_t dtypes = kAllDtypes;                // bitOf(DType) set
  uint32_t reduceOps = kAllReduceOps;          // bitOf(ReduceOp) set (reducing ops only)
  uint32_t places = bitOf(BufferPlace::Host);  // bitOf(BufferPlace) set
  Needs needs = Needs::Transport;
  // Runs exact operations, and operations whose policy asks for a codec (a provider qualifies only
  // for the kind it runs).
  bool exact = true;
  bool compressed = false;
  // Keeps error feedback in OpPolicy::residual (a compressed allreduce or reduce-scatter).
  bool feedsBackErrors = false;
  // Its allreduce multiplies this rank's input by AllreduceArgs::inputScale as it copies it in;
  // for the others the communicator scales the input in a pass of its own first.
  bool scalesInput = false;
};

// One operation as the table sees it.
struct Operation {
  OpKind kind = OpKind::Allreduce;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;  // Avg already turned into Sum
  size_t bytes = 0;             // the whole buffer (reduce-scatter: input; allgather: output)
  BufferPlace place = BufferPlace::Host;
  // The codec the operation's policy puts on the wire of this group (flat) or of the level between
  // islands (hierarchy), or null for an exact operation (CompressionPolicy::codecFor).
  const Codec* codec = nullptr;
  const OpPolicy* policy = nullptr;  // never null while the table chooses
  uint8_t provider = 0;              // the chosen provider's id, once chosen
};

// What a provider may use, alike on every rank.
struct GroupFacts {
  int rank = 0;
  int size = 1;
  Transport* transport = nullptr;
  SharedArena* arena = nullptr;    // null when the transport has none
  Hierarchy* hierarchy = nullptr;  // null for a group of one island
  LinkCost link;                   // a point-to-point message of the group's transport
  LinkCost arenaLink;              // a sync point and a copy through the arena
  bool hasNativeLibrary = false;   // the transport is a native library's group
};

// Wire bytes per buffer byte of `op` (1 for an exact or empty operation).
inline double wireRatio(const Operation& op) {
  if (!op.codec || op.bytes == 0) return 1.0;
  return double(op.codec->encodedBytes(op.bytes / sizeof(float))) / double(op.bytes);
}

class Provider {
 public:
  virtual ~Provider() = default;
  virtual const char* name() const = 0;
  virtual ProviderTraits traits() const = 0;
  // Null when the provider can run `op` in this group beyond what traits() declares (e.g. it
  // fits the arena's slots), else why not, as a static text (the choice runs for every operation
  // and must not allocate). Called only for operations the traits allow.
  virtual const char* whyNot(const Operation& op, const GroupFacts& group) const {
    (void)op;
    (void)group;
    return nullptr;
  }
  // Predicted seconds of `op` in this group. Like whyNot(), a function of the operation's kind,
  // dtype, reduce op, place, size and codec and of the group facts only: the communicator remembers
  // its choices by them (choice_cache.h).
  virtual double seconds(const Operation& op, const GroupFacts& group) const = 0;

  // The collectives (c10d's shape): each defaults to an error naming the provider and the
  // operation; a provider overrides those its traits declare. `codec` is Operation::codec.
  virtual void allreduce(const GroupFacts& group, const Operation& op, const AllreduceArgs& args);
  virtual void reduceScatter(const GroupFacts& group, const Operation& op,
                             const ReduceScatterArgs& args);
  virtual void allgather(const GroupFacts& group, const Operation& op, const AllgatherArgs& args);
  virtual void broadcast(const GroupFacts& group, const Operation& op, const BroadcastArgs& args);
  virtual void barrier(const GroupFacts& group, const Operation& op, const BarrierArgs& args);
};

}  // namespace hetra::comm
