// Device probe: real values on this machine, the tool-output parsers on sample text, and the NVML /
// ROCm SMI code paths driven through fake entry points (this machine may have no GPU).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "device/probe.h"

namespace hetra::device {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool anyNoteContains(const HostInfo& info, const std::string& part) {
  for (const auto& note : info.notes)
    if (contains(note, part)) return true;
  return false;
}

TEST(DeviceProbe, HostValuesAreSane) {
  const HostInfo info = probeHost();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_GE(info.logicalCores, 1);
  EXPECT_EQ(info.logicalCores, CPU_COUNT(&set));
  EXPECT_GE(info.onlineCores, info.logicalCores);
  EXPECT_GT(info.memoryTotal, 0u);
  EXPECT_GT(info.memoryAvailable, 0u);
  EXPECT_LE(info.memoryAvailable, info.memoryTotal);
  EXPECT_FALSE(info.hostname.empty());
  EXPECT_FALSE(info.cpuModel.empty());
  for (const auto& gpu : info.gpus) {
    EXPECT_TRUE(gpu.vendor == "nvidia" || gpu.vendor == "amd") << gpu.vendor;
    EXPECT_FALSE(gpu.source.empty());
    EXPECT_LE(gpu.memoryFree, gpu.memoryTotal);
  }
  // Without GPUs, the notes say what was looked for.
  if (info.gpus.empty()) {
    EXPECT_TRUE(anyNoteContains(info, "NVML") || anyNoteContains(info, "nvidia-smi"));
    EXPECT_TRUE(anyNoteContains(info, "ROCm SMI") || anyNoteContains(info, "rocm-smi"));
  }
  std::cout << formatHostInfo(info);
}

TEST(DeviceProbe, JsonHasEveryField) {
  const HostInfo info = probeHost();
  const auto doc = nlohmann::json::parse(hostInfoJson(info));
  for (const char* key : {"hostname", "cpuModel", "logicalCores", "onlineCores", "cpuQuota",
                          "memoryTotal", "memoryAvailable", "memoryLimit", "gpus", "notes"})
    EXPECT_TRUE(doc.contains(key)) << key;
  EXPECT_EQ(doc["logicalCores"].get<int>(), info.logicalCores);
  EXPECT_EQ(doc["memoryTotal"].get<uint64_t>(), info.memoryTotal);
  EXPECT_EQ(doc["gpus"].size(), info.gpus.size());
  EXPECT_EQ(doc["notes"].size(), info.notes.size());

  HostInfo synthetic;
  synthetic.hostname = "h";
  GpuInfo gpu;
  gpu.vendor = "amd";
  gpu.index = 3;
  gpu.name = "MI250X";
  gpu.memoryTotal = 68719476736ull;
  gpu.memoryFree = 1ull << 30;
  gpu.source = "rocm_smi";
  gpu.temperatureC = 41;
  synthetic.gpus.push_back(gpu);
  const auto g = nlohmann::json::parse(hostInfoJson(synthetic))["gpus"][0];
  EXPECT_EQ(g["index"], 3);
  EXPECT_EQ(g["memoryTotal"].get<uint64_t>(), 68719476736ull);
  EXPECT_EQ(g["temperatureC"], 41);
  EXPECT_TRUE(g["utilizationPercent"].is_null());
  EXPECT_TRUE(g["uuid"].is_null());
}

TEST(DeviceProbe, FormatSaysNoneFoundOrListsGpus) {
  HostInfo info;
  info.hostname = "node7";
  info.logicalCores = 3;
  info.onlineCores = 8;
  info.memoryTotal = 16ull << 30;
  info.memoryAvailable = 5ull << 30;
  info.notes.push_back("NVML: cannot load libnvidia-ml.so.1");
  std::string text = formatHostInfo(info);
  EXPECT_TRUE(contains(text, "GPUs: none found")) << text;
  EXPECT_TRUE(contains(text, "3 usable (affinity) of 8 online")) << text;
  EXPECT_TRUE(contains(text, "5.0 GiB available of 16.0 GiB")) << text;
  EXPECT_TRUE(contains(text, "NVML: cannot load")) << text;

  GpuInfo gpu;
  gpu.vendor = "nvidia";
  gpu.index = 1;
  gpu.name = "NVIDIA A100-SXM4-40GB";
  gpu.architecture = "sm_80";
  gpu.memoryTotal = 40ull << 30;
  gpu.memoryFree = 39ull << 30;
  gpu.clockSmMHz = 210;
  gpu.clockSmMaxMHz = 1410;
  gpu.source = "nvml";
  info.gpus.push_back(gpu);
  text = formatHostInfo(info);
  EXPECT_FALSE(contains(text, "none found")) << text;
  EXPECT_TRUE(contains(text, "[1] nvidia NVIDIA A100-SXM4-40GB (sm_80): 39.0 GiB free of 40.0 GiB"))
      << text;
  EXPECT_TRUE(contains(text, "SM 210/1410 MHz")) << text;
}

// With the libraries absent, the probe runs the tools found on PATH: fake ones here, one that
// answers the query and one that fails.
TEST(DeviceProbe, FallsBackToToolsOnPath) {
  for (const char* library : {"libnvidia-ml.so.1", "librocm_smi64.so", "librocm_smi64.so.1"})
    if (void* handle = ::dlopen(library, RTLD_LAZY)) {
      ::dlclose(handle);
      GTEST_SKIP() << library << " is installed: the tool fallback is not used here";
    }
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("hetra-probe-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  auto script = [&](const std::string& name, const std::string& body) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << body;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  };
  script("nvidia-smi",
         "case \"$1\" in --query-gpu=index,name,*) ;; *) exit 3 ;; esac\n"
         "[ \"$2\" = --format=csv ] || exit 4\n"
         "echo 'index, name, memory.total [MiB], memory.free [MiB]'\n"
         "echo '0, Fake Tool GPU, 1024 MiB, 512 MiB'\n");
  script("rocm-smi", "echo 'ERROR: amdgpu driver not loaded'\nexit 1\n");
  const std::string oldPath = std::getenv("PATH") ? std::getenv("PATH") : "";
  ::setenv("PATH", (dir + ":" + oldPath).c_str(), 1);
  const HostInfo info = probeHost();
  // A wedged tool is killed at the timeout, with its children (the script's sleep).
  script("nvidia-smi", "sleep 30\n");
  ::setenv("HETRA_PROBE_TOOL_TIMEOUT_MS", "300", 1);
  const auto start = std::chrono::steady_clock::now();
  const HostInfo hung = probeHost();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::unsetenv("HETRA_PROBE_TOOL_TIMEOUT_MS");
  ::setenv("PATH", oldPath.c_str(), 1);
  std::filesystem::remove_all(dir);

  EXPECT_TRUE(hung.gpus.empty());
  EXPECT_TRUE(anyNoteContains(hung, "nvidia-smi: no answer within 300 ms (killed)"))
      << formatHostInfo(hung);
  // Killed at 300 ms, not waited for (the script sleeps 30 s); room for a sanitizer build.
  EXPECT_LT(seconds, 15.0);
  ASSERT_EQ(info.gpus.size(), 1u) << formatHostInfo(info);
  EXPECT_EQ(info.gpus[0].name, "Fake Tool GPU");
  EXPECT_EQ(info.gpus[0].source, "nvidia-smi");
  EXPECT_EQ(info.gpus[0].memoryTotal, 1024ull << 20);
  EXPECT_EQ(info.gpus[0].memoryFree, 512ull << 20);
  EXPECT_TRUE(anyNoteContains(info, "rocm-smi: exit status 1: ERROR: amdgpu driver not loaded"))
      << formatHostInfo(info);
}

// ---------------------------------------------------------------------------------------------
// Parsers

TEST(NvidiaSmiCsv, ParsesHeaderUnitsAndMissingValues) {
  const std::string text =
      "index, name, uuid, driver_version, memory.total [MiB], memory.free [MiB], utilization.gpu "
      "[%], "
      "clocks.current.sm [MHz], clocks.max.sm [MHz], clocks.current.memory [MHz], temperature.gpu\n"
      "0, NVIDIA H200, GPU-0a1b, 550.54.15, 143771 MiB, 143246 MiB, 7 %, 345 MHz, 1980 MHz, 3201 "
      "MHz, 29\n"
      "1, Tesla T4, GPU-ffee, 550.54.15, 15360 MiB, 15101 MiB, [N/A], [Not Supported], 1590 MHz, "
      "[N/A], 41\r\n"
      "\n";
  const auto gpus = parseNvidiaSmiCsv(text);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].vendor, "nvidia");
  EXPECT_EQ(gpus[0].source, "nvidia-smi");
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(gpus[0].uuid, "GPU-0a1b");
  EXPECT_EQ(gpus[0].driverVersion, "550.54.15");
  EXPECT_EQ(gpus[0].memoryTotal, 143771ull << 20);
  EXPECT_EQ(gpus[0].memoryFree, 143246ull << 20);
  EXPECT_EQ(gpus[0].utilizationPercent, 7);
  EXPECT_EQ(gpus[0].clockSmMHz, 345);
  EXPECT_EQ(gpus[0].clockSmMaxMHz, 1980);
  EXPECT_EQ(gpus[0].clockMemoryMHz, 3201);
  EXPECT_EQ(gpus[0].temperatureC, 29);
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_EQ(gpus[1].name, "Tesla T4");
  EXPECT_EQ(gpus[1].memoryTotal, 15360ull << 20);
  EXPECT_EQ(gpus[1].utilizationPercent, -1);
  EXPECT_EQ(gpus[1].clockSmMHz, -1);
  EXPECT_EQ(gpus[1].clockSmMaxMHz, 1590);
  EXPECT_EQ(gpus[1].clockMemoryMHz, -1);
  EXPECT_EQ(gpus[1].temperatureC, 41);
}

TEST(NvidiaSmiCsv, NoUnitsColumnSubsetAndComputeCapability) {
  // `nounits` output (units only in the header) and a reduced column set in another order.
  const auto gpus = parseNvidiaSmiCsv(
      "name, memory.free [MiB], memory.total [MiB], compute_cap\n"
      "NVIDIA GeForce RTX 4090, 20000, 24564, 8.9\n"
      "NVIDIA L4, 1, 23034, 8.9\n");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_EQ(gpus[0].memoryTotal, 24564ull << 20);
  EXPECT_EQ(gpus[0].memoryFree, 20000ull << 20);
  EXPECT_EQ(gpus[1].memoryFree, 1ull << 20);
  EXPECT_EQ(gpus[0].architecture, "sm_89");
  EXPECT_EQ(gpus[0].temperatureC, -1);
}

// Expects parse(text) to throw an Error whose message contains `reason`.
template <typename Parse>
void expectRefused(Parse parse, const std::string& text, const std::string& reason) {
  try {
    parse(text);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
}

TEST(NvidiaSmiCsv, RejectsOutputThatIsNotTheQuery) {
  EXPECT_TRUE(parseNvidiaSmiCsv("").empty());
  EXPECT_TRUE(parseNvidiaSmiCsv("index, name\n").empty());  // header only: no GPU
  expectRefused(parseNvidiaSmiCsv,
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
                "no header naming a 'name' column");
  expectRefused(parseNvidiaSmiCsv, "0, NVIDIA H200, 143771 MiB\n", "no header");
  expectRefused(parseNvidiaSmiCsv, "index, name, memory.total [MiB]\n0, H200\n", "has 2 fields");
}

TEST(RocmSmiJson, ParsesCardsInIndexOrderAndSkipsOthers) {
  const std::string text =
      "WARNING: AMD GPU device(s) is/are in a low-power state. Check power control/runtime_status\n"
      "{\"card10\": {\"Card Series\": \"AMD Instinct MI300X\", \"GFX Version\": \"gfx942\", "
      "\"VRAM Total Memory (B)\": \"206141652992\", \"VRAM Total Used Memory (B)\": "
      "\"301989888\"}, "
      "\"card2\": {\"Card series\": \"Radeon RX 7900 XTX\", \"Card model\": \"0x744c\", "
      "\"VRAM Total Memory (B)\": \"25753026560\", \"VRAM Total Used Memory (B)\": \"1048576\", "
      "\"GPU use (%)\": \"12\", \"Temperature (Sensor edge) (C)\": \"45.0\"}, "
      "\"card3\": {\"Card model\": \"0x7408\", \"VRAM Total Memory (B)\": \"N/A\"}, "
      "\"system\": {\"Driver version\": \"6.7.0\"}}\n";
  const auto gpus = parseRocmSmiJson(text);
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].index, 2);
  EXPECT_EQ(gpus[0].vendor, "amd");
  EXPECT_EQ(gpus[0].source, "rocm-smi");
  EXPECT_EQ(gpus[0].name, "Radeon RX 7900 XTX");
  EXPECT_EQ(gpus[0].memoryTotal, 25753026560ull);
  EXPECT_EQ(gpus[0].memoryFree, 25753026560ull - 1048576ull);
  EXPECT_EQ(gpus[0].utilizationPercent, 12);
  EXPECT_EQ(gpus[0].temperatureC, 45);
  EXPECT_EQ(gpus[1].index, 3);
  EXPECT_EQ(gpus[1].name, "0x7408");
  EXPECT_EQ(gpus[1].memoryTotal, 0u);
  EXPECT_EQ(gpus[2].index, 10);
  EXPECT_EQ(gpus[2].name, "AMD Instinct MI300X");
  EXPECT_EQ(gpus[2].architecture, "gfx942");
  EXPECT_EQ(gpus[2].memoryFree, 206141652992ull - 301989888ull);
  EXPECT_EQ(gpus[2].utilizationPercent, -1);
}

TEST(RocmSmiJson, RejectsTextThatIsNotJson) {
  expectRefused(parseRocmSmiJson, "ERROR: no amdgpu driver loaded", "holds no JSON object");
  expectRefused(parseRocmSmiJson, "{\"card0\": {\"VRAM Total Memory (B)\": }", "not valid JSON");
  EXPECT_TRUE(parseRocmSmiJson("{\"system\": {}}").empty());
}

// ---------------------------------------------------------------------------------------------
// Library probes through fake entry points (C ABI as the vendor headers declare it).

struct FakeNvmlMemory {
  unsigned long long total, free, used;
};
int fakeNvmlInitResult = 0;
int fakeNvmlShutdowns = 0;
int nvmlInit() {
  return fakeNvmlInitResult;
}
int nvmlShutdownFake() {
  return ++fakeNvmlShutdowns, 0;
}
const char* nvmlErrorStringFake(int rc) {
  return rc == 9 ? "Driver Not Loaded" : "Unknown Error";
}
int nvmlCount(unsigned* count) {
  return *count = 2, 0;
}
int nvmlHandle(unsigned index, void** device) {
  *device = reinterpret_cast<void*>(uintptr_t(0x1000 + index));
  return 0;
}
int nvmlName(void* device, char* name, unsigned length) {
  std::snprintf(name, length, "Fake GPU %d", int(uintptr_t(device) - 0x1000));
  return 0;
}
int nvmlMemory(void* device, FakeNvmlMemory* memory) {
  if (device == reinterpret_cast<void*>(0x1001)) return 3;  // NVML_ERROR_NOT_SUPPORTED
  *memory = {80ull << 30, 79ull << 30, 1ull << 30};
  return 0;
}
int nvmlClock(void* device, int type, unsigned* mhz) {
  return *mhz = type == 1 ? 1200 : 2600, 0;
}
int nvmlTemperature(void* device, int sensor, unsigned* celsius) {
  return *celsius = 33, 0;
}
int nvmlCapability(void* device, int* major, int* minor) {
  return *major = 9, *minor = 0, 0;
}
int nvmlDriver(char* text, unsigned length) {
  std::snprintf(text, length, "555.42");
  return 0;
}

SymbolLookup fakeNvml(const std::string& without = "") {
  static const std::map<std::string, void*> symbols = {
      {"nvmlInit_v2", reinterpret_cast<void*>(&nvmlInit)},
      {"nvmlShutdown", reinterpret_cast<void*>(&nvmlShutdownFake)},
      {"nvmlErrorString", reinterpret_cast<void*>(&nvmlErrorStringFake)},
      {"nvmlDeviceGetCount_v2", reinterpret_cast<void*>(&nvmlCount)},
      {"nvmlDeviceGetHandleByIndex_v2", reinterpret_cast<void*>(&nvmlHandle)},
      {"nvmlDeviceGetName", reinterpret_cast<void*>(&nvmlName)},
      {"nvmlDeviceGetMemoryInfo", reinterpret_cast<void*>(&nvmlMemory)},
      {"nvmlDeviceGetClockInfo", reinterpret_cast<void*>(&nvmlClock)},
      {"nvmlDeviceGetTemperature", reinterpret_cast<void*>(&nvmlTemperature)},
      {"nvmlDeviceGetCudaComputeCapability", reinterpret_cast<void*>(&nvmlCapability)},
      {"nvmlSystemGetDriverVersion", reinterpret_cast<void*>(&nvmlDriver)},
  };
  return [without](const char* name) -> void* {
    auto it = symbols.find(name);
    return it == symbols.end() || name == without ? nullptr : it->second;
  };
}

TEST(NvmlProbe, ReadsEveryDeviceThroughTheEntryPoints) {
  fakeNvmlInitResult = 0;
  fakeNvmlShutdowns = 0;
  HostInfo info;
  ASSERT_TRUE(probeNvml(fakeNvml(), info));
  ASSERT_EQ(info.gpus.size(), 2u);
  EXPECT_EQ(fakeNvmlShutdowns, 1);
  const GpuInfo& g0 = info.gpus[0];
  EXPECT_EQ(g0.vendor, "nvidia");
  EXPECT_EQ(g0.source, "nvml");
  EXPECT_EQ(g0.name, "Fake GPU 0");
  EXPECT_EQ(g0.memoryTotal, 80ull << 30);
  EXPECT_EQ(g0.memoryFree, 79ull << 30);
  EXPECT_EQ(g0.clockSmMHz, 1200);
  EXPECT_EQ(g0.clockMemoryMHz, 2600);
  EXPECT_EQ(g0.clockSmMaxMHz, -1);  // entry point absent
  EXPECT_EQ(g0.utilizationPercent, -1);
  EXPECT_EQ(g0.temperatureC, 33);
  EXPECT_EQ(g0.architecture, "sm_90");
  EXPECT_EQ(g0.driverVersion, "555.42");
  EXPECT_EQ(info.gpus[1].name, "Fake GPU 1");
  EXPECT_EQ(info.gpus[1].index, 1);
  EXPECT_EQ(info.gpus[1].memoryTotal, 0u);
  EXPECT_TRUE(anyNoteContains(info, "GPU 1 memory unknown")) << info.notes.size();
}

TEST(NvmlProbe, InitFailureAndMissingEntryPointsAreNoted) {
  fakeNvmlInitResult = 9;
  HostInfo info;
  EXPECT_FALSE(probeNvml(fakeNvml(), info));
  EXPECT_TRUE(info.gpus.empty());
  EXPECT_TRUE(anyNoteContains(info, "Driver Not Loaded"));
  fakeNvmlInitResult = 0;
  HostInfo missing;
  EXPECT_FALSE(probeNvml(fakeNvml("nvmlDeviceGetMemoryInfo"), missing));
  EXPECT_TRUE(anyNoteContains(missing, "entry point"));
}

int rsmiInit(uint64_t) {
  return 0;
}
int rsmiShutdown() {
  return 0;
}
int rsmiCount(uint32_t* count) {
  return *count = 1, 0;
}
int rsmiName(uint32_t, char* name, size_t length) {
  std::snprintf(name, length, "Instinct MI210");
  return 0;
}
int rsmiTotal(uint32_t, int type, uint64_t* total) {
  return type == 0 ? (*total = 64ull << 30, 0) : 2;
}
int rsmiUsed(uint32_t, int type, uint64_t* used) {
  return type == 0 ? (*used = 4ull << 30, 0) : 2;
}
int rsmiBusy(uint32_t, uint32_t* percent) {
  return *percent = 57, 0;
}
int rsmiTemperature(uint32_t, uint32_t sensor, int metric, int64_t* milli) {
  if (sensor == 0) return 2;  // no edge sensor (as on MI300): the junction one is used
  return *milli = 51999, 0;
}

TEST(RocmSmiProbe, ReadsDevicesThroughTheEntryPoints) {
  const std::map<std::string, void*> symbols = {
      {"rsmi_init", reinterpret_cast<void*>(&rsmiInit)},
      {"rsmi_shut_down", reinterpret_cast<void*>(&rsmiShutdown)},
      {"rsmi_num_monitor_devices", reinterpret_cast<void*>(&rsmiCount)},
      {"rsmi_dev_name_get", reinterpret_cast<void*>(&rsmiName)},
      {"rsmi_dev_memory_total_get", reinterpret_cast<void*>(&rsmiTotal)},
      {"rsmi_dev_memory_usage_get", reinterpret_cast<void*>(&rsmiUsed)},
      {"rsmi_dev_busy_percent_get", reinterpret_cast<void*>(&rsmiBusy)},
      {"rsmi_dev_temp_metric_get", reinterpret_cast<void*>(&rsmiTemperature)},
  };
  HostInfo info;
  ASSERT_TRUE(probeRocmSmi(
      [&](const char* name) -> void* {
        auto it = symbols.find(name);
        return it == symbols.end() ? nullptr : it->second;
      },
      info));
  ASSERT_EQ(info.gpus.size(), 1u);
  const GpuInfo& g = info.gpus[0];
  EXPECT_EQ(g.vendor, "amd");
  EXPECT_EQ(g.source, "rocm_smi");
  EXPECT_EQ(g.name, "Instinct MI210");
  EXPECT_EQ(g.memoryTotal, 64ull << 30);
  EXPECT_EQ(g.memoryFree, 60ull << 30);
  EXPECT_EQ(g.utilizationPercent, 57);
  EXPECT_EQ(g.temperatureC, 51);

  HostInfo none;
  EXPECT_FALSE(probeRocmSmi([](const char*) -> void* { return nullptr; }, none));
  EXPECT_TRUE(anyNoteContains(none, "ROCm SMI"));
}

}  // namespace
}  // namespace hetra::device
