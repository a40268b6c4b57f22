// Collectives through memory that every rank of the group maps (SharedArena): each rank copies its
// input into its slot, reduces its own slice across all slots, and copies the reduced slices out.
#pragma once

#include "comm/algorithms/args.h"
#include "comm/transport/shared_arena.h"

namespace hetra::comm {

void allreduceShared(SharedArena& arena, const AllreduceArgs& args);
void reduceScatterShared(SharedArena& arena, const ReduceScatterArgs& args);
void allgatherShared(SharedArena& arena, const AllgatherArgs& args);
void broadcastShared(SharedArena& arena, const BroadcastArgs& args);
void barrierShared(SharedArena& arena, const BarrierArgs& args);

}  // namespace hetra::comm
