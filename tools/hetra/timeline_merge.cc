#include "timeline_merge.h"

#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "common/errors.h"
#include "common/params.h"

namespace hetra::cli {
namespace {

using nlohmann::json;

const Param kTimeline(
    "HETRA_TIMELINE", "",
    "Write the run's Chrome trace (chrome://tracing, Perfetto) to this file, as "
    "`hetra run --timeline FILE` does; each rank also keeps its own FILE.rank<N>.");

// Store values are frames of at most 64 MiB (store/tcp_store_wire.h): a long run's events go in
// pieces.
constexpr size_t kChunkBytes = size_t(8) << 20;

std::string key(const std::string& what, int rank) {
  return str("timeline/", what, "/", rank);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void sendText(store::Store& store, int rank, const std::string& text) {
  const size_t chunks = (text.size() + kChunkBytes - 1) / kChunkBytes;
  for (size_t c = 0; c < chunks; ++c)
    store.setString(str(key("events", rank), "/", c), text.substr(c * kChunkBytes, kChunkBytes));
  store.setString(key("chunks", rank), std::to_string(chunks));
}

std::string receiveText(store::Store& store, int rank, Deadline deadline) {
  const size_t chunks = std::stoul(store.getString(key("chunks", rank), deadline));
  std::string text;
  for (size_t c = 0; c < chunks; ++c)
    text += store.getString(str(key("events", rank), "/", c), deadline);
  return text;
}

}  // namespace

std::string rankTimelinePath(const std::string& path, int rank) {
  return str(path, ".rank", rank);
}

std::string timelinePath(const std::string& option) {
  return option.empty() ? kTimeline.str() : option;
}

ClockOffset estimateClockOffset(store::Store& store, int rank, int size, Deadline deadline,
                                int rounds) {
  const auto now = [] { return timeline::microseconds(Clock::now()); };
  if (rank == 0) {
    for (int r = 1; r < size; ++r)
      for (int k = 0; k < rounds; ++k) {
        store.get(str(key("ping", r), "/", k), deadline);
        std::ostringstream reply;
        reply.precision(17);
        reply << now();
        store.setString(str(key("pong", r), "/", k), reply.str());
      }
    return {};
  }
  ClockOffset best{0, std::numeric_limits<double>::infinity()};
  for (int k = 0; k < rounds; ++k) {
    const double sent = now();
    store.setString(str(key("ping", rank), "/", k), "");
    const double reply = std::stod(store.getString(str(key("pong", rank), "/", k), deadline));
    const double received = now();
    const double halfTrip = (received - sent) / 2;
    if (halfTrip < best.errorUs) best = {reply - (sent + halfTrip), halfTrip};
  }
  return best;
}

std::vector<json> timelineEvents(const std::string& text) {
  std::vector<json> events;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == ',' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line.front() != '{') continue;
    json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (event.is_object()) events.push_back(std::move(event));
  }
  return events;
}

json mergeTimelines(const std::vector<std::string>& rankTexts,
                    const std::vector<ClockOffset>& offsets) {
  HETRA_ENFORCE_EQ(rankTexts.size(), offsets.size(), "one clock offset per rank's timeline");
  json events = json::array(), clocks = json::array();
  for (size_t r = 0; r < rankTexts.size(); ++r) {
    for (json& event : timelineEvents(rankTexts[r])) {
      if (event.contains("ts")) event["ts"] = event["ts"].get<double>() + offsets[r].offsetUs;
      events.push_back(std::move(event));
    }
    clocks.push_back(
        {{"rank", r}, {"offset_us", offsets[r].offsetUs}, {"error_us", offsets[r].errorUs}});
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"clock", "rank 0's steady clock, microseconds"},
            {"clock_sync",
             "each rank's offset to rank 0 by ping-pong through the job's store: offset = "
             "reply - (sent + received) / 2, within +-(received - sent) / 2, the shortest of "
             "8 round trips"},
            {"clock_offsets", std::move(clocks)}}}};
}

RunTimeline::RunTimeline(const std::string& path, int rank, const std::string& device)
    : path_(path), rank_(rank) {
  if (path_.empty()) return;
  writer_ = std::make_unique<timeline::Writer>(rankTimelinePath(path_, rank), rank,
                                               str("rank ", rank, " (", device, ")"));
  timeline::activate(writer_.get());
}

RunTimeline::~RunTimeline() {
  if (writer_) timeline::activate(nullptr);
}

void RunTimeline::finish(store::Store& store, int size, Millis timeout) {
  if (!writer_) return;
  timeline::activate(nullptr);
  writer_->close();
  const Deadline deadline = deadlineAfter(timeout);
  const ClockOffset offset = estimateClockOffset(store, rank_, size, deadline);
  if (rank_ != 0) {
    sendText(store, rank_, readFile(writer_->path()));
    std::ostringstream text;
    text.precision(17);
    text << offset.offsetUs << " " << offset.errorUs;
    store.setString(key("offset", rank_), text.str());
    return;
  }
  std::vector<std::string> texts{readFile(writer_->path())};
  std::vector<ClockOffset> offsets{offset};
  for (int r = 1; r < size; ++r) {
    texts.push_back(receiveText(store, r, deadline));
    std::istringstream in(store.getString(key("offset", r), deadline));
    ClockOffset theirs;
    in >> theirs.offsetUs >> theirs.errorUs;
    offsets.push_back(theirs);
  }
  std::ofstream out(path_, std::ios::trunc);
  out << mergeTimelines(texts, offsets).dump() << "\n";
  out.flush();
  if (!out) throw IoError(str("cannot write the timeline file '", path_, "'"));
}

}  // namespace hetra::cli
