#include "store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "common/errors.h"
#include "common/net.h"

namespace hetra::store {
namespace {

// Leaves room under NAME_MAX (255) for the "k_" prefix and the hash suffix.
constexpr size_t kMaxEscapedName = 200;
constexpr Millis kMaxPollSleep{20};

std::string errnoText() {
  return std::strerror(errno);
}

std::optional<Bytes> readFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw IoError(str("file store: cannot open ", path, ": ", errnoText()));
  }
  Bytes out;
  uint8_t buffer[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      out.insert(out.end(), buffer, buffer + n);
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      const std::string error = errnoText();
      ::close(fd);
      throw IoError(str("file store: cannot read ", path, ": ", error));
    }
  }
  ::close(fd);
  return out;
}

// Polls `ready` with a sleep that grows to kMaxPollSleep, until it holds or the deadline passes.
template <typename Ready>
bool pollUntil(Deadline deadline, Ready ready) {
  Millis sleep{1};
  for (;;) {
    if (ready()) return true;
    const Millis left = remaining(deadline);
    if (left.count() <= 0) return false;
    std::this_thread::sleep_for(std::min(sleep, left));
    sleep = std::min(sleep * 2, kMaxPollSleep);
  }
}

}  // namespace

// Exclusive flock on <directory>/.lock. flock locks belong to the open file description, so threads
// of one process exclude each other as well as other processes. Non-blocking attempts with a
// growing sleep keep the wait bounded by the store's lock timeout.
class FileStore::Lock {
 public:
  Lock(const std::string& directory, Millis timeout) : path_(directory + "/.lock") {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(str("file store: cannot open lock ", path_, ": ", errnoText()));
    const Deadline deadline = deadlineAfter(timeout);
    auto sleep = std::chrono::microseconds(20);
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) {
        const std::string error = errnoText();
        ::close(fd_);
        throw IoError(str("file store: cannot lock ", path_, ": ", error));
      }
      if (Clock::now() >= deadline) {
        ::close(fd_);
        throw TimeoutError(str("file store: lock ", path_, " still held by another writer after ",
                               timeout.count(), " ms"));
      }
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(2000));
    }
  }
  ~Lock() { ::close(fd_); }  // closing the last descriptor releases the flock
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

FileStore::FileStore(std::string directory, Millis lockTimeout)
    : directory_(std::move(directory)), lockTimeout_(lockTimeout) {
  HETRA_ENFORCE(!directory_.empty(), "file store: empty directory");
  std::error_code error;
  std::filesystem::create_directories(directory_, error);
  if (error || !std::filesystem::is_directory(directory_))
    throw IoError(str("file store: cannot create directory ", directory_, ": ",
                      error ? error.message() : "not a directory"));
}

std::string FileStore::fileNameForKey(const std::string& key) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string escaped;
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-') {
      escaped += char(ch);
    } else {
      escaped += '%';
      escaped += kHex[ch >> 4];
      escaped += kHex[ch & 15];
    }
  }
  if (escaped.size() > kMaxEscapedName) {
    // FNV-1a: '~' never appears in an escaped key, so cut names cannot equal uncut ones.
    uint64_t hash = 1469598103934665603ull;
    for (unsigned char ch : key) hash = (hash ^ ch) * 1099511628211ull;
    std::string suffix = "~";
    for (int shift = 60; shift >= 0; shift -= 4) suffix += kHex[(hash >> shift) & 15];
    escaped = escaped.substr(0, kMaxEscapedName) + suffix;
  }
  return "k_" + escaped;
}

std::string FileStore::pathFor(const std::string& key) const {
  return directory_ + "/" + fileNameForKey(key);
}

void FileStore::writeFile(const std::string& key, const Bytes& value) {
  // Unique per host, process and call, so concurrent writers never share a temp file.
  static std::atomic<uint64_t> counter{0};
  static const std::string host = net::hostName();
  const std::string temp =
      str(directory_, "/.tmp.", host, ".", ::getpid(), ".", counter.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(str("file store: cannot create ", temp, ": ", errnoText()));
  size_t written = 0;
  while (written < value.size()) {
    const ssize_t n = ::write(fd, value.data() + written, value.size() - written);
    if (n > 0) {
      written += size_t(n);
    } else if (n < 0 && errno != EINTR) {
      const std::string error = errnoText();
      ::close(fd);
      ::unlink(temp.c_str());
      throw IoError(str("file store: cannot write ", temp, ": ", error));
    }
  }
  ::close(fd);
  const std::string path = pathFor(key);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string error = errnoText();
    ::unlink(temp.c_str());
    throw IoError(str("file store: cannot rename ", temp, " to ", path, ": ", error));
  }
}

// Writers all hold the lock, so set cannot slip between the read and the write of add or
// compareSet.
void FileStore::set(const std::string& key, const Bytes& value) {
  Lock lock(directory_, lockTimeout_);
  writeFile(key, value);
}

Bytes FileStore::get(const std::string& key, Deadline deadline) {
  const Millis budget = remaining(deadline);
  std::optional<Bytes> value;
  // Reading (not only checking) each time: a key deleted between a check and a read keeps waiting.
  if (!pollUntil(deadline, [&] { return (value = readFile(pathFor(key))).has_value(); }))
    throw TimeoutError(str("file store ", directory_, ": get timed out after ", budget.count(),
                           " ms for keys ", describeKeys({key})));
  return std::move(*value);
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  Lock lock(directory_, lockTimeout_);
  const std::optional<Bytes> current = readFile(pathFor(key));
  const int64_t before = current ? parseInteger(*current) : 0;
  int64_t result = 0;
  if (__builtin_add_overflow(before, delta, &result))
    throw Error(str("store add on '", key, "' overflows int64"));
  writeFile(key, integerBytes(result));
  return result;
}

Bytes FileStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Lock lock(directory_, lockTimeout_);
  const std::optional<Bytes> current = readFile(pathFor(key));
  const bool matches = current ? *current == expected : expected.empty();
  if (!matches) return current.value_or(Bytes{});
  writeFile(key, desired);
  return desired;
}

void FileStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  const Millis budget = remaining(deadline);
  if (!pollUntil(deadline, [&] { return check(keys); }))
    throw TimeoutError(str("file store ", directory_, ": wait timed out after ", budget.count(),
                           " ms for keys ", describeKeys(keys)));
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    struct stat info;
    if (::stat(pathFor(key).c_str(), &info) != 0) {
      if (errno == ENOENT) return false;
      throw IoError(str("file store: cannot stat ", pathFor(key), ": ", errnoText()));
    }
  }
  return true;
}

bool FileStore::deleteKey(const std::string& key) {
  Lock lock(directory_, lockTimeout_);
  if (::unlink(pathFor(key).c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  throw IoError(str("file store: cannot delete ", pathFor(key), ": ", errnoText()));
}

}  // namespace hetra::store
