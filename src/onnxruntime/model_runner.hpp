// model_runner.hpp - one ONNX model run through ORT's C API with fixed inputs, for the
// adapter's tests and benchmark (internal).
//
// A model is MODEL.onnx with MODEL.json (its inputs' names, shapes, float32) and one raw
// file MODEL.NAME.bin per input, as tests/onnxruntime/export_models.py writes them. A
// ModelRunner owns one session made with the given SessionSettings and the input OrtValues;
// run() returns the first output's bytes, so two configurations compare bit for bit.
// Errors: Error naming the file or ORT's message; a failed Run() is returned as ORT's
// message in RunResult (the session stays usable).
#pragma once

#include <onnxruntime_c_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sdalloc/onnxruntime/planned_run.hpp"

namespace sdalloc::onnxruntime {

struct ModelInput {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

struct Model {
  std::string onnx_path;
  std::vector<ModelInput> inputs;
};

// Reads DIR/NAME.json and the inputs' .bin files.
Model read_model(const std::string& dir, const std::string& name);

struct SessionSettings {
  bool cpu_arena = true;        // ORT's CPU BFC arena (DisableCpuMemArena when false)
  bool mem_pattern = true;      // ORT's memory patterns (DisableMemPattern when false)
  bool env_allocators = false;  // session.use_env_allocators = 1
  int intra_op_threads = 1;
};

struct RunResult {
  std::vector<std::uint8_t> output;  // the first output's bytes (empty on failure)
  std::string error;                 // ORT's message when Run() failed
};

class ModelRunner {
 public:
  ModelRunner(OrtEnv* env, const Model& model, const SessionSettings& settings);
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;
  ~ModelRunner();

  // One Run(), through planned->run() when planned is given. keep_output: the output
  // OrtValue is kept (released by release_outputs() or the destructor) instead of at once.
  RunResult run(PlannedSession* planned = nullptr, bool keep_output = false);
  void release_outputs();
  OrtSession* session() { return session_; }

 private:
  OrtSession* session_ = nullptr;
  OrtMemoryInfo* input_info_ = nullptr;
  std::vector<ModelInput> inputs_;
  std::vector<OrtValue*> values_;
  std::vector<OrtValue*> kept_;
  std::string output_name_;
};

}  // namespace sdalloc::onnxruntime
