#include "run/run_allocators.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace sdalloc::run {
namespace {

#ifndef SDALLOC_PRELOAD_LIBRARY_DEFAULT
#define SDALLOC_PRELOAD_LIBRARY_DEFAULT ""  // the build has no drop-in target (yet)
#endif

const replay::SystemAllocator* system_allocator(const std::string& name) {
  for (const replay::SystemAllocator& a : replay::system_allocators()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

}  // namespace

const std::vector<RunAllocator>& run_allocators() {
  static const std::vector<RunAllocator> allocators = [] {
    std::vector<RunAllocator> list;
    for (const replay::SystemAllocator& a : replay::system_allocators()) {
      list.push_back({a.name, a.description, "", system_allocator(a.name), ""});
    }
    list.push_back({"sdalloc-pool", "sdalloc drop-in, caching pool", "pool", nullptr, ""});
    list.push_back({"sdalloc-vmm", "sdalloc drop-in, virtual-memory pool", "vmm", nullptr, ""});
    list.push_back({"sdalloc-planned", "sdalloc drop-in, planned arena", "planned", nullptr, ""});
    for (const char* mode : {"pool", "vmm", "planned"}) {
      list.push_back({std::string("sdalloc-").append(mode).append("-huge"),
                      std::string("sdalloc drop-in, mode:").append(mode).append(", huge pages"),
                      mode, nullptr, "huge_pages:true"});
    }
    return list;
  }();
  return allocators;
}

std::vector<std::string> run_allocator_names() {
  std::vector<std::string> names;
  for (const RunAllocator& a : run_allocators()) names.push_back(a.name);
  return names;
}

const RunAllocator* find_run_allocator(const std::string& name) {
  for (const RunAllocator& a : run_allocators()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

Launch launch_for(const RunAllocator& allocator, const std::string& preload_library,
                  const std::string& report_path) {
  Launch launch;
  if (allocator.system != nullptr) {
    const std::optional<std::string> library = replay::find_preload_library(*allocator.system);
    if (!library) {
      launch.problem = allocator.system->libraries.front() +
                       " not found; install it with: sudo apt-get install " +
                       allocator.system->package;
    } else {
      launch.preload = *library;
    }
    return launch;
  }
  if (preload_library.empty()) {
    launch.problem =
        "drop-in not built (libsdalloc_preload.so: build the sdalloc_preload target, or give "
        "--preload-library or SDALLOC_PRELOAD_LIBRARY)";
    return launch;
  }
  std::error_code error;
  if (!std::filesystem::is_regular_file(preload_library, error)) {
    launch.problem = "drop-in library " + preload_library + " not found";
    return launch;
  }
  launch.preload = preload_library;
  launch.report_path = report_path;
  // The drop-in's own variable (read before SDALLOC_CONF, which the PyTorch shim also reads
  // and which refuses the drop-in's keys).
  std::string conf = "mode:" + allocator.sdalloc_mode;
  if (!allocator.sdalloc_conf.empty()) conf.append(",").append(allocator.sdalloc_conf);
  launch.environment.emplace_back("SDALLOC_PRELOAD_CONF", conf + ",report:" + report_path);
  return launch;
}

std::string resolve_preload_library(const std::string& option) {
  if (!option.empty()) return option;
  const char* env = std::getenv("SDALLOC_PRELOAD_LIBRARY");
  if (env != nullptr && *env != '\0') return env;
  return SDALLOC_PRELOAD_LIBRARY_DEFAULT;
}

std::optional<SdallocReport> read_sdalloc_report(const std::string& path, std::string& problem) {
  problem.clear();
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    SdallocReport report;
    report.mode = j.at("mode").get<std::string>();
    report.peak_live_bytes = j.at("peak_live_bytes").get<std::uint64_t>();
    report.peak_reserved_bytes = j.at("peak_reserved_bytes").get<std::uint64_t>();
    report.pool_allocations = j.at("pool_allocations").get<std::uint64_t>();
    report.system_allocations = j.at("system_allocations").get<std::uint64_t>();
    return report;
  } catch (const nlohmann::json::exception& error) {
    problem = "sdalloc's report " + path + " is unreadable: " + error.what();
    return std::nullopt;
  }
}

}  // namespace sdalloc::run
