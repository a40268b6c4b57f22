// What every transport's request has alike (tcp and mpi): what it moves — direction, peer, tag,
// buffer, size — and the transport that moves it. The transport (`Owner`) waits for it with
// `Owner::wait(Derived&, Deadline)` and names peers with `Owner::who(peer)`. Each transport derives
// its request, adds its progress state, and releases it in its own destructor (where that state
// still exists). Constructing one checks the arguments of isend/irecv (`Owner::name()`, `rank()`
// and `size()` word the error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/transport/transport.h"
#include "common/errors.h"

namespace hetra::comm {

template <class Derived, class Owner>
class PeerRequest : public Request {
 public:
  PeerRequest(Owner& transport, bool isSend, int peer, uint64_t tag, uint8_t* data, size_t bytes)
      : transport_(transport), isSend_(isSend), peer_(peer), tag_(tag), data_(data), bytes_(bytes) {
    // Every isend/irecv makes its request first, so this is the one check of their arguments.
    const int rank = transport.rank(), size = transport.size();
    HETRA_ENFORCE(peer >= 0 && peer < size && peer != rank, transport.name(), ": peer ", peer,
                  " is not another rank of this group of ", size, " (this is rank ", rank, ")");
    HETRA_ENFORCE(data != nullptr || bytes == 0, transport.name(), ": null buffer for ", bytes,
                  " bytes");
  }

  // The request of an isend (its data is only read) and of an irecv.
  static std::unique_ptr<Derived> send(Owner& transport, int peer, uint64_t tag, const void* data,
                                       size_t bytes) {
    return std::make_unique<Derived>(transport, true, peer, tag,
                                     static_cast<uint8_t*>(const_cast<void*>(data)), bytes);
  }
  static std::unique_ptr<Derived> receive(Owner& transport, int peer, uint64_t tag, void* data,
                                          size_t bytes) {
    return std::make_unique<Derived>(transport, false, peer, tag, static_cast<uint8_t*>(data),
                                     bytes);
  }

  void wait(Deadline deadline) override { transport_.wait(static_cast<Derived&>(*this), deadline); }

  // "send of 8 bytes to rank 1 (host) (tag 3)", for errors.
  std::string describe() const {
    return str(isSend_ ? "send of " : "receive of ", bytes_, " bytes ", isSend_ ? "to " : "from ",
               transport_.who(peer_), " (tag ", tag_, ")");
  }

 protected:
  Owner& transport_;
  const bool isSend_;
  const int peer_;
  const uint64_t tag_;
  uint8_t* const data_;
  const size_t bytes_;
};

}  // namespace hetra::comm
