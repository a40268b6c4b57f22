// The communicator on raw buffers: a buffer is (address, element count, dtype), as the caller's
// framework lays it out (hetra.torch passes tensor.data_ptr()). Every collective returns a Work at
// once; the caller keeps the buffers alive and unchanged until it completes, which the Work helps
// with by holding `keep` (the tensors) until it is waited for or dropped.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "bindings.h"
#include "comm/codec/codec.h"
#include "comm/communicator.h"
#include "comm/policy.h"
#include "comm/reduce.h"
#include "common/dtype.h"
#include "common/errors.h"

namespace py = pybind11;

namespace hetra::python {
namespace {

using comm::Communicator;
using CommunicatorPtr = std::shared_ptr<Communicator>;

struct PyWork {
  comm::WorkPtr work;
  py::object keep;  // whatever owns the buffers (released with the GIL held, by Python)

  PyWork(comm::WorkPtr w, py::object k) : work(std::move(w)), keep(std::move(k)) {}
  PyWork(PyWork&&) = default;
  PyWork& operator=(PyWork&&) = default;
  // A Work dropped before its operation ended still owns the buffers the operation reads and
  // writes: they are released only once it ended (at most its deadline). Its error, if any, stays
  // latched in the group: the next operation raises it.
  ~PyWork() {
    if (!work || keep.is_none() || work->isCompleted()) return;
    py::gil_scoped_release release;
    try {
      work->wait();
    } catch (const std::exception&) {
    }
  }

  void wait(std::optional<double> timeout) {
    {
      py::gil_scoped_release release;
      if (timeout)
        work->wait(deadlineAfter(millisFromSeconds(*timeout, "timeout")));
      else
        work->wait();
    }
    keep = py::none();
  }
};

// The operation's compression: "none" (exact), or a codec name (fp16, bf16, fp8-e4m3, fp8-e5m2)
// that applies where policy.h allows it (float32 sums, averages and gathers above min_bytes).
comm::OpPolicy policyFor(const std::string& compression, size_t block, size_t minBytes,
                         uintptr_t residual) {
  comm::OpPolicy policy;
  const comm::Compression kind = comm::parseCompression(compression);
  if (kind != comm::Compression::None)
    policy.compression = comm::CompressionPolicy(kind, block, minBytes);
  policy.residual = reinterpret_cast<float*>(residual);
  return policy;
}

PyWork started(comm::WorkPtr work, py::object keep) {
  return PyWork(std::move(work), std::move(keep));
}

// The elements of a gather or scatter over all ranks: one count per rank.
size_t totalOf(const Communicator& c, const std::vector<size_t>& counts) {
  if (int(counts.size()) != c.size())
    throw ConfigError(
        str("counts has ", counts.size(), " entries; allowed: one per rank (", c.size(), ")"));
  size_t total = 0;
  for (size_t n : counts) total += n;
  return total;
}

}  // namespace

void bindComm(py::module_& module) {
  module.def("dtype_size", [](const std::string& name) { return dtypeSize(parseDType(name)); });

  py::class_<PyWork>(module, "Work", "An operation in flight.")
      .def("is_completed", [](const PyWork& w) { return w.work->isCompleted(); })
      .def("wait", &PyWork::wait, py::arg("timeout") = py::none(),
           "Waits (GIL released) and raises the operation's error; TimeoutError after `timeout` "
           "seconds (default: the group's timeout).")
      .def("exception", [](const PyWork& w) -> std::optional<std::string> {
        // The error as text, for a poll loop; wait() raises it typed.
        if (auto error = w.work->exception()) {
          try {
            std::rethrow_exception(error);
          } catch (const std::exception& e) {
            return std::string(e.what());
          }
        }
        return std::nullopt;
      });

  py::class_<Communicator, CommunicatorPtr>(module, "Communicator",
                                            "A group of ranks and the collectives they run.")
      .def(py::init([](std::shared_ptr<store::Store> store, int rank, int size,
                       const std::string& transport, double timeout, const std::string& algorithm,
                       const std::string& listenAddress) {
             comm::GroupOptions options;
             options.transport = transport;
             options.timeout = millisFromSeconds(timeout, "timeout");
             options.algorithm = algorithm;
             options.listenAddress = listenAddress;
             py::gil_scoped_release release;
             return Communicator::create(std::move(store), rank, size, options);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("transport") = "auto",
           py::arg("timeout") = 30.0, py::arg("algorithm") = "", py::arg("listen_address") = "",
           "Every rank of the group calls it with the same store; `timeout` is each operation's "
           "deadline in seconds.")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("transport_name", &Communicator::transportName)
      .def_property_readonly("bytes_sent", &Communicator::bytesSent)
      .def_property_readonly("bytes_received", &Communicator::bytesReceived)
      .def(
          "allreduce",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t count, const std::string& dtype,
             const std::string& op, const std::string& compression, size_t block, size_t minBytes,
             uintptr_t residual, double scale, py::object keep) {
            comm::OpPolicy policy = policyFor(compression, block, minBytes, residual);
            policy.inputScale = scale;
            return started(
                c.allreduce(address<const void>(in, count, "in"), address<void>(out, count, "out"),
                            count, parseDType(dtype), comm::parseReduceOp(op), policy),
                keep);
          },
          py::arg("inp"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op") = "sum",
          py::arg("compression") = "none", py::arg("block") = 256, py::arg("min_bytes") = 65536,
          py::arg("residual") = 0, py::arg("scale") = 1.0, py::arg("keep") = py::none(),
          "out may equal inp. `residual`: the address of `count` float32 of error feedback state "
          "for a compressed float32 allreduce (0: none). `scale`: this rank's input is multiplied "
          "by it before the sum (a premultiplied sum; float32/float64 sum or avg), by the "
          "communicator's thread.")
      .def(
          "reduce_scatter",
          [](Communicator& c, uintptr_t in, uintptr_t out, const std::vector<size_t>& counts,
             const std::string& dtype, const std::string& op, py::object keep) {
            const size_t total = totalOf(c, counts);
            return started(c.reduceScatter(address<const void>(in, total, "in"),
                                           address<void>(out, counts[size_t(c.rank())], "out"),
                                           counts, parseDType(dtype), comm::parseReduceOp(op)),
                           keep);
          },
          py::arg("inp"), py::arg("out"), py::arg("counts"), py::arg("dtype"),
          py::arg("op") = "sum", py::arg("keep") = py::none(),
          "inp holds sum(counts) elements; out receives counts[rank].")
      .def(
          "allgather",
          [](Communicator& c, uintptr_t in, uintptr_t out, const std::vector<size_t>& counts,
             const std::string& dtype, py::object keep) {
            const size_t total = totalOf(c, counts);
            return started(c.allgather(address<const void>(in, counts[size_t(c.rank())], "in"),
                                       address<void>(out, total, "out"), counts, parseDType(dtype)),
                           keep);
          },
          py::arg("inp"), py::arg("out"), py::arg("counts"), py::arg("dtype"),
          py::arg("keep") = py::none(),
          "inp holds counts[rank] elements; out receives sum(counts) in rank order.")
      .def(
          "broadcast",
          [](Communicator& c, uintptr_t buf, size_t count, const std::string& dtype, int root,
             py::object keep) {
            return started(
                c.broadcast(address<void>(buf, count, "buf"), count, parseDType(dtype), root),
                keep);
          },
          py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("root") = 0,
          py::arg("keep") = py::none())
      .def("barrier", [](Communicator& c) { return started(c.barrier(), py::none()); })
      .def(
          "send",
          [](Communicator& c, uintptr_t buf, size_t count, const std::string& dtype, int dst,
             uint64_t tag, py::object keep) {
            return started(
                c.send(address<const void>(buf, count, "buf"), count, parseDType(dtype), dst, tag),
                keep);
          },
          py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("dst"), py::arg("tag") = 0,
          py::arg("keep") = py::none(),
          "Completes once the peer posted the matching recv (order the exchange).")
      .def(
          "recv",
          [](Communicator& c, uintptr_t buf, size_t count, const std::string& dtype, int src,
             uint64_t tag, py::object keep) {
            return started(
                c.recv(address<void>(buf, count, "buf"), count, parseDType(dtype), src, tag), keep);
          },
          py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("src"), py::arg("tag") = 0,
          py::arg("keep") = py::none())
      .def("abort", &Communicator::abort, py::arg("reason"),
           "Fails the group on every reachable rank.");
}

}  // namespace hetra::python
