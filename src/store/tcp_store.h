// TcpStore: hetra's built-in rendezvous store over TCP. One TcpStoreServer (started by the
// launcher, or by rank 0 in-process) holds the keys; every rank talks to it through a TcpStore
// client.
//
// Vocabulary:
//   frame   - magic (u32) + payload length (u32) + payload, all integers little-endian. Payloads
//   over
//             64 MiB or a wrong magic mean a confused or hostile peer: the server closes that
//             connection.
//   request - one frame from a client (an opcode and its fields); reply - one frame back (a status
//   and
//             its fields). A client has at most one request in flight.
//   waiter  - a get/wait request parked on the server until its keys exist or its deadline passes.
//             Parking never blocks the server's poll() loop, so one slow rank cannot stall the
//             others.
//   handshake - with a job secret (common/auth.h), every connection first proves it knows the
//             secret; the server runs each handshake as a state of that connection, so a
//             stranger that sends nothing stalls nobody and is dropped after its handshake
//             timeout. A connection that fails it is logged (WARN, with its address) and closed.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/auth.h"
#include "store/store.h"

namespace hetra::store {

namespace wire {
enum class Op : uint8_t;  // tcp_store_wire.h
}

class TcpStoreServer {
 public:
  // Binds host:port and serves on a background thread until destroyed. Port 0 picks a free port
  // (see port()); host "", "*" or "0.0.0.0" binds every IPv4 interface. Throws IoError naming
  // host:port when the address cannot be bound. `auth` decides whether connections must prove
  // the job secret (by default: when the environment names one).
  TcpStoreServer(const std::string& host, int port, const auth::AuthOptions& auth = {});
  // Stops the thread and closes every connection: clients then get IoError.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;
  const std::string& host() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A client of a TcpStoreServer; safe to share between threads (one request at a time).
// get/wait carry the time left until their deadline to the server, which answers "timed out" at the
// deadline; the client also enforces it locally (plus a small grace), so a silent server cannot
// hang it. A server that goes away gives IoError on the pending call and on every later call.
class TcpStore : public Store {
 public:
  // Connects, retrying until `timeout` (the server may start later), else TimeoutError naming
  // host:port. `timeout` also bounds the calls that take none (set, add, compareSet, check,
  // deleteKey). With a job secret (`auth`, by default the environment's), the connection is
  // authenticated first; a server that refuses it gives auth::AuthError (not retried).
  TcpStore(std::string host, int port, Millis timeout = kDefaultTimeout,
           const auth::AuthOptions& auth = {});
  ~TcpStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Deadline deadline = deadlineAfter(kDefaultTimeout)) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys,
            Deadline deadline = deadlineAfter(kDefaultTimeout)) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;

  // Keeps `server` alive as long as this client (connectStore's rank 0 without serverOut).
  void adoptServer(std::unique_ptr<TcpStoreServer> server) { ownedServer_ = std::move(server); }
  std::string address() const;  // "host:port"

 private:
  // Sends one request (opcode `op`, then `fields`) and returns the body of its reply. A get or
  // wait passes its deadline: the request then carries the milliseconds left until it, read as the
  // request is sent, and the reply is awaited until the deadline plus a grace. Other requests
  // await their reply for the store's timeout.
  Bytes request(wire::Op op, const Bytes& fields, std::optional<Deadline> waitDeadline,
                const char* what, const std::vector<std::string>& keys);
  void connectUntil(Deadline deadline);
  void closeSocket();

  // Declared first so that it is destroyed last: this client disconnects before its server stops.
  std::unique_ptr<TcpStoreServer> ownedServer_;
  std::string host_;
  int port_;
  Millis timeout_;
  std::mutex mutex_;
  int fd_ = -1;
  std::string broken_;  // set once the server closed the connection: later calls fail fast
  auth::JobSecret secret_;
  Millis handshakeTimeout_;
};

struct HostPort {
  std::string host;
  int port = 0;
};

// Parses "host:port" or "[ipv6]:port"; throws ConfigError naming the value when malformed.
HostPort parseHostPort(const std::string& hostPort);

// Rendezvous for a rank: parses `hostPort` ("host:port", ConfigError when malformed). Rank 0 starts
// a TcpStoreServer bound to host:port and connects a client to it; other ranks connect a client,
// retrying until `timeout` while rank 0 comes up. The server lives in *serverOut when given (the
// caller must keep it alive until every rank is done with the store); with serverOut == nullptr the
// returned client owns it. Rank 0 binding "0.0.0.0" or "*" connects its own client via 127.0.0.1.
// `auth` applies to both the server and the clients.
std::shared_ptr<Store> connectStore(const std::string& hostPort, int rank, Millis timeout,
                                    std::unique_ptr<TcpStoreServer>* serverOut = nullptr,
                                    const auth::AuthOptions& auth = {});

}  // namespace hetra::store
