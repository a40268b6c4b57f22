// Host probe: CPU and memory from /proc and cgroup files; GPUs from the vendor management libraries
// (NVML, ROCm SMI) loaded with dlopen, else from their command-line tools with a timeout. The few
// vendor types used are declared here so that no SDK header is needed to build.
#include "device/probe.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/errors.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/params.h"
#include "common/timing.h"

namespace hetra::device {

const char* const kNvidiaSmiQuery =
    "index,name,uuid,driver_version,memory.total,memory.free,utilization.gpu,clocks.sm,clocks.max."
    "sm,"
    "clocks.mem,temperature.gpu";

namespace {

// A vendor tool may hang when its driver is wedged; the probe must not.
const Param kToolTimeoutMs("HETRA_PROBE_TOOL_TIMEOUT_MS", "15000",
                           "Milliseconds the device probe waits for nvidia-smi or rocm-smi before "
                           "killing it.");
constexpr size_t kMaxToolOutput = 4u << 20;

std::string trim(const std::string& s) {
  size_t begin = 0, end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(begin, end - begin);
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// ---------------------------------------------------------------------------------------------
// CPU and memory

std::string cpuModel() {
  // x86 names the CPU "model name"; arm64 and POWER kernels use other keys, tried in order.
  std::map<std::string, std::string> fields;
  std::istringstream in(readText("/proc/cpuinfo"));
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    if (!fields.count(key)) fields[key] = trim(line.substr(colon + 1));
  }
  for (const char* key : {"model name", "Model", "Hardware", "cpu", "Processor"})
    if (fields.count(key) && !fields[key].empty()) return fields[key];
  return "unknown";
}

int affinityCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

uint64_t meminfoBytes(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    uint64_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  return 0;
}

// cgroup v2 limits of this process's group ("max" = unlimited). Containers often cap CPUs by quota
// rather than by affinity, and that is what a balancer must respect.
std::string cgroupFile(const std::string& name) {
  std::istringstream in(readText("/proc/self/cgroup"));
  std::string group = "/";
  for (std::string line; std::getline(in, line);)
    if (line.rfind("0::", 0) == 0) group = line.substr(3);
  std::string text = readText("/sys/fs/cgroup" + group + "/" + name);
  if (text.empty()) text = readText("/sys/fs/cgroup/" + name);
  return trim(text);
}

double cgroupCpuQuota() {
  std::istringstream in(cgroupFile("cpu.max"));
  std::string quota;
  double period = 0;
  in >> quota >> period;
  if (quota.empty() || quota == "max" || period <= 0) return 0;
  try {
    return std::stod(quota) / period;
  } catch (const std::exception&) {
    return 0;
  }
}

uint64_t cgroupMemoryLimit() {
  const std::string text = cgroupFile("memory.max");
  if (text.empty() || text == "max") return 0;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return 0;
  }
}

// ---------------------------------------------------------------------------------------------
// Vendor tools

std::optional<std::string> findExecutable(const std::string& name,
                                          const std::vector<std::string>& extraDirs = {}) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::istringstream in(path);
    for (std::string dir; std::getline(in, dir, ':');)
      if (!dir.empty()) dirs.push_back(dir);
  }
  dirs.insert(dirs.end(), extraDirs.begin(), extraDirs.end());
  for (const auto& dir : dirs) {
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

// Runs argv[0] (a path) with stdout captured and stderr discarded; kills it at the timeout.
// Returns the output when it exits with status 0, else nullopt with `error` set.
std::optional<std::string> runTool(const std::vector<std::string>& argv, Millis timeout,
                                   std::string& error) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    error = str("pipe: ", std::strerror(errno));
    return std::nullopt;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    error = str("fork: ", std::strerror(errno));
    ::close(out[0]);
    ::close(out[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec: the parent may have other threads.
    // Its own process group, so that a timeout kills a wrapper script's children too.
    ::setpgid(0, 0);
    const int devNull = ::open("/dev/null", O_RDWR);
    ::dup2(out[1], 1);
    if (devNull >= 0) {
      ::dup2(devNull, 0);
      ::dup2(devNull, 2);
    }
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string output;
  bool timedOut = false;
  const Deadline deadline = deadlineAfter(timeout);
  char buffer[8192];
  for (;;) {
    pollfd p{out[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, int(remaining(deadline).count()));
    if (ready == 0) {
      timedOut = true;
      break;
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const ssize_t n = ::read(out[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output.size() < kMaxToolOutput) output.append(buffer, size_t(n));
  }
  ::close(out[0]);
  if (timedOut) {
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);  // in case the child had not made its group yet
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timedOut) {
    error = str("no answer within ", timeout.count(), " ms (killed)");
    return std::nullopt;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    error = WIFEXITED(status) ? str("exit status ", WEXITSTATUS(status))
                              : str("killed by signal ", WTERMSIG(status));
    const std::string firstLine = trim(output.substr(0, output.find('\n')));
    if (!firstLine.empty()) error += ": " + firstLine;
    return std::nullopt;
  }
  return output;
}

// "81559 MiB", "45 %", "[N/A]" -> number (scaled by the unit to bytes for memory), or nullopt.
std::optional<double> parseQuantity(const std::string& raw, const std::string& headerUnit) {
  const std::string text = trim(raw);
  if (text.empty() || text[0] == '[' || lower(text) == "n/a") return std::nullopt;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::string unit = trim(text.substr(used));
  if (unit.empty()) unit = headerUnit;
  if (unit == "KiB")
    value *= 1024.0;
  else if (unit == "MiB")
    value *= 1024.0 * 1024.0;
  else if (unit == "GiB")
    value *= 1024.0 * 1024.0 * 1024.0;
  return value;
}

int optionalInt(const std::optional<double>& v) {
  return v ? int(std::lround(*v)) : -1;
}

std::vector<std::string> splitCsv(const std::string& line) {
  std::vector<std::string> fields;
  std::istringstream in(line);
  for (std::string field; std::getline(in, field, ',');) fields.push_back(trim(field));
  if (!line.empty() && line.back() == ',') fields.push_back("");
  return fields;
}

// ---------------------------------------------------------------------------------------------
// Libraries

// Library handles stay loaded: some vendor libraries do not survive being unloaded (background
// threads), and dlopen of an already loaded library is cheap.
void* openLibrary(const std::vector<std::string>& names, std::string& error) {
  for (const auto& name : names) {
    if (void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    if (error.empty()) error = ::dlerror();
  }
  return nullptr;
}

template <typename Fn>
Fn symbol(const SymbolLookup& lookup, const char* name) {
  return reinterpret_cast<Fn>(lookup(name));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// NVML: declared here from NVIDIA's documented C API (ABI-stable entry points with _v2 suffixes).

namespace nvml {
using Return = int;  // nvmlReturn_t; 0 = NVML_SUCCESS
using Device = struct DeviceOpaque*;
struct Memory {
  unsigned long long total, free, used;
};
struct Utilization {
  unsigned int gpu, memory;
};
constexpr int kClockSm = 1;         // NVML_CLOCK_SM
constexpr int kClockMem = 2;        // NVML_CLOCK_MEM
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
}  // namespace nvml

bool probeNvml(const SymbolLookup& lookup, HostInfo& info) {
  using namespace nvml;
  auto init = symbol<Return (*)()>(lookup, "nvmlInit_v2");
  auto shutdown = symbol<Return (*)()>(lookup, "nvmlShutdown");
  auto getCount = symbol<Return (*)(unsigned*)>(lookup, "nvmlDeviceGetCount_v2");
  auto getHandle = symbol<Return (*)(unsigned, Device*)>(lookup, "nvmlDeviceGetHandleByIndex_v2");
  auto getName = symbol<Return (*)(Device, char*, unsigned)>(lookup, "nvmlDeviceGetName");
  auto getMemory = symbol<Return (*)(Device, Memory*)>(lookup, "nvmlDeviceGetMemoryInfo");
  if (!init || !shutdown || !getCount || !getHandle || !getName || !getMemory) {
    info.notes.push_back("NVML: the library lacks a required entry point (driver too old?)");
    return false;
  }
  // Optional entry points: older drivers or some GPUs do not report them.
  auto errorString = symbol<const char* (*)(Return)>(lookup, "nvmlErrorString");
  auto getUtilization =
      symbol<Return (*)(Device, Utilization*)>(lookup, "nvmlDeviceGetUtilizationRates");
  auto getClock = symbol<Return (*)(Device, int, unsigned*)>(lookup, "nvmlDeviceGetClockInfo");
  auto getMaxClock =
      symbol<Return (*)(Device, int, unsigned*)>(lookup, "nvmlDeviceGetMaxClockInfo");
  auto getTemperature =
      symbol<Return (*)(Device, int, unsigned*)>(lookup, "nvmlDeviceGetTemperature");
  auto getUuid = symbol<Return (*)(Device, char*, unsigned)>(lookup, "nvmlDeviceGetUUID");
  auto getCapability =
      symbol<Return (*)(Device, int*, int*)>(lookup, "nvmlDeviceGetCudaComputeCapability");
  auto getDriver = symbol<Return (*)(char*, unsigned)>(lookup, "nvmlSystemGetDriverVersion");
  auto describe = [&](Return rc) {
    return errorString ? str(errorString(rc), " (", rc, ")") : str("error ", rc);
  };

  if (Return rc = init(); rc != 0) {
    info.notes.push_back(str("NVML: nvmlInit_v2 failed: ", describe(rc)));
    return false;
  }
  char text[256] = {};
  std::string driver;
  if (getDriver && getDriver(text, sizeof(text)) == 0) driver = text;
  unsigned count = 0;
  if (Return rc = getCount(&count); rc != 0) {
    info.notes.push_back(str("NVML: nvmlDeviceGetCount_v2 failed: ", describe(rc)));
    shutdown();
    return false;
  }
  if (count == 0) info.notes.push_back("NVML: loaded, but it reports no NVIDIA GPU");
  for (unsigned i = 0; i < count; ++i) {
    Device device = nullptr;
    Memory memory{};
    if (Return rc = getHandle(i, &device); rc != 0) {
      info.notes.push_back(str("NVML: GPU ", i, " skipped: ", describe(rc)));
      continue;
    }
    GpuInfo gpu;
    gpu.vendor = "nvidia";
    gpu.index = int(i);
    gpu.source = "nvml";
    gpu.driverVersion = driver;
    if (getName(device, text, sizeof(text)) == 0) gpu.name = text;
    if (Return rc = getMemory(device, &memory); rc == 0) {
      gpu.memoryTotal = memory.total;
      gpu.memoryFree = memory.free;
    } else {
      info.notes.push_back(str("NVML: GPU ", i, " memory unknown: ", describe(rc)));
    }
    Utilization utilization{};
    unsigned value = 0;
    if (getUtilization && getUtilization(device, &utilization) == 0)
      gpu.utilizationPercent = int(utilization.gpu);
    if (getClock && getClock(device, kClockSm, &value) == 0) gpu.clockSmMHz = int(value);
    if (getMaxClock && getMaxClock(device, kClockSm, &value) == 0) gpu.clockSmMaxMHz = int(value);
    if (getClock && getClock(device, kClockMem, &value) == 0) gpu.clockMemoryMHz = int(value);
    if (getTemperature && getTemperature(device, kTemperatureGpu, &value) == 0)
      gpu.temperatureC = int(value);
    if (getUuid && getUuid(device, text, sizeof(text)) == 0) gpu.uuid = text;
    int major = 0, minor = 0;
    if (getCapability && getCapability(device, &major, &minor) == 0)
      gpu.architecture = str("sm_", major, minor);
    info.gpus.push_back(std::move(gpu));
  }
  shutdown();
  return true;
}

// ---------------------------------------------------------------------------------------------
// ROCm SMI: declared here from AMD's rocm_smi.h.

namespace rsmi {
using Status = int;                           // rsmi_status_t; 0 = RSMI_STATUS_SUCCESS
constexpr int kMemoryVram = 0;                // RSMI_MEM_TYPE_VRAM
constexpr uint32_t kTemperatureEdge = 0;      // RSMI_TEMP_TYPE_EDGE
constexpr uint32_t kTemperatureJunction = 1;  // RSMI_TEMP_TYPE_JUNCTION (MI300 has no edge sensor)
constexpr int kTemperatureCurrent = 0;        // RSMI_TEMP_CURRENT
}  // namespace rsmi

bool probeRocmSmi(const SymbolLookup& lookup, HostInfo& info) {
  using namespace rsmi;
  auto init = symbol<Status (*)(uint64_t)>(lookup, "rsmi_init");
  auto shutdown = symbol<Status (*)()>(lookup, "rsmi_shut_down");
  auto getCount = symbol<Status (*)(uint32_t*)>(lookup, "rsmi_num_monitor_devices");
  auto getName = symbol<Status (*)(uint32_t, char*, size_t)>(lookup, "rsmi_dev_name_get");
  auto getTotal = symbol<Status (*)(uint32_t, int, uint64_t*)>(lookup, "rsmi_dev_memory_total_get");
  auto getUsed = symbol<Status (*)(uint32_t, int, uint64_t*)>(lookup, "rsmi_dev_memory_usage_get");
  if (!init || !shutdown || !getCount || !getName || !getTotal || !getUsed) {
    info.notes.push_back("ROCm SMI: the library lacks a required entry point");
    return false;
  }
  auto statusString = symbol<Status (*)(Status, const char**)>(lookup, "rsmi_status_string");
  auto getBusy = symbol<Status (*)(uint32_t, uint32_t*)>(lookup, "rsmi_dev_busy_percent_get");
  auto getTemperature =
      symbol<Status (*)(uint32_t, uint32_t, int, int64_t*)>(lookup, "rsmi_dev_temp_metric_get");
  auto describe = [&](Status rc) {
    const char* text = nullptr;
    if (statusString && statusString(rc, &text) == 0 && text) return str(text, " (", rc, ")");
    return str("error ", rc);
  };

  if (Status rc = init(0); rc != 0) {
    info.notes.push_back(str("ROCm SMI: rsmi_init failed: ", describe(rc)));
    return false;
  }
  uint32_t count = 0;
  if (Status rc = getCount(&count); rc != 0) {
    info.notes.push_back(str("ROCm SMI: rsmi_num_monitor_devices failed: ", describe(rc)));
    shutdown();
    return false;
  }
  if (count == 0) info.notes.push_back("ROCm SMI: loaded, but it reports no AMD GPU");
  for (uint32_t i = 0; i < count; ++i) {
    GpuInfo gpu;
    gpu.vendor = "amd";
    gpu.index = int(i);
    gpu.source = "rocm_smi";
    char name[256] = {};
    if (getName(i, name, sizeof(name)) == 0) gpu.name = name;
    uint64_t total = 0, used = 0;
    if (Status rc = getTotal(i, kMemoryVram, &total); rc == 0) {
      gpu.memoryTotal = total;
      if (getUsed(i, kMemoryVram, &used) == 0) gpu.memoryFree = total > used ? total - used : 0;
    } else {
      info.notes.push_back(str("ROCm SMI: GPU ", i, " memory unknown: ", describe(rc)));
    }
    uint32_t busy = 0;
    if (getBusy && getBusy(i, &busy) == 0) gpu.utilizationPercent = int(busy);
    int64_t milliC = 0;
    if (getTemperature &&
        (getTemperature(i, kTemperatureEdge, kTemperatureCurrent, &milliC) == 0 ||
         getTemperature(i, kTemperatureJunction, kTemperatureCurrent, &milliC) == 0))
      gpu.temperatureC = int(milliC / 1000);
    info.gpus.push_back(std::move(gpu));
  }
  shutdown();
  return true;
}

// ---------------------------------------------------------------------------------------------
// Tool output parsers

std::vector<GpuInfo> parseNvidiaSmiCsv(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!trim(line).empty()) lines.push_back(trim(line));
  if (lines.empty()) return {};

  // Header "memory.total [MiB]": column name and the unit of its values.
  std::vector<std::string> names, units;
  for (const auto& field : splitCsv(lines[0])) {
    const size_t bracket = field.find(" [");
    names.push_back(lower(trim(field.substr(0, bracket))));
    units.push_back(bracket == std::string::npos
                        ? ""
                        : field.substr(bracket + 2, field.find(']', bracket) - bracket - 2));
  }
  auto column = [&](std::initializer_list<const char*> aliases) -> int {
    for (const char* alias : aliases)
      for (size_t i = 0; i < names.size(); ++i)
        if (names[i] == alias) return int(i);
    return -1;
  };
  const int nameCol = column({"name"});
  if (nameCol < 0)
    throw Error(str("nvidia-smi output has no header naming a 'name' column: '", lines[0], "'"));
  const int indexCol = column({"index"});
  const int uuidCol = column({"uuid"});
  const int driverCol = column({"driver_version"});
  const int totalCol = column({"memory.total"});
  const int freeCol = column({"memory.free"});
  const int utilCol = column({"utilization.gpu"});
  const int smCol = column({"clocks.sm", "clocks.current.sm"});
  const int smMaxCol = column({"clocks.max.sm", "clocks.max.sm_clock"});
  const int memCol = column({"clocks.mem", "clocks.current.memory"});
  const int tempCol = column({"temperature.gpu"});
  const int capCol = column({"compute_cap"});

  std::vector<GpuInfo> gpus;
  for (size_t row = 1; row < lines.size(); ++row) {
    const auto fields = splitCsv(lines[row]);
    if (fields.size() != names.size())
      throw Error(str("nvidia-smi line ", row + 1, " has ", fields.size(), " fields, the header ",
                      names.size(), ": '", lines[row], "'"));
    auto quantity = [&](int col) -> std::optional<double> {
      return col < 0 ? std::nullopt : parseQuantity(fields[col], units[col]);
    };
    auto textAt = [&](int col) {
      return col < 0 || fields[col].empty() || fields[col][0] == '[' ? std::string() : fields[col];
    };
    GpuInfo gpu;
    gpu.vendor = "nvidia";
    gpu.source = "nvidia-smi";
    gpu.index = indexCol >= 0 ? optionalInt(quantity(indexCol)) : int(row - 1);
    gpu.name = textAt(nameCol);
    gpu.uuid = textAt(uuidCol);
    gpu.driverVersion = textAt(driverCol);
    gpu.memoryTotal = uint64_t(quantity(totalCol).value_or(0));
    gpu.memoryFree = uint64_t(quantity(freeCol).value_or(0));
    gpu.utilizationPercent = optionalInt(quantity(utilCol));
    gpu.clockSmMHz = optionalInt(quantity(smCol));
    gpu.clockSmMaxMHz = optionalInt(quantity(smMaxCol));
    gpu.clockMemoryMHz = optionalInt(quantity(memCol));
    gpu.temperatureC = optionalInt(quantity(tempCol));
    if (const std::string cap = textAt(capCol); !cap.empty()) {
      std::string digits;
      for (char c : cap)
        if (std::isdigit(static_cast<unsigned char>(c))) digits += c;
      gpu.architecture = "sm_" + digits;
    }
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

std::vector<GpuInfo> parseRocmSmiJson(const std::string& text) {
  // rocm-smi may print warnings around the JSON document.
  const size_t begin = text.find('{');
  const size_t end = text.rfind('}');
  if (begin == std::string::npos || end == std::string::npos || end < begin)
    throw Error(str("rocm-smi output holds no JSON object: '", trim(text.substr(0, 200)), "'"));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.begin() + long(begin), text.begin() + long(end) + 1);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("rocm-smi output is not valid JSON: ", e.what()));
  }
  if (!doc.is_object()) throw Error("rocm-smi JSON is not an object of cards");

  std::vector<GpuInfo> gpus;
  for (const auto& [key, card] : doc.items()) {
    // Cards are "card0", "card1", ...; other entries ("system") hold no GPU.
    if (key.rfind("card", 0) != 0 || key.size() == 4 || !card.is_object() ||
        key.find_first_not_of("0123456789", 4) != std::string::npos)
      continue;
    // Field names changed case between ROCm releases ("Card series" / "Card Series").
    std::map<std::string, std::string> fields;
    for (const auto& [name, value] : card.items())
      fields[lower(name)] = value.is_string() ? value.get<std::string>() : value.dump();
    auto field = [&](std::initializer_list<const char*> names) -> std::string {
      for (const char* name : names)
        if (auto it = fields.find(name);
            it != fields.end() && !trim(it->second).empty() && lower(trim(it->second)) != "n/a")
          return trim(it->second);
      return "";
    };
    auto number = [&](std::initializer_list<const char*> names) -> std::optional<double> {
      const std::string value = field(names);
      return value.empty() ? std::nullopt : parseQuantity(value, "");
    };
    GpuInfo gpu;
    gpu.vendor = "amd";
    gpu.source = "rocm-smi";
    gpu.index = std::stoi(key.substr(4));
    gpu.name = field({"card series", "device name", "card model"});
    gpu.architecture = field({"gfx version"});
    gpu.uuid = field({"unique id"});
    gpu.driverVersion = field({"driver version"});
    const auto total = number({"vram total memory (b)"});
    const auto used = number({"vram total used memory (b)"});
    if (total) gpu.memoryTotal = uint64_t(*total);
    if (total && used) gpu.memoryFree = *total > *used ? uint64_t(*total - *used) : 0;
    gpu.utilizationPercent = optionalInt(number({"gpu use (%)"}));
    gpu.temperatureC =
        optionalInt(number({"temperature (sensor edge) (c)", "temperature (sensor junction) (c)"}));
    gpus.push_back(std::move(gpu));
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const GpuInfo& a, const GpuInfo& b) { return a.index < b.index; });
  return gpus;
}

// ---------------------------------------------------------------------------------------------

namespace {

// One vendor: the library first; when it cannot be used, the tool. Notes say what was missing.
template <typename Parse>
void probeVendor(HostInfo& info, const char* label, const std::vector<std::string>& libraries,
                 bool (*probeLibrary)(const SymbolLookup&, HostInfo&), const std::string& tool,
                 const std::vector<std::string>& toolDirs, std::vector<std::string> toolArgs,
                 Parse parse) {
  std::string loadError;
  if (void* handle = openLibrary(libraries, loadError)) {
    if (probeLibrary([handle](const char* name) { return ::dlsym(handle, name); }, info)) return;
  } else {
    info.notes.push_back(str(label, ": cannot load ", libraries[0], " (", loadError, ")"));
  }
  const auto path = findExecutable(tool, toolDirs);
  if (!path) {
    info.notes.push_back(str(tool, ": not found on PATH"));
    return;
  }
  toolArgs.insert(toolArgs.begin(), *path);
  std::string error;
  const auto output = runTool(toolArgs, Millis(kToolTimeoutMs.integer()), error);
  if (!output) {
    info.notes.push_back(str(tool, ": ", error));
    return;
  }
  try {
    const std::vector<GpuInfo> gpus = parse(*output);
    if (gpus.empty()) info.notes.push_back(str(tool, ": reports no GPU"));
    info.gpus.insert(info.gpus.end(), gpus.begin(), gpus.end());
  } catch (const Error& e) {
    info.notes.push_back(str(tool, ": ", e.what()));
  }
}

std::string gib(uint64_t bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << double(bytes) / double(1ull << 30) << " GiB";
  return os.str();
}

}  // namespace

HostInfo probeHost() {
  HostInfo info;
  info.hostname = net::hostName();
  info.cpuModel = cpuModel();
  info.logicalCores = affinityCores();
  info.onlineCores = int(::sysconf(_SC_NPROCESSORS_ONLN));
  if (info.logicalCores <= 0) {
    info.logicalCores = std::max(1, info.onlineCores);
    info.notes.push_back("sched_getaffinity failed: using the online CPU count");
  }
  info.cpuQuota = cgroupCpuQuota();
  const std::string meminfo = readText("/proc/meminfo");
  info.memoryTotal = meminfoBytes(meminfo, "MemTotal");
  info.memoryAvailable = meminfoBytes(meminfo, "MemAvailable");
  if (info.memoryTotal == 0) info.notes.push_back("/proc/meminfo unreadable: memory unknown");
  info.memoryLimit = cgroupMemoryLimit();

  probeVendor(info, "NVML", {"libnvidia-ml.so.1"}, &probeNvml, "nvidia-smi", {},
              {str("--query-gpu=", kNvidiaSmiQuery), "--format=csv"}, &parseNvidiaSmiCsv);
  probeVendor(info, "ROCm SMI",
              {"librocm_smi64.so", "librocm_smi64.so.1", "/opt/rocm/lib/librocm_smi64.so"},
              &probeRocmSmi, "rocm-smi", {"/opt/rocm/bin"},
              {"--showmeminfo", "vram", "--showproductname", "--json"}, &parseRocmSmiJson);
  HETRA_DEBUG("device", "probe: ", info.gpus.size(), " GPUs, ", info.notes.size(), " notes");
  return info;
}

std::string formatHostInfo(const HostInfo& info) {
  std::ostringstream os;
  os << "Host: " << info.hostname << "\n";
  os << "CPU: " << info.cpuModel << "\n";
  os << "Cores: " << info.logicalCores << " usable (affinity) of " << info.onlineCores << " online";
  if (info.cpuQuota > 0) os << "; cgroup quota " << info.cpuQuota << " CPUs";
  os << "\n";
  os << "Memory: " << gib(info.memoryAvailable) << " available of " << gib(info.memoryTotal);
  if (info.memoryLimit > 0) os << "; cgroup limit " << gib(info.memoryLimit);
  os << "\n";
  if (info.gpus.empty()) {
    os << "GPUs: none found\n";
  } else {
    os << "GPUs: " << info.gpus.size() << "\n";
    for (const auto& g : info.gpus) {
      os << "  [" << g.index << "] " << g.vendor << " " << (g.name.empty() ? "?" : g.name);
      if (!g.architecture.empty()) os << " (" << g.architecture << ")";
      os << ": " << gib(g.memoryFree) << " free of " << gib(g.memoryTotal);
      if (g.utilizationPercent >= 0) os << "; util " << g.utilizationPercent << "%";
      if (g.clockSmMHz >= 0) {
        os << "; SM " << g.clockSmMHz;
        if (g.clockSmMaxMHz >= 0) os << "/" << g.clockSmMaxMHz;
        os << " MHz";
      }
      if (g.clockMemoryMHz >= 0) os << "; mem " << g.clockMemoryMHz << " MHz";
      if (g.temperatureC >= 0) os << "; " << g.temperatureC << " C";
      os << "; via " << g.source << "\n";
    }
  }
  if (!info.notes.empty()) {
    os << "Notes:\n";
    for (const auto& note : info.notes) os << "  - " << note << "\n";
  }
  return os.str();
}

std::string hostInfoJson(const HostInfo& info) {
  auto optional = [](int v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  auto text = [](const std::string& s) {
    return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
  };
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& g : info.gpus) {
    gpus.push_back({{"vendor", g.vendor},
                    {"index", g.index},
                    {"name", g.name},
                    {"memoryTotal", g.memoryTotal},
                    {"memoryFree", g.memoryFree},
                    {"source", g.source},
                    {"uuid", text(g.uuid)},
                    {"architecture", text(g.architecture)},
                    {"driverVersion", text(g.driverVersion)},
                    {"utilizationPercent", optional(g.utilizationPercent)},
                    {"clockSmMHz", optional(g.clockSmMHz)},
                    {"clockSmMaxMHz", optional(g.clockSmMaxMHz)},
                    {"clockMemoryMHz", optional(g.clockMemoryMHz)},
                    {"temperatureC", optional(g.temperatureC)}});
  }
  const nlohmann::json doc = {{"hostname", info.hostname},
                              {"cpuModel", info.cpuModel},
                              {"logicalCores", info.logicalCores},
                              {"onlineCores", info.onlineCores},
                              {"cpuQuota", info.cpuQuota},
                              {"memoryTotal", info.memoryTotal},
                              {"memoryAvailable", info.memoryAvailable},
                              {"memoryLimit", info.memoryLimit},
                              {"gpus", gpus},
                              {"notes", info.notes}};
  return doc.dump(2);
}

}  // namespace hetra::device
