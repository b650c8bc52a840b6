#include "run/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "sdalloc/core/errors.hpp"

extern char** environ;

namespace sdalloc::run {
namespace {

constexpr std::size_t kTailBytes = 2000;

// The parent's environment without LD_PRELOAD and the variables spec sets, then those.
std::vector<std::string> child_environment(const ChildSpec& spec) {
  auto replaced = [&](const char* entry) {
    if (std::strncmp(entry, "LD_PRELOAD=", 11) == 0) return true;
    for (const auto& [name, value] : spec.environment) {
      if (std::strncmp(entry, name.c_str(), name.size()) == 0 && entry[name.size()] == '=') {
        return true;
      }
    }
    return false;
  };
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!replaced(*e)) env.emplace_back(*e);
  }
  if (!spec.preload.empty()) env.push_back("LD_PRELOAD=" + spec.preload);
  for (const auto& [name, value] : spec.environment)
    env.push_back(std::string(name).append("=").append(value));
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  p.reserve(strings.size() + 1);
  for (std::string& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

double seconds(const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; }

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream whole;
  whole << in.rdbuf();
  return whole.str();
}

std::string tail(const std::string& text) {
  return text.size() > kTailBytes ? text.substr(text.size() - kTailBytes) : text;
}

// The files' last kTailBytes, and the loader's line when it refused LD_PRELOAD.
void read_output(const ChildSpec& spec, ChildOutcome& outcome) {
  outcome.stdout_tail = tail(read_whole(spec.stdout_path));
  const std::string text = read_whole(spec.stderr_path);
  outcome.stderr_tail = tail(text);
  // ld.so: "ERROR: ld.so: object 'X' from LD_PRELOAD cannot be preloaded (...): ignored."
  const std::size_t at = text.find("from LD_PRELOAD cannot be preloaded");
  if (at != std::string::npos) {
    const std::size_t begin = text.rfind('\n', at);
    const std::size_t end = text.find('\n', at);
    outcome.preload_failed =
        text.substr(begin == std::string::npos ? 0 : begin + 1,
                    end == std::string::npos ? std::string::npos
                                             : end - (begin == std::string::npos ? 0 : begin + 1));
  }
}

// Returns when the child has exited (its zombie stays for wait4), calling `waiting` every
// quarter second until then.
void wait_with_progress(pid_t pid, const std::function<void()>& waiting) {
#ifdef SYS_pidfd_open
  if (!waiting) return;
  const int pidfd = int(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return;  // an old kernel: wait4 blocks instead
  pollfd p{pidfd, POLLIN, 0};
  while (true) {
    const int ready = ::poll(&p, 1, 250);
    if (ready > 0 || (ready < 0 && errno != EINTR)) break;
    waiting();
  }
  ::close(pidfd);
#else
  (void)pid;
  (void)waiting;
#endif
}

}  // namespace

std::string find_program(const std::string& program) {
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) {
    return ::access(program.c_str(), X_OK) == 0 ? program : "";
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = dir.empty() ? "." : dir;
    candidate.append("/").append(program);
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

std::string last_lines(const std::string& text, std::size_t limit) {
  std::string joined;
  std::size_t end = text.size();
  while (end > 0 && joined.size() < limit) {
    const std::size_t newline = text.rfind('\n', end - 1);
    const std::size_t begin = newline == std::string::npos ? 0 : newline + 1;
    std::string line = text.substr(begin, end - begin);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) joined = joined.empty() ? line : line.append(" | ").append(joined);
    if (newline == std::string::npos) break;
    end = newline;
  }
  if (joined.size() > limit) joined = "..." + joined.substr(joined.size() - limit + 3);
  return joined;
}

ChildOutcome run_child(const ChildSpec& spec, const std::function<void()>& waiting) {
  if (spec.argv.empty()) throw Error("no command to run");
  // Everything the child needs is built before fork: it only calls dup2, execvp and _exit.
  std::vector<std::string> env = child_environment(spec);
  std::vector<std::string> args = spec.argv;
  std::vector<char*> envp = pointers(env);
  std::vector<char*> argp = pointers(args);
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0) throw Error(std::string("cannot open /dev/null: ") + std::strerror(errno));
  int out_fd = -1;
  int err_fd = -1;
  if (!spec.show_output) {
    out_fd = ::open(spec.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    err_fd = ::open(spec.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out_fd < 0 || err_fd < 0) {
      const std::string failed = out_fd < 0 ? spec.stdout_path : spec.stderr_path;
      const int error = errno;
      for (const int fd : {null_fd, out_fd, err_fd}) {
        if (fd >= 0) ::close(fd);
      }
      throw Error("cannot write " + failed + ": " + std::strerror(error));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(null_fd, STDIN_FILENO);
    if (!spec.show_output) {
      ::dup2(out_fd, STDOUT_FILENO);
      ::dup2(err_fd, STDERR_FILENO);
    }
    environ = envp.data();
    ::execvp(argp[0], argp.data());
    const char* reason = std::strerror(errno);
    const char* prefix = "sdalloc run: cannot run ";
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, prefix, std::strlen(prefix));
    n = ::write(STDERR_FILENO, argp[0], std::strlen(argp[0]));
    n = ::write(STDERR_FILENO, ": ", 2);
    n = ::write(STDERR_FILENO, reason, std::strlen(reason));
    n = ::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(null_fd);
  if (out_fd >= 0) ::close(out_fd);
  if (err_fd >= 0) ::close(err_fd);
  if (pid < 0) throw Error(std::string("fork: ") + std::strerror(fork_errno));

  wait_with_progress(pid, waiting);
  int status = 0;
  rusage usage{};
  while (::wait4(pid, &status, 0, &usage) < 0) {
    if (errno != EINTR) throw Error(std::string("wait4: ") + std::strerror(errno));
  }
  ChildOutcome outcome;
  outcome.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) {
    outcome.exit_status = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    outcome.signal = WTERMSIG(status);
  }
  outcome.user_seconds = seconds(usage.ru_utime);
  outcome.system_seconds = seconds(usage.ru_stime);
  outcome.peak_rss_bytes = std::uint64_t(usage.ru_maxrss) * 1024;  // Linux: KiB
  outcome.minor_faults = std::uint64_t(usage.ru_minflt);
  outcome.major_faults = std::uint64_t(usage.ru_majflt);
  if (!spec.show_output) read_output(spec, outcome);
  return outcome;
}

}  // namespace sdalloc::run
