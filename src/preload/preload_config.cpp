// preload_config.cpp - the drop-in's SDALLOC_CONF table: the shared pool rows plus its own.
#include "preload/preload_config.hpp"

#include <vector>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::preload {
namespace {

using config::Option;

constexpr std::string_view kName = "SDALLOC_CONF";

// The smallest threshold: below it the pool's 512-byte rounding would cost more than the
// request, and every pool block is at least this big anyway.
constexpr std::size_t kMinThreshold = std::size_t{4} << 10;
// The smallest reserved range worth having: one default segment of each kind and then some.
constexpr std::size_t kMinAddressSpace = std::size_t{1} << 30;

std::vector<Option<PreloadConfig>> preload_rows() {
  std::vector<Option<PreloadConfig>> rows = config::lift<PreloadConfig>(config::pool_options(
      {config::kModeAuto, config::kModePool, config::kModeVmm, config::kModePlanned}));
  // The drop-in's own rows go first: they are what a user of LD_PRELOAD sets.
  std::vector<Option<PreloadConfig>> own;
  own.push_back(config::size_option<PreloadConfig>(
      "threshold",
      "requests of at least this many bytes (tensor storage) come from the pool; smaller ones "
      "from the system allocator (glibc). At least 4KiB.",
      [](auto& c) -> auto& { return c.threshold; }));
  own.push_back(config::size_option<PreloadConfig>(
      "address_space",
      "the one range of address space (reserved, not memory) every pool byte lies in; the "
      "pool's memory can never exceed it. At least 1GiB.",
      [](auto& c) -> auto& { return c.address_space; }));
  own.push_back(config::text_option<PreloadConfig>(
      "report",
      "`stderr` or a file path (`%p` in it: the process id): at exit, write peak live and "
      "reserved bytes and the counts of what the pool served.",
      [](auto& c) -> auto& { return c.report; }));
  own.push_back(config::text_option<PreloadConfig>(
      "record",
      "a file path (`%p` in it: the process id): write the event trace (docs/formats.md) of "
      "every request the pool served, for `sdalloc replay`.",
      [](auto& c) -> auto& { return c.record; }));
  own.push_back(config::bool_option<PreloadConfig>(
      "huge_pages",
      "ask for transparent huge pages (madvise MADV_HUGEPAGE) on the pool's memory: one page "
      "fault per 2MiB instead of 512, where the kernel's THP setting allows it.",
      [](auto& c) -> auto& { return c.huge_pages; }));
  own.push_back(config::bool_option<PreloadConfig>(
      "keep_system_heap",
      "glibc keeps the memory of the requests below the threshold: no mmap'd block below the "
      "threshold and no heap trimming (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD), so they "
      "are not faulted in again every iteration. `false`: glibc's defaults.",
      [](auto& c) -> auto& { return c.keep_system_heap; }));
  own.push_back(config::bool_option<PreloadConfig>(
      "vmm_moves",
      "`mode:vmm`: a free page the pool needs elsewhere moves there with its page table "
      "(mremap, Linux 5.7), keeping what the program faulted in; `false`: it is unmapped and "
      "a fresh page mapped, faulted in again on first use.",
      [](auto& c) -> auto& { return c.vmm_moves; }));
  rows.insert(rows.begin() + 1, own.begin(), own.end());  // after mode
  return rows;
}

void finish(PreloadConfig& c, const config::KeySet& given) {
  config::raise_to_granularity(c, given);
  if (c.threshold < kMinThreshold) {
    throw InvalidArgument(
        "SDALLOC_CONF: threshold must be at least 4KiB (the pool is not a "
        "small-object allocator), not " +
        config::size_text(c.threshold));
  }
  if (c.address_space < kMinAddressSpace) {
    throw InvalidArgument("SDALLOC_CONF: address_space must be at least 1GiB, not " +
                          config::size_text(c.address_space));
  }
  if (c.capacity != 0 && c.capacity > c.address_space) {
    throw InvalidArgument("SDALLOC_CONF: capacity " + config::size_text(c.capacity) +
                          " exceeds address_space " + config::size_text(c.address_space));
  }
  config::validate_pool_conf(kName, c);
}

}  // namespace

const config::OptionTable<PreloadConfig>& preload_options() {
  static const config::OptionTable<PreloadConfig> table(kName, preload_rows(), finish);
  return table;
}

PreloadConfig parse_preload_config(std::string_view text) { return preload_options().parse(text); }

std::string format_preload_config(const PreloadConfig& config) {
  return preload_options().format(config);
}

std::string path_for_process(std::string_view path, int pid) {
  std::string out;
  out.reserve(path.size() + 8);
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 1 < path.size() && (path[i + 1] == 'p' || path[i + 1] == '%')) {
      out += path[i + 1] == 'p' ? std::to_string(pid) : std::string("%");
      ++i;
    } else {
      out += path[i];
    }
  }
  return out;
}

}  // namespace sdalloc::preload
