#include "comm/algorithms/args.h"

#include <iterator>
#include <numeric>

#include "comm/codec/codec.h"
#include "comm/providers/registry.h"
#include "common/errors.h"
#include "common/names.h"

namespace hetra::comm {

namespace {
// In messages, and in HETRA_ALGO and on the command line.
constexpr NamedValue<OpKind> kOpKindNames[] = {{OpKind::Allreduce, "allreduce"},
                                               {OpKind::ReduceScatter, "reduce-scatter"},
                                               {OpKind::Allgather, "allgather"},
                                               {OpKind::Broadcast, "broadcast"},
                                               {OpKind::Barrier, "barrier"}};
constexpr NamedValue<OpKind> kOpKindKeys[] = {{OpKind::Allreduce, "allreduce"},
                                              {OpKind::ReduceScatter, "reducescatter"},
                                              {OpKind::Allgather, "allgather"},
                                              {OpKind::Broadcast, "broadcast"},
                                              {OpKind::Barrier, "barrier"}};
static_assert(coversEnum(kOpKindNames, OpKind::Barrier) &&
              coversEnum(kOpKindKeys, OpKind::Barrier));
}  // namespace

// A header from the wire may carry any kind: an unknown one is named "?" (nameOf).
const char* opKindName(OpKind kind) {
  return nameOf(kind, kOpKindNames);
}

const char* opKindKey(OpKind kind) {
  return nameOf(kind, kOpKindKeys);
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

// The fields every operation's header has.
OpHeader headerOf(OpKind kind, uint64_t seq, uint8_t provider, DType dtype, uint64_t count) {
  OpHeader h;
  h.seq = seq;
  h.provider = provider;
  h.kind = uint8_t(kind);
  h.dtype = uint8_t(dtype);
  h.count = count;
  return h;
}

}  // namespace

OpHeader OpHeader::of(const AllreduceArgs& a) {
  OpHeader h = headerOf(OpKind::Allreduce, a.seq, a.provider, a.dtype, a.count);
  h.op = uint8_t(a.op);
  return h;
}

OpHeader OpHeader::of(const ReduceScatterArgs& a) {
  OpHeader h = headerOf(OpKind::ReduceScatter, a.seq, a.provider, a.dtype, totalCount(a.counts));
  h.countsHash = hashCounts(a.counts);
  h.op = uint8_t(a.op);
  return h;
}

OpHeader OpHeader::of(const AllgatherArgs& a) {
  OpHeader h = headerOf(OpKind::Allgather, a.seq, a.provider, a.dtype, totalCount(a.counts));
  h.countsHash = hashCounts(a.counts);
  return h;
}

OpHeader OpHeader::of(const BroadcastArgs& a) {
  OpHeader h = headerOf(OpKind::Broadcast, a.seq, a.provider, a.dtype, a.count);
  h.root = int16_t(a.root);
  return h;
}

OpHeader OpHeader::of(const BarrierArgs& a) {
  // dtype 0 and count 0: a barrier moves no data.
  return headerOf(OpKind::Barrier, a.seq, a.provider, DType(0), 0);
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
