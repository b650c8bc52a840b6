// `sdalloc run` (tools/sdalloc/run/): a probe program (run_probe.cpp) that allocates and touches
// N MiB runs under glibc, tcmalloc and a stand-in for sdalloc's drop-in (fake_preload.cpp);
// rusage figures, the interleaved order, medians, failures, missing allocators, the report
// of sdalloc's modes, the table, the JSON file and the program's exit statuses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "run/child_process.hpp"
#include "run/run_driver.hpp"
#include "run/run_output.hpp"
#include "sdalloc/core/errors.hpp"
#include "support/test_support.hpp"

namespace sdalloc::run {
namespace {

using test::Contains;
using test::TempDir;

constexpr std::uint64_t kMiB = 1 << 20;

RunOptions probe_options(std::vector<std::string> allocators, std::vector<std::string> args,
                         int repeat = 1) {
  RunOptions o;
  o.command = {SDALLOC_RUN_PROBE};
  o.command.insert(o.command.end(), args.begin(), args.end());
  o.allocators = std::move(allocators);
  o.repeat = repeat;
  o.progress = false;
  o.preload_library = SDALLOC_FAKE_PRELOAD;
  return o;
}

const AllocatorRuns& result_of(const RunReport& report, const std::string& name) {
  for (const AllocatorRuns& r : report.results) {
    if (r.allocator == name) return r;
  }
  throw std::runtime_error("no result for " + name);
}

bool tcmalloc_installed() {
  return replay::find_preload_library(*find_run_allocator("tcmalloc")->system).has_value();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return lines;
}

// ---------------------------------------------------------------- pure parts
TEST(RunDriver, InterleavedOrderRunsEveryAllocatorOncePerRound) {
  const std::vector<std::pair<std::size_t, int>> expected = {{0, 1}, {1, 1}, {2, 1},
                                                             {0, 2}, {1, 2}, {2, 2}};
  EXPECT_EQ(interleaved_order(3, 2), expected);
  EXPECT_TRUE(interleaved_order(0, 3).empty());
}

TEST(RunDriver, MedianOfOddAndEvenCounts) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median({}), 0);
}

TEST(RunDriver, MediansSkipFailedRunsAndTakeEachFigureOnItsOwn) {
  AllocatorRuns r;
  for (int i = 0; i < 3; ++i) {
    RunSample s;
    s.round = i + 1;
    s.outcome.exit_status = 0;
    s.outcome.wall_seconds = 1.0 + i;                               // 1 2 3
    s.outcome.peak_rss_bytes = (3 - i) * kMiB;                      // 3 2 1
    s.outcome.minor_faults = std::uint64_t(10 * (i == 1 ? 9 : i));  // 0 90 20
    r.runs.push_back(s);
  }
  EXPECT_EQ(r.failure(), nullptr);
  const Medians m = *r.medians();
  EXPECT_DOUBLE_EQ(m.wall_seconds, 2.0);
  EXPECT_EQ(m.peak_rss_bytes, 2 * kMiB);
  EXPECT_EQ(m.minor_faults, 20u);
  r.runs[2].outcome.exit_status = 1;  // a failed run counts for no median
  EXPECT_EQ(r.failure(), &r.runs[2]);
  EXPECT_DOUBLE_EQ(r.medians()->wall_seconds, 1.5);
}

TEST(RunDriver, LastLinesJoinsTheTailOnOneLine) {
  EXPECT_EQ(last_lines("a\nb\n\nc\n", 100), "a | b | c");
  EXPECT_EQ(last_lines("", 100), "");
  const std::string cut = last_lines("first line\n" + std::string(50, 'x') + "\n", 20);
  EXPECT_EQ(cut.size(), 20u);
  EXPECT_EQ(cut.substr(0, 3), "...");
}

TEST(RunAllocators, MissingSystemLibraryNamesThePackageToInstall) {
  const replay::SystemAllocator nosuch{"nosuch", "", {"libnosuch.so.9"}, "libnosuch9", ""};
  const RunAllocator allocator{"nosuch", "", "", &nosuch, ""};
  const Launch launch = launch_for(allocator, SDALLOC_FAKE_PRELOAD, "/tmp/r.json");
  EXPECT_TRUE(Contains(launch.problem, "libnosuch.so.9 not found"));
  EXPECT_TRUE(Contains(launch.problem, "sudo apt-get install libnosuch9"));
}

TEST(RunAllocators, SdallocModeWithoutTheDropInSaysItIsNotBuilt) {
  const Launch launch = launch_for(*find_run_allocator("sdalloc-pool"), "", "/tmp/r.json");
  EXPECT_TRUE(Contains(launch.problem, "drop-in not built"));
  const Launch named =
      launch_for(*find_run_allocator("sdalloc-vmm"), "/no/such/libsdalloc_preload.so", "r");
  EXPECT_TRUE(Contains(named.problem, "/no/such/libsdalloc_preload.so not found"));
}

TEST(RunAllocators, SdallocModeGetsTheDropInAndItsConf) {
  const Launch launch =
      launch_for(*find_run_allocator("sdalloc-planned"), SDALLOC_FAKE_PRELOAD, "/tmp/r.json");
  EXPECT_EQ(launch.problem, "");
  EXPECT_EQ(launch.preload, SDALLOC_FAKE_PRELOAD);
  ASSERT_EQ(launch.environment.size(), 1u);
  EXPECT_EQ(launch.environment[0].first, "SDALLOC_PRELOAD_CONF");
  EXPECT_EQ(launch.environment[0].second, "mode:planned,report:/tmp/r.json");
  const Launch huge =
      launch_for(*find_run_allocator("sdalloc-pool-huge"), SDALLOC_FAKE_PRELOAD, "/tmp/r.json");
  ASSERT_EQ(huge.environment.size(), 1u);
  EXPECT_EQ(huge.environment[0].second, "mode:pool,huge_pages:true,report:/tmp/r.json");
}

TEST(RunAllocators, PreloadLibraryOptionWinsOverTheEnvironment) {
  ::setenv("SDALLOC_PRELOAD_LIBRARY", "/from/env.so", 1);
  EXPECT_EQ(resolve_preload_library("/from/option.so"), "/from/option.so");
  EXPECT_EQ(resolve_preload_library(""), "/from/env.so");
  ::unsetenv("SDALLOC_PRELOAD_LIBRARY");
}

// ---------------------------------------------------------------- real runs
TEST(RunDriver, PeakRssAndFaultsCoverTheMemoryTheCommandTouched) {
  std::vector<std::string> allocators = {"glibc"};
  if (tcmalloc_installed()) allocators.emplace_back("tcmalloc");  // the probe is uninstrumented
  const RunReport report = run_under_allocators(probe_options(allocators, {"--mib", "64"}));
  ASSERT_EQ(report.results.size(), allocators.size());
  for (const AllocatorRuns& r : report.results) {
    SCOPED_TRACE(r.allocator);
    ASSERT_EQ(r.failure(), nullptr) << r.runs.front().outcome.stderr_tail;
    const Medians m = *r.medians();
    EXPECT_GE(m.peak_rss_bytes, 64 * kMiB);
    EXPECT_LT(m.peak_rss_bytes, 64 * kMiB + 256 * kMiB);
    EXPECT_GE(m.minor_faults, 64 * kMiB / (2 * kMiB));  // at least one per huge page
    EXPECT_GT(m.wall_seconds, 0);
    EXPECT_GE(m.wall_seconds, 0.5 * (m.user_seconds + m.system_seconds) - 0.05);
  }
}

TEST(RunDriver, RoundsInterleaveTheAllocators) {
  TempDir dir;
  const std::string log = dir.file("log.txt");
  const RunReport report = run_under_allocators(
      probe_options({"glibc", "sdalloc-pool", "sdalloc-vmm"}, {"--log", log}, 2));
  const std::vector<std::string> expected = {"glibc", "sdalloc-pool", "sdalloc-vmm",
                                             "glibc", "sdalloc-pool", "sdalloc-vmm"};
  EXPECT_EQ(report.order, expected);
  const std::vector<std::string> lines = lines_of(test::read_file(log));
  ASSERT_EQ(lines.size(), 6u);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].substr(0, lines[i].find(' ')), expected[i]) << lines[i];
  }
  EXPECT_EQ(lines[0], "glibc -");  // no SDALLOC_PRELOAD_CONF outside sdalloc's modes
  EXPECT_TRUE(Contains(lines[1], "sdalloc-pool mode:pool,report:/"));
  EXPECT_EQ(result_of(report, "glibc").runs.size(), 2u);
}

TEST(RunDriver, WarmUpRunsAreUntimedAndUnderTheFirstAllocatorThatCanRun) {
  TempDir dir;
  const std::string log = dir.file("log.txt");
  RunOptions o = probe_options({"sdalloc-vmm", "glibc", "sdalloc-pool"}, {"--log", log});
  o.preload_library = "/no/such/libsdalloc_preload.so";  // sdalloc's modes cannot run
  o.warmup = 2;
  const RunReport report = run_under_allocators(o);
  EXPECT_EQ(report.order, std::vector<std::string>{"glibc"});
  EXPECT_EQ(lines_of(test::read_file(log)),
            (std::vector<std::string>{"glibc -", "glibc -", "glibc -"}));
  EXPECT_TRUE(Contains(format_run_table(report), "2 untimed warm-up run(s)"));
}

TEST(ChildProcess, ProgressIsCalledWhileWaitingAndWallTimeStaysExact) {
  TempDir dir;
  ChildSpec spec;
  spec.argv = {"/bin/sleep", "0.6"};
  spec.stdout_path = dir.file("out");
  spec.stderr_path = dir.file("err");
  int calls = 0;
  const ChildOutcome outcome = run_child(spec, [&] { ++calls; });
  EXPECT_TRUE(outcome.succeeded());
  EXPECT_GE(calls, 1);
  EXPECT_GE(outcome.wall_seconds, 0.6);
  // The pidfd wakes the wait when the child exits; the slack is for a loaded machine.
  EXPECT_LT(outcome.wall_seconds, 1.2);
}

TEST(ChildProcess, CommandThatCannotBeExecutedExits127WithTheReason) {
  TempDir dir;
  const std::string not_executable = dir.file("script");
  test::write_file(not_executable, "#!/no/such/interpreter\n");
  ChildSpec spec;
  spec.argv = {not_executable};
  spec.stdout_path = dir.file("out");
  spec.stderr_path = dir.file("err");
  const ChildOutcome outcome = run_child(spec);
  EXPECT_EQ(outcome.exit_status, 127);
  EXPECT_TRUE(Contains(outcome.stderr_tail, "sdalloc run: cannot run " + not_executable));
}

TEST(RunDriver, SdallocModesShowTheDropInsReport) {
  const RunReport report =
      run_under_allocators(probe_options({"sdalloc-pool", "sdalloc-planned"}, {}));
  for (const char* mode : {"pool", "planned"}) {
    const AllocatorRuns& r = result_of(report, std::string("sdalloc-") + mode);
    ASSERT_EQ(r.runs.size(), 1u);
    ASSERT_TRUE(r.runs[0].report.has_value());
    EXPECT_EQ(r.runs[0].report->mode, mode);
    EXPECT_EQ(r.runs[0].report->peak_reserved_bytes, 2 * kMiB);
  }
  const std::string table = format_run_table(report);
  EXPECT_TRUE(Contains(table,
                       "sdalloc pool: peak live 1.0 MiB, peak reserved 2.0 MiB (2.00x), "
                       "10 pool / 2 system allocations"));
}

TEST(RunDriver, UnreadableReportIsNotedNotFatal) {
  ::setenv("SDALLOC_FAKE_BROKEN_REPORT", "1", 1);
  const RunReport report = run_under_allocators(probe_options({"sdalloc-vmm"}, {}));
  ::unsetenv("SDALLOC_FAKE_BROKEN_REPORT");
  const AllocatorRuns& r = result_of(report, "sdalloc-vmm");
  EXPECT_FALSE(report.command_failed());
  EXPECT_TRUE(Contains(format_run_table(report), "unreadable"));
  EXPECT_FALSE(r.runs[0].report.has_value());
}

TEST(RunDriver, FailingCommandKeepsItsStatusAndStderrAndTheOtherRows) {
  const RunReport report = run_under_allocators(probe_options(
      {"glibc", "sdalloc-pool"}, {"--fail-under", "sdalloc-pool", "--stderr", "boom: bad"}, 3));
  EXPECT_TRUE(report.command_failed());
  const AllocatorRuns& failed = result_of(report, "sdalloc-pool");
  ASSERT_EQ(failed.runs.size(), 1u);  // no further rounds after a failure
  EXPECT_EQ(failed.runs[0].outcome.exit_status, 7);
  EXPECT_FALSE(failed.medians().has_value());
  EXPECT_EQ(result_of(report, "glibc").runs.size(), 3u);
  const std::string table = format_run_table(report);
  EXPECT_TRUE(Contains(table, "FAILED in round 1: exit status 7: boom: bad"));
  EXPECT_TRUE(Contains(table, "x glibc"));  // the fastest, without tcmalloc
}

TEST(RunDriver, CommandKilledBySignalIsAFailure) {
  const RunReport report = run_under_allocators(probe_options({"glibc"}, {"--abort"}));
  const RunSample* failed = result_of(report, "glibc").failure();
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->outcome.signal, 6);
  EXPECT_TRUE(Contains(format_run_table(report), "killed by signal 6"));
}

TEST(RunDriver, PreloadTheLoaderRefusesIsAFailure) {
  TempDir dir;
  const std::string not_a_library = dir.file("libnot.so");
  test::write_file(not_a_library, "not an ELF file\n");
  RunOptions o = probe_options({"sdalloc-pool", "glibc"}, {});
  o.preload_library = not_a_library;
  const RunReport report = run_under_allocators(o);
  EXPECT_TRUE(Contains(format_run_table(report), "LD_PRELOAD refused"));
  EXPECT_EQ(result_of(report, "glibc").failure(), nullptr);
}

TEST(RunDriver, AllocatorThatCannotRunIsListedAndTheOthersRun) {
  RunOptions o = probe_options({"sdalloc-vmm", "glibc"}, {});
  o.preload_library = "/no/such/libsdalloc_preload.so";
  const RunReport report = run_under_allocators(o);
  EXPECT_FALSE(report.command_failed());
  EXPECT_TRUE(Contains(result_of(report, "sdalloc-vmm").problem, "not found"));
  EXPECT_TRUE(result_of(report, "sdalloc-vmm").runs.empty());
  EXPECT_EQ(result_of(report, "glibc").runs.size(), 1u);
  const nlohmann::json j = run_to_json(report);
  EXPECT_FALSE(j["results"][0]["ran"].get<bool>());
  EXPECT_TRUE(j["results"][0]["median"].is_null());
}

TEST(RunDriver, BadRequestsThrowBeforeAnythingRuns) {
  EXPECT_THROW(run_under_allocators(probe_options({"nosuch"}, {})), Error);
  RunOptions no_program = probe_options({"glibc"}, {});
  no_program.command = {"/no/such/program"};
  EXPECT_THROW(run_under_allocators(no_program), Error);
  no_program.command.clear();
  EXPECT_THROW(run_under_allocators(no_program), Error);
}

// ---------------------------------------------------------------- the program
struct CliRun {
  int status = -1;
  std::string out;
  std::string err;
};

CliRun run_cli(const TempDir& dir, const std::string& args) {
  const std::string out = dir.file("stdout.txt");
  const std::string err = dir.file("stderr.txt");
  const std::string command =
      std::string("'") + SDALLOC_CLI + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int raw = std::system(command.c_str());
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, test::read_file(out), test::read_file(err)};
}

TEST(RunCli, BadUsageExitsTwo) {
  TempDir dir;
  const std::string probe = std::string(" -- '") + SDALLOC_RUN_PROBE + "'";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"run -a glibc", "command"},
      {"run -a nosuch" + probe, "unknown allocator 'nosuch'"},
      {"run -n 0" + probe, "repeat"},
      {"run -a glibc -- /no/such/program", "command not found: /no/such/program"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args);
    const CliRun run = run_cli(dir, args);
    EXPECT_EQ(run.status, 2);
    EXPECT_TRUE(Contains(run.err, message));
    EXPECT_EQ(run.out, "");
  }
}

TEST(RunCli, WritesTheTableAndTheJsonFile) {
  TempDir dir;
  const std::string json = dir.file("run.json");
  const CliRun run = run_cli(dir, std::string("run -q -n 2 -a glibc,sdalloc-pool --json '") + json +
                                      "' --preload-library '" + SDALLOC_FAKE_PRELOAD + "' -- '" +
                                      SDALLOC_RUN_PROBE + "' --mib 8 --stdout 'step 1/1'");
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(Contains(run.out, "allocator"));
  EXPECT_TRUE(Contains(run.out, "peak RSS"));
  EXPECT_TRUE(Contains(run.out, "2 runs, wall"));
  const nlohmann::json j = nlohmann::json::parse(test::read_file(json));
  EXPECT_EQ(j["repeat"], 2);
  EXPECT_EQ(j["command"].back(), "step 1/1");
  EXPECT_FALSE(Contains(run.out, "step 1/1\n"));  // the command's stdout is not ours
  EXPECT_EQ(j["order"].size(), 4u);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const nlohmann::json& r : j["results"]) {
    EXPECT_TRUE(r["ran"].get<bool>());
    EXPECT_FALSE(r["failed"].get<bool>());
    EXPECT_EQ(r["runs"].size(), 2u);
    EXPECT_GE(r["median"]["peak_rss_bytes"].get<std::uint64_t>(), 8 * kMiB);
    for (const char* key :
         {"wall_seconds", "user_seconds", "system_seconds", "minor_faults", "major_faults"}) {
      EXPECT_TRUE(r["median"].contains(key)) << key;
    }
    EXPECT_TRUE(r["relative"].is_number());
    EXPECT_EQ(r["runs"][0]["stdout_tail"], "step 1/1\n");
  }
  EXPECT_TRUE(j["results"][0]["sdalloc_report"].is_null());
  EXPECT_EQ(j["results"][1]["sdalloc_report"]["mode"], "pool");
  EXPECT_TRUE(j["reference"].is_string());
}

TEST(RunCli, CommandFailingUnderAnAllocatorExitsThreeAndPrintsEveryRow) {
  TempDir dir;
  const CliRun run = run_cli(dir, std::string("run -q -a sdalloc-pool,glibc --preload-library '") +
                                      SDALLOC_FAKE_PRELOAD + "' -- '" + SDALLOC_RUN_PROBE +
                                      "' --fail-under sdalloc-pool --stderr oops");
  EXPECT_EQ(run.status, 3);
  EXPECT_TRUE(Contains(run.out, "FAILED in round 1: exit status 7: oops"));
  EXPECT_TRUE(Contains(run.out, "\nglibc "));
}

}  // namespace
}  // namespace sdalloc::run
