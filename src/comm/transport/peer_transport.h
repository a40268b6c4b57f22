// What the tcp and the MPI transport have alike besides their requests (peer_request.h): this
// rank in a group of `size`, the hosts that name the peers in errors, the payload counters, and
// the lock that guards the transport's state together with its first failure (failure_latch.h).
// Each derives from it and moves the bytes its own way.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/transport/failure_latch.h"
#include "comm/transport/transport.h"
#include "common/errors.h"

namespace hetra::comm {

class PeerTransport : public Transport {
 public:
  int rank() const final { return rank_; }
  int size() const final { return size_; }
  uint64_t bytesSent() const final { return sent_.load(std::memory_order_relaxed); }
  uint64_t bytesReceived() const final { return received_.load(std::memory_order_relaxed); }

  // Latches a PeerAbortedError that blames this rank (FailureLatch::abort), which tells the
  // peers; then afterAbort().
  void abort(const std::string& reason) final {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_.abort(rank_, who(rank_), reason);
    }
    afterAbort();
  }

  // "rank 3 (host)": how errors name a peer.
  std::string who(int peer) const { return str("rank ", peer, " (", hosts_[size_t(peer)], ")"); }

 protected:
  // `name`: the transport's name() in the log line of a failure.
  PeerTransport(const char* name, int rank, int size, std::vector<std::string> hosts)
      : rank_(rank),
        size_(size),
        hosts_(std::move(hosts)),
        failure_(name, [this](int culprit, const std::string& message) {
          tellPeersLocked(culprit, message);
        }) {}

  // failure_'s notify, run once by the call that latches: tells every peer that rank `culprit`
  // failed the group and why, the transport's own way. The caller holds mutex_.
  virtual void tellPeersLocked(int culprit, const std::string& message) = 0;

  // What the transport does once abort() latched, without the lock; nothing by default.
  virtual void afterAbort() {}

  // The opening of every isend and irecv: the lock, then the group's failure if one is latched.
  std::unique_lock<std::mutex> lockUnlessFailed() {
    std::unique_lock<std::mutex> lock(mutex_);
    failure_.rethrowIfFailed();
    return lock;
  }

  // A request that moved `bytes` payload bytes completed.
  void countPayload(bool isSend, size_t bytes) {
    (isSend ? sent_ : received_).fetch_add(bytes, std::memory_order_relaxed);
  }

  const int rank_;
  const int size_;
  std::vector<std::string> hosts_;  // by rank; set once, before the first who()
  std::mutex mutex_;
  FailureLatch failure_;  // guarded by mutex_

 private:
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> received_{0};
};

}  // namespace hetra::comm
