/* sdalloc_ort_c_check.c - sdalloc_ort.h from C11: a planned C API pool as the env allocator,
 * registered, registered again (refused), a planned Run(), unregistered, destroyed. Called
 * by ort_c_api_test.cpp, which gives it the env and a session made for it; returns 0 or the
 * line that failed. */
#include <stddef.h>

#include "sdalloc/onnxruntime/sdalloc_ort.h"

typedef OrtSession* (*make_session_fn)(void* context);

int sdalloc_ort_c_check(OrtEnv* env, make_session_fn make_session, void* context,
                        const char* const* input_names, const OrtValue* const* inputs,
                        size_t input_count, const char* output_name) {
  sdalloc_pool_config_t config;
  sdalloc_pool_config_init(&config);
  config.planned = true;
  sdalloc_pool_t* pool = NULL;
  if (sdalloc_pool_create(&config, &pool) != SDALLOC_SUCCESS) return __LINE__;
  sdalloc_ort_allocator_t* allocator = NULL;
  if (sdalloc_ort_allocator_create(pool, &allocator) != SDALLOC_SUCCESS) return __LINE__;
  if (sdalloc_ort_allocator_get(allocator) == NULL) return __LINE__;
  sdalloc_ort_allocator_t* refused = allocator;
  if (sdalloc_ort_allocator_create(NULL, &refused) != SDALLOC_ERROR_INVALID_ARGUMENT) {
    return __LINE__;
  }
  if (refused != NULL) return __LINE__; /* *out is NULL on failure */
  if (sdalloc_ort_register(allocator, env) != SDALLOC_SUCCESS) return __LINE__;
  if (sdalloc_ort_register(allocator, env) != SDALLOC_ERROR_INVALID_ARGUMENT) return __LINE__;
  OrtSession* session = make_session(context);
  if (session == NULL) return __LINE__;
  const OrtApi* api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  for (int i = 0; i < 3; ++i) {
    OrtValue* output = NULL;
    OrtStatus* ort_status = NULL;
    if (sdalloc_ort_planned_run(allocator, session, NULL, input_names, inputs, input_count,
                                &output_name, 1, &output, &ort_status) != SDALLOC_SUCCESS) {
      return __LINE__;
    }
    if (ort_status != NULL || output == NULL) return __LINE__;
    api->ReleaseValue(output);
  }
  sdalloc_step_stats_t stats;
  stats.struct_size = sizeof stats;
  if (sdalloc_pool_step_stats(pool, &stats) != SDALLOC_SUCCESS) return __LINE__;
  if (stats.planned_allocations == 0) return __LINE__;
  api->ReleaseSession(session);
  if (sdalloc_ort_unregister(allocator) != SDALLOC_SUCCESS) return __LINE__;
  if (sdalloc_ort_unregister(allocator) != SDALLOC_ERROR_INVALID_ARGUMENT) return __LINE__;
  sdalloc_ort_allocator_destroy(allocator);
  sdalloc_ort_allocator_destroy(NULL);
  sdalloc_pool_destroy(pool);
  return 0;
}
