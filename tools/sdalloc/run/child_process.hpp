// tools/sdalloc/run/child_process.hpp - one run of a command in a child process, measured.
//
// fork + execvp with the environment given (LD_PRELOAD replaced or removed, a few variables
// set), stdin from /dev/null, stdout and stderr to files whose tails are kept (both
// inherited with show_output), then wait4() for the child's rusage: ru_maxrss (the peak resident
// size of the child or of the largest of its waited-for descendants), minor and major faults, user
// and system time. Wall time runs from just before fork to wait4's return. While it waits,
// `waiting` (when given) is called about four times a second: a pidfd (Linux >= 5.3) wakes
// the wait the moment the child exits, so the progress costs the wall time nothing; without
// one the wait is a plain blocking wait4 and `waiting` is not called.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace sdalloc::run {

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is looked up on PATH as the shell does
  std::string preload;            // LD_PRELOAD for the child; "" removes it
  std::vector<std::pair<std::string, std::string>> environment;  // set or replaced
  std::string stdout_path;   // the child's stdout goes here (unless show_output)
  std::string stderr_path;   // the child's stderr goes here (unless show_output)
  bool show_output = false;  // inherit stdout/stderr instead
};

struct ChildOutcome {
  int exit_status = -1;  // when it exited; -1 when killed by a signal
  int signal = 0;        // the signal that killed it, 0 when it exited
  double wall_seconds = 0;
  double user_seconds = 0;
  double system_seconds = 0;
  std::uint64_t peak_rss_bytes = 0;
  std::uint64_t minor_faults = 0;
  std::uint64_t major_faults = 0;
  std::string stdout_tail;     // the last bytes it wrote on stdout (at most 2000)
  std::string stderr_tail;     // the last bytes it wrote on stderr (at most 2000)
  std::string preload_failed;  // the dynamic loader's message when LD_PRELOAD was ignored

  bool succeeded() const { return signal == 0 && exit_status == 0 && preload_failed.empty(); }
};

// Runs spec.argv and waits for it. Throws sdalloc::Error when the child cannot be started
// (fork or the stderr file fail); a command that cannot be executed exits 127 with the
// reason on its stderr, as in a shell.
ChildOutcome run_child(const ChildSpec& spec, const std::function<void()>& waiting = {});

// Where `program` would be executed from: itself when it holds a '/', else the first
// executable of that name on $PATH; "" when there is none.
std::string find_program(const std::string& program);

// The last lines of `text` on one line (" | " between them), at most `limit` characters:
// what a table's notes can show of a failing command's stderr.
std::string last_lines(const std::string& text, std::size_t limit);

}  // namespace sdalloc::run
