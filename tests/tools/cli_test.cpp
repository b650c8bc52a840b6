// The `sdalloc` program end to end: exit statuses, messages, the JSON file, system
// allocators in child processes. Runs the built binary (SDALLOC_CLI).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "config/pool_conf.hpp"
#include "replay/replay_result.hpp"
#include "replay/system_allocators.hpp"
#include "support/test_support.hpp"

namespace sdalloc::replay {
namespace {

using test::Contains;
using test::TempDir;

struct CliRun {
  int status = -1;
  std::string out;
  std::string err;
};

// Runs `sdalloc ARGS` through the shell, stdout and stderr captured in files of `dir`.
CliRun run_cli(const TempDir& dir, const std::string& args, const std::string& stdin_file = "") {
  const std::string out = dir.file("stdout.txt");
  const std::string err = dir.file("stderr.txt");
  std::string command =
      std::string("'") + SDALLOC_CLI + "' " + args + " >'" + out + "' 2>'" + err + "'";
  if (!stdin_file.empty()) command += " <'" + stdin_file + "'";
  const int raw = std::system(command.c_str());
  CliRun run;
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  run.out = test::read_file(out);
  run.err = test::read_file(err);
  return run;
}

std::string resnet_trace() {
  return std::string(SDALLOC_DATA_DIR) + "/traces/torchvision_resnet50_b1_224_cpu_2pass.csv";
}

struct MalformedTrace {
  const char* name;
  std::string text;
  const char* message;  // what the error must say
};

TEST(Cli, MalformedTracesExitWithStatusOneAndNameTheProblem) {
  const std::vector<MalformedTrace> cases = {
      {"bad header", "op,id,bytes\na,0,16\n", "header"},
      {"unknown op", "op,id,size\na,0,16\nx,0,16\n", "unknown op 'x'"},
      {"free of an unknown id", "op,id,size\na,0,16\nf,7,16\n", "id 7"},
      {"negative size", "op,id,size\na,0,-16\n", "size '-16' is not a non-negative integer"},
  };
  TempDir dir;
  for (const MalformedTrace& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file("trace.csv");
    test::write_file(path, c.text);
    const CliRun run = run_cli(dir, "replay -a pool '" + path + "'");
    EXPECT_EQ(run.status, 1);
    EXPECT_TRUE(Contains(run.err, "sdalloc replay: bad trace: " + path));
    EXPECT_TRUE(Contains(run.err, c.message));
    EXPECT_EQ(run.out, "");
  }
}

TEST(Cli, TruncatedGzipTraceExitsWithStatusOne) {
  TempDir dir;
  std::string text = "op,id,size\n";
  for (int i = 0; i < 2000; ++i) text += "a," + std::to_string(i) + ",4096\n";
  const std::string whole = dir.file("whole.csv.gz");
  test::write_gzip(whole, text);
  const std::string bytes = test::read_file(whole);
  const std::string cut = dir.file("cut.csv.gz");
  test::write_file(cut, bytes.substr(0, bytes.size() / 2));
  const CliRun run = run_cli(dir, "replay -a pool '" + cut + "'");
  EXPECT_EQ(run.status, 1);
  EXPECT_TRUE(Contains(run.err, "truncated gzip file"));
}

TEST(Cli, BadUsageExitsWithStatusTwo) {
  TempDir dir;
  EXPECT_EQ(run_cli(dir, "replay --passes 0").status, 2);
  EXPECT_EQ(run_cli(dir, "replay --frobnicate").status, 2);
  const CliRun unknown = run_cli(dir, "replay -a pool,nope '" + resnet_trace() + "'");
  EXPECT_EQ(unknown.status, 2);
  EXPECT_TRUE(Contains(unknown.err, "unknown allocator 'nope'"));
  EXPECT_EQ(run_cli(dir, "").status, 2);  // a command is required
}

// --pool-conf: the pool's options in SDALLOC_CONF's spelling. Without consolidation the
// ResNet trace's second forward churns segments again, so the counts differ; a key that is
// not a pool row, or a bad value, is bad usage.
TEST(Cli, PoolConfSetsThePoolsOptionsAndRejectsWhatItDoesNotKnow) {
  TempDir dir;
  const std::string json_default = dir.file("default.json");
  const std::string json_conf = dir.file("conf.json");
  const CliRun plain = run_cli(
      dir, "replay -q -a pool --passes 1 --json '" + json_default + "' '" + resnet_trace() + "'");
  ASSERT_EQ(plain.status, 0) << plain.err;
  const CliRun conf = run_cli(dir,
                              "replay -q -a pool --passes 1 --pool-conf "
                              "huge_threshold:128MiB,consolidate:false --json '" +
                                  json_conf + "' '" + resnet_trace() + "'");
  ASSERT_EQ(conf.status, 0) << conf.err;
  const auto a = nlohmann::json::parse(test::read_file(json_default));
  const auto b = nlohmann::json::parse(test::read_file(json_conf));
  EXPECT_NE(a["results"][0]["counters"], b["results"][0]["counters"]);
  const CliRun unknown =
      run_cli(dir, "replay -q -a pool --pool-conf threshold:1MiB '" + resnet_trace() + "'");
  EXPECT_EQ(unknown.status, 2);
  EXPECT_TRUE(Contains(unknown.err, "--pool-conf")) << unknown.err;
  EXPECT_TRUE(Contains(unknown.err, "threshold")) << unknown.err;
  const CliRun bad =
      run_cli(dir, "replay -q -a pool --pool-conf granularity:3KiB '" + resnet_trace() + "'");
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(Contains(bad.err, "segment_granularity must be a power of two")) << bad.err;
  // SDALLOC_CONF's rows that are not the caching pool's mean nothing to --pool-conf.
  for (const char* other : {"capacity:1GiB", "mode:pool", "max_plans:2"}) {
    const CliRun not_pool = run_cli(
        dir, std::string("replay -q -a pool --pool-conf ") + other + " '" + resnet_trace() + "'");
    EXPECT_EQ(not_pool.status, 2) << other;
  }
}

// --device-like: vmm's pages are 2 MiB and cannot be moved (a CUDA mapping is unmapped and
// mapped again, never moved), as on CUDA's virtual memory; pool takes whole segments either
// way, so its figures do not change.
TEST(Cli, DeviceLikeVmmNeverMovesPagesAndThePoolIsUnchanged) {
  TempDir dir;
  auto counters = [&](const std::string& allocator, const std::string& flags) {
    const std::string json = dir.file("counters.json");
    const CliRun run = run_cli(dir, "replay -q -a " + allocator + " --passes 2 " + flags +
                                        " --json '" + json + "' '" + resnet_trace() + "'");
    EXPECT_EQ(run.status, 0) << run.err;
    return nlohmann::json::parse(test::read_file(json))["results"][0]["counters"]
        .get<std::string>();
  };
  const std::string host = counters("vmm", "");
  const std::string device = counters("vmm", "--device-like");
  EXPECT_FALSE(Contains(host, "pages moved 0")) << host;
  EXPECT_TRUE(Contains(device, "moves 0, pages moved 0")) << device;
  EXPECT_EQ(counters("pool", ""), counters("pool", "--device-like"));
}

// --help lists the keys --pool-conf takes, from the table that parses them.
TEST(Cli, PoolConfHelpListsEveryKeyItTakes) {
  TempDir dir;
  const CliRun help = run_cli(dir, "replay --help");
  ASSERT_EQ(help.status, 0) << help.err;
  for (const auto& row : config::caching_pool_options()) {
    // A retired key is still accepted (with a warning) but no longer offered.
    const bool retired = row.spec.type == config::OptionType::kRetired;
    EXPECT_EQ(Contains(help.out, std::string(row.spec.key)), !retired) << row.spec.key;
  }
  EXPECT_FALSE(Contains(help.out, "replan_after")) << help.out;
}

TEST(Cli, MissingTraceFileExitsWithStatusOne) {
  TempDir dir;
  const CliRun run = run_cli(dir, "replay -a pool '" + dir.file("absent.csv") + "'");
  EXPECT_EQ(run.status, 1);
  EXPECT_TRUE(Contains(run.err, "cannot open"));
}

TEST(Cli, CapacityTooSmallExitsWithStatusThreeAndSaysOutOfMemory) {
  TempDir dir;
  const CliRun run = run_cli(dir, "replay -q -a pool --capacity 1M '" + resnet_trace() + "'");
  EXPECT_EQ(run.status, 3);
  EXPECT_TRUE(Contains(run.out, "out of memory"));
}

// Issue 15, F3: one 4 GiB allocation on vmm hit the kernel's mapping limit (a mapping per
// 64 KiB chunk), the row said "-" and the exit status was 0. The pages are never written.
TEST(Cli, F3FourGiBAllocationReplaysOnVmm) {
  TempDir dir;
  const std::string trace = dir.file("four_gib.csv");
  test::write_file(trace, "op,id,size\na,0,4294967296\nf,0,4294967296\na,1,1048576\nf,1,1048576\n");
  const CliRun run = run_cli(dir, "replay -q -a vmm --passes 1 '" + trace + "'");
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  // 65,536 pages of 64 KiB for the 4 GiB; the 1 MiB reuses 16 of them.
  EXPECT_TRUE(Contains(run.out, "chunks 65536")) << run.out;
}

// F3: an allocator that fails for a reason other than out of memory makes the exit status
// 4 (it used to be 0); out of memory alone is 3; skipped allocators are no failure.
TEST(Cli, F3ExitStatusIsFourWhenAnAllocatorFailsOtherwise) {
  AllocatorResult ran;
  ran.ran = true;
  AllocatorResult out_of_memory;
  out_of_memory.problem = "out of memory: vmm: ...";
  AllocatorResult not_installed;
  not_installed.problem = "libjemalloc.so.2 not found; install it with: sudo apt-get install";
  AllocatorResult failed;
  failed.problem = "host-vm(anonymous): unmap at 0x1000 of 64 KiB: mmap(PROT_NONE) failed";
  failed.failed = true;
  EXPECT_EQ(replay_exit_status({ran, not_installed}), 0);
  EXPECT_EQ(replay_exit_status({ran, out_of_memory}), 3);
  EXPECT_EQ(replay_exit_status({out_of_memory, failed, ran}), 4);
  EXPECT_EQ(replay_exit_status({failed}), 4);
}

// Issue 15, F4: one 1 TiB request to vmm without a capacity created 16 M chunks one by one
// (a hang), and --min-capacity hung with it. Now it is refused at once: out of memory.
TEST(Cli, F4TerabyteRequestOnVmmFailsFastAlsoWithMinCapacity) {
  TempDir dir;
  const std::string trace = dir.file("one_tib.csv");
  test::write_file(trace, "op,id,size\na,0,1099511627776\nf,0,1099511627776\n");
  for (const char* extra : {"", " --min-capacity"}) {
    SCOPED_TRACE(extra);
    const CliRun run =
        run_cli(dir, std::string("replay -q -a vmm --passes 1") + extra + " '" + trace + "'");
    EXPECT_EQ(run.status, 3) << run.out << run.err;
    EXPECT_TRUE(Contains(run.out, "out of memory")) << run.out;
  }
}

TEST(Cli, JsonHasEveryFieldForEveryAllocatorItRan) {
  if (built_with_sanitizer()) GTEST_SKIP() << "system allocators are not measured under sanitizers";
  TempDir dir;
  const std::string json = dir.file("out.json");
  const CliRun run = run_cli(dir,
                             "replay -q --touch --passes 2 -a pool,planned,glibc,tcmalloc "
                             "--json '" +
                                 json + "' '" + resnet_trace() + "'");
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json j = nlohmann::json::parse(test::read_file(json));
  EXPECT_EQ(j.at("trace").get<std::string>(), resnet_trace());
  EXPECT_EQ(j.at("peak_live").get<std::uint64_t>(), 11763840u);
  std::set<std::string> seen;
  for (const auto& r : j.at("results")) {
    const std::string name = r.at("allocator").get<std::string>();
    seen.insert(name);
    SCOPED_TRACE(name);
    if (name == "tcmalloc" && !r.at("ran").get<bool>()) {
      EXPECT_TRUE(Contains(r.at("problem").get<std::string>(), "apt-get install"));
      continue;  // not installed here; CI installs it (ReplayDriver.SystemAllocatorLibraries...)
    }
    ASSERT_TRUE(r.at("ran").get<bool>()) << r.dump();
    EXPECT_GT(r.at("peak_reserved").get<std::uint64_t>(), 0u);
    EXPECT_GT(r.at("ratio").get<double>(), 0.0);
    EXPECT_GT(r.at("ns_per_op").get<double>(), 0.0);
    EXPECT_TRUE(r.at("min_capacity").is_null());
    EXPECT_EQ(r.at("pass_seconds").size(), 2u);
    EXPECT_TRUE(r.contains("counters"));
  }
  EXPECT_EQ(seen, (std::set<std::string>{"pool", "planned", "glibc", "tcmalloc"}));
  // The table names every allocator too.
  for (const std::string& name : seen) EXPECT_TRUE(Contains(run.out, "\n" + name + " "));
}

TEST(Cli, TraceFromStandardInputAndRmmLogsAreAccepted) {
  TempDir dir;
  const CliRun from_stdin = run_cli(dir, "replay -q -a pool -", resnet_trace());
  EXPECT_EQ(from_stdin.status, 0) << from_stdin.err;
  EXPECT_TRUE(Contains(from_stdin.out, "peak live:   11.2 MiB"));
  const CliRun rmm = run_cli(
      dir, "replay -q -a pool '" + std::string(SDALLOC_DATA_DIR) + "/samples/rmm_log_sample.csv'");
  EXPECT_EQ(rmm.status, 0) << rmm.err;
}

TEST(Cli, PlanPrintsJsonAndItsExitStatusSaysWhetherThePlanFits) {
  TempDir dir;
  // Three buffers in MiniMalloc's format: 0 and 1 overlap in time, then 1 and 2; at most
  // 300 bytes are live at once, and a plan of 300 bytes exists (1 above 0 and 2).
  const std::string instance = dir.file("three.csv");
  test::write_file(instance, "id,lower,upper,size\n0,0,10,100\n1,5,15,200\n2,10,20,100\n");
  const CliRun fits = run_cli(dir, "plan --json --capacity 300 '" + instance + "'");
  ASSERT_EQ(fits.status, 0) << fits.err;
  const nlohmann::json j = nlohmann::json::parse(fits.out);
  EXPECT_TRUE(j.at("fits").get<bool>());
  EXPECT_EQ(j.at("lower_bound").get<std::uint64_t>(), 300u);
  EXPECT_EQ(j.at("arena").get<std::uint64_t>(), 300u);
  EXPECT_DOUBLE_EQ(j.at("ratio").get<double>(), 1.0);
  // Below the lower bound no plan exists: exit status 3.
  const CliRun no_fit =
      run_cli(dir, "plan --json --time-limit 1 --capacity 299 '" + instance + "'");
  EXPECT_EQ(no_fit.status, 3);
  EXPECT_FALSE(nlohmann::json::parse(no_fit.out).at("fits").get<bool>());
  EXPECT_EQ(run_cli(dir, "plan '" + dir.file("absent.csv") + "'").status, 1);
  EXPECT_EQ(run_cli(dir, "plan").status, 2);  // INPUT is required
}

TEST(Cli, PlanThreadsAndNodeLimit) {
  TempDir dir;
  const std::string instance = std::string(SDALLOC_DATA_DIR) + "/minimalloc/D.1048576.csv";
  // A node limit gives the same plan on every run, whatever --threads says (and however
  // slow the machine: a time limit far above what the nodes take, so only they decide).
  const std::string first = dir.file("first.csv");
  const std::string again = dir.file("again.csv");
  const std::string limited =
      "plan --json --threads 2 --max-nodes 5000 --time-limit 300 '" + instance + "' -o ";
  ASSERT_EQ(run_cli(dir, limited + "'" + first + "'").status, 0);
  ASSERT_EQ(run_cli(dir, limited + "'" + again + "'").status, 0);
  EXPECT_EQ(test::read_file(first), test::read_file(again));
  // Two threads for half a second: a valid plan below greedy's (1.3 x the bound on D).
  const CliRun threaded =
      run_cli(dir, "plan --json --threads 2 --time-limit 0.5 '" + instance + "'");
  ASSERT_EQ(threaded.status, 0) << threaded.err;
  EXPECT_LT(nlohmann::json::parse(threaded.out).at("ratio").get<double>(), 1.2);
  // Out of range: a usage error naming the option.
  const CliRun many = run_cli(dir, "plan --threads 65 '" + instance + "'");
  EXPECT_EQ(many.status, 2);
  EXPECT_TRUE(Contains(many.err, "--threads")) << many.err;
  const CliRun negative = run_cli(dir, "plan --max-nodes -1 '" + instance + "'");
  EXPECT_EQ(negative.status, 2);  // not 2^64 - 1
  EXPECT_TRUE(Contains(negative.err, "'-1' is not a count")) << negative.err;
  // Above 2^64 - 1, and control bytes: refused as given, escaped (issue 15, F9).
  const CliRun huge = run_cli(dir, "plan --max-nodes 18446744073709551616 '" + instance + "'");
  EXPECT_EQ(huge.status, 2);
  EXPECT_TRUE(Contains(huge.err, "'18446744073709551616' is not a count")) << huge.err;
  const CliRun escape =
      run_cli(dir, "plan --max-nodes \"$(printf '\\033[31m')\" '" + instance + "'");
  EXPECT_EQ(escape.status, 2);
  EXPECT_TRUE(Contains(escape.err, "'\\x1b[31m' is not a count")) << escape.err;
  EXPECT_EQ(escape.err.find('\x1b'), std::string::npos);
}

// ---------------------------------------------------------------------------------------
// Issue 15: F7 (/dev/zero fails fast) and F9 (messages and --capacity).

TEST(Cli, F7_ReplayAndPlanOfDevZeroFailFastWithStatusOne) {
  if (!std::filesystem::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero";
  TempDir dir;
  for (const std::string command : {"replay -a pool", "plan"}) {
    SCOPED_TRACE(command);
    // `timeout` bounds a regression: it would hang (plan) or grow to 16.8 GB (replay).
    const auto start = std::chrono::steady_clock::now();
    const std::string err = dir.file("err.txt");
    const int raw = std::system(("timeout 60 '" + std::string(SDALLOC_CLI) + "' " + command +
                                 " /dev/zero >/dev/null 2>'" + err + "'")
                                    .c_str());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(WIFEXITED(raw));
    EXPECT_EQ(WEXITSTATUS(raw), 1);
    EXPECT_LT(seconds, 10.0);
    EXPECT_TRUE(Contains(test::read_file(err), "bad trace: /dev/zero:1: unrecognised trace format"))
        << test::read_file(err);
  }
}

TEST(Cli, F9_ControlBytesInATraceReachTheTerminalEscaped) {
  TempDir dir;
  const std::string path = dir.file("escapes.csv");
  test::write_file(path, std::string("op,id,size\na,0,16\n\x1b]0;owned\x07\0,1,2\n", 34));
  const CliRun run = run_cli(dir, "replay -a pool '" + path + "'");
  EXPECT_EQ(run.status, 1);
  EXPECT_TRUE(Contains(run.err, "unknown op '\\x1b]0;owned\\x07\\x00' (expected 'a' or 'f')"))
      << run.err;
  EXPECT_EQ(run.err.find('\x1b'), std::string::npos);
  EXPECT_EQ(run.err.find('\0'), std::string::npos);
}

TEST(Cli, F9_CapacityThatDoesNotFitIsRefusedAsGiven) {
  TempDir dir;
  for (const std::string command : {"replay -q -a pool", "plan"}) {
    SCOPED_TRACE(command);
    std::string trace = "'";  // appended: GCC 12 warns (-Wrestrict, falsely) about "'" + ...
    trace.append(resnet_trace()).append("'");
    const CliRun digits = run_cli(dir, command + " --capacity 99999999999999999999999 " + trace);
    EXPECT_EQ(digits.status, 2);  // not silently 2^64 - 1
    EXPECT_TRUE(Contains(digits.err, "--capacity: '99999999999999999999999' is too large"))
        << digits.err;
    const CliRun unit = run_cli(dir, command + " --capacity 17EB " + trace);
    EXPECT_EQ(unit.status, 2);
    EXPECT_TRUE(Contains(unit.err, "'17EB' is too large")) << unit.err;
    const CliRun negative = run_cli(dir, command + " --capacity -5 " + trace);
    EXPECT_EQ(negative.status, 2);
    EXPECT_TRUE(Contains(negative.err, "'-5' is not a byte size")) << negative.err;
    EXPECT_FALSE(Contains(negative.err, "1797693134862315"));  // DBL_MAX, 309 digits
    const CliRun zero = run_cli(dir, command + " --capacity 0 " + trace);
    EXPECT_EQ(zero.status, 2);
    const CliRun long_text =
        run_cli(dir, command + " --capacity " + std::string(5000, '7') + " " + trace);
    EXPECT_EQ(long_text.status, 2);
    EXPECT_LT(long_text.err.size(), 300u) << long_text.err;
  }
  // What fits is read as before: the largest size, units in either case, spaces before a unit.
  EXPECT_EQ(run_cli(dir, "replay -q -a pool --capacity 16383PiB '" + resnet_trace() + "'").status,
            0);
  EXPECT_EQ(run_cli(dir, "replay -q -a pool --capacity '8 gb' '" + resnet_trace() + "'").status, 0);
  const CliRun small = run_cli(dir, "replay -q -a pool --capacity 1k '" + resnet_trace() + "'");
  EXPECT_EQ(small.status, 3);  // out of memory under 1 KiB: the capacity was applied
}

// Issue 15, F6: a time limit past the clock's range was undefined behaviour and gave only
// the greedy plan (10 bytes here); clamped, the search runs and finds the 9 of the bound.
TEST(Cli, F6_PlanWithAHugeTimeLimitSearchesToTheBound) {
  TempDir dir;
  const std::string instance = dir.file("six.csv");
  test::write_file(instance,
                   "id,lower,upper,size\n0,4,8,1\n1,6,8,4\n2,0,3,4\n3,0,2,4\n4,1,5,1\n5,3,8,4\n");
  const CliRun run = run_cli(dir, "plan --json --time-limit 1e300 '" + instance + "'");
  ASSERT_EQ(run.status, 0) << run.err;
  const nlohmann::json j = nlohmann::json::parse(run.out);
  EXPECT_EQ(j.at("arena").get<std::uint64_t>(), 9u);
  EXPECT_FALSE(j.at("timed_out").get<bool>());
}

// Issue 15, F1: times past +-2^62 wrapped the lower bound; they are refused, naming the line.
TEST(Cli, F1_PlanRefusesTimesBeyondTwoToThe62) {
  TempDir dir;
  const std::string instance = dir.file("far.csv");
  test::write_file(instance,
                   "id,lower,upper,size\n0,-9000000000000000000,9000000000000000000,100\n");
  const CliRun run = run_cli(dir, "plan --json '" + instance + "'");
  EXPECT_EQ(run.status, 1);
  EXPECT_NE(run.err.find("far.csv:2:"), std::string::npos) << run.err;
}

}  // namespace
}  // namespace sdalloc::replay
