// The store, rank discovery and the job's store; the global sampler, the balancer, the
// slow-device emulation and the kept host heap. Blocking calls release the GIL, so other Python
// threads (a DataLoader's, a heartbeat) keep running while a rank waits for its peers.
#include <memory>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "balance/balancer.h"
#include "bindings.h"
#include "device/host_heap.h"
#include "device/slowdown.h"
#include "launch/rank_environment.h"
#include "store/store.h"
#include "store/tcp_store.h"
#include "train/sampler.h"

namespace py = pybind11;

namespace hetra::python {
namespace {

using StorePtr = std::shared_ptr<store::Store>;

py::bytes toPython(const store::Bytes& value) {
  return py::bytes(reinterpret_cast<const char*>(value.data()), value.size());
}

store::Bytes fromPython(const py::bytes& value) {
  const std::string text = value;
  return store::Bytes(text.begin(), text.end());
}

// The job's store and, on the rank that serves it, the server: one object, so that the server
// lives exactly as long as Python holds the store.
struct JobStore {
  StorePtr store;
  std::shared_ptr<void> server;
};

}  // namespace

void bindRuntime(py::module_& module) {
  py::class_<store::Store, StorePtr>(module, "Store",
                                     "Key/value rendezvous of a job (values are bytes).")
      .def("set", [](store::Store& s, const std::string& key,
                     const py::bytes& value) { s.set(key, fromPython(value)); })
      .def(
          "get",
          [](store::Store& s, const std::string& key, double timeout) {
            const Deadline deadline = deadlineAfter(millisFromSeconds(timeout, "timeout"));
            store::Bytes value;
            {
              py::gil_scoped_release release;
              value = s.get(key, deadline);
            }
            return toPython(value);
          },
          py::arg("key"), py::arg("timeout") = 30.0,
          "Waits until the key exists (TimeoutError naming it after `timeout` seconds).")
      .def("add", &store::Store::add, py::call_guard<py::gil_scoped_release>())
      .def("compare_set",
           [](store::Store& s, const std::string& key, const py::bytes& expected,
              const py::bytes& desired) {
             return toPython(s.compareSet(key, fromPython(expected), fromPython(desired)));
           })
      .def(
          "wait",
          [](store::Store& s, const std::vector<std::string>& keys, double timeout) {
            const Deadline deadline = deadlineAfter(millisFromSeconds(timeout, "timeout"));
            py::gil_scoped_release release;
            s.wait(keys, deadline);
          },
          py::arg("keys"), py::arg("timeout") = 30.0)
      .def("check", &store::Store::check)
      .def("delete_key", &store::Store::deleteKey);

  module.def(
      "prefix_store",
      [](const std::string& prefix, StorePtr inner) -> StorePtr {
        return std::make_shared<store::PrefixStore>(prefix, std::move(inner));
      },
      "The keys of `inner` under 'prefix/'.");
  module.def(
      "memory_store", []() -> StorePtr { return std::make_shared<store::MemoryStore>(); },
      "An in-process store (a world of one).");
  module.def(
      "connect_store",
      [](const std::string& host, int port, double timeout) -> StorePtr {
        const Millis budget = millisFromSeconds(timeout, "timeout");
        py::gil_scoped_release release;
        return std::make_shared<store::TcpStore>(host, port, budget);
      },
      py::arg("host"), py::arg("port"), py::arg("timeout") = 30.0,
      "A client of hetra's TCP store at host:port, retrying until `timeout` seconds.");

  py::class_<store::TcpStoreServer>(module, "StoreServer",
                                    "hetra's TCP store, served on a background thread.")
      .def(py::init<const std::string&, int>(), py::arg("host"), py::arg("port") = 0,
           "Binds host:port (port 0: a free one, see .port).")
      .def_property_readonly("port", &store::TcpStoreServer::port)
      .def_property_readonly("host", &store::TcpStoreServer::host);

  py::class_<launch::RankContext>(module, "RankContext",
                                  "This rank's place in the job, as its launcher describes it.")
      .def(py::init<>())
      .def_readwrite("rank", &launch::RankContext::rank)
      .def_readwrite("world_size", &launch::RankContext::worldSize)
      .def_readwrite("local_rank", &launch::RankContext::localRank)
      .def_readwrite("store_address", &launch::RankContext::storeAddress)
      .def_readwrite("store_external", &launch::RankContext::storeExternal)
      .def_readwrite("job_id", &launch::RankContext::jobId)
      .def_readwrite("launcher", &launch::RankContext::launcher);
  module.def("rank_from_environment", &launch::rankFromEnvironment,
             "The rank the environment describes (hetra launch, torchrun, mpirun, srun, PMI), or "
             "None when no launcher's variables are set; ConfigError when they are inconsistent.");
  module.def("listen_address_for", &launch::listenAddressFor,
             "The address this rank's tcp transport listens on.");

  py::class_<JobStore>(module, "JobStore")
      .def_readonly("store", &JobStore::store)
      .def_property_readonly("serves", [](const JobStore& job) { return job.server != nullptr; });
  module.def(
      "connect_job_store",
      [](const launch::RankContext& context, double timeout) {
        const Millis budget = millisFromSeconds(timeout, "timeout");
        py::gil_scoped_release release;
        JobStore job;
        job.store = launch::connectJobStore(context, budget, &job.server);
        return job;
      },
      py::arg("context"), py::arg("timeout") = 30.0,
      "Connects to the job's store (rank 0 serves it unless the launcher does), keys under the "
      "job id.");
}

void bindTraining(py::module_& module) {
  py::class_<train::GlobalSampler>(module, "GlobalSampler",
                                   "One seeded permutation per epoch, cut into global steps and "
                                   "each step into contiguous per-rank slices.")
      .def(py::init<int64_t, int64_t, uint64_t>(), py::arg("dataset_size"), py::arg("global_batch"),
           py::arg("seed"))
      .def("indices", &train::GlobalSampler::indices, py::arg("step"), py::arg("batches"),
           py::arg("rank"))
      .def("steps_for", &train::GlobalSampler::stepsFor, py::arg("epochs"))
      .def_property_readonly("dataset_size", &train::GlobalSampler::datasetSize)
      .def_property_readonly("global_batch", &train::GlobalSampler::globalBatch);

  py::class_<balance::RankAssignment>(module, "RankAssignment")
      .def_readonly("batch", &balance::RankAssignment::batch)
      .def_readonly("micro_batch", &balance::RankAssignment::microBatch)
      .def_readonly("accum_steps", &balance::RankAssignment::accumSteps)
      .def_readonly("predicted_seconds", &balance::RankAssignment::predictedSeconds);
  py::class_<balance::Plan>(module, "Plan")
      .def_readonly("ranks", &balance::Plan::ranks)
      .def_readonly("version", &balance::Plan::version)
      .def_readonly("reason", &balance::Plan::reason)
      .def("summary", &balance::Plan::summary);
  py::class_<balance::Balancer>(module, "Balancer",
                                "Each rank's share of the global batch from measured compute "
                                "times; deterministic, so every rank runs its own on the same "
                                "all-gathered times.")
      .def(py::init([](int64_t globalBatch, const std::vector<int64_t>& maxMicroBatch,
                       const std::string& mode) {
             balance::BalancerOptions options = balance::BalancerOptions::fromParams(globalBatch);
             if (!mode.empty()) options.mode = balance::parseMode(mode);
             std::vector<balance::RankCaps> caps(maxMicroBatch.size());
             for (size_t r = 0; r < caps.size(); ++r) caps[r].maxMicroBatch = maxMicroBatch[r];
             return balance::Balancer(options, caps);
           }),
           py::arg("global_batch"), py::arg("max_micro_batch"), py::arg("mode") = "",
           "One cap per rank (most samples per micro-batch); mode dynamic, static or equal ('' "
           "follows HETRA_BALANCE_MODE).")
      .def_property_readonly("plan", &balance::Balancer::plan)
      .def("observe", &balance::Balancer::observe, py::arg("rank"), py::arg("micro_batch"),
           py::arg("seconds"))
      .def("observe_step_cost", &balance::Balancer::observeStepCost, py::arg("rank"),
           py::arg("seconds"),
           "Seconds `rank` spent this step outside its samples, alike for any share (its "
           "optimizer step).")
      .def("end_step", &balance::Balancer::endStep, py::arg("step"),
           "Returns True when the split changed (the new plan applies from the next step on).");

  module.def("slowdown_at", &device::slowdownAt, py::arg("initial"), py::arg("schedule"),
             py::arg("step"));
  py::class_<device::SlowdownChange>(module, "SlowdownChange")
      .def(py::init([](int64_t step, double factor) {
             return device::SlowdownChange{step, factor};
           }),
           py::arg("step"), py::arg("factor"));
  py::class_<device::SlowdownEmulator>(module, "SlowdownEmulator",
                                       "An emulated slow device: after a compute phase, sleeps "
                                       "until it lasted `slowdown` times its CPU work.")
      .def(py::init<>())
      .def("end_phase", &device::SlowdownEmulator::endPhase, py::arg("slowdown"), py::arg("wall"),
           py::arg("work"), py::call_guard<py::gil_scoped_release>(),
           "Ends a phase of `wall` elapsed and `work` CPU seconds; returns the seconds slept.")
      .def_static("tighten_timer_slack", &device::SlowdownEmulator::tightenTimerSlack);

  module.def("keep_host_heap", &device::keepHostHeap,
             "Pins glibc's mmap and trim thresholds for this process, as hetra run's ranks do, so "
             "that the tensors a step frees stay in the heap for the next step instead of being "
             "faulted in again (src/device/host_heap.h; HETRA_KEEP_HOST_HEAP=0 or the user's own "
             "MALLOC_*_ / GLIBC_TUNABLES leave glibc alone). Returns whether they are pinned.");
}

}  // namespace hetra::python
