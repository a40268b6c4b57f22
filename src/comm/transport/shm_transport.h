// Shared-memory transport: every rank of the group is on one host and maps one POSIX shared-memory
// segment (per job and group, mode 0600). Rank 0 creates it under an unguessable name
// (/hetra-<pid of rank 0>-<128 random bits>) and publishes the name through the store under the
// key "segment" (deleted again once every rank has mapped it). The last rank to map the segment
// unlinks it, and every rank unlinks it again on exit in case a rank never came. Creating a
// segment also removes the /dev/shm/hetra-* segments whose creator process no longer exists.
//
// The segment holds a SharedArena (per-rank slots, step counters and header areas, used by the
// shared-memory collectives) and, for isend/irecv, one ring buffer per ordered pair of ranks that
// carries framed messages (tag, size, payload) as a byte stream. Any wait progresses every pending
// request of the transport, so exchanges in both directions never deadlock whatever their sizes.
#pragma once

#include <memory>
#include <string>

#include "comm/transport/transport.h"
#include "store/store.h"

namespace hetra::comm {

struct ShmOptions {
  Millis timeout{30000};  // for setting up the group
  // Bytes of each rank's arena slot; 0 takes HETRA_SHM_SLOT_BYTES. Tests shrink it to reach the
  // multi-piece paths of the collectives with small buffers.
  size_t slotBytes = 0;
  // Bytes of each pair's ring buffer; 0 takes HETRA_SHM_RING_BYTES (scaled down for large groups).
  size_t ringBytes = 0;
};

// Collective over the group: every rank calls it with the same (prefixed) store.
std::unique_ptr<Transport> createShmTransport(store::Store& store, int rank, int size,
                                              const ShmOptions& options);

// The same, for processes that share no store (fork-based fault tests): rank 0 creates the segment
// `segmentName` (which must look like /hetra-<pid of rank 0>-<suffix>), the other ranks open it,
// retrying until it exists and is initialised or options.timeout passes.
std::unique_ptr<Transport> createShmTransport(const std::string& segmentName, int rank, int size,
                                              const ShmOptions& options);

// A fresh segment name for the calling process: /hetra-<pid>-<32 random hex digits>.
std::string newShmSegmentName();

}  // namespace hetra::comm
