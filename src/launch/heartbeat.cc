// Vocabulary: see heartbeat.h.
#include "launch/heartbeat.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <tuple>

#include "common/errors.h"
#include "common/net.h"
#include "common/params.h"
#include "common/process.h"

namespace hetra::launch {
namespace {

const Param kChannels("HETRA_RANK_CHANNELS", "",
                      "Set by hetra launch and hetra run for each local rank: its heartbeat "
                      "interval and pipes (\"<interval ms>;<stderr fd or -1>,<heartbeat fd>\").");
// A line written with one write() of at most PIPE_BUF bytes is never interleaved with another.
constexpr size_t kMaxMessage = 3000;

void writeAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the launcher is gone or not reading: nothing to tell
    done += size_t(n);
  }
}

// Splits complete lines off `partial` (after appending `data`).
std::vector<std::string> takeLines(std::string& partial, const char* data, size_t size) {
  partial.append(data, size);
  std::vector<std::string> lines;
  size_t start = 0, end;
  while ((end = partial.find('\n', start)) != std::string::npos) {
    lines.push_back(partial.substr(start, end - start));
    start = end + 1;
  }
  partial.erase(0, start);
  return lines;
}

void closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

std::string processState(int pid) {
  const std::optional<ProcessStat> stat = readProcessStat(pid);
  if (!stat) return "";
  const char state = stat->state;
  switch (state) {
    case 'R':
      return "R (running)";
    case 'S':
      return "S (sleeping)";
    case 'D':
      return "D (waiting in the kernel)";
    case 'T':
      return "T (stopped)";
    case 't':
      return "t (stopped by a debugger)";
    case 'Z':
      return "Z (exited, not yet reaped)";
    case 'X':
      return "X (dead)";
    default:
      return std::string(1, state);
  }
}

// ---- rank side ----

std::unique_ptr<RankChannel> RankChannel::fromEnvironment() {
  const std::string value = kChannels.str();
  if (value.empty()) return nullptr;
  // "<interval ms>;<stderr fd or -1>,<heartbeat fd>": this rank's pipes only.
  long intervalMs = 0;
  int err = -1, beat = -1;
  char rest = 0;
  if (std::sscanf(value.c_str(), "%ld;%d,%d%c", &intervalMs, &err, &beat, &rest) != 3 ||
      intervalMs <= 0 || beat < 0 || err < -1)
    throw ConfigError(
        str(kChannels.env(), "='", value,
            "' is malformed; expected <interval ms>;<stderr fd or -1>,<heartbeat fd>"));
  if (::fcntl(beat, F_GETFD) < 0)
    throw ConfigError(str(kChannels.env(), "='", value, "': fd ", beat, " is not open"));
  if (err >= 0) {
    if (::dup2(err, STDERR_FILENO) < 0)
      throw IoError(str("cannot send stderr to the launcher: ", std::strerror(errno)));
    if (err != STDERR_FILENO) ::close(err);
  }
  ::fcntl(beat, F_SETFD, FD_CLOEXEC);
  // A launcher that stops reading must not block the heartbeat thread, nor the exit.
  ::fcntl(beat, F_SETFL, ::fcntl(beat, F_GETFL) | O_NONBLOCK);
  // Processes this rank starts are not ranks. Called first thing in main, before any thread.
  ::unsetenv(kChannels.env().c_str());
  return std::unique_ptr<RankChannel>(new RankChannel(beat, Millis(intervalMs)));
}

RankChannel::RankChannel(int heartbeatFd, Millis interval) : fd_(heartbeatFd), interval_(interval) {
  send(str("hello ", getpid(), " ", net::hostName()));
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      std::this_thread::sleep_for(interval_);
      lock.lock();
      if (!stopping_) writeAll(fd_, "beat\n");
    }
  });
}

void RankChannel::send(const std::string& line) {
  writeAll(fd_, line + "\n");
}

void RankChannel::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void RankChannel::bye(int code, const std::string& message, bool reportsPeer) {
  stop();
  std::string text = message.substr(0, kMaxMessage);
  std::replace(text.begin(), text.end(), '\n', ' ');
  send(str(reportsPeer ? "bye-peer " : "bye ", code, " ", text));
}

RankChannel::~RankChannel() {
  stop();
  ::close(fd_);
}

// ---- launcher side ----

RankWatch::RankWatch(int ranks, Options options)
    : options_(options),
      interval_(std::clamp(Millis(options.hangTimeout.count() / 10), Millis(50), Millis(1000))),
      ranks_(size_t(ranks)) {
  HETRA_ENFORCE(ranks >= 1, "a job has at least one rank");
  HETRA_ENFORCE(options.hangTimeout.count() > 0, "the hang timeout must be positive");
  auto makePipe = [](int* readEnd, int* writeEnd) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw IoError(str("pipe: ", std::strerror(errno)));
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    ::fcntl(fds[1], F_SETFD, 0);  // the ranks inherit the write end
    *readEnd = fds[0];
    *writeEnd = fds[1];
  };
  for (auto& rank : ranks_) {
    if (options.captureStderr)
      makePipe(&rank.errRead, &rank.errWrite);
    else
      rank.errClosed = true;  // the launcher reads it
    makePipe(&rank.beatRead, &rank.beatWrite);
  }
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw IoError(str("pipe: ", std::strerror(errno)));
  // The thread takes no signal: a launcher that waits for SIGINT, SIGTERM or SIGCHLD with
  // sigtimedwait needs them blocked in every thread, or one landing here would kill it.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &previous);
  thread_ = std::thread([this] { loop(); });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

RankWatch::~RankWatch() {
  finish(Millis(0));
  for (auto& rank : ranks_) {
    closeFd(rank.errRead);
    closeFd(rank.errWrite);
    closeFd(rank.beatRead);
    closeFd(rank.beatWrite);
  }
  closeFd(wake_[0]);
  closeFd(wake_[1]);
}

std::map<std::string, std::string> RankWatch::environment(int rank) const {
  HETRA_ENFORCE(rank >= 0 && rank < int(ranks_.size()), "no rank ", rank);
  const Rank& r = ranks_[size_t(rank)];
  return {{kChannels.env(), str(interval_.count(), ";", r.errWrite, ",", r.beatWrite)}};
}

std::vector<int> RankWatch::closeInRank(int rank) const {
  HETRA_ENFORCE(rank >= 0 && rank < int(ranks_.size()), "no rank ", rank);
  std::vector<int> fds;
  for (size_t r = 0; r < ranks_.size(); ++r)
    if (int(r) != rank)
      for (int fd : {ranks_[r].errWrite, ranks_[r].beatWrite})
        if (fd >= 0) fds.push_back(fd);
  return fds;
}

void RankWatch::finish(Millis timeout) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) return;
    // Every rank has been started by now: the launcher's copies of the write ends must go, or
    // the pipes of ranks that have ended never report end of file.
    if (!writeEndsClosed_) {
      for (auto& rank : ranks_) {
        closeFd(rank.errWrite);
        closeFd(rank.beatWrite);
      }
      writeEndsClosed_ = true;
    }
  }
  const Deadline until = deadlineAfter(timeout);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const bool drained = std::all_of(ranks_.begin(), ranks_.end(),
                                       [](const Rank& r) { return r.ended && r.errClosed; });
      if (drained || Clock::now() >= until) {
        stop_ = true;
        break;
      }
    }
    std::this_thread::sleep_for(Millis(10));
  }
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_[1], &byte, 1);
  thread_.join();
}

void RankWatch::loop() {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, bool>> owners;  // rank, is stderr
  for (;;) {
    fds.clear();
    owners.clear();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) break;
      fds.push_back({wake_[0], POLLIN, 0});
      owners.emplace_back(0, false);
      for (size_t r = 0; r < ranks_.size(); ++r) {
        if (!ranks_[r].errClosed) {
          fds.push_back({ranks_[r].errRead, POLLIN, 0});
          owners.emplace_back(r, true);
        }
        if (!ranks_[r].ended) {
          fds.push_back({ranks_[r].beatRead, POLLIN, 0});
          owners.emplace_back(r, false);
        }
      }
    }
    const int ready =
        ::poll(fds.data(), fds.size(), int(std::min<int64_t>(interval_.count(), 100)));
    if (ready < 0 && errno != EINTR) break;
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) break;
    // Ends seen in one round are tied (endCounter_ counts rounds); see firstFailure.
    ++endCounter_;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank& rank = ranks_[owners[i].first];
      if (owners[i].second)
        readErr(rank);
      else
        readBeat(rank);
    }
    if (!writeEndsClosed_ &&
        std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.hello; })) {
      // Every rank has started (said hello), so no later fork needs the write ends.
      for (auto& rank : ranks_) {
        closeFd(rank.errWrite);
        closeFd(rank.beatWrite);
      }
      writeEndsClosed_ = true;
    }
    // A reaped rank's pipe holds all it wrote before it ended: read it, then end the rank.
    for (auto& rank : ranks_)
      if (rank.reaped && !rank.ended) {
        readBeat(rank);
        markEnded(rank);
      }
    const auto now = Clock::now();
    for (auto& rank : ranks_) checkHung(rank, now);
  }
  // Lines still buffered in the pipes are forwarded before the watch stops.
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& rank : ranks_)
    if (!rank.errClosed) readErr(rank);
}

void RankWatch::readErr(Rank& rank) {
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(rank.errRead, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: all read for now
    if (n == 0) {
      if (!rank.partialErr.empty()) {
        const std::string last = rank.partialErr + "\n";
        rank.partialErr.clear();
        writeAll(STDERR_FILENO, last);
        rank.tail.push_back(last.substr(0, last.size() - 1));
      }
      rank.errClosed = true;
      closeFd(rank.errRead);
      break;
    }
    for (auto& line : takeLines(rank.partialErr, buf, size_t(n))) {
      writeAll(STDERR_FILENO, line + "\n");
      rank.tail.push_back(std::move(line));
    }
  }
  while (rank.tail.size() > options_.tailLines) rank.tail.pop_front();
}

void RankWatch::readBeat(Rank& rank) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(rank.beatRead, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    if (n == 0) {
      markEnded(rank);
      return;
    }
    for (const auto& line : takeLines(rank.partialBeat, buf, size_t(n))) {
      if (line == "beat") {
        rank.lastBeat = Clock::now();
      } else if (line.rfind("hello ", 0) == 0) {
        std::istringstream in(line.substr(6));
        in >> rank.pid >> rank.host;
        rank.hello = true;
        rank.lastBeat = Clock::now();
      } else if (line.rfind("bye ", 0) == 0 || line.rfind("bye-peer ", 0) == 0) {
        rank.reportsPeer = line[3] == '-';
        const char* text = line.c_str() + line.find(' ') + 1;
        char* end = nullptr;
        rank.code = int(std::strtol(text, &end, 10));
        rank.message = *end == ' ' ? end + 1 : end;
        rank.said = true;
      }
    }
  }
}

void RankWatch::markEnded(Rank& rank) {
  if (rank.ended) return;
  rank.ended = true;
  if (rank.endOrder == 0) rank.endOrder = endCounter_;
  closeFd(rank.beatRead);
}

void RankWatch::checkHung(Rank& rank, Clock::time_point now) {
  if (!rank.hello || rank.ended || rank.said || !rank.hung.empty()) return;
  const auto silent = std::chrono::duration_cast<Millis>(now - rank.lastBeat);
  if (silent < options_.hangTimeout) return;
  const std::string state = processState(rank.pid);
  if (state.empty() || state[0] == 'Z' || state[0] == 'X') {
    markEnded(rank);  // it died; its pipes stay open only while the launcher still holds them
    return;
  }
  rank.hung = str("hung: no heartbeat for ", double(silent.count()) / 1000.0, " s (process state ",
                  state, "); the launcher killed it");
  rank.endOrder = endCounter_;
  ::kill(rank.pid, SIGKILL);
  if (options_.onHung) options_.onHung(int(&rank - ranks_.data()), rank.pid, rank.host, rank.hung);
}

void RankWatch::rankReaped(int rank) {
  HETRA_ENFORCE(rank >= 0 && rank < int(ranks_.size()), "no rank ", rank);
  std::lock_guard<std::mutex> lock(mutex_);
  Rank& r = ranks_[size_t(rank)];
  if (r.ended || r.reaped) return;
  r.reaped = true;
  if (r.endOrder == 0) r.endOrder = endCounter_;  // it ended by now: this round at the latest
}

void RankWatch::launcherKillsTheRest() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& rank : ranks_)
    if (!rank.ended && !rank.reaped && !rank.said) rank.killedByLauncher = true;
}

RankWatch::Failure RankWatch::firstFailure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Rank* first = nullptr;
  int firstIndex = -1;
  // Ranks that failed by themselves go before ranks that report a peer's failure; then the
  // earlier end; within one round a rank that said nothing (killed, crashed, hung) goes before one
  // that reported an error: the reporter is most likely reporting the silent one's death.
  auto orderOf = [](const Rank& r) {
    const bool reporter = r.hung.empty() && r.said;
    return std::make_tuple(reporter && r.reportsPeer, r.endOrder, reporter);
  };
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    const bool failed =
        !r.hung.empty() || ((r.ended || r.reaped) && (r.said ? r.code != 0 : !r.killedByLauncher));
    if (!failed) continue;
    if (!first || orderOf(r) < orderOf(*first)) {
      first = &r;
      firstIndex = int(i);
    }
  }
  Failure failure;
  if (!first) return failure;
  failure.rank = firstIndex;
  failure.pid = first->pid;
  failure.host = first->host;
  if (!first->hung.empty())
    failure.how = first->hung;
  else if (first->said)
    failure.how = str("exited with status ", first->code, ": ", first->message);
  else
    failure.how = "ended without reporting why (killed by a signal, or crashed)";
  failure.tail.assign(first->tail.begin(), first->tail.end());
  return failure;
}

std::vector<std::string> RankWatch::tail(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  HETRA_ENFORCE(rank >= 0 && rank < int(ranks_.size()), "no rank ", rank);
  return {ranks_[size_t(rank)].tail.begin(), ranks_[size_t(rank)].tail.end()};
}

}  // namespace hetra::launch
