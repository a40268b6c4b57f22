// The tcp transport's engine, shared by its two halves: tcp_transport.cc (requests, matching,
// the I/O driver, failure) and tcp_bootstrap.cc (listening, handshakes, connecting the group).
// Internal to hetra_comm.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
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
#include "comm/transport/failure_latch.h"
#include "comm/transport/peer_request.h"
#include "comm/transport/peer_transport.h"
#include "comm/transport/tag_matcher.h"
#include "comm/transport/tcp_transport.h"
#include "comm/transport/tcp_wire.h"
#include "comm/transport/wait_schedule.h"
#include "common/bytes.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/params.h"
#include "common/units.h"

namespace hetra::comm::tcp {

// A peer that fails shuts its connections and publishes its abort record; a rank that sees a
// connection drop without an Abort frame waits this long for the record to appear.
constexpr Millis kRecordGrace{500};
// A request that waits this long reads the group's abort record, and again at this interval.
constexpr Millis kProbeInterval{200};
// A wait polls its connections for this long before it blocks in epoll_wait (the schedule of
// wait_schedule.h): long enough to catch a small message's reply over loopback or a LAN, short
// enough that a rank waiting for a slow peer soon leaves the core to others.
constexpr WaitSchedule kWaitSchedule{std::chrono::microseconds(50), std::chrono::microseconds(50)};
// Waits in a row whose spin ended without the message before waits stop spinning; then every
// kSpinRetryEvery-th wait spins again, to notice when spinning pays again.
constexpr int kMaxSpinMisses = 4;
constexpr uint32_t kSpinRetryEvery = 64;
// Per-connection read buffer: small frames are read many per system call.
constexpr size_t kStageBytes = 64 << 10;
// Messages nobody has posted a receive for yet, over all peers.
constexpr size_t kMaxUnexpectedBytes = size_t(256) << 20;

inline std::string errnoText(int err) {
  return std::strerror(err);
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

class TcpTransport;

class TcpRequest final : public PeerRequest<TcpRequest, TcpTransport> {
 public:
  using PeerRequest::PeerRequest;
  ~TcpRequest() override;

 private:
  friend class TcpTransport;
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
  TagMatcher<TcpRequest*, std::shared_ptr<Unexpected>> matcher;
};

class TcpTransport final : public PeerTransport {
 public:
  TcpTransport(std::shared_ptr<store::Store> store, int rank, int size, const TcpOptions& options)
      : PeerTransport("tcp", rank, size, {}),
        store_(std::move(store)),
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
  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) override;

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

  // Failure handling. failure_.latch() (with the lock) latches an error, the first call wins; it
  // calls tellPeersLocked, which sends Abort frames, shuts the connections and wakes everyone;
  // publishRecord (without the lock) then writes the store record.
  void tellPeersLocked(int culprit, const std::string& message) override;
  void afterAbort() override { publishRecord(); }
  void publishRecord();
  bool readAbortRecord(int& culprit, std::string& message);
  // A connection dropped without an Abort frame: blames the culprit of the abort record if one
  // appears within kRecordGrace, else `peer`. Called without the lock.
  void disconnected(int peer, const std::string& why);
  void probeRecord();
  void wakeDriver();

  std::shared_ptr<store::Store> store_;
  const TcpOptions options_;
  const auth::JobSecret secret_;
  std::string groupId_;

  int listenFd_ = -1;
  std::string listenAddress_;  // as published: host:port
  int epollFd_ = -1;
  int wakeFd_ = -1;      // eventfd: wakes the driver
  int acceptWake_ = -1;  // eventfd: stops the accept loop
  std::thread acceptor_;

  std::condition_variable changed_;  // requests completed, the driver left, the group failed
  std::vector<Peer> peers_;
  bool formed_ = false;  // every peer connected: later connections are strangers
  bool driving_ = false;
  int followers_ = 0;
  int spinMisses_ = 0;  // see wait()
  uint32_t waitsWithoutSpin_ = 0;
  std::optional<TokenBucket> bucket_;
  bool throttled_ = false;
  size_t unexpectedBytes_ = 0;
  std::string unpublishedRecord_;
  // Peers whose connection dropped without an Abort frame, noticed by the driver.
  std::vector<std::pair<int, std::string>> lostPeers_;
};

}  // namespace hetra::comm::tcp
