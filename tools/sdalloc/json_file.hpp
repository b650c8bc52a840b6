// json_file.hpp - writing a subcommand's --json file.
#pragma once

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::tools {

// Writes `value` to `path`, indented, with a final newline; sdalloc::Error naming the path
// and the system's reason when the file cannot be written whole.
inline void write_json_file(const nlohmann::json& value, const std::string& path) {
  std::ofstream out(path);
  if (out) out << value.dump(2) << "\n";
  out.flush();
  if (!out) throw Error("cannot write " + path + ": " + std::strerror(errno));
}

}  // namespace sdalloc::tools
