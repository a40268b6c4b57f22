// Collectives for small messages through the shared arena's small slots: one sync point per
// operation. Each rank writes its OpHeader, a stamp naming the operation and its payload together
// into its small slot, waits once for every other rank's stamp, then posts; readers check every
// peer's header as they read its payload, so a mismatched call throws MismatchError on every rank
// and no rank reads a peer's data for a call it did not make. No heap allocation and no lock for
// groups of up to 64 ranks.
//
// Every rank reads every peer's whole payload, so the time grows with size * bytes: the cost model
// (smallSharedSeconds) is what makes the pipelined algorithms of shared.h win for larger
// messages. ReduceOp::Avg is reduced as Sum (the caller divides). After any of these throws the
// arena's ranks are out of step: abort the group.
//
// A call that takes this path on one rank and the algorithms of shared.h on another (arguments
// that differ in size) also fails with MismatchError on every rank: these functions publish the
// header in the arena's header area too, where shared.h reads it, and check the stamp, which a
// peer on the other path does not write.
#pragma once

#include <cstddef>

#include "comm/algorithms/args.h"
#include "comm/transport/shared_arena.h"

namespace hetra::comm {

// Payload bytes one rank can put in its small slot.
size_t smallSharedCapacity();

// Whether an operation that puts bytesPerRank bytes in each rank's slot fits (allreduce and
// broadcast: the message; allgather: the largest block; barrier: 0).
bool smallSharedFits(const SharedArena& arena, size_t bytesPerRank);

void allreduceSmallShared(SharedArena& arena, const AllreduceArgs& args);
void allgatherSmallShared(SharedArena& arena, const AllgatherArgs& args);
void broadcastSmallShared(SharedArena& arena, const BroadcastArgs& args);
void barrierSmallShared(SharedArena& arena, const BarrierArgs& args);

// Predicted seconds of one of these operations on `size` ranks when every rank reads bytes from
// each peer (allreduce, broadcast: the message; allgather: the total).
double smallSharedSeconds(size_t bytes, int size);

}  // namespace hetra::comm
