// shim_config.cpp - parsing and printing SDALLOC_CONF.
#include "shim_config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <set>
#include <string>
#include <system_error>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::torch_shim {
namespace {

// Every mode and its name in SDALLOC_CONF: what parsing accepts and printing writes.
struct ModeName {
  Mode mode;
  std::string_view name;
};
constexpr ModeName kModes[] = {{Mode::kPool, "pool"},
                               {Mode::kAsync, "async"},
                               {Mode::kVmm, "vmm"},
                               {Mode::kPlanned, "planned"}};

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

[[noreturn]] void bad(std::string_view pair, const std::string& what) {
  throw InvalidArgument("SDALLOC_CONF: " + what + ", in '" + std::string(pair) + "'");
}

bool parse_bool(std::string_view pair, std::string_view value) {
  if (value == "true" || value == "True" || value == "1") return true;
  if (value == "false" || value == "False" || value == "0") return false;
  bad(pair, "expected true or false, got '" + std::string(value) + "'");
}

double parse_fraction(std::string_view pair, std::string_view value) {
  double fraction = 0.0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), fraction);
  if (error != std::errc() || end != value.data() + value.size() || !(fraction > 0.0) ||
      fraction > 1.0) {
    bad(pair, "memory_fraction must be a number in (0, 1], got '" + std::string(value) + "'");
  }
  return fraction;
}

std::size_t parse_count(std::string_view pair, std::string_view value) {
  std::size_t count = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), count);
  if (error != std::errc() || end != value.data() + value.size() || count == 0) {
    bad(pair, "expected a whole number >= 1, got '" + std::string(value) + "'");
  }
  return count;
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

}  // namespace

std::size_t parse_size(std::string_view text) {
  const std::string_view original = text;
  text = trim(text);
  double number = 0.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error != std::errc() || end == text.data() || number < 0.0) {
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

ShimConfig parse_shim_config(std::string_view text) {
  ShimConfig config;
  std::set<std::string, std::less<>> seen;
  while (!trim(text).empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view pair = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (pair.empty()) continue;  // "a:1,,b:2" and a trailing comma are harmless
    const std::size_t colon = pair.find(':');
    if (colon == std::string_view::npos) bad(pair, "expected key:value");
    const std::string_view key = trim(pair.substr(0, colon));
    const std::string_view value = trim(pair.substr(colon + 1));
    if (value.empty()) bad(pair, "the value is empty");
    if (!seen.emplace(key).second) bad(pair, "the key '" + std::string(key) + "' is repeated");
    try {
      if (key == "backend") {
        if (value == "cuda") {
          config.backend = Backend::kCuda;
        } else if (value == "host") {
          config.backend = Backend::kHost;
        } else {
          bad(pair, "backend must be cuda or host");
        }
      } else if (key == "mode") {
        const auto* known = std::find_if(std::begin(kModes), std::end(kModes),
                                         [&](const ModeName& m) { return m.name == value; });
        if (known == std::end(kModes)) bad(pair, "mode must be pool, async, vmm or planned");
        config.mode = known->mode;
      } else if (key == "capacity") {
        config.capacity = parse_size(value);
      } else if (key == "memory_fraction") {
        config.memory_fraction = parse_fraction(pair, value);
      } else if (key == "replan_after") {
        config.replan_after = parse_count(pair, value);
      } else if (key == "max_plans") {
        config.max_plans = parse_count(pair, value);
      } else if (key == "granularity") {
        config.pool.segment_granularity = parse_size(value);
      } else if (key == "min_segment") {
        config.pool.min_segment_size = parse_size(value);
      } else if (key == "huge_threshold") {
        config.pool.huge_threshold = parse_size(value);
      } else if (key == "initial_reservation") {
        config.pool.initial_reservation = parse_size(value);
      } else if (key == "release_before_growth") {
        config.pool.release_cached_before_growth = parse_bool(pair, value);
      } else if (key == "consolidate") {
        config.pool.consolidate_when_empty = parse_bool(pair, value);
      } else {
        bad(pair, "unknown key '" + std::string(key) +
                      "' (known: backend, mode, capacity, memory_fraction, replan_after, "
                      "max_plans, granularity, min_segment, huge_threshold, initial_reservation, "
                      "release_before_growth, consolidate)");
      }
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      if (message.rfind("SDALLOC_CONF:", 0) == 0) throw;
      bad(pair, message);
    }
  }
  // A larger granularity alone raises the sizes that must be its multiples, rather than
  // making the user repeat it in min_segment and huge_threshold.
  const std::size_t granularity = config.pool.segment_granularity;
  if (!seen.contains("min_segment") && config.pool.min_segment_size < granularity) {
    config.pool.min_segment_size = granularity;
  }
  if (!seen.contains("huge_threshold") && config.pool.huge_threshold < granularity) {
    config.pool.huge_threshold = granularity;
  }
  if (config.backend == Backend::kHost && config.mode == Mode::kAsync) {
    throw InvalidArgument("SDALLOC_CONF: mode:async needs backend:cuda (it is cudaMallocAsync)");
  }
  if (config.backend == Backend::kHost && config.memory_fraction > 0.0 && config.capacity == 0) {
    throw InvalidArgument(
        "SDALLOC_CONF: memory_fraction with backend:host needs capacity (the host has no "
        "device memory size to take a fraction of)");
  }
  try {
    config.pool.validate();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string("SDALLOC_CONF: ") + e.what());
  }
  return config;
}

std::string format_shim_config(const ShimConfig& c) {
  std::string text;
  text += c.backend == Backend::kCuda ? "backend:cuda" : "backend:host";
  for (const ModeName& m : kModes) {
    if (m.mode == c.mode) {
      text += ",mode:";
      text += m.name;
    }
  }
  text += ",capacity:" + size_text(c.capacity);
  if (c.memory_fraction > 0.0) {
    char fraction[32];
    std::snprintf(fraction, sizeof fraction, "%.17g", c.memory_fraction);
    text += ",memory_fraction:";
    text += fraction;
  }
  text += ",replan_after:" + std::to_string(c.replan_after);
  text += ",max_plans:" + std::to_string(c.max_plans);
  text += ",granularity:" + size_text(c.pool.segment_granularity);
  text += ",min_segment:" + size_text(c.pool.min_segment_size);
  text += ",huge_threshold:" + size_text(c.pool.huge_threshold);
  text += ",initial_reservation:" + size_text(c.pool.initial_reservation);
  text += c.pool.release_cached_before_growth ? ",release_before_growth:true"
                                              : ",release_before_growth:false";
  text += c.pool.consolidate_when_empty ? ",consolidate:true" : ",consolidate:false";
  return text;
}

}  // namespace sdalloc::torch_shim
