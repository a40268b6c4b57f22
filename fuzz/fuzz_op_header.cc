// checkHeaders on two arbitrary 32-byte OpHeaders: equal headers pass, different ones throw
// MismatchError (nothing else), and describe() of any header, whatever its kind, dtype or op byte,
// does not crash.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "comm/algorithms/args.h"
#include "common/errors.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetra;
  comm::OpHeader headers[2];
  uint8_t bytes[2 * sizeof(comm::OpHeader)] = {};
  std::memcpy(bytes, data, size < sizeof bytes ? size : sizeof bytes);
  std::memcpy(&headers[0], bytes, sizeof(comm::OpHeader));
  // A short input compares a header with itself (the common case on the wire).
  std::memcpy(&headers[1], size > sizeof(comm::OpHeader) ? bytes + sizeof(comm::OpHeader) : bytes,
              sizeof(comm::OpHeader));
  (void)headers[0].describe();
  (void)headers[1].describe();
  const bool equal = headers[0] == headers[1];
  try {
    comm::checkHeaders(headers[0], 0, headers[1], 1);
    if (!equal) fuzz::fail("different headers passed checkHeaders");
  } catch (const MismatchError& e) {
    if (equal) fuzz::fail(std::string("equal headers raised MismatchError: ") + e.what());
    if (std::string(e.what()).empty()) fuzz::fail("MismatchError without a message");
  }
  return 0;
}
