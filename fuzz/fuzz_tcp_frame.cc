// The tcp transport's frame header decoder on arbitrary bytes: it never reads past the input, and a
// header it accepts is within the limits and encodes back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "comm/transport/tcp_transport.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetra::comm;
  // The first 4 bytes choose the sequence number the decoder expects; the rest is the frame.
  uint32_t expected = 0;
  if (size >= 4) std::memcpy(&expected, data, 4);
  const uint8_t* frame = size >= 4 ? data + 4 : data;
  const size_t frameSize = size >= 4 ? size - 4 : size;
  TcpFrameHeader header;
  const std::string error = decodeTcpFrameHeader(frame, frameSize, expected, header);
  if (!error.empty()) return 0;
  if (frameSize < kTcpFrameHeaderBytes) hetra::fuzz::fail("accepted a short header");
  if (header.seq != expected) hetra::fuzz::fail("accepted an unexpected sequence number");
  if (header.type == TcpFrameHeader::Type::Data && header.bytes > kTcpMaxFrameBytes)
    hetra::fuzz::fail("accepted a data frame over the size limit");
  if (header.type == TcpFrameHeader::Type::Abort && header.bytes > kTcpMaxAbortBytes)
    hetra::fuzz::fail("accepted an abort frame over the size limit");
  uint8_t again[kTcpFrameHeaderBytes];
  encodeTcpFrameHeader(header, again);
  if (std::memcmp(again, frame, kTcpFrameHeaderBytes) != 0)
    hetra::fuzz::fail("an accepted header does not encode back to its bytes");
  return 0;
}
