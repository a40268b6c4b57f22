// MPI transport: hetra's point-to-point messages over an MPI communicator (Open MPI).
//
// Vocabulary:
//   communicator - the group's MPI communicator: MPI_Comm_create_group over the MPI world ranks of
//                  the group's ranks in hetra rank order, so its MPI rank is the hetra rank. It is
//                  collective over the group only (MPI_Comm_split would be collective over
//                  MPI_COMM_WORLD, which a hetra sub-group cannot promise).
//   envelope     - a small MPI message on the reserved MPI tag 0 announcing one hetra message: its
//                  type (data, abort, close), group id, hetra tag, size and first data sequence
//                  number. A message of at most kInlineBytes travels inside its envelope.
//   inbox        - per peer, the one posted MPI receive for that peer's next envelope.
//   data chunk   - the payload of a larger message, cut into chunks of at most kChunkBytes (MPI
//                  counts are int); each chunk has its own sequence number.
//   seq          - per ordered pair of ranks, the sender numbers its data chunks 0, 1, 2, ...;
//   chunk
//                  seq travels on MPI tag 1 + (base + seq) mod tagUb, where base is derived from
//                  the group id and the pair.
//
// Tags. Hetra tags are 64-bit; MPI tags are int and MPI_TAG_UB may be as low as 32767, so hetra
// tags cannot be MPI tags. Envelopes carry them instead: MPI does not let messages of one source,
// tag and communicator overtake each other, so a peer's envelopes arrive in send order, and the
// k-th receive posted for (peer, tag) takes the k-th envelope of that tag (per-tag FIFO, the
// Transport contract). Only then does the receiver post MPI receives for the envelope's data
// chunks, straight into the caller's buffer: we never copy a payload; MPI keeps an early data chunk
// (eager) or leaves it at the sender until the receive is posted (rendezvous). A chunk's MPI tag is
// unique among the chunks in flight between a pair while fewer than tagUb of them are outstanding,
// which the receiver checks before posting (Open MPI's tagUb is 2^31-1). Messages that arrive
// before their receive is posted cost one envelope each (at most kEnvelopeBytes; inline payloads
// are copied once).
//
// Freeing a communicator. A message sent to a communicator its receiver already freed can reach a
// later communicator that reuses the context id (Open MPI 4.1.4 crashed in mca_pml_ob1_add_comm on
// exactly that in our tests). So a destroyed transport frees its communicator only once every
// peer's Close arrived (Close is a rank's last message on it): its destructor waits kCloseWait for
// them, then parks the communicator, and the next createMpiTransport frees parked ones whose peers
// all closed. A failed group's communicator is never freed (its peers may still send). As a second
// line, envelopes carry the group id (random, from the store) and foreign ones are dropped, and
// the per-pair base of the data tags keeps stale chunks away from a new group's tags.
//
// Progress. MPI progresses only inside MPI calls. Request::wait polls (MPI_Test) the inboxes and
// its own MPI requests until done or its deadline: it spins, then yields, then sleeps in short
// slices. It never calls MPI_Wait, which has no deadline. One mutex guards the transport's state
// and its MPI calls; MPI itself runs at MPI_THREAD_MULTIPLE so several groups progress
// independently.
//
// Failure model (as tcp). The first fault a rank sees (a timeout, a mismatched size, an MPI error,
// abort(), a request destroyed while pending) is latched (failure_latch.h): the rank sends an
// Abort envelope (culprit and reason) to every peer and wakes its local waiters; a peer that
// reads it fails with the original culprit and forwards it. A rank that destroys its transport
// cleanly sends Close, so a peer's receive that can no longer be matched fails with
// PeerAbortedError naming it. MPI errors are returned (MPI_ERRORS_RETURN on our communicators) and
// become PeerAbortedError naming the peer of the failed request, or IoError when no peer is
// involved. We never call MPI_Abort: it ends every process of the MPI job, not only this group; it
// remains the application's last resort. Open MPI without ULFM cannot survive a dead process:
// mpirun ends the job, so that case never reaches us.
#include "comm/transport/mpi_transport.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/transport/failure_latch.h"
#include "comm/transport/group_join.h"
#include "comm/transport/mpi_runtime.h"
#include "comm/transport/peer_request.h"
#include "comm/transport/peer_transport.h"
#include "comm/transport/tag_matcher.h"
#include "comm/transport/wait_schedule.h"
#include "common/bytes.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/net.h"

namespace hetra::comm {

using namespace mpi;

namespace {

// A send to a peer that closed its transport fails if it has not completed this long after the
// Close arrived (the data may still be draining when the Close overtakes the local completion).
constexpr Millis kCloseGrace{500};
// How long a destructor waits for its peers' Close before leaving its communicator to the reaper.
constexpr Millis kCloseWait{50};
// Poll schedule of a wait: spin, then yield the core, then sleep in slices.
constexpr WaitSchedule kWaitSchedule{std::chrono::microseconds(50), std::chrono::milliseconds(20)};
constexpr auto kSleepSlice = std::chrono::microseconds(100);

class MpiTransport;

class MpiRequest final : public PeerRequest<MpiRequest, MpiTransport> {
 public:
  using PeerRequest::PeerRequest;
  ~MpiRequest() override;

 private:
  friend class MpiTransport;
  // Guarded by the transport's mutex.
  std::vector<MPI_Request> mpi_;    // sends: envelope then data chunks; receives: data chunks
  std::vector<size_t> chunkBytes_;  // receives: the expected size of each data chunk
  std::vector<uint8_t> envelope_;   // sends: the envelope, alive until its MPI send completes
  bool matched_ = false;            // its MPI requests are posted (sends: at once)
  bool queued_ = false;             // a receive waiting for its envelope
  bool done_ = false;
};

// An envelope that arrived before its receive was posted.
struct Arrived {
  uint64_t seq = 0;
  uint64_t bytes = 0;
  bool inlined = false;
  std::vector<uint8_t> payload;  // inline payloads only
};

struct Peer {
  std::vector<uint8_t> inbox;
  MPI_Request inboxRequest = MPI_REQUEST_NULL;
  uint64_t sendSeq = 0;  // next data chunk to this peer
  uint64_t sendBase = 0;
  uint64_t recvBase = 0;
  TagMatcher<MpiRequest*, Arrived> matcher;
  std::set<uint64_t> pendingSeqs;  // first seq of arrived data envelopes not yet received
  bool closed = false;
  Clock::time_point closedAt;
};

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

class MpiTransport final : public PeerTransport {
 public:
  MpiTransport(MPI_Comm comm, int rank, int size, uint64_t group, std::vector<std::string> hosts)
      : PeerTransport("mpi", rank, size, std::move(hosts)),
        comm_(comm),
        group_(group),
        tagRange_(uint64_t(tagUpperBound())),
        peers_(size_t(size)) {
    for (int peer = 0; peer < size_; ++peer) {
      Peer& p = peers_[size_t(peer)];
      p.sendBase = pairBase(rank_, peer);
      p.recvBase = pairBase(peer, rank_);
    }
  }
  ~MpiTransport() override;

  // Posts the inboxes; the caller then hands the transport out.
  void start();

  const char* name() const override { return "mpi"; }
  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  std::unique_ptr<Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) override;

  // --- used by MpiRequest ---
  void wait(MpiRequest& request, Deadline deadline);
  void release(MpiRequest& request);

 private:
  uint64_t pairBase(int from, int to) const {
    return mix(group_ ^ mix(uint64_t(from) << 32 | uint64_t(uint32_t(to))));
  }
  int dataTag(uint64_t base, uint64_t seq) const { return int(1 + (base + seq) % tagRange_); }
  static size_t chunksOf(size_t bytes) { return (bytes + kChunkBytes - 1) / kChunkBytes; }

  // The caller holds mutex_.
  void postInbox(int peer);
  void pollInboxes();
  void handleEnvelope(int peer, size_t size);
  void match(MpiRequest& request, uint64_t seq, uint64_t bytes, const uint8_t* inlinePayload);
  void test(MpiRequest& request);
  void complete(MpiRequest& request);
  void checkClosed(int peer);
  void sendOrphan(int peer, const Envelope& envelope, const std::string& payload);
  void testOrphans();
  // failure_'s notify: an Abort envelope (culprit, message) to every peer.
  void tellPeersLocked(int culprit, const std::string& message) override;
  // An MPI call failed: PeerAbortedError naming `peer`, or IoError when peer < 0.
  std::exception_ptr failMpi(int peer, int code, const std::string& what);

  MPI_Comm comm_;
  const uint64_t group_;
  const uint64_t tagRange_;

  std::vector<Peer> peers_;
  std::vector<Orphan> orphans_;
  std::optional<Deadline> releaseUntil_;  // the shared grace for abandoned MPI requests
  bool closing_ = false;                  // Close was sent (or the group failed): send nothing more
};

// --- MpiRequest ---

MpiRequest::~MpiRequest() {
  transport_.release(*this);
}

// --- MpiTransport ---

void MpiTransport::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    peers_[size_t(peer)].inbox.resize(kEnvelopeBytes);
    postInbox(peer);
    failure_.rethrowIfFailed();
  }
}

void MpiTransport::postInbox(int peer) {
  Peer& p = peers_[size_t(peer)];
  const int rc = MPI_Irecv(p.inbox.data(), int(kEnvelopeBytes), MPI_BYTE, peer, kEnvelopeTag, comm_,
                           &p.inboxRequest);
  if (rc != MPI_SUCCESS) failMpi(peer, rc, str("posting the envelope receive from ", who(peer)));
}

std::unique_ptr<Request> MpiTransport::isend(int peer, uint64_t tag, const void* data,
                                             size_t bytes) {
  auto request = MpiRequest::send(*this, peer, tag, data, bytes);
  auto lock = lockUnlessFailed();
  Peer& p = peers_[size_t(peer)];
  Envelope e;
  e.type = EnvelopeType::Data;
  e.group = group_;
  e.tag = tag;
  e.bytes = bytes;
  const bool inlined = isInline(e);
  if (!inlined) {
    e.seq = p.sendSeq;
    p.sendSeq += chunksOf(bytes);
  }
  request->envelope_ = encodeEnvelope(e, data);
  request->matched_ = true;
  MPI_Request mpi = MPI_REQUEST_NULL;
  int rc = MPI_Isend(request->envelope_.data(), int(request->envelope_.size()), MPI_BYTE, peer,
                     kEnvelopeTag, comm_, &mpi);
  if (rc != MPI_SUCCESS)
    std::rethrow_exception(failMpi(peer, rc, str("starting the ", request->describe())));
  request->mpi_.push_back(mpi);
  for (size_t offset = 0, chunk = 0; !inlined && offset < bytes; offset += kChunkBytes, ++chunk) {
    const size_t length = std::min(kChunkBytes, bytes - offset);
    rc = MPI_Isend(request->data_ + offset, int(length), MPI_BYTE, peer,
                   dataTag(p.sendBase, e.seq + chunk), comm_, &mpi);
    if (rc != MPI_SUCCESS)
      std::rethrow_exception(failMpi(peer, rc, str("starting the ", request->describe())));
    request->mpi_.push_back(mpi);
  }
  return request;
}

std::unique_ptr<Request> MpiTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  auto request = MpiRequest::receive(*this, peer, tag, data, bytes);
  auto lock = lockUnlessFailed();
  Peer& p = peers_[size_t(peer)];
  if (p.matcher.oldestArrived(tag)) {
    // The oldest envelope of this tag arrived first: it is this receive's.
    Arrived message = p.matcher.takeArrived(tag);
    if (!message.inlined) p.pendingSeqs.erase(message.seq);
    match(*request, message.seq, message.bytes, message.inlined ? message.payload.data() : nullptr);
  } else {
    p.matcher.post(tag, request.get());
    request->queued_ = true;
    checkClosed(peer);
  }
  failure_.rethrowIfFailed();
  return request;
}

void MpiTransport::match(MpiRequest& request, uint64_t seq, uint64_t bytes,
                         const uint8_t* inlinePayload) {
  const int peer = request.peer_;
  if (bytes != request.bytes_) {
    const std::string message =
        sizeMismatchMessage("mpi", who(peer), bytes, request.tag_, rank_, request.bytes_);
    failure_.latch(std::make_exception_ptr(MismatchError(message)), rank_, message);
    return;
  }
  request.matched_ = true;
  if (bytes <= kInlineBytes) {
    if (bytes) std::memcpy(request.data_, inlinePayload, bytes);
    complete(request);
    return;
  }
  Peer& p = peers_[size_t(peer)];
  const uint64_t last = seq + chunksOf(bytes) - 1;
  // An older chunk not yet received whose tag this message's chunks would repeat.
  if (!p.pendingSeqs.empty() && *p.pendingSeqs.begin() < seq &&
      last - *p.pendingSeqs.begin() >= tagRange_) {
    const std::string message =
        str("mpi: rank ", rank_, " has more than ", tagRange_, " data chunks from ", who(peer),
            " outstanding; their MPI tags would repeat (receive the older messages first)");
    failure_.latch(std::make_exception_ptr(IoError(message)), rank_, message);
    return;
  }
  for (size_t offset = 0, chunk = 0; offset < bytes; offset += kChunkBytes, ++chunk) {
    const size_t length = std::min<size_t>(kChunkBytes, bytes - offset);
    MPI_Request mpi = MPI_REQUEST_NULL;
    const int rc = MPI_Irecv(request.data_ + offset, int(length), MPI_BYTE, peer,
                             dataTag(p.recvBase, seq + chunk), comm_, &mpi);
    if (rc != MPI_SUCCESS) {
      failMpi(peer, rc, str("starting the ", request.describe()));
      return;
    }
    request.mpi_.push_back(mpi);
    request.chunkBytes_.push_back(length);
  }
}

void MpiTransport::complete(MpiRequest& request) {
  request.done_ = true;
  request.queued_ = false;
  countPayload(request.isSend_, request.bytes_);
}

void MpiTransport::test(MpiRequest& request) {
  if (request.done_ || !request.matched_) return;
  int flag = 0;
  std::vector<MPI_Status> statuses(request.mpi_.size());
  const int rc = MPI_Testall(int(request.mpi_.size()), request.mpi_.data(), &flag, statuses.data());
  if (rc != MPI_SUCCESS) {
    int code = rc;
    if (rc == MPI_ERR_IN_STATUS)
      for (const auto& s : statuses)
        if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
          code = s.MPI_ERROR;
          break;
        }
    failMpi(request.peer_, code, request.describe());
    return;
  }
  if (!flag) return;
  for (size_t i = 0; i < request.chunkBytes_.size(); ++i) {
    int count = -1;
    MPI_Get_count(&statuses[i], MPI_BYTE, &count);
    if (count < 0 || size_t(count) != request.chunkBytes_[i]) {
      const std::string message =
          str("mpi: rank ", rank_, " received ", count, " bytes where chunk ", i, " of the ",
              request.describe(), " has ", request.chunkBytes_[i], " (a stray message)");
      failure_.latch(std::make_exception_ptr(IoError(message)), rank_, message);
      return;
    }
  }
  request.mpi_.clear();
  complete(request);
}

void MpiTransport::pollInboxes() {
  for (int peer = 0; peer < size_ && !failure_; ++peer) {
    Peer& p = peers_[size_t(peer)];
    while (p.inboxRequest != MPI_REQUEST_NULL && !failure_) {
      int flag = 0;
      MPI_Status status;
      const int rc = MPI_Test(&p.inboxRequest, &flag, &status);
      if (rc != MPI_SUCCESS) {
        failMpi(peer, rc, str("receiving an envelope from ", who(peer)));
        return;
      }
      if (!flag) break;
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      handleEnvelope(peer, size_t(std::max(count, 0)));
      if (!failure_) postInbox(peer);
    }
  }
  if (!orphans_.empty()) testOrphans();
}

void MpiTransport::handleEnvelope(int peer, size_t size) {
  Peer& p = peers_[size_t(peer)];
  Envelope e;
  const std::string problem = decodeEnvelope(p.inbox.data(), size, e);
  if (!problem.empty()) {
    const std::string message =
        str("mpi: rank ", rank_, " received a malformed envelope from ", who(peer), ": ", problem);
    failure_.latch(std::make_exception_ptr(IoError(message)), peer, message);
    return;
  }
  if (e.group != group_) {
    // Sent to an earlier communicator that had this context id (see the top of the file).
    HETRA_DEBUG("comm", "mpi: rank ", rank_, " dropped an envelope of another group from ",
                who(peer));
    return;
  }
  const uint8_t* payload = p.inbox.data() + kEnvelopeHeaderBytes;
  switch (e.type) {
    case EnvelopeType::Data: {
      if (p.matcher.oldestPosted(e.tag)) {
        MpiRequest& request = *p.matcher.takePosted(e.tag);
        request.queued_ = false;
        match(request, e.seq, e.bytes, payload);
        return;
      }
      Arrived message;
      message.seq = e.seq;
      message.bytes = e.bytes;
      message.inlined = isInline(e);
      if (message.inlined)
        message.payload.assign(payload, payload + e.bytes);
      else
        p.pendingSeqs.insert(e.seq);
      p.matcher.addArrived(e.tag, std::move(message));
      return;
    }
    case EnvelopeType::Abort: {
      const int culprit = e.seq < uint64_t(size_) ? int(e.seq) : peer;
      const std::string message = str(std::string(reinterpret_cast<const char*>(payload), e.bytes),
                                      " (seen by rank ", rank_, ")");
      failure_.latch(std::make_exception_ptr(PeerAbortedError(culprit, message)), culprit, message);
      return;
    }
    case EnvelopeType::Close:
      p.closed = true;
      p.closedAt = Clock::now();
      checkClosed(peer);
      return;
  }
}

// After a peer's Close, no envelope follows: a receive still waiting for one never completes.
void MpiTransport::checkClosed(int peer) {
  Peer& p = peers_[size_t(peer)];
  if (!p.closed || failure_) return;
  const auto* stranded = p.matcher.anyPosted();
  if (!stranded) return;
  const std::string message = str(who(peer), " closed its transport before the ",
                                  (*stranded)->describe(), " on rank ", rank_, " completed");
  failure_.latch(std::make_exception_ptr(PeerAbortedError(peer, message)), peer, message);
}

void MpiTransport::sendOrphan(int peer, const Envelope& envelope, const std::string& payload) {
  Orphan orphan;
  orphan.buffer = encodeEnvelope(envelope, payload.data());
  if (MPI_Isend(orphan.buffer.data(), int(orphan.buffer.size()), MPI_BYTE, peer, kEnvelopeTag,
                comm_, &orphan.request) == MPI_SUCCESS)
    orphans_.push_back(std::move(orphan));
}

void MpiTransport::testOrphans() {
  for (auto& o : orphans_) {
    int flag = 0;
    if (MPI_Test(&o.request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      o.request = MPI_REQUEST_NULL;  // the peer is gone; nothing else to do with this message
  }
  orphans_.erase(std::remove_if(orphans_.begin(), orphans_.end(),
                                [](const Orphan& o) { return o.request == MPI_REQUEST_NULL; }),
                 orphans_.end());
}

void MpiTransport::tellPeersLocked(int culprit, const std::string& message) {
  Envelope e;
  e.type = EnvelopeType::Abort;
  e.group = group_;
  e.seq = uint64_t(culprit);
  const std::string reason = message.substr(0, kInlineBytes);
  e.bytes = reason.size();
  for (int peer = 0; peer < size_ && !closing_; ++peer)
    if (peer != rank_) sendOrphan(peer, e, reason);
}

std::exception_ptr MpiTransport::failMpi(int peer, int code, const std::string& what) {
  const std::string message =
      str("mpi: ", what, " failed on rank ", rank_, ": ", mpiErrorText(code));
  if (peer >= 0)
    return failure_.latch(std::make_exception_ptr(PeerAbortedError(peer, message)), peer, message);
  return failure_.latch(std::make_exception_ptr(IoError(message)), rank_, message);
}

void MpiTransport::wait(MpiRequest& request, Deadline deadline) {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (!request.done_ && !failure_) {
      pollInboxes();
      if (!failure_) test(request);
    }
    if (request.done_) return;
    failure_.rethrowIfFailed();
    const auto now = Clock::now();
    const Peer& p = peers_[size_t(request.peer_)];
    if (request.isSend_ && p.closed && now - p.closedAt >= kCloseGrace) {
      const std::string message = str(who(request.peer_), " closed its transport before the ",
                                      request.describe(), " on rank ", rank_, " completed");
      std::rethrow_exception(
          failure_.latch(std::make_exception_ptr(PeerAbortedError(request.peer_, message)),
                         request.peer_, message));
    }
    if (now >= deadline) {
      const auto waited = std::chrono::duration_cast<Millis>(now - start);
      const std::string message = str("mpi: rank ", rank_, " timed out after ", waited.count(),
                                      " ms waiting for the ", request.describe());
      std::rethrow_exception(
          failure_.latch(std::make_exception_ptr(TimeoutError(message)), request.peer_, message));
    }
    lock.unlock();
    // MPI has no blocking wait with a deadline: "blocking" is sleeping in slices.
    switch (kWaitSchedule.phase(now - start)) {
      case WaitPhase::kBlock:
        std::this_thread::sleep_for(std::min<Clock::duration>(kSleepSlice, deadline - now));
        break;
      case WaitPhase::kYield:
        sched_yield();
        break;
      case WaitPhase::kSpin:
        break;
    }
    lock.lock();
  }
}

void MpiTransport::release(MpiRequest& request) {
  std::unique_lock<std::mutex> lock(mutex_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // MPI released everything already
  // A send the caller did not wait for may have completed meanwhile.
  if (!request.done_ && request.isSend_ && !failure_) test(request);
  if (request.done_) return;
  Peer& p = peers_[size_t(request.peer_)];
  if (request.queued_) {
    p.matcher.cancel(request.tag_, &request);
    request.queued_ = false;
  }
  if (!failure_) {
    // The peer will send this message (or expects it): the group cannot continue consistently.
    const std::string message =
        str("rank ", rank_, " abandoned a pending ", request.describe(), " (a bug in the caller)");
    failure_.latch(std::make_exception_ptr(IoError(message)), rank_, message);
  }
  if (request.mpi_.empty()) return;
  // MPI may still write into (or read from) the caller's buffer: cancel what can be cancelled
  // (receives) and wait a little for the rest (a send completes once the peer has received it).
  if (!request.isSend_)
    for (auto& mpi : request.mpi_)
      if (mpi != MPI_REQUEST_NULL) MPI_Cancel(&mpi);
  if (!releaseUntil_) releaseUntil_ = deadlineAfter(kReleaseGrace);
  for (;;) {
    int flag = 0;
    MPI_Testall(int(request.mpi_.size()), request.mpi_.data(), &flag, MPI_STATUSES_IGNORE);
    if (flag) return;
    if (Clock::now() >= *releaseUntil_) break;
    lock.unlock();
    sched_yield();
    lock.lock();
  }
  HETRA_WARN("comm", "mpi: rank ", rank_, " freed the still pending ", request.describe(),
             " after the group failed");
  for (auto& mpi : request.mpi_)
    if (mpi != MPI_REQUEST_NULL) MPI_Request_free(&mpi);
  if (!request.envelope_.empty()) leak(std::move(request.envelope_));
}

MpiTransport::~MpiTransport() {
  std::unique_lock<std::mutex> lock(mutex_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // MPI released everything already
  const bool clean = !failure_;
  if (clean) {
    // The end of this rank's messages is no fault: peers that still wait for one fail at once.
    Envelope e;
    e.type = EnvelopeType::Close;
    e.group = group_;
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_) sendOrphan(peer, e, "");
  }
  // Nothing may be sent after Close (a peer frees its communicator once every Close arrived).
  closing_ = true;
  auto allClosed = [&] {
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_ && !peers_[size_t(peer)].closed) return false;
    return true;
  };
  // Peers that finish at about the same time close within this wait; the others are waited for by
  // the reaper (see Parked), so a destructor never stalls on a slow peer.
  const Deadline until = deadlineAfter(kCloseWait);
  while (clean && !failure_) {
    pollInboxes();
    if ((allClosed() && orphans_.empty()) || Clock::now() >= until) break;
    lock.unlock();
    sched_yield();
    lock.lock();
  }
  Parked parked;
  parked.comm = comm_;
  parked.group = group_;
  parked.failed = bool(failure_);
  parked.orphans = std::move(orphans_);
  for (int peer = 0; peer < size_; ++peer) {
    Peer& p = peers_[size_t(peer)];
    if (peer == rank_ || p.closed) continue;
    parked.inboxes.push_back({peer, std::move(p.inbox), p.inboxRequest});
    p.inboxRequest = MPI_REQUEST_NULL;
  }
  comm_ = MPI_COMM_NULL;
  lock.unlock();
  park(std::move(parked));
}

}  // namespace

std::unique_ptr<Transport> createMpiTransport(std::shared_ptr<store::Store> store, int rank,
                                              int size, const MpiOptions& options) {
  enforceGroupMember("mpi transport", store.get(), rank, size);
  const Deadline deadline = deadlineAfter(options.timeout);
  const MpiProcess process = initMpi();
  reapParked();

  // The group id: tells this group's envelopes from stale ones and tags MPI_Comm_create_group.
  if (rank == 0) {
    std::random_device device;
    const uint64_t id = uint64_t(device()) << 32 | device();
    store->setString("group", str(id));
  }
  // Join: every rank publishes its MPI job, world rank and host; a missing rank is named here.
  const std::vector<std::string> records =
      joinGroup(*store, "world", str(process.job, "\n", process.worldRank, "\n", net::hostName()),
                rank, size, deadline, options.timeout, "mpi transport");
  std::vector<int> worldRanks(static_cast<size_t>(size), -1);
  std::vector<std::string> hosts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const std::string& record = records[size_t(r)];
    const size_t first = record.find('\n');
    const size_t second = record.find('\n', first == std::string::npos ? first : first + 1);
    if (second == std::string::npos)
      throw IoError(str("mpi transport: rank ", r, " published a malformed record '", record, "'"));
    const std::string job = record.substr(0, first);
    if (job != process.job)
      throw ConfigError(str("mpi transport: rank ", r, " is in MPI job '", job, "', rank ", rank,
                            " in '", process.job,
                            "'; every rank of an mpi group must be a process of one mpirun job"));
    worldRanks[size_t(r)] = std::stoi(record.substr(first + 1, second - first - 1));
    hosts[size_t(r)] = record.substr(second + 1);
    for (int q = 0; q < r; ++q)
      if (worldRanks[size_t(q)] == worldRanks[size_t(r)])
        throw ConfigError(str("mpi transport: ranks ", q, " and ", r,
                              " of the group are the same MPI process (world rank ",
                              worldRanks[size_t(r)],
                              "); every rank of an mpi group must be its own MPI process "
                              "(launch with mpirun -np N)"));
  }
  const uint64_t group = std::stoull(store->getString("group", deadline));

  // The group's communicator, collective over the group only. MPI offers no timeout here; every
  // rank has joined above, so all of them are about to call it.
  MPI_Group world = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_group(MPI_COMM_WORLD, &world);
  if (rc == MPI_SUCCESS) rc = MPI_Group_incl(world, size, worldRanks.data(), &members);
  if (rc == MPI_SUCCESS)
    rc = MPI_Comm_create_group(MPI_COMM_WORLD, members, int(group % uint64_t(tagUpperBound())),
                               &comm);
  if (members != MPI_GROUP_NULL) MPI_Group_free(&members);
  if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
  if (rc != MPI_SUCCESS || comm == MPI_COMM_NULL)
    throw IoError(str("mpi transport: rank ", rank, " could not create the group's communicator: ",
                      rc == MPI_SUCCESS ? "not a member" : mpiErrorText(rc)));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int commRank = -1;
  MPI_Comm_rank(comm, &commRank);
  if (commRank != rank) {
    MPI_Comm_free(&comm);
    throw IoError(str("mpi transport: rank ", rank, " has rank ", commRank,
                      " in the group's MPI communicator"));
  }
  auto transport = std::make_unique<MpiTransport>(comm, rank, size, group, std::move(hosts));
  transport->start();
  HETRA_DEBUG("comm", "mpi: rank ", rank, " of ", size, " is world rank ", process.worldRank);
  return transport;
}

}  // namespace hetra::comm
