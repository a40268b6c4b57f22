#include "report_command.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/errors.h"
#include "common/params.h"

namespace hetra::cli {
namespace {

namespace fs = std::filesystem;

const Param kPython("HETRA_PYTHON", "/usr/bin/python3",
                    "The Python that draws `hetra report` (it needs matplotlib: Debian's "
                    "python3-matplotlib).");

constexpr const char* kModule = "hetra_report.py";

// Installed: <prefix>/bin/hetra beside <prefix>/share/hetra/report; else the source tree's copy
// (a build that was not installed).
fs::path findModule() {
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  std::vector<fs::path> candidates;
  if (!error) candidates.push_back(exe.parent_path() / ".." / HETRA_REPORT_INSTALL_DIR / kModule);
  candidates.push_back(fs::path(HETRA_REPORT_SOURCE_DIR) / kModule);
  for (const fs::path& candidate : candidates)
    if (fs::is_regular_file(candidate, error)) return fs::weakly_canonical(candidate, error);
  std::string tried;
  for (const fs::path& candidate : candidates) tried += " " + candidate.string();
  throw ConfigError(str("hetra report: cannot find ", kModule, " (looked at", tried,
                        "); install hetra or run it from its build tree"));
}

}  // namespace

CLI::App* addReportCommand(CLI::App& app, ReportCommandOptions& options) {
  auto* report = app.add_subcommand(
      "report", "Write an HTML page with the figures of a run's metrics (and timeline)");
  report->add_option("metrics", options.metricsPath, "The file of hetra run --metrics")->required();
  report->add_option("--timeline", options.timelinePath,
                     "The trace of hetra run --timeline (adds a Gantt chart)");
  report->add_option("-o,--output", options.outputDir, "Directory for index.html")->required();
  return report;
}

int runReport(const ReportCommandOptions& options) {
  const fs::path module = findModule();
  const std::string python = kPython.str();
  std::vector<std::string> args{python, module.string(), options.metricsPath, "-o",
                                options.outputDir};
  if (!options.timelinePath.empty()) {
    args.push_back("--timeline");
    args.push_back(options.timelinePath);
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t child = fork();
  if (child < 0) throw IoError(str("hetra report: fork: ", std::strerror(errno)));
  if (child == 0) {
    execv(python.c_str(), argv.data());
    std::fprintf(stderr,
                 "hetra report: cannot run %s (%s); set HETRA_PYTHON to a Python with "
                 "matplotlib\n",
                 python.c_str(), std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace hetra::cli
