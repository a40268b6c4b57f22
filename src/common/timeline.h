// Timeline: one rank's Chrome trace (the Trace Event Format that chrome://tracing and Perfetto
// open), written as it goes, as Horovod's HOROVOD_TIMELINE is.
//
// Vocabulary: an *event* is one JSON object of the trace; a *span* an event with a start and a
// duration ("ph":"X"), an *instant* one with a time only ("ph":"i"). A *lane* is a trace "thread":
// one per kind of work, so that a lane's spans nest and never overlap. Times are microseconds of
// this process's steady clock; tools/hetra/timeline_merge.h moves them onto rank 0's clock.
//
// File: "[" on the first line, then one event per line, each followed by a comma. Every event is
// one write(2) of a whole line, so a killed rank leaves every event it wrote; the Trace Event
// Format allows the missing "]" of a trace whose process ended abruptly. close() ends the file with
// a last event and "]", which makes it strict JSON.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "common/timing.h"

namespace hetra::timeline {

enum class Lane : int { Compute = 1, Comm = 2, Balance = 3 };

class Writer {
 public:
  // Creates (truncates) `path` and writes the trace's opening and the names of the process
  // (`processName`, e.g. "rank 1 (gpu0)") and of its lanes. Throws IoError naming the path.
  Writer(const std::string& path, int rank, const std::string& processName);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // `args`: the members of the event's "args" object, already JSON ("" for none).
  void span(Lane lane, std::string_view category, std::string_view name, Clock::time_point start,
            Clock::time_point end, std::string_view args = {});
  void instant(Lane lane, std::string_view category, std::string_view name, Clock::time_point at,
               std::string_view args = {});
  // Ends the file ("]"); later events are dropped. Idempotent.
  void close();

  const std::string& path() const { return path_; }
  int rank() const { return rank_; }

 private:
  void writeEvent(std::string_view phase, Lane lane, std::string_view category,
                  std::string_view name, Clock::time_point at, double durationUs,
                  std::string_view args);
  void writeLine(const std::string& line);

  std::string path_;
  int rank_;
  int fd_ = -1;
  std::mutex mutex_;  // lines from the compute and the communication threads stay whole
};

namespace detail {
extern std::atomic<Writer*> activeWriter;
}

// The process's timeline, null when none: every hook asks this first, so a disabled timeline
// costs one load and one branch.
inline Writer* active() {
  return detail::activeWriter.load(std::memory_order_acquire);
}
// Makes `writer` the process's timeline (nullptr: none). The caller keeps it alive until it
// deactivates it.
void activate(Writer* writer);

// Microseconds of the steady clock, the trace's "ts".
double microseconds(Clock::time_point t);

// `text` as a JSON string, quoted and escaped.
std::string jsonString(std::string_view text);

// A span from construction to end() (or destruction) on the process's timeline; does nothing but
// one branch when there is none. Arguments are formatted only when the timeline is on.
class Span {
 public:
  Span(Lane lane, const char* category, std::string_view name) : writer_(active()) {
    if (writer_) [[unlikely]]
      begin(lane, category, name);
  }
  ~Span() { end(); }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  Span& arg(std::string_view key, int64_t value);
  Span& arg(std::string_view key, double value);
  Span& arg(std::string_view key, std::string_view value);
  void end() {
    if (writer_) [[unlikely]]
      finish();
  }

 private:
  void begin(Lane lane, const char* category, std::string_view name);
  void finish();
  void key(std::string_view key);

  Writer* writer_;
  Lane lane_ = Lane::Compute;
  const char* category_ = "";
  std::string name_, args_;
  Clock::time_point start_;
};

// An instant on the process's timeline (nothing when there is none).
void instant(Lane lane, const char* category, std::string_view name, std::string_view args = {});

}  // namespace hetra::timeline
