#include "probe_links.h"

#include <cstdio>
#include <iostream>
#include <set>

#include <CLI/CLI.hpp>

#include "bench_command.h"
#include "comm/communicator.h"
#include "comm/topology.h"
#include "common/errors.h"
#include "common/logging.h"
#include "device/probe.h"
#include "launch.h"
#include "rank_group.h"

namespace hetra::cli {
namespace {

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    parts.push_back(text.substr(begin, comma - begin));
    if (comma == std::string::npos) return parts;
    begin = comma + 1;
  }
}

// --vendor as one entry per rank.
std::vector<std::string> vendorsFor(const std::string& list, int worldSize) {
  std::vector<std::string> vendors = splitList(list);
  for (const auto& v : vendors)
    if (v != "cpu" && v != "nvidia" && v != "amd")
      throw ConfigError(
          str("--vendor ", list, ": '", v, "' is not allowed; allowed: cpu, nvidia, amd"));
  if (vendors.size() == 1) vendors.assign(size_t(worldSize), vendors[0]);
  if (int(vendors.size()) != worldSize)
    throw ConfigError(str("--vendor ", list, ": ", vendors.size(), " entries for ", worldSize,
                          " ranks; give one vendor for all or one per rank"));
  return vendors;
}

// What this rank runs on: the CPU model, or the GPU of its vendor that its place among the local
// ranks of that vendor names (local ranks are consecutive ranks under every hetra launcher).
std::string deviceKindOf(const RankContext& context, const std::vector<std::string>& vendors) {
  const std::string& vendor = vendors[size_t(context.rank)];
  const auto host = device::probeHost();
  if (vendor == "cpu") return host.cpuModel.empty() ? std::string("cpu") : host.cpuModel;
  std::vector<const device::GpuInfo*> gpus;
  for (const auto& gpu : host.gpus)
    if (gpu.vendor == vendor) gpus.push_back(&gpu);
  if (gpus.empty())
    throw ConfigError(str("--vendor ", vendor, " for rank ", context.rank, ": no ", vendor,
                          " GPU found on this host (`hetra probe` shows what was found)"));
  int ordinal = 0;
  for (int r = context.rank - context.localRank; r < context.rank; ++r)
    ordinal += r >= 0 && vendors[size_t(r)] == vendor;
  const auto& gpu = *gpus[size_t(ordinal) % gpus.size()];
  return str(gpu.name, " (", vendor, " ", gpu.index, ")");
}

int runProbeLinksRank(const ProbeLinksOptions& o) {
  auto context = rankFromEnvironment();
  HETRA_ENFORCE(context.has_value(), "runProbeLinksRank needs the rank environment");
  log::setRank(context->rank);
  const std::vector<std::string> vendors = vendorsFor(o.vendor, context->worldSize);
  const std::string deviceKind = deviceKindOf(*context, vendors);
  comm::LinkOptions links;
  links.bandwidthBytes = parseSize(o.bandwidthSize);
  if (links.bandwidthBytes == 0) throw ConfigError("--bytes must be at least 1 byte");
  links.latencyIters = o.latencyIters;
  links.bandwidthIters = o.bandwidthIters;

  std::shared_ptr<void> server;
  auto store = connectJobStore(*context, Millis(o.timeoutMs), &server);
  comm::GroupOptions group = rankGroupOptions(*context, o.transport, Millis(o.timeoutMs));
  group.algorithm = "ring";  // no hierarchy: the probe measures links, not collectives
  links.hostGroup = group;
  links.hostGroup.transport = o.transport == "tcp" ? "tcp" : "auto";
  auto world = comm::Communicator::create(store, context->rank, context->worldSize, group);

  comm::Topology topology =
      comm::gatherTopology(*world, vendors[size_t(context->rank)], deviceKind);
  measureLinks(*world, topology, links);
  world->barrier()->wait();
  if (world->rank() != 0) return 0;
  if (o.json) {
    std::cout << comm::topologyToJson(topology) << std::flush;
  } else {
    std::set<std::string> hosts;
    for (const auto& r : topology.ranks) hosts.insert(r.hostIdentity);
    std::cout << "# hetra probe --links: " << world->size() << " ranks on " << hosts.size()
              << (hosts.size() == 1 ? " host" : " hosts") << ", world transport "
              << world->transportName() << "\n"
              << comm::formatRanks(topology) << "#\n"
              << comm::formatLinkMatrices(topology) << "#\n"
              << comm::formatIslandMap(topology);
  }
  if (!o.out.empty()) {
    comm::writeTopology(topology, o.out);
    if (!o.json) std::cout << "# topology written to " << o.out << "\n";
  }
  std::cout << std::flush;
  return 0;
}

}  // namespace

void addProbeLinksOptions(CLI::App& probe, ProbeLinksOptions& o) {
  CLI::Option* links = probe.add_flag(
      "--links", o.links,
      "Measure latency and bandwidth between every pair of ranks and print the islands");
  // Every other option is for --links only: given alone, it is refused rather than ignored.
  std::vector<CLI::Option*> options = {
      probe.add_option("--np", o.np, "Start this many local ranks (unless HETRA_RANK is set)")
          ->check(CLI::Range(1, 1024)),
      probe.add_option("--out", o.out, "Write the topology JSON to this file"),
      probe.add_option("--vendor", o.vendor,
                       "cpu | nvidia | amd, or a comma-separated list with one per rank"),
      probe.add_option("--bytes", o.bandwidthSize, "Bandwidth message size (K, M, G suffixes)"),
      probe.add_option("--latency-iters", o.latencyIters, "Most round trips timed for latency")
          ->check(CLI::Range(1, 1000000)),
      probe
          .add_option("--bandwidth-iters", o.bandwidthIters, "Most round trips timed for bandwidth")
          ->check(CLI::Range(1, 1000000)),
      probe.add_option("--transport", o.transport, "shm | tcp | auto")
          ->check(CLI::IsMember({"auto", "shm", "tcp"})),
      probe.add_option("--timeout-ms", o.timeoutMs, "Deadline of each operation")
          ->check(CLI::Range(100, 3600000)),
  };
  for (CLI::Option* option : options) option->capture_default_str()->needs(links)->group("--links");
}

int runProbeLinks(const ProbeLinksOptions& o, const std::vector<std::string>& argv) {
  // --np means "start the ranks here", even inside another launcher's job (as bench).
  const auto context = rankFromEnvironment();
  if (context && (context->launcher == "hetra" || o.np == 0)) return runProbeLinksRank(o);
  const int np = o.np > 0 ? o.np : 1;
  vendorsFor(o.vendor, np);  // refused here once, not by every rank
  parseSize(o.bandwidthSize);
  return spawnLocalRanks(np, argv, onePerCore(np));
}

}  // namespace hetra::cli
