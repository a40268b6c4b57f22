// The progress bar's line (train/progress.h): its fields, its bar, its width, the time left.
#include <gtest/gtest.h>

#include <string>

#include "train/progress.h"

namespace {

using hetra::train::durationText;
using hetra::train::EtaEstimator;
using hetra::train::progressLine;
using hetra::train::ProgressState;

TEST(Progress, DurationsReadAsClockTimes) {
  EXPECT_EQ(durationText(0), "0:00");
  EXPECT_EQ(durationText(59.6), "1:00");
  EXPECT_EQ(durationText(754), "12:34");
  EXPECT_EQ(durationText(3723), "1:02:03");
  EXPECT_EQ(durationText(-5), "0:00");
}

TEST(Progress, TheLineShowsStepsEpochRateTimeLeftAndSplit) {
  const ProgressState state{.step = 10,
                            .totalSteps = 40,
                            .epoch = 1.25,
                            .loss = 0.5,
                            .samplesPerSecond = 1234.4,
                            .secondsLeft = 75,
                            .split = "30/20/14"};
  EXPECT_EQ(progressLine(state, 200),
            "[######..................] 10/40 epoch 1.25 loss 0.5000 1234 samples/s eta 1:15 "
            "split 30/20/14");
  // A terminal of 40 columns gets 39 characters: a full-width line would wrap before the "\r".
  EXPECT_EQ(progressLine(state, 40), progressLine(state, 200).substr(0, 39));
  ProgressState unknown = state;
  unknown.secondsLeft = -1;
  EXPECT_NE(progressLine(unknown, 200).find(" eta ? "), std::string::npos);
  ProgressState done = state;
  done.step = 40;
  EXPECT_EQ(progressLine(done, 200).substr(0, 26), "[" + std::string(24, '#') + "]");
}

TEST(Progress, TimeLeftFollowsTheRecentSteps) {
  EtaEstimator eta;
  EXPECT_LT(eta.secondsLeft(10), 0);
  eta.addStep(1.0);
  EXPECT_DOUBLE_EQ(eta.secondsLeft(10), 10.0);
  eta.addStep(1.0);
  EXPECT_DOUBLE_EQ(eta.secondsLeft(0), 0.0);
  // Steps twice as long: the estimate moves towards 2 s a step, a tenth of the way each step.
  eta.addStep(2.0);
  EXPECT_DOUBLE_EQ(eta.secondsLeft(10), 10 * (0.9 * 1.0 + 0.1 * 2.0));
  for (int i = 0; i < 100; ++i) eta.addStep(2.0);
  EXPECT_NEAR(eta.secondsLeft(10), 20.0, 1e-3);
}

}  // namespace
