// The abort record: how a transport that fails tells every rank of its group which rank failed and
// why, through the group's store (for ranks it cannot reach directly). The record is
// "<culprit rank>\n<message>"; the first one written wins.
#pragma once

#include <string>

#include "common/logging.h"
#include "store/store.h"

namespace hetra::comm {

constexpr const char* kAbortKey = "<abort>";

// Writes `record` unless one is there already; a store that is gone is only logged.
inline void publishAbortRecord(store::Store& store, const std::string& record, const char* who) {
  try {
    store.compareSet(kAbortKey, {}, store::Bytes(record.begin(), record.end()));
  } catch (const std::exception& e) {
    HETRA_WARN("comm", who, ": could not publish the abort record: ", e.what());
  }
}

// Reads the record into culprit and message; false when there is none (or no store to ask).
inline bool readAbortRecord(store::Store& store, int& culprit, std::string& message) {
  try {
    if (!store.check({kAbortKey})) return false;
    const std::string record = store.getString(kAbortKey, deadlineAfter(Millis(1000)));
    const size_t newline = record.find('\n');
    if (newline == std::string::npos) return false;
    culprit = std::stoi(record.substr(0, newline));
    message = record.substr(newline + 1);
    return true;
  } catch (const std::exception&) {
    return false;  // the store may have died with the rank that hosted it
  }
}

}  // namespace hetra::comm
