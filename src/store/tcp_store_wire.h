// The TcpStore wire format, shared by the server (tcp_store_server.cc) and the client
// (tcp_store.cc). Requests: op (u8) then fields; strings and byte values are u32 length + bytes,
// integers u64. Replies: status (u8: ok, timeout, failed + message) then the op's result. Internal
// to hetra_store.
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/timing.h"
#include "store/store.h"

namespace hetra::store::wire {

constexpr uint32_t kMagic = 0x31535448;  // "HTS1" on the wire
constexpr size_t kHeaderBytes = 8;
constexpr uint32_t kMaxPayload = 64u << 20;
constexpr size_t kReadChunk = 64u << 10;
// The server answers "timed out" at a get/wait's deadline; the client waits this much longer before
// deciding the server is stuck.
constexpr Millis kReplyGrace{1000};
// Longer waits are clamped so deadlines never overflow.
constexpr uint64_t kMaxWaitMs = uint64_t(30) * 24 * 3600 * 1000;
// The context of the store's handshake proofs (a transport's proofs do not pass here).
constexpr const char* kAuthContext = "hetra-store";
// Connections still in their handshake: more are refused, so strangers cannot exhaust descriptors.
constexpr size_t kMaxPendingHandshakes = 256;
// A connection in its handshake is read this much at a time: a stranger's flood stays small.
constexpr size_t kHandshakeReadBytes = 256;

enum class Op : uint8_t { Set = 1, Get, Add, CompareSet, Wait, Check, Delete };
enum class Status : uint8_t { Ok = 0, Timeout = 1, Failed = 2 };

// A peer sent bytes that are not a valid frame or request.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

inline uint32_t loadU32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

class Writer {
 public:
  Writer& u8(uint8_t v) {
    out_.push_back(v);
    return *this;
  }
  Writer& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(uint8_t(v >> (8 * i)));
    return *this;
  }
  Writer& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(uint8_t(v >> (8 * i)));
    return *this;
  }
  Writer& bytes(const uint8_t* data, size_t size) {
    HETRA_ENFORCE_LE(size, size_t(UINT32_MAX), "store field too large");
    u32(uint32_t(size));
    out_.insert(out_.end(), data, data + size);
    return *this;
  }
  Writer& bytes(const Bytes& b) { return bytes(b.data(), b.size()); }
  Writer& string(const std::string& s) {
    return bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  Writer& strings(const std::vector<std::string>& keys) {
    u32(uint32_t(keys.size()));
    for (const auto& key : keys) string(key);
    return *this;
  }
  Bytes take() { return std::move(out_); }

 private:
  Bytes out_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() { return take(1)[0]; }
  uint32_t u32() { return loadU32(take(4)); }
  uint64_t u64() {
    const uint8_t* p = take(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
  }
  Bytes bytes() {
    const uint32_t size = u32();
    const uint8_t* p = take(size);
    return Bytes(p, p + size);
  }
  std::string string() {
    const uint32_t size = u32();
    const uint8_t* p = take(size);
    return std::string(reinterpret_cast<const char*>(p), size);
  }
  std::vector<std::string> strings() {
    const uint32_t count = u32();
    // Each string takes at least its 4-byte length: bounds the reservation by the frame size.
    if (count > (size_ - pos_) / 4)
      throw ProtocolError(str("key count ", count, " exceeds the frame"));
    std::vector<std::string> out;
    out.reserve(count);
    for (uint32_t i = 0; i < count; ++i) out.push_back(string());
    return out;
  }
  void end() const {
    if (pos_ != size_) throw ProtocolError(str(size_ - pos_, " trailing bytes in a frame"));
  }

 private:
  const uint8_t* take(size_t n) {
    if (n > size_ - pos_) throw ProtocolError(str("frame truncated: need ", n, " more bytes"));
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

inline Bytes makeFrame(const Bytes& payload) {
  Writer w;
  w.u32(kMagic).u32(uint32_t(payload.size()));
  Bytes frame = w.take();
  frame.insert(frame.end(), payload.begin(), payload.end());
  return frame;
}

inline uint64_t clampMs(Millis timeout) {
  return timeout.count() <= 0 ? 0 : std::min<uint64_t>(uint64_t(timeout.count()), kMaxWaitMs);
}

// A request's payload: the opcode, then (get and wait only) the milliseconds it may wait, then the
// op's other fields.
inline size_t requestBytes(bool waits, size_t fieldBytes) {
  return 1 + (waits ? 8 : 0) + fieldBytes;
}
inline Bytes makeRequestFrame(Op op, std::optional<Millis> wait, const Bytes& fields) {
  Writer w;
  w.u32(kMagic).u32(uint32_t(requestBytes(wait.has_value(), fields.size()))).u8(uint8_t(op));
  if (wait) w.u64(clampMs(*wait));
  Bytes frame = w.take();
  frame.insert(frame.end(), fields.begin(), fields.end());
  return frame;
}

inline std::string errnoText(int err) {
  return std::strerror(err);
}

}  // namespace hetra::store::wire
