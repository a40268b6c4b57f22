// Collectives through memory that every rank of the group maps (SharedArena). Vocabulary:
//   slot        a rank's region of the arena, laid out here as two *small buffers* (used by
//               alternate operations) followed by three *piece buffers* (used by rotating pieces).
//   piece       a part of the operation's data that fits a piece buffer. Large operations move
//               one piece after another so that the working set stays in L2, and with three
//               buffers a rank copies piece p+1 in while its peers still read piece p.
//   slice       (allreduce) the part of a piece that one rank reduces, across all slots, for
//               everyone.
//   block       (reduce-scatter, allgather) the part of the full buffer that belongs to one rank;
//               a piece then covers the same range of every block.
//   sync point  a rank posts its next step and waits until the others have posted it too (in a
//               broadcast the others wait only for the root). C_p names the step "piece p is
//               copied in", R_p "piece p is reduced".
//
// Every operation starts with a sync point that also publishes the rank's OpHeader, so mismatched
// calls fail on every rank before any rank reads a peer's data. Small operations put their data in
// the small buffer before that first sync point and finish after it with no further sync: each rank
// reduces (or copies) everything it needs itself.
//
// Why the steps are safe: piece buffer b = p % 3 is written again for piece p + 3 only after its
// owner waited for every rank's C_{p+2}, and every rank posts C_{p+2} after it finished reading
// piece p. The small buffers and header areas of operation k are written again at operation k + 2,
// which starts only after every rank passed the first sync point of operation k + 1.
#include "comm/algorithms/shared.h"

#include <emmintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "common/errors.h"

namespace hetra::comm {
namespace {

constexpr size_t kSmallBytes = 16 << 10;
constexpr size_t kPieceBuffers = 3;

struct SlotLayout {
  size_t small = 0;  // bytes of each small buffer
  size_t piece = 0;  // bytes of each piece buffer

  uint8_t* smallBuffer(const SharedArena& arena, int rank, uint64_t op) const {
    return arena.slot(rank) + (op & 1) * small;
  }
  uint8_t* pieceBuffer(const SharedArena& arena, int rank, size_t piece) const {
    return arena.slot(rank) + 2 * small + (piece % kPieceBuffers) * this->piece;
  }
};

SlotLayout layoutOf(const SharedArena& arena) {
  SlotLayout l;
  const size_t slot = arena.slotBytes();
  l.small = std::min(kSmallBytes, slot / 8) & ~size_t(63);
  l.piece = ((slot - 2 * l.small) / kPieceBuffers) & ~size_t(63);
  HETRA_ENFORCE(l.small >= 64 && l.piece >= 64, "arena slot of ", slot, " bytes is too small");
  return l;
}

// Source pointers for reduceMany without a heap allocation for the usual group sizes.
class Sources {
 public:
  explicit Sources(int n) {
    if (n > int(inline_.size())) heap_.resize(n);
    data_ = heap_.empty() ? inline_.data() : heap_.data();
  }
  const void*& operator[](int i) { return data_[i]; }
  const void* const* data() const { return data_; }

 private:
  std::array<const void*, 16> inline_;
  std::vector<const void*> heap_;
  const void** data_;
};

size_t ceilDiv(size_t a, size_t b) {
  return (a + b - 1) / b;
}

// Messages this large do not stay in cache anyway (the ranks' inputs and outputs together exceed a
// typical L3), so their output is written with non-temporal stores: that saves reading every
// output line from memory before overwriting it, half the memory traffic of the copy-out.
constexpr size_t kStreamingBytes = size_t(8) << 20;

// memcpy with non-temporal stores for the 16-byte aligned body (SSE2 is baseline on x86-64).
void streamCopy(uint8_t* dst, const uint8_t* src, size_t bytes) {
  const size_t head = std::min(bytes, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
}

// The first sync point of every operation: publishes this rank's header (and whatever it wrote to
// its small buffer) and compares the header with every other rank's.
void syncHeaders(SharedArena& arena, uint64_t op, const OpHeader& mine, Deadline deadline) {
  const int me = arena.rank();
  arena.header(me, op) = mine;
  arena.post();
  arena.waitAll(arena.step(), deadline, "the start of the collective");
  for (int r = 0; r < arena.size(); ++r)
    if (r != me) checkHeaders(mine, me, arena.header(r, op), r);
}

// How many elements of a block of `count` elements fall in piece p (perPiece elements a piece).
size_t pieceLength(size_t count, size_t p, size_t perPiece) {
  const size_t first = p * perPiece;
  return first >= count ? 0 : std::min(perPiece, count - first);
}

// Where each rank's block starts in the whole buffer of a reduce-scatter or allgather, and its end
// (offsets[n]); ConfigError unless `counts` has one count per rank of the arena.
std::vector<size_t> blockOffsets(const SharedArena& arena, const std::vector<size_t>& counts,
                                 const char* op) {
  if (int(counts.size()) != arena.size())
    throw ConfigError(str(op, ": counts has ", counts.size(), " entries; the group has ",
                          arena.size(), " ranks"));
  std::vector<size_t> offsets(counts.size() + 1, 0);
  for (size_t k = 0; k < counts.size(); ++k) offsets[k + 1] = offsets[k] + counts[k];
  return offsets;
}

// The piece pipeline of reduce-scatter, allgather and broadcast: copy piece 0 in and post; then,
// for each piece p, wait until the ranks that matter posted C_p = base + 1 + p, copy piece p + 1 in
// (the next buffer) and post, and consume piece p while the peers copy theirs.
template <typename Wait, typename CopyIn, typename Consume>
void runPiecePipeline(SharedArena& arena, size_t pieces, Wait wait, CopyIn copyIn,
                      Consume consume) {
  const uint64_t base = arena.step();
  copyIn(0);
  arena.post();
  for (size_t p = 0; p < pieces; ++p) {
    wait(base + 1 + p);
    if (p + 1 < pieces) {
      copyIn(p + 1);
      arena.post();
    }
    consume(p);
  }
}

// The pipeline of reduce-scatter and allgather, where every rank copies its pieces in and reads
// piece p of every peer: each waits for all of them.
template <typename CopyIn, typename Consume>
void runSymmetricPipeline(SharedArena& arena, size_t pieces, Deadline deadline, CopyIn copyIn,
                          Consume consume) {
  runPiecePipeline(
      arena, pieces,
      [&](uint64_t counter) { arena.waitAll(counter, deadline, "peers copying a piece in"); },
      copyIn, consume);
}

}  // namespace

void allreduceShared(SharedArena& arena, const AllreduceArgs& args) {
  const int n = arena.size();
  const int me = arena.rank();
  const size_t es = dtypeSize(args.dtype);
  const size_t bytes = args.count * es;
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  const SlotLayout layout = layoutOf(arena);
  const uint64_t op = arena.beginOp();
  const bool small = bytes <= layout.small;
  // A premultiplied sum scales this rank's input where it is first read: no pass of its own.
  const double inputScale = args.inputScale;
  auto copyScaled = [&](void* dst, const void* src, size_t elements) {
    if (inputScale != 1.0)
      scale(args.dtype, src, dst, elements, inputScale);
    else
      std::memcpy(dst, src, elements * es);
  };
  if (small && n > 1 && bytes > 0) copyScaled(layout.smallBuffer(arena, me, op), in, args.count);
  syncHeaders(arena, op, OpHeader::of(args), args.deadline);
  if (bytes == 0) return;
  if (n == 1) {
    if (inputScale != 1.0)
      scale(args.dtype, in, out, args.count, inputScale);
    else if (out != in)
      std::memmove(out, in, bytes);
    return;
  }
  Sources srcs(n);
  if (small) {
    // Every rank reduces the whole message in rank order, so all ranks get the same bits.
    for (int k = 0; k < n; ++k) srcs[k] = layout.smallBuffer(arena, k, op);
    reduceMany(args.op, args.dtype, out, srcs.data(), n, args.count);
    arena.account(bytes, bytes * (n - 1));
    return;
  }

  // Pipelined reduce-scatter + allgather through the piece buffers.
  const size_t perPiece = layout.piece / es;
  const size_t pieces = ceilDiv(args.count, perPiece);
  const size_t align = 64 / es;  // slices start on cache lines
  struct Range {
    size_t begin, end;
  };
  auto sliceOf = [&](size_t len, int k) {
    const size_t per = ceilDiv(ceilDiv(len, size_t(n)), align) * align;
    const size_t begin = std::min(size_t(k) * per, len);
    return Range{begin, std::min(begin + per, len)};
  };
  // Copies piece p of the input, but for this rank's own slice, which reduce() reads from `in`.
  auto copyIn = [&](size_t p) {
    const size_t first = p * perPiece;
    const size_t len = std::min(perPiece, args.count - first);
    const Range mine = sliceOf(len, me);
    uint8_t* dst = layout.pieceBuffer(arena, me, p);
    copyScaled(dst, in + first * es, mine.begin);
    copyScaled(dst + mine.end * es, in + (first + mine.end) * es, len - mine.end);
    arena.account((len - (mine.end - mine.begin)) * es, 0);
  };
  const bool streaming = bytes >= kStreamingBytes;
  const uint64_t base = arena.step();  // C_p = base + 1 + 2p, R_p = base + 2 + 2p
  copyIn(0);
  arena.post();
  for (size_t p = 0; p < pieces; ++p) {
    const size_t first = p * perPiece;
    const size_t len = std::min(perPiece, args.count - first);
    arena.waitAll(base + 1 + 2 * p, args.deadline, "peers copying a piece in");
    const Range mine = sliceOf(len, me);
    if (mine.end > mine.begin) {
      uint8_t* dst = layout.pieceBuffer(arena, me, p) + mine.begin * es;
      srcs[0] = in + (first + mine.begin) * es;
      if (inputScale != 1.0) {  // this rank's own slice, scaled where it is reduced (in place)
        scale(args.dtype, srcs[0], dst, mine.end - mine.begin, inputScale);
        srcs[0] = dst;
      }
      for (int k = 0, i = 1; k < n; ++k)
        if (k != me) srcs[i++] = layout.pieceBuffer(arena, k, p) + mine.begin * es;
      reduceMany(args.op, args.dtype, dst, srcs.data(), n, mine.end - mine.begin);
      arena.account(0, (mine.end - mine.begin) * es * (n - 1));
    }
    arena.post();  // R_p
    if (p + 1 < pieces) {
      copyIn(p + 1);
      arena.post();  // C_{p+1}
    }
    arena.waitAll(base + 2 + 2 * p, args.deadline, "peers reducing a piece");
    for (int k = 0; k < n; ++k) {
      const Range slice = sliceOf(len, k);
      uint8_t* dst = out + (first + slice.begin) * es;
      const uint8_t* src = layout.pieceBuffer(arena, k, p) + slice.begin * es;
      if (streaming)
        streamCopy(dst, src, (slice.end - slice.begin) * es);
      else
        std::memcpy(dst, src, (slice.end - slice.begin) * es);
      if (k != me) arena.account(0, (slice.end - slice.begin) * es);
    }
  }
  if (streaming) _mm_sfence();
}

void reduceScatterShared(SharedArena& arena, const ReduceScatterArgs& args) {
  const int n = arena.size();
  const int me = arena.rank();
  const size_t es = dtypeSize(args.dtype);
  const std::vector<size_t> offsets = blockOffsets(arena, args.counts, "reduce-scatter");
  const size_t totalBytes = offsets[n] * es;
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  const SlotLayout layout = layoutOf(arena);
  const uint64_t op = arena.beginOp();
  const bool small = totalBytes <= layout.small;
  if (small && n > 1 && totalBytes > 0)
    std::memcpy(layout.smallBuffer(arena, me, op), in, totalBytes);
  syncHeaders(arena, op, OpHeader::of(args), args.deadline);
  const size_t myCount = args.counts[me];
  if (n == 1) {
    if (myCount > 0 && out != in) std::memmove(out, in, myCount * es);
    return;
  }
  if (totalBytes == 0) return;
  Sources srcs(n);
  if (small) {
    if (myCount == 0) return;
    for (int k = 0; k < n; ++k) srcs[k] = layout.smallBuffer(arena, k, op) + offsets[me] * es;
    reduceMany(args.op, args.dtype, out, srcs.data(), n, myCount);
    arena.account(totalBytes - myCount * es, myCount * es * (n - 1));
    return;
  }

  // Piece p holds elements [p * perPiece, (p + 1) * perPiece) of every block, block k at k *
  // perPiece.
  const size_t align = 64 / es;
  const size_t perPiece = std::max(align, (layout.piece / size_t(n) / es) / align * align);
  HETRA_ENFORCE_LE(perPiece * es * n, layout.piece, "arena slot too small for ", n, " ranks");
  const size_t maxCount = *std::max_element(args.counts.begin(), args.counts.end());
  const size_t pieces = ceilDiv(maxCount, perPiece);
  auto copyIn = [&](size_t p) {
    uint8_t* dst = layout.pieceBuffer(arena, me, p);
    for (int k = 0; k < n; ++k) {
      const size_t len = pieceLength(args.counts[k], p, perPiece);
      if (k == me || len == 0) continue;  // the own block is read from `in` directly
      std::memcpy(dst + k * perPiece * es, in + (offsets[k] + p * perPiece) * es, len * es);
      arena.account(len * es, 0);
    }
  };
  runSymmetricPipeline(arena, pieces, args.deadline, copyIn, [&](size_t p) {
    const size_t len = pieceLength(myCount, p, perPiece);
    if (len == 0) return;
    // The own block first: `out` may be `in` at this rank's block (in place), which
    // reduceMany allows for its first source.
    srcs[0] = in + (offsets[me] + p * perPiece) * es;
    for (int k = 0, i = 1; k < n; ++k)
      if (k != me) srcs[i++] = layout.pieceBuffer(arena, k, p) + me * perPiece * es;
    reduceMany(args.op, args.dtype, out + p * perPiece * es, srcs.data(), n, len);
    arena.account(0, len * es * (n - 1));
  });
}

void allgatherShared(SharedArena& arena, const AllgatherArgs& args) {
  const int n = arena.size();
  const int me = arena.rank();
  const size_t es = dtypeSize(args.dtype);
  const std::vector<size_t> offsets = blockOffsets(arena, args.counts, "allgather");
  const auto* in = static_cast<const uint8_t*>(args.in);
  auto* out = static_cast<uint8_t*>(args.out);
  const size_t myBytes = args.counts[me] * es;
  uint8_t* myOut = out + offsets[me] * es;
  const SlotLayout layout = layoutOf(arena);
  const uint64_t op = arena.beginOp();
  const size_t maxCount = *std::max_element(args.counts.begin(), args.counts.end());
  const bool small = maxCount * es <= layout.small;
  if (small && n > 1 && myBytes > 0) std::memcpy(layout.smallBuffer(arena, me, op), in, myBytes);
  syncHeaders(arena, op, OpHeader::of(args), args.deadline);
  if (myBytes > 0 && myOut != in) std::memmove(myOut, in, myBytes);
  if (n == 1 || maxCount == 0) return;
  if (small) {
    for (int k = 0; k < n; ++k) {
      if (k == me || args.counts[k] == 0) continue;
      std::memcpy(out + offsets[k] * es, layout.smallBuffer(arena, k, op), args.counts[k] * es);
      arena.account(0, args.counts[k] * es);
    }
    arena.account(myBytes, 0);
    return;
  }

  // Piece p holds elements [p * perPiece, (p + 1) * perPiece) of the owner's block. The own block
  // went to `out` above; `in` is read again below, which stays correct when in == myOut.
  const size_t perPiece = layout.piece / es;
  const size_t pieces = ceilDiv(maxCount, perPiece);
  auto copyIn = [&](size_t p) {
    const size_t len = pieceLength(args.counts[me], p, perPiece);
    if (len == 0) return;
    std::memcpy(layout.pieceBuffer(arena, me, p), myOut + p * perPiece * es, len * es);
    arena.account(len * es, 0);
  };
  runSymmetricPipeline(arena, pieces, args.deadline, copyIn, [&](size_t p) {
    for (int k = 0; k < n; ++k) {
      const size_t len = pieceLength(args.counts[k], p, perPiece);
      if (k == me || len == 0) continue;
      std::memcpy(out + (offsets[k] + p * perPiece) * es, layout.pieceBuffer(arena, k, p),
                  len * es);
      arena.account(0, len * es);
    }
  });
}

void broadcastShared(SharedArena& arena, const BroadcastArgs& args) {
  const int n = arena.size();
  const int me = arena.rank();
  const int root = args.root;
  HETRA_ENFORCE(root >= 0 && root < n, "broadcast root ", root, " is outside a group of ", n);
  const size_t bytes = args.count * dtypeSize(args.dtype);
  auto* buf = static_cast<uint8_t*>(args.buf);
  const SlotLayout layout = layoutOf(arena);
  const uint64_t op = arena.beginOp();
  const bool small = bytes <= layout.small;
  if (small && me == root && n > 1 && bytes > 0)
    std::memcpy(layout.smallBuffer(arena, me, op), buf, bytes);
  syncHeaders(arena, op, OpHeader::of(args), args.deadline);
  if (n == 1 || bytes == 0) return;
  if (small) {
    if (me == root)
      arena.account(bytes, 0);
    else
      std::memcpy(buf, layout.smallBuffer(arena, root, op), bytes);
    if (me != root) arena.account(0, bytes);
    return;
  }

  // The root copies piece after piece into its piece buffers; the others copy them out. The root
  // waits for every rank's C_p before it reuses a buffer; the others only wait for the root.
  const size_t perPiece = layout.piece;
  const size_t pieces = ceilDiv(bytes, perPiece);
  auto copyIn = [&](size_t p) {
    if (me != root) return;
    const size_t len = std::min(perPiece, bytes - p * perPiece);
    std::memcpy(layout.pieceBuffer(arena, me, p), buf + p * perPiece, len);
    arena.account(len, 0);
  };
  runPiecePipeline(
      arena, pieces,
      [&](uint64_t counter) {
        if (me == root)
          arena.waitAll(counter, args.deadline, "peers copying a piece out");
        else
          arena.waitFor(root, counter, args.deadline, "the root copying a piece in");
      },
      copyIn,
      [&](size_t p) {
        if (me == root) return;
        const size_t len = std::min(perPiece, bytes - p * perPiece);
        std::memcpy(buf + p * perPiece, layout.pieceBuffer(arena, root, p), len);
        arena.account(0, len);
      });
}

void barrierShared(SharedArena& arena, const BarrierArgs& args) {
  const uint64_t op = arena.beginOp();
  syncHeaders(arena, op, OpHeader::of(args), args.deadline);
}

size_t sharedSmallBytes(const SharedArena& arena) {
  return layoutOf(arena).small;
}

}  // namespace hetra::comm
