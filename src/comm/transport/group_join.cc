#include "comm/transport/group_join.h"

#include "common/errors.h"

namespace hetra::comm {

void enforceGroupMember(const char* what, const store::Store* store, int rank, int size) {
  HETRA_ENFORCE(store != nullptr, what, ": no store");
  HETRA_ENFORCE(size >= 1 && rank >= 0 && rank < size, what, ": rank ", rank,
                " is outside a group of ", size);
}

std::vector<std::string> joinGroup(store::Store& store, const std::string& prefix,
                                   const std::string& record, int rank, int size, Deadline deadline,
                                   Millis timeout, const char* what) {
  store.setString(str(prefix, "/", rank), record);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(str(prefix, "/", r));
  try {
    store.wait(keys, deadline);
  } catch (const TimeoutError&) {
    std::string missing;
    int count = 0;
    for (int r = 0; r < size; ++r)
      if (!store.check({keys[size_t(r)]})) missing += str(count++ ? ", " : "", r);
    throw TimeoutError(str(what, ": rank", count > 1 ? "s " : " ", missing, " of a group of ", size,
                           " did not join within ", timeout.count(), " ms (this is rank ", rank,
                           ")"));
  }
  std::vector<std::string> records;
  for (const std::string& key : keys) records.push_back(store.getString(key, deadline));
  return records;
}

}  // namespace hetra::comm
