// Authentication of the connections of one job: every store and transport connection proves that
// both ends know the job's secret before anything else crosses it.
//
// Vocabulary:
//   job secret - 32 random bytes (written as 64 hex characters) shared by every process of a job:
//                HETRA_JOB_SECRET, or a file named by HETRA_JOB_SECRET_FILE (mode 0600 or
//                stricter). The launcher (`hetra run`, `--np`) generates one per job. No secret
//                configured: authentication is off (logged once at info level), for tests and
//                ranks started by hand.
//   handshake  - mutual challenge-response, one round trip: each side sends a hello (magic,
//                version, role, a fresh 32-byte nonce), then a proof
//                HMAC-SHA256(secret, label || own role || own nonce || peer nonce || context).
//                The roles differ, so a proof cannot be reflected back at its sender; the nonces
//                are fresh, so it cannot be replayed; the context ("store", "tcp-transport")
//                keeps one protocol's proofs out of the other. Nothing is encrypted: this keeps
//                strangers out of a job, it does not hide its traffic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/timing.h"

namespace hetra::auth {

// A peer failed to authenticate (garbage, a wrong secret, silence past the deadline) or closed the
// connection during the handshake.
class AuthError : public IoError {
 public:
  using IoError::IoError;
};

class JobSecret {
 public:
  JobSecret() = default;  // empty: authentication off
  // From hex text (at least 32 hex digits = 16 bytes); `source` names where it came from in the
  // ConfigError thrown for malformed text.
  static JobSecret fromHex(const std::string& hex, const std::string& source);
  bool empty() const { return bytes_.empty(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// 32 bytes from the kernel's random source, as 64 lowercase hex characters.
std::string generateJobSecret();

// Reads a secret file; throws ConfigError when it cannot be read, is readable or writable by group
// or others, or does not hold a hex secret (trailing whitespace is ignored).
JobSecret readJobSecretFile(const std::string& path);

// HETRA_JOB_SECRET, else the file named by HETRA_JOB_SECRET_FILE, else an empty secret (logged once
// at info level). Both set is a ConfigError. Read at each call: tests change the environment.
JobSecret jobSecretFromEnvironment();

// How a store or transport endpoint authenticates its connections.
struct AuthOptions {
  std::optional<JobSecret> secret;  // nullopt: jobSecretFromEnvironment()
  // A peer must finish its handshake within this long (a silent stranger is dropped then).
  Millis handshakeTimeout{10000};

  JobSecret resolve() const { return secret ? *secret : jobSecretFromEnvironment(); }
};

enum class Role : uint8_t { Client = 1, Server = 2 };

// The handshake as a state machine without I/O, so that a blocking socket and a poll() server
// drive the same code. Usage: send takeOutput(); feed received bytes (at most wanted() at a time
// keeps bytes of the next protocol unread); after each feed send takeOutput() again; done() once
// the peer's proof checked out. feed throws AuthError on a malformed hello or a wrong proof.
class Handshake {
 public:
  static constexpr size_t kHelloBytes = 40;
  static constexpr size_t kProofBytes = 32;

  Handshake(const JobSecret& secret, Role role, std::string context);
  std::vector<uint8_t> takeOutput();
  size_t wanted() const;  // bytes still needed by the current step; 0 once done
  size_t feed(const uint8_t* data, size_t size);
  bool done() const { return state_ == State::Done; }

 private:
  enum class State { Hello, Proof, Done };
  std::vector<uint8_t> proof(Role role, const uint8_t* first, const uint8_t* second) const;

  std::vector<uint8_t> secret_;
  Role role_;
  std::string context_;
  State state_ = State::Hello;
  uint8_t nonce_[32];
  uint8_t peerNonce_[32] = {};
  std::vector<uint8_t> in_;   // the current step's bytes received so far
  std::vector<uint8_t> out_;  // bytes to send
};

// Runs the handshake over a connected socket (blocking or not), every read bounded by the step's
// size and by `deadline`. Throws AuthError naming `peer` (e.g. "127.0.0.1:5000") and the reason,
// TimeoutError-free: a deadline that passes is an AuthError too ("did not finish within").
void authenticate(int fd, const JobSecret& secret, Role role, const std::string& context,
                  Deadline deadline, const std::string& peer);

}  // namespace hetra::auth
