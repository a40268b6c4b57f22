// Authentication of store and transport connections (common/auth), the tcp transport's frame
// decoder and its rate limit: the right secret connects; garbage, a wrong secret or silence are
// refused and logged while a real job of 3 ranks goes on.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "comm/algorithms/ring.h"
#include "comm/transport/tcp_transport.h"
#include "common/auth.h"
#include "common/errors.h"
#include "harness.h"
#include "store/store.h"
#include "store/tcp_store.h"

namespace hetra {
namespace {

using auth::AuthError;
using auth::AuthOptions;
using auth::JobSecret;
using auth::Role;
using test::runRanks;
using test::runRanksCollect;

JobSecret newSecret() {
  return JobSecret::fromHex(auth::generateJobSecret(), "test");
}

AuthOptions withSecret(const JobSecret& secret, Millis handshake = Millis(10000)) {
  AuthOptions options;
  options.secret = secret;
  options.handshakeTimeout = handshake;
  return options;
}

// Sets or clears an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A raw TCP connection to 127.0.0.1:port, as a stranger makes it.
int connectRaw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(uint16_t(port));
  HETRA_ENFORCE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "connect to ",
                port, ": ", std::strerror(errno));
  return fd;
}

// True when the other end closes `fd` within `timeout` (reading and dropping whatever it sends).
bool closedByPeer(int fd, Millis timeout) {
  const Deadline deadline = deadlineAfter(timeout);
  uint8_t buffer[256];
  while (Clock::now() < deadline) {
    timeval tv{0, 20000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return true;
  }
  return false;
}

// Reads what has arrived, without waiting: false once the peer has closed the connection.
bool stillOpen(int fd) {
  uint8_t buffer[256];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

void sendGarbage(int fd) {
  const std::string garbage = "GET / HTTP/1.1\r\nHost: hetra\r\n\r\n";
  ASSERT_GT(::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL), 0);
}

int portOf(const std::string& hostPort) {
  return std::stoi(hostPort.substr(hostPort.rfind(':') + 1));
}

// --- secrets ---

TEST(JobSecret, GeneratedSecretsAreLongHexAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 20; ++i) {
    const std::string secret = auth::generateJobSecret();
    EXPECT_EQ(secret.size(), 64u);
    EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos) << secret;
    seen.insert(secret);
    EXPECT_EQ(JobSecret::fromHex(secret, "test").bytes().size(), 32u);
  }
  EXPECT_EQ(seen.size(), 20u);
}

TEST(JobSecret, MalformedSecretsAreConfigErrors) {
  EXPECT_THROW(JobSecret::fromHex("abc", "test"), ConfigError);                 // short
  EXPECT_THROW(JobSecret::fromHex(std::string(63, 'a'), "test"), ConfigError);  // odd
  EXPECT_THROW(JobSecret::fromHex(std::string(64, 'g'), "test"), ConfigError);  // not hex
  EXPECT_NO_THROW(JobSecret::fromHex(std::string(64, 'A') + "\n", "test"));     // newline ok
}

TEST(JobSecret, FileMustBePrivate) {
  const std::string path =
      (std::filesystem::temp_directory_path() / str("hetra-secret-", getpid())).string();
  const std::string secret = auth::generateJobSecret();
  {
    std::ofstream out(path);
    out << secret << "\n";
  }
  ::chmod(path.c_str(), 0644);
  try {
    auth::readJobSecretFile(path);
    ADD_FAILURE() << "a world-readable secret file was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("0644"), std::string::npos) << what;
    EXPECT_NE(what.find("chmod 600"), std::string::npos) << what;
  }
  ::chmod(path.c_str(), 0640);
  EXPECT_THROW(auth::readJobSecretFile(path), ConfigError);
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(auth::readJobSecretFile(path).bytes(), JobSecret::fromHex(secret, "x").bytes());
  {
    ScopedEnv value("HETRA_JOB_SECRET", nullptr);
    ScopedEnv file("HETRA_JOB_SECRET_FILE", path.c_str());
    EXPECT_EQ(auth::jobSecretFromEnvironment().bytes(), JobSecret::fromHex(secret, "x").bytes());
  }
  {
    ScopedEnv value("HETRA_JOB_SECRET", secret.c_str());
    ScopedEnv file("HETRA_JOB_SECRET_FILE", path.c_str());
    EXPECT_THROW(auth::jobSecretFromEnvironment(), ConfigError);  // ambiguous
  }
  {
    ScopedEnv value("HETRA_JOB_SECRET", nullptr);
    ScopedEnv file("HETRA_JOB_SECRET_FILE", nullptr);
    EXPECT_TRUE(auth::jobSecretFromEnvironment().empty());  // no secret: no authentication
  }
  std::filesystem::remove(path);
  EXPECT_THROW(auth::readJobSecretFile(path), ConfigError);  // missing
}

// --- the handshake over a socket pair ---

struct HandshakeResult {
  std::exception_ptr client, server;
};

HandshakeResult handshakeOver(const JobSecret& clientSecret, const JobSecret& serverSecret,
                              const std::string& clientContext = "ctx",
                              const std::string& serverContext = "ctx") {
  int fds[2];
  HETRA_ENFORCE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "socketpair");
  HandshakeResult result;
  std::thread server([&] {
    try {
      auth::authenticate(fds[1], serverSecret, Role::Server, serverContext,
                         deadlineAfter(Millis(5000)), "client");
    } catch (...) {
      result.server = std::current_exception();
      ::shutdown(fds[1], SHUT_RDWR);
    }
  });
  try {
    auth::authenticate(fds[0], clientSecret, Role::Client, clientContext,
                       deadlineAfter(Millis(5000)), "server");
  } catch (...) {
    result.client = std::current_exception();
    ::shutdown(fds[0], SHUT_RDWR);
  }
  server.join();
  ::close(fds[0]);
  ::close(fds[1]);
  return result;
}

TEST(Handshake, SameSecretPassesOtherSecretOrContextFails) {
  const JobSecret secret = newSecret();
  auto ok = handshakeOver(secret, secret);
  EXPECT_FALSE(ok.client);
  EXPECT_FALSE(ok.server);

  auto wrong = handshakeOver(secret, newSecret());
  ASSERT_TRUE(wrong.client);
  ASSERT_TRUE(wrong.server);
  try {
    std::rethrow_exception(wrong.server);
  } catch (const AuthError& e) {
    EXPECT_NE(std::string(e.what()).find("does not know the job secret"), std::string::npos)
        << e.what();
  }
  // A proof made for the store does not pass on a transport connection.
  auto context = handshakeOver(secret, secret, "store", "transport");
  EXPECT_TRUE(context.client && context.server);
}

TEST(Handshake, GarbageAndSilenceAreRefusedWithinTheDeadline) {
  const JobSecret secret = newSecret();
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  sendGarbage(fds[0]);
  try {
    auth::authenticate(fds[1], secret, Role::Server, "ctx", deadlineAfter(Millis(5000)), "x");
    ADD_FAILURE() << "garbage passed the handshake";
  } catch (const AuthError& e) {
    // Refused for what it sent, not at the 5 s deadline.
    EXPECT_NE(std::string(e.what()).find("not a hetra handshake"), std::string::npos) << e.what();
  }
  ::close(fds[0]);
  ::close(fds[1]);

  // Silence: refused at the deadline (the only thing that can end it), not before.
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  const auto start = Clock::now();
  EXPECT_THROW(
      auth::authenticate(fds[1], secret, Role::Server, "ctx", deadlineAfter(Millis(300)), "x"),
      AuthError);
  EXPECT_GE(secondsSince(start), 0.29);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(Handshake, ReflectedHelloIsRefused) {
  // A peer that echoes our own hello (same role, same nonce) must not pass.
  const JobSecret secret = newSecret();
  auth::Handshake server(secret, Role::Server, "ctx");
  auto hello = server.takeOutput();
  EXPECT_THROW(server.feed(hello.data(), hello.size()), AuthError);
}

// --- the store ---

TEST(StoreAuth, RightSecretServesWrongSecretAndStrangersAreRefused) {
  const JobSecret secret = newSecret();
  store::TcpStoreServer server("127.0.0.1", 0, withSecret(secret, Millis(3000)));
  store::TcpStore good("127.0.0.1", server.port(), Millis(5000), withSecret(secret));
  good.setString("k", "v");

  testing::internal::CaptureStderr();
  EXPECT_THROW(store::TcpStore("127.0.0.1", server.port(), Millis(3000), withSecret(newSecret())),
               AuthError);
  // A client without any secret speaks the store protocol at once: refused, connection closed.
  {
    AuthOptions none;
    none.secret = JobSecret();
    store::TcpStore plain("127.0.0.1", server.port(), Millis(3000), none);
    EXPECT_THROW(plain.getString("k", deadlineAfter(Millis(500))), IoError);
  }
  const int garbage = connectRaw(server.port());
  sendGarbage(garbage);
  EXPECT_TRUE(closedByPeer(garbage, Millis(3000)));
  ::close(garbage);

  // A stranger that connects and says nothing stalls nobody: others are served while it is still
  // connected (its handshake pending), and it is dropped at its deadline.
  const int silent = connectRaw(server.port());
  store::TcpStore other("127.0.0.1", server.port(), Millis(5000), withSecret(secret));
  for (int i = 0; i < 50; ++i) other.setString(str("key", i), str(i));
  EXPECT_EQ(good.getString("key49", deadlineAfter(Millis(1000))), "49");
  EXPECT_TRUE(stillOpen(silent)) << "the silent stranger was dropped before the others were served";
  EXPECT_TRUE(closedByPeer(silent, Millis(10000)));
  ::close(silent);
  const std::string log = testing::internal::GetCapturedStderr();

  EXPECT_NE(log.find("does not know the job secret"), std::string::npos) << log;
  EXPECT_NE(log.find("not a hetra handshake"), std::string::npos) << log;
  EXPECT_NE(log.find("did not authenticate within 3000 ms"), std::string::npos) << log;
  EXPECT_NE(log.find("refused: "), std::string::npos) << log;
  EXPECT_NE(log.find("127.0.0.1:"), std::string::npos) << log;  // names the peer
  // The job's own clients were not disturbed.
  EXPECT_EQ(good.getString("k", deadlineAfter(Millis(1000))), "v");
}

TEST(StoreAuth, ConnectStoreUsesTheEnvironmentsSecret) {
  const std::string secret = auth::generateJobSecret();
  ScopedEnv file("HETRA_JOB_SECRET_FILE", nullptr);
  ScopedEnv value("HETRA_JOB_SECRET", secret.c_str());
  std::unique_ptr<store::TcpStoreServer> server;
  auto rank0 = store::connectStore("127.0.0.1:0", 0, Millis(5000), &server);
  auto rank1 =
      std::make_shared<store::TcpStore>("127.0.0.1", server->port(), Millis(5000));  // env secret
  rank1->setString("x", "1");
  EXPECT_EQ(rank0->getString("x", deadlineAfter(Millis(1000))), "1");
  EXPECT_THROW(store::TcpStore("127.0.0.1", server->port(), Millis(3000), withSecret(newSecret())),
               AuthError);
}

// --- the transport ---

// A real job of 3 ranks (a TcpStore server, one client per rank) runs allreduces while a stranger
// connects to the store port and to a transport port, sends garbage, then a wrong-secret
// handshake, then the right secret with a bogus hello. The job's results stay correct and every
// stranger is refused and logged.
TEST(TransportAuth, StrangersAreRefusedWhileTheJobRuns) {
  const JobSecret secret = newSecret();
  store::TcpStoreServer server("127.0.0.1", 0, withSecret(secret, Millis(500)));
  constexpr int kSize = 3;
  std::vector<std::unique_ptr<comm::Transport>> ranks(kSize);
  comm::TcpOptions options;
  options.timeout = Millis(20000);
  options.auth = withSecret(secret, Millis(500));
  runRanks(kSize, [&](int r) {
    auto client =
        std::make_shared<store::TcpStore>("127.0.0.1", server.port(), Millis(10000), options.auth);
    ranks[size_t(r)] = comm::createTcpTransport(
        std::make_shared<store::PrefixStore>("job/tcp", client), r, kSize, options);
  });
  store::TcpStore observer("127.0.0.1", server.port(), Millis(5000), withSecret(secret));
  const int transportPort =
      portOf(observer.getString("job/tcp/addr/1", deadlineAfter(Millis(1000))));

  testing::internal::CaptureStderr();
  std::atomic<bool> strangersDone{false};
  std::atomic<int> rounds{0};
  std::thread stranger([&] {
    for (int port : {server.port(), transportPort}) {
      const int garbage = connectRaw(port);
      sendGarbage(garbage);
      EXPECT_TRUE(closedByPeer(garbage, Millis(3000))) << "port " << port;
      ::close(garbage);

      const int wrong = connectRaw(port);
      EXPECT_THROW(auth::authenticate(wrong, newSecret(), Role::Client,
                                      port == server.port() ? "hetra-store" : "hetra-tcp-transport",
                                      deadlineAfter(Millis(3000)), "victim"),
                   AuthError);
      ::close(wrong);

      const int silent = connectRaw(port);
      EXPECT_TRUE(closedByPeer(silent, Millis(3000))) << "port " << port;
      ::close(silent);
    }
    // The right secret but not a member: a hello claiming a rank of the formed group.
    const int late = connectRaw(transportPort);
    auth::authenticate(late, secret, Role::Client, "hetra-tcp-transport",
                       deadlineAfter(Millis(3000)), "victim");
    std::vector<uint8_t> hello(32, 0);
    const uint8_t prefix[] = {'H', 'T', 'H', '1', 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0};
    std::copy(std::begin(prefix), std::end(prefix), hello.begin());
    ::send(late, hello.data(), hello.size(), MSG_NOSIGNAL);
    EXPECT_TRUE(closedByPeer(late, Millis(3000)));
    ::close(late);
    strangersDone = true;
  });
  constexpr size_t kCount = 10007;
  std::exception_ptr jobError;
  try {
    runRanks(kSize, [&](int r) {
      // The last element carries rank 0's "strangers are done" into the sum, so that every rank
      // stops after the same round.
      std::vector<float> data(kCount + 1);
      for (uint64_t seq = 0;; ++seq) {
        for (size_t i = 0; i < kCount; ++i) data[i] = float(r * 1000 + int(i % 113) + int(seq));
        data[kCount] = r == 0 && strangersDone.load() ? 1.0f : 0.0f;
        comm::AllreduceArgs args;
        args.in = args.out = data.data();
        args.count = kCount + 1;
        args.seq = seq;
        args.deadline = deadlineAfter(Millis(20000));
        comm::allreduceRing(*ranks[size_t(r)], args);
        for (size_t i = 0; i < kCount; i += 997)
          ASSERT_EQ(data[i], float(3000 + 3 * int(i % 113) + 3 * int(seq))) << "element " << i;
        if (r == 0) rounds.fetch_add(1);
        if (data[kCount] > 0 && seq >= 20) break;
      }
    });
  } catch (...) {
    jobError = std::current_exception();
  }
  stranger.join();
  const std::string log = testing::internal::GetCapturedStderr();
  if (jobError) {
    try {
      std::rethrow_exception(jobError);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the job failed: " << e.what() << "\nlog:\n" << log;
    }
  }
  EXPECT_GE(rounds.load(), 20);
  EXPECT_NE(log.find("store server: closing connection from 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("refused a connection from 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("does not know the job secret"), std::string::npos) << log;
  EXPECT_NE(log.find("not a hetra handshake"), std::string::npos) << log;
  EXPECT_NE(log.find("of another group"), std::string::npos) << log;
  EXPECT_NE(log.find("did not complete its handshake within 500 ms"), std::string::npos) << log;
}

TEST(TransportAuth, RankWithAnotherSecretCannotJoin) {
  auto shared =
      std::make_shared<store::PrefixStore>("other", std::make_shared<store::MemoryStore>());
  const JobSecret secret = newSecret();
  const JobSecret other = newSecret();
  auto errors = runRanksCollect(2, [&](int r) {
    comm::TcpOptions options;
    options.timeout = Millis(1500);
    options.auth = withSecret(r == 0 ? secret : other);
    comm::createTcpTransport(shared, r, 2, options);
  });
  ASSERT_TRUE(errors[0] && errors[1]);
  try {
    std::rethrow_exception(errors[1]);  // rank 1 connects to rank 0 and is refused
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  try {
    std::rethrow_exception(errors[0]);  // rank 0 waits for rank 1 in vain
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1"), std::string::npos) << e.what();
  }
}

// --- frame decoder ---

TEST(TcpFrame, EncodeDecodeRoundTrip) {
  comm::TcpFrameHeader in;
  in.type = comm::TcpFrameHeader::Type::Data;
  in.seq = 0x01020304;
  in.tag = 0x8000000000000007ull;
  in.bytes = 12345;
  uint8_t bytes[comm::kTcpFrameHeaderBytes];
  comm::encodeTcpFrameHeader(in, bytes);
  comm::TcpFrameHeader out;
  EXPECT_EQ(comm::decodeTcpFrameHeader(bytes, sizeof bytes, in.seq, out), "");
  EXPECT_EQ(out.seq, in.seq);
  EXPECT_EQ(out.tag, in.tag);
  EXPECT_EQ(out.bytes, in.bytes);
  EXPECT_EQ(out.type, in.type);

  auto problem = [&](auto mutate, uint32_t seq = 0x01020304) {
    uint8_t copy[comm::kTcpFrameHeaderBytes];
    std::memcpy(copy, bytes, sizeof copy);
    mutate(copy);
    comm::TcpFrameHeader ignored;
    return comm::decodeTcpFrameHeader(copy, sizeof copy, seq, ignored);
  };
  EXPECT_NE(problem([](uint8_t* b) { b[0] ^= 1; }).find("bad frame magic"), std::string::npos);
  EXPECT_NE(problem([](uint8_t* b) { b[4] = 9; }).find("unknown frame type"), std::string::npos);
  EXPECT_NE(problem([](uint8_t* b) { b[13] = 1; }).find("padding"), std::string::npos);
  EXPECT_NE(problem([](uint8_t*) {}, 7).find("frame 7 was due"), std::string::npos);
  EXPECT_NE(problem([](uint8_t* b) { b[31] = 0x80; }).find("exceeds"), std::string::npos);
  EXPECT_NE(problem([](uint8_t* b) {
              b[4] = 2;  // abort frame with a huge reason
              b[26] = 0x10;
            }).find("abort frame"),
            std::string::npos);
  comm::TcpFrameHeader ignored;
  EXPECT_NE(comm::decodeTcpFrameHeader(bytes, 31, in.seq, ignored).find("needs 32 bytes"),
            std::string::npos);
}

TEST(TcpFrame, RandomBytesAreRejectedNeverMisread) {
  std::mt19937_64 random(42);
  uint8_t valid[comm::kTcpFrameHeaderBytes];
  comm::TcpFrameHeader header;
  header.tag = 5;
  header.bytes = 77;
  comm::encodeTcpFrameHeader(header, valid);
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    uint8_t bytes[comm::kTcpFrameHeaderBytes + 8];
    if (i % 2) {
      for (auto& b : bytes) b = uint8_t(random());
    } else {
      // A valid header with a few random bit flips.
      std::memcpy(bytes, valid, sizeof valid);
      for (int flips = 1 + int(random() % 3); flips > 0; --flips)
        bytes[random() % sizeof valid] ^= uint8_t(1u << (random() % 8));
    }
    const size_t size = size_t(random() % (sizeof bytes + 1));
    comm::TcpFrameHeader out;
    const std::string problem = comm::decodeTcpFrameHeader(bytes, size, 0, out);
    if (problem.empty()) {
      ++accepted;
      // Only the tag and size fields may differ from a valid header.
      EXPECT_GE(size, comm::kTcpFrameHeaderBytes);
      EXPECT_LE(out.bytes, comm::kTcpMaxFrameBytes);
      EXPECT_EQ(std::memcmp(bytes, valid, 16), 0);
    }
  }
  EXPECT_GT(accepted, 0);  // flips in the tag or size fields decode
}

// --- rate limit ---

TEST(TcpRate, ParsesUnits) {
  EXPECT_EQ(comm::parseRate("0", "X"), 0u);
  EXPECT_EQ(comm::parseRate("125000000", "X"), 125000000u);
  EXPECT_EQ(comm::parseRate("125MB", "X"), 125000000u);
  EXPECT_EQ(comm::parseRate("1gbit", "X"), 125000000u);
  EXPECT_EQ(comm::parseRate("20MB/s", "X"), 20000000u);
  EXPECT_EQ(comm::parseRate("512KiB", "X"), 524288u);
  EXPECT_EQ(comm::parseRate("100mbit", "X"), 12500000u);
  EXPECT_EQ(comm::parseRate("1.5GB", "X"), 1500000000u);
  for (const char* bad : {"", "fast", "-1MB", "10XB", "5 parsecs", "1e30"})
    EXPECT_THROW(comm::parseRate(bad, "HETRA_TCP_RATE_LIMIT"), ConfigError) << bad;
  ScopedEnv env("HETRA_TCP_RATE_LIMIT", "2mbit");
  EXPECT_EQ(comm::TcpOptions{}.rateLimitBytesPerSecond, 250000u);
}

double timeTransfer(size_t bytes, uint64_t rate) {
  auto shared = std::make_shared<store::PrefixStore>(str("rate", rate),
                                                     std::make_shared<store::MemoryStore>());
  std::vector<std::unique_ptr<comm::Transport>> ranks(2);
  comm::TcpOptions options;
  options.rateLimitBytesPerSecond = rate;
  runRanks(2, [&](int r) { ranks[size_t(r)] = comm::createTcpTransport(shared, r, 2, options); });
  std::vector<uint8_t> out(bytes), in(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = uint8_t(i * 7 + 3);
  const auto start = Clock::now();
  runRanks(2, [&](int r) {
    if (r == 0)
      ranks[0]->isend(1, 3, out.data(), bytes)->wait(deadlineAfter(Millis(20000)));
    else
      ranks[1]->irecv(0, 3, in.data(), bytes)->wait(deadlineAfter(Millis(20000)));
  });
  const double seconds = secondsSince(start);
  EXPECT_TRUE(in == out);
  return seconds;
}

TEST(TcpRate, LimitSlowsTheSenderToTheRate) {
  const double limited = timeTransfer(4 << 20, 20000000);  // 4 MiB at 20 MB/s: ~0.2 s
  std::cout << "[   info   ] 4 MiB at 20 MB/s took " << limited << " s\n";
  EXPECT_GE(limited, 0.18);
  EXPECT_LT(limited, 1.0);
  const double unlimited = timeTransfer(4 << 20, 0);
  std::cout << "[   info   ] 4 MiB unlimited took " << unlimited << " s\n";
  EXPECT_LT(unlimited, limited);
}

}  // namespace
}  // namespace hetra
