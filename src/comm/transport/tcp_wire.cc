// The tcp transport's wire format: the frame header and the connection hello (both
// little-endian, fixed size).
#include <algorithm>
#include <climits>
#include <cstring>

#include "comm/transport/tcp_transport.h"
#include "comm/transport/tcp_wire.h"
#include "common/bytes.h"
#include "common/errors.h"

namespace hetra::comm {

namespace tcp {
namespace {

constexpr uint32_t kFrameMagic = 0x31465448;  // "HTF1" on the wire
constexpr uint32_t kHelloMagic = 0x31485448;  // "HTH1"
constexpr uint16_t kHelloVersion = 1;

}  // namespace

std::vector<uint8_t> encodeHello(const Hello& hello) {
  std::vector<uint8_t> out(kHelloBytes, 0);
  storeU32(out.data(), kHelloMagic);
  storeU16(out.data() + 4, kHelloVersion);
  storeU32(out.data() + 8, uint32_t(hello.rank));
  storeU32(out.data() + 12, uint32_t(hello.size));
  std::memcpy(out.data() + 16, hello.groupId.data(), std::min<size_t>(16, hello.groupId.size()));
  return out;
}

std::string decodeHello(const uint8_t* p, Hello& out) {
  if (loadU32(p) != kHelloMagic) return str("sent a bad hello (word 0x", std::hex, loadU32(p), ")");
  if (loadU16(p + 4) != kHelloVersion)
    return str("speaks transport version ", loadU16(p + 4), ", this process ", kHelloVersion);
  if (loadU16(p + 6) != 0) return "sent a hello with non-zero padding";
  const uint32_t rank = loadU32(p + 8);
  const uint32_t size = loadU32(p + 12);
  if (rank > uint32_t(INT_MAX) || size > uint32_t(INT_MAX) || rank >= size)
    return str("sent a hello for rank ", rank, " of ", size);
  out.rank = int(rank);
  out.size = int(size);
  out.groupId.assign(reinterpret_cast<const char*>(p + 16), 16);
  return "";
}

}  // namespace tcp

using tcp::kFrameMagic;

void encodeTcpFrameHeader(const TcpFrameHeader& header, uint8_t* out) {
  std::memset(out, 0, kTcpFrameHeaderBytes);
  storeU32(out, kFrameMagic);
  storeU16(out + 4, uint16_t(header.type));
  storeU32(out + 8, header.seq);
  storeU64(out + 16, header.tag);
  storeU64(out + 24, header.bytes);
}

std::string decodeTcpFrameHeader(const uint8_t* data, size_t size, uint32_t expectedSeq,
                                 TcpFrameHeader& out) {
  if (size < kTcpFrameHeaderBytes)
    return str("a frame header needs ", kTcpFrameHeaderBytes, " bytes, got ", size);
  const uint32_t magic = loadU32(data);
  if (magic != kFrameMagic)
    return str("bad frame magic 0x", std::hex, magic, " (a corrupt stream or not a hetra peer)");
  const uint16_t type = loadU16(data + 4);
  if (type < uint16_t(TcpFrameHeader::Type::Data) || type > uint16_t(TcpFrameHeader::Type::Close))
    return str("unknown frame type ", type);
  if (loadU16(data + 6) != 0 || loadU32(data + 12) != 0)
    return "non-zero padding in a frame header";
  const uint32_t seq = loadU32(data + 8);
  if (seq != expectedSeq)
    return str("frame ", seq, " arrived where frame ", expectedSeq,
               " was due (frames lost or reordered)");
  const uint64_t bytes = loadU64(data + 24);
  const auto kind = TcpFrameHeader::Type(type);
  if (kind == TcpFrameHeader::Type::Abort && bytes > kTcpMaxAbortBytes)
    return str("abort frame of ", bytes, " bytes exceeds ", kTcpMaxAbortBytes);
  if (kind == TcpFrameHeader::Type::Close && bytes != 0)
    return str("close frame with ", bytes, " payload bytes");
  if (bytes > kTcpMaxFrameBytes)
    return str("frame of ", bytes, " bytes exceeds ", kTcpMaxFrameBytes);
  out.type = kind;
  out.seq = seq;
  out.tag = loadU64(data + 16);
  out.bytes = bytes;
  return "";
}

}  // namespace hetra::comm
