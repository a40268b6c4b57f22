// Allreduce for tiny messages over any Transport (built for tcp, where every round trip costs a
// few system calls): recursive doubling, log2(size) exchanges with a partner, each message carrying
// the sender's OpHeader next to its partial result, so there is no separate header round.
//
// Messages come in a few fixed sizes (envelopes: headers and a payload class of 1 or 8 KiB, the
// smallest that holds the call), so that calls of different counts in one class still meet, and a
// rank that saw a mismatch passes it on in every later message: a mismatched call (count, dtype,
// op, seq) throws MismatchError on every rank once the exchanges are done, never a hang or a wrong
// result. Calls of different classes, or a peer that runs another algorithm for the same call
// (the ring), meet a message of another size than they expect, which the transport reports as a
// MismatchError and aborts the group with.
//
// World sizes that are not a power of two fold the extra ranks: rank p + k (p the largest power
// of two not above size) hands its input to rank k, which returns the result at the end. Every
// rank gets the same bits (each step reduces the lower rank's partial with the higher's).
// ReduceOp::Avg is reduced as Sum (the caller divides). After a throw, abort the group.
#pragma once

#include <cstddef>

#include "comm/algorithms/args.h"
#include "comm/transport/transport.h"

namespace hetra::comm {

// Payload bytes an envelope carries: the largest message this algorithm takes.
size_t recursiveDoublingCapacity();

void allreduceRecursiveDoubling(Transport& transport, const AllreduceArgs& args);

// Predicted seconds: ceil(log2(size)) exchanges (two more when size is not a power of two), each
// one link latency plus the fixed envelope at the link's bandwidth, plus the reduction.
double recursiveDoublingSeconds(size_t bytes, int size, double alphaSeconds,
                                double betaBytesPerSecond);

}  // namespace hetra::comm
