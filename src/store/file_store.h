// FileStore: keys as files in one directory shared by the processes of a host (or by hosts through
// a shared filesystem). Writers take an flock on a lock file and replace a key's file atomically
// (temp file + rename), so readers never see half a value and need no lock; waiting is polling.
#pragma once

#include <string>

#include "store/store.h"

namespace hetra::store {

class FileStore : public Store {
 public:
  // Creates `directory` (and its parents) when missing; throws IoError when that fails.
  // `lockTimeout` bounds how long a writer waits for the lock held by other processes.
  explicit FileStore(std::string directory, Millis lockTimeout = kDefaultTimeout);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Deadline deadline = deadlineAfter(kDefaultTimeout)) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys,
            Deadline deadline = deadlineAfter(kDefaultTimeout)) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;

  const std::string& directory() const { return directory_; }

  // The file name holding `key`: "k_" + the key with every byte outside [A-Za-z0-9._-] written as
  // %XX, so distinct keys (with '/', '%', anything) map to distinct names; names that would exceed
  // the filesystem's limit are cut and end in "~" + a 64-bit hash of the whole key.
  static std::string fileNameForKey(const std::string& key);

 private:
  class Lock;
  std::string pathFor(const std::string& key) const;
  void writeFile(const std::string& key, const Bytes& value);

  std::string directory_;
  Millis lockTimeout_;
};

}  // namespace hetra::store
