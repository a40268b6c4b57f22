// `hetra run --timeline FILE` (or HETRA_TIMELINE=FILE): every rank writes its own timeline
// (common/timeline.h) to FILE.rank<N> as it runs; at the end rank 0 merges them into FILE, one
// Chrome trace on rank 0's clock.
//
// Clocks: each rank's events carry its own steady clock, which on another host has another origin.
// Each rank estimates its offset to rank 0 by ping-pong through the job's store (as NTP does): it
// notes its time t0, posts a ping, gets rank 0's time r in reply, notes t1, and takes
// offset = r - (t0 + t1) / 2, within ±(t1 - t0) / 2; the round with the shortest round trip wins.
// The merged trace states every offset and its error bound ("otherData").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/timeline.h"
#include "common/timing.h"
#include "store/store.h"

namespace hetra::cli {

// Where rank `rank` writes its own timeline when the merged one goes to `path`.
std::string rankTimelinePath(const std::string& path, int rank);

// Rank 0's time = this rank's time + offsetUs, within ±errorUs.
struct ClockOffset {
  double offsetUs = 0;
  double errorUs = 0;
};

// Collective over the group's ranks: rank 0 answers every other rank's pings in rank order.
// Returns this rank's offset ({0, 0} on rank 0). Throws TimeoutError past the deadline.
ClockOffset estimateClockOffset(store::Store& store, int rank, int size, Deadline deadline,
                                int rounds = 8);

// The events of one rank's timeline file: every whole line that is an event, so that the file of a
// killed rank (no "]", maybe a cut last line) gives what it wrote.
std::vector<nlohmann::json> timelineEvents(const std::string& text);

// One Chrome trace ({"traceEvents": [...], ...}) of the ranks' files, rank r's times moved by
// offsets[r].
nlohmann::json mergeTimelines(const std::vector<std::string>& rankTexts,
                              const std::vector<ClockOffset>& offsets);

// The process's timeline of `hetra run`, open from construction (FILE.rank<N>, active for every
// hook) to finish().
class RunTimeline {
 public:
  // `path`: the merged file; "" means none (then nothing is written and finish() returns).
  RunTimeline(const std::string& path, int rank, const std::string& device);
  ~RunTimeline();

  // Collective at the end of a run, after the last operation: closes this rank's file, sends its
  // events and clock offset to rank 0 through the store; rank 0 writes the merged trace. Throws
  // IoError naming the file rank 0 cannot write, TimeoutError when a rank does not answer.
  void finish(store::Store& store, int size, Millis timeout);

 private:
  std::string path_;
  int rank_;
  std::unique_ptr<timeline::Writer> writer_;
};

// The file `hetra run --timeline` names, else HETRA_TIMELINE's ("": none).
std::string timelinePath(const std::string& option);

}  // namespace hetra::cli
