// onnx_node_runner.cpp - sdalloc_peers_onnx: ONNX's backend node tests (Debian's
// libonnx-testdata) run through ONNX Runtime under one memory configuration, for
// tests/peers/run_peers.py, which runs every configuration and compares their outputs.
//
//   sdalloc_peers_onnx --mode ort|pool|vmm|planned --cases FILE --out DIR [--runs N]
//
// Modes:
//   ort      ORT's defaults: its CPU arena and memory patterns (the reference)
//   pool     sdalloc's segment cache (mode:pool, made by make_pool) as the env allocator
//            (OrtPoolAllocator, registered on the OrtEnv; sessions made with
//            session.use_env_allocators = 1, no memory patterns), one pool for every case of
//            the process, so cases reuse each other's memory
//   vmm      the same with mode:vmm, a VirtualMemoryPool
//   planned  a PlannedArena (planned_session_conf()) made for each case, every Run() one
//            step (PlannedSession): run 1 is recorded, the later runs use the plan
// Every session runs on one thread (intra- and inter-op), sequentially, so that two
// configurations compute in the same order and their outputs can be compared bit for bit.
//
// FILE (written by run_peers.py) lists the cases, one field per tab-separated line:
//   case NAME MODEL_PATH   then   in INPUT_NAME VALUE_FILE ...   out OUTPUT_NAME ...
// Each case is run N times (default: 1 for ort, 2 for pool and vmm, 3 for planned); the
// outputs of run 1 are written to DIR/NAME/out_<i>.val (onnx_value_file.hpp) and every later
// run's must be byte-equal to them. One JSON line per case on stdout:
//   {"case", "status", "message", "seconds", "allocs"}
// status: ok; session_error or run_error (ORT's message: run_peers.py keeps only the cases
// ORT passes with its defaults); runs_differ; leak (the session gave back fewer allocations
// than it took from sdalloc's pool); driver_error (a file, an output kind). The process exits
// 0 once every case has its line; 2 for bad arguments; a case that crashes the process has
// no line (run_peers.py restarts after it).
#include <onnxruntime_c_api.h>
#include <onnxruntime_session_options_config_keys.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "onnx_value_file.hpp"
#include "sdalloc/config/make_pool.hpp"
#include "sdalloc/onnxruntime/ort_allocator.hpp"
#include "sdalloc/onnxruntime/planned_run.hpp"
#include "sdalloc/resources/host_backend.hpp"

namespace so = sdalloc::onnxruntime;
namespace sp = sdalloc::peers;

namespace {

struct Case {
  std::string name, model;
  std::vector<std::string> input_names, input_files, output_names;
};

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  std::string field;
  while (std::getline(in, field, '\t')) fields.push_back(field);
  return fields;
}

std::vector<Case> read_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<Case> cases;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const std::vector<std::string> f = split_tabs(line);
    const auto bad = [&] {
      return std::runtime_error(path + ":" + std::to_string(number) + ": bad line '" + line + "'");
    };
    if (f[0] == "case" && f.size() == 3) {
      cases.push_back({f[1], f[2], {}, {}, {}});
    } else if (f[0] == "in" && f.size() == 3 && !cases.empty()) {
      cases.back().input_names.push_back(f[1]);
      cases.back().input_files.push_back(f[2]);
    } else if (f[0] == "out" && f.size() == 2 && !cases.empty()) {
      cases.back().output_names.push_back(f[1]);
    } else {
      throw bad();
    }
  }
  return cases;
}

// The memory configuration of the process: nothing for ort; one sdalloc pool, its
// OrtAllocator and their registration on the env otherwise.
class Configuration {
 public:
  Configuration(std::string mode, OrtEnv* env) : mode_(std::move(mode)), env_(env) {
    if (mode_ != "ort" && mode_ != "pool" && mode_ != "vmm" && mode_ != "planned") {
      throw std::invalid_argument("unknown mode " + mode_);
    }
    if (mode_ == "pool" || mode_ == "vmm") {
      sdalloc::PoolConf conf;
      conf.mode = mode_ == "pool" ? sdalloc::PoolMode::kPool : sdalloc::PoolMode::kVmm;
      attach(sdalloc::share_pool(sdalloc::make_pool(conf, sdalloc::host_backend())));
    }
  }
  ~Configuration() { detach(); }

  const std::string& mode() const { return mode_; }
  bool sdalloc() const { return mode_ != "ort"; }
  // planned: a fresh PlannedArena for the next case, so each case plans its own step.
  void begin_case() {
    if (mode_ != "planned") return;
    detach();
    attach(sdalloc::share_pool(
        sdalloc::make_pool(so::planned_session_conf(), sdalloc::host_backend())));
  }
  so::OrtPoolAllocator* allocator() { return allocator_.get(); }
  // Allocations ORT holds from the pool now (0 for ort).
  std::size_t outstanding() const { return allocator_ ? allocator_->counters().outstanding : 0; }
  std::uint64_t allocs() const {
    return allocator_ ? allocator_->counters().allocs + allocator_->counters().reserves : 0;
  }

 private:
  void attach(std::shared_ptr<sdalloc::AnyPool> pool) {
    allocator_ = std::make_unique<so::OrtPoolAllocator>(std::move(pool));
    registered_ = std::make_unique<so::OrtEnvAllocator>(env_, *allocator_);
  }
  void detach() {
    registered_.reset();
    if (allocator_ && allocator_->counters().outstanding != 0) {
      // The adapter aborts when destroyed with memory out (its documented rule); the case
      // that leaked is already reported, so keep the allocator and say so.
      std::fprintf(stderr, "sdalloc_peers_onnx: %zu allocations still out at the end\n",
                   allocator_->counters().outstanding);
      (void)allocator_.release();
    }
    allocator_.reset();
  }

  std::string mode_;
  OrtEnv* env_;
  std::unique_ptr<so::OrtPoolAllocator> allocator_;
  std::unique_ptr<so::OrtEnvAllocator> registered_;
};

struct Outcome {
  std::string status = "ok";
  std::string message;
};

// Owns what one case creates through ORT's C API.
struct CaseValues {
  const OrtApi& api = so::ort_api();
  OrtSession* session = nullptr;
  std::vector<OrtValue*> inputs;
  std::vector<OrtValue*> outputs;
  void release_outputs() {
    for (OrtValue*& v : outputs) {
      api.ReleaseValue(v);
      v = nullptr;
    }
  }
  ~CaseValues() {
    release_outputs();
    for (OrtValue* v : inputs) api.ReleaseValue(v);
    api.ReleaseSession(session);
  }
};

OrtSession* make_session(OrtEnv* env, const Case& c, bool env_allocators) {
  const OrtApi& api = so::ort_api();
  OrtSessionOptions* options = nullptr;
  so::throw_if_failed(api.CreateSessionOptions(&options), "CreateSessionOptions");
  OrtSession* session = nullptr;
  OrtStatus* status = api.SetIntraOpNumThreads(options, 1);
  if (status == nullptr) status = api.SetInterOpNumThreads(options, 1);
  if (status == nullptr) status = api.SetSessionExecutionMode(options, ORT_SEQUENTIAL);
  if (status == nullptr && env_allocators) status = api.DisableMemPattern(options);
  if (status == nullptr && env_allocators) {
    status = api.AddSessionConfigEntry(options, kOrtSessionOptionsConfigUseEnvAllocators, "1");
  }
  if (status == nullptr) status = api.CreateSession(env, c.model.c_str(), options, &session);
  api.ReleaseSessionOptions(options);
  so::throw_if_failed(status, "CreateSession");
  return session;
}

// The outputs of one Run(), encoded as their files will hold them.
std::vector<std::string> encode_outputs(const CaseValues& values, OrtAllocator* reader) {
  std::vector<std::string> encoded;
  for (const OrtValue* v : values.outputs) {
    encoded.push_back(sp::encode_value(sp::from_ort_value(v, reader)));
  }
  return encoded;
}

Outcome run_case(OrtEnv* env, Configuration& config, const Case& c, int runs,
                 const std::filesystem::path& out_dir) {
  const OrtApi& api = so::ort_api();
  OrtAllocator* cpu = nullptr;
  so::throw_if_failed(api.GetAllocatorWithDefaultOptions(&cpu), "default allocator");
  const std::size_t outstanding_before = config.outstanding();
  Outcome outcome;
  {
    CaseValues values;
    try {
      values.session = make_session(env, c, config.sdalloc());
    } catch (const std::exception& e) {
      return {"session_error", e.what()};
    }
    std::vector<const char*> input_names;
    for (std::size_t i = 0; i < c.input_files.size(); ++i) {
      values.inputs.push_back(sp::to_ort_value(sp::read_value_file(c.input_files[i]), cpu));
      input_names.push_back(c.input_names[i].c_str());
    }
    std::vector<const char*> output_names;
    for (const std::string& n : c.output_names) output_names.push_back(n.c_str());
    values.outputs.assign(output_names.size(), nullptr);
    std::unique_ptr<so::PlannedSession> planned;
    if (config.mode() == "planned") {
      planned = std::make_unique<so::PlannedSession>(values.session, *config.allocator());
    }
    std::vector<std::string> first;
    for (int run = 0; run < runs; ++run) {
      OrtStatus* status =
          planned ? planned->run(nullptr, input_names.data(), values.inputs.data(),
                                 values.inputs.size(), output_names.data(), output_names.size(),
                                 values.outputs.data())
                  : api.Run(values.session, nullptr, input_names.data(), values.inputs.data(),
                            values.inputs.size(), output_names.data(), output_names.size(),
                            values.outputs.data());
      if (status != nullptr) {
        outcome = {"run_error",
                   "run " + std::to_string(run + 1) + ": " + api.GetErrorMessage(status)};
        api.ReleaseStatus(status);
        break;
      }
      std::vector<std::string> encoded = encode_outputs(values, cpu);
      values.release_outputs();
      if (run == 0) {
        first = std::move(encoded);
        continue;
      }
      for (std::size_t i = 0; i < first.size(); ++i) {
        if (encoded[i] != first[i]) {
          outcome = {"runs_differ", "output " + c.output_names[i] + " of run " +
                                        std::to_string(run + 1) + " differs from run 1's"};
        }
      }
      if (outcome.status != "ok") break;
    }
    if (!first.empty()) {
      const std::filesystem::path dir = out_dir / c.name;
      std::filesystem::create_directories(dir);
      for (std::size_t i = 0; i < first.size(); ++i) {
        std::ofstream file(dir / ("out_" + std::to_string(i) + ".val"),
                           std::ios::binary | std::ios::trunc);
        file.write(first[i].data(), static_cast<std::streamsize>(first[i].size()));
        if (!file) throw std::runtime_error("cannot write the outputs of " + c.name);
      }
    }
  }
  if (config.sdalloc()) {
    config.allocator()->pool().check_invariants();
    if (config.outstanding() != outstanding_before && outcome.status == "ok") {
      outcome = {"leak", std::to_string(config.outstanding() - outstanding_before) +
                             " allocations still out after the session was released"};
    }
  }
  return outcome;
}

int run(int argc, char** argv) {
  std::string mode, cases_path, out;
  int runs = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") {
      mode = v;
    } else if (k == "--cases") {
      cases_path = v;
    } else if (k == "--out") {
      out = v;
    } else if (k == "--runs") {
      runs = std::stoi(v);
    } else {
      throw std::invalid_argument("unknown option " + k);
    }
  }
  if (mode.empty() || cases_path.empty() || out.empty() || runs < 0 || argc % 2 == 0) {
    throw std::invalid_argument(
        "usage: sdalloc_peers_onnx --mode ort|pool|vmm|planned --cases FILE --out DIR [--runs N]");
  }
  if (runs == 0) runs = mode == "planned" ? 3 : mode == "ort" ? 1 : 2;
  const std::vector<Case> cases = read_cases(cases_path);

  const OrtApi& api = so::ort_api();
  OrtEnv* env = nullptr;
  so::throw_if_failed(api.CreateEnv(ORT_LOGGING_LEVEL_FATAL, "sdalloc-peers", &env), "CreateEnv");
  {
    Configuration config(mode, env);
    for (const Case& c : cases) {
      config.begin_case();
      const std::uint64_t allocs_before = config.allocs();
      const auto t0 = std::chrono::steady_clock::now();
      Outcome outcome;
      try {
        outcome = run_case(env, config, c, runs, out);
      } catch (const std::exception& e) {
        outcome = {"driver_error", e.what()};
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const nlohmann::json line = {{"case", c.name},
                                   {"status", outcome.status},
                                   {"message", outcome.message},
                                   {"seconds", seconds},
                                   {"allocs", config.allocs() - allocs_before}};
      std::printf("%s\n",
                  line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      std::fflush(stdout);
    }
  }
  api.ReleaseEnv(env);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "sdalloc_peers_onnx: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdalloc_peers_onnx: %s\n", e.what());
    return 1;
  }
}
