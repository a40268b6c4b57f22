// STUB: replaced by the device probe.
#include "device/probe.h"

namespace hetra::device {
HostInfo probeHost() { return {}; }
}  // namespace hetra::device
