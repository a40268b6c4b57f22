// Collectives over point-to-point transfers, written against Transport only.
//
// Vocabulary:
// - left, right: the ring neighbours of rank r, r-1 and r+1 (mod n).
// - block: the part of the buffer one rank owns. Rank b ends reduce-scatter holding block b and
//   contributes block b to allgather; allreduce splits its count evenly into n blocks.
// - segment: every block is cut into K segments (K is the same for every block, set by the
//   largest), each at most HETRA_RING_SEGMENT_BYTES; a segment is one message. Segment k is
//   forwarded while segment k+1 is still on the wire, so network and reduction overlap.
// - step: one hop; at step s every rank sends one block to right and receives one from left.
// - chunk: (step, segment), the unit that moves. Within one phase, chunks are sent and received
//   in (step, segment) order, so one tag per phase keeps them matched.
// - header: the OpHeader every rank exchanges with both neighbours before any data moves. If all
//   neighbour pairs agree, all ranks agree. A rank posts a receive only from peers whose header it
//   checked, so a mismatched call can never overrun a buffer; a rank that sees a mismatch aborts
//   the transport, so ranks that did not see it fail promptly too.
//
// Reductions go through comm::reduce (float16/bfloat16 computed in float32, rounded at each step);
// Avg is reduced as Sum and divided by the caller. Each block is reduced once, in one place, and
// then copied, so every rank ends with bitwise identical results.
#include "comm/algorithms/ring.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/algorithms/p2p.h"
#include "common/errors.h"
#include "common/params.h"

namespace hetra::comm {
namespace {

// Element ranges of n blocks, each cut into K segments.
struct Layout {
  std::vector<size_t> offset;  // first element of each block
  std::vector<size_t> count;   // elements of each block
  size_t segments = 1;         // K
  size_t maxSegment = 0;       // elements of the largest segment

  Layout(std::vector<size_t> counts, size_t elementSize) : count(std::move(counts)) {
    offset.resize(count.size());
    size_t at = 0, largest = 0;
    for (size_t b = 0; b < count.size(); ++b) {
      offset[b] = at;
      at += count[b];
      largest = std::max(largest, count[b]);
    }
    const size_t perSegment = std::max<size_t>(1, segmentBytes() / elementSize);
    segments = std::max<size_t>(1, (largest + perSegment - 1) / perSegment);
    maxSegment = (largest + segments - 1) / segments;
  }

  // Segment k of block b: elements [begin, begin + size) of the whole buffer.
  size_t segBegin(size_t b, size_t k) const {
    const size_t base = count[b] / segments, extra = count[b] % segments;
    return offset[b] + base * k + std::min(k, extra);
  }
  size_t segSize(size_t b, size_t k) const {
    return count[b] / segments + (k < count[b] % segments ? 1 : 0);
  }
  // Scratch holds segment k of any block at k * maxSegment, so that segments of blocks with
  // different sizes never overlap.
  size_t scratchElements() const { return segments * maxSegment; }
};

// Sends every non-empty segment of block b of `buffer` to `peer`, one request each, onto `sends`.
void sendBlock(Transport& transport, int peer, uint64_t tag, const uint8_t* buffer,
               const Layout& layout, size_t b, size_t es, std::vector<RequestPtr>& sends) {
  for (size_t k = 0; k < layout.segments; ++k) {
    const size_t len = layout.segSize(b, k);
    if (len)
      sends.push_back(transport.isend(peer, tag, buffer + layout.segBegin(b, k) * es, len * es));
  }
}

ReduceOp reduceAs(ReduceOp op) {
  return op == ReduceOp::Avg ? ReduceOp::Sum : op;
}

// Every rank sends its whole buffer to every other rank and reduces all n contributions in rank
// order (so every rank computes the same bits), in one round.
void exchangeAndReduce(Transport& transport, const AllreduceArgs& a) {
  const int n = transport.size(), r = transport.rank();
  const size_t bytes = a.count * dtypeSize(a.dtype);
  const uint64_t tag = opTag(a.seq, kDirectPhase);
  Scratch scratch(bytes * n);
  auto slot = [&](int p) { return scratch.data() + bytes * p; };
  // Our own contribution is copied too: `in` may equal `out`, and sends read it until they finish.
  std::memcpy(slot(r), a.in, bytes);
  std::vector<RequestPtr> recvs, sends;
  for (int i = 1; i < n; ++i)
    recvs.push_back(transport.irecv(mod(r - i, n), tag, slot(mod(r - i, n)), bytes));
  for (int i = 1; i < n; ++i) sends.push_back(transport.isend(mod(r + i, n), tag, slot(r), bytes));
  waitAll(recvs, a.deadline);
  std::vector<const void*> sources(n);
  for (int p = 0; p < n; ++p) sources[p] = slot(p);
  reduceMany(reduceAs(a.op), a.dtype, a.out, sources.data(), n, a.count);
  waitAll(sends, a.deadline);
}

// Large allreduce: ring reduce-scatter fused with ring allgather over an even split of count. The
// reduce phase accumulates straight into `out` (each block once), and the last reduce step of a
// segment is immediately forwarded as the first allgather step, so the phases overlap.
//   reduce step s (0..n-2): send block r-1-s, receive block r-2-s and add it into out.
//   gather step s (0..n-2): send block r-s, receive block r-1-s into out.
void allreduceRingLarge(Transport& transport, const AllreduceArgs& a) {
  const int n = transport.size(), r = transport.rank();
  const int left = mod(r - 1, n), right = mod(r + 1, n);
  const size_t es = dtypeSize(a.dtype);
  const ReduceOp op = reduceAs(a.op);
  const Layout layout(evenSplit(a.count, n), es);
  const size_t K = layout.segments;
  const int steps = n - 1;
  const uint64_t reduceTag = opTag(a.seq, kReducePhase), gatherTag = opTag(a.seq, kGatherPhase);
  const uint8_t* in = static_cast<const uint8_t*>(a.in);
  uint8_t* out = static_cast<uint8_t*>(a.out);
  // In place, a received segment cannot land in `out` (it still holds our input); it goes to
  // scratch, whose segment k is free again once chunk (s, k) has been added.
  const bool inPlace = in == out;
  Scratch scratch(inPlace ? layout.scratchElements() * es : 0);

  auto recvTarget = [&](int s, size_t k) {
    const size_t b = mod(r - 2 - s, n);
    return inPlace ? scratch.data() + k * layout.maxSegment * es : out + layout.segBegin(b, k) * es;
  };
  std::vector<RequestPtr> reduceRecvs(steps * K), gatherRecvs(steps * K), sends;
  sends.reserve(3 * steps * K);
  auto postReduceRecv = [&](int s, size_t k) {
    const size_t b = mod(r - 2 - s, n), len = layout.segSize(b, k);
    if (len) reduceRecvs[s * K + k] = transport.irecv(left, reduceTag, recvTarget(s, k), len * es);
  };

  // Gather receives land in out and never move again: post them all now.
  for (int s = 0; s < steps; ++s)
    for (size_t k = 0; k < K; ++k) {
      const size_t b = mod(r - 1 - s, n), len = layout.segSize(b, k);
      if (len)
        gatherRecvs[s * K + k] =
            transport.irecv(left, gatherTag, out + layout.segBegin(b, k) * es, len * es);
    }
  for (int s = 0; s < (inPlace ? 1 : steps); ++s)
    for (size_t k = 0; k < K; ++k) postReduceRecv(s, k);
  // Reduce step 0 sends our own input of block r-1. In place, gather step 0 later overwrites that
  // block, but only with data that could not exist before these bytes reached right.
  sendBlock(transport, right, reduceTag, in, layout, mod(r - 1, n), es, sends);

  for (int s = 0; s < steps; ++s) {
    const size_t b = mod(r - 2 - s, n);
    for (size_t k = 0; k < K; ++k) {
      const size_t len = layout.segSize(b, k);
      if (!len) {
        if (inPlace && s + 1 < steps) postReduceRecv(s + 1, k);
        continue;
      }
      reduceRecvs[s * K + k]->wait(a.deadline);
      uint8_t* dst = out + layout.segBegin(b, k) * es;
      const uint8_t* mine = in + layout.segBegin(b, k) * es;
      reduce(op, a.dtype, dst, mine, recvTarget(s, k), len);
      if (inPlace && s + 1 < steps) postReduceRecv(s + 1, k);
      // Forward: as the next reduce step, or (last step: block r is complete) as gather step 0.
      sends.push_back(transport.isend(right, s + 1 < steps ? reduceTag : gatherTag, dst, len * es));
    }
  }
  for (int s = 0; s < steps; ++s) {
    const size_t b = mod(r - 1 - s, n);
    for (size_t k = 0; k < K; ++k) {
      const size_t len = layout.segSize(b, k);
      if (!len) continue;
      gatherRecvs[s * K + k]->wait(a.deadline);
      if (s + 1 < steps)
        sends.push_back(
            transport.isend(right, gatherTag, out + layout.segBegin(b, k) * es, len * es));
    }
  }
  waitAll(sends, a.deadline);
}

}  // namespace

namespace {

// The two allreduces share their checks and header exchange; `direct` exchanges headers with
// every peer, as its data goes to every peer.
void allreduceOverTransport(Transport& transport, const AllreduceArgs& args, bool direct) {
  const int n = transport.size();
  const size_t bytes = args.count * dtypeSize(args.dtype);
  HETRA_ENFORCE(args.count == 0 || (args.in && args.out), "allreduce: null buffer for ", args.count,
                " elements");
  exchangeHeaders(transport, OpHeader::of(args), args.deadline, direct && n > 1);
  if (n == 1 || args.count == 0) {
    if (args.count && args.in != args.out) std::memcpy(args.out, args.in, bytes);
    return;
  }
  if (direct)
    exchangeAndReduce(transport, args);
  else
    allreduceRingLarge(transport, args);
}

}  // namespace

void allreduceRing(Transport& transport, const AllreduceArgs& args) {
  allreduceOverTransport(transport, args, false);
}

void allreduceDirect(Transport& transport, const AllreduceArgs& args) {
  allreduceOverTransport(transport, args, true);
}

// Reduce-scatter with uneven blocks. `out` holds only block r, so partial sums travel through a
// double buffer `acc` (each half holds one segment per k): chunk (s, k) for s < n-2 is received
// into acc[s % 2], our input is added in place, and it is forwarded from there. acc[s % 2] segment
// k is received into again by chunk (s+2, k), posted once the forward of chunk (s, k) has
// completed. The last step receives straight into out.
//   step s (0..n-2): send block r-1-s (step 0: our input), receive block r-2-s.
void reduceScatterRing(Transport& transport, const ReduceScatterArgs& args) {
  const int n = transport.size(), r = transport.rank();
  HETRA_ENFORCE_EQ(args.counts.size(), size_t(n), "reduceScatter: one count per rank");
  exchangeHeaders(transport, OpHeader::of(args), args.deadline, false);
  const size_t es = dtypeSize(args.dtype);
  const uint8_t* in = static_cast<const uint8_t*>(args.in);
  uint8_t* out = static_cast<uint8_t*>(args.out);
  const Layout layout(args.counts, es);
  if (n == 1) {
    if (layout.count[0] && in != out) std::memcpy(out, in, layout.count[0] * es);
    return;
  }
  const int left = mod(r - 1, n), right = mod(r + 1, n);
  const size_t K = layout.segments;
  const int steps = n - 1;
  const ReduceOp op = reduceAs(args.op);
  const uint64_t tag = opTag(args.seq, kReducePhase);
  const size_t accBytes = layout.scratchElements() * es;
  Scratch scratch(std::min(2, steps - 1) * accBytes);

  auto target = [&](int s, size_t k) {
    const size_t b = mod(r - 2 - s, n);
    if (s == steps - 1) return out + (layout.segBegin(b, k) - layout.offset[b]) * es;
    return scratch.data() + (s % 2) * accBytes + k * layout.maxSegment * es;
  };
  std::vector<RequestPtr> recvs(steps * K), forwards(steps * K), sends;
  auto postRecv = [&](int s, size_t k) {
    const size_t b = mod(r - 2 - s, n), len = layout.segSize(b, k);
    if (len) recvs[s * K + k] = transport.irecv(left, tag, target(s, k), len * es);
  };
  // Receives share one tag, so they are posted in (step, segment) order: steps 0 and 1 now (fresh
  // buffers), each later step one step ahead, as its buffer frees up.
  for (int s = 0; s < std::min(2, steps); ++s)
    for (size_t k = 0; k < K; ++k) postRecv(s, k);
  sendBlock(transport, right, tag, in, layout, mod(r - 1, n), es, sends);
  for (int s = 0; s < steps; ++s) {
    const size_t b = mod(r - 2 - s, n);
    for (size_t k = 0; k < K; ++k) {
      // Keep one step of receives posted ahead: chunk (s+1, k) reuses the buffer of chunk (s-1, k).
      if (s + 1 >= 2 && s + 1 < steps) {
        const bool intoOut = s + 1 == steps - 1;
        if (!intoOut && forwards[(s - 1) * K + k]) forwards[(s - 1) * K + k]->wait(args.deadline);
        postRecv(s + 1, k);
      }
      const size_t len = layout.segSize(b, k);
      if (!len) continue;
      recvs[s * K + k]->wait(args.deadline);
      uint8_t* acc = target(s, k);
      reduce(op, args.dtype, acc, acc, in + layout.segBegin(b, k) * es, len);
      if (s + 1 < steps) forwards[s * K + k] = transport.isend(right, tag, acc, len * es);
    }
  }
  waitAll(forwards, args.deadline);
  waitAll(sends, args.deadline);
}

// Allgather with uneven blocks: every receive lands in its final place in out, so all are posted
// up front; a received segment is forwarded from out.
//   step s (0..n-2): send block r-s, receive block r-1-s.
void allgatherRing(Transport& transport, const AllgatherArgs& args) {
  const int n = transport.size(), r = transport.rank();
  HETRA_ENFORCE_EQ(args.counts.size(), size_t(n), "allgather: one count per rank");
  exchangeHeaders(transport, OpHeader::of(args), args.deadline, false);
  const size_t es = dtypeSize(args.dtype);
  const Layout layout(args.counts, es);
  uint8_t* out = static_cast<uint8_t*>(args.out);
  const uint8_t* in = static_cast<const uint8_t*>(args.in);
  uint8_t* mine = out + layout.offset[r] * es;
  if (layout.count[r] && in != mine) std::memcpy(mine, in, layout.count[r] * es);
  if (n == 1) return;
  const int left = mod(r - 1, n), right = mod(r + 1, n);
  const size_t K = layout.segments;
  const int steps = n - 1;
  const uint64_t tag = opTag(args.seq, kGatherPhase);
  std::vector<RequestPtr> recvs(steps * K), sends;
  for (int s = 0; s < steps; ++s)
    for (size_t k = 0; k < K; ++k) {
      const size_t b = mod(r - 1 - s, n), len = layout.segSize(b, k);
      if (len)
        recvs[s * K + k] = transport.irecv(left, tag, out + layout.segBegin(b, k) * es, len * es);
    }
  sendBlock(transport, right, tag, out, layout, r, es, sends);
  for (int s = 0; s + 1 < steps; ++s) {
    const size_t b = mod(r - 1 - s, n);
    for (size_t k = 0; k < K; ++k) {
      const size_t len = layout.segSize(b, k);
      if (!len) continue;
      recvs[s * K + k]->wait(args.deadline);
      sends.push_back(transport.isend(right, tag, out + layout.segBegin(b, k) * es, len * es));
    }
  }
  waitAll(recvs, args.deadline);
  waitAll(sends, args.deadline);
}

// Broadcast along the ring starting at root (a chain: root -> root+1 -> ... -> root-1), pipelined
// in segments: each rank forwards segment k while segment k+1 arrives. Links are ring neighbours,
// whose headers were checked.
void broadcastPipelined(Transport& transport, const BroadcastArgs& args) {
  const int n = transport.size(), r = transport.rank();
  HETRA_ENFORCE(args.root >= 0 && args.root < n, "broadcast: root ", args.root,
                " is outside a group of ", n);
  exchangeHeaders(transport, OpHeader::of(args), args.deadline, false);
  if (n == 1 || args.count == 0) return;
  const size_t es = dtypeSize(args.dtype);
  const Layout layout({args.count}, es);
  const int position = mod(r - args.root, n);  // 0 at the root, n-1 at the end of the chain
  const uint64_t tag = opTag(args.seq, kBroadcastPhase);
  uint8_t* buf = static_cast<uint8_t*>(args.buf);
  std::vector<RequestPtr> recvs(layout.segments), sends;
  if (position > 0)
    for (size_t k = 0; k < layout.segments; ++k)
      if (size_t len = layout.segSize(0, k))
        recvs[k] = transport.irecv(mod(r - 1, n), tag, buf + layout.segBegin(0, k) * es, len * es);
  for (size_t k = 0; k < layout.segments; ++k) {
    const size_t len = layout.segSize(0, k);
    if (!len) continue;
    if (recvs[k]) recvs[k]->wait(args.deadline);
    if (position < n - 1)
      sends.push_back(
          transport.isend(mod(r + 1, n), tag, buf + layout.segBegin(0, k) * es, len * es));
  }
  waitAll(sends, args.deadline);
}

// Dissemination barrier: in round j every rank signals rank r + 2^j and waits for rank r - 2^j;
// after ceil(log2 n) rounds every rank has heard, transitively, from all. The header exchange with
// both neighbours is round 0.
void barrierDissemination(Transport& transport, const BarrierArgs& args) {
  const int n = transport.size(), r = transport.rank();
  exchangeHeaders(transport, OpHeader::of(args), args.deadline, false);
  int round = 1;
  for (int distance = 2; distance < n; distance *= 2, ++round) {
    const uint64_t tag = opTag(args.seq, kBarrierPhase + round);
    auto recv = transport.irecv(mod(r - distance, n), tag, nullptr, 0);
    auto send = transport.isend(mod(r + distance, n), tag, nullptr, 0);
    recv->wait(args.deadline);
    send->wait(args.deadline);
  }
}

}  // namespace hetra::comm
