#include "common/net.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/errors.h"
#include "common/params.h"

namespace hetra::net {
namespace {

const Param kInterfaceAddress(
    "HETRA_IFACE_ADDR", "",
    "Address the tcp transport listens on, the interface other hosts reach (unset: 127.0.0.1; "
    "under a launcher, the local address routed to the job's store).");

}  // namespace

std::optional<std::string> chosenInterfaceAddress() {
  std::string address = kInterfaceAddress.str();
  if (address.empty()) return std::nullopt;
  return address;
}

int pollMillis(Deadline deadline) {
  constexpr int64_t kMaxPollMs = 3600 * 1000;
  const auto left = std::chrono::ceil<Millis>(deadline - Clock::now()).count();
  return int(std::clamp<int64_t>(left, 0, kMaxPollMs));
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

std::string socketAddress(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (::getnameinfo(addr, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return addr->sa_family == AF_INET6 ? str("[", host, "]:", port) : str(host, ":", port);
}

bool isWildcardHost(const std::string& host) {
  return host.empty() || host == "*" || host == "0.0.0.0";
}

Listener listenOn(const std::string& host, int port, bool reuseAddress, const std::string& what) {
  const bool any = isWildcardHost(host);
  addrinfo hints{};
  hints.ai_family = any ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(any ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0)
    throw IoError(str(what, ": cannot resolve '", host, "' port ", port, ": ", gai_strerror(rc)));
  Listener listener;
  std::string lastError = "no address";
  for (addrinfo* ai = res; ai && listener.fd < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      lastError = std::strerror(errno);
      continue;
    }
    int one = 1;
    if (reuseAddress) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      listener.fd = fd;
    } else {
      lastError = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (listener.fd < 0)
    throw IoError(str(what, ": cannot listen on '", host, "' port ", port, ": ", lastError));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&bound), &len);
  listener.port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return listener;
}

namespace {

// One connection attempt to one address, waiting at most a second (or to the deadline).
int connectOnce(const addrinfo& ai, Deadline deadline, std::string& lastError) {
  const int fd = ::socket(ai.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    lastError = std::strerror(errno);
    return -1;
  }
  int err = 0;
  if (::connect(fd, ai.ai_addr, ai.ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = ::poll(&p, 1, std::max(1, std::min(pollMillis(deadline), 1000)));
      socklen_t len = sizeof err;
      if (ready == 1)
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      else
        err = ready == 0 ? ETIMEDOUT : errno;
    }
  }
  if (err == 0) return fd;
  lastError = std::strerror(err);
  ::close(fd);
  return -1;
}

}  // namespace

int connectUntil(const std::string& host, const std::string& port, Deadline deadline,
                 Millis firstPause, Millis maxPause, std::string& lastError) {
  lastError = "no attempt";
  Millis pause = firstPause;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
    if (rc != 0) lastError = gai_strerror(rc);
    int fd = -1;
    for (addrinfo* ai = rc == 0 ? found : nullptr; ai && fd < 0; ai = ai->ai_next)
      fd = connectOnce(*ai, deadline, lastError);
    if (rc == 0) ::freeaddrinfo(found);
    if (fd >= 0) return fd;
    const Millis left = remaining(deadline);
    if (left.count() <= 0) return -1;
    std::this_thread::sleep_for(std::min(pause, left));
    pause = std::min(pause * 2, maxPause);
  }
}

}  // namespace hetra::net
