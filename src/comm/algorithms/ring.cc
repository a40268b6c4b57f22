// STUB: replaced by the ring algorithms.
#include "comm/algorithms/ring.h"

#include "common/errors.h"

namespace hetra::comm {
void allreduceRing(Transport&, const AllreduceArgs&) { throw Error("allreduceRing: not built yet"); }
void reduceScatterRing(Transport&, const ReduceScatterArgs&) { throw Error("reduceScatterRing: not built yet"); }
void allgatherRing(Transport&, const AllgatherArgs&) { throw Error("allgatherRing: not built yet"); }
void broadcastPipelined(Transport&, const BroadcastArgs&) { throw Error("broadcastPipelined: not built yet"); }
void barrierDissemination(Transport&, const BarrierArgs&) { throw Error("barrierDissemination: not built yet"); }
}  // namespace hetra::comm
