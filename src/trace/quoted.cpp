// quoted.cpp - escaping input for messages (quoted.hpp): a small UTF-8 checker that keeps
// well-formed characters and writes every other byte as \xNN.
#include "trace/quoted.hpp"

#include <cstdint>

namespace sdalloc::detail {
namespace {

// Bytes of the well-formed UTF-8 character starting at text[i] (RFC 3629: no overlong forms,
// no surrogates, nothing above U+10FFFF), or 0 when there is none.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<std::uint8_t>(text[i + k]); };
  const std::uint8_t lead = byte(0);
  std::size_t length = 0;
  std::uint8_t low = 0x80;  // the range of the second byte
  std::uint8_t high = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t k = 2; k < length; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xbf) return 0;
  }
  return length;
}

// A well-formed character that still controls a terminal or reorders text: C1 controls
// (U+0080-U+009F) and the bidirectional embeddings, overrides and isolates.
bool is_control_character(std::string_view character) {
  const auto b = [&](std::size_t k) { return static_cast<std::uint8_t>(character[k]); };
  if (character.size() == 2) return b(0) == 0xc2 && b(1) <= 0x9f;
  if (character.size() == 3 && b(0) == 0xe2) {
    if (b(1) == 0x80) return b(2) >= 0xaa && b(2) <= 0xae;  // U+202A-U+202E
    if (b(1) == 0x81) return b(2) >= 0xa6 && b(2) <= 0xa9;  // U+2066-U+2069
  }
  return false;
}

void append_hex(std::string& out, std::string_view bytes) {
  constexpr const char* kDigits = "0123456789abcdef";
  for (const char c : bytes) {
    const auto byte = static_cast<std::uint8_t>(c);
    out.append("\\x").append(1, kDigits[byte >> 4]).append(1, kDigits[byte & 0xf]);
  }
}

}  // namespace

std::string escaped(std::string_view text, std::size_t max_bytes) {
  std::string out;
  out.reserve(text.size() < max_bytes ? text.size() : max_bytes);
  std::size_t i = 0;
  while (i < text.size()) {
    if (i >= max_bytes) {
      out.append("...");
      break;
    }
    const auto byte = static_cast<std::uint8_t>(text[i]);
    if (byte >= 0x20 && byte < 0x7f) {
      out.append(1, text[i]);
      ++i;
      continue;
    }
    const std::size_t length = byte >= 0x80 ? utf8_length(text, i) : 0;
    const std::string_view character = text.substr(i, length == 0 ? 1 : length);
    if (length == 0 || is_control_character(character)) {
      append_hex(out, character);
    } else {
      out.append(character);
    }
    i += character.size();
  }
  return out;
}

}  // namespace sdalloc::detail
