// TCP transport: one socket per pair of ranks, authenticated, carrying frames.
//
// Vocabulary:
//   connection - the socket between two ranks; the higher rank connects to the lower one's
//                listening socket (whose address it finds in the store), proves the job secret
//                (common/auth.h) and exchanges a hello (rank, group size, group id). The listening
//                socket stays open: a stranger that connects later is authenticated, refused and
//                logged, and the group goes on.
//   frame      - a 32-byte header (TcpFrameHeader: magic, type, sequence number, tag, size) and
//                its payload. Data frames carry one message; an Abort frame carries the reason a
//                rank failed the group.
//   posted     - receives waiting for a message, per (peer, tag), in the order posted.
//   unexpected - messages that arrived before their receive was posted, buffered up to
//                kMaxUnexpectedBytes; past that, the connection is not read until a receive for
//                the waiting message is posted (backpressure, never unbounded memory).
//   driver     - the thread inside Request::wait that runs the I/O: it waits in epoll for every
//                connection, writes queued sends and reads frames straight into posted buffers,
//                for every request, not only its own. Other waiting threads sleep until it is
//                done (leader/follower). No I/O thread: a message costs no thread wake-up on
//                either side, and a send that fits the socket buffer completes inside isend.
//
// Failure model: the first fault a rank sees (a timeout, a peer's connection dropping, a
// malformed frame, abort()) is latched. The rank then (1) sends an Abort frame with the culprit
// and the reason on every connection that is between frames and shuts every connection down, (2)
// wakes every local waiter, (3) publishes an abort record "<culprit rank>\n<message>" under
// kAbortKey in the group's store (the first record wins). A peer reads the Abort frame, or sees
// the connection close and finds the record (waiting up to kRecordGrace for it), and fails in
// turn with the original culprit and cause. A waiter also reads the record every kProbeInterval,
// so a group fails everywhere within about a second, not at the deadline.
#include "comm/transport/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "comm/transport/abort_record.h"
#include "common/bytes.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/params.h"
#include "common/units.h"

namespace hetra::comm {

namespace {

const Param kRateLimit("HETRA_TCP_RATE_LIMIT", "0",
                       "Outgoing bytes per second of each rank on the tcp transport, e.g. 1gbit, "
                       "125MB, 20MB/s (0: unlimited). Emulates a slow link.");

constexpr uint32_t kFrameMagic = 0x31465448;  // "HTF1" on the wire
constexpr uint32_t kHelloMagic = 0x31485448;  // "HTH1"
constexpr uint16_t kHelloVersion = 1;
constexpr size_t kHelloBytes = 32;
constexpr const char* kAuthContext = "hetra-tcp-transport";
// A peer that fails shuts its connections and publishes its abort record; a rank that sees a
// connection drop without an Abort frame waits this long for the record to appear.
constexpr Millis kRecordGrace{500};
// A request that waits this long reads the group's abort record, and again at this interval.
constexpr Millis kProbeInterval{200};
// Per-connection read buffer: small frames are read many per system call.
constexpr size_t kStageBytes = 64 << 10;
// Messages nobody has posted a receive for yet, over all peers.
constexpr size_t kMaxUnexpectedBytes = size_t(256) << 20;
// Connections in their handshake on the listening socket; more are refused.
constexpr size_t kMaxPendingConnections = 64;

std::string errnoText(int err) {
  return std::strerror(err);
}

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

std::string addressOf(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (::getnameinfo(addr, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return addr->sa_family == AF_INET6 ? str("[", host, "]:", port) : str(host, ":", port);
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

// The hello after the handshake: magic (u32), version (u16), zero (u16), rank (u32), group size
// (u32), group id (16 bytes).
struct Hello {
  int rank = -1;
  int size = 0;
  std::string groupId;  // 16 bytes
};

std::vector<uint8_t> encodeHello(const Hello& hello) {
  std::vector<uint8_t> out(kHelloBytes, 0);
  storeU32(out.data(), kHelloMagic);
  storeU16(out.data() + 4, kHelloVersion);
  storeU32(out.data() + 8, uint32_t(hello.rank));
  storeU32(out.data() + 12, uint32_t(hello.size));
  std::memcpy(out.data() + 16, hello.groupId.data(), std::min<size_t>(16, hello.groupId.size()));
  return out;
}

// "" and `out` filled, or what is wrong with the bytes.
std::string decodeHello(const uint8_t* p, Hello& out) {
  if (loadU32(p) != kHelloMagic) return str("sent a bad hello (word 0x", std::hex, loadU32(p), ")");
  if (loadU16(p + 4) != kHelloVersion)
    return str("speaks transport version ", loadU16(p + 4), ", this process ", kHelloVersion);
  if (loadU16(p + 6) != 0) return "sent a hello with non-zero padding";
  const uint32_t rank = loadU32(p + 8);
  const uint32_t size = loadU32(p + 12);
  if (rank > uint32_t(INT_MAX) || size > uint32_t(INT_MAX) || rank >= size)
    return str("sent a hello for rank ", rank, " of ", size);
  out.rank = int(rank);
  out.size = int(size);
  out.groupId.assign(reinterpret_cast<const char*>(p + 16), 16);
  return "";
}

std::string randomGroupId() {
  std::random_device device;
  std::string id(16, '\0');
  for (auto& c : id) c = char(device() & 0xff);
  return id;
}

// Outgoing bytes per second with a burst of 10 ms (at least 64 KiB), so that a rate limit acts on
// the timescale of one message, not of a whole run.
class TokenBucket {
 public:
  explicit TokenBucket(uint64_t rate)
      : rate_(double(rate)),
        burst_(std::max(65536.0, rate_ * 0.01)),
        tokens_(burst_),
        last_(Clock::now()) {}
  size_t available() {
    const auto now = Clock::now();
    tokens_ =
        std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
    last_ = now;
    return tokens_ >= 1 ? size_t(tokens_) : 0;
  }
  void consume(size_t bytes) { tokens_ -= double(bytes); }
  // When `bytes` (capped at the burst) will be available.
  Clock::time_point when(size_t bytes) const {
    const double missing = std::min(double(bytes), burst_) - tokens_;
    if (missing <= 0) return last_;
    return last_ + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>(missing / rate_));
  }

 private:
  double rate_;
  double burst_;
  double tokens_;
  Clock::time_point last_;
};

}  // namespace

// --- frame header codec ---

void encodeTcpFrameHeader(const TcpFrameHeader& header, uint8_t* out) {
  std::memset(out, 0, kTcpFrameHeaderBytes);
  storeU32(out, kFrameMagic);
  storeU16(out + 4, uint16_t(header.type));
  storeU32(out + 8, header.seq);
  storeU64(out + 16, header.tag);
  storeU64(out + 24, header.bytes);
}

std::string decodeTcpFrameHeader(const uint8_t* data, size_t size, uint32_t expectedSeq,
                                 TcpFrameHeader& out) {
  if (size < kTcpFrameHeaderBytes)
    return str("a frame header needs ", kTcpFrameHeaderBytes, " bytes, got ", size);
  const uint32_t magic = loadU32(data);
  if (magic != kFrameMagic)
    return str("bad frame magic 0x", std::hex, magic, " (a corrupt stream or not a hetra peer)");
  const uint16_t type = loadU16(data + 4);
  if (type < uint16_t(TcpFrameHeader::Type::Data) || type > uint16_t(TcpFrameHeader::Type::Close))
    return str("unknown frame type ", type);
  if (loadU16(data + 6) != 0 || loadU32(data + 12) != 0)
    return "non-zero padding in a frame header";
  const uint32_t seq = loadU32(data + 8);
  if (seq != expectedSeq)
    return str("frame ", seq, " arrived where frame ", expectedSeq,
               " was due (frames lost or reordered)");
  const uint64_t bytes = loadU64(data + 24);
  const auto kind = TcpFrameHeader::Type(type);
  if (kind == TcpFrameHeader::Type::Abort && bytes > kTcpMaxAbortBytes)
    return str("abort frame of ", bytes, " bytes exceeds ", kTcpMaxAbortBytes);
  if (kind == TcpFrameHeader::Type::Close && bytes != 0)
    return str("close frame with ", bytes, " payload bytes");
  if (bytes > kTcpMaxFrameBytes)
    return str("frame of ", bytes, " bytes exceeds ", kTcpMaxFrameBytes);
  out.type = kind;
  out.seq = seq;
  out.tag = loadU64(data + 16);
  out.bytes = bytes;
  return "";
}

uint64_t parseRate(const std::string& text, const std::string& source) {
  const double rate = hetra::parseRate(text, source);
  // A petabyte per second is no limit on any link: a larger figure is a typo.
  if (rate > 1e15)
    throw ConfigError(str(source, "='", text, "' is above 1PB/s; use 0 for unlimited"));
  // A positive rate below one byte per second would never send anything.
  return rate > 0 ? std::max<uint64_t>(1, uint64_t(std::llround(rate))) : 0;
}

uint64_t tcpRateLimitFromEnvironment() {
  return parseRate(kRateLimit.str(), kRateLimit.env());
}

namespace {

class TcpTransport;

class TcpRequest final : public Request {
 public:
  TcpRequest(TcpTransport& transport, bool isSend, int peer, uint64_t tag, uint8_t* data,
             size_t bytes)
      : transport_(transport),
        isSend_(isSend),
        peer_(peer),
        tag_(tag),
        data_(data),
        bytes_(bytes) {}
  ~TcpRequest() override;
  void wait(Deadline deadline) override;
  std::string describe() const;

 private:
  friend class TcpTransport;
  TcpTransport& transport_;
  const bool isSend_;
  const int peer_;
  const uint64_t tag_;
  uint8_t* const data_;
  const size_t bytes_;
  // Guarded by the transport's mutex.
  uint8_t header_[kTcpFrameHeaderBytes] = {};  // sends: the frame header
  size_t progress_ = 0;  // sends: header + payload bytes written; receives: payload bytes read
  bool queued_ = false;  // in a queue or a connection's read target
  bool done_ = false;
};

// A message that arrived before its receive was posted.
struct Unexpected {
  std::vector<uint8_t> data;
  size_t got = 0;
  bool complete() const { return got == data.size(); }
};

struct Peer {
  int fd = -1;
  std::string name;     // "rank 3 (host)"
  uint32_t events = 0;  // the epoll interest currently registered
  // Sending: the head is being written; frames never interleave.
  std::deque<TcpRequest*> sends;
  uint32_t sendSeq = 0;
  bool writeBlocked = false;  // the socket buffer is full: wait for EPOLLOUT
  // Receiving.
  uint32_t recvSeq = 0;
  std::vector<uint8_t> stage;
  size_t stageBegin = 0;
  size_t stageEnd = 0;
  bool inFrame = false;
  TcpFrameHeader frame;
  size_t frameGot = 0;
  TcpRequest* target = nullptr;            // the frame goes straight into a posted receive
  std::shared_ptr<Unexpected> unexpected;  // or into a buffer
  std::string abortText;                   // or, for an Abort frame, here
  bool paused = false;  // a frame has neither: not read until a receive is posted or memory frees
  bool dead = false;    // the connection dropped; no longer polled
  bool closed = false;  // the peer sent Close: its end of the stream is not a fault
  std::unordered_map<uint64_t, std::deque<TcpRequest*>> posted;
  std::unordered_map<uint64_t, std::deque<std::shared_ptr<Unexpected>>> arrived;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(std::shared_ptr<store::Store> store, int rank, int size, const TcpOptions& options)
      : store_(std::move(store)),
        rank_(rank),
        size_(size),
        options_(options),
        secret_(options.auth.resolve()),
        peers_(size_t(size)) {
    if (options.rateLimitBytesPerSecond > 0) bucket_.emplace(options.rateLimitBytesPerSecond);
  }
  ~TcpTransport() override;

  // Listens and publishes the address (before the join); then, once every rank joined, connects
  // to the lower ranks and waits for the higher ones.
  void setup(Deadline deadline);
  void connectPeers(Deadline deadline);

  const char* name() const override { return "tcp"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  void abort(const std::string& reason) override {
    const std::string message = str(who(rank_), " aborted the group: ", reason);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failLocked(std::make_exception_ptr(PeerAbortedError(rank_, message)), rank_, message);
    }
    publishRecord();
  }
  uint64_t bytesSent() const override { return sent_.load(std::memory_order_relaxed); }
  uint64_t bytesReceived() const override { return received_.load(std::memory_order_relaxed); }

  std::string who(int peer) const { return str("rank ", peer, " (", hosts_[size_t(peer)], ")"); }
  void setHosts(std::vector<std::string> hosts) { hosts_ = std::move(hosts); }

  // --- used by TcpRequest ---
  void wait(TcpRequest& request, Deadline deadline);
  void release(TcpRequest& request);

 private:
  // Connection setup.
  void listen();
  void acceptLoop();
  void connectTo(int peer, const std::string& address, Deadline deadline);
  std::string helloProblem(const Hello& hello, int expectedRank) const;

  // I/O; the caller holds mutex_.
  void updateInterest(Peer& p);
  void writePeer(int peer);
  void writeAll();
  void readPeer(int peer);
  void startFrame(int peer);
  void finishFrame(int peer);
  void completeLocked(TcpRequest& request);
  void resumePaused();
  bool assignTarget(int peer);
  void lost(int peer, const std::string& why);
  void checkClosed(int peer);

  // Failure handling. failLocked latches `error` (first call wins), sends Abort frames, shuts the
  // connections and wakes everyone; publishRecord (without the lock) then writes the store record.
  std::exception_ptr failLocked(std::exception_ptr error, int culprit, const std::string& message);
  void publishRecord();
  bool readAbortRecord(int& culprit, std::string& message);
  // A connection dropped without an Abort frame: blames the culprit of the abort record if one
  // appears within kRecordGrace, else `peer`. Called without the lock.
  void disconnected(int peer, const std::string& why);
  void probeRecord();
  void wakeDriver();

  std::shared_ptr<store::Store> store_;
  const int rank_;
  const int size_;
  const TcpOptions options_;
  const auth::JobSecret secret_;
  std::vector<std::string> hosts_;
  std::string groupId_;
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> received_{0};

  int listenFd_ = -1;
  std::string listenAddress_;  // as published: host:port
  int epollFd_ = -1;
  int wakeFd_ = -1;      // eventfd: wakes the driver
  int acceptWake_ = -1;  // eventfd: stops the accept loop
  std::thread acceptor_;

  std::mutex mutex_;
  std::condition_variable changed_;  // requests completed, the driver left, the group failed
  std::vector<Peer> peers_;
  bool formed_ = false;  // every peer connected: later connections are strangers
  bool driving_ = false;
  int followers_ = 0;
  std::optional<TokenBucket> bucket_;
  bool throttled_ = false;
  size_t unexpectedBytes_ = 0;
  std::exception_ptr failure_;
  std::string unpublishedRecord_;
  // Peers whose connection dropped without an Abort frame, noticed by the driver.
  std::vector<std::pair<int, std::string>> lostPeers_;
};

// --- TcpRequest ---

std::string TcpRequest::describe() const {
  return str(isSend_ ? "send of " : "receive of ", bytes_, " bytes ", isSend_ ? "to " : "from ",
             transport_.who(peer_), " (tag ", tag_, ")");
}

void TcpRequest::wait(Deadline deadline) {
  transport_.wait(*this, deadline);
}

TcpRequest::~TcpRequest() {
  transport_.release(*this);
}

// --- TcpTransport: requests ---

std::unique_ptr<Request> TcpTransport::isend(int peer, uint64_t tag, const void* data,
                                             size_t bytes) {
  HETRA_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "tcp: peer ", peer,
                " is not another rank of this group of ", size_, " (this is rank ", rank_, ")");
  HETRA_ENFORCE(data != nullptr || bytes == 0, "tcp: null buffer for ", bytes, " bytes");
  auto request = std::make_unique<TcpRequest>(
      *this, true, peer, tag, static_cast<uint8_t*>(const_cast<void*>(data)), bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  Peer& p = peers_[size_t(peer)];
  TcpFrameHeader header;
  header.type = TcpFrameHeader::Type::Data;
  header.seq = p.sendSeq++;
  header.tag = tag;
  header.bytes = bytes;
  encodeTcpFrameHeader(header, request->header_);
  request->queued_ = true;
  p.sends.push_back(request.get());
  checkClosed(peer);
  if (failure_) std::rethrow_exception(failure_);
  // Write now: a small message is on the wire before isend returns.
  if (p.sends.size() == 1 && !p.writeBlocked) writePeer(peer);
  if (throttled_ && driving_) wakeDriver();  // its sleep may be longer than the token wait
  return request;
}

std::unique_ptr<Request> TcpTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  HETRA_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "tcp: peer ", peer,
                " is not another rank of this group of ", size_, " (this is rank ", rank_, ")");
  HETRA_ENFORCE(data != nullptr || bytes == 0, "tcp: null buffer for ", bytes, " bytes");
  auto request =
      std::make_unique<TcpRequest>(*this, false, peer, tag, static_cast<uint8_t*>(data), bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  Peer& p = peers_[size_t(peer)];
  auto mismatch = [&](uint64_t sent) {
    const std::string message =
        str("tcp: ", who(peer), " sent a message of ", sent, " bytes with tag ", tag, " but rank ",
            rank_, " posted a receive of ", bytes, " bytes for it");
    std::rethrow_exception(
        failLocked(std::make_exception_ptr(MismatchError(message)), rank_, message));
  };
  auto& arrived = p.arrived[tag];
  if (!arrived.empty()) {
    // The oldest message of this tag arrived first: it is this receive's.
    std::shared_ptr<Unexpected> message = arrived.front();
    if (message->data.size() != bytes) mismatch(message->data.size());
    arrived.pop_front();
    if (arrived.empty()) p.arrived.erase(tag);
    if (bytes) std::memcpy(data, message->data.data(), message->got);
    request->progress_ = message->got;
    if (message->complete()) {
      unexpectedBytes_ -= bytes;
      completeLocked(*request);
      resumePaused();
    } else {
      // Still arriving: the rest goes straight into the posted buffer.
      HETRA_ENFORCE(p.unexpected == message,
                    "tcp: an incomplete message is not the one being read");
      unexpectedBytes_ -= bytes;
      p.unexpected.reset();
      p.target = request.get();
      request->queued_ = true;
      resumePaused();
    }
    return request;
  }
  auto& posted = p.posted[tag];
  request->queued_ = true;
  posted.push_back(request.get());
  if (p.paused && !p.dead && p.frame.tag == tag && posted.size() == 1 && assignTarget(peer)) {
    p.paused = false;
    updateInterest(p);
  }
  checkClosed(peer);
  if (failure_) std::rethrow_exception(failure_);
  return request;
}

void TcpTransport::completeLocked(TcpRequest& request) {
  request.done_ = true;
  request.queued_ = false;
  (request.isSend_ ? sent_ : received_).fetch_add(request.bytes_, std::memory_order_relaxed);
}

void TcpTransport::release(TcpRequest& request) {
  bool abandoned = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!request.queued_) return;
    Peer& p = peers_[size_t(request.peer_)];
    // After a failure the queues may have been cleared already.
    if (request.isSend_) {
      auto found = std::find(p.sends.begin(), p.sends.end(), &request);
      if (found != p.sends.end()) p.sends.erase(found);
    } else if (p.target == &request) {
      p.target = nullptr;
    } else if (auto posted = p.posted.find(request.tag_); posted != p.posted.end()) {
      auto found = std::find(posted->second.begin(), posted->second.end(), &request);
      if (found != posted->second.end()) posted->second.erase(found);
    }
    request.queued_ = false;
    if (!failure_) {
      // The peer will send this message (or expects it): the group cannot continue consistently.
      const std::string message = str("rank ", rank_, " abandoned a pending ", request.describe(),
                                      " (a bug in the caller)");
      failLocked(std::make_exception_ptr(IoError(message)), rank_, message);
      abandoned = true;
    }
  }
  if (abandoned) publishRecord();
}

// --- TcpTransport: the driver ---

void TcpTransport::wait(TcpRequest& request, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto start = Clock::now();
  auto nextProbe = start + kProbeInterval;
  epoll_event events[16];
  while (!request.done_) {
    if (failure_) {
      lock.unlock();
      publishRecord();
      lock.lock();
      std::rethrow_exception(failure_);
    }
    if (!lostPeers_.empty() && !driving_) {
      auto [peer, why] = lostPeers_.front();
      lostPeers_.clear();
      driving_ = true;  // nobody else drives meanwhile: they would only see the same drop
      lock.unlock();
      disconnected(peer, why);
      lock.lock();
      driving_ = false;
      continue;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      const auto waited = std::chrono::duration_cast<Millis>(now - start);
      const std::string message = str("tcp: rank ", rank_, " timed out after ", waited.count(),
                                      " ms waiting for the ", request.describe());
      failLocked(std::make_exception_ptr(TimeoutError(message)), request.peer_, message);
      continue;
    }
    if (now >= nextProbe && !driving_) {
      nextProbe = now + kProbeInterval;
      lock.unlock();
      probeRecord();
      lock.lock();
      continue;
    }
    if (driving_) {
      ++followers_;
      changed_.wait_until(lock, std::min(deadline, nextProbe));
      --followers_;
      continue;
    }
    // This thread drives the I/O of every connection until its own request completes.
    driving_ = true;
    auto until = std::min(deadline, nextProbe);
    if (throttled_ && bucket_) until = std::min(until, bucket_->when(kStageBytes));
    lock.unlock();
    const int ms = net::pollMillis(until);
    const int n = ::epoll_wait(epollFd_, events, 16, ms);
    const int err = errno;
    lock.lock();
    driving_ = false;
    if (n < 0 && err != EINTR) {
      const std::string message = str("tcp: epoll_wait on rank ", rank_, ": ", errnoText(err));
      failLocked(std::make_exception_ptr(IoError(message)), rank_, message);
    }
    for (int i = 0; i < n && !failure_; ++i) {
      const uint32_t peer = events[i].data.u32;
      if (peer >= uint32_t(size_)) {  // the wake-up eventfd
        uint64_t value;
        [[maybe_unused]] auto ignored = ::read(wakeFd_, &value, sizeof value);
        continue;
      }
      if (events[i].events & EPOLLOUT) peers_[peer].writeBlocked = false;
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) readPeer(int(peer));
    }
    if (!failure_) writeAll();
    if (followers_ > 0) changed_.notify_all();
  }
  if (followers_ > 0) changed_.notify_all();
}

void TcpTransport::updateInterest(Peer& p) {
  if (p.fd < 0 || epollFd_ < 0 || p.dead) return;
  uint32_t events = p.paused ? 0u : uint32_t(EPOLLIN | EPOLLRDHUP);
  if (p.writeBlocked) events |= EPOLLOUT;
  if (events == p.events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u32 = uint32_t(&p - peers_.data());
  ::epoll_ctl(epollFd_, EPOLL_CTL_MOD, p.fd, &ev);
  p.events = events;
}

void TcpTransport::writeAll() {
  throttled_ = false;
  for (int peer = 0; peer < size_ && !failure_; ++peer)
    if (!peers_[size_t(peer)].sends.empty() && !peers_[size_t(peer)].writeBlocked) writePeer(peer);
}

void TcpTransport::writePeer(int peer) {
  Peer& p = peers_[size_t(peer)];
  while (!p.sends.empty() && !failure_) {
    // Several queued small messages go out in one system call.
    iovec iov[16];
    int count = 0;
    size_t want = 0;
    for (size_t i = 0; i < p.sends.size() && count + 2 <= 16; ++i) {
      TcpRequest& r = *p.sends[i];
      size_t offset = r.progress_;
      if (offset < kTcpFrameHeaderBytes) {
        iov[count++] = {r.header_ + offset, kTcpFrameHeaderBytes - offset};
        want += kTcpFrameHeaderBytes - offset;
        offset = kTcpFrameHeaderBytes;
      }
      const size_t payload = offset - kTcpFrameHeaderBytes;
      if (payload < r.bytes_) {
        iov[count++] = {r.data_ + payload, r.bytes_ - payload};
        want += r.bytes_ - payload;
      }
      if (want >= kStageBytes) break;
    }
    if (bucket_) {
      const size_t allowed = bucket_->available();
      if (allowed == 0) {
        throttled_ = true;
        return;
      }
      if (allowed < want) {
        // Trim the vector to the allowance.
        size_t left = allowed;
        int kept = 0;
        for (; kept < count && left > 0; ++kept) {
          iov[kept].iov_len = std::min(iov[kept].iov_len, left);
          left -= iov[kept].iov_len;
        }
        count = kept;
        want = allowed;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = size_t(count);
    const ssize_t n = ::sendmsg(p.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        p.writeBlocked = true;
        updateInterest(p);
        return;
      }
      lost(peer, str("send failed: ", errnoText(errno)));
      return;
    }
    if (bucket_) bucket_->consume(size_t(n));
    // Every queued frame has at least its header, so the bytes written end in some frame.
    for (size_t left = size_t(n); left > 0;) {
      TcpRequest& r = *p.sends.front();
      const size_t take = std::min(left, kTcpFrameHeaderBytes + r.bytes_ - r.progress_);
      r.progress_ += take;
      left -= take;
      if (r.progress_ < kTcpFrameHeaderBytes + r.bytes_) break;
      p.sends.pop_front();
      completeLocked(r);
    }
    // A short write means the socket buffer is full: the next sendmsg says EAGAIN.
  }
  p.writeBlocked = false;
  updateInterest(p);
}

void TcpTransport::readPeer(int peer) {
  Peer& p = peers_[size_t(peer)];
  while (!failure_ && !p.paused) {
    const size_t staged = p.stageEnd - p.stageBegin;
    if (!p.inFrame) {
      if (staged >= kTcpFrameHeaderBytes) {
        startFrame(peer);
        continue;
      }
    } else {
      const size_t left = p.frame.bytes - p.frameGot;
      uint8_t* dst = p.target       ? p.target->data_ + p.frameGot
                     : p.unexpected ? p.unexpected->data.data() + p.frameGot
                                    : reinterpret_cast<uint8_t*>(p.abortText.data()) + p.frameGot;
      if (left == 0) {
        finishFrame(peer);
        continue;
      }
      if (staged > 0) {
        const size_t take = std::min(left, staged);
        std::memcpy(dst, p.stage.data() + p.stageBegin, take);
        p.stageBegin += take;
        p.frameGot += take;
        if (p.unexpected) p.unexpected->got += take;
        if (p.target) p.target->progress_ += take;
        continue;
      }
      // Nothing staged: read the rest of the payload straight into place, and what follows it
      // into the stage, in one system call.
      p.stageBegin = p.stageEnd = 0;
      iovec iov[2] = {{dst, left}, {p.stage.data(), p.stage.size()}};
      const ssize_t n = ::readv(p.fd, iov, 2);
      if (n > 0) {
        const size_t direct = std::min(left, size_t(n));
        p.frameGot += direct;
        if (p.unexpected) p.unexpected->got += direct;
        if (p.target) p.target->progress_ += direct;
        p.stageEnd = size_t(n) - direct;
        continue;
      }
      if (n == 0) {
        lost(peer, str("the connection closed in the middle of a ", p.frame.bytes, "-byte frame"));
        return;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      lost(peer, str("receive failed: ", errnoText(errno)));
      return;
    }
    // Need more bytes for a header: compact the stage and read.
    if (p.stageBegin > 0) {
      std::memmove(p.stage.data(), p.stage.data() + p.stageBegin, staged);
      p.stageBegin = 0;
      p.stageEnd = staged;
    }
    const ssize_t n = ::recv(p.fd, p.stage.data() + p.stageEnd, p.stage.size() - p.stageEnd, 0);
    if (n > 0) {
      p.stageEnd += size_t(n);
      continue;
    }
    if (n == 0) {
      if (p.closed && staged == 0) {
        // The peer closed its transport cleanly: stop polling the socket.
        ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, p.fd, nullptr);
        p.events = 0;
        p.dead = p.paused = true;
        return;
      }
      lost(peer, staged ? "the connection closed in the middle of a frame header"
                        : "the connection closed");
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    lost(peer, str("receive failed: ", errnoText(errno)));
    return;
  }
}

void TcpTransport::startFrame(int peer) {
  Peer& p = peers_[size_t(peer)];
  TcpFrameHeader header;
  const std::string problem = decodeTcpFrameHeader(p.stage.data() + p.stageBegin,
                                                   p.stageEnd - p.stageBegin, p.recvSeq, header);
  if (!problem.empty()) {
    const std::string message =
        str("tcp: rank ", rank_, " received a malformed frame from ", who(peer), ": ", problem);
    failLocked(std::make_exception_ptr(IoError(message)), peer, message);
    return;
  }
  p.stageBegin += kTcpFrameHeaderBytes;
  ++p.recvSeq;
  p.inFrame = true;
  p.frame = header;
  p.frameGot = 0;
  p.target = nullptr;
  p.unexpected.reset();
  if (header.type == TcpFrameHeader::Type::Abort) {
    p.abortText.assign(header.bytes, '\0');
    return;
  }
  if (header.type == TcpFrameHeader::Type::Close) {
    p.inFrame = false;
    p.closed = true;
    checkClosed(peer);
    return;
  }
  if (!assignTarget(peer) && !failure_) {
    p.paused = true;  // resumed by irecv or when buffered messages are taken
    updateInterest(p);
  }
}

// Gives the current data frame of `peer` a destination: the oldest posted receive of its tag, else
// a new buffer if memory allows. False when it has none (then the connection pauses).
bool TcpTransport::assignTarget(int peer) {
  Peer& p = peers_[size_t(peer)];
  auto found = p.posted.find(p.frame.tag);
  if (found != p.posted.end() && !found->second.empty()) {
    TcpRequest& r = *found->second.front();
    if (r.bytes_ != p.frame.bytes) {
      const std::string message =
          str("tcp: ", who(peer), " sent a message of ", p.frame.bytes, " bytes with tag ",
              p.frame.tag, " but rank ", rank_, " posted a receive of ", r.bytes_, " bytes for it");
      failLocked(std::make_exception_ptr(MismatchError(message)), rank_, message);
      return false;
    }
    found->second.pop_front();
    if (found->second.empty()) p.posted.erase(found);
    p.target = &r;
    return true;
  }
  if (p.frame.bytes > 0 && unexpectedBytes_ + p.frame.bytes > kMaxUnexpectedBytes) return false;
  auto message = std::make_shared<Unexpected>();
  message->data.resize(p.frame.bytes);
  unexpectedBytes_ += p.frame.bytes;
  p.arrived[p.frame.tag].push_back(message);
  p.unexpected = message;
  return true;
}

void TcpTransport::finishFrame(int peer) {
  Peer& p = peers_[size_t(peer)];
  p.inFrame = false;
  if (p.frame.type == TcpFrameHeader::Type::Abort) {
    const int culprit = p.frame.tag < uint64_t(size_) ? int(p.frame.tag) : peer;
    const std::string message = str(p.abortText, " (seen by rank ", rank_, ")");
    failLocked(std::make_exception_ptr(PeerAbortedError(culprit, message)), culprit, message);
    return;
  }
  if (p.target) completeLocked(*p.target);
  p.target = nullptr;
  p.unexpected.reset();
}

// A peer that closed its transport cleanly fails only the requests that still need it.
void TcpTransport::checkClosed(int peer) {
  Peer& p = peers_[size_t(peer)];
  if (!p.closed || failure_) return;
  const TcpRequest* stranded = !p.sends.empty() ? p.sends.front() : nullptr;
  for (const auto& [tag, posted] : p.posted)
    if (!stranded && !posted.empty()) stranded = posted.front();
  if (!stranded) return;
  const std::string message = str(who(peer), " closed its transport before the ",
                                  stranded->describe(), " on rank ", rank_, " completed");
  failLocked(std::make_exception_ptr(PeerAbortedError(peer, message)), peer, message);
}

// Buffered messages were taken: connections paused for lack of memory may go on.
void TcpTransport::resumePaused() {
  for (int peer = 0; peer < size_; ++peer) {
    Peer& p = peers_[size_t(peer)];
    if (!p.paused || p.dead || failure_) continue;
    if (assignTarget(peer)) {
      p.paused = false;
      updateInterest(p);
    }
  }
}

void TcpTransport::lost(int peer, const std::string& why) {
  Peer& p = peers_[size_t(peer)];
  if (p.dead) return;
  if (p.fd >= 0 && epollFd_ >= 0 && p.events != 0) {
    // Level-triggered: stop reporting the dead socket while the drop is looked into.
    ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, p.fd, nullptr);
    p.events = 0;
  }
  p.dead = true;
  p.paused = true;
  p.sends.clear();  // they fail with the transport
  lostPeers_.emplace_back(peer, why);
}

// --- TcpTransport: failure ---

std::exception_ptr TcpTransport::failLocked(std::exception_ptr error, int culprit,
                                            const std::string& message) {
  if (failure_) return failure_;
  failure_ = error;
  HETRA_DEBUG("comm", "tcp: group failed: ", message);
  unpublishedRecord_ = str(culprit, "\n", message);
  uint8_t header[kTcpFrameHeaderBytes];
  const std::string reason = message.substr(0, kTcpMaxAbortBytes);
  for (int peer = 0; peer < size_; ++peer) {
    Peer& p = peers_[size_t(peer)];
    if (p.fd < 0) continue;
    // Between frames only (the head send has not started): else the peer sees the stream end
    // mid-frame and reads the store's record instead.
    if (p.sends.empty() || p.sends.front()->progress_ == 0) {
      TcpFrameHeader h;
      h.type = TcpFrameHeader::Type::Abort;
      h.seq = p.sendSeq++;
      h.tag = uint64_t(culprit);
      h.bytes = reason.size();
      encodeTcpFrameHeader(h, header);
      iovec iov[2] = {{header, sizeof header}, {const_cast<char*>(reason.data()), reason.size()}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      [[maybe_unused]] auto ignored = ::sendmsg(p.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    ::shutdown(p.fd, SHUT_RDWR);
  }
  for (auto& p : peers_) p.sends.clear();
  wakeDriver();
  changed_.notify_all();
  return failure_;
}

void TcpTransport::publishRecord() {
  std::string record;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    record.swap(unpublishedRecord_);
  }
  if (record.empty()) return;
  publishAbortRecord(*store_, record, "tcp");
}

bool TcpTransport::readAbortRecord(int& culprit, std::string& message) {
  return comm::readAbortRecord(*store_, culprit, message);
}

void TcpTransport::disconnected(int peer, const std::string& why) {
  int culprit = peer;
  std::string message;
  const Deadline graceEnd = deadlineAfter(kRecordGrace);
  bool found = readAbortRecord(culprit, message);
  auto failed = [&] {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_ != nullptr;
  };
  while (!found && Clock::now() < graceEnd && !failed()) {
    std::this_thread::sleep_for(Millis(5));
    found = readAbortRecord(culprit, message);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (found) {
      message += str(" (seen by rank ", rank_, ")");
    } else {
      culprit = peer;
      message = str(who(peer), " disconnected: ", why, " (seen by rank ", rank_, ")");
    }
    failLocked(std::make_exception_ptr(PeerAbortedError(culprit, message)), culprit, message);
  }
  publishRecord();
}

void TcpTransport::probeRecord() {
  int culprit = -1;
  std::string message;
  if (!readAbortRecord(culprit, message)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  message += str(" (seen by rank ", rank_, ")");
  failLocked(std::make_exception_ptr(PeerAbortedError(culprit, message)), culprit, message);
}

void TcpTransport::wakeDriver() {
  if (wakeFd_ < 0) return;
  const uint64_t one = 1;
  [[maybe_unused]] auto ignored = ::write(wakeFd_, &one, sizeof one);
}

// --- TcpTransport: connection setup ---

void TcpTransport::listen() {
  const std::string& host = options_.listenAddress;
  const bool any = host.empty() || host == "*" || host == "0.0.0.0";
  addrinfo hints{};
  hints.ai_family = any ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(any ? nullptr : host.c_str(), "0", &hints, &res);
  if (rc != 0)
    throw IoError(
        str("tcp transport: cannot listen on '", host, "' (rank ", rank_, "): ", gai_strerror(rc)));
  std::string lastError = "no address";
  for (addrinfo* ai = res; ai && listenFd_ < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      lastError = errnoText(errno);
      continue;
    }
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      listenFd_ = fd;
    } else {
      lastError = errnoText(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (listenFd_ < 0)
    throw IoError(
        str("tcp transport: cannot listen on '", host, "' (rank ", rank_, "): ", lastError));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listenFd_, reinterpret_cast<sockaddr*>(&bound), &len);
  listenAddress_ = addressOf(reinterpret_cast<sockaddr*>(&bound), len);
  if (any) {
    // Peers on other hosts need a name they can reach, not the wildcard.
    const auto port = ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    listenAddress_ = str(net::hostName(), ":", port);
  }
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
        c.address = addressOf(reinterpret_cast<sockaddr*>(&addr), len);
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
  if (rank_ != 0) groupId_ = store_->getString("group", remaining(deadline));
  // Connections that arrived meanwhile wait in the listen backlog.
  acceptor_ = std::thread([this] { acceptLoop(); });
  for (int peer = 0; peer < rank_; ++peer)
    connectTo(peer, store_->getString(str("addr/", peer), remaining(deadline)), deadline);
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

}  // namespace

std::unique_ptr<Transport> createTcpTransport(std::shared_ptr<store::Store> store, int rank,
                                              int size, const TcpOptions& options) {
  HETRA_ENFORCE(store != nullptr, "tcp transport: no store");
  HETRA_ENFORCE(size >= 1 && rank >= 0 && rank < size, "tcp transport: rank ", rank,
                " is outside a group of ", size);
  ignoreSigpipe();
  const Deadline deadline = deadlineAfter(options.timeout);

  // A record left by an earlier group under this prefix would fail this one at its first long
  // wait; rank 0 clears it before joining, so no rank passes the join below before that.
  if (rank == 0) store->deleteKey(kAbortKey);
  auto transport = std::make_unique<TcpTransport>(store, rank, size, options);
  if (size > 1) transport->setup(deadline);
  // Join: a missing rank is named here instead of surfacing as an anonymous connection timeout.
  store->setString(str("join/", rank), net::hostName());
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(str("join/", r));
  try {
    store->wait(keys, remaining(deadline));
  } catch (const TimeoutError&) {
    std::string missing;
    int count = 0;
    for (int r = 0; r < size; ++r) {
      if (store->check({keys[size_t(r)]})) continue;
      missing += str(count++ ? ", " : "", r);
    }
    throw TimeoutError(str("tcp transport: rank", count > 1 ? "s " : " ", missing,
                           " of a group of ", size, " did not join within ",
                           options.timeout.count(), " ms (this is rank ", rank, ")"));
  }
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r)
    hosts.push_back(store->getString(keys[size_t(r)], remaining(deadline)));
  transport->setHosts(std::move(hosts));
  if (size > 1) transport->connectPeers(deadline);
  return transport;
}

}  // namespace hetra::comm
