#include "common/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/errors.h"

namespace hetra::timeline {
namespace detail {
std::atomic<Writer*> activeWriter{nullptr};
}

namespace {

const char* laneName(Lane lane) {
  switch (lane) {
    case Lane::Compute:
      return "compute";
    case Lane::Comm:
      return "communication";
    case Lane::Balance:
      return "balancer";
  }
  return "?";
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", value);
  return text;
}

}  // namespace

void activate(Writer* writer) {
  detail::activeWriter.store(writer, std::memory_order_release);
}

double microseconds(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

std::string jsonString(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", unsigned(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

Writer::Writer(const std::string& path, int rank, const std::string& processName)
    : path_(path), rank_(rank) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw IoError(str("cannot write the timeline file '", path, "': ", std::strerror(errno)));
  writeLine("[\n");
  const std::string pid = std::to_string(rank_);
  writeLine(str(R"({"ph":"M","name":"process_name","pid":)", pid, R"(,"tid":0,"args":{"name":)",
                jsonString(processName), "}},\n"));
  writeLine(str(R"({"ph":"M","name":"process_sort_index","pid":)", pid,
                R"(,"tid":0,"args":{"sort_index":)", pid, "}},\n"));
  for (const Lane lane : {Lane::Compute, Lane::Comm, Lane::Balance})
    writeLine(str(R"({"ph":"M","name":"thread_name","pid":)", pid, R"(,"tid":)", int(lane),
                  R"(,"args":{"name":")", laneName(lane), "\"}},\n"));
}

Writer::~Writer() {
  if (active() == this) activate(nullptr);
  close();
}

void Writer::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  // A last event without a comma, so that the closing bracket makes the file strict JSON.
  const std::string last = str(R"({"ph":"M","name":"trace_end","pid":)", rank_, R"(,"tid":0,"ts":)",
                               number(microseconds(Clock::now())), "}\n]\n");
  [[maybe_unused]] const ssize_t n = ::write(fd_, last.data(), last.size());
  ::close(fd_);
  fd_ = -1;
}

void Writer::span(Lane lane, std::string_view category, std::string_view name,
                  Clock::time_point start, Clock::time_point end, std::string_view args) {
  writeEvent("X", lane, category, name, start,
             std::chrono::duration<double, std::micro>(end - start).count(), args);
}

void Writer::instant(Lane lane, std::string_view category, std::string_view name,
                     Clock::time_point at, std::string_view args) {
  writeEvent("i", lane, category, name, at, -1, args);
}

void Writer::writeEvent(std::string_view phase, Lane lane, std::string_view category,
                        std::string_view name, Clock::time_point at, double durationUs,
                        std::string_view args) {
  std::string line =
      str(R"({"ph":")", phase, R"(","cat":)", jsonString(category), R"(,"name":)", jsonString(name),
          R"(,"pid":)", rank_, R"(,"tid":)", int(lane), R"(,"ts":)", number(microseconds(at)));
  if (durationUs >= 0) line += str(R"(,"dur":)", number(durationUs));
  if (phase == "i") line += R"(,"s":"t")";
  if (!args.empty()) line += str(R"(,"args":{)", args, "}");
  line += "},\n";
  writeLine(line);
}

// One write per line: what a killed process leaves is whole lines. A failing write (a full disk)
// drops the event rather than failing the training it describes.
void Writer::writeLine(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  [[maybe_unused]] const ssize_t n = ::write(fd_, line.data(), line.size());
}

void Span::begin(Lane lane, const char* category, std::string_view name) {
  lane_ = lane;
  category_ = category;
  name_ = name;
  start_ = Clock::now();
}

void Span::finish() {
  writer_->span(lane_, category_, name_, start_, Clock::now(), args_);
  writer_ = nullptr;
}

void Span::key(std::string_view key) {
  if (!args_.empty()) args_ += ",";
  args_ += jsonString(key) + ":";
}

Span& Span::arg(std::string_view name, int64_t value) {
  if (writer_) {
    key(name);
    args_ += std::to_string(value);
  }
  return *this;
}

Span& Span::arg(std::string_view name, double value) {
  if (writer_) {
    key(name);
    args_ += number(value);
  }
  return *this;
}

Span& Span::arg(std::string_view name, std::string_view value) {
  if (writer_) {
    key(name);
    args_ += jsonString(value);
  }
  return *this;
}

void instant(Lane lane, const char* category, std::string_view name, std::string_view args) {
  if (Writer* writer = active()) [[unlikely]]
    writer->instant(lane, category, name, Clock::now(), args);
}

}  // namespace hetra::timeline
