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

// Parses "LATENCY,BANDWIDTH" such as "5us,5GB/s" or "50us,1gbit"; throws ConfigError naming it.
LinkCost parseLinkCost(const std::string& text);

}  // namespace hetra::comm
