// ort_env.hpp - what the ORT tests share: the one OrtEnv of the test process (ORT keeps one
// environment per process; each test unregisters what it registers, through
// OrtEnvAllocator's destructor), the models' folder, host memory and session settings.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "onnxruntime/model_runner.hpp"
#include "sdalloc/onnxruntime/ort_allocator.hpp"
#include "sdalloc/resources/host_resource.hpp"

namespace sdalloc::onnxruntime::test {

inline OrtEnv* test_env() {
  static OrtEnv* env = [] {
    OrtEnv* e = nullptr;
    throw_if_failed(ort_api().CreateEnv(ORT_LOGGING_LEVEL_FATAL, "sdalloc-test", &e), "CreateEnv");
    return e;
  }();
  return env;
}

// Where the ctest fixture (export_models.py) wrote the models; SDALLOC_ORT_MODELS overrides.
inline std::string models_dir() {
  const char* dir = std::getenv("SDALLOC_ORT_MODELS");
  return dir != nullptr ? dir : SDALLOC_ORT_MODELS_DIR;
}

// The host memory the tests' pools share.
inline HostResource& host() {
  static HostResource resource;
  return resource;
}

// A session that takes the env's allocators, without memory patterns: sdalloc sees every
// tensor.
inline SessionSettings sdalloc_settings() {
  SessionSettings s;
  s.env_allocators = true;
  s.mem_pattern = false;
  return s;
}

}  // namespace sdalloc::onnxruntime::test
