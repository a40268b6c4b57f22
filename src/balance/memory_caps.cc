#include "balance/memory_caps.h"

#include <algorithm>
#include <limits>

#include "common/errors.h"

namespace hetra::balance {

int64_t maxMicroBatch(int64_t capBytes, int64_t fixedBytes, int64_t bytesPerSample) {
  HETRA_ENFORCE(capBytes >= 0 && fixedBytes >= 0 && bytesPerSample >= 0, "capBytes ", capBytes,
                ", fixedBytes ", fixedBytes, ", bytesPerSample ", bytesPerSample);
  if (capBytes == 0) return std::numeric_limits<int64_t>::max();
  if (capBytes < fixedBytes) return 0;
  if (bytesPerSample == 0) return std::numeric_limits<int64_t>::max();
  return (capBytes - fixedBytes) / bytesPerSample;
}

int64_t measuredMaxMicroBatch(int64_t capBytes, int64_t fixedBytes, int64_t activationBytes,
                              int64_t microBatch) {
  HETRA_ENFORCE(capBytes >= 0 && fixedBytes >= 0 && activationBytes >= 0 && microBatch >= 1,
                "capBytes ", capBytes, ", fixedBytes ", fixedBytes, ", activationBytes ",
                activationBytes, ", microBatch ", microBatch);
  const int64_t perSample = (activationBytes + microBatch - 1) / microBatch;
  if (capBytes == 0 || perSample == 0) return std::numeric_limits<int64_t>::max();
  const int64_t room = capBytes - fixedBytes;
  if (room <= 0) return 1;
  return std::max<int64_t>(1, (room - int64_t(double(room) * kMeasuredHeadroom)) / perSample);
}

int64_t bytesForOneSample(int64_t fixedBytes, int64_t bytesPerSample) {
  HETRA_ENFORCE(fixedBytes >= 0 && bytesPerSample >= 0 &&
                    fixedBytes <= std::numeric_limits<int64_t>::max() - bytesPerSample,
                "fixedBytes ", fixedBytes, ", bytesPerSample ", bytesPerSample);
  return fixedBytes + bytesPerSample;
}

}  // namespace hetra::balance
