// STUB: replaced by the shared-memory algorithms.
#include "comm/algorithms/shared.h"

#include "common/errors.h"

namespace hetra::comm {
void allreduceShared(SharedArena&, const AllreduceArgs&) { throw Error("allreduceShared: not built yet"); }
void reduceScatterShared(SharedArena&, const ReduceScatterArgs&) { throw Error("reduceScatterShared: not built yet"); }
void allgatherShared(SharedArena&, const AllgatherArgs&) { throw Error("allgatherShared: not built yet"); }
void broadcastShared(SharedArena&, const BroadcastArgs&) { throw Error("broadcastShared: not built yet"); }
void barrierShared(SharedArena&, const BarrierArgs&) { throw Error("barrierShared: not built yet"); }
}  // namespace hetra::comm
