// ort_c_api_test.cpp - sdalloc_ort.h: the C check (sdalloc_ort_c_check.c, compiled as C11) on
// a real session, and the C entry points' argument errors.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "onnxruntime/model_runner.hpp"
#include "onnxruntime/ort_env.hpp"
#include "sdalloc/onnxruntime/sdalloc_ort.h"

extern "C" int sdalloc_ort_c_check(OrtEnv* env, OrtSession* (*make_session)(void*), void* context,
                                   const char* const* input_names, const OrtValue* const* inputs,
                                   std::size_t input_count, const char* output_name);

namespace sdalloc::onnxruntime {
namespace {

using test::models_dir;
using test::test_env;

struct Inputs {
  Model model;
  OrtMemoryInfo* info = nullptr;
  std::vector<OrtValue*> values;
  std::vector<const char*> names;
};

OrtSession* make_session(void* context) {
  const auto& in = *static_cast<const Inputs*>(context);
  const OrtApi& api = ort_api();
  OrtSessionOptions* options = nullptr;
  OrtSession* session = nullptr;
  throw_if_failed(api.CreateSessionOptions(&options), "options");
  throw_if_failed(api.DisableMemPattern(options), "patterns");
  throw_if_failed(api.AddSessionConfigEntry(options, "session.use_env_allocators", "1"), "env");
  throw_if_failed(api.CreateSession(test_env(), in.model.onnx_path.c_str(), options, &session),
                  "session");
  api.ReleaseSessionOptions(options);
  return session;
}

TEST(SdallocOrtCApi, CProgramRegistersAPlannedPoolAndRunsASession) {
  Inputs in;
  in.model = read_model(models_dir(), "small_unet");
  const OrtApi& api = ort_api();
  throw_if_failed(api.CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &in.info), "info");
  for (ModelInput& m : in.model.inputs) {
    OrtValue* v = nullptr;
    throw_if_failed(api.CreateTensorWithDataAsOrtValue(
                        in.info, m.data.data(), m.data.size() * sizeof(float), m.shape.data(),
                        m.shape.size(), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &v),
                    "input");
    in.values.push_back(v);
    in.names.push_back(m.name.c_str());
  }
  EXPECT_EQ(sdalloc_ort_c_check(test_env(), &make_session, &in, in.names.data(), in.values.data(),
                                in.values.size(), "output"),
            0)
      << "the C check failed at the line above; " << sdalloc_last_error();
  for (OrtValue* v : in.values) api.ReleaseValue(v);
  api.ReleaseMemoryInfo(in.info);
}

TEST(SdallocOrtCApi, NullArgumentsAreInvalidArguments) {
  EXPECT_EQ(sdalloc_ort_allocator_create(nullptr, nullptr), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sdalloc_ort_allocator_get(nullptr), nullptr);
  EXPECT_EQ(sdalloc_ort_register(nullptr, test_env()), SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sdalloc_ort_unregister(nullptr), SDALLOC_ERROR_INVALID_ARGUMENT);
  OrtStatus* st = nullptr;
  EXPECT_EQ(sdalloc_ort_planned_run(nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0,
                                    nullptr, &st),
            SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sdalloc_last_error()).find("sdalloc_ort_planned_run"), std::string::npos);
}

TEST(SdallocOrtCApi, PlannedRunOfAPoolWithoutStepsIsRefused) {
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  sdalloc_pool_t* pool = nullptr;
  ASSERT_EQ(sdalloc_pool_create(&config, &pool), SDALLOC_SUCCESS);
  sdalloc_ort_allocator_t* allocator = nullptr;
  ASSERT_EQ(sdalloc_ort_allocator_create(pool, &allocator), SDALLOC_SUCCESS);
  OrtStatus* st = nullptr;
  const int dummy = 0;
  EXPECT_EQ(
      sdalloc_ort_planned_run(allocator, reinterpret_cast<OrtSession*>(const_cast<int*>(&dummy)),
                              nullptr, nullptr, nullptr, 0, nullptr, 0, nullptr, &st),
      SDALLOC_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(st, nullptr);
  sdalloc_ort_allocator_destroy(allocator);
  sdalloc_pool_destroy(pool);
}

}  // namespace
}  // namespace sdalloc::onnxruntime
