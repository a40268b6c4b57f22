#include "train/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/errors.h"

namespace hetra::train {
namespace {

constexpr int kBarWidth = 24;
// The weight of the newest step: about the last 20 steps count.
constexpr double kNewestWeight = 0.1;

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

}  // namespace

std::string durationText(double seconds) {
  const int64_t total = int64_t(std::llround(std::max(0.0, seconds)));
  const int64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
  char text[48];
  if (h > 0)
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", (long long)h, (long long)m,
                  (long long)s);
  else
    std::snprintf(text, sizeof text, "%lld:%02lld", (long long)m, (long long)s);
  return text;
}

std::string progressLine(const ProgressState& state, int columns) {
  const double done = state.totalSteps > 0
                          ? std::clamp(double(state.step) / double(state.totalSteps), 0.0, 1.0)
                          : 0.0;
  const int filled = int(done * kBarWidth);
  std::string line =
      "[" + std::string(size_t(filled), '#') + std::string(size_t(kBarWidth - filled), '.') + "] " +
      str(state.step, "/", state.totalSteps, " epoch ", fixed(state.epoch, 2), " loss ",
          fixed(state.loss, 4), " ", fixed(state.samplesPerSecond, 0), " samples/s eta ",
          state.secondsLeft < 0 ? std::string("?") : durationText(state.secondsLeft), " split ",
          state.split);
  const size_t width = size_t(std::max(columns - 1, 20));
  if (line.size() > width) line.resize(width);
  return line;
}

void EtaEstimator::addStep(double seconds) {
  meanSeconds_ =
      meanSeconds_ < 0 ? seconds : (1 - kNewestWeight) * meanSeconds_ + kNewestWeight * seconds;
}

double EtaEstimator::secondsLeft(int64_t stepsLeft) const {
  return meanSeconds_ < 0 ? -1 : meanSeconds_ * double(std::max<int64_t>(0, stepsLeft));
}

int terminalColumns() {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

}  // namespace hetra::train
