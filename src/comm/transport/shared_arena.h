// SharedArena: memory that every rank of a group maps, with counters ranks use to signal each other.
// (Defined by the shm transport work; algorithms in algorithms/shared.cc use only this interface.)
#pragma once

namespace hetra::comm {

class SharedArena {
 public:
  virtual ~SharedArena() = default;
};

}  // namespace hetra::comm
