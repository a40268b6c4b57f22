#include "comm/policy.h"

namespace hetra::comm {

CompressionPolicy::CompressionPolicy(Compression codec, size_t block, size_t minBytes)
    : kind_(codec), block_(block), minBytes_(minBytes) {
  if (kind_ != Compression::None) codec_ = makeCodec(kind_, block_);
}

const Codec* CompressionPolicy::codecFor(OpKind kind, DType dtype, ReduceOp op,
                                         size_t bytes) const {
  if (!codec_ || dtype != DType::F32 || bytes < minBytes_) return nullptr;
  switch (kind) {
    case OpKind::Allreduce:
    case OpKind::ReduceScatter:
      return op == ReduceOp::Sum || op == ReduceOp::Avg ? codec_.get() : nullptr;
    case OpKind::Allgather:
      return codec_.get();
    case OpKind::Broadcast:
    case OpKind::Barrier:
      return nullptr;
  }
  return nullptr;
}

}  // namespace hetra::comm
