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
#include "comm/transport/tcp_engine.h"

namespace hetra::comm {

namespace {

const Param kRateLimit("HETRA_TCP_RATE_LIMIT", "0",
                       "Outgoing bytes per second of each rank on the tcp transport, e.g. 1gbit, "
                       "125MB, 20MB/s (0: unlimited). Emulates a slow link.");

}  // namespace

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

namespace tcp {

// --- TcpRequest ---

TcpRequest::~TcpRequest() {
  transport_.release(*this);
}

// --- TcpTransport: requests ---

std::unique_ptr<Request> TcpTransport::isend(int peer, uint64_t tag, const void* data,
                                             size_t bytes) {
  auto request = TcpRequest::send(*this, peer, tag, data, bytes);
  auto lock = lockUnlessFailed();
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
  failure_.rethrowIfFailed();
  // Write now: a small message is on the wire before isend returns.
  if (p.sends.size() == 1 && !p.writeBlocked) writePeer(peer);
  if (throttled_ && driving_) wakeDriver();  // its sleep may be longer than the token wait
  return request;
}

std::unique_ptr<Request> TcpTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  auto request = TcpRequest::receive(*this, peer, tag, data, bytes);
  auto lock = lockUnlessFailed();
  Peer& p = peers_[size_t(peer)];
  if (auto* oldest = p.matcher.oldestArrived(tag)) {
    // The oldest message of this tag arrived first: it is this receive's.
    if ((*oldest)->data.size() != bytes) {
      const std::string message =
          sizeMismatchMessage("tcp", who(peer), (*oldest)->data.size(), tag, rank_, bytes);
      std::rethrow_exception(
          failure_.latch(std::make_exception_ptr(MismatchError(message)), rank_, message));
    }
    std::shared_ptr<Unexpected> message = p.matcher.takeArrived(tag);
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
  request->queued_ = true;
  p.matcher.post(tag, request.get());
  if (p.paused && !p.dead && p.frame.tag == tag && p.matcher.postedCount(tag) == 1 &&
      assignTarget(peer)) {
    p.paused = false;
    updateInterest(p);
  }
  checkClosed(peer);
  failure_.rethrowIfFailed();
  return request;
}

void TcpTransport::completeLocked(TcpRequest& request) {
  request.done_ = true;
  request.queued_ = false;
  countPayload(request.isSend_, request.bytes_);
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
    } else {
      p.matcher.cancel(request.tag_, &request);
    }
    request.queued_ = false;
    if (!failure_) {
      // The peer will send this message (or expects it): the group cannot continue consistently.
      const std::string message = str("rank ", rank_, " abandoned a pending ", request.describe(),
                                      " (a bug in the caller)");
      failure_.latch(std::make_exception_ptr(IoError(message)), rank_, message);
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
  // Spinning pays only while the peer runs meanwhile on another core. Where it does not (more
  // ranks or threads than cores), a spin holds the core the peer needs: waits whose spins keep
  // missing block at once, and try a spin again now and then.
  const bool spin = spinMisses_ < kMaxSpinMisses || ++waitsWithoutSpin_ % kSpinRetryEvery == 0;
  bool spun = false;  // a poll of this wait found nothing, so it waited by spinning
  while (!request.done_) {
    if (failure_) {
      lock.unlock();
      publishRecord();
      lock.lock();
      std::rethrow_exception(failure_.error());
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
      failure_.latch(std::make_exception_ptr(TimeoutError(message)), request.peer_, message);
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
    // Polling first: a small reply usually arrives within microseconds, sooner than the kernel
    // wakes a thread that blocked in epoll_wait (measured: 8-byte allreduce 50 -> 12 us).
    const WaitPhase phase = spin ? kWaitSchedule.phase(now - start) : WaitPhase::kBlock;
    lock.unlock();
    const int ms = phase == WaitPhase::kBlock ? net::pollMillis(until) : 0;
    const int n = ::epoll_wait(epollFd_, events, 16, ms);
    const int err = errno;
    if (n == 0 && phase == WaitPhase::kYield) sched_yield();
    lock.lock();
    if (n == 0 && phase != WaitPhase::kBlock) spun = true;
    driving_ = false;
    if (n < 0 && err != EINTR) {
      const std::string message = str("tcp: epoll_wait on rank ", rank_, ": ", errnoText(err));
      failure_.latch(std::make_exception_ptr(IoError(message)), rank_, message);
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
  if (spun) spinMisses_ = Clock::now() - start < kWaitSchedule.yieldFor ? 0 : spinMisses_ + 1;
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
    failure_.latch(std::make_exception_ptr(IoError(message)), peer, message);
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
  if (TcpRequest** oldest = p.matcher.oldestPosted(p.frame.tag)) {
    if ((*oldest)->bytes_ != p.frame.bytes) {
      const std::string message = sizeMismatchMessage("tcp", who(peer), p.frame.bytes, p.frame.tag,
                                                      rank_, (*oldest)->bytes_);
      failure_.latch(std::make_exception_ptr(MismatchError(message)), rank_, message);
      return false;
    }
    p.target = p.matcher.takePosted(p.frame.tag);
    return true;
  }
  if (p.frame.bytes > 0 && unexpectedBytes_ + p.frame.bytes > kMaxUnexpectedBytes) return false;
  auto message = std::make_shared<Unexpected>();
  message->data.resize(p.frame.bytes);
  unexpectedBytes_ += p.frame.bytes;
  p.matcher.addArrived(p.frame.tag, message);
  p.unexpected = message;
  return true;
}

void TcpTransport::finishFrame(int peer) {
  Peer& p = peers_[size_t(peer)];
  p.inFrame = false;
  if (p.frame.type == TcpFrameHeader::Type::Abort) {
    const int culprit = p.frame.tag < uint64_t(size_) ? int(p.frame.tag) : peer;
    const std::string message = str(p.abortText, " (seen by rank ", rank_, ")");
    failure_.latch(std::make_exception_ptr(PeerAbortedError(culprit, message)), culprit, message);
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
  const TcpRequest* stranded = nullptr;
  if (!p.sends.empty())
    stranded = p.sends.front();
  else if (const auto* posted = p.matcher.anyPosted())
    stranded = *posted;
  if (!stranded) return;
  const std::string message = str(who(peer), " closed its transport before the ",
                                  stranded->describe(), " on rank ", rank_, " completed");
  failure_.latch(std::make_exception_ptr(PeerAbortedError(peer, message)), peer, message);
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

void TcpTransport::tellPeersLocked(int culprit, const std::string& message) {
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
    return bool(failure_);
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
    failure_.latch(std::make_exception_ptr(PeerAbortedError(culprit, message)), culprit, message);
  }
  publishRecord();
}

void TcpTransport::probeRecord() {
  int culprit = -1;
  std::string message;
  if (!readAbortRecord(culprit, message)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  message += str(" (seen by rank ", rank_, ")");
  failure_.latch(std::make_exception_ptr(PeerAbortedError(culprit, message)), culprit, message);
}

void TcpTransport::wakeDriver() {
  if (wakeFd_ < 0) return;
  const uint64_t one = 1;
  [[maybe_unused]] auto ignored = ::write(wakeFd_, &one, sizeof one);
}

}  // namespace tcp
}  // namespace hetra::comm
