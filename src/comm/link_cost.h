// Latency and bandwidth of one kind of link: the inputs of the communicator's cost model (the
// provider table, the hierarchy).
#pragma once

#include <string>

namespace hetra::comm {

struct LinkCost {
  double latencySeconds = 0;
  double bytesPerSecond = 0;
  // `messages` sequential latencies plus `bytes` through the link.
  double seconds(double messages, double bytes) const {
    return messages * latencySeconds + bytes / bytesPerSecond;
  }
};

// Bytes per second one core reduces (reads two buffers, writes one) in host memory: the cost of a
// reduction that does not overlap a transfer. About 2/3 of one core's memcpy rate (2 streams
// against 3), 9 GB/s on the machines of docs/benchmarks.md; rounded down.
constexpr double kHostReduceBytesPerSecond = 4.0e9;

// Parses "LATENCY,BANDWIDTH" such as "5us,5GB/s" or "50us,1gbit"; throws ConfigError naming it.
LinkCost parseLinkCost(const std::string& text);

}  // namespace hetra::comm
