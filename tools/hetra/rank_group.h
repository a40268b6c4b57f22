// The group options every rank command (bench, probe --links, run) starts from, so the listen
// address rule (launch/rank_environment.h) is applied in one place.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "launch.h"

namespace hetra::cli {

// The job's transport and timeout, and the address this rank's tcp transport listens on; the
// caller adds what its command needs (algorithm, islands).
inline comm::GroupOptions rankGroupOptions(const RankContext& context, const std::string& transport,
                                           Millis timeout) {
  comm::GroupOptions group;
  group.transport = transport;
  group.timeout = timeout;
  group.listenAddress = listenAddressFor(context);
  return group;
}

}  // namespace hetra::cli
