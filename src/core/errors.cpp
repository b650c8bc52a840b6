// errors.cpp - the standard out-of-memory message and the size formatting it uses.
//
// Every error message that states a size goes through format_bytes(), so sizes read the same
// everywhere: the exact byte count (for scripts and for comparing with traces) followed by a
// rounded figure (for people). Every byte formatter of the tree is here: format_bytes,
// format_size (both through rounded()) and format_exact_size; tools call these.
#include "sdalloc/core/errors.hpp"

#include <cstdio>
#include <iterator>
#include <string>

namespace sdalloc {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
// format_bytes keeps MiB up to here, so the sizes one OOM message compares (request, live,
// capacity of a typical card) usually share a unit and can be compared at a glance.
constexpr std::size_t kGiBThreshold = std::size_t{16} << 30;

std::string scaled(std::size_t bytes, std::size_t unit, const char* unit_name, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f %s", decimals,
                static_cast<double>(bytes) / static_cast<double>(unit), unit_name);
  return text;
}

// The rounded figure in the largest binary unit the value reaches, GiB only from gib_from.
std::string rounded(std::size_t bytes, std::size_t gib_from, int gib_decimals) {
  if (bytes < kKiB) return std::to_string(bytes) + " B";
  if (bytes < kMiB) return scaled(bytes, kKiB, "KiB", 1);
  if (bytes < gib_from) return scaled(bytes, kMiB, "MiB", 1);
  return scaled(bytes, kGiB, "GiB", gib_decimals);
}

}  // namespace

std::string format_bytes(std::size_t bytes) {
  std::string text = std::to_string(bytes) + " B";
  if (bytes < kKiB) return text;
  return text + " (" + rounded(bytes, kGiBThreshold, 1) + ")";
}

std::string format_size(std::size_t bytes) { return rounded(bytes, kGiB, 1); }

std::string format_size(std::size_t bytes, int gib_decimals) {
  gib_decimals = gib_decimals < 0 ? 0 : (gib_decimals > 9 ? 9 : gib_decimals);
  return rounded(bytes, kGiB, gib_decimals);
}

std::string format_exact_size(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t unit = 0;
  while (bytes != 0 && bytes % 1024 == 0 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + " " + kUnits[unit];
}

OutOfMemory OutOfMemory::describe(const std::string& where, const OutOfMemoryInfo& info,
                                  const std::string& detail) {
  std::string message = "out of memory: " + where + " could not allocate " +
                        format_bytes(info.requested) + ": live " + format_bytes(info.live) +
                        ", reserved " + format_bytes(info.reserved) + ", largest free block " +
                        format_bytes(info.largest_free) + ", ";
  message += info.capacity == 0 ? std::string("capacity unlimited")
                                : "capacity " + format_bytes(info.capacity);
  if (!detail.empty()) message += "; " + detail;
  return {message, info};
}

}  // namespace sdalloc
