// Socket helpers shared by the TCP store and the tcp transport.
#pragma once

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

// Connects a non-blocking TCP socket (close-on-exec) to host:port, trying every address of `host`,
// and again after a pause that doubles from firstPause up to maxPause (the server may not listen
// yet), until one succeeds or `deadline` passes. Returns the socket, or -1 at the deadline with
// lastError saying why the last attempt failed.
int connectUntil(const std::string& host, const std::string& port, Deadline deadline,
                 Millis firstPause, Millis maxPause, std::string& lastError);

}  // namespace hetra::net
