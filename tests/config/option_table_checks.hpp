// option_table_checks.hpp - checks every option table must pass, whatever its front end:
// each row's default text parses back to the default, each enum name parses to its value,
// and format() of the defaults parses back to the same text; and how a test finds the key
// table a document holds (between()).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "config/option_table.hpp"

namespace sdalloc::test {

template <class Config>
void expect_defaults_parse_back(const config::OptionTable<Config>& table) {
  const Config defaults{};
  for (const config::Option<Config>& row : table.rows()) {
    SCOPED_TRACE(std::string(row.spec.key));
    const config::OptionValue value = row.get(defaults);
    if (config::is_unset(row.spec, value)) {
      // Not set by default: format() leaves it out, and no text can give it.
      EXPECT_EQ(table.format(defaults).find(std::string(row.spec.key) + ":"), std::string::npos);
      continue;
    }
    const std::string text = std::string(row.spec.key) + ":" + format_value(row.spec, value);
    EXPECT_EQ(row.get(table.parse(text)), value) << text;
  }
  EXPECT_EQ(table.format(table.parse(table.format(defaults))), table.format(defaults));
}

template <class Config>
void expect_enum_names_parse(const config::OptionTable<Config>& table, const std::string& base) {
  for (const config::Option<Config>& row : table.rows()) {
    for (const config::EnumName& name : row.spec.names) {
      const std::string text = base + (base.empty() ? "" : ",") + std::string(row.spec.key) + ":" +
                               std::string(name.name);
      SCOPED_TRACE(text);
      const Config parsed = table.parse(text);
      EXPECT_EQ(row.get(parsed), config::OptionValue(name.value));
      EXPECT_NE(table.format(parsed).find(std::string(row.spec.key) + ":" + std::string(name.name)),
                std::string::npos);
    }
  }
}

// The text after the line holding `begin` (or, with `after`, after the first `after` that
// follows it) up to `end`; "(no '...')" naming what is missing.
inline std::string between(const std::string& text, const std::string& begin,
                           const std::string& end, const std::string& after = "\n") {
  const std::size_t from = text.find(begin);
  if (from == std::string::npos) return "(no '" + begin + "')";
  const std::size_t past = text.find(after, from);
  if (past == std::string::npos) return "(no '" + after + "' after '" + begin + "')";
  const std::size_t start = past + after.size();
  const std::size_t stop = text.find(end, start);
  if (stop == std::string::npos) return "(no '" + end + "')";
  return text.substr(start, stop - start);
}

// The key table a document holds between its markers, "<!-- SDALLOC_CONF keys: generated
// ...-->" and "<!-- end of SDALLOC_CONF keys -->".
inline std::string generated_key_table(const std::string& doc) {
  return between(doc, "<!-- SDALLOC_CONF keys: generated", "<!-- end of SDALLOC_CONF keys -->",
                 "-->\n");
}

}  // namespace sdalloc::test
