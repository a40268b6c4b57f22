#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>

#include "common/errors.h"
#include "common/units.h"
#include "store/store.h"

namespace hetra::store {

struct MemoryStore::State {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, Bytes> values;
};

MemoryStore::MemoryStore() : state_(std::make_unique<State>()) {}
MemoryStore::~MemoryStore() = default;

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->values[key] = value;
  }
  state_->changed.notify_all();
}

Bytes MemoryStore::get(const std::string& key, Deadline deadline) {
  wait({key}, deadline);
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->values.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t result;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->values.find(key);
    result = (it == state_->values.end() ? 0 : parseInteger(it->second)) + delta;
    state_->values[key] = integerBytes(result);
  }
  state_->changed.notify_all();
  return result;
}

Bytes MemoryStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->values.find(key);
    const bool matches = it == state_->values.end() ? expected.empty() : it->second == expected;
    if (matches) state_->values[key] = desired;
    result = state_->values.count(key) ? state_->values[key] : Bytes{};
  }
  state_->changed.notify_all();
  return result;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  const Millis budget = remaining(deadline);  // what the message reports as waited
  std::unique_lock<std::mutex> lock(state_->mutex);
  auto present = [&] {
    for (const auto& key : keys)
      if (!state_->values.count(key)) return false;
    return true;
  };
  if (!state_->changed.wait_until(lock, deadline, present))
    throw TimeoutError(
        str("store wait timed out after ", budget.count(), " ms for keys ", describeKeys(keys)));
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (const auto& key : keys)
    if (!state_->values.count(key)) return false;
  return true;
}

bool MemoryStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->values.erase(key) > 0;
}

std::string describeKeys(const std::vector<std::string>& keys) {
  std::string out;
  const size_t shown = std::min<size_t>(keys.size(), 3);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + keys[i];
  if (keys.size() > shown) out += str(" (and ", keys.size() - shown, " more)");
  return out;
}

int64_t parseInteger(const Bytes& value) {
  const std::string text(value.begin(), value.end());
  if (std::optional<int64_t> parsed = wholeInteger(text)) return *parsed;
  throw Error(str("store value '", text, "' is not an integer (add on a non-counter key)"));
}

Bytes integerBytes(int64_t value) {
  const std::string text = std::to_string(value);
  return Bytes(text.begin(), text.end());
}

}  // namespace hetra::store
