/* sdalloc/sdalloc_transfer.h - the C API of the transfer engine and weight offload.
 *
 * C11 callers (and the Python package through ctypes) reach the TransferEngine
 * (sdalloc/transfer/transfer_engine.hpp) and the WeightOffloader
 * (sdalloc/transfer/weight_offloader.hpp) here. This library's engines use the host copy
 * backend: "device" memory is host memory (the offloader's device pool is a CachingPool
 * over host memory), copies are memcpy on worker threads, optionally at a set speed.
 *
 *   sdalloc_transfer_engine_t* e; sdalloc_transfer_config_t c;
 *   sdalloc_transfer_config_init(&c);
 *   sdalloc_transfer_engine_create(&c, &e);
 *   sdalloc_transfer_t t;
 *   sdalloc_transfer_copy(e, SDALLOC_COPY_HOST_TO_DEVICE, dst, src, n, &t);
 *   sdalloc_transfer_wait(e, t);          // flushes the queue, waits, releases t
 *
 * Contract: the same as sdalloc.h - every function returns a status, sets the thread's
 * message (sdalloc_last_error) on failure, and lets no C++ exception cross. A request
 * handle lives until sdalloc_transfer_wait (which releases it whatever the outcome) or
 * until its engine is destroyed. Errors: INVALID_ARGUMENT for NULL handles or outputs, a
 * bad config, a budget below the largest weight; INVALID_POINTER for a copy from freed
 * staging memory or an unknown request handle; OUT_OF_MEMORY when staging or device memory
 * runs out; INTERNAL for a failed or cancelled copy (the message says which). Thread-safe
 * per engine; an offload handle is used from one thread. */
#ifndef SDALLOC_SDALLOC_TRANSFER_H_
#define SDALLOC_SDALLOC_TRANSFER_H_

#include "sdalloc/sdalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sdalloc_transfer_engine sdalloc_transfer_engine_t;
typedef struct sdalloc_offload sdalloc_offload_t;
/* One copy request; 0 is never a valid handle. */
typedef uint64_t sdalloc_transfer_t;

typedef enum sdalloc_copy_kind_t {
  SDALLOC_COPY_HOST_TO_DEVICE = 0,
  SDALLOC_COPY_DEVICE_TO_HOST = 1,
  SDALLOC_COPY_DEVICE_TO_DEVICE = 2
} sdalloc_copy_kind_t;

typedef struct sdalloc_transfer_config_t {
  size_t struct_size;           /* sizeof(sdalloc_transfer_config_t), set by _init */
  size_t staging_budget;        /* pinned staging pool's cap (default 256 MiB) */
  size_t batch_bytes;           /* one packed copy call moves up to this (16 MiB) */
  size_t small_bytes;           /* requests up to this are packed (1 MiB) */
  size_t chunk_bytes;           /* pageable large copies go in chunks of this (8 MiB) */
  size_t copy_streams;          /* host backend worker threads (2) */
  double copy_bytes_per_second; /* host backend copy speed, 0 = memcpy speed (0) */
} sdalloc_transfer_config_t;

typedef struct sdalloc_transfer_stats_t {
  size_t struct_size;
  uint64_t requests, bytes, calls, packed_requests, direct_requests, chunked_requests,
      failed_requests, cancelled_requests;
  size_t staging_held_bytes, staging_peak_held_bytes;
} sdalloc_transfer_stats_t;

/* Fills the first struct_size bytes of *config with the defaults (at most this library's
 * sizeof) and sets config->struct_size to what it filled; nothing if config is NULL or
 * struct_size cannot hold struct_size itself. The macro passes sizeof as the caller's header
 * has it, so a program never has more bytes written than its struct holds, whatever library
 * it runs with (as sdalloc_pool_config_init in sdalloc.h); the function itself, for bindings
 * that call the symbol, writes this library's sizeof. */
SDALLOC_API void sdalloc_transfer_config_init_sized(sdalloc_transfer_config_t* config,
                                                    size_t struct_size) SDALLOC_NOEXCEPT;
SDALLOC_API void sdalloc_transfer_config_init(sdalloc_transfer_config_t* config) SDALLOC_NOEXCEPT;
#define sdalloc_transfer_config_init(config) \
  sdalloc_transfer_config_init_sized((config), sizeof(sdalloc_transfer_config_t))
SDALLOC_API sdalloc_status_t sdalloc_transfer_engine_create(
    const sdalloc_transfer_config_t* config, sdalloc_transfer_engine_t** out) SDALLOC_NOEXCEPT;
/* Waits for every request, then frees the engine. NULL is a no-op. */
SDALLOC_API void sdalloc_transfer_engine_destroy(sdalloc_transfer_engine_t* engine)
    SDALLOC_NOEXCEPT;

SDALLOC_API sdalloc_status_t sdalloc_transfer_copy(sdalloc_transfer_engine_t* engine,
                                                   sdalloc_copy_kind_t kind, void* dst,
                                                   const void* src, size_t bytes,
                                                   sdalloc_transfer_t* out) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_transfer_flush(sdalloc_transfer_engine_t* engine)
    SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_transfer_synchronize(sdalloc_transfer_engine_t* engine)
    SDALLOC_NOEXCEPT;
/* Waits for the request and releases its handle; INTERNAL when it failed or was cancelled. */
SDALLOC_API sdalloc_status_t sdalloc_transfer_wait(sdalloc_transfer_engine_t* engine,
                                                   sdalloc_transfer_t request) SDALLOC_NOEXCEPT;
/* *done = 1 once the request ended (done, failed or cancelled), else 0. Never blocks. */
SDALLOC_API sdalloc_status_t sdalloc_transfer_query(sdalloc_transfer_engine_t* engine,
                                                    sdalloc_transfer_t request,
                                                    int* done) SDALLOC_NOEXCEPT;
/* *cancelled = 1 when the request was still queued and is now cancelled, else 0. */
SDALLOC_API sdalloc_status_t sdalloc_transfer_cancel(sdalloc_transfer_engine_t* engine,
                                                     sdalloc_transfer_t request,
                                                     int* cancelled) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_transfer_register_host(sdalloc_transfer_engine_t* engine,
                                                            void* ptr,
                                                            size_t bytes) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_transfer_unregister_host(sdalloc_transfer_engine_t* engine,
                                                              void* ptr) SDALLOC_NOEXCEPT;
/* Pinned host memory from the engine's staging pool (exact size, under the budget). */
SDALLOC_API sdalloc_status_t sdalloc_transfer_staging_alloc(sdalloc_transfer_engine_t* engine,
                                                            size_t bytes,
                                                            void** out) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_transfer_staging_free(sdalloc_transfer_engine_t* engine,
                                                           void* ptr) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_transfer_stats(sdalloc_transfer_engine_t* engine,
                                                    sdalloc_transfer_stats_t* out) SDALLOC_NOEXCEPT;

/* --- weight offload ------------------------------------------------------------------- */

typedef struct sdalloc_offload_config_t {
  size_t struct_size; /* sizeof(sdalloc_offload_config_t), set by _init */
  size_t budget;      /* device bytes for weights; must hold the largest weight (no default) */
  size_t prefetch;    /* uses ahead a load may be issued; 0 = load at the use (2) */
  bool pin;           /* register each weight's host memory with the engine (true) */
} sdalloc_offload_config_t;

typedef struct sdalloc_offload_stats_t {
  size_t struct_size;
  uint64_t loads, loaded_bytes, evictions, waits, recorded_steps, planned_steps, divergent_steps,
      plans;
  size_t resident_bytes, peak_resident_bytes, budget, largest_weight;
} sdalloc_offload_stats_t;

/* As sdalloc_transfer_config_init_sized / sdalloc_transfer_config_init. */
SDALLOC_API void sdalloc_offload_config_init_sized(sdalloc_offload_config_t* config,
                                                   size_t struct_size) SDALLOC_NOEXCEPT;
SDALLOC_API void sdalloc_offload_config_init(sdalloc_offload_config_t* config) SDALLOC_NOEXCEPT;
#define sdalloc_offload_config_init(config) \
  sdalloc_offload_config_init_sized((config), sizeof(sdalloc_offload_config_t))
/* The engine must outlive the offload handle. */
SDALLOC_API sdalloc_status_t sdalloc_offload_create(sdalloc_transfer_engine_t* engine,
                                                    const sdalloc_offload_config_t* config,
                                                    sdalloc_offload_t** out) SDALLOC_NOEXCEPT;
SDALLOC_API void sdalloc_offload_destroy(sdalloc_offload_t* offload) SDALLOC_NOEXCEPT;
/* The host memory must stay valid while the handle lives. *id: the weight's number. */
SDALLOC_API sdalloc_status_t sdalloc_offload_add_weight(sdalloc_offload_t* offload,
                                                        const void* host, size_t bytes,
                                                        size_t* id) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_offload_begin_step(sdalloc_offload_t* offload)
    SDALLOC_NOEXCEPT;
/* The device pointers of one layer's weights; valid until the next acquire or end_step. */
SDALLOC_API sdalloc_status_t sdalloc_offload_acquire(sdalloc_offload_t* offload, const size_t* ids,
                                                     size_t count, void** device) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_offload_end_step(sdalloc_offload_t* offload) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_offload_stats(sdalloc_offload_t* offload,
                                                   sdalloc_offload_stats_t* out) SDALLOC_NOEXCEPT;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SDALLOC_SDALLOC_TRANSFER_H_ */
