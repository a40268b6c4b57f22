// Matching of receives to messages, shared by the tcp and mpi transports: per peer, the receives
// posted for each tag and the messages of each tag that arrived before their receive
// ("unexpected"), both oldest first. The Transport contract (messages of one tag arrive in the
// order they were sent) then makes the k-th receive of a tag take the k-th message of that tag,
// whichever came first. Not thread-safe: the transport's mutex guards it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/errors.h"

namespace hetra::comm {

// `Posted`: what a posted receive is to the transport (a request pointer); `Arrived`: what an
// unexpected message is (its buffer, or where to find it).
template <class Posted, class Arrived>
class TagMatcher {
 public:
  // The oldest unexpected message of `tag`, still queued; nullptr when there is none.
  Arrived* oldestArrived(uint64_t tag) {
    auto found = arrived_.find(tag);
    return found == arrived_.end() ? nullptr : &found->second.front();
  }
  // Removes and returns the oldest unexpected message of `tag` (there must be one).
  Arrived takeArrived(uint64_t tag) { return takeFront(arrived_, tag); }
  void addArrived(uint64_t tag, Arrived message) { arrived_[tag].push_back(std::move(message)); }

  // The oldest receive posted for `tag`, still queued; nullptr when there is none.
  Posted* oldestPosted(uint64_t tag) {
    auto found = posted_.find(tag);
    return found == posted_.end() ? nullptr : &found->second.front();
  }
  Posted takePosted(uint64_t tag) { return takeFront(posted_, tag); }
  void post(uint64_t tag, Posted receive) { posted_[tag].push_back(std::move(receive)); }
  size_t postedCount(uint64_t tag) const {
    auto found = posted_.find(tag);
    return found == posted_.end() ? 0 : found->second.size();
  }
  // Withdraws a posted receive (its request was destroyed); false when it was not queued.
  bool cancel(uint64_t tag, const Posted& receive) {
    auto found = posted_.find(tag);
    if (found == posted_.end()) return false;
    auto& queue = found->second;
    auto it = std::find(queue.begin(), queue.end(), receive);
    if (it == queue.end()) return false;
    queue.erase(it);
    if (queue.empty()) posted_.erase(found);
    return true;
  }
  // Some posted receive (of any tag), e.g. to name one that a closed peer strands; nullptr if none.
  const Posted* anyPosted() const {
    return posted_.empty() ? nullptr : &posted_.begin()->second.front();
  }
  void clear() {
    posted_.clear();
    arrived_.clear();
  }

 private:
  // Queues are never left empty in the maps, so a present tag has a front.
  template <class T>
  static T takeFront(std::unordered_map<uint64_t, std::deque<T>>& queues, uint64_t tag) {
    auto found = queues.find(tag);
    HETRA_ENFORCE(found != queues.end(), "TagMatcher: nothing queued for tag ", tag);
    T front = std::move(found->second.front());
    found->second.pop_front();
    if (found->second.empty()) queues.erase(found);
    return front;
  }

  std::unordered_map<uint64_t, std::deque<Posted>> posted_;
  std::unordered_map<uint64_t, std::deque<Arrived>> arrived_;
};

// The MismatchError text of a message whose size differs from its receive's, on the receiving rank.
inline std::string sizeMismatchMessage(const std::string& transport, const std::string& sender,
                                       uint64_t sentBytes, uint64_t tag, int receiver,
                                       uint64_t postedBytes) {
  return str(transport, ": ", sender, " sent a message of ", sentBytes, " bytes with tag ", tag,
             " but rank ", receiver, " posted a receive of ", postedBytes, " bytes for it");
}

}  // namespace hetra::comm
