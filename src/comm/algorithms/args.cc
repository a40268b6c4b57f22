#include "comm/algorithms/args.h"

#include <numeric>

#include "comm/codec/codec.h"
#include "comm/providers/registry.h"
#include "common/errors.h"

namespace hetra::comm {

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::Allreduce:
      return "allreduce";
    case OpKind::ReduceScatter:
      return "reduce-scatter";
    case OpKind::Allgather:
      return "allgather";
    case OpKind::Broadcast:
      return "broadcast";
    case OpKind::Barrier:
      return "barrier";
  }
  return "?";
}

size_t totalCount(const std::vector<size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), size_t(0));
}

namespace {
uint64_t hashCounts(const std::vector<size_t>& counts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the counts
  for (size_t c : counts) {
    h ^= uint64_t(c);
    h *= 1099511628211ull;
  }
  return h;
}
}  // namespace

OpHeader OpHeader::of(const AllreduceArgs& a) {
  OpHeader h;
  h.seq = a.seq;
  h.provider = a.provider;
  h.count = a.count;
  h.kind = uint8_t(OpKind::Allreduce);
  h.dtype = uint8_t(a.dtype);
  h.op = uint8_t(a.op);
  return h;
}

OpHeader OpHeader::of(const ReduceScatterArgs& a) {
  OpHeader h;
  h.seq = a.seq;
  h.provider = a.provider;
  h.count = totalCount(a.counts);
  h.countsHash = hashCounts(a.counts);
  h.kind = uint8_t(OpKind::ReduceScatter);
  h.dtype = uint8_t(a.dtype);
  h.op = uint8_t(a.op);
  return h;
}

OpHeader OpHeader::of(const AllgatherArgs& a) {
  OpHeader h;
  h.seq = a.seq;
  h.provider = a.provider;
  h.count = totalCount(a.counts);
  h.countsHash = hashCounts(a.counts);
  h.kind = uint8_t(OpKind::Allgather);
  h.dtype = uint8_t(a.dtype);
  return h;
}

OpHeader OpHeader::of(const BroadcastArgs& a) {
  OpHeader h;
  h.seq = a.seq;
  h.provider = a.provider;
  h.count = a.count;
  h.kind = uint8_t(OpKind::Broadcast);
  h.dtype = uint8_t(a.dtype);
  h.root = int16_t(a.root);
  return h;
}

OpHeader OpHeader::of(const BarrierArgs& a) {
  OpHeader h;
  h.seq = a.seq;
  h.provider = a.provider;
  h.kind = uint8_t(OpKind::Barrier);
  return h;
}

bool OpHeader::operator==(const OpHeader& o) const {
  return seq == o.seq && count == o.count && countsHash == o.countsHash && kind == o.kind &&
         dtype == o.dtype && op == o.op && codec == o.codec && root == o.root &&
         provider == o.provider;
}

std::string OpHeader::describe() const {
  std::string text = str(opKindName(OpKind(kind)), " #", seq);
  if (OpKind(kind) == OpKind::Barrier) return text;
  text += str(" of ", count, " ", dtypeName(DType(dtype)));
  if (OpKind(kind) == OpKind::Allreduce || OpKind(kind) == OpKind::ReduceScatter)
    text += str(" (", reduceOpName(ReduceOp(op)), ")");
  if (OpKind(kind) == OpKind::Broadcast) text += str(" from root ", root);
  if (codec != 0) text += str(" compressed ", compressionName(Compression(codec)));
  text += str(" by provider ", providerName(provider));
  if (countsHash != 0 && OpKind(kind) != OpKind::Allreduce)
    text += str(" counts#", countsHash % 100000);
  return text;
}

void checkHeaders(const OpHeader& mine, int myRank, const OpHeader& theirs, int theirRank) {
  if (mine == theirs) return;
  throw MismatchError(str("mismatched collective: rank ", myRank, " called ", mine.describe(),
                          " but rank ", theirRank, " called ", theirs.describe()));
}

}  // namespace hetra::comm
