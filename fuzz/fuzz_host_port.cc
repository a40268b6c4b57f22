// parseHostPort on arbitrary text: only ConfigError; an accepted address has a port in 0..65535 and
// a non-empty host.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/errors.h"
#include "fuzz_common.h"
#include "store/tcp_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetra;
  const std::string text(reinterpret_cast<const char*>(data), size);
  store::HostPort address;
  try {
    address = store::parseHostPort(text);
  } catch (const ConfigError&) {
    return 0;
  }
  if (address.port < 0 || address.port > 65535)
    fuzz::fail("port " + std::to_string(address.port) + " accepted from '" + text + "'");
  if (address.host.empty()) fuzz::fail("empty host accepted from '" + text + "'");
  return 0;
}
