// `hetra probe --links`: every rank reports its host, vendor and device; every pair of ranks is
// measured in turn (latency of a small message, bandwidth of a large one, as nccl-tests' p2p
// tests do); rank 0 prints the ranks, the latency and bandwidth matrices and the islands, and
// writes the topology (comm/topology.h) to a JSON file that a run's [topology] section reads.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace hetra::cli {

struct ProbeLinksOptions {
  bool links = false;  // --links: measure instead of describing this host
  int np = 0;          // start this many local ranks (unless the environment names the rank)
  std::string out;     // write the topology JSON here (rank 0)
  bool json = false;   // print the topology JSON instead of the tables
  // Vendor of each rank: one for all, or a comma-separated list with one per rank.
  std::string vendor = "cpu";
  std::string bandwidthSize = "16M";  // message of the bandwidth series
  int latencyIters = 100;
  int bandwidthIters = 10;
  std::string transport = "auto";
  int timeoutMs = 60000;
};

// Adds --links and its options to the `probe` subcommand.
void addProbeLinksOptions(CLI::App& probe, ProbeLinksOptions& options);

// Runs `hetra probe --links`: as one rank when the environment describes one (and no --np asks to
// start them here), else starts --np local ranks of this same command line. `argv` is the
// process's own.
int runProbeLinks(const ProbeLinksOptions& options, const std::vector<std::string>& argv);

}  // namespace hetra::cli
