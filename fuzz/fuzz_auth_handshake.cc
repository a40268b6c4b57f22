// The connection handshake (common/auth.h) fed arbitrary bytes as the peer's side, as a stranger
// would send them: it refuses with AuthError (never another exception, a crash or unbounded
// buffering) and never reports success without the secret.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/auth.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetra;
  static const auth::JobSecret secret = auth::JobSecret::fromHex(
      "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", "the fuzz target");
  for (auth::Role role : {auth::Role::Server, auth::Role::Client}) {
    auth::Handshake handshake(secret, role, "hetra-fuzz");
    (void)handshake.takeOutput();
    size_t at = 0;
    try {
      // Feed in the chunks the server's poll loop would read: at most wanted() at a time.
      while (at < size && !handshake.done()) {
        const size_t wanted = handshake.wanted();
        if (wanted == 0) break;
        const size_t chunk = std::min(wanted, size - at);
        const size_t used = handshake.feed(data + at, chunk);
        if (used == 0 || used > chunk) fuzz::fail("feed consumed an impossible number of bytes");
        at += used;
        (void)handshake.takeOutput();
      }
    } catch (const auth::AuthError&) {
      continue;
    }
    // Random bytes cannot hold an HMAC of our fresh nonce under the secret.
    if (handshake.done()) fuzz::fail("a stranger's bytes completed the handshake");
  }
  return 0;
}
