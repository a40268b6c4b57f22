// Socket helpers shared by the TCP store, the tcp transport and the launcher.
#pragma once

#include <sys/socket.h>

#include <optional>
#include <string>

#include "common/timing.h"

namespace hetra::net {

// Milliseconds until `deadline` for poll(), rounded up (poll never returns just before it) and
// clamped to [0, 1 hour].
int pollMillis(Deadline deadline);

void setNoDelay(int fd);

// This machine's name (gethostname), "?" when it has none: the one copy for logs, stores and
// transports.
std::string hostName();

// HETRA_IFACE_ADDR, the address this rank's tcp transport listens on (the interface other hosts
// reach), or nullopt when it is not set: the one reader of that parameter. Its callers' defaults
// differ: the transport listens on the loopback address, a launched rank on the address routed to
// its job's store.
std::optional<std::string> chosenInterfaceAddress();

// "host:port" of a socket address, numeric, IPv6 hosts in brackets; "?" when it cannot be printed.
std::string socketAddress(const sockaddr* addr, socklen_t len);

// Whether `host` asks to listen on every interface: "", "*" or "0.0.0.0" (IPv4 then).
bool isWildcardHost(const std::string& host);

struct Listener {
  int fd = -1;
  int port = 0;  // as bound (the one picked when port 0 was asked for)
};

// The one listen loop of the TCP store and the tcp transport: a non-blocking, close-on-exec socket
// listening on the first address of host:port (port 0: any free port) that binds. `reuseAddress`
// sets SO_REUSEADDR (a server restarted on its well-known port). Throws IoError starting with
// `what`, naming the address and the cause.
Listener listenOn(const std::string& host, int port, bool reuseAddress, const std::string& what);

// Connects a non-blocking TCP socket (close-on-exec) to host:port, trying every address of `host`,
// and again after a pause that doubles from firstPause up to maxPause (the server may not listen
// yet), until one succeeds or `deadline` passes. Returns the socket, or -1 at the deadline with
// lastError saying why the last attempt failed.
int connectUntil(const std::string& host, const std::string& port, Deadline deadline,
                 Millis firstPause, Millis maxPause, std::string& lastError);

}  // namespace hetra::net
