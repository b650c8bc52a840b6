// tools/sdalloc/replay/progress_line.hpp - a progress line on stderr for work that takes a while.
//
// Silent for the first second (short replays print nothing), then at most four updates a
// second: rewritten in place ("\r") on a terminal, one line every five seconds otherwise
// (logs of CI runs stay short). done() clears or ends the line.
#pragma once

#include <chrono>
#include <string>

namespace sdalloc::replay {

class ProgressLine {
 public:
  explicit ProgressLine(std::string label);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Called at the replay's sample points (a few hundred a pass): one clock read each.
  void update_now(int pass, int passes, std::size_t event, std::size_t events);
  // Any other state, e.g. "--min-capacity: probe 3, between 2.1 GiB and 2.3 GiB".
  void report(const std::string& text);
  void done();

 private:
  bool due();
  void print(const std::string& text);
  using Clock = std::chrono::steady_clock;
  std::string label_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = start_;
  bool terminal_;
  bool printed_ = false;
};

}  // namespace sdalloc::replay
