// The progress bar of `hetra run` on a terminal: one line redrawn in place with the steps, the
// epoch, samples/s, the time left and the current split, fitted to the terminal's width.
#pragma once

#include <cstdint>
#include <string>

namespace hetra::train {

struct ProgressState {
  int64_t step = 0, totalSteps = 0;
  double epoch = 0;
  double loss = 0;
  double samplesPerSecond = 0;
  double secondsLeft = -1;  // < 0: not known yet
  std::string split;        // "34/24/6"
};

// "[#####.....] 12/30 epoch 0.75 loss 0.4321 120345 samples/s eta 0:03 split 34/24/6", cut to
// `columns` - 1 characters (a line as wide as the terminal wraps before the carriage return).
std::string progressLine(const ProgressState& state, int columns);

// "0:07", "12:34", "1:02:03".
std::string durationText(double seconds);

// The time left, from an average of the recent steps' times (exponentially weighted, so that a
// new split or a slowdown shows within a few steps).
class EtaEstimator {
 public:
  void addStep(double seconds);
  double secondsLeft(int64_t stepsLeft) const;  // < 0 before the first step

 private:
  double meanSeconds_ = -1;
};

// The columns of the terminal on stdout (80 when it has none).
int terminalColumns();

}  // namespace hetra::train
