// size_text.hpp - short human-readable sizes for names and tables (internal).
//
// format_bytes() (errors.hpp) gives the exact byte count with a unit in brackets, for error
// messages. format_size() gives only the rounded figure, e.g. "8.0 GiB", for resource names
// such as "limit(host, 8.0 GiB)" where the exact count would be noise.
#pragma once

#include <cstddef>
#include <string>

namespace sdalloc {

// "512 B", "4.0 KiB", "20.0 MiB", "8.0 GiB": the largest binary unit the value reaches.
std::string format_size(std::size_t bytes);

}  // namespace sdalloc
