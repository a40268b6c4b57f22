// TCP transport: one authenticated socket per pair of ranks, set up through our store (see
// tcp_transport.cc for the design).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/transport/transport.h"
#include "common/auth.h"
#include "store/store.h"

namespace hetra::comm {

// HETRA_TCP_RATE_LIMIT as bytes per second (0: unlimited); ConfigError when malformed.
uint64_t tcpRateLimitFromEnvironment();

// HETRA_TCP_RATE_LIMIT's text ("0", "125000000", "125MB", "1gbit", "20MB/s", "512KiB") to bytes
// per second, as hetra::parseRate reads it, at most 1PB/s; ConfigError naming `source` and the
// value when malformed.
uint64_t parseRate(const std::string& text, const std::string& source);

struct TcpOptions {
  Millis timeout{30000};
  std::string listenAddress = "127.0.0.1";
  // Connections prove the job secret (by default the environment's; none: not authenticated).
  auth::AuthOptions auth;
  // This rank's outgoing bytes per second over all its peers (a token bucket; emulates a slow
  // link). 0: unlimited.
  uint64_t rateLimitBytesPerSecond = tcpRateLimitFromEnvironment();
};

// Collective over the group: every rank calls it with the same (prefixed) store. Fails in about
// options.timeout with TimeoutError naming the ranks that did not join or connect, with IoError
// when the address cannot be listened on or a peer cannot be authenticated. Notes for callers:
// - a receive must name exactly the size of the matching send; a difference is a MismatchError
//   naming both ranks (on the receiving rank, and the group fails);
// - SIGPIPE is set to ignored if it still has its default action, so that a dead peer fails a
//   write instead of killing the process (the transport itself writes with MSG_NOSIGNAL).
std::unique_ptr<Transport> createTcpTransport(std::shared_ptr<store::Store> store, int rank,
                                              int size, const TcpOptions& options);

// The frame that precedes every message on a connection (32 bytes, little-endian): magic (u32),
// type (u16), zero (u16), sequence number of the frame on this connection (u32), zero (u32), tag
// (u64; for Abort the culprit rank), payload bytes (u64). Exposed so that tests can feed the
// decoder arbitrary bytes.
struct TcpFrameHeader {
  // Close: the sender destroyed its transport cleanly; its end of the stream follows.
  enum class Type : uint16_t { Data = 1, Abort = 2, Close = 3 };
  Type type = Type::Data;
  uint32_t seq = 0;
  uint64_t tag = 0;
  uint64_t bytes = 0;
};
constexpr size_t kTcpFrameHeaderBytes = 32;
// An abort frame carries a reason of at most this many bytes.
constexpr size_t kTcpMaxAbortBytes = 64 << 10;
// A data frame carries at most this many bytes (larger is a corrupt or hostile header).
constexpr uint64_t kTcpMaxFrameBytes = uint64_t(1) << 40;

void encodeTcpFrameHeader(const TcpFrameHeader& header, uint8_t* out);
// Decodes the first kTcpFrameHeaderBytes of `data`. Returns "" and fills `out`, or says what is
// wrong (too short, bad magic, unknown type, non-zero padding, sequence number other than
// `expectedSeq`, a size over the limits). Never reads past `size`.
std::string decodeTcpFrameHeader(const uint8_t* data, size_t size, uint32_t expectedSeq,
                                 TcpFrameHeader& out);

}  // namespace hetra::comm
