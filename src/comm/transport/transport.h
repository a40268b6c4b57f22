// Transport: moves bytes between the ranks of one group. Collective algorithms are written against
// this interface (and, where present, its SharedArena capability) and never name a concrete
// transport.
//
// Vocabulary: a *peer* is a rank of the group; a *tag* separates independent streams of messages
// between the same pair (messages with one tag arrive in the order they were sent); a *request* is
// one pending send or receive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/timing.h"

namespace hetra::comm {

class SharedArena;

class Request {
 public:
  virtual ~Request() = default;
  // Blocks until the transfer completes. Throws TimeoutError past the deadline, PeerAbortedError
  // when the peer died or aborted the group, IoError for other failures.
  virtual void wait(Deadline deadline) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const char* name() const = 0;  // "shm", "tcp"
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Starts sending `bytes` bytes to `peer`; the buffer must stay valid and unchanged until wait
  // returns. The receive on the peer must name the same tag and exactly the same size.
  virtual std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data,
                                         size_t bytes) = 0;
  virtual std::unique_ptr<Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;

  // Memory that every rank of the group maps, when the transport has it; nullptr otherwise.
  virtual SharedArena* sharedArena() { return nullptr; }

  // Marks the group failed: every rank blocked in this group (here and on peers that can be
  // reached) wakes with PeerAbortedError naming this rank and the reason. Safe to call from any
  // thread.
  virtual void abort(const std::string& reason) = 0;

  // Payload bytes sent and received through this transport since it was created.
  virtual uint64_t bytesSent() const = 0;
  virtual uint64_t bytesReceived() const = 0;
};

}  // namespace hetra::comm
