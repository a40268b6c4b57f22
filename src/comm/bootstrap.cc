#include "comm/bootstrap.h"

#include "common/errors.h"

namespace hetra::comm {

store::Bytes exchangeRootId(store::Store& store, const std::string& key, int rank,
                            const std::function<store::Bytes()>& makeId, Deadline deadline,
                            size_t idBytes) {
  HETRA_ENFORCE_GE(rank, 0, "bootstrap: negative rank");
  store::Bytes id;
  if (rank == 0) {
    id = makeId();
    if (idBytes != 0 && id.size() != idBytes)
      throw IoError(str("bootstrap: rank 0 made an id of ", id.size(), " bytes under '", key,
                        "', expected ", idBytes));
    store.set(key, id);
    return id;
  }
  const Millis budget = remaining(deadline);  // what the message reports as waited
  try {
    id = store.get(key, deadline);
  } catch (const TimeoutError& e) {
    throw TimeoutError(
        str("bootstrap: rank ", rank, " waited ", budget.count(),
            " ms for rank 0 to publish the communicator id under '", key,
            "' (did rank 0 start, and create its device communicator?): ", e.what()));
  }
  if (idBytes != 0 && id.size() != idBytes)
    throw IoError(str("bootstrap: rank ", rank, " read an id of ", id.size(), " bytes under '", key,
                      "', expected ", idBytes, " (a different library version on rank 0?)"));
  return id;
}

}  // namespace hetra::comm
