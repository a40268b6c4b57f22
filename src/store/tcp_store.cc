// TcpStore's client, and host:port parsing; see tcp_store.h for the vocabulary (frame, request,
// reply, waiter) and tcp_store_wire.h for the bytes.
#include "store/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <list>
#include <map>
#include <thread>

#include "common/errors.h"
#include "common/logging.h"
#include "common/net.h"
#include "store/tcp_store_wire.h"

namespace hetra::store {

using namespace wire;

TcpStore::TcpStore(std::string host, int port, Millis timeout, const auth::AuthOptions& auth)
    : host_(std::move(host)),
      port_(port),
      timeout_(timeout),
      secret_(auth.resolve()),
      handshakeTimeout_(auth.handshakeTimeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  connectUntil(deadlineAfter(timeout_));
}

TcpStore::~TcpStore() {
  closeSocket();
}

std::string TcpStore::address() const {
  return host_.find(':') != std::string::npos ? str("[", host_, "]:", port_)
                                              : str(host_, ":", port_);
}

void TcpStore::closeSocket() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void TcpStore::connectUntil(Deadline deadline) {
  std::string lastError;
  const int fd =
      net::connectUntil(host_, std::to_string(port_), deadline, Millis(5), Millis(200), lastError);
  if (fd < 0)
    throw TimeoutError(str("store: could not connect to ", address(), " within ", timeout_.count(),
                           " ms (last error: ", lastError, ")"));
  net::setNoDelay(fd);
  if (!secret_.empty()) {
    // A refusal is final: retrying with the same secret would be refused again.
    try {
      auth::authenticate(fd, secret_, auth::Role::Client, kAuthContext,
                         std::min(deadline, deadlineAfter(handshakeTimeout_)),
                         str("store server ", address()));
    } catch (...) {
      ::close(fd);
      throw;
    }
  }
  fd_ = fd;
}

Bytes TcpStore::request(Op op, const Bytes& fields, std::optional<Deadline> waitDeadline,
                        const char* what, const std::vector<std::string>& keys) {
  const bool waits = waitDeadline.has_value();
  // What a timeout message reports as waited: the budget this call was given.
  const Millis budget = waits ? remaining(*waitDeadline) : timeout_;
  // The server would drop the connection on a larger frame; say why here instead.
  const size_t payloadBytes = requestBytes(waits, fields.size());
  if (payloadBytes > kMaxPayload)
    throw Error(str("store ", what, " of ", describeKeys(keys), ": request of ", payloadBytes,
                    " bytes exceeds the ", kMaxPayload, " byte frame limit"));
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty()) throw IoError(str(broken_, "; store ", what, " failed"));
  // A socket closed after a client-side timeout (stream out of step) is reopened here.
  if (fd_ < 0) connectUntil(deadlineAfter(timeout_));

  // min: a deadline of Deadline::max() (wait for ever) must not overflow.
  const Deadline deadline =
      waits ? std::min(*waitDeadline, Deadline::max() - kReplyGrace) + kReplyGrace
            : deadlineAfter(timeout_);
  auto timedOut = [&]() -> TimeoutError {
    closeSocket();
    if (waits)
      return TimeoutError(str("store ", what, " on ", address(), " timed out after ",
                              budget.count(), " ms for keys ", describeKeys(keys),
                              " (server did not answer)"));
    return TimeoutError(str("store ", what, " of '", describeKeys(keys), "' on ", address(),
                            " got no reply within ", timeout_.count(), " ms"));
  };
  auto serverGone = [&](const std::string& detail) -> IoError {
    broken_ = str("store server ", address(), " closed the connection (", detail, ")");
    closeSocket();
    return IoError(str(broken_, " during ", what, " of ", describeKeys(keys)));
  };
  auto waitFor = [&](short events) {
    for (;;) {
      pollfd p{fd_, events, 0};
      const int ready = ::poll(&p, 1, net::pollMillis(deadline));
      if (ready > 0) return;
      if (ready == 0 && Clock::now() >= deadline) throw timedOut();
      if (ready < 0 && errno != EINTR) throw serverGone(str("poll: ", errnoText(errno)));
    }
  };
  auto receive = [&](uint8_t* data, size_t size) {
    size_t got = 0;
    while (got < size) {
      const ssize_t n = ::recv(fd_, data + got, size - got, 0);
      if (n > 0)
        got += size_t(n);
      else if (n == 0)
        throw serverGone("end of stream");
      else if (errno == EAGAIN || errno == EWOULDBLOCK)
        waitFor(POLLIN);
      else if (errno != EINTR)
        throw serverGone(errnoText(errno));
    }
  };

  // The server's wait starts when the request arrives: it gets what is left of the deadline now.
  const Bytes frame = makeRequestFrame(
      op, waits ? std::optional<Millis>(remaining(*waitDeadline)) : std::nullopt, fields);
  for (size_t sent = 0; sent < frame.size();) {
    const ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n > 0)
      sent += size_t(n);
    else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      waitFor(POLLOUT);
    else if (n < 0 && errno != EINTR)
      throw serverGone(errnoText(errno));
  }

  uint8_t header[kHeaderBytes];
  receive(header, kHeaderBytes);
  const uint32_t length = loadU32(header + 4);
  if (loadU32(header) != kMagic || length == 0 || length > kMaxPayload)
    throw serverGone("reply is not a hetra store frame");
  Bytes reply(length);
  receive(reply.data(), length);
  switch (Status(reply[0])) {
    case Status::Ok:
      return Bytes(reply.begin() + 1, reply.end());
    case Status::Timeout:
      throw TimeoutError(str("store ", what, " on ", address(), " timed out after ", budget.count(),
                             " ms for keys ", describeKeys(keys)));
    case Status::Failed: {
      Reader r(reply.data() + 1, reply.size() - 1);
      throw Error(r.string());
    }
  }
  throw serverGone(str("unknown reply status ", int(reply[0])));
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  request(Op::Set, Writer().string(key).bytes(value).take(), std::nullopt, "set", {key});
}

Bytes TcpStore::get(const std::string& key, Deadline deadline) {
  const Bytes body = request(Op::Get, Writer().string(key).take(), deadline, "get", {key});
  Reader r(body.data(), body.size());
  Bytes value = r.bytes();
  r.end();
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const Bytes body = request(Op::Add, Writer().string(key).u64(uint64_t(delta)).take(),
                             std::nullopt, "add", {key});
  Reader r(body.data(), body.size());
  return int64_t(r.u64());
}

Bytes TcpStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const Bytes body =
      request(Op::CompareSet, Writer().string(key).bytes(expected).bytes(desired).take(),
              std::nullopt, "compareSet", {key});
  Reader r(body.data(), body.size());
  return r.bytes();
}

void TcpStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  request(Op::Wait, Writer().strings(keys).take(), deadline, "wait", keys);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  const Bytes body = request(Op::Check, Writer().strings(keys).take(), std::nullopt, "check", keys);
  return !body.empty() && body[0] != 0;
}

bool TcpStore::deleteKey(const std::string& key) {
  const Bytes body =
      request(Op::Delete, Writer().string(key).take(), std::nullopt, "deleteKey", {key});
  return !body.empty() && body[0] != 0;
}

// ---------------------------------------------------------------------------------------------

HostPort parseHostPort(const std::string& hostPort) {
  auto bad = [&](const std::string& why) {
    return ConfigError(str("store address '", hostPort, "' is not host:port (", why,
                           "); expected e.g. 10.0.0.1:29500 or [::1]:29500"));
  };
  HostPort out;
  std::string portText;
  if (!hostPort.empty() && hostPort[0] == '[') {
    const size_t close = hostPort.find(']');
    if (close == std::string::npos || close + 1 >= hostPort.size() || hostPort[close + 1] != ':')
      throw bad("unterminated [ipv6] host");
    out.host = hostPort.substr(1, close - 1);
    portText = hostPort.substr(close + 2);
  } else {
    const size_t colon = hostPort.rfind(':');
    if (colon == std::string::npos) throw bad("no ':'");
    out.host = hostPort.substr(0, colon);
    portText = hostPort.substr(colon + 1);
    if (out.host.find(':') != std::string::npos) throw bad("write IPv6 hosts as [addr]:port");
  }
  if (out.host.empty()) throw bad("empty host");
  if (portText.empty() || portText.size() > 5 ||
      portText.find_first_not_of("0123456789") != std::string::npos)
    throw bad("port is not a number");
  out.port = std::stoi(portText);
  if (out.port > 65535) throw bad("port above 65535");
  return out;
}

std::shared_ptr<Store> connectStore(const std::string& hostPort, int rank, Millis timeout,
                                    std::unique_ptr<TcpStoreServer>* serverOut,
                                    const auth::AuthOptions& auth) {
  const HostPort address = parseHostPort(hostPort);
  if (rank < 0) throw ConfigError(str("connectStore: rank ", rank, " is negative"));
  if (rank != 0) return std::make_shared<TcpStore>(address.host, address.port, timeout, auth);

  auto server = std::make_unique<TcpStoreServer>(address.host, address.port, auth);
  const bool any = address.host == "*" || address.host == "0.0.0.0";
  auto client =
      std::make_shared<TcpStore>(any ? "127.0.0.1" : address.host, server->port(), timeout, auth);
  if (serverOut)
    *serverOut = std::move(server);
  else
    client->adoptServer(std::move(server));
  return client;
}

}  // namespace hetra::store
