#include "replay/system_allocators.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "replay/prepared_trace.hpp"
#include "replay/trace_player.hpp"
#include "sdalloc/core/errors.hpp"
#include "sdalloc/trace/event_trace.hpp"

extern char** environ;

namespace sdalloc::replay {
namespace {

#ifndef SDALLOC_LIBRARY_ARCHITECTURE
#define SDALLOC_LIBRARY_ARCHITECTURE ""
#endif

std::vector<std::string> library_directories() {
  const std::string arch = SDALLOC_LIBRARY_ARCHITECTURE;
  std::vector<std::string> dirs;
  if (!arch.empty()) {
    dirs.push_back("/usr/lib/" + arch);
    dirs.push_back("/lib/" + arch);
  }
  for (const char* d : {"/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib"}) dirs.emplace_back(d);
  return dirs;
}

// Resident bytes of this process now, read from /proc/self/statm (second field, in pages).
class ResidentSize {
 public:
  ResidentSize() : fd_(::open("/proc/self/statm", O_RDONLY | O_CLOEXEC)) {}
  ~ResidentSize() {
    if (fd_ >= 0) ::close(fd_);
  }
  ResidentSize(const ResidentSize&) = delete;
  ResidentSize& operator=(const ResidentSize&) = delete;

  std::uint64_t now() const {
    std::array<char, 128> buffer{};
    if (fd_ < 0) return 0;
    const ssize_t n = ::pread(fd_, buffer.data(), buffer.size() - 1, 0);
    if (n <= 0) return 0;
    unsigned long long size_pages = 0, resident_pages = 0;
    if (std::sscanf(buffer.data(), "%llu %llu", &size_pages, &resident_pages) != 2) return 0;
    return resident_pages * page_size_;
  }

 private:
  int fd_;
  std::uint64_t page_size_ = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
};

// Sets the process's peak resident size to its current one (Linux >= 4.0).
bool reset_peak_resident() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

// VmHWM from /proc/self/status, in bytes; 0 when it cannot be read.
std::uint64_t peak_resident() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

const SystemAllocator* find_system_allocator(const std::string& name) {
  for (const SystemAllocator& a : system_allocators()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

// Which allocator's marker symbols this process has: the one LD_PRELOAD brought in.
std::string loaded_allocator() {
  for (const SystemAllocator& a : system_allocators()) {
    if (!a.marker.empty() && ::dlsym(RTLD_DEFAULT, a.marker.c_str()) != nullptr) return a.name;
  }
  return "glibc";
}

// Runs argv with LD_PRELOAD set (when preload is not empty); returns its exit status and
// what it wrote on stdout. stderr is shared, so the child's progress line shows.
int spawn_and_read(const std::vector<std::string>& argv, const std::string& preload,
                   std::string& out) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);

  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env_strings.emplace_back(*e);
  }
  if (!preload.empty()) env_strings.push_back("LD_PRELOAD=" + preload);
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  argp.reserve(args.size() + 1);
  for (std::string& s : args) argp.push_back(s.data());
  argp.push_back(nullptr);

  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argp.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (rc != 0) {
    ::close(pipe_fds[0]);
    throw Error("cannot start " + args[0] + ": " + std::strerror(rc));
  }
  std::array<char, 65536> buffer{};
  for (;;) {
    const ssize_t n = ::read(pipe_fds[0], buffer.data(), buffer.size());
    if (n > 0) {
      out.append(buffer.data(), static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string self_executable() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) throw Error("cannot find this program's path (/proc/self/exe): " + error.message());
  return self.string();
}

}  // namespace

const std::vector<SystemAllocator>& system_allocators() {
  static const std::vector<SystemAllocator> allocators = {
      {"glibc", "glibc malloc (ptmalloc2), the system default", {}, "libc6", ""},
      {"jemalloc", "jemalloc, LD_PRELOAD", {"libjemalloc.so.2"}, "libjemalloc2", "mallctl"},
      {"mimalloc", "mimalloc, LD_PRELOAD", {"libmimalloc.so.2"}, "libmimalloc2.0", "mi_malloc"},
      {"tcmalloc",
       "tcmalloc (gperftools, minimal), LD_PRELOAD",
       {"libtcmalloc_minimal.so.4", "libtcmalloc.so.4"},
       "libtcmalloc-minimal4",
       "tc_malloc"},
  };
  return allocators;
}

std::optional<std::string> find_preload_library(const SystemAllocator& allocator) {
  if (allocator.libraries.empty()) return std::string();
  for (const std::string& dir : library_directories()) {
    for (const std::string& file : allocator.libraries) {
      const std::filesystem::path path = std::filesystem::path(dir) / file;
      std::error_code error;
      if (std::filesystem::is_regular_file(path, error)) return path.string();
    }
  }
  return std::nullopt;
}

bool built_with_sanitizer() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#else
  return false;
#endif
}

AllocatorResult run_system_allocator(const SystemAllocator& allocator,
                                     const ChildReplaySettings& settings, std::uint64_t peak_live) {
  AllocatorResult result;
  result.allocator = allocator.name;
  result.description = allocator.description;
  if (built_with_sanitizer()) {
    result.problem =
        "not measured: this sdalloc is built with a sanitizer, whose runtime "
        "replaces malloc";
    return result;
  }
  const std::optional<std::string> library = find_preload_library(allocator);
  if (!library) {
    result.problem = allocator.libraries.front() +
                     " not found; install it with: sudo apt-get "
                     "install " +
                     allocator.package;
    return result;
  }
  std::vector<std::string> argv = {
      self_executable(), "__replay-child",    "--allocator", allocator.name,
      "--trace",         settings.trace_path, "--passes",    std::to_string(settings.passes)};
  if (settings.touch) argv.emplace_back("--touch");
  if (!settings.progress) argv.emplace_back("--quiet");
  std::string out;
  int status = 0;
  try {
    status = spawn_and_read(argv, *library, out);
  } catch (const Error& error) {  // this allocator is lost, not the other results
    result.problem = error.what();
    result.failed = true;
    return result;
  }
  if (status != 0) {
    result.failed = true;
    result.problem = "the child process failed (exit status " + std::to_string(status) + ")" +
                     (out.empty() ? std::string() : ": " + out.substr(0, 300));
    return result;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(out);
    result.pass_seconds = j.at("pass_seconds").get<std::vector<double>>();
    result.peak_reserved = j.at("peak_reserved").get<std::uint64_t>();
    for (const auto& s : j.at("samples")) {
      result.samples.push_back(Sample{s.at(0).get<std::uint64_t>(), s.at(1).get<std::uint64_t>(),
                                      s.at(2).get<std::uint64_t>()});
    }
    result.counters = j.at("counters").get<std::string>();
    const std::uint64_t events = j.at("events").get<std::uint64_t>();
    result.ns_per_op = median_ns_per_op(result.pass_seconds, events);
  } catch (const nlohmann::json::exception& error) {
    result.problem = std::string("the child's report is unreadable: ") + error.what();
    result.failed = true;
    return result;
  }
  result.ratio = peak_live == 0 ? 0 : double(result.peak_reserved) / double(peak_live);
  result.ran = true;
  return result;
}

int run_replay_child(const std::string& allocator_name, const ChildReplaySettings& settings) {
  const SystemAllocator* allocator = find_system_allocator(allocator_name);
  if (allocator == nullptr) {
    std::printf("unknown system allocator '%s'", allocator_name.c_str());
    return 2;
  }
  const std::string loaded = loaded_allocator();
  if (loaded != allocator->name) {
    std::printf("LD_PRELOAD did not take effect: expected %s, this process runs %s",
                allocator->name.c_str(), loaded.c_str());
    return 4;
  }
  const PreparedTrace trace = PreparedTrace::from(read_event_trace(settings.trace_path));
  LiveSet live(trace);
  std::vector<Sample> samples;
  samples.reserve(std::size_t(settings.passes) * (kSamplesPerPass + 2));
  std::vector<double> seconds;
  seconds.reserve(std::size_t(settings.passes));
  ProgressLine progress(allocator->name);
  const ResidentSize resident;

  const bool peak_was_reset = reset_peak_resident();
  const std::uint64_t baseline = resident.now();
  std::uint64_t sampled_peak = 0;
  auto growth = [&] {
    const std::uint64_t now = resident.now();
    const std::uint64_t g = now > baseline ? now - baseline : 0;
    sampled_peak = std::max(sampled_peak, g);
    return g;
  };
  for (int pass = 0; pass < settings.passes; ++pass) {
    const PassSettings pass_settings{pass, settings.passes, settings.touch, &samples,
                                     settings.progress ? &progress : nullptr};
    seconds.push_back(play_pass(
        trace, live, pass_settings,
        [](std::uint64_t bytes, std::uint64_t) { return std::malloc(bytes); },
        [](void* p, std::uint64_t, std::uint64_t) { std::free(p); }, growth));
  }
  progress.done();
  const std::uint64_t hwm = peak_resident();
  const bool use_hwm = peak_was_reset && hwm != 0;
  const std::uint64_t peak = use_hwm ? (hwm > baseline ? hwm - baseline : 0) : sampled_peak;

  nlohmann::json j;
  j["events"] = trace.events.size();
  j["pass_seconds"] = seconds;
  j["peak_reserved"] = peak;
  j["counters"] = use_hwm ? "peak RSS growth (VmHWM)" : "RSS growth, sampled (VmHWM unavailable)";
  nlohmann::json s = nlohmann::json::array();
  for (const Sample& sample : samples) {
    s.push_back({sample.event, sample.live_bytes, sample.reserved_bytes});
  }
  j["samples"] = std::move(s);
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace sdalloc::replay
