// TcpStore's server loop; see tcp_store.h for the vocabulary (frame, request, reply, waiter) and
// tcp_store_wire.h for the bytes.
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

struct TcpStoreServer::Impl {
  struct Connection {
    int fd = -1;
    std::string peer;
    Bytes in;   // received bytes not yet parsed
    Bytes out;  // reply bytes not yet sent
    size_t outSent = 0;
    bool parked = false;  // a waiter of this connection is pending: later frames wait
    bool closed = false;
    // Set until the peer proved the job secret; no request is served before.
    std::unique_ptr<auth::Handshake> handshake;
    Deadline handshakeDeadline{};
  };
  struct Waiter {
    uint64_t conn;
    Op op;
    std::vector<std::string> keys;
    Deadline deadline;
  };

  std::string host;
  int port = 0;
  auth::JobSecret secret;
  Millis handshakeTimeout{};
  int listenFd = -1;
  int wakeRead = -1;
  int wakeWrite = -1;
  std::atomic<bool> stop{false};
  std::thread thread;

  // Everything below belongs to the server thread.
  std::map<std::string, Bytes> values;
  std::map<uint64_t, Connection> conns;
  std::list<Waiter> waiters;
  uint64_t nextConn = 1;
  bool changed = false;  // a key was written since waiters were last checked

  void run();
  void loop();
  void acceptAll();
  void readFrom(Connection& c);
  // Advances c's handshake with the bytes received; false when c is (now) closed or still in it.
  bool authenticate(Connection& c);
  void expireHandshakes();
  size_t pendingHandshakes() const;
  void processFrames(uint64_t id, Connection& c);
  void handle(uint64_t id, Connection& c, Reader& r);
  void reply(Connection& c, Status status, const Bytes& body);
  void flush(Connection& c);
  void settle(std::vector<uint64_t> resumed);
  void expireWaiters();
  void closeConnection(Connection& c, const std::string& why);
  bool present(const std::vector<std::string>& keys) const {
    for (const auto& key : keys)
      if (!values.count(key)) return false;
    return true;
  }
  void answerWaiter(Connection& c, const Waiter& w) {
    if (w.op == Op::Get)
      reply(c, Status::Ok, Writer().bytes(values.at(w.keys[0])).take());
    else
      reply(c, Status::Ok, {});
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port, const auth::AuthOptions& auth)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->secret = auth.resolve();
  impl_->handshakeTimeout = auth.handshakeTimeout;
  const net::Listener listener = net::listenOn(host, port, true, "store server");
  impl_->listenFd = listener.fd;
  impl_->port = listener.port;
  int wake[2];
  if (::pipe2(wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    ::close(impl_->listenFd);
    throw IoError(str("store server: pipe: ", errnoText(errno)));
  }
  impl_->wakeRead = wake[0];
  impl_->wakeWrite = wake[1];
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
  HETRA_INFO(
      "store", "store server listening on ", host, ":", impl_->port,
      impl_->secret.empty() ? " (no authentication)" : " (clients must prove the job secret)");
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop = true;
  const char byte = 1;
  [[maybe_unused]] auto ignored = ::write(impl_->wakeWrite, &byte, 1);
  impl_->thread.join();
  for (auto& [id, c] : impl_->conns)
    if (!c.closed) ::close(c.fd);
  ::close(impl_->listenFd);
  ::close(impl_->wakeRead);
  ::close(impl_->wakeWrite);
}

int TcpStoreServer::port() const {
  return impl_->port;
}
const std::string& TcpStoreServer::host() const {
  return impl_->host;
}

void TcpStoreServer::Impl::run() {
  try {
    loop();
  } catch (const std::exception& e) {
    // Closing every connection turns the failure into IoError on the clients instead of timeouts.
    HETRA_ERROR("store", "store server on ", host, ":", port, " stopped: ", e.what());
    for (auto& [id, c] : conns)
      if (!c.closed) closeConnection(c, "");
  }
}

void TcpStoreServer::Impl::loop() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  while (!stop.load()) {
    fds.assign({{wakeRead, POLLIN, 0}, {listenFd, POLLIN, 0}});
    ids.clear();
    for (auto& [id, c] : conns) {
      const short events = POLLIN | (c.outSent < c.out.size() ? POLLOUT : 0);
      fds.push_back({c.fd, events, 0});
      ids.push_back(id);
    }
    int timeoutMs = -1;
    for (const auto& w : waiters) {
      const int ms = net::pollMillis(w.deadline);
      timeoutMs = timeoutMs < 0 ? ms : std::min(timeoutMs, ms);
    }
    for (const auto& [id, c] : conns) {
      if (!c.handshake) continue;
      const int ms = net::pollMillis(c.handshakeDeadline);
      timeoutMs = timeoutMs < 0 ? ms : std::min(timeoutMs, ms);
    }
    if (::poll(fds.data(), fds.size(), timeoutMs) < 0) {
      if (errno == EINTR) continue;
      throw IoError(str("poll: ", errnoText(errno)));
    }
    if (fds[0].revents) {
      char buf[64];
      while (::read(wakeRead, buf, sizeof(buf)) > 0) {
      }
    }
    if (stop.load()) break;
    if (fds[1].revents & POLLIN) acceptAll();

    for (size_t i = 0; i < ids.size(); ++i) {
      const short revents = fds[i + 2].revents;
      if (!revents) continue;
      Connection& c = conns.at(ids[i]);
      if (!c.closed && (revents & POLLOUT)) flush(c);
      if (!c.closed && (revents & (POLLIN | POLLHUP | POLLERR))) readFrom(c);
      if (!c.closed) processFrames(ids[i], c);
    }
    settle({});
    expireWaiters();
    expireHandshakes();

    for (auto it = conns.begin(); it != conns.end();) {
      if (!it->second.closed) {
        ++it;
        continue;
      }
      const uint64_t id = it->first;
      waiters.remove_if([id](const Waiter& w) { return w.conn == id; });
      it = conns.erase(it);
    }
  }
}

void TcpStoreServer::Impl::acceptAll() {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd =
        ::accept4(listenFd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        HETRA_WARN("store", "store server accept: ", errnoText(errno));
      return;
    }
    net::setNoDelay(fd);
    Connection c;
    c.fd = fd;
    c.peer = net::socketAddress(reinterpret_cast<sockaddr*>(&addr), len);
    HETRA_DEBUG("store", "store server: connection from ", c.peer);
    if (!secret.empty()) {
      if (pendingHandshakes() >= kMaxPendingHandshakes) {
        HETRA_WARN("store", "store server: refused connection from ", c.peer, ": ",
                   kMaxPendingHandshakes, " connections are already authenticating");
        ::close(fd);
        continue;
      }
      c.handshake = std::make_unique<auth::Handshake>(secret, auth::Role::Server, kAuthContext);
      c.handshakeDeadline = deadlineAfter(handshakeTimeout);
      c.out = c.handshake->takeOutput();
    }
    Connection& added = conns.emplace(nextConn++, std::move(c)).first->second;
    if (!added.out.empty()) flush(added);
  }
}

size_t TcpStoreServer::Impl::pendingHandshakes() const {
  size_t count = 0;
  for (const auto& [id, c] : conns) count += c.handshake && !c.closed;
  return count;
}

bool TcpStoreServer::Impl::authenticate(Connection& c) {
  if (!c.handshake) return !c.closed;
  try {
    const size_t used = c.handshake->feed(c.in.data(), c.in.size());
    c.in.erase(c.in.begin(), c.in.begin() + ptrdiff_t(used));
  } catch (const auth::AuthError& e) {
    closeConnection(c, str("refused: the peer ", e.what()));
    return false;
  }
  const auto output = c.handshake->takeOutput();
  c.out.insert(c.out.end(), output.begin(), output.end());
  flush(c);
  if (c.closed || !c.handshake->done()) return false;
  c.handshake.reset();
  HETRA_DEBUG("store", "store server: ", c.peer, " proved the job secret");
  return true;
}

void TcpStoreServer::Impl::expireHandshakes() {
  const Deadline now = Clock::now();
  for (auto& [id, c] : conns)
    if (c.handshake && !c.closed && c.handshakeDeadline <= now)
      closeConnection(c, str("refused: the peer did not authenticate within ",
                             handshakeTimeout.count(), " ms (", c.in.size(), " bytes received)"));
}

void TcpStoreServer::Impl::readFrom(Connection& c) {
  // A well-behaved client has at most one request in flight, so more than one maximal frame
  // buffered means a flood: refuse it rather than buffer without bound.
  constexpr size_t kMaxBuffered = kHeaderBytes + kMaxPayload + kReadChunk;
  for (;;) {
    if (c.in.size() > kMaxBuffered) {
      closeConnection(c, str("client sent over ", kMaxBuffered, " bytes ahead of its replies"));
      return;
    }
    // Before the peer proved the secret, read only a little at a time (poll calls again).
    const size_t chunk = c.handshake ? kHandshakeReadBytes : kReadChunk;
    const size_t old = c.in.size();
    c.in.resize(old + chunk);
    const ssize_t n = ::recv(c.fd, c.in.data() + old, chunk, 0);
    c.in.resize(old + std::max<ssize_t>(n, 0));
    if (n > 0 && c.handshake) return;
    if (n > 0) continue;
    if (n == 0) {
      closeConnection(c, c.handshake ? str("refused: the peer closed the connection during the "
                                           "handshake after ",
                                           c.in.size(), " bytes")
                                     : "");
    } else if (errno == EINTR) {
      continue;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      HETRA_DEBUG("store", "store server: connection from ", c.peer, ": ", errnoText(errno));
      closeConnection(c, "");
    }
    return;
  }
}

void TcpStoreServer::Impl::processFrames(uint64_t id, Connection& c) {
  if (!authenticate(c)) return;
  size_t pos = 0;
  // One request at a time per connection: a parked waiter or an unsent reply holds later frames
  // back (backpressure on clients that do not read their replies).
  while (!c.closed && !c.parked && c.outSent == c.out.size()) {
    if (c.in.size() - pos < kHeaderBytes) break;
    const uint32_t magic = loadU32(&c.in[pos]);
    const uint32_t length = loadU32(&c.in[pos + 4]);
    if (magic != kMagic) {
      closeConnection(c,
                      str("bad frame magic 0x", std::hex, magic, " (not a hetra store client?)"));
      return;
    }
    if (length > kMaxPayload) {
      closeConnection(c,
                      str("frame of ", length, " bytes exceeds the ", kMaxPayload, " byte limit"));
      return;
    }
    if (c.in.size() - pos - kHeaderBytes < length) break;
    Reader r(c.in.data() + pos + kHeaderBytes, length);
    pos += kHeaderBytes + length;
    try {
      handle(id, c, r);
    } catch (const ProtocolError& e) {
      closeConnection(c, str("malformed request: ", e.what()));
      return;
    }
  }
  c.in.erase(c.in.begin(), c.in.begin() + pos);
}

void TcpStoreServer::Impl::handle(uint64_t id, Connection& c, Reader& r) {
  const uint8_t op = r.u8();
  switch (Op(op)) {
    case Op::Set: {
      std::string key = r.string();
      Bytes value = r.bytes();
      r.end();
      values[std::move(key)] = std::move(value);
      changed = true;
      reply(c, Status::Ok, {});
      return;
    }
    case Op::Get:
    case Op::Wait: {
      const uint64_t ms = std::min(r.u64(), kMaxWaitMs);
      std::vector<std::string> keys;
      if (Op(op) == Op::Get)
        keys.push_back(r.string());
      else
        keys = r.strings();
      r.end();
      Waiter w{id, Op(op), std::move(keys), deadlineAfter(Millis(ms))};
      if (present(w.keys)) {
        answerWaiter(c, w);
      } else {
        c.parked = true;
        waiters.push_back(std::move(w));
      }
      return;
    }
    case Op::Add: {
      const std::string key = r.string();
      const int64_t delta = int64_t(r.u64());
      r.end();
      int64_t result = 0;
      try {
        auto it = values.find(key);
        const int64_t current = it == values.end() ? 0 : parseInteger(it->second);
        if (__builtin_add_overflow(current, delta, &result))
          throw Error(str("store add on '", key, "' overflows int64"));
      } catch (const Error& e) {
        reply(c, Status::Failed, Writer().string(e.what()).take());
        return;
      }
      values[key] = integerBytes(result);
      changed = true;
      reply(c, Status::Ok, Writer().u64(uint64_t(result)).take());
      return;
    }
    case Op::CompareSet: {
      const std::string key = r.string();
      const Bytes expected = r.bytes();
      Bytes desired = r.bytes();
      r.end();
      auto it = values.find(key);
      const bool matches = it == values.end() ? expected.empty() : it->second == expected;
      if (matches) {
        values[key] = std::move(desired);
        changed = true;
      }
      it = values.find(key);
      reply(c, Status::Ok, Writer().bytes(it == values.end() ? Bytes{} : it->second).take());
      return;
    }
    case Op::Check: {
      const auto keys = r.strings();
      r.end();
      reply(c, Status::Ok, Writer().u8(present(keys)).take());
      return;
    }
    case Op::Delete: {
      const std::string key = r.string();
      r.end();
      reply(c, Status::Ok, Writer().u8(values.erase(key) > 0).take());
      return;
    }
  }
  throw ProtocolError(str("unknown opcode ", int(op)));
}

void TcpStoreServer::Impl::reply(Connection& c, Status status, const Bytes& body) {
  Bytes payload;
  payload.reserve(body.size() + 1);
  payload.push_back(uint8_t(status));
  payload.insert(payload.end(), body.begin(), body.end());
  const Bytes frame = makeFrame(payload);
  c.out.insert(c.out.end(), frame.begin(), frame.end());
  flush(c);
}

void TcpStoreServer::Impl::flush(Connection& c) {
  while (c.outSent < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.outSent, c.out.size() - c.outSent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.outSent += size_t(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      HETRA_DEBUG("store", "store server: send to ", c.peer, ": ", errnoText(errno));
      closeConnection(c, "");
      return;
    }
  }
  c.out.clear();
  c.outSent = 0;
}

// Answers the waiters whose keys now exist and resumes their connections, until nothing changes.
void TcpStoreServer::Impl::settle(std::vector<uint64_t> resumed) {
  for (;;) {
    if (changed) {
      changed = false;
      for (auto it = waiters.begin(); it != waiters.end();) {
        Connection& c = conns.at(it->conn);
        if (c.closed || !present(it->keys)) {
          ++it;
          continue;
        }
        answerWaiter(c, *it);
        c.parked = false;
        resumed.push_back(it->conn);
        it = waiters.erase(it);
      }
    }
    if (resumed.empty()) return;
    const std::vector<uint64_t> batch = std::move(resumed);
    resumed.clear();
    for (uint64_t id : batch) {
      Connection& c = conns.at(id);
      if (!c.closed) processFrames(id, c);
    }
  }
}

void TcpStoreServer::Impl::expireWaiters() {
  const Deadline now = Clock::now();
  std::vector<uint64_t> resumed;
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    Connection& c = conns.at(it->conn);
    if (!c.closed) {
      reply(c, Status::Timeout, {});
      c.parked = false;
      resumed.push_back(it->conn);
    }
    it = waiters.erase(it);
  }
  settle(std::move(resumed));
}

void TcpStoreServer::Impl::closeConnection(Connection& c, const std::string& why) {
  if (c.closed) return;
  if (!why.empty())
    HETRA_WARN("store", "store server: closing connection from ", c.peer, ": ", why);
  ::close(c.fd);
  c.closed = true;
  c.parked = false;
}

}  // namespace hetra::store
