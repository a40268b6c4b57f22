// Error handling for every layer of hetra.
//
// Two tiers, as in Gloo: HETRA_ENFORCE* checks invariants (a bug or a misuse of an API) and throws
// EnforceError with both operand values, the file and the line; typed exceptions report faults a
// caller can handle (a peer that died, a timeout, a bad configuration). Nothing here aborts the
// process.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace hetra {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An invariant did not hold: a bug in hetra or a misuse of its API.
class EnforceError : public Error {
 public:
  using Error::Error;
};

// A read, write, connect or system call failed.
class IoError : public Error {
 public:
  using Error::Error;
};

// A blocking call did not complete before its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer of the group died, disconnected or aborted the group; `rank()` names it (-1 when unknown).
class PeerAbortedError : public Error {
 public:
  PeerAbortedError(int rank, const std::string& what) : Error(what), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  int rank_;
};

// Ranks called a collective with arguments that do not match (count, dtype, op, root).
class MismatchError : public Error {
 public:
  using Error::Error;
};

// A configuration value or an argument is not allowed. The message names the key, the value and
// what is allowed.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// An emulated device ran out of its memory cap (device/memory_accounting.h): an allocation of
// `askedBytes` for `category` would have taken the device's accounted bytes past `capBytes`.
// `peakBytes` is the device's peak so far. The message says all of it, and what would fit when the
// trainer knows.
class DeviceOutOfMemoryError : public Error {
 public:
  DeviceOutOfMemoryError(const std::string& what, std::string device, int64_t capBytes,
                         std::string category, int64_t askedBytes, int64_t peakBytes)
      : Error(what),
        device_(std::move(device)),
        category_(std::move(category)),
        capBytes_(capBytes),
        askedBytes_(askedBytes),
        peakBytes_(peakBytes) {}
  const std::string& device() const { return device_; }
  const std::string& category() const { return category_; }
  int64_t capBytes() const { return capBytes_; }
  int64_t askedBytes() const { return askedBytes_; }
  int64_t peakBytes() const { return peakBytes_; }

 private:
  std::string device_, category_;
  int64_t capBytes_, askedBytes_, peakBytes_;
};

namespace detail {
inline void appendAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void appendAll(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  appendAll(os, rest...);
}
}  // namespace detail

// Builds a string from any streamable values: str("rank ", r, " of ", n).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::appendAll(os, args...);
  return os.str();
}

[[noreturn]] void throwEnforce(const char* file, int line, const std::string& condition,
                               const std::string& message);

}  // namespace hetra

#define HETRA_ENFORCE(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) ::hetra::throwEnforce(__FILE__, __LINE__, #cond, ::hetra::str(__VA_ARGS__)); \
  } while (0)

#define HETRA_ENFORCE_BINARY_(op, a, b, ...)                                                       \
  do {                                                                                             \
    const auto& hetra_a_ = (a);                                                                    \
    const auto& hetra_b_ = (b);                                                                    \
    if (!(hetra_a_ op hetra_b_))                                                                   \
      ::hetra::throwEnforce(__FILE__, __LINE__,                                                    \
                            ::hetra::str(#a " " #op " " #b " (", hetra_a_, " vs ", hetra_b_, ")"), \
                            ::hetra::str(__VA_ARGS__));                                            \
  } while (0)

#define HETRA_ENFORCE_EQ(a, b, ...) HETRA_ENFORCE_BINARY_(==, a, b, __VA_ARGS__)
#define HETRA_ENFORCE_NE(a, b, ...) HETRA_ENFORCE_BINARY_(!=, a, b, __VA_ARGS__)
#define HETRA_ENFORCE_LT(a, b, ...) HETRA_ENFORCE_BINARY_(<, a, b, __VA_ARGS__)
#define HETRA_ENFORCE_LE(a, b, ...) HETRA_ENFORCE_BINARY_(<=, a, b, __VA_ARGS__)
#define HETRA_ENFORCE_GT(a, b, ...) HETRA_ENFORCE_BINARY_(>, a, b, __VA_ARGS__)
#define HETRA_ENFORCE_GE(a, b, ...) HETRA_ENFORCE_BINARY_(>=, a, b, __VA_ARGS__)
