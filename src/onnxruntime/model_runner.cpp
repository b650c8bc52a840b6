// model_runner.cpp - ModelRunner (model_runner.hpp): read the exported model's inputs, make
// the session, run it, copy out the first output.
#include "onnxruntime/model_runner.hpp"

#include <onnxruntime_session_options_config_keys.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "sdalloc/core/errors.hpp"

namespace sdalloc::onnxruntime {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path + " (export it: tests/onnxruntime/export_models.py)");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

Model read_model(const std::string& dir, const std::string& name) {
  Model model;
  model.onnx_path = dir + "/" + name + ".onnx";
  const auto meta = nlohmann::json::parse(read_file(dir + "/" + name + ".json"));
  for (const auto& in : meta.at("inputs")) {
    ModelInput input;
    input.name = in.at("name").get<std::string>();
    input.shape = in.at("shape").get<std::vector<std::int64_t>>();
    std::size_t count = 1;
    for (const std::int64_t d : input.shape) count *= static_cast<std::size_t>(d);
    std::string path = dir;
    path.append("/").append(name).append(".").append(input.name).append(".bin");
    const std::string bytes = read_file(path);
    if (bytes.size() != count * sizeof(float)) {
      path.append(": ").append(std::to_string(bytes.size())).append(" bytes, the shape needs ");
      throw Error(path.append(std::to_string(count * sizeof(float))));
    }
    input.data.resize(count);
    std::memcpy(input.data.data(), bytes.data(), bytes.size());
    model.inputs.push_back(std::move(input));
  }
  return model;
}

ModelRunner::ModelRunner(OrtEnv* env, const Model& model, const SessionSettings& settings)
    : inputs_(model.inputs) {
  const OrtApi& api = ort_api();
  OrtSessionOptions* options = nullptr;
  throw_if_failed(api.CreateSessionOptions(&options), "CreateSessionOptions");
  try {
    throw_if_failed(api.SetIntraOpNumThreads(options, settings.intra_op_threads), "threads");
    throw_if_failed(api.SetInterOpNumThreads(options, 1), "threads");
    throw_if_failed(api.SetSessionExecutionMode(options, ORT_SEQUENTIAL), "sequential");
    if (!settings.cpu_arena) throw_if_failed(api.DisableCpuMemArena(options), "arena off");
    if (!settings.mem_pattern) throw_if_failed(api.DisableMemPattern(options), "patterns off");
    if (settings.env_allocators) {
      throw_if_failed(
          api.AddSessionConfigEntry(options, kOrtSessionOptionsConfigUseEnvAllocators, "1"),
          "use_env_allocators");
    }
    throw_if_failed(api.CreateSession(env, model.onnx_path.c_str(), options, &session_),
                    "CreateSession");
  } catch (...) {
    api.ReleaseSessionOptions(options);
    throw;
  }
  api.ReleaseSessionOptions(options);

  throw_if_failed(api.CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &input_info_),
                  "CreateCpuMemoryInfo");
  // The inputs live in this object's vectors (ORT does not own or allocate them).
  for (ModelInput& in : inputs_) {
    OrtValue* value = nullptr;
    throw_if_failed(api.CreateTensorWithDataAsOrtValue(input_info_, in.data.data(),
                                                       in.data.size() * sizeof(float),
                                                       in.shape.data(), in.shape.size(),
                                                       ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value),
                    "CreateTensorWithDataAsOrtValue");
    values_.push_back(value);
  }
  OrtAllocator* names = nullptr;
  throw_if_failed(api.GetAllocatorWithDefaultOptions(&names), "default allocator");
  char* output_name = nullptr;
  throw_if_failed(api.SessionGetOutputName(session_, 0, names, &output_name), "output name");
  output_name_ = output_name;
  throw_if_failed(api.AllocatorFree(names, output_name), "free name");
}

ModelRunner::~ModelRunner() {
  const OrtApi& api = ort_api();
  release_outputs();
  for (OrtValue* v : values_) api.ReleaseValue(v);
  api.ReleaseMemoryInfo(input_info_);
  api.ReleaseSession(session_);
}

void ModelRunner::release_outputs() {
  for (OrtValue* v : kept_) ort_api().ReleaseValue(v);
  kept_.clear();
}

RunResult ModelRunner::run(PlannedSession* planned, bool keep_output) {
  const OrtApi& api = ort_api();
  std::vector<const char*> names;
  names.reserve(inputs_.size());
  for (const ModelInput& in : inputs_) names.push_back(in.name.c_str());
  const char* output_name = output_name_.c_str();
  OrtValue* output = nullptr;
  OrtStatus* status = planned != nullptr ? planned->run(nullptr, names.data(), values_.data(),
                                                        values_.size(), &output_name, 1, &output)
                                         : api.Run(session_, nullptr, names.data(), values_.data(),
                                                   values_.size(), &output_name, 1, &output);
  RunResult result;
  if (status != nullptr) {
    result.error = api.GetErrorMessage(status);
    api.ReleaseStatus(status);
    return result;
  }
  OrtTensorTypeAndShapeInfo* info = nullptr;
  std::size_t count = 0;
  void* data = nullptr;
  throw_if_failed(api.GetTensorTypeAndShape(output, &info), "output shape");
  OrtStatus* count_status = api.GetTensorShapeElementCount(info, &count);
  api.ReleaseTensorTypeAndShapeInfo(info);
  throw_if_failed(count_status, "output size");
  throw_if_failed(api.GetTensorMutableData(output, &data), "output data");
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  result.output.assign(bytes, bytes + count * sizeof(float));
  if (keep_output) {
    kept_.push_back(output);
  } else {
    api.ReleaseValue(output);
  }
  return result;
}

}  // namespace sdalloc::onnxruntime
