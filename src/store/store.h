// Store: the key/value rendezvous through which ranks find each other (c10d's Store, Gloo's
// rendezvous). Values are bytes. Every blocking call takes a Deadline (common/timing.h), so that
// several calls under one budget share it, and throws TimeoutError naming the keys it waited for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/timing.h"

namespace hetra::store {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  // The budget of a blocking call given no deadline, counted from that call.
  static constexpr Millis kDefaultTimeout{30000};

  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits until the key exists, then returns its value.
  virtual Bytes get(const std::string& key, Deadline deadline = deadlineAfter(kDefaultTimeout)) = 0;
  // Atomically adds delta to the integer stored at key (0 if absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to desired if its current value equals expected (an absent key equals an empty
  // expected); returns the value the key holds afterwards.
  virtual Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // Waits until every key exists.
  virtual void wait(const std::vector<std::string>& keys,
                    Deadline deadline = deadlineAfter(kDefaultTimeout)) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual bool deleteKey(const std::string& key) = 0;

  // Convenience for string values.
  void setString(const std::string& key, const std::string& value) {
    set(key, Bytes(value.begin(), value.end()));
  }
  std::string getString(const std::string& key,
                        Deadline deadline = deadlineAfter(kDefaultTimeout)) {
    Bytes value = get(key, deadline);
    return std::string(value.begin(), value.end());
  }
};

// All keys of `inner` under "prefix/": groups and jobs sharing one store stay apart.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
      : prefix_(std::move(prefix) + "/"), inner_(std::move(inner)) {}
  void set(const std::string& key, const Bytes& value) override {
    inner_->set(prefix_ + key, value);
  }
  Bytes get(const std::string& key, Deadline deadline) override {
    return inner_->get(prefix_ + key, deadline);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return inner_->add(prefix_ + key, delta);
  }
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return inner_->compareSet(prefix_ + key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, Deadline deadline) override {
    inner_->wait(prefixed(keys), deadline);
  }
  bool check(const std::vector<std::string>& keys) override {
    return inner_->check(prefixed(keys));
  }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(prefix_ + key); }
  const std::shared_ptr<Store>& inner() const { return inner_; }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& key : keys) out.push_back(prefix_ + key);
    return out;
  }
  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

// In-process store for tests that run one thread per rank.
class MemoryStore : public Store {
 public:
  MemoryStore();
  ~MemoryStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Deadline deadline) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Deadline deadline) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Describes keys in a timeout message: "a, b, c (and 5 more)".
std::string describeKeys(const std::vector<std::string>& keys);

// Integer values are stored as decimal text so that every store implementation agrees on `add`.
int64_t parseInteger(const Bytes& value);
Bytes integerBytes(int64_t value);

}  // namespace hetra::store
