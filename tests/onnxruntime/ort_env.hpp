// ort_env.hpp - the one OrtEnv of the test process and the models' folder (ORT keeps one
// environment per process, so every test shares it; each test unregisters what it
// registers, through OrtEnvAllocator's destructor).
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "sdalloc/onnxruntime/ort_allocator.hpp"

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

}  // namespace sdalloc::onnxruntime::test
