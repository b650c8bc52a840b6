// text_lines.hpp - the lines of a text trace, one at a time, with their numbers (internal).
//
// Every text reader walks its input the same way: split at '\n', drop a trailing '\r'
// (CRLF files), and know the 1-based number of the line at hand for its error messages.
#pragma once

#include <cstddef>
#include <string_view>

namespace sdalloc::detail {

class TextLines {
 public:
  explicit TextLines(std::string_view text) : text_(text) {}

  // The next line, without its line end; false at the end of the text.
  bool next(std::string_view& line) {
    if (pos_ >= text_.size()) return false;
    std::size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) end = text_.size();
    line = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    ++number_;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return true;
  }

  // 1-based number of the line next() returned last; 0 before the first.
  std::size_t number() const { return number_; }
  // The text after that line.
  std::string_view rest() const { return pos_ < text_.size() ? text_.substr(pos_) : ""; }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
  std::size_t number_ = 0;
};

}  // namespace sdalloc::detail
