// command_line.hpp - what the `sdalloc` subcommands parse alike.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace sdalloc::tools {

// "pool,vmm,,glibc" -> {"pool", "vmm", "glibc"}: the items of a comma-separated list, empty
// ones dropped.
inline std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    if (comma > start) items.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

}  // namespace sdalloc::tools
