// TCP transport: a full mesh of Gloo TCP pairs, set up through our store.
#pragma once

#include <memory>
#include <string>

#include "comm/transport/transport.h"
#include "store/store.h"

namespace hetra::comm {

struct TcpOptions {
  Millis timeout{30000};
  std::string listenAddress = "127.0.0.1";
};

// Collective over the group: every rank calls it with the same (prefixed) store.
std::unique_ptr<Transport> createTcpTransport(std::shared_ptr<store::Store> store, int rank,
                                              int size, const TcpOptions& options);

}  // namespace hetra::comm
