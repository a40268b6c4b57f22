#include "train/zero_offload.h"

#include "common/names.h"

namespace hetra::train {
namespace {

constexpr NamedValue<Offload> kOffloadNames[] = {{Offload::kNone, "none"},
                                                 {Offload::kOptimizer, "optimizer"},
                                                 {Offload::kParameters, "parameters"}};
static_assert(coversEnum(kOffloadNames, Offload::kParameters));

}  // namespace

Offload parseOffload(const std::string& value) {
  return parseName(value, kOffloadNames, "offload");
}

const char* offloadName(Offload offload) {
  return nameOf(offload, kOffloadNames);
}

}  // namespace hetra::train
