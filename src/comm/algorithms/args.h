// Arguments of the collective algorithms (an options object per collective, as in Gloo) and the
// header that ranks compare before any data moves, so mismatched calls fail on every rank instead
// of hanging or overrunning a buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/reduce.h"
#include "common/dtype.h"
#include "common/timing.h"

namespace hetra::comm {

enum class OpKind : uint8_t { Allreduce, ReduceScatter, Allgather, Broadcast, Barrier };
constexpr OpKind kOpKinds[] = {OpKind::Allreduce, OpKind::ReduceScatter, OpKind::Allgather,
                               OpKind::Broadcast, OpKind::Barrier};
const char* opKindName(OpKind kind);  // "reduce-scatter": in messages
const char* opKindKey(OpKind kind);   // "reducescatter": in HETRA_ALGO and on the command line

// in: count elements; out: count elements (out may equal in).
struct AllreduceArgs {
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  uint64_t seq = 0;  // the group's operation number: every rank passes the same one
  Deadline deadline{};
  uint8_t provider = 0;  // set by the communicator; travels in the header
  // Compressed float32 allreduce only: this rank's error feedback state, count elements, updated
  // in place (see compressed.h); nullptr for none.
  float* residual = nullptr;
  // A float32 or float64 sum of premultiplied inputs: this rank's `in` counts inputScale times
  // (OpPolicy::inputScale), multiplied in as the algorithm first reads it; `in` stays as it was.
  // Set only for a provider whose traits say scalesInput.
  double inputScale = 1.0;
};

// in: sum(counts) elements, laid out as the ranks' blocks in rank order; out: counts[rank]
// elements.
struct ReduceScatterArgs {
  const void* in = nullptr;
  void* out = nullptr;
  std::vector<size_t> counts;  // one per rank; may differ (uneven)
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  uint64_t seq = 0;
  Deadline deadline{};
  uint8_t provider = 0;
  // Compressed float32 reduce-scatter only: this rank's error feedback state, sum(counts)
  // elements shaped as `in` (its own block stays zero: it is never encoded); nullptr for none.
  float* residual = nullptr;
};

// in: counts[rank] elements; out: sum(counts) elements in rank order. `in` may point into `out` at
// this rank's block (in-place allgather).
struct AllgatherArgs {
  const void* in = nullptr;
  void* out = nullptr;
  std::vector<size_t> counts;
  DType dtype = DType::F32;
  uint64_t seq = 0;
  Deadline deadline{};
  uint8_t provider = 0;
};

struct BroadcastArgs {
  void* buf = nullptr;
  size_t count = 0;
  DType dtype = DType::F32;
  int root = 0;
  uint64_t seq = 0;
  Deadline deadline{};
  uint8_t provider = 0;
};

struct BarrierArgs {
  uint64_t seq = 0;
  Deadline deadline{};
  uint8_t provider = 0;
};

// The largest group: a rank number fits the header's 16-bit root.
constexpr int kMaxGroupSize = 32767;

// What one rank was asked to do; equal on every rank for a well-formed call. 32 bytes on the wire.
struct OpHeader {
  uint64_t seq = 0;
  uint64_t count = 0;  // total elements (allreduce: count; reduce-scatter/allgather: sum(counts))
  uint64_t countsHash = 0;  // hash of the per-rank counts (0 when not uneven-capable)
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t codec = 0;     // Compression of the bytes on the wire (0: none)
  int16_t root = 0;      // broadcast only (groups have at most kMaxGroupSize ranks)
  uint8_t provider = 0;  // the provider that runs it (providers/registry.h): ranks must agree
  uint8_t reserved = 0;

  static OpHeader of(const AllreduceArgs& a);
  static OpHeader of(const ReduceScatterArgs& a);
  static OpHeader of(const AllgatherArgs& a);
  static OpHeader of(const BroadcastArgs& a);
  static OpHeader of(const BarrierArgs& a);
  bool operator==(const OpHeader& other) const;
  std::string describe() const;  // "allreduce seq 7 of 1000 float32 (sum)"
};
static_assert(sizeof(OpHeader) == 32);

// Throws MismatchError on every rank that sees a difference, naming both ranks and both calls.
void checkHeaders(const OpHeader& mine, int myRank, const OpHeader& theirs, int theirRank);

size_t totalCount(const std::vector<size_t>& counts);

}  // namespace hetra::comm
