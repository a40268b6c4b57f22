// Compressed collectives (see compressed.h for the error bound).
//
// Vocabulary (as in ring.cc): block b is the part of the buffer rank b reduces (allreduce: an even
// split; reduce-scatter and allgather: the caller's counts); a segment is one message, a fixed
// number of elements of a block, encoded on its own so that encoding, the wire and decoding
// overlap. The encoded buffer keeps the blocks in rank order, segment after segment.
//
//   reduce phase: rank r encodes block b of its input for every b != r and sends it to rank b;
//                 it adds the n-1 encoded contributions to its own block r in float32.
//   gather phase: rank r encodes its reduced block once, decodes it in place (so its copy has the
//                 bits everyone else gets) and sends it to every other rank, which decodes it.
// Both phases send straight to the destination; all receives are posted before any send.
// With error feedback, what is encoded is value + residual, and the residual becomes what that
// encoding lost.
#include "comm/algorithms/compressed.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/p2p.h"
#include "common/errors.h"

namespace hetra::comm {
namespace {

// Segments are whole codec blocks, so that a block split into blocks of the codec encodes block
// for block as encode() over the whole buffer would, when the blocks start at codec-block
// multiples (alignedSplit): error feedback relies on it.
class EncodedLayout {
 public:
  EncodedLayout(const Codec& codec, std::vector<size_t> counts)
      : codec_(codec), count_(std::move(counts)) {
    const size_t align = codec.blockSize();
    perSegment_ = std::max(align, segmentBytes() / sizeof(float) / align * align);
    fullSegmentBytes_ = codec.encodedBytes(perSegment_);
    offset_.resize(count_.size());
    byteOffset_.resize(count_.size());
    size_t elements = 0, bytes = 0;
    for (size_t b = 0; b < count_.size(); ++b) {
      offset_[b] = elements;
      byteOffset_[b] = bytes;
      elements += count_[b];
      bytes += blockBytes(b);
      maxSegments_ = std::max(maxSegments_, segments(b));
    }
    totalBytes_ = bytes;
  }

  size_t count(size_t b) const { return count_[b]; }
  size_t offset(size_t b) const { return offset_[b]; }
  size_t segments(size_t b) const { return (count_[b] + perSegment_ - 1) / perSegment_; }
  size_t segmentElements() const { return perSegment_; }
  size_t maxSegments() const { return maxSegments_; }
  // Segment k of block b, relative to the block's first element.
  size_t segBegin(size_t k) const { return k * perSegment_; }
  size_t segSize(size_t b, size_t k) const {
    return std::min(perSegment_, count_[b] - segBegin(k));
  }
  size_t segBytes(size_t b, size_t k) const { return codec_.encodedBytes(segSize(b, k)); }
  // Where segment k of block b starts, relative to the block's encoded start.
  size_t segByteOffset(size_t k) const { return k * fullSegmentBytes_; }
  size_t byteOffset(size_t b) const { return byteOffset_[b]; }
  size_t blockBytes(size_t b) const {
    const size_t full = count_[b] / perSegment_, rest = count_[b] % perSegment_;
    return full * fullSegmentBytes_ + (rest ? codec_.encodedBytes(rest) : 0);
  }
  size_t totalBytes() const { return totalBytes_; }

 private:
  const Codec& codec_;
  std::vector<size_t> count_, offset_, byteOffset_;
  size_t perSegment_ = 0, fullSegmentBytes_ = 0, maxSegments_ = 0, totalBytes_ = 0;
};

// An even split of count into n blocks that start at multiples of `align` elements.
std::vector<size_t> alignedSplit(size_t count, int n, size_t align) {
  const size_t units = (count + align - 1) / align;
  std::vector<size_t> counts = evenSplit(units, n);
  size_t left = count;
  for (auto& c : counts) {
    c = std::min(c * align, left);
    left -= c;
  }
  return counts;
}

void checkFloatSum(DType dtype, ReduceOp op, const char* what) {
  HETRA_ENFORCE(dtype == DType::F32, what, ": compression applies to float32 only, not ",
                dtypeName(dtype));
  HETRA_ENFORCE(op == ReduceOp::Sum || op == ReduceOp::Avg, what,
                ": compression applies to sum and avg only, not ", reduceOpName(op));
}

OpHeader compressedHeader(OpHeader header, const Codec& codec) {
  header.codec = uint8_t(codec.kind());
  return header;
}

// The opening of a compressed collective over per-rank blocks (reduce-scatter, allgather): one
// count per rank, the headers compared with every rank's, then the blocks' encoded layout.
template <typename BlockArgs>
EncodedLayout openBlocks(Transport& transport, const BlockArgs& args, const Codec& codec,
                         const char* what) {
  HETRA_ENFORCE_EQ(args.counts.size(), size_t(transport.size()), what, ": one count per rank");
  exchangeHeaders(transport, compressedHeader(OpHeader::of(args), codec), args.deadline, true);
  return EncodedLayout(codec, args.counts);
}

// Encodes `count` values into `encoded`. With a residual: encodes values + residual (through
// `staging`, count floats) and leaves in residual what the encoding lost.
void encodeWithFeedback(const Codec& codec, const float* values, size_t count, uint8_t* encoded,
                        float* residual, float* staging) {
  if (!residual) {
    codec.encode(values, count, encoded);
    return;
  }
  for (size_t i = 0; i < count; ++i) staging[i] = values[i] + residual[i];
  codec.encode(staging, count, encoded);
  codec.decode(encoded, count, residual);
  for (size_t i = 0; i < count; ++i) residual[i] = staging[i] - residual[i];
}

// The reduce phase. `acc` holds block r of this rank's input and ends as the float32 sum of all
// ranks' block r; `wire` is the encoded buffer (blocks b != r are written and sent from here);
// `incoming` holds n-1 encoded copies of block r; `residual` (or nullptr) is the whole buffer's
// error feedback state and `staging` one segment of floats. onReduced(k) runs as soon as segment k
// of acc is complete. Sends may still be in flight on return (they are appended to `sends`).
template <class OnReduced>
void reduceToOwners(Transport& transport, const Codec& codec, const EncodedLayout& layout,
                    const float* in, float* acc, uint8_t* wire, uint8_t* incoming, float* residual,
                    float* staging, uint64_t tag, Deadline deadline, std::vector<RequestPtr>& sends,
                    OnReduced onReduced) {
  const int n = transport.size(), r = transport.rank();
  const size_t K = layout.segments(r);
  auto slot = [&](int i, size_t k) {
    return incoming + (i - 1) * layout.blockBytes(r) + layout.segByteOffset(k);
  };
  std::vector<RequestPtr> recvs((n - 1) * K);
  for (int i = 1; i < n; ++i)
    for (size_t k = 0; k < K; ++k)
      recvs[(i - 1) * K + k] =
          transport.irecv(mod(r - i, n), tag, slot(i, k), layout.segBytes(r, k));
  // Segment-major, so that every destination's first segment leaves early.
  for (size_t k = 0; k < layout.maxSegments(); ++k)
    for (int i = 1; i < n; ++i) {
      const int dst = mod(r + i, n);
      if (k >= layout.segments(dst)) continue;
      uint8_t* encoded = wire + layout.byteOffset(dst) + layout.segByteOffset(k);
      const size_t first = layout.offset(dst) + layout.segBegin(k);
      encodeWithFeedback(codec, in + first, layout.segSize(dst, k), encoded,
                         residual ? residual + first : nullptr, staging);
      sends.push_back(transport.isend(dst, tag, encoded, layout.segBytes(dst, k)));
    }
  for (size_t k = 0; k < K; ++k) {
    for (int i = 1; i < n; ++i) {
      recvs[(i - 1) * K + k]->wait(deadline);
      codec.decodeAdd(slot(i, k), layout.segSize(r, k), acc + layout.segBegin(k));
    }
    onReduced(k);
  }
}

// Posts the receives of every other rank's encoded block into `gathered` (same layout as `wire`).
std::vector<RequestPtr> postGatherReceives(Transport& transport, const EncodedLayout& layout,
                                           uint8_t* gathered, uint64_t tag) {
  const int n = transport.size(), r = transport.rank();
  std::vector<RequestPtr> recvs;
  for (int i = 1; i < n; ++i) {
    const int src = mod(r - i, n);
    for (size_t k = 0; k < layout.segments(src); ++k)
      recvs.push_back(transport.irecv(src, tag,
                                      gathered + layout.byteOffset(src) + layout.segByteOffset(k),
                                      layout.segBytes(src, k)));
  }
  return recvs;
}

// Encodes segment k of this rank's block (held in `block`, float32) into `wire`, replaces it with
// its decoded value and sends the encoding to every other rank. `residual` (or nullptr) is this
// block's error feedback state.
void shareSegment(Transport& transport, const Codec& codec, const EncodedLayout& layout,
                  float* block, uint8_t* wire, size_t k, float* residual, float* staging,
                  uint64_t tag, std::vector<RequestPtr>& sends) {
  const int n = transport.size(), r = transport.rank();
  uint8_t* encoded = wire + layout.byteOffset(r) + layout.segByteOffset(k);
  float* values = block + layout.segBegin(k);
  encodeWithFeedback(codec, values, layout.segSize(r, k), encoded,
                     residual ? residual + layout.segBegin(k) : nullptr, staging);
  codec.decode(encoded, layout.segSize(r, k), values);
  for (int i = 1; i < n; ++i)
    sends.push_back(transport.isend(mod(r + i, n), tag, encoded, layout.segBytes(r, k)));
}

// Waits for the gather receives (posted in (source, segment) order) and decodes them into out.
void decodeGathered(Transport& transport, const Codec& codec, const EncodedLayout& layout,
                    const uint8_t* gathered, float* out, std::vector<RequestPtr>& recvs,
                    Deadline deadline) {
  const int n = transport.size(), r = transport.rank();
  size_t next = 0;
  for (int i = 1; i < n; ++i) {
    const int src = mod(r - i, n);
    for (size_t k = 0; k < layout.segments(src); ++k) {
      recvs[next++]->wait(deadline);
      codec.decode(gathered + layout.byteOffset(src) + layout.segByteOffset(k),
                   layout.segSize(src, k), out + layout.offset(src) + layout.segBegin(k));
    }
  }
}

}  // namespace

void allreduceCompressed(Transport& transport, const AllreduceArgs& args, const Codec& codec) {
  checkFloatSum(args.dtype, args.op, "allreduce");
  HETRA_ENFORCE(args.count == 0 || (args.in && args.out), "allreduce: null buffer for ", args.count,
                " elements");
  const int n = transport.size(), r = transport.rank();
  exchangeHeaders(transport, compressedHeader(OpHeader::of(args), codec), args.deadline, true);
  const float* in = static_cast<const float*>(args.in);
  float* out = static_cast<float*>(args.out);
  if (n == 1 || args.count == 0) {
    if (args.count && in != out) std::memcpy(out, in, args.count * sizeof(float));
    return;
  }
  const EncodedLayout layout(codec, alignedSplit(args.count, n, codec.blockSize()));
  float* mine = out + layout.offset(r);
  if (in != out) std::memcpy(mine, in + layout.offset(r), layout.count(r) * sizeof(float));
  const size_t stagingBytes = args.residual ? layout.segmentElements() * sizeof(float) : 0;
  Scratch scratch(stagingBytes + 2 * layout.totalBytes() + (n - 1) * layout.blockBytes(r));
  float* staging = reinterpret_cast<float*>(scratch.data());
  uint8_t* wire = scratch.data() + stagingBytes;
  uint8_t* gathered = wire + layout.totalBytes();
  uint8_t* incoming = gathered + layout.totalBytes();
  const uint64_t reduceTag = opTag(args.seq, kCompressedReducePhase);
  const uint64_t gatherTag = opTag(args.seq, kCompressedGatherPhase);
  float* myResidual = args.residual ? args.residual + layout.offset(r) : nullptr;

  std::vector<RequestPtr> gatherRecvs = postGatherReceives(transport, layout, gathered, gatherTag);
  std::vector<RequestPtr> sends;
  reduceToOwners(transport, codec, layout, in, mine, wire, incoming, args.residual, staging,
                 reduceTag, args.deadline, sends, [&](size_t k) {
                   shareSegment(transport, codec, layout, mine, wire, k, myResidual, staging,
                                gatherTag, sends);
                 });
  decodeGathered(transport, codec, layout, gathered, out, gatherRecvs, args.deadline);
  waitAll(sends, args.deadline);
}

void reduceScatterCompressed(Transport& transport, const ReduceScatterArgs& args,
                             const Codec& codec) {
  checkFloatSum(args.dtype, args.op, "reduceScatter");
  const int n = transport.size(), r = transport.rank();
  const EncodedLayout layout = openBlocks(transport, args, codec, "reduceScatter");
  const float* in = static_cast<const float*>(args.in);
  float* out = static_cast<float*>(args.out);
  if (layout.count(r) && in + layout.offset(r) != out)
    std::memmove(out, in + layout.offset(r), layout.count(r) * sizeof(float));
  if (n == 1) return;
  const size_t stagingBytes = args.residual ? layout.segmentElements() * sizeof(float) : 0;
  Scratch scratch(stagingBytes + layout.totalBytes() + (n - 1) * layout.blockBytes(r));
  float* staging = reinterpret_cast<float*>(scratch.data());
  uint8_t* wire = scratch.data() + stagingBytes;
  uint8_t* incoming = wire + layout.totalBytes();
  std::vector<RequestPtr> sends;
  reduceToOwners(transport, codec, layout, in, out, wire, incoming, args.residual, staging,
                 opTag(args.seq, kCompressedReducePhase), args.deadline, sends, [](size_t) {});
  waitAll(sends, args.deadline);
}

void allgatherCompressed(Transport& transport, const AllgatherArgs& args, const Codec& codec) {
  HETRA_ENFORCE(args.dtype == DType::F32, "allgather: compression applies to float32 only, not ",
                dtypeName(args.dtype));
  const int n = transport.size(), r = transport.rank();
  const EncodedLayout layout = openBlocks(transport, args, codec, "allgather");
  const float* in = static_cast<const float*>(args.in);
  float* out = static_cast<float*>(args.out);
  float* mine = out + layout.offset(r);
  if (n == 1) {
    if (layout.count(r) && in != mine) std::memcpy(mine, in, layout.count(r) * sizeof(float));
    return;
  }
  Scratch scratch(2 * layout.totalBytes());
  uint8_t* wire = scratch.data();
  uint8_t* gathered = wire + layout.totalBytes();
  const uint64_t tag = opTag(args.seq, kCompressedGatherPhase);
  std::vector<RequestPtr> recvs = postGatherReceives(transport, layout, gathered, tag);
  std::vector<RequestPtr> sends;
  if (layout.count(r) && in != mine) std::memmove(mine, in, layout.count(r) * sizeof(float));
  for (size_t k = 0; k < layout.segments(r); ++k)
    shareSegment(transport, codec, layout, mine, wire, k, nullptr, nullptr, tag, sends);
  decodeGathered(transport, codec, layout, gathered, out, recvs, args.deadline);
  waitAll(sends, args.deadline);
}

}  // namespace hetra::comm
