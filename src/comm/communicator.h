// Communicator: a group of ranks and the collectives they run together.
//
// Every collective returns a Work handle at once; the operations of one communicator run in the
// order they were issued on its own progress thread, so a caller can overlap communication with
// compute (gradient buckets during backward). The first failure of an operation (a dead peer, a
// timeout, a mismatched call) is latched: every later operation of the group fails with the same
// error.
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "comm/algorithms/args.h"
#include "comm/codec/codec.h"
#include "comm/policy.h"
#include "comm/reduce.h"
#include "common/dtype.h"
#include "common/timing.h"
#include "store/store.h"

namespace hetra::comm {

class Transport;

struct GroupOptions {
  // "auto" picks shm when every rank of the group is on one host (same host identity), else tcp.
  std::string transport = "auto";
  // Deadline of each operation, counted from when it starts running.
  Millis timeout{30000};
  // Address the tcp transport listens on; "" uses HETRA_IFACE_ADDR or the loopback address.
  std::string listenAddress;
  // Providers forced per operation (providers/registry.h): "" follows HETRA_ALGO; "auto" forces
  // none, "ring" every operation that provider has, "allreduce:hierarchical,barrier:ring" some.
  std::string algorithm;
  // Islands for the hierarchical collectives (hierarchy.h): the island id of each rank, or empty to
  // group ranks by host identity and vendor.
  std::vector<int> islands;
  std::string vendor = "cpu";  // cpu, nvidia, amd: ranks of one host but different vendors
  // The cost model's links: "LATENCY,BANDWIDTH" inside islands and between them (such as
  // "5us,5GB/s"; comm::parseLinkCost), e.g. measured by `hetra probe --links`; "" follows
  // HETRA_ISLAND_LINK / HETRA_CROSS_LINK. A group on one host prices its messages as an island's.
  std::string islandLink;
  std::string crossLink;
};

class Work {
 public:
  virtual ~Work() = default;
  virtual bool isCompleted() const = 0;
  // Waits for completion and rethrows the operation's error. Throws TimeoutError if it has not
  // completed by `deadline` (the operation itself keeps running toward its own deadline).
  virtual void wait(Deadline deadline) = 0;
  // The same with a deadline of twice the group's timeout (GroupOptions::timeout), counted from
  // when the wait first finds nothing it can run itself.
  virtual void wait() = 0;
  virtual std::exception_ptr exception() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  // Creates a group of `size` ranks; every rank calls it with the same store (prefixed per job).
  static std::shared_ptr<Communicator> create(std::shared_ptr<store::Store> store, int rank,
                                              int size, const GroupOptions& options = {});
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* transportName() const = 0;
  virtual Transport& transport() = 0;

  // The options the group was created with.
  virtual const GroupOptions& groupOptions() const = 0;

  // Splits the group: ranks with the same color form a new group, ordered by (key, old rank). Every
  // rank of this group must call it. A negative color returns nullptr (the rank joins no group).
  // Islands given for every rank of this group (groupOptions()'s) are kept for the members.
  virtual std::shared_ptr<Communicator> split(int color, int key, const GroupOptions& options) = 0;

  // Each collective runs on the provider the table chooses for it (providers/registry.h). `policy`
  // is the operation's own: exact unless it asks for compression (policy.h).
  // out may equal in (in place).
  virtual WorkPtr allreduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                            const OpPolicy& policy = {}) = 0;
  // in holds sum(counts) elements; out receives counts[rank()] elements.
  virtual WorkPtr reduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                DType dtype, ReduceOp op, const OpPolicy& policy = {}) = 0;
  // in holds counts[rank()] elements; out receives sum(counts) elements in rank order.
  virtual WorkPtr allgather(const void* in, void* out, const std::vector<size_t>& counts,
                            DType dtype, const OpPolicy& policy = {}) = 0;
  virtual WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual WorkPtr barrier() = 0;
  // Point-to-point messages run in the group's order like collectives, and a send may complete only
  // once the peer has posted the matching receive (MPI_Ssend semantics): two ranks that both send
  // before they receive wait on each other. Order the exchange (lower rank sends first).
  // Tags are 64-bit like the transport's, below 2^63 (the tags above are the algorithms').
  virtual WorkPtr send(const void* buf, size_t count, DType dtype, int dst, uint64_t tag = 0) = 0;
  virtual WorkPtr recv(void* buf, size_t count, DType dtype, int src, uint64_t tag = 0) = 0;

  // The codec an allreduce or reduce-scatter (`kind`) of `count` elements (reduce-scatter: its
  // input) with this dtype, op and policy puts on the wire when its provider keeps error feedback
  // (policy.residual is used, count floats), or nullptr when it does not (exact, or compressed
  // only between islands). Alike on every rank; error feedback uses it to know exactly what the
  // wire will carry.
  virtual const Codec* feedbackCodec(OpKind kind, DType dtype, ReduceOp op, size_t count,
                                     const OpPolicy& policy) const = 0;

  // The provider the table chooses for an operation of this group (what would run; for tests,
  // benchmarks and logs). ConfigError as the operation itself would throw it.
  virtual std::string providerFor(OpKind kind, DType dtype, ReduceOp op, size_t count,
                                  const OpPolicy& policy = {}) const = 0;

  // Payload bytes this rank sent and received for this group since it was created (after
  // compression), its hierarchy's island and cross groups included.
  virtual uint64_t bytesSent() const = 0;
  virtual uint64_t bytesReceived() const = 0;

  // Fails the group on every reachable rank (see Transport::abort).
  virtual void abort(const std::string& reason) = 0;
};

// Identity of the host this process runs on: the hostname plus the kernel's boot id and IPC
// namespace, so two network-namespace "hosts" on one machine count as different hosts.
std::string hostIdentity();

}  // namespace hetra::comm
