// text_table.hpp - the aligned text tables `sdalloc replay` and `sdalloc run` print.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace sdalloc::tools {

// The header and rows as aligned lines: the first and the last column (names, notes) left,
// the figures right, two spaces between columns. `trim` drops trailing spaces (a row whose
// last cells are empty).
inline std::string text_table(const std::vector<std::string>& header,
                              const std::vector<std::vector<std::string>>& rows,
                              bool trim = false) {
  std::vector<std::size_t> width(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) {
    width[c] = header[c].size();
    for (const auto& row : rows) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      const bool last = c + 1 == cells.size();
      const bool left = c == 0 || last;
      const std::string pad(width[c] - cells[c].size(), ' ');
      text += left ? cells[c] + (last ? "" : pad) : pad + cells[c];
      if (!last) text += "  ";
    }
    if (trim) {
      while (!text.empty() && text.back() == ' ') text.pop_back();
    }
    return text + "\n";
  };
  std::string out = line(header);
  for (const auto& row : rows) out += line(row);
  return out;
}

}  // namespace sdalloc::tools
