// The tcp transport's bootstrap: each rank listens and publishes its address in the store, the
// ranks join, the higher rank of each pair connects to the lower one, authenticates (common/auth.h)
// and exchanges the hello (tcp_wire.h); the listening socket then refuses strangers until the
// transport is destroyed.
#include "comm/transport/group_join.h"
#include "comm/transport/tcp_engine.h"
#include "comm/transport/tcp_wire.h"

namespace hetra::comm {
namespace tcp {
namespace {

constexpr const char* kAuthContext = "hetra-tcp-transport";
// Connections in their handshake on the listening socket; more are refused.
constexpr size_t kMaxPendingConnections = 64;

// The transport writes with MSG_NOSIGNAL; this protects the application's other sockets the way the
// old Gloo-based transport did, unless the application installed its own handler.
void ignoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
      HETRA_DEBUG("comm", "tcp: SIGPIPE is now ignored, so a dead peer fails a write with EPIPE");
    }
  });
}

// Blocking-style helpers for connection setup on a non-blocking socket, bounded by a deadline.
void waitReady(int fd, short events, Deadline deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ms = net::pollMillis(deadline);
    const int ready = ::poll(&p, 1, ms);
    if (ready > 0) return;
    if (ready == 0 && ms == 0) throw TimeoutError(str(what, ": timed out"));
    if (ready < 0 && errno != EINTR) throw IoError(str(what, ": poll: ", errnoText(errno)));
  }
}

void sendExact(int fd, const uint8_t* data, size_t size, Deadline deadline,
               const std::string& what) {
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0)
      sent += size_t(n);
    else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      waitReady(fd, POLLOUT, deadline, what);
    else if (n < 0 && errno != EINTR)
      throw IoError(str(what, ": ", errnoText(errno)));
  }
}

void receiveExact(int fd, uint8_t* data, size_t size, Deadline deadline, const std::string& what) {
  for (size_t got = 0; got < size;) {
    const ssize_t n = ::recv(fd, data + got, size - got, MSG_DONTWAIT);
    if (n > 0)
      got += size_t(n);
    else if (n == 0)
      throw IoError(str(what, ": the peer closed the connection"));
    else if (errno == EAGAIN || errno == EWOULDBLOCK)
      waitReady(fd, POLLIN, deadline, what);
    else if (errno != EINTR)
      throw IoError(str(what, ": ", errnoText(errno)));
  }
}

std::string randomGroupId() {
  std::random_device device;
  std::string id(16, '\0');
  for (auto& c : id) c = char(device() & 0xff);
  return id;
}

}  // namespace

// --- TcpTransport: connection setup ---

void TcpTransport::listen() {
  const std::string& host = options_.listenAddress;
  const net::Listener listener =
      net::listenOn(host, 0, false, str("tcp transport (rank ", rank_, ")"));
  listenFd_ = listener.fd;
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listenFd_, reinterpret_cast<sockaddr*>(&bound), &len);
  // Peers on other hosts need a name they can reach, not the wildcard.
  listenAddress_ = net::isWildcardHost(host)
                       ? str(net::hostName(), ":", listener.port)
                       : net::socketAddress(reinterpret_cast<sockaddr*>(&bound), len);
}

std::string TcpTransport::helloProblem(const Hello& hello, int expectedRank) const {
  if (hello.size != size_)
    return str("says it is rank ", hello.rank, " of a group of ", hello.size, ", not of ", size_);
  if (hello.groupId != groupId_) return str("says it is rank ", hello.rank, " of another group");
  if (expectedRank >= 0 && hello.rank != expectedRank)
    return str("says it is rank ", hello.rank, ", expected rank ", expectedRank);
  if (expectedRank < 0 && hello.rank <= rank_)
    return str("says it is rank ", hello.rank, ", which does not connect to rank ", rank_);
  return "";
}

// Accepts the connections of the higher ranks, and refuses everyone else with a log line. Every
// handshake is a state of its connection, so a silent stranger holds up nobody.
void TcpTransport::acceptLoop() {
  log::setRank(rank_);
  struct Pending {
    int fd = -1;
    std::string address;
    std::unique_ptr<auth::Handshake> handshake;
    std::vector<uint8_t> hello;
    Deadline deadline;
  };
  std::vector<Pending> pending;
  auto refuse = [&](Pending& c, const std::string& why) {
    HETRA_WARN("comm", "tcp: rank ", rank_, " refused a connection from ", c.address, ": ", why);
    ::close(c.fd);
    c.fd = -1;
  };
  auto sendNow = [&](Pending& c, const std::vector<uint8_t>& bytes) {
    // Handshake messages are tiny and the socket is new: anything but a full write is a failure.
    const ssize_t n = ::send(c.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n != ssize_t(bytes.size()))
      refuse(c, str("could not write the handshake: ", n < 0 ? errnoText(errno) : "short write"));
  };
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign({{acceptWake_, POLLIN, 0}, {listenFd_, POLLIN, 0}});
    Deadline until = Clock::now() + std::chrono::hours(1);  // no deadline: wake hourly
    for (const auto& c : pending) {
      fds.push_back({c.fd, POLLIN, 0});
      until = std::min(until, c.deadline);
    }
    if (::poll(fds.data(), fds.size(), net::pollMillis(until)) < 0 && errno != EINTR) {
      HETRA_ERROR("comm", "tcp: rank ", rank_,
                  " stops accepting connections: poll: ", errnoText(errno));
      break;
    }
    if (fds[0].revents) break;  // the transport is being destroyed
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& c = pending[i];
      if (!fds[i + 2].revents) continue;
      uint8_t buffer[std::max(kHelloBytes, auth::Handshake::kHelloBytes)];
      const size_t want = c.handshake && !c.handshake->done() ? c.handshake->wanted()
                                                              : kHelloBytes - c.hello.size();
      const ssize_t n = ::recv(c.fd, buffer, want, MSG_DONTWAIT);
      if (n == 0) {
        refuse(c, "the peer closed the connection before it was authenticated");
        continue;
      }
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          refuse(c, str("receive failed: ", errnoText(errno)));
        continue;
      }
      if (c.handshake && !c.handshake->done()) {
        try {
          c.handshake->feed(buffer, size_t(n));
        } catch (const auth::AuthError& e) {
          refuse(c, str("the peer ", e.what()));
          continue;
        }
        sendNow(c, c.handshake->takeOutput());
        continue;
      }
      c.hello.insert(c.hello.end(), buffer, buffer + n);
      if (c.hello.size() < kHelloBytes) continue;
      Hello hello;
      std::string problem = decodeHello(c.hello.data(), hello);
      if (problem.empty()) problem = helloProblem(hello, -1);
      if (!problem.empty()) {
        refuse(c, str("the peer ", problem));
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (formed_ || failure_) {
          problem = str("rank ", hello.rank, " connected again after the group formed");
        } else if (peers_[size_t(hello.rank)].fd >= 0) {
          problem = str("rank ", hello.rank, " is already connected");
        }
      }
      if (!problem.empty()) {
        refuse(c, problem);
        continue;
      }
      Hello mine{rank_, size_, groupId_};
      sendNow(c, encodeHello(mine));
      if (c.fd < 0) continue;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        peers_[size_t(hello.rank)].fd = c.fd;
      }
      HETRA_DEBUG("comm", "tcp: rank ", rank_, " accepted rank ", hello.rank, " from ", c.address);
      c.fd = -1;
      changed_.notify_all();
    }
    const auto now = Clock::now();
    for (auto& c : pending)
      if (c.fd >= 0 && c.deadline <= now)
        refuse(c, str("the peer did not complete its handshake within ",
                      options_.auth.handshakeTimeout.count(), " ms"));
    pending.erase(
        std::remove_if(pending.begin(), pending.end(), [](const Pending& c) { return c.fd < 0; }),
        pending.end());
    if (fds[1].revents & POLLIN) {
      for (;;) {
        sockaddr_storage addr{};
        socklen_t len = sizeof addr;
        const int fd = ::accept4(listenFd_, reinterpret_cast<sockaddr*>(&addr), &len,
                                 SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        Pending c;
        c.fd = fd;
        c.address = net::socketAddress(reinterpret_cast<sockaddr*>(&addr), len);
        c.deadline = deadlineAfter(options_.auth.handshakeTimeout);
        if (pending.size() >= kMaxPendingConnections) {
          refuse(c, str(kMaxPendingConnections, " connections are already in their handshake"));
          continue;
        }
        if (!secret_.empty()) {
          c.handshake =
              std::make_unique<auth::Handshake>(secret_, auth::Role::Server, kAuthContext);
          sendNow(c, c.handshake->takeOutput());
          if (c.fd < 0) continue;
        }
        pending.push_back(std::move(c));
      }
    }
  }
  for (auto& c : pending)
    if (c.fd >= 0) ::close(c.fd);
}

void TcpTransport::connectTo(int peer, const std::string& address, Deadline deadline) {
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  const std::string what =
      str("tcp transport: rank ", rank_, " connecting to ", who(peer), " at ", address);
  std::string lastError;
  const int fd = net::connectUntil(host, port, deadline, Millis(2), Millis(100), lastError);
  if (fd < 0) throw TimeoutError(str(what, ": timed out (last error: ", lastError, ")"));
  try {
    if (!secret_.empty())
      auth::authenticate(fd, secret_, auth::Role::Client, kAuthContext,
                         std::min(deadline, deadlineAfter(options_.auth.handshakeTimeout)),
                         who(peer) + " at " + address);
    const auto hello = encodeHello(Hello{rank_, size_, groupId_});
    sendExact(fd, hello.data(), hello.size(), deadline, what);
    uint8_t reply[kHelloBytes];
    receiveExact(fd, reply, sizeof reply, deadline, what);
    Hello theirs;
    std::string problem = decodeHello(reply, theirs);
    if (problem.empty()) problem = helloProblem(theirs, peer);
    if (!problem.empty()) throw IoError(str(what, ": the peer ", problem));
  } catch (const TimeoutError& e) {
    ::close(fd);
    throw TimeoutError(str(e.what(), " (the peer did not answer the hello)"));
  } catch (const std::exception& e) {
    ::close(fd);
    throw IoError(
        str("tcp transport: rank ", rank_, " could not connect to its peers: ", e.what()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  peers_[size_t(peer)].fd = fd;
}

void TcpTransport::setup(Deadline deadline) {
  listen();
  wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  acceptWake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (wakeFd_ < 0 || acceptWake_ < 0 || epollFd_ < 0)
    throw IoError(str("tcp transport: rank ", rank_, ": eventfd/epoll: ", errnoText(errno)));
  if (rank_ == 0) {
    groupId_ = randomGroupId();
    store_->set("group", store::Bytes(groupId_.begin(), groupId_.end()));
  }
  store_->setString(str("addr/", rank_), listenAddress_);
}

void TcpTransport::connectPeers(Deadline deadline) {
  if (rank_ != 0) groupId_ = store_->getString("group", deadline);
  // Connections that arrived meanwhile wait in the listen backlog.
  acceptor_ = std::thread([this] { acceptLoop(); });
  for (int peer = 0; peer < rank_; ++peer)
    connectTo(peer, store_->getString(str("addr/", peer), deadline), deadline);
  std::unique_lock<std::mutex> lock(mutex_);
  auto missing = [&] {
    std::string list;
    for (int peer = rank_ + 1; peer < size_; ++peer)
      if (peers_[size_t(peer)].fd < 0) list += str(list.empty() ? "" : ", ", peer);
    return list;
  };
  while (!missing().empty()) {
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !missing().empty())
      throw TimeoutError(str("tcp transport: rank ", rank_, " timed out after ",
                             options_.timeout.count(), " ms waiting for rank(s) ", missing(),
                             " to connect"));
  }
  formed_ = true;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Peer& p = peers_[size_t(peer)];
    p.name = who(peer);
    p.stage.resize(kStageBytes);
    net::setNoDelay(p.fd);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u32 = uint32_t(peer);
    if (::epoll_ctl(epollFd_, EPOLL_CTL_ADD, p.fd, &ev) != 0)
      throw IoError(str("tcp transport: rank ", rank_, ": epoll_ctl: ", errnoText(errno)));
    p.events = ev.events;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u32 = UINT32_MAX;
  if (::epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev) != 0)
    throw IoError(str("tcp transport: rank ", rank_, ": epoll_ctl: ", errnoText(errno)));
}

TcpTransport::~TcpTransport() {
  if (acceptor_.joinable()) {
    const uint64_t one = 1;
    [[maybe_unused]] auto ignored = ::write(acceptWake_, &one, sizeof one);
    acceptor_.join();
  }
  if (!failure_ && formed_) {
    // Tell every peer that the end of the stream is no fault: a rank that finished early must not
    // fail peers that are still working with others.
    uint8_t header[kTcpFrameHeaderBytes];
    for (auto& p : peers_) {
      if (p.fd < 0 || p.dead || !p.sends.empty()) continue;
      TcpFrameHeader h;
      h.type = TcpFrameHeader::Type::Close;
      h.seq = p.sendSeq++;
      encodeTcpFrameHeader(h, header);
      [[maybe_unused]] auto ignored =
          ::send(p.fd, header, sizeof header, MSG_NOSIGNAL | MSG_DONTWAIT);
      ::shutdown(p.fd, SHUT_WR);
    }
  }
  for (auto& p : peers_)
    if (p.fd >= 0) ::close(p.fd);
  for (int fd : {listenFd_, epollFd_, wakeFd_, acceptWake_})
    if (fd >= 0) ::close(fd);
}

}  // namespace tcp

std::unique_ptr<Transport> createTcpTransport(std::shared_ptr<store::Store> store, int rank,
                                              int size, const TcpOptions& options) {
  enforceGroupMember("tcp transport", store.get(), rank, size);
  tcp::ignoreSigpipe();
  const Deadline deadline = deadlineAfter(options.timeout);

  // A record left by an earlier group under this prefix would fail this one at its first long
  // wait; rank 0 clears it before joining, so no rank passes the join below before that.
  if (rank == 0) store->deleteKey(kAbortKey);
  auto transport = std::make_unique<tcp::TcpTransport>(store, rank, size, options);
  if (size > 1) transport->setup(deadline);
  // Join: a missing rank is named here instead of surfacing as an anonymous connection timeout.
  std::vector<std::string> hosts = joinGroup(*store, "join", net::hostName(), rank, size, deadline,
                                             options.timeout, "tcp transport");
  transport->setHosts(std::move(hosts));
  if (size > 1) transport->connectPeers(deadline);
  return transport;
}

}  // namespace hetra::comm
