#include "replay/progress_line.hpp"

#include <unistd.h>

#include <cstdio>

namespace sdalloc::replay {

ProgressLine::ProgressLine(std::string label)
    : label_(std::move(label)), terminal_(isatty(STDERR_FILENO) == 1) {}

ProgressLine::~ProgressLine() { done(); }

void ProgressLine::update_now(int pass, int passes, std::size_t event, std::size_t events) {
  if (!due()) return;
  const double fraction = events == 0 ? 1.0 : double(event) / double(events);
  char text[96];
  std::snprintf(text, sizeof text, "pass %d/%d, %3.0f%% of the events", pass, passes,
                fraction * 100.0);
  print(text);
}

void ProgressLine::report(const std::string& text) {
  if (due()) print(text);
}

bool ProgressLine::due() {
  const Clock::time_point now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  if (elapsed < 1.0 || since_last < (terminal_ ? 0.25 : 5.0)) return false;
  last_ = now;
  return true;
}

void ProgressLine::print(const std::string& text) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  std::fprintf(stderr, "%s  %s: %s, %.0f s%s", terminal_ ? "\r" : "", label_.c_str(), text.c_str(),
               elapsed, terminal_ ? "\033[K" : "\n");
  std::fflush(stderr);
  printed_ = true;
}

void ProgressLine::done() {
  if (printed_ && terminal_) std::fprintf(stderr, "\r\033[K");
  printed_ = false;
}

}  // namespace sdalloc::replay
