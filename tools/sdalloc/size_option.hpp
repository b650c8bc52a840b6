// size_option.hpp - byte-size options (--capacity): "4096", "2500M", "8 GiB", read exactly;
// and counts (--max-nodes) and seconds (--time-limit), refused the same way.
//
// Accepts a decimal integer, optional spaces, and an optional unit, case-insensitive: b; k,
// kb, kib; m, mb, mib; g, gb, gib; t, tb, tib; p, pb, pib; e, eb, eib (all powers of 1024, as
// CLI11's AsSizeValue(false) read them before). Every step is overflow-checked: a value
// that does not fit 64 bits is an error, never a silent 2^64 - 1, whether it is too many digits
// or too large a unit. Zero is refused (a capacity of no bytes). Messages show the text as
// given, escaped and shortened, never a number the program made up.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sdalloc::tools {

// The value of `text`, or nullopt with `problem` set to what is wrong.
std::optional<std::uint64_t> parse_byte_size(std::string_view text, std::string& problem);

// A CLI11 transform for a positive byte size: rewrites the option's text to its decimal value.
CLI::Validator byte_size_option();

// A CLI11 check for a count from 0 to 2^64 - 1: decimal digits only (CLI11 alone reads "-1"
// as 2^64 - 1), refused as given, escaped and shortened.
CLI::Validator count_option();

// A CLI11 check for a number of seconds >= 0 (finite), refused as given, escaped and
// shortened, not with the bound CLI11's NonNegativeNumber prints (DBL_MAX, 309 digits).
CLI::Validator seconds_option();

}  // namespace sdalloc::tools
