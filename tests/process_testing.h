// Helpers for the tests that run the hetra binary and look at the rank processes it starts.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "shm_testing.h"

namespace hetra::test {

// The whole file as text ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The exit status of the child `pid` (128 + signal when killed), or -1 when it has not ended within
// `seconds` (it is then left running: the caller kills it).
inline int waitForExit(pid_t pid, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// The child processes of `parent` with HETRA_RANK set, indexed by rank (-1 where none is found).
inline std::vector<pid_t> rankProcesses(pid_t parent, int ranks) {
  std::vector<pid_t> out(size_t(ranks), -1);
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string status = slurp(entry.path() / "status");
    const auto ppid = status.find("PPid:\t");
    if (ppid == std::string::npos || std::stoi(status.substr(ppid + 6)) != parent) continue;
    const std::string environ = slurp(entry.path() / "environ");
    const auto at = environ.find(std::string("HETRA_RANK="));
    if (at == std::string::npos || (at > 0 && environ[at - 1] != '\0')) continue;
    const int rank = std::atoi(environ.c_str() + at + 11);
    if (rank >= 0 && rank < ranks) out[size_t(rank)] = pid_t(std::stoi(name));
  }
  return out;
}

// The /dev/shm segments that any of these processes created and left behind.
inline std::vector<std::string> shmSegmentsOf(const std::vector<pid_t>& pids) {
  std::vector<std::string> out;
  for (pid_t pid : pids)
    for (auto& name : shmSegmentsOfPid(pid)) out.push_back(std::move(name));
  return out;
}

}  // namespace hetra::test
