// size_option.cpp - parsing byte sizes with overflow checks (size_option.hpp).
#include "size_option.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

namespace sdalloc::tools {
namespace {

constexpr std::size_t kShownChars = 40;

// The option's text for a message: printable ASCII as it is, other bytes as \xNN, cut at
// kShownChars with "...".
std::string shown(std::string_view text) {
  std::string out = "'";
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (i == kShownChars) {
      out += "...";
      break;
    }
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f) {
      out += text[i];
    } else {
      constexpr const char* kDigits = "0123456789abcdef";
      out += "\\x";
      out += kDigits[byte >> 4];
      out += kDigits[byte & 0xf];
    }
  }
  return out + "'";
}

// The value of a string of decimal digits, or nullopt when it does not fit 64 bits.
std::optional<std::uint64_t> decimal_value(std::string_view digits) {
  std::uint64_t value = 0;
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  for (const char c : digits) {
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (value > (kMax - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

// log2 of the unit's factor, or -1 for no such unit.
int unit_shift(std::string unit) {
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit.empty() || unit == "b") return 0;
  constexpr std::string_view kPrefixes = "kmgtpe";
  const std::size_t prefix = kPrefixes.find(unit[0]);
  if (prefix == std::string_view::npos) return -1;
  const std::string_view rest = std::string_view(unit).substr(1);
  if (!rest.empty() && rest != "b" && rest != "ib") return -1;
  return 10 * static_cast<int>(prefix + 1);
}

}  // namespace

std::optional<std::uint64_t> parse_byte_size(std::string_view text, std::string& problem) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  std::string_view rest = text;
  while (!rest.empty() && is_space(rest.front())) rest.remove_prefix(1);
  while (!rest.empty() && is_space(rest.back())) rest.remove_suffix(1);
  std::size_t digits = 0;
  while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
  std::string_view unit = rest.substr(digits);
  while (!unit.empty() && is_space(unit.front())) unit.remove_prefix(1);
  const bool unit_is_letters = std::all_of(unit.begin(), unit.end(), [](char c) {
    return std::isalpha(static_cast<unsigned char>(c)) != 0;
  });
  const int shift = unit_is_letters ? unit_shift(std::string(unit)) : -1;
  if (digits == 0 || shift < 0) {
    problem = shown(text) +
              " is not a byte size (a whole number with an optional unit: B, K, M, G, T, P or "
              "E, powers of 1024, e.g. 2500M or 8G)";
    return std::nullopt;
  }
  const std::optional<std::uint64_t> number = decimal_value(rest.substr(0, digits));
  if (!number) {
    problem = shown(text) + " is too large: a size must be below 16 EiB (2^64 bytes)";
    return std::nullopt;
  }
  std::uint64_t value = *number;
  if (shift > 0 && value > (std::numeric_limits<std::uint64_t>::max() >> shift)) {
    problem = shown(text) + " is too large: a size must be below 16 EiB (2^64 bytes)";
    return std::nullopt;
  }
  value <<= shift;
  if (value == 0) {
    problem = shown(text) + " is not a positive size";
    return std::nullopt;
  }
  return value;
}

CLI::Validator byte_size_option() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        std::string problem;
        const std::optional<std::uint64_t> value = parse_byte_size(input, problem);
        if (!value) return problem;
        input = std::to_string(*value);
        return {};
      },
      "SIZE", "byte size");
}

CLI::Validator count_option() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        const bool digits =
            !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || !decimal_value(text)) {
          return shown(text) + " is not a count from 0 to 2^64 - 1";
        }
        return {};
      },
      "COUNT");
}

CLI::Validator seconds_option() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !std::isfinite(value) || value < 0) {
          return shown(text) + " is not a number of seconds >= 0";
        }
        return {};
      },
      "SECONDS");
}

}  // namespace sdalloc::tools
