// FailureLatch: the first failure of a message transport's group (a dead peer, a timeout, a
// mismatched message, abort()), kept so that every later call of the group fails with it. One
// piece of code for the tcp and the MPI transport.
//
// Vocabulary:
//   latch   the first error wins and is kept; the transport tells its peers once, then every
//           pending and later request rethrows it. A later error is dropped: the first one is its
//           cause, and every rank should report that one.
//   notify  the transport's own way to tell its peers who failed and why (an Abort frame, an
//           Abort envelope), run once by the call that latched.
// Not synchronised: the transport calls it under its own lock, notify included.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "common/errors.h"
#include "common/logging.h"

namespace hetra::comm {

class FailureLatch {
 public:
  // notify(culprit, message): tells the peers that rank `culprit` failed the group.
  using Notify = std::function<void(int culprit, const std::string& message)>;
  FailureLatch(const char* transport, Notify notify)
      : transport_(transport), notify_(std::move(notify)) {}

  // Latches `error` unless a failure is latched already; returns the latched one (to rethrow).
  std::exception_ptr latch(std::exception_ptr error, int culprit, const std::string& message) {
    if (error_) return error_;
    error_ = std::move(error);
    HETRA_DEBUG("comm", transport_, ": group failed: ", message);
    notify_(culprit, message);
    return error_;
  }

  // Transport::abort(reason) on this rank, `rank`, which `who` names: a PeerAbortedError that
  // blames it, on this rank and on every peer it reaches.
  std::exception_ptr abort(int rank, const std::string& who, const std::string& reason) {
    const std::string message = str(who, " aborted the group: ", reason);
    return latch(std::make_exception_ptr(PeerAbortedError(rank, message)), rank, message);
  }

  explicit operator bool() const { return error_ != nullptr; }
  std::exception_ptr error() const { return error_; }
  void rethrowIfFailed() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  const char* transport_;  // "tcp": in the log line
  Notify notify_;
  std::exception_ptr error_;
};

}  // namespace hetra::comm
