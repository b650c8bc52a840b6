// quoted.hpp - how error messages show a piece of input: between single quotes (internal).
#pragma once

#include <string>
#include <string_view>

namespace sdalloc::detail {

// Built with append: GCC 12 warns (-Wrestrict, falsely) about "'" + std::string(text) + "'".
inline std::string quoted(std::string_view text) {
  std::string result;
  result.reserve(text.size() + 2);
  result.append(1, '\'').append(text).append(1, '\'');
  return result;
}

}  // namespace sdalloc::detail
