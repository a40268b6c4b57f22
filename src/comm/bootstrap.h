// Bootstrap of a vendor library's communicator (NCCL, RCCL) through the group's store: rank 0
// creates the library's unique id, publishes it, and every rank reads it before it initialises its
// communicator. Kept free of any vendor header so that it is tested on any machine
// (tests/test_comm_bootstrap.cc, with a fake id); cuda/nccl_transport.cc passes ncclGetUniqueId.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "common/timing.h"
#include "store/store.h"

namespace hetra::comm {

// Rank 0 calls makeId() and sets `key` to it; every rank (rank 0 included) returns the published
// id. `key` must be fresh for this group (the group's PrefixStore makes it so). Throws
// TimeoutError naming the key and rank 0 when the id is not published by `deadline`, and
// IoError when it does not have exactly `idBytes` bytes (0: any size).
store::Bytes exchangeRootId(store::Store& store, const std::string& key, int rank,
                            const std::function<store::Bytes()>& makeId, Deadline deadline,
                            size_t idBytes = 0);

}  // namespace hetra::comm
