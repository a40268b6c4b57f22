// STUB: replaced by the tcp transport.
#include "comm/transport/tcp_transport.h"

#include "common/errors.h"

namespace hetra::comm {
std::unique_ptr<Transport> createTcpTransport(std::shared_ptr<store::Store>, int, int, const TcpOptions&) {
  throw Error("tcp transport: not built yet");
}
}  // namespace hetra::comm
