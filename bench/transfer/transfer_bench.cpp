// transfer_bench.cpp - sdalloc_transfer_bench: the transfer engine on the host backend.
//
// Two tables, every figure measured here (median of --repeat runs):
//  1. Many small tensors host->device: the engine's packed calls against one copy call per
//     tensor (the engine with packing off, and the backend fed one call per tensor), with
//     the wall time, the copy calls, and the throughput.
//  2. Weight offload with a simulated compute of known duration per layer (a sleep) and
//     copies of known duration (the backend's bytes_per_second): the planned, prefetching
//     step against the synchronous one (prefetch 0) and against max(compute, copy), the
//     bound a perfect overlap reaches, and compute + copy, the synchronous bound.
// Usage: sdalloc_transfer_bench [--count N] [--bytes B] [--layers L] [--compute-ms C]
//                               [--copy-ms T] [--budget-layers K] [--repeat R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sdalloc/resources/host_resource.hpp"
#include "sdalloc/transfer/host_copy_backend.hpp"
#include "sdalloc/transfer/transfer_engine.hpp"
#include "sdalloc/transfer/weight_offloader.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::size_t count = 10000;
  std::size_t bytes = 4096;
  std::size_t layers = 24;
  double compute_ms = 20;
  double copy_ms = 10;
  std::size_t budget_layers = 6;
  int repeat = 5;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Run {
  double seconds = 0;
  std::uint64_t calls = 0;
};

// count tensors of `bytes` host->device through an engine (warm: its staging is cached).
Run engine_run(const Args& a, sdalloc::HostCopyBackend& backend, sdalloc::TransferEngine& engine,
               const std::vector<unsigned char>& host, std::vector<unsigned char>& device) {
  const std::uint64_t before = backend.calls();
  const auto start = Clock::now();
  for (std::size_t i = 0; i < a.count; ++i) {
    (void)engine.copy(sdalloc::CopyKind::kHostToDevice, device.data() + i * a.bytes,
                      host.data() + i * a.bytes, a.bytes);
  }
  engine.synchronize();
  return Run{seconds_since(start), backend.calls() - before};
}

// The backend fed one call per tensor, no engine: the floor of per-call submission.
Run per_call_run(const Args& a, const std::vector<unsigned char>& host,
                 std::vector<unsigned char>& device) {
  sdalloc::HostCopyBackend backend;
  const auto start = Clock::now();
  for (std::size_t i = 0; i < a.count; ++i) {
    sdalloc::CopyCall call;
    call.regions.push_back({device.data() + i * a.bytes, host.data() + i * a.bytes, a.bytes});
    (void)backend.submit(std::move(call), 0);
  }
  backend.synchronize();
  return Run{seconds_since(start), backend.calls()};
}

double offload_step(const Args& a, std::size_t prefetch, std::uint64_t* loads) {
  constexpr std::size_t kWeight = 256 * 1024;
  sdalloc::HostCopyBackendOptions options;
  options.bytes_per_second = static_cast<double>(kWeight) / (a.copy_ms / 1000.0);
  sdalloc::HostCopyBackend backend(options);
  sdalloc::TransferEngine engine(backend);
  sdalloc::HostResource device;
  sdalloc::WeightOffloader offloader(
      engine, device, sdalloc::OffloadOptions{a.budget_layers * kWeight, prefetch, true});
  std::vector<std::vector<unsigned char>> weights(a.layers, std::vector<unsigned char>(kWeight, 1));
  for (const auto& w : weights) offloader.add_weight(w.data(), w.size());
  const auto compute = std::chrono::duration<double, std::milli>(a.compute_ms);
  std::vector<double> steps;
  for (int step = 0; step < 2 + a.repeat; ++step) {
    const std::uint64_t before = offloader.stats().loads;
    const auto start = Clock::now();
    offloader.begin_step();
    for (std::size_t l = 0; l < a.layers; ++l) {
      (void)offloader.acquire(std::span<const std::size_t>(&l, 1));
      std::this_thread::sleep_for(compute);
    }
    offloader.end_step();
    if (step >= 2) {  // after the recorded and the first planned step
      steps.push_back(seconds_since(start));
      *loads = offloader.stats().loads - before;
    }
  }
  return median(steps);
}

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return false;
    const char* value = argv[++i];
    if (flag == "--count")
      a.count = std::strtoull(value, nullptr, 10);
    else if (flag == "--bytes")
      a.bytes = std::strtoull(value, nullptr, 10);
    else if (flag == "--layers")
      a.layers = std::strtoull(value, nullptr, 10);
    else if (flag == "--compute-ms")
      a.compute_ms = std::strtod(value, nullptr);
    else if (flag == "--copy-ms")
      a.copy_ms = std::strtod(value, nullptr);
    else if (flag == "--budget-layers")
      a.budget_layers = std::strtoull(value, nullptr, 10);
    else if (flag == "--repeat")
      a.repeat = std::atoi(value);
    else
      return false;
  }
  return a.count > 0 && a.bytes > 0 && a.layers > 0 && a.budget_layers > 0 && a.repeat > 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) {
    std::fprintf(stderr,
                 "usage: sdalloc_transfer_bench [--count N] [--bytes B] [--layers L] "
                 "[--compute-ms C] [--copy-ms T] [--budget-layers K] [--repeat R]\n");
    return 2;
  }
  std::vector<unsigned char> host(a.count * a.bytes, 7), device(host.size());
  std::printf("== %zu tensors of %zu B host->device (host backend, median of %d)\n", a.count,
              a.bytes, a.repeat);
  std::printf("%-34s %10s %8s %10s\n", "method", "time ms", "calls", "GB/s");
  struct Row {
    const char* name;
    std::vector<Run> runs;
  };
  Row rows[] = {{"engine, packed (default)", {}},
                {"engine, one call per tensor", {}},
                {"backend, one call per tensor", {}}};
  sdalloc::HostCopyBackend packed_backend, single_backend;
  sdalloc::TransferEngineOptions single_options;
  single_options.small_bytes = 0;  // every request on its own: one call per tensor
  single_options.chunk_bytes = std::max<std::size_t>(a.bytes, 4096);
  sdalloc::TransferEngine packed(packed_backend), single(single_backend, single_options);
  (void)engine_run(a, packed_backend, packed, host, device);  // warm the staging caches
  (void)engine_run(a, single_backend, single, host, device);
  for (int r = 0; r < a.repeat; ++r) {
    rows[0].runs.push_back(engine_run(a, packed_backend, packed, host, device));
    rows[1].runs.push_back(engine_run(a, single_backend, single, host, device));
    rows[2].runs.push_back(per_call_run(a, host, device));
  }
  double packed_s = 0;
  for (const Row& row : rows) {
    std::vector<double> s;
    for (const Run& run : row.runs) s.push_back(run.seconds);
    const double t = median(s);
    if (packed_s == 0) packed_s = t;
    std::printf("%-34s %10.2f %8llu %10.2f   (%.1fx the packed time)\n", row.name, t * 1e3,
                static_cast<unsigned long long>(row.runs.back().calls),
                static_cast<double>(host.size()) / t / 1e9, t / packed_s);
  }
  std::printf(
      "\n== weight offload: %zu layers of 256 KiB, compute %.1f ms and copy %.1f ms "
      "per layer, budget %zu layers (median of %d steps)\n",
      a.layers, a.compute_ms, a.copy_ms, a.budget_layers, a.repeat);
  std::uint64_t loads_prefetch = 0, loads_sync = 0;
  const double overlapped = offload_step(a, 2, &loads_prefetch);
  const double synchronous = offload_step(a, 0, &loads_sync);
  const double compute = static_cast<double>(a.layers) * a.compute_ms / 1000.0;
  const double copy = static_cast<double>(loads_prefetch) * a.copy_ms / 1000.0;
  const double bound = std::max(compute, copy);
  const double sum = compute + static_cast<double>(loads_sync) * a.copy_ms / 1000.0;
  std::printf("%-34s %10s %8s %14s\n", "step", "time ms", "loads", "vs bound");
  std::printf("%-34s %10.1f %8llu %13.3fx  (bound max(compute, copy) %.1f ms)\n",
              "planned, prefetch 2", overlapped * 1e3,
              static_cast<unsigned long long>(loads_prefetch), overlapped / bound, bound * 1e3);
  std::printf("%-34s %10.1f %8llu %13.3fx  (compute + copy %.1f ms)\n", "synchronous, prefetch 0",
              synchronous * 1e3, static_cast<unsigned long long>(loads_sync), synchronous / sum,
              sum * 1e3);
  std::printf("bar: planned step <= 1.10 x max(compute, copy): %s\n",
              overlapped <= 1.10 * bound ? "PASS" : "FAIL");
  return 0;
}
