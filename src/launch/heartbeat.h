// Liveness of local ranks, seen from their launcher: a heartbeat per rank, its stderr's last lines,
// and how it ended.
//
// Vocabulary:
//   channel    the pipes of one rank, created by the launcher before it starts the ranks; each
//              rank inherits only its own (their numbers travel in its HETRA_RANK_CHANNELS): its
//              heartbeat pipe, which carries lines "hello <pid> <host>", "beat" and, just before
//              the rank exits, "bye <exit code> <message>" ("bye-peer ..." when the message
//              reports another rank's failure, a PeerAbortedError); and, unless the launcher reads
//              the rank's stderr itself (a program that may not be linked with hetra), its stderr.
//   heartbeat  a "beat" written by a thread of the rank every interval. A rank that is stopped
//              (SIGSTOP, a frozen VM, a debugger) or wedged in the kernel stops beating; a rank
//              whose main thread is merely busy or blocked keeps beating (its peers' operation
//              deadlines cover that case).
//   hung       no heartbeat for the hang timeout. The watch then kills the rank (SIGKILL): its
//              peers see it die within one sleep slice of their waits and fail with
//              PeerAbortedError naming it, instead of waiting for their own deadlines.
//   tail       the last lines a rank wrote to stderr; every line is also forwarded to the
//              launcher's stderr as it arrives.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/timing.h"

namespace hetra::launch {

// The rank's side. fromEnvironment() returns null when HETRA_RANK_CHANNELS is not set (the rank
// was not started by a watching launcher). Otherwise it sends fd 2 into the rank's stderr pipe
// (when the channel has one), says hello and starts beating until destroyed. Every process linked
// with hetra calls it first thing (tools/hetra/main.cc), so any hetra command run as a rank of
// hetra launch or hetra run is watched.
class RankChannel {
 public:
  static std::unique_ptr<RankChannel> fromEnvironment();
  ~RankChannel();
  RankChannel(const RankChannel&) = delete;
  RankChannel& operator=(const RankChannel&) = delete;

  // Tells the launcher how this rank is about to end (code 0: success). Stops the heartbeat.
  // `reportsPeer`: the error is another rank's failure seen from here (PeerAbortedError), so the
  // launcher names a local rank that failed by itself before this one, whatever the order it saw.
  void bye(int code, const std::string& message, bool reportsPeer);

 private:
  RankChannel(int heartbeatFd, Millis interval);
  void send(const std::string& line);
  void stop();

  int fd_;
  Millis interval_;
  std::mutex mutex_;
  bool stopping_ = false;
  std::thread thread_;
};

// The launcher's side: one per local job. Create it before starting the ranks, put
// environment(rank) into each rank's environment, close closeInRank(rank) in it before it execs,
// start them; the watch's thread forwards their stderr, keeps the tails and kills a rank that
// hangs.
class RankWatch {
 public:
  struct Options {
    Millis hangTimeout{5000};  // no heartbeat for this long: the rank is hung
    size_t tailLines = 20;
    // Off: the launcher reads the ranks' stderr itself; the watch only hears their heartbeats.
    bool captureStderr = true;
    // Called (on the watch's thread) right after a hung rank was killed, with why.
    std::function<void(int rank, int pid, const std::string& host, const std::string& how)> onHung;
  };
  // How one rank ended, as far as the watch knows.
  struct Failure {
    int rank = -1;  // -1: no rank failed
    int pid = 0;
    std::string host;
    std::string how;  // "exited with status 1: <its last error>", "hung: ...", "ended without ..."
    std::vector<std::string> tail;
  };

  RankWatch(int ranks, Options options);
  ~RankWatch();
  RankWatch(const RankWatch&) = delete;
  RankWatch& operator=(const RankWatch&) = delete;

  // The variables rank `rank` needs to find its channel (HETRA_RANK_CHANNELS).
  std::map<std::string, std::string> environment(int rank) const;
  // The launcher's pipe ends the process of rank `rank` inherits but must close before it execs
  // (the other ranks' ends: their pipes would never report end of file otherwise).
  std::vector<int> closeInRank(int rank) const;
  // Stops watching once every rank has ended (or after `timeout`), draining their pipes.
  void finish(Millis timeout = Millis(2000));
  // The launcher reaped the process of `rank`: it has ended, whatever its pipes say (a process
  // it started, or any other holder of its pipe's write end, would delay their end of file past the
  // ends of the ranks that report its death, and make one of them look first). Any thread.
  void rankReaped(int rank);
  // The launcher is about to kill every rank still running: those that have not said how they
  // ended are stopped, not failed. Any thread.
  void launcherKillsTheRest();
  // The rank that failed first (by the time the watch saw it), with its tail. A rank whose error
  // reports a peer's failure comes after every rank that failed by itself, however early it ended:
  // a killed rank's pipes close only once its last thread has exited, which can be after a peer
  // saw it die, reported and exited.
  Failure firstFailure() const;
  // The tail of one rank (tests, messages).
  std::vector<std::string> tail(int rank) const;

 private:
  struct Rank {
    int errRead = -1, errWrite = -1, beatRead = -1, beatWrite = -1;
    int pid = 0;
    std::string host;
    bool hello = false, ended = false, said = false, errClosed = false;
    bool reaped = false;            // by the launcher (rankReaped); the watch's thread then ends it
    bool reportsPeer = false;       // its "bye" reported another rank's failure
    bool killedByLauncher = false;  // still running when the launcher killed the rest
    int code = 0;
    std::string message, partialErr, partialBeat;
    std::deque<std::string> tail;
    Clock::time_point lastBeat;
    std::string hung;  // why the watch killed it
    uint64_t endOrder = 0;
  };
  void loop();
  void readErr(Rank& rank);
  void readBeat(Rank& rank);
  void checkHung(Rank& rank, Clock::time_point now);
  void markEnded(Rank& rank);

  Options options_;
  Millis interval_;
  std::vector<Rank> ranks_;
  mutable std::mutex mutex_;
  bool stop_ = false;
  bool writeEndsClosed_ = false;
  uint64_t endCounter_ = 0;
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

// "R" running, "S" sleeping, "T" stopped, "D" in the kernel...: the state letter of
// /proc/<pid>/stat with its meaning, or "" when it cannot be read.
std::string processState(int pid);

}  // namespace hetra::launch
