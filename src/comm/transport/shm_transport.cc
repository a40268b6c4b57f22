// STUB: replaced by the shm transport.
#include "comm/transport/shm_transport.h"

#include "common/errors.h"

namespace hetra::comm {
std::unique_ptr<Transport> createShmTransport(store::Store&, int, int, const ShmOptions&) {
  throw Error("shm transport: not built yet");
}
}  // namespace hetra::comm
