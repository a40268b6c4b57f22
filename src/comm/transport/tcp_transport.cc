// TCP transport: one Gloo tcp::Device (its own event-loop thread) and two Gloo contexts, each a
// full mesh of pairs connected through our Store: one carries messages from lower to higher ranks,
// the other the reverse (see contextFor). isend/irecv post Gloo unbound-buffer operations; the tag
// is Gloo's slot, so messages with one tag from one rank to another arrive in the order sent.
//
// Failure model: the first fault a rank sees (a timeout, a peer's connection dropping, abort()) is
// latched. The rank then (1) publishes an abort record "<culprit rank>\n<message>" under kAbortKey
// in the group's store (the first record wins), (2) wakes every local waiter, and (3) closes all
// its pairs. Closing makes every peer that waits on this rank fail at once; those peers find the
// record and report the original cause and culprit instead of "rank X disconnected", then close
// their own pairs in turn. A watchdog covers what Gloo does not signal (a queued send to a dead
// peer, a failure elsewhere in the group while this rank waits on a live peer). A dead group
// therefore fails everywhere within about a second, not at the deadline.
#include "comm/transport/tcp_transport.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "comm/transport/gloo_store.h"
#include "common/errors.h"
#include "common/logging.h"

namespace hetra::comm {
namespace {

constexpr const char* kAbortKey = "<abort>";
// A peer that fails closes its connections (Gloo does it first on a timeout) and then publishes its
// abort record; a rank that sees the connection drop waits this long for the record to appear.
constexpr Millis kRecordGrace{500};
// How long a request waits before the watchdog checks the pairs and the abort record.
constexpr Millis kProbeInterval{200};
// Never used by callers (user tags are below 2^63 + 2^32): the sentinel receives that detect a
// dropped connection.
constexpr uint64_t kSentinelTag = ~uint64_t(0);
// Gloo converts a wait timeout to an absolute time; far-away deadlines would overflow it.
constexpr Millis kMaxWait{24 * 3600 * 1000};

std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// Gloo writes with writev, so a peer that died would kill this process with SIGPIPE instead of
// failing the write with EPIPE. Ignore it, unless the application installed its own handler.
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

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

// Gloo reports I/O failures as IoException with a message only; these are the ones that mean the
// connection to the pair's peer is gone.
bool isDisconnect(const std::string& message) {
  return contains(message, "closed") || contains(message, "reset") ||
         contains(message, "Broken pipe") || contains(message, "Read error") ||
         contains(message, "writev");
}

class TcpTransport;

class TcpRequest final : public Request {
 public:
  TcpRequest(TcpTransport& transport, bool isSend, int peer, uint64_t tag, size_t bytes)
      : transport_(transport), isSend_(isSend), peer_(peer), tag_(tag), bytes_(bytes) {}
  ~TcpRequest() override;

  void start(void* data);
  void wait(Deadline deadline) override;
  // Wakes a thread blocked in wait(); called by the transport with its mutex held.
  void interrupt() {
    if (!buffer_) return;
    if (isSend_)
      buffer_->abortWaitSend();
    else
      buffer_->abortWaitRecv();
  }
  std::string describe() const;

 private:
  TcpTransport& transport_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  const bool isSend_;
  const int peer_;
  const uint64_t tag_;
  const size_t bytes_;
  bool done_ = false;
  // Gloo's read path is not written for empty payloads: a 0-byte transfer moves one dummy byte.
  uint8_t dummy_ = 0;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(std::shared_ptr<store::Store> store, int rank, int size,
               std::vector<std::string> hosts)
      : store_(std::move(store)), rank_(rank), size_(size), hosts_(std::move(hosts)) {}

  ~TcpTransport() override {
    if (watchdog_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
      }
      wake_.notify_all();
      watchdog_.join();
    }
    // Gloo buffers before their pairs, pairs (they unregister from the device's loop) before the
    // device (which joins the loop).
    sentinels_.clear();
    for (auto& context : contexts_) context.reset();
    device_.reset();
  }

  void connect(const TcpOptions& options, Deadline deadline);

  const char* name() const override { return "tcp"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    return post(true, peer, tag, const_cast<void*>(data), bytes);
  }
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    return post(false, peer, tag, data, bytes);
  }

  void abort(const std::string& reason) override {
    const std::string message = str(who(rank_), " aborted the group: ", reason);
    fail(std::make_exception_ptr(PeerAbortedError(rank_, message)), rank_, message);
  }

  uint64_t bytesSent() const override { return sent_.load(std::memory_order_relaxed); }
  uint64_t bytesReceived() const override { return received_.load(std::memory_order_relaxed); }

  // --- used by TcpRequest ---
  // Messages from lower to higher ranks use one mesh and the others a second one, so that a pair
  // (one socket, one lock in Gloo) carries data one way only: a long write of ours on a pair never
  // holds up Gloo's event loop reading what the same peer sends us.
  gloo::Context& contextFor(int from, int to) { return *contexts_[from < to ? 0 : 1]; }
  std::string who(int peer) const { return str("rank ", peer, " (", hosts_[peer], ")"); }
  void countDone(bool isSend, size_t bytes) {
    (isSend ? sent_ : received_).fetch_add(bytes, std::memory_order_relaxed);
  }
  void track(TcpRequest* request) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.insert(request);
  }
  void untrack(TcpRequest* request) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.erase(request);
  }
  void waiting(int delta) {
    std::lock_guard<std::mutex> lock(mutex_);
    waiters_ += delta;
    if (waiters_ > 0 && waitersSince_ == Clock::time_point{}) waitersSince_ = Clock::now();
    if (waiters_ == 0) waitersSince_ = Clock::time_point{};
  }
  std::exception_ptr failure() {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }
  [[noreturn]] void rethrowFailure() {
    auto error = failure();
    HETRA_ENFORCE(error != nullptr, "tcp: a wait was interrupted but the transport has not failed");
    std::rethrow_exception(error);
  }

  // Turns a Gloo error seen by `request` (talking to `peer`) into our typed error, fails the
  // transport with it and throws it. If the transport already failed, throws that first failure.
  [[noreturn]] void glooFailed(const std::string& glooMessage, int peer, const TcpRequest& request,
                               Millis waited, Deadline deadline);

  // Latches `error` as the transport's failure (first call wins), publishes the abort record, wakes
  // local waiters and closes every pair. Returns the latched failure.
  std::exception_ptr fail(std::exception_ptr error, int culprit, const std::string& message);

 private:
  std::unique_ptr<Request> post(bool isSend, int peer, uint64_t tag, void* data, size_t bytes);
  // Reads the group's abort record; false when there is none (or the store cannot be reached).
  bool readAbortRecord(int& culprit, std::string& message);
  // The connection to `peer` dropped: fails the transport, blaming the culprit of the abort record
  // if one appears within the grace period, else `peer`.
  std::exception_ptr disconnected(int peer, const std::string& glooMessage,
                                  const std::string& during, Deadline deadline);
  void watch();
  void probe();

  std::shared_ptr<store::Store> store_;
  const int rank_;
  const int size_;
  const std::vector<std::string> hosts_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> contexts_[2];
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> received_{0};
  // One receive per pair on kSentinelTag, never matched: Gloo signals it when the pair fails.
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sentinels_;
  std::vector<int> sentinelPeers_;
  uint8_t sentinelBytes_[1] = {};
  std::thread watchdog_;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::set<TcpRequest*> live_;
  int waiters_ = 0;
  Clock::time_point waitersSince_{};
};

// --- TcpRequest ---

std::string TcpRequest::describe() const {
  return str(isSend_ ? "send of " : "receive of ", bytes_, " bytes ", isSend_ ? "to " : "from ",
             transport_.who(peer_), " (tag ", tag_, ")");
}

void TcpRequest::start(void* data) {
  void* ptr = bytes_ == 0 ? &dummy_ : data;
  const size_t size = bytes_ == 0 ? 1 : bytes_;
  const int self = transport_.rank();
  try {
    buffer_ = transport_.contextFor(isSend_ ? self : peer_, isSend_ ? peer_ : self)
                  .createUnboundBuffer(ptr, size);
  } catch (const std::exception& e) {
    done_ = true;
    transport_.glooFailed(e.what(), peer_, *this, Millis(0), deadlineAfter(kRecordGrace));
  }
  transport_.track(this);  // from here on, a failure on another thread can interrupt this request
  try {
    if (auto error = transport_.failure()) std::rethrow_exception(error);
    if (isSend_)
      buffer_->send(peer_, tag_, 0, size);
    else
      buffer_->recv(peer_, tag_, 0, size);
  } catch (const Error&) {
    done_ = true;  // nothing is pending in Gloo for this request
    throw;
  } catch (const std::exception& e) {
    done_ = true;
    transport_.glooFailed(e.what(), peer_, *this, Millis(0), deadlineAfter(kRecordGrace));
  }
}

TcpRequest::~TcpRequest() {
  transport_.untrack(this);
  if (!done_ && buffer_ && !transport_.failure()) {
    // Gloo still holds this operation; data arriving for it later would stall the pair. The group
    // cannot continue consistently, so fail it rather than let it hang.
    const std::string message = str("rank ", transport_.rank(), " abandoned a pending ", describe(),
                                    " (a bug in the caller)");
    transport_.fail(std::make_exception_ptr(IoError(message)), transport_.rank(), message);
  }
}

void TcpRequest::wait(Deadline deadline) {
  if (done_) return;
  if (auto error = transport_.failure()) std::rethrow_exception(error);
  const Millis left = std::min(remaining(deadline), kMaxWait);
  bool completed = false;
  transport_.waiting(+1);
  try {
    completed = isSend_ ? buffer_->waitSend(left) : buffer_->waitRecv(left);
  } catch (const std::exception& e) {
    transport_.waiting(-1);
    transport_.glooFailed(e.what(), peer_, *this, left, deadline);
  }
  transport_.waiting(-1);
  if (!completed) transport_.rethrowFailure();  // interrupted by a failure
  done_ = true;
  transport_.countDone(isSend_, bytes_);
}

// --- TcpTransport ---

std::unique_ptr<Request> TcpTransport::post(bool isSend, int peer, uint64_t tag, void* data,
                                            size_t bytes) {
  HETRA_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "tcp: peer ", peer,
                " is not another rank of this group of ", size_, " (this is rank ", rank_, ")");
  HETRA_ENFORCE(data != nullptr || bytes == 0, "tcp: null buffer for ", bytes, " bytes");
  HETRA_ENFORCE_NE(tag, kSentinelTag, "tcp: tag ", tag, " is reserved by the transport");
  if (auto error = failure()) std::rethrow_exception(error);
  auto request = std::make_unique<TcpRequest>(*this, isSend, peer, tag, bytes);
  request->start(data);
  return request;
}

bool TcpTransport::readAbortRecord(int& culprit, std::string& message) {
  try {
    if (!store_->check({kAbortKey})) return false;
    const std::string record = store_->getString(kAbortKey, Millis(1000));
    const size_t newline = record.find('\n');
    if (newline == std::string::npos) return false;
    culprit = std::stoi(record.substr(0, newline));
    message = record.substr(newline + 1);
    return true;
  } catch (const std::exception&) {
    return false;  // the store may have died with the rank that hosted it
  }
}

std::exception_ptr TcpTransport::fail(std::exception_ptr error, int culprit,
                                      const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return failure_;
    failure_ = error;
  }
  HETRA_DEBUG("comm", "tcp: group failed: ", message);
  try {
    const std::string record = str(culprit, "\n", message);
    store_->compareSet(kAbortKey, {}, store::Bytes(record.begin(), record.end()));
  } catch (const std::exception& e) {
    HETRA_WARN("comm", "tcp: could not publish the abort record: ", e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (TcpRequest* request : live_) request->interrupt();
  }
  // Peers blocked on this rank see the connection reset and fail now rather than at their deadline.
  for (auto& context : contexts_)
    if (context) context->closeConnections();
  return error;
}

std::exception_ptr TcpTransport::disconnected(int peer, const std::string& glooMessage,
                                              const std::string& during, Deadline deadline) {
  int culprit = peer;
  std::string message;
  const Deadline graceEnd = std::min(deadline, deadlineAfter(kRecordGrace));
  bool found = readAbortRecord(culprit, message);
  while (!found && Clock::now() < graceEnd && !failure()) {
    std::this_thread::sleep_for(Millis(5));
    found = readAbortRecord(culprit, message);
  }
  if (auto error = failure()) return error;
  if (found) {
    message += str(" (seen by rank ", rank_, ")");
  } else {
    culprit = peer;
    message = str(who(peer), " disconnected: ", glooMessage, " (seen by rank ", rank_, during, ")");
  }
  return fail(std::make_exception_ptr(PeerAbortedError(culprit, message)), culprit, message);
}

void TcpTransport::glooFailed(const std::string& glooMessage, int peer, const TcpRequest& request,
                              Millis waited, Deadline deadline) {
  if (auto error = failure()) std::rethrow_exception(error);
  std::exception_ptr error;
  if (contains(glooMessage, "Timed out waiting") || contains(glooMessage, "Application timeout")) {
    const std::string message = str("tcp: rank ", rank_, " timed out after ", waited.count(),
                                    " ms waiting for the ", request.describe());
    error = fail(std::make_exception_ptr(TimeoutError(message)), peer, message);
  } else if (isDisconnect(glooMessage)) {
    error = disconnected(peer, glooMessage, str(" during the ", request.describe()), deadline);
  } else {
    const std::string message =
        str("tcp: ", request.describe(), " failed on rank ", rank_, ": ", glooMessage);
    error = fail(std::make_exception_ptr(IoError(message)), peer, message);
  }
  std::rethrow_exception(error);
}

// While some request has been waiting for a while, checks that the wait can still end: Gloo does
// not signal an unbound send still queued for a pair whose connection dropped, and a peer that
// failed on another link publishes its abort record without touching ours.
void TcpTransport::watch() {
  log::setRank(rank_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kProbeInterval);
    if (stopping_ || failure_ || waiters_ == 0 || Clock::now() - waitersSince_ < kProbeInterval)
      continue;
    lock.unlock();
    probe();
    lock.lock();
  }
}

void TcpTransport::probe() {
  for (size_t i = 0; i < sentinels_.size(); ++i) {
    try {
      // The abort flag makes the wait return at once, unless the pair failed: then it throws.
      sentinels_[i]->abortWaitRecv();
      sentinels_[i]->waitRecv(kMaxWait);
    } catch (const std::exception& e) {
      disconnected(sentinelPeers_[i], e.what(), "", deadlineAfter(kRecordGrace));
      return;
    }
  }
  int culprit = -1;
  std::string message;
  if (readAbortRecord(culprit, message)) {
    message += str(" (seen by rank ", rank_, ")");
    fail(std::make_exception_ptr(PeerAbortedError(culprit, message)), culprit, message);
  }
}

void TcpTransport::connect(const TcpOptions& options, Deadline deadline) {
  gloo::transport::tcp::attr attr;
  attr.hostname = options.listenAddress;
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw IoError(str("tcp transport: cannot listen on '", options.listenAddress, "' (rank ", rank_,
                      "): ", e.what()));
  }
  for (int i = 0; i < 2; ++i) {
    auto& context = contexts_[i];
    context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    // Gloo waits up to 5x its timeout for a pair to connect; keep that within our deadline.
    context->setTimeout(std::max(Millis(100), remaining(deadline) / 5));
    GlooStore glooStore(std::make_shared<store::PrefixStore>(str("gloo", i), store_), deadline);
    try {
      context->connectFullMesh(glooStore, device_);
    } catch (const TimeoutError& e) {
      throw TimeoutError(str("tcp transport: rank ", rank_,
                             " timed out connecting to its peers after ", options.timeout.count(),
                             " ms: ", e.what()));
    } catch (const gloo::IoException& e) {
      const std::string message = e.what();
      const std::string text =
          str("tcp transport: rank ", rank_, " could not connect to its peers: ", message);
      if (contains(message, "timeout") || contains(message, "Timed out")) throw TimeoutError(text);
      throw IoError(text);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw IoError(
          str("tcp transport: rank ", rank_, " could not connect to its peers: ", e.what()));
    }
    context->setTimeout(options.timeout);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      sentinels_.push_back(context->createUnboundBuffer(sentinelBytes_, sizeof sentinelBytes_));
      sentinels_.back()->recv(peer, kSentinelTag, 0, sizeof sentinelBytes_);
      sentinelPeers_.push_back(peer);
    }
  }
  watchdog_ = std::thread([this] { watch(); });
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
  // Join first: a missing rank is named here instead of surfacing as an anonymous Gloo timeout.
  store->setString(str("join/", rank), hostName());
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(str("join/", r));
  try {
    store->wait(keys, remaining(deadline));
  } catch (const TimeoutError&) {
    std::string missing;
    int count = 0;
    for (int r = 0; r < size; ++r) {
      if (store->check({keys[r]})) continue;
      missing += str(count++ ? ", " : "", r);
    }
    throw TimeoutError(str("tcp transport: rank", count > 1 ? "s " : " ", missing,
                           " of a group of ", size, " did not join within ",
                           options.timeout.count(), " ms (this is rank ", rank, ")"));
  }
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r) hosts.push_back(store->getString(keys[r], remaining(deadline)));

  auto transport = std::make_unique<TcpTransport>(store, rank, size, std::move(hosts));
  if (size > 1) transport->connect(options, deadline);
  return transport;
}

}  // namespace hetra::comm
