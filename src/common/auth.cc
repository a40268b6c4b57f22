#include "common/auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "common/logging.h"
#include "common/params.h"

namespace hetra::auth {
namespace {

const Param kSecret("HETRA_JOB_SECRET", "",
                    "The job's secret (hex); every store and transport connection proves it "
                    "knows it. Set by the launcher; empty: no authentication.");
const Param kSecretFile(
    "HETRA_JOB_SECRET_FILE", "",
    "A file (mode 0600) holding the job's secret, instead of HETRA_JOB_SECRET.");

constexpr uint32_t kMagic = 0x31414854;  // "THA1" on the wire (little-endian)
constexpr uint8_t kVersion = 1;
constexpr size_t kSecretBytes = 32;
constexpr size_t kMinSecretBytes = 16;
constexpr const char* kLabel = "hetra-auth-v1";

void randomBytes(uint8_t* out, size_t size) {
  if (RAND_bytes(out, int(size)) == 1) return;
  // OpenSSL's generator failed to seed: ask the kernel directly.
  size_t got = 0;
  while (got < size) {
    const ssize_t n = getrandom(out + got, size - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw IoError(str("no random bytes for the job secret: ", std::strerror(errno)));
    got += size_t(n);
  }
}

std::string hex(const uint8_t* data, size_t size) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

uint32_t loadU32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

const char* roleName(Role role) {
  return role == Role::Client ? "client" : "server";
}

}  // namespace

JobSecret JobSecret::fromHex(const std::string& text, const std::string& source) {
  std::string hexText = text;
  while (!hexText.empty() && std::isspace(static_cast<unsigned char>(hexText.back())))
    hexText.pop_back();
  if (hexText.size() % 2 != 0 || hexText.size() < 2 * kMinSecretBytes)
    throw ConfigError(str(source, ": the job secret must be at least ", 2 * kMinSecretBytes,
                          " hex digits (an even number), got ", hexText.size(),
                          " characters; `hetra` generates one per job"));
  JobSecret secret;
  for (size_t i = 0; i < hexText.size(); i += 2) {
    const int high = hexDigit(hexText[i]);
    const int low = hexDigit(hexText[i + 1]);
    if (high < 0 || low < 0)
      throw ConfigError(str(source, ": the job secret is not hex (character ",
                            i + (high < 0 ? 0 : 1), " is not 0-9 or a-f)"));
    secret.bytes_.push_back(uint8_t(high << 4 | low));
  }
  return secret;
}

std::string generateJobSecret() {
  uint8_t bytes[kSecretBytes];
  randomBytes(bytes, sizeof bytes);
  return hex(bytes, sizeof bytes);
}

JobSecret readJobSecretFile(const std::string& path) {
  const std::string source = str("HETRA_JOB_SECRET_FILE=", path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw ConfigError(str(source, ": cannot read the job secret file: ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw ConfigError(str(source, ": not a regular file"));
  // Anyone who can read the file can join the job; anyone who can write it can lock the job out.
  if (st.st_mode & 077)
    throw ConfigError(str(source, ": the job secret file is accessible to group or others (mode 0",
                          std::oct, (st.st_mode & 0777), std::dec, "); run chmod 600 on it"));
  std::ifstream in(path);
  if (!in) throw ConfigError(str(source, ": cannot open the job secret file"));
  std::stringstream text;
  text << in.rdbuf();
  return JobSecret::fromHex(text.str(), source);
}

JobSecret jobSecretFromEnvironment() {
  const std::string value = kSecret.str();
  const std::string file = kSecretFile.str();
  if (!value.empty() && !file.empty())
    throw ConfigError(
        "both HETRA_JOB_SECRET and HETRA_JOB_SECRET_FILE are set; set only one of them");
  if (!value.empty()) return JobSecret::fromHex(value, "HETRA_JOB_SECRET");
  if (!file.empty()) return readJobSecretFile(file);
  static std::once_flag once;
  std::call_once(once, [] {
    HETRA_INFO("auth",
               "no job secret configured (HETRA_JOB_SECRET, HETRA_JOB_SECRET_FILE): store and "
               "transport connections are not authenticated");
  });
  return {};
}

// --- Handshake ---
// Hello: magic (u32), version (u8), role (u8), two zero bytes, nonce (32 bytes). Proof: 32 bytes.

Handshake::Handshake(const JobSecret& secret, Role role, std::string context)
    : secret_(secret.bytes()), role_(role), context_(std::move(context)) {
  HETRA_ENFORCE(!secret.empty(), "a handshake needs a job secret");
  randomBytes(nonce_, sizeof nonce_);
  out_ = {uint8_t(kMagic),
          uint8_t(kMagic >> 8),
          uint8_t(kMagic >> 16),
          uint8_t(kMagic >> 24),
          kVersion,
          uint8_t(role),
          0,
          0};
  out_.insert(out_.end(), nonce_, nonce_ + sizeof nonce_);
}

std::vector<uint8_t> Handshake::takeOutput() {
  return std::move(out_);
}

size_t Handshake::wanted() const {
  switch (state_) {
    case State::Hello:
      return kHelloBytes - in_.size();
    case State::Proof:
      return kProofBytes - in_.size();
    case State::Done:
      return 0;
  }
  return 0;
}

std::vector<uint8_t> Handshake::proof(Role role, const uint8_t* first,
                                      const uint8_t* second) const {
  std::vector<uint8_t> message(kLabel, kLabel + std::strlen(kLabel));
  message.push_back(uint8_t(role));
  message.insert(message.end(), first, first + 32);
  message.insert(message.end(), second, second + 32);
  message.insert(message.end(), context_.begin(), context_.end());
  std::vector<uint8_t> mac(EVP_MAX_MD_SIZE);
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), secret_.data(), int(secret_.size()), message.data(), message.size(),
            mac.data(), &length) ||
      length != kProofBytes)
    throw IoError("HMAC-SHA256 failed in the authentication handshake");
  mac.resize(length);
  return mac;
}

size_t Handshake::feed(const uint8_t* data, size_t size) {
  size_t used = 0;
  while (used < size && state_ != State::Done) {
    const size_t take = std::min(wanted(), size - used);
    in_.insert(in_.end(), data + used, data + used + take);
    used += take;
    if (state_ == State::Hello && in_.size() >= 4 && loadU32(in_.data()) != kMagic)
      throw AuthError(str("sent bytes that are not a hetra handshake (first word 0x", std::hex,
                          loadU32(in_.data()), ")"));
    if (wanted() != 0) break;
    if (state_ == State::Hello) {
      if (in_[4] != kVersion)
        throw AuthError(
            str("speaks handshake version ", int(in_[4]), ", this process ", int(kVersion)));
      const Role expected = role_ == Role::Client ? Role::Server : Role::Client;
      if (in_[5] != uint8_t(expected) || in_[6] != 0 || in_[7] != 0)
        throw AuthError(str("sent a hello with role ", int(in_[5]), " (expected the ",
                            roleName(expected), " role)"));
      std::memcpy(peerNonce_, in_.data() + 8, sizeof peerNonce_);
      if (CRYPTO_memcmp(peerNonce_, nonce_, sizeof nonce_) == 0)
        throw AuthError("echoed this process's own nonce (a reflection attempt)");
      const auto mine = proof(role_, nonce_, peerNonce_);
      out_.insert(out_.end(), mine.begin(), mine.end());
      state_ = State::Proof;
    } else {
      const Role peerRole = role_ == Role::Client ? Role::Server : Role::Client;
      const auto expected = proof(peerRole, peerNonce_, nonce_);
      if (CRYPTO_memcmp(expected.data(), in_.data(), kProofBytes) != 0)
        throw AuthError("does not know the job secret (its proof does not match)");
      state_ = State::Done;
    }
    in_.clear();
  }
  return used;
}

void authenticate(int fd, const JobSecret& secret, Role role, const std::string& context,
                  Deadline deadline, const std::string& peer) {
  Handshake handshake(secret, role, context);
  auto failed = [&](const std::string& why) {
    return AuthError(str("authentication with ", peer, " failed: the peer ", why));
  };
  auto waitFor = [&](short events) {
    for (;;) {
      const auto left = std::chrono::ceil<Millis>(deadline - Clock::now()).count();
      if (left <= 0) throw failed("did not finish the handshake in time");
      pollfd p{fd, events, 0};
      const int ready = ::poll(&p, 1, int(std::min<int64_t>(left, INT_MAX)));
      if (ready > 0) return;
      if (ready < 0 && errno != EINTR) throw failed(str("poll: ", std::strerror(errno)));
    }
  };
  auto sendAll = [&](const std::vector<uint8_t>& bytes) {
    for (size_t sent = 0; sent < bytes.size();) {
      const ssize_t n =
          ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0)
        sent += size_t(n);
      else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        waitFor(POLLOUT);
      else if (n < 0 && errno != EINTR)
        throw failed(str("could not be written to: ", std::strerror(errno)));
    }
  };
  sendAll(handshake.takeOutput());
  uint8_t buffer[Handshake::kHelloBytes];
  while (!handshake.done()) {
    const ssize_t n = ::recv(fd, buffer, handshake.wanted(), MSG_DONTWAIT);
    if (n > 0) {
      try {
        handshake.feed(buffer, size_t(n));
      } catch (const AuthError& e) {
        throw failed(e.what());  // names the peer
      }
      sendAll(handshake.takeOutput());
    } else if (n == 0) {
      throw failed("closed the connection during the handshake (does it have this job's secret?)");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      waitFor(POLLIN);
    } else if (errno != EINTR) {
      throw failed(str("could not be read from: ", std::strerror(errno)));
    }
  }
}

}  // namespace hetra::auth
