// The store server's frame and request decoder, reached through its only public door: bytes sent
// over a TCP connection to a TcpStoreServer on 127.0.0.1 (the decoder is internal to
// tcp_store.cc). Each input is one connection: the bytes are sent, the sending side is shut, the
// replies are read until the server closes or 200 ms pass. The server must survive every input
// (ASan/UBSan watch its thread) and still serve a well-formed client afterwards.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "common/auth.h"
#include "common/errors.h"
#include "fuzz_common.h"
#include "store/tcp_store.h"

namespace {

using namespace hetra;

store::TcpStoreServer& server() {
  static auto* s = [] {
    auth::AuthOptions noAuth;
    noAuth.secret = auth::JobSecret();  // frames reach the decoder without a handshake
    return new store::TcpStoreServer("127.0.0.1", 0, noAuth);
  }();
  return *s;
}

int connectToServer() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fuzz::fail("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(server().port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    // libFuzzer's once-a-second SIGALRM may interrupt connect(); the connection then completes
    // in the background, and SO_ERROR tells how it ended.
    if (errno != EINTR)
      fuzz::fail(std::string("cannot connect to the store server: ") + std::strerror(errno));
    pollfd p{fd, POLLOUT, 0};
    while (::poll(&p, 1, 5000) < 0 && errno == EINTR) {
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0)
      fuzz::fail(std::string("cannot connect to the store server: ") + std::strerror(err));
  }
  // Closed with a reset, not a FIN: tens of thousands of inputs would otherwise leave as many
  // sockets in TIME_WAIT and run out of local ports.
  const linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = connectToServer();
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed the connection on a bad frame
    sent += size_t(n);
  }
  ::shutdown(fd, SHUT_WR);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  char buffer[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, int(left)) <= 0) break;
    if (::recv(fd, buffer, sizeof buffer, 0) <= 0) break;
  }
  ::close(fd);

  // The server still answers a real client (a decoder bug that kills its loop would show here).
  static int round = 0;
  if (++round % 64 == 0) {
    try {
      auth::AuthOptions noAuth;
      noAuth.secret = auth::JobSecret();
      store::TcpStore client("127.0.0.1", server().port(), Millis(5000), noAuth);
      client.set("fuzz-alive", {1, 2, 3});
      if (client.get("fuzz-alive", deadlineAfter(Millis(5000))) != store::Bytes{1, 2, 3})
        fuzz::fail("the store server answers wrongly after fuzzed input");
    } catch (const Error& e) {
      fuzz::fail(std::string("the store server stopped serving: ") + e.what());
    }
  }
  return 0;
}
