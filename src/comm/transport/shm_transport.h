// Shared-memory transport: every rank of the group is on one host and maps one POSIX shared-memory
// segment (per job and group, mode 0600, unlinked once all ranks have mapped it).
#pragma once

#include <memory>
#include <string>

#include "comm/transport/transport.h"
#include "store/store.h"

namespace hetra::comm {

struct ShmOptions {
  Millis timeout{30000};  // for setting up the group
};

// Collective over the group: every rank calls it with the same (prefixed) store.
std::unique_ptr<Transport> createShmTransport(store::Store& store, int rank, int size,
                                              const ShmOptions& options);

}  // namespace hetra::comm
