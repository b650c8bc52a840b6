// pool_stats.cpp - derived ratios, the PyTorch-named view and the printed table.
#include "sdalloc/core/pool_stats.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

namespace sdalloc {
namespace {

std::int64_t as_int(std::uint64_t value) { return static_cast<std::int64_t>(value); }

double mib(std::size_t bytes) { return static_cast<double>(bytes) / double(1 << 20); }

// Rows of the table: a label, then a 33-character cell for the current figure and one for
// the peak (bytes as "<count> B <MiB> MiB"; counts and ratios right-aligned under the byte
// counts). Rows without a peak leave that cell empty.
void byte_row(std::string& out, const char* label, std::size_t current) {
  char line[160];
  std::snprintf(line, sizeof line, "  %-20s %15zu B %11.1f MiB\n", label, current, mib(current));
  out += line;
}

void byte_row(std::string& out, const char* label, std::size_t current, std::size_t peak) {
  char line[160];
  std::snprintf(line, sizeof line, "  %-20s %15zu B %11.1f MiB %15zu B %11.1f MiB\n", label,
                current, mib(current), peak, mib(peak));
  out += line;
}

void count_row(std::string& out, const char* label, std::uint64_t current) {
  char line[160];
  std::snprintf(line, sizeof line, "  %-20s %15llu\n", label,
                static_cast<unsigned long long>(current));
  out += line;
}

void count_row(std::string& out, const char* label, std::uint64_t current, std::uint64_t peak) {
  char line[160];
  std::snprintf(line, sizeof line, "  %-20s %15llu%18s %15llu\n", label,
                static_cast<unsigned long long>(current), "",
                static_cast<unsigned long long>(peak));
  out += line;
}

void ratio_row(std::string& out, const char* label, double value) {
  char line[160];
  std::snprintf(line, sizeof line, "  %-20s %15.3f\n", label, value);
  out += line;
}

}  // namespace

double PoolStats::fragmentation() const {
  if (free_bytes == 0) return 0.0;
  const std::size_t largest = std::min(largest_free_block, free_bytes);
  return 1.0 - static_cast<double>(largest) / static_cast<double>(free_bytes);
}

double PoolStats::peak_overhead_ratio() const {
  if (peak_live_bytes == 0) return 0.0;
  return static_cast<double>(peak_reserved_bytes) / static_cast<double>(peak_live_bytes);
}

std::map<std::string, std::int64_t> to_memory_stats(const PoolStats& s) {
  return {
      {"allocated_bytes.all.current", as_int(s.allocated_bytes)},
      {"allocated_bytes.all.peak", as_int(s.peak_allocated_bytes)},
      {"requested_bytes.all.current", as_int(s.live_bytes)},
      {"requested_bytes.all.peak", as_int(s.peak_live_bytes)},
      {"reserved_bytes.all.current", as_int(s.reserved_bytes)},
      {"reserved_bytes.all.peak", as_int(s.peak_reserved_bytes)},
      // PyTorch counts a block as active until its cross-stream free completes.
      {"active_bytes.all.current", as_int(s.allocated_bytes + s.pending_free_bytes)},
      {"active_bytes.all.peak", as_int(s.peak_allocated_bytes)},
      {"inactive_split_bytes.all.current", as_int(s.free_bytes)},
      {"allocation.all.current", as_int(s.live_allocations)},
      {"allocation.all.peak", as_int(s.peak_live_allocations)},
      {"allocation.all.allocated", as_int(s.allocations)},
      {"allocation.all.freed", as_int(s.frees)},
      {"segment.all.current", as_int(s.segments)},
      {"segment.all.peak", as_int(s.peak_segments)},
      {"num_alloc_retries", as_int(s.oom_retries)},
      {"num_ooms", as_int(s.ooms)},
      {"num_device_alloc", as_int(s.segment_allocations)},
      {"num_device_free", as_int(s.segment_releases)},
  };
}

std::string format_stats(const PoolStats& s) {
  std::string out;
  char header[160];
  std::snprintf(header, sizeof header, "  %-20s %33s %33s\n", "", "current", "peak");
  out += header;
  byte_row(out, "live (requested)", s.live_bytes, s.peak_live_bytes);
  byte_row(out, "allocated (blocks)", s.allocated_bytes, s.peak_allocated_bytes);
  byte_row(out, "reserved", s.reserved_bytes, s.peak_reserved_bytes);
  byte_row(out, "free (cached)", s.free_bytes);
  byte_row(out, "largest free block", s.largest_free_block);
  byte_row(out, "pending free", s.pending_free_bytes);
  if (s.spare_bytes != 0) byte_row(out, "spare chunks", s.spare_bytes);
  count_row(out, "live allocations", s.live_allocations, s.peak_live_allocations);
  count_row(out, "segments", s.segments, s.peak_segments);
  count_row(out, "allocations", s.allocations);
  count_row(out, "frees", s.frees);
  count_row(out, "segment allocations", s.segment_allocations);
  count_row(out, "segment releases", s.segment_releases);
  if (s.failed_releases != 0) count_row(out, "failed releases", s.failed_releases);
  count_row(out, "consolidations", s.consolidations);
  count_row(out, "oom retries", s.oom_retries);
  count_row(out, "ooms", s.ooms);
  count_row(out, "streams", s.streams);
  ratio_row(out, "fragmentation", s.fragmentation());
  ratio_row(out, "peak reserved/live", s.peak_overhead_ratio());
  return out;
}

}  // namespace sdalloc
