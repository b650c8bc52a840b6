// preload_config.hpp - the malloc drop-in's settings and their text form (SDALLOC_CONF).
//
// The syntax and the shared pool rows are the PyTorch shim's (config/option_table.hpp,
// config/pool_conf.hpp): comma-separated `key:value` pairs, e.g.
// "mode:planned,threshold:1MiB,report:stderr". The drop-in serves modes pool, vmm and planned
// and adds its own rows: threshold (requests at or above it come from the pool, smaller ones
// from the system allocator), address_space (the one range every pool byte lies in, which
// makes "is this pointer ours?" one comparison), report and record. preload_options()
// .markdown() is the table in docs/preload.md, which a test keeps equal.
//
// parse_preload_config() throws InvalidArgument("SDALLOC_CONF: <what>, in '<pair>'") for a
// bad text; the drop-in prints that one line and runs on the system allocator instead.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "config/option_table.hpp"
#include "config/pool_conf.hpp"

namespace sdalloc::preload {

using Mode = PoolMode;

// The default threshold (docs/preload.md has the measurement behind it).
inline constexpr std::size_t kDefaultThreshold = std::size_t{1} << 20;
// The default reserved range: address space only (PROT_NONE, MAP_NORESERVE), no memory.
inline constexpr std::size_t kDefaultAddressSpace = std::size_t{1} << 42;

// mode, capacity, pool, replan_after and max_plans come from PoolConf.
struct PreloadConfig : PoolConf {
  std::size_t threshold = kDefaultThreshold;
  std::size_t address_space = kDefaultAddressSpace;
  std::string report;       // "", "stderr" or a file path: the summary written at exit
  std::string record;       // "" or a file path: the event trace of what the pool served
  bool huge_pages = false;  // madvise(MADV_HUGEPAGE) on the pool's memory
  // glibc keeps what it serves below the threshold in its heaps (mallopt: no mmap'd blocks
  // below the threshold, no trimming), as tcmalloc keeps its memory; off: glibc's defaults.
  bool keep_system_heap = true;
  // mode:vmm moves free pages with their page tables (mremap) where the kernel can, instead
  // of unmapping and mapping fresh ones.
  bool vmm_moves = true;
};

const config::OptionTable<PreloadConfig>& preload_options();

// Throws InvalidArgument as described above; checks the pool options too.
PreloadConfig parse_preload_config(std::string_view text);
std::string format_preload_config(const PreloadConfig& config);

// A report or record path for the process `pid`: each "%p" becomes the pid and "%%" a "%",
// so that every process of a program started with one SDALLOC_CONF (subprocesses, workers)
// writes a file of its own instead of overwriting the others'. Any other "%" stays.
std::string path_for_process(std::string_view path, int pid);

}  // namespace sdalloc::preload
