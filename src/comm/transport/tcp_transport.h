// TCP transport: full meshes of Gloo TCP pairs, set up through our store (see tcp_transport.cc).
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

// Collective over the group: every rank calls it with the same (prefixed) store. Fails in about
// options.timeout with TimeoutError naming the ranks that did not join, or with IoError when the
// address cannot be listened on. Notes for callers:
// - tag 2^64-1 is reserved (the transport's own dead-connection probes);
// - a receive must name exactly the size of the matching send: Gloo cannot report a mismatch as an
//   error (the collectives guarantee this with their header check);
// - SIGPIPE is set to ignored if it still has its default action, so that a dead peer fails a
//   write instead of killing the process.
std::unique_ptr<Transport> createTcpTransport(std::shared_ptr<store::Store> store, int rank,
                                              int size, const TcpOptions& options);

}  // namespace hetra::comm
