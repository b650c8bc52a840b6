// decimal_field.hpp - a non-negative decimal field of a text trace format (internal).
//
// Every trace reader accepts exactly the digits 0-9 (no sign, no spaces, no fraction) and
// reports the same three faults the same way, naming the field and quoting the text.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "trace/quoted.hpp"

namespace sdalloc::detail {

// Parses `text` into `value`; on a fault answers false and sets `fault` to a message such
// as "size '1.5' is not a non-negative integer".
inline bool parse_decimal_field(const char* what, std::string_view text, std::uint64_t& value,
                                std::string& fault) {
  if (text.empty()) {
    fault = std::string(what) + " is empty";
    return false;
  }
  for (const char c : text) {
    if (c < '0' || c > '9') {
      fault = std::string(what) + " " + quoted(text) + " is not a non-negative integer";
      return false;
    }
  }
  if (std::from_chars(text.data(), text.data() + text.size(), value).ec != std::errc()) {
    fault = std::string(what) + " " + quoted(text) + " is too large (more than 2^64 - 1)";
    return false;
  }
  return true;
}

}  // namespace sdalloc::detail
