// Per-operation policy: how one collective may trade exactness for bytes on the wire. It is an
// argument of the operation, chosen by its caller (DataParallel asks for its gradients; a parameter
// allgather stays exact), never a property of the group.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/algorithms/args.h"
#include "comm/codec/codec.h"
#include "comm/reduce.h"
#include "common/dtype.h"

namespace hetra::comm {

// Float32 sum (or avg) allreduce and reduce-scatter, and float32 allgather, may travel encoded;
// every other operation is exact whatever the policy says.
class CompressionPolicy {
 public:
  CompressionPolicy() = default;
  // `minBytes`: smaller operations stay float32 (their cost is latency, not bytes).
  CompressionPolicy(Compression codec, size_t block = 256, size_t minBytes = 65536);

  Compression compression() const { return kind_; }
  size_t block() const { return block_; }
  size_t minBytes() const { return minBytes_; }
  bool enabled() const { return kind_ != Compression::None; }

  // The codec an operation of this kind, dtype, op and size travels under, or null when it stays
  // exact. Equal on every rank for equal arguments.
  const Codec* codecFor(OpKind kind, DType dtype, ReduceOp op, size_t bytes) const;

 private:
  Compression kind_ = Compression::None;
  size_t block_ = 256;
  size_t minBytes_ = 65536;
  std::shared_ptr<const Codec> codec_;  // shared: policies are copied into queued operations
};

struct OpPolicy {
  // The bytes on a flat group's wire, or, in a group of islands, on the level between them.
  CompressionPolicy compression;
  // Inside the islands of a hierarchy (exact unless asked).
  CompressionPolicy islandCompression;
  // Error feedback for a compressed float32 allreduce or reduce-scatter (algorithms/compressed.h):
  // as many floats as the operation's input, this rank's own state, zero at first, kept by the
  // caller from call to call; used only where the operation is compressed on a flat group
  // (Communicator::feedbackCodec says so), left as it is otherwise.
  float* residual = nullptr;
  // An allreduce's input is multiplied by this rank's factor before the sum (NCCL's premultiplied
  // sum): each rank weighs its own contribution, e.g. by its share of a global batch.
  // Floating-point sum or avg only. Applied by the communicator's thread in the operation's first
  // pass over the input, so the caller's thread does not pass over the buffer.
  double inputScale = 1.0;
};

}  // namespace hetra::comm
