// Collectives through memory that every rank of the group maps (SharedArena): each rank copies its
// input into its slot, reduces its own slice across all slots, and copies the reduced slices out.
//
// Every rank of the arena's group calls the same collectives in the same order; a call whose
// arguments differ between ranks (count, counts, dtype, op, root, seq) throws MismatchError on
// every rank before any data moves. ReduceOp::Avg is reduced as Sum: the caller divides. Outputs
// may alias inputs as the Args structs describe (allreduce in == out, reduce-scatter out == this
// rank's block of in, allgather in == this rank's block of out). After any of these throws, the
// arena's ranks are out of step: abort the group rather than run another collective on it.
#pragma once

#include "comm/algorithms/args.h"
#include "comm/transport/shared_arena.h"

namespace hetra::comm {

void allreduceShared(SharedArena& arena, const AllreduceArgs& args);
void reduceScatterShared(SharedArena& arena, const ReduceScatterArgs& args);
void allgatherShared(SharedArena& arena, const AllgatherArgs& args);
void broadcastShared(SharedArena& arena, const BroadcastArgs& args);
void barrierShared(SharedArena& arena, const BarrierArgs& args);

// Operations of at most this many bytes per rank take the small path: their data travels with the
// first sync point, and nothing else follows (the cost model's inputs).
size_t sharedSmallBytes(const SharedArena& arena);

}  // namespace hetra::comm
