// The cost of one timeline event on this machine: a span with one argument, as the trainer's hooks
// write them, timed over many events into a real file (one write(2) each). With the events a rank
// writes per second (count the lines of a run's trace.json.rank<N>), it bounds the timeline's share
// of a rank's time, which alternating whole runs (bench/timeline_overhead.sh) can only resolve to
// their run-to-run noise.
//   timeline_event_cost [EVENTS] [FILE]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/timeline.h"

int main(int argc, char** argv) {
  using namespace hetra;
  const long events = argc > 1 ? std::atol(argv[1]) : 200000;
  const std::string path = argc > 2 ? argv[2] : "/tmp/hetra-timeline-event-cost.json";
  timeline::Writer writer(path, 0, "rank 0 (bench)");
  timeline::activate(&writer);
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < events; ++i) {
    timeline::Span span(timeline::Lane::Compute, "compute", "forward");
    span.arg("micro_batch", int64_t(i));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  timeline::activate(nullptr);
  writer.close();
  ::unlink(path.c_str());
  std::printf("%ld spans in %.3f s: %.2f us per event\n", events, seconds, 1e6 * seconds / events);
}
