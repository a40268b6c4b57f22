// The tcp transport's connection hello, sent by its bootstrap (tcp_bootstrap.cc) after the
// handshake and encoded with the frames (tcp_wire.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hetra::comm::tcp {

constexpr size_t kHelloBytes = 32;

// The hello after the handshake: magic (u32), version (u16), zero (u16), rank (u32), group size
// (u32), group id (16 bytes).
struct Hello {
  int rank = -1;
  int size = 0;
  std::string groupId;  // 16 bytes
};

std::vector<uint8_t> encodeHello(const Hello& hello);

// "" and `out` filled, or what is wrong with the bytes.
std::string decodeHello(const uint8_t* p, Hello& out);

}  // namespace hetra::comm::tcp
