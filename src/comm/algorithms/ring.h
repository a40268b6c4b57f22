// Collectives over point-to-point transfers (any Transport): ring reduce-scatter and allgather,
// their composition for allreduce, a pipelined broadcast, a dissemination barrier.
#pragma once

#include "comm/algorithms/args.h"
#include "comm/transport/transport.h"

namespace hetra::comm {

void allreduceRing(Transport& transport, const AllreduceArgs& args);
// Every rank sends its whole buffer to every other rank in one round and reduces the n buffers
// itself (in rank order, so every rank computes the same bits): few latencies, n-1 buffers of
// traffic per rank, for small messages.
void allreduceDirect(Transport& transport, const AllreduceArgs& args);
void reduceScatterRing(Transport& transport, const ReduceScatterArgs& args);
void allgatherRing(Transport& transport, const AllgatherArgs& args);
void broadcastPipelined(Transport& transport, const BroadcastArgs& args);
void barrierDissemination(Transport& transport, const BarrierArgs& args);

}  // namespace hetra::comm
