// errors.cpp - the standard out-of-memory message and the size formatting it uses.
//
// Every error message that states a size goes through format_bytes(), so sizes read the same
// everywhere: the exact byte count (for scripts and for comparing with traces) followed by a
// rounded figure (for people).
#include "sdalloc/core/errors.hpp"

#include <cstdio>
#include <string>


namespace sdalloc {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
// format_bytes keeps MiB up to here, so the sizes one OOM message compares (request, live,
// capacity of a typical card) usually share a unit and can be compared at a glance.
constexpr std::size_t kGiBThreshold = std::size_t{16} << 30;

std::string scaled(std::size_t bytes, std::size_t unit, const char* unit_name) {
  char text[64];
  std::snprintf(text, sizeof text, "%.1f %s",
                static_cast<double>(bytes) / static_cast<double>(unit), unit_name);
  return text;
}

}  // namespace

std::string format_bytes(std::size_t bytes) {
  std::string text = std::to_string(bytes) + " B";
  if (bytes < kKiB) return text;
  if (bytes < kMiB) return text + " (" + scaled(bytes, kKiB, "KiB") + ")";
  if (bytes < kGiBThreshold) return text + " (" + scaled(bytes, kMiB, "MiB") + ")";
  return text + " (" + scaled(bytes, kGiB, "GiB") + ")";
}

std::string format_size(std::size_t bytes) {
  if (bytes < kKiB) return std::to_string(bytes) + " B";
  if (bytes < kMiB) return scaled(bytes, kKiB, "KiB");
  if (bytes < kGiB) return scaled(bytes, kMiB, "MiB");
  return scaled(bytes, kGiB, "GiB");
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
