/* sdalloc/onnxruntime/sdalloc_ort.h - the OrtAllocator adapter for C callers: an sdalloc_pool_t
 * (sdalloc.h) as ONNX Runtime's OrtAllocator, registered on an OrtEnv, and a planned Run().
 *
 * The C face of sdalloc/onnxruntime/ort_allocator.hpp and planned_run.hpp; the same rules:
 *  - Errors: sdalloc_status_t with sdalloc_last_error() as in sdalloc.h; no exception leaves
 *    these functions. The OrtAllocator's own entries answer ORT as the C++ adapter does
 *    (a failed Alloc raises std::bad_alloc into ORT, which reports its own error).
 *  - Lifetime: the pool outlives the adapter; destroy sessions and their OrtValues first,
 *    then the adapter (it unregisters), then the pool. Destroying the adapter while ORT still
 *    holds memory from it aborts the process with a message.
 *  - Registering: one registration per adapter (a second one, or another adapter for the same
 *    memory info on the same env, is SDALLOC_ERROR_INVALID_ARGUMENT).
 * Needs onnxruntime_c_api.h (ORT 1.29); built when CMake finds ORT (libsdalloc_onnxruntime). */
#ifndef SDALLOC_ONNXRUNTIME_SDALLOC_ORT_H_
#define SDALLOC_ONNXRUNTIME_SDALLOC_ORT_H_

#include <onnxruntime_c_api.h>

#include "sdalloc/sdalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sdalloc_ort_allocator sdalloc_ort_allocator_t;

/* An OrtAllocator (memory info "Cpu", OrtDeviceAllocator, device 0) over `pool`. */
SDALLOC_API sdalloc_status_t
sdalloc_ort_allocator_create(sdalloc_pool_t* pool, sdalloc_ort_allocator_t** out) SDALLOC_NOEXCEPT;
/* The OrtAllocator to hand ORT; NULL for a NULL adapter. */
SDALLOC_API OrtAllocator* sdalloc_ort_allocator_get(sdalloc_ort_allocator_t* allocator)
    SDALLOC_NOEXCEPT;
/* RegisterAllocator on `env` until sdalloc_ort_unregister or destroy. */
SDALLOC_API sdalloc_status_t sdalloc_ort_register(sdalloc_ort_allocator_t* allocator,
                                                  OrtEnv* env) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_ort_unregister(sdalloc_ort_allocator_t* allocator)
    SDALLOC_NOEXCEPT;
/* OrtApi::Run as one step of the pool's PlannedArena (the pool must be planned:
 * sdalloc_pool_config_t.planned); ORT's status of the run in *ort_status (NULL on success). */
SDALLOC_API sdalloc_status_t sdalloc_ort_planned_run(
    sdalloc_ort_allocator_t* allocator, OrtSession* session, const OrtRunOptions* run_options,
    const char* const* input_names, const OrtValue* const* inputs, size_t input_count,
    const char* const* output_names, size_t output_count, OrtValue** outputs,
    OrtStatus** ort_status) SDALLOC_NOEXCEPT;
/* Unregisters and frees the adapter (NULL is ignored). */
SDALLOC_API void sdalloc_ort_allocator_destroy(sdalloc_ort_allocator_t* allocator) SDALLOC_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif /* SDALLOC_ONNXRUNTIME_SDALLOC_ORT_H_ */
