// How the ranks of a store-bootstrapped transport (tcp, mpi, nccl) meet before they connect: the
// argument checks of every create*Transport, and a join that names the ranks that did not come
// instead of surfacing as an anonymous timeout later.
#pragma once

#include <string>
#include <vector>

#include "common/timing.h"
#include "store/store.h"

namespace hetra::comm {

// There is a store to meet through and `rank` is inside a group of `size`; else EnforceError.
// `what` names the transport in the message ("tcp transport").
void enforceGroupMember(const char* what, const store::Store* store, int rank, int size);

// Publishes `record` under "<prefix>/<rank>", waits until every rank of the group has published
// its own and returns them all, indexed by rank. Ranks still missing at `deadline` give
// TimeoutError "<what>: rank(s) 1, 3 of a group of 4 did not join within <timeout> ms (this is
// rank 0)"; `timeout` is the budget the deadline was made from, for that message.
std::vector<std::string> joinGroup(store::Store& store, const std::string& prefix,
                                   const std::string& record, int rank, int size, Deadline deadline,
                                   Millis timeout, const char* what);

}  // namespace hetra::comm
