// option_table.cpp - the text side of option tables: pairs, values per type, sizes, docs.
#include "config/option_table.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

namespace sdalloc::config {
namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// "a", "a or b", "a, b or c": how messages list an enum's names.
std::string name_list(const OptionSpec& spec) {
  std::string list;
  for (std::size_t i = 0; i < spec.names.size(); ++i) {
    if (i > 0) list += i + 1 == spec.names.size() ? " or " : ", ";
    list += spec.names[i].name;
  }
  return list;
}

bool parse_bool(std::string_view value) {
  if (value == "true" || value == "True" || value == "1") return true;
  if (value == "false" || value == "False" || value == "0") return false;
  throw InvalidArgument("expected true or false, got '" + std::string(value) + "'");
}

double parse_fraction(std::string_view key, std::string_view value) {
  double fraction = 0.0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), fraction);
  if (error != std::errc() || end != value.data() + value.size() || !(fraction > 0.0) ||
      fraction > 1.0) {
    throw InvalidArgument(std::string(key) + " must be a number in (0, 1], got '" +
                          std::string(value) + "'");
  }
  return fraction;
}

std::size_t parse_count(std::string_view value) {
  std::size_t count = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), count);
  if (error != std::errc() || end != value.data() + value.size() || count == 0) {
    throw InvalidArgument("expected a whole number >= 1, got '" + std::string(value) + "'");
  }
  return count;
}

int parse_enum(const OptionSpec& spec, std::string_view value) {
  for (const EnumName& name : spec.names) {
    if (name.name == value) return name.value;
  }
  throw InvalidArgument(std::string(spec.key) + " must be " + name_list(spec));
}

// What the docs say a row accepts; Markdown quotes an enum's names as code.
std::string values_text(const OptionSpec& spec, bool markdown) {
  switch (spec.type) {
    case OptionType::kSize:
      return "size (B, KiB, MiB, GiB, TiB)";
    case OptionType::kCount:
      return "whole number >= 1";
    case OptionType::kFraction:
      return "number in (0, 1]";
    case OptionType::kBool:
      return markdown ? "`true`, `false`" : "true | false";
    case OptionType::kText:
      return "text";
    case OptionType::kRetired:
      return "any (ignored)";
    case OptionType::kEnum: {
      std::string list;
      for (const EnumName& name : spec.names) {
        if (!list.empty()) list += markdown ? ", " : " | ";
        if (markdown) {
          list.append("`").append(name.name).append("`");
        } else {
          list.append(name.name);
        }
      }
      return list;
    }
  }
  return {};
}

// A table cell holds no '|' and no line break.
std::string cell(const std::string& text) {
  std::string escaped;
  for (const char c : text) {
    if (c == '|') {
      escaped += "\\|";
    } else {
      escaped += c == '\n' ? ' ' : c;
    }
  }
  return escaped;
}

}  // namespace

// =======================================================================================
// Values

bool is_unset(const OptionSpec& spec, const OptionValue& value) {
  if (spec.type == OptionType::kCount) return std::get<std::size_t>(value) == 0;
  if (const auto* fraction = std::get_if<double>(&value)) return !(*fraction > 0.0);
  if (const auto* text = std::get_if<std::string>(&value)) return text->empty();
  return false;
}

OptionValue parse_value(const OptionSpec& spec, std::string_view text) {
  switch (spec.type) {
    case OptionType::kSize:
      return OptionValue(std::in_place_type<std::size_t>, parse_size(text));
    case OptionType::kCount:
      return OptionValue(std::in_place_type<std::size_t>, parse_count(text));
    case OptionType::kFraction:
      return OptionValue(std::in_place_type<double>, parse_fraction(spec.key, text));
    case OptionType::kBool:
      return OptionValue(std::in_place_type<bool>, parse_bool(text));
    case OptionType::kEnum:
      return OptionValue(std::in_place_type<int>, parse_enum(spec, text));
    case OptionType::kText:
    case OptionType::kRetired:
      return OptionValue(std::in_place_type<std::string>, text);
  }
  throw InvalidArgument("option '" + std::string(spec.key) + "' has no type");
}

std::string format_value(const OptionSpec& spec, const OptionValue& value) {
  switch (spec.type) {
    case OptionType::kSize:
      return size_text(std::get<std::size_t>(value));
    case OptionType::kCount:
      return std::to_string(std::get<std::size_t>(value));
    case OptionType::kFraction: {
      char fraction[32];
      std::snprintf(fraction, sizeof fraction, "%.17g", std::get<double>(value));
      return fraction;
    }
    case OptionType::kBool:
      return std::get<bool>(value) ? "true" : "false";
    case OptionType::kEnum:
      for (const EnumName& name : spec.names) {
        if (name.value == std::get<int>(value)) return std::string(name.name);
      }
      // A struct holding an enumerator this front end does not offer: say so, unparseably.
      return std::string("<").append(std::to_string(std::get<int>(value))).append(">");
    case OptionType::kText:
    case OptionType::kRetired:
      return std::get<std::string>(value);
  }
  return {};
}

// =======================================================================================
// Sizes

std::size_t parse_size(std::string_view text) {
  const std::string_view original = text;
  text = trim(text);
  double number = 0.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  // !isfinite: NaN passes every comparison below and would reach the cast (undefined).
  if (error != std::errc() || end == text.data() || !std::isfinite(number) || number < 0.0) {
    throw InvalidArgument("not a size: '" + std::string(original) + "'");
  }
  const std::string_view suffix = trim(text.substr(std::size_t(end - text.data())));
  double scale = 0.0;
  if (suffix.empty() || suffix == "B") {
    scale = 1.0;
  } else if (suffix == "K" || suffix == "KiB" || suffix == "KB") {
    scale = 0x1p10;
  } else if (suffix == "M" || suffix == "MiB" || suffix == "MB") {
    scale = 0x1p20;
  } else if (suffix == "G" || suffix == "GiB" || suffix == "GB") {
    scale = 0x1p30;
  } else if (suffix == "T" || suffix == "TiB" || suffix == "TB") {
    scale = 0x1p40;
  } else {
    throw InvalidArgument("unknown size unit '" + std::string(suffix) + "' in '" +
                          std::string(original) + "' (use B, KiB, MiB, GiB or TiB)");
  }
  const double bytes = std::floor(number * scale);
  if (bytes >= 0x1p63) throw InvalidArgument("size too large: '" + std::string(original) + "'");
  return static_cast<std::size_t>(bytes);
}

std::string size_text(std::size_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kUnits[unit];
}

// =======================================================================================
// Pairs and messages

bool next_pair(std::string_view name, std::string_view& text, ConfPair& pair) {
  while (!trim(text).empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;  // "a:1,,b:2" and a trailing comma are harmless
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) throw_bad_pair(name, item, "expected key:value");
    pair.text = item;
    pair.key = trim(item.substr(0, colon));
    pair.value = trim(item.substr(colon + 1));
    if (pair.value.empty()) throw_bad_pair(name, item, "the value is empty");
    return true;
  }
  return false;
}

void throw_bad_pair(std::string_view name, std::string_view pair, const std::string& what) {
  throw InvalidArgument(std::string(name) + ": " + what + ", in '" + std::string(pair) + "'");
}

std::string retired_message(std::string_view name, const OptionSpec& spec) {
  return std::string(name) + ": '" + std::string(spec.key) +
         "' no longer has any effect and is ignored (" + std::string(spec.help) + ")";
}

std::string unknown_key_message(std::string_view key, std::span<const OptionSpec* const> specs) {
  std::string known;
  for (const OptionSpec* spec : specs) {
    if (!known.empty()) known += ", ";
    known += spec->key;
  }
  return "unknown key '" + std::string(key) + "' (known: " + known + ")";
}

// =======================================================================================
// Documentation

std::string markdown_table(std::span<const DocRow> rows) {
  std::string table = "| key | values | meaning | default |\n|---|---|---|---|\n";
  for (const DocRow& row : rows) {
    std::string meaning(row.spec->help);
    for (const EnumName& name : row.spec->names) {
      if (name.help.empty()) continue;
      meaning += meaning.empty() ? "" : " ";
      meaning.append("`").append(name.name).append("`: ").append(name.help).append(".");
    }
    table += "| `" + std::string(row.spec->key) + "` | " + cell(values_text(*row.spec, true)) +
             " | " + cell(meaning) + " | " +
             (row.default_text.empty() ? std::string("none") : "`" + row.default_text + "`") +
             " |\n";
  }
  return table;
}

std::string help_text(std::span<const DocRow> rows) {
  std::string text;
  for (const DocRow& row : rows) {
    text += std::string(row.spec->key) + ": " + values_text(*row.spec, false) + "; default " +
            (row.default_text.empty() ? std::string("none") : row.default_text) + "\n";
    if (!row.spec->help.empty()) text += "    " + std::string(row.spec->help) + "\n";
    for (const EnumName& name : row.spec->names) {
      text += "    " + std::string(name.name);
      if (!name.help.empty()) text += " - " + std::string(name.help);
      text += "\n";
    }
  }
  return text;
}

}  // namespace sdalloc::config
