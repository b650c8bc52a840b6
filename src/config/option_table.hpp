// option_table.hpp - a front end's settings as one table of options (SDALLOC_CONF syntax).
//
// One row per key: its name, value type (size, count, fraction, enum with its names, bool,
// text), help text, and how it reads and writes the front end's config struct. The default
// is what a default-constructed struct holds. Everything else comes from the rows, so a key
// is spelled once: parse() (text -> struct, checking each value against its type), format()
// (struct -> text that parses back to the same struct), markdown() (the documentation table)
// and help() (plain text). Rows over a part of the struct (config/pool_conf.hpp's PoolConf,
// a base of each front end's struct) are lifted into a front end's table, so front ends
// share keys and each adds its own rows without touching the others.
//
// The syntax is PyTorch's PYTORCH_CUDA_ALLOC_CONF: comma-separated `key:value` pairs, e.g.
// "mode:vmm,capacity:8GiB". Blanks around keys, values and pairs and empty pairs are
// ignored. parse() rejects a missing ':', an empty value, a repeated key, an unknown key and
// a bad value with InvalidArgument("<NAME>: <what>, in '<pair>'"), so a typo never silently
// falls back to a default; the finish hook then sees which keys were given, may adjust
// defaults from them and checks what spans several keys. A retired key (one that no longer
// means anything) is accepted with any value and ignored, with a one-line warning, so
// scripts written for an older sdalloc keep working.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::config {

// =======================================================================================
// Values and rows

enum class OptionType {
  kSize,      // bytes, with an optional binary suffix (parse_size)
  kCount,     // a whole number >= 1
  kFraction,  // a number in (0, 1]
  kEnum,      // one of the row's names
  kBool,      // true|false (also True/False/1/0)
  kText,      // any non-empty text without ','
  kRetired,   // any value, ignored: a key that no longer means anything
};

// One value of an enum row: what the text says, the enumerator (as an int) and, for the
// documentation, what it means.
struct EnumName {
  std::string_view name;
  int value = 0;
  std::string_view help;
};

// A row's value as parse and format see it: kSize/kCount hold std::size_t, kFraction double,
// kBool bool, kEnum int (the enumerator), kText std::string.
using OptionValue = std::variant<std::size_t, double, bool, int, std::string>;

// What a row is, apart from how it reaches the struct.
struct OptionSpec {
  std::string_view key;
  OptionType type = OptionType::kText;
  std::string_view help;
  std::vector<EnumName> names;  // kEnum only, in the order messages and docs list them
};

// A value no text parses to (a count of 0, a fraction <= 0, an empty text) means "not set":
// format() leaves such a key out, and the docs give its default as "none".
bool is_unset(const OptionSpec& spec, const OptionValue& value);

// The text -> value step of parse() for one row; throws InvalidArgument saying what is wrong
// (without the pair, which parse() adds).
OptionValue parse_value(const OptionSpec& spec, std::string_view text);
// The value -> text step of format(); parse_value(spec, format_value(spec, v)) == v.
std::string format_value(const OptionSpec& spec, const OptionValue& value);

template <class Config>
struct Option {
  OptionSpec spec;
  std::function<OptionValue(const Config&)> get;
  std::function<void(Config&, const OptionValue&)> set;
};

// "123", "2MiB", "1.5GiB", "4K" -> bytes (B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB, all
// binary); throws InvalidArgument naming the text.
std::size_t parse_size(std::string_view text);
// bytes -> the largest exact binary unit: 2097152 -> "2MiB", 1000 -> "1000B", 0 -> "0B".
std::string size_text(std::size_t bytes);

// =======================================================================================
// Making rows
//
// `field` is a generic lambda naming the struct member, so one accessor serves reading and
// writing: [](auto& c) -> auto& { return c.capacity; }.

namespace detail {
template <class Config, class Stored, class Field>
Option<Config> bind(OptionSpec spec, Field field) {
  Option<Config> row{std::move(spec), {}, {}};
  row.get = [field](const Config& c) {
    return OptionValue(std::in_place_type<Stored>, static_cast<Stored>(field(c)));
  };
  row.set = [field](Config& c, const OptionValue& value) {
    using Target = std::remove_cvref_t<decltype(field(c))>;
    field(c) = static_cast<Target>(std::get<Stored>(value));
  };
  return row;
}
}  // namespace detail

template <class Config, class Field>
Option<Config> size_option(std::string_view key, std::string_view help, Field field) {
  return detail::bind<Config, std::size_t>({key, OptionType::kSize, help, {}}, field);
}
// Its default may be 0: "not set" (is_unset), e.g. "no limit".
template <class Config, class Field>
Option<Config> count_option(std::string_view key, std::string_view help, Field field) {
  return detail::bind<Config, std::size_t>({key, OptionType::kCount, help, {}}, field);
}
// A key kept for old scripts: any value is accepted and changes nothing; `help` says since
// when and why (the docs list it, parse() warns when it is given).
template <class Config>
Option<Config> retired_option(std::string_view key, std::string_view help) {
  Option<Config> row{{key, OptionType::kRetired, help, {}}, {}, {}};
  row.get = [](const Config&) { return OptionValue(std::in_place_type<std::string>); };
  row.set = [](Config&, const OptionValue&) {};
  return row;
}
// Its default should be 0: "not set" (is_unset).
template <class Config, class Field>
Option<Config> fraction_option(std::string_view key, std::string_view help, Field field) {
  return detail::bind<Config, double>({key, OptionType::kFraction, help, {}}, field);
}
template <class Config, class Field>
Option<Config> bool_option(std::string_view key, std::string_view help, Field field) {
  return detail::bind<Config, bool>({key, OptionType::kBool, help, {}}, field);
}
// An empty text is "not set" (is_unset).
template <class Config, class Field>
Option<Config> text_option(std::string_view key, std::string_view help, Field field) {
  return detail::bind<Config, std::string>({key, OptionType::kText, help, {}}, field);
}
template <class Config, class Field>
Option<Config> enum_option(std::string_view key, std::string_view help, std::vector<EnumName> names,
                           Field field) {
  return detail::bind<Config, int>({key, OptionType::kEnum, help, std::move(names)}, field);
}

// Rows over a base of the front end's struct, as rows over the struct itself.
template <class Config, class Part>
std::vector<Option<Config>> lift(const std::vector<Option<Part>>& rows) {
  static_assert(std::derived_from<Config, Part>, "rows lift only from a base of the struct");
  std::vector<Option<Config>> lifted;
  lifted.reserve(rows.size());
  for (const Option<Part>& row : rows) {
    lifted.push_back({row.spec, [get = row.get](const Config& c) { return get(c); },
                      [set = row.set](Config& c, const OptionValue& v) { set(c, v); }});
  }
  return lifted;
}

// =======================================================================================
// The table's text-level pieces (option_table.cpp), shared by every Config

using KeySet = std::set<std::string, std::less<>>;

struct ConfPair {
  std::string_view text;  // the whole pair, trimmed: what messages quote
  std::string_view key;
  std::string_view value;
};

// Takes the next non-empty pair off the front of `text`; false when none is left. Throws
// (as parse() describes) for a missing ':' or an empty value.
bool next_pair(std::string_view name, std::string_view& text, ConfPair& pair);
[[noreturn]] void throw_bad_pair(std::string_view name, std::string_view pair,
                                 const std::string& what);
// "SDALLOC_CONF: 'k' no longer has any effect and is ignored (<help>)"
std::string retired_message(std::string_view name, const OptionSpec& spec);
// "unknown key 'k' (known: a, b, c)"
std::string unknown_key_message(std::string_view key, std::span<const OptionSpec* const> specs);

// One documented row: its spec and its default, as text ("" for "none").
struct DocRow {
  const OptionSpec* spec;
  std::string default_text;
};
std::string markdown_table(std::span<const DocRow> rows);
std::string help_text(std::span<const DocRow> rows);

// =======================================================================================
// The table

template <class Config>
class OptionTable {
 public:
  // Runs after every pair is applied: `given` holds the keys the text set. Throws
  // InvalidArgument (its message should start with the table's name) for what spans keys.
  using Finish = std::function<void(Config&, const KeySet& given)>;

  // `name` starts every message ("SDALLOC_CONF"); keys must be unique.
  OptionTable(std::string_view name, std::vector<Option<Config>> rows, Finish finish = {})
      : name_(name), rows_(std::move(rows)), finish_(std::move(finish)) {}

  std::string_view name() const { return name_; }
  const std::vector<Option<Config>>& rows() const { return rows_; }
  const Option<Config>* find(std::string_view key) const {
    for (const Option<Config>& row : rows_) {
      if (row.spec.key == key) return &row;
    }
    return nullptr;
  }

  // `warnings` collects one line per retired key given; without it they go to stderr.
  Config parse(std::string_view text, std::vector<std::string>* warnings = nullptr) const {
    Config config{};
    KeySet given;
    ConfPair pair;
    while (next_pair(name_, text, pair)) {
      if (!given.emplace(pair.key).second) {
        throw_bad_pair(name_, pair.text, "the key '" + std::string(pair.key) + "' is repeated");
      }
      const Option<Config>* row = find(pair.key);
      if (row == nullptr) throw_bad_pair(name_, pair.text, unknown_key_message(pair.key));
      try {
        row->set(config, parse_value(row->spec, pair.value));
      } catch (const InvalidArgument& e) {
        throw_bad_pair(name_, pair.text, e.what());
      }
      if (row->spec.type == OptionType::kRetired) {
        const std::string line = retired_message(name_, row->spec);
        if (warnings != nullptr) {
          warnings->push_back(line);
        } else {
          std::fprintf(stderr, "%s\n", line.c_str());
        }
      }
    }
    if (finish_) finish_(config, given);
    return config;
  }

  // Every key in table order, but those not set (is_unset).
  std::string format(const Config& config) const {
    std::string text;
    for (const Option<Config>& row : rows_) {
      const OptionValue value = row.get(config);
      if (is_unset(row.spec, value)) continue;
      if (!text.empty()) text += ',';
      text += row.spec.key;
      text += ':';
      text += format_value(row.spec, value);
    }
    return text;
  }

  std::string markdown() const { return markdown_table(doc_rows()); }
  std::string help() const { return help_text(doc_rows()); }

 private:
  std::vector<DocRow> doc_rows() const {
    const Config defaults{};
    std::vector<DocRow> docs;
    for (const Option<Config>& row : rows_) {
      const OptionValue value = row.get(defaults);
      docs.push_back(
          {&row.spec, is_unset(row.spec, value) ? std::string() : format_value(row.spec, value)});
    }
    return docs;
  }

  std::string unknown_key_message(std::string_view key) const {
    std::vector<const OptionSpec*> specs;
    for (const Option<Config>& row : rows_) {
      if (row.spec.type != OptionType::kRetired) specs.push_back(&row.spec);
    }
    return config::unknown_key_message(key, specs);
  }

  std::string name_;
  std::vector<Option<Config>> rows_;
  Finish finish_;
};

}  // namespace sdalloc::config
