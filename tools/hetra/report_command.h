// `hetra report METRICS.jsonl [--timeline FILE] -o DIR`: the run's HTML page with its figures,
// drawn by the project's Python module tools/report/hetra_report.py (matplotlib), which this
// command finds beside the binary once installed (share/hetra/report) or in the source tree.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace hetra::cli {

struct ReportCommandOptions {
  std::string metricsPath;
  std::string timelinePath;  // "" = no Gantt chart
  std::string outputDir;
};

// Declares the subcommand and its options, which fill `options`.
CLI::App* addReportCommand(CLI::App& app, ReportCommandOptions& options);

// Runs the module with HETRA_PYTHON; returns its exit status. Throws ConfigError when the module
// or the interpreter cannot be found.
int runReport(const ReportCommandOptions& options);

}  // namespace hetra::cli
