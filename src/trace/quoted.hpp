// quoted.hpp - how error messages show a piece of input: escaped, shortened, between single
// quotes (internal).
//
// Input bytes never reach a message as they are: a NUL would cut the message short where it
// is printed with %s, and terminal escape codes would reach the user's terminal. So every
// parser shows input through escaped() (or quoted(), which adds the quotes): printable ASCII
// and well-formed UTF-8 stay as they are; control bytes (C0, DEL, C1), bidirectional
// overrides and bytes that are not well-formed UTF-8 become \xNN; text longer than the limit
// is cut at a character boundary and ends with "...". The output holds no control byte, so
// escaping it again changes nothing (TraceFormatError escapes its whole message).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sdalloc::detail {

constexpr std::size_t kShownBytes = 100;  // what a message shows of one piece of input
constexpr std::size_t kUnlimited = static_cast<std::size_t>(-1);

// `text` made safe for a one-line message, at most about `max_bytes` of it (before escaping).
std::string escaped(std::string_view text, std::size_t max_bytes = kShownBytes);

// escaped(text) between single quotes.
// Built with append: GCC 12 warns (-Wrestrict, falsely) about "'" + std::string(text) + "'".
inline std::string quoted(std::string_view text) {
  std::string result;
  result.reserve(text.size() + 2);
  result.append(1, '\'').append(escaped(text)).append(1, '\'');
  return result;
}

}  // namespace sdalloc::detail
