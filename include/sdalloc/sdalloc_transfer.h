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

/* --- unit offload: packed units, a device region, streams and events only -------------
 * The UnitOffloader (sdalloc/transfer/unit_offloader.hpp, docs/transfer.md): a model's
 * weights cut into units, packed once in a host arena (the one copy in RAM, page-locked in
 * place in the background), one device region of at most the budget; the first step is
 * recorded, then planned (resident units, a ring of fixed slots, each copy after the slot's
 * release), and every later step is events only: one call per unit, no host wait, no
 * allocation.
 *
 *   sdalloc_sim_device_create(&device_config, &device);          // or the shim's CUDA one
 *   sdalloc_unit_offload_create(device, &config, &offload);
 *   sdalloc_unit_offload_add_unit(offload, bytes, 0, &id);       // per unit, then
 *   sdalloc_unit_offload_seal(offload);                          // arena and region exist
 *   sdalloc_unit_offload_host_image(offload, id, &host);         // write each unit there
 *   sdalloc_unit_offload_device_image(offload, id, &dev);        // point its tensors here,
 *                                                                // again when layout changes
 *   sdalloc_unit_offload_begin_step(offload, stream);            // per forward
 *   sdalloc_unit_offload_enter(offload, id);                     // before a unit's kernels
 *   sdalloc_unit_offload_end_step(offload);
 *
 * The device must outlive the offloads made on it. Errors: INVALID_ARGUMENT for NULL
 * handles or outputs, configs not from their _init, a unit over the budget ("the budget
 * must hold the largest unit"), calls out of order, an unknown unit, a forward on another
 * stream than the device's compute stream (both named); OUT_OF_MEMORY when the arena or the
 * region cannot be mapped; INTERNAL when the operating system refuses to page-lock even the
 * staging (the message says why, e.g. RLIMIT_MEMLOCK). */

typedef struct sdalloc_stream_device sdalloc_stream_device_t;
typedef struct sdalloc_unit_offload sdalloc_unit_offload_t;

/* The simulated device (sdalloc/transfer/simulated_device.hpp): a compute queue of
 * simulated kernels, one copy engine, costs per call, simulated clocks. */
typedef struct sdalloc_sim_device_config_t {
  size_t struct_size;           /* sizeof(sdalloc_sim_device_config_t), set by _init */
  double copy_bytes_per_second; /* the copy engine; 0 = memcpy speed (0) */
  double seconds_per_copy;      /* the engine's cost per copy call (0) */
  double seconds_per_call;      /* the host's cost per record, wait, copy call (0) */
  bool host_compute;            /* the calling thread is the compute queue (true) */
} sdalloc_sim_device_config_t;

typedef struct sdalloc_sim_device_stats_t {
  size_t struct_size;
  uint64_t kernels, copy_calls, copied_bytes, pageable_copies, calls, host_waits,
      device_allocations, check_failures;
  size_t device_bytes, locked_bytes;
} sdalloc_sim_device_stats_t;

typedef struct sdalloc_unit_offload_config_t {
  size_t struct_size;          /* sizeof(sdalloc_unit_offload_config_t), set by _init */
  size_t budget;               /* device bytes: resident units and the ring (no default) */
  bool pin;                    /* page-lock the arena (true) */
  size_t register_chunk_bytes; /* the arena is locked in chunks of about this (64 MiB) */
  size_t staging_chunk_bytes;  /* the fallback's staging chunks (8 MiB) */
} sdalloc_unit_offload_config_t;

typedef struct sdalloc_unit_offload_stats_t {
  size_t struct_size;
  uint64_t steps, recorded_steps, planned_steps, divergent_steps, plans, copies, copied_bytes,
      staged_copies, host_waits, device_allocations, layout_version;
  size_t units, streamed_units, model_bytes, resident_bytes, ring_bytes, region_bytes,
      streamed_bytes, registered_bytes, arena_bytes_in_ram;
  int registration_refused, planned;
  double compute_seconds, predicted_step_seconds, floor_seconds, ideal_floor_seconds,
      copy_bytes_per_second, seconds_per_copy;
} sdalloc_unit_offload_stats_t;

/* As sdalloc_transfer_config_init_sized / sdalloc_transfer_config_init. */
SDALLOC_API void sdalloc_sim_device_config_init_sized(sdalloc_sim_device_config_t* config,
                                                      size_t struct_size) SDALLOC_NOEXCEPT;
SDALLOC_API void sdalloc_sim_device_config_init(sdalloc_sim_device_config_t* config)
    SDALLOC_NOEXCEPT;
#define sdalloc_sim_device_config_init(config) \
  sdalloc_sim_device_config_init_sized((config), sizeof(sdalloc_sim_device_config_t))
SDALLOC_API sdalloc_status_t sdalloc_sim_device_create(
    const sdalloc_sim_device_config_t* config, sdalloc_stream_device_t** out) SDALLOC_NOEXCEPT;
/* Waits for the device's queues, then frees it. NULL is a no-op. */
SDALLOC_API void sdalloc_stream_device_destroy(sdalloc_stream_device_t* device) SDALLOC_NOEXCEPT;
/* The token of the device's compute stream (begin_step's `stream` must be it). */
SDALLOC_API sdalloc_status_t sdalloc_stream_device_compute_stream(
    sdalloc_stream_device_t* device, sdalloc_stream_t* stream) SDALLOC_NOEXCEPT;
/* The host waits for everything queued on the compute stream. */
SDALLOC_API sdalloc_status_t sdalloc_stream_device_synchronize(sdalloc_stream_device_t* device)
    SDALLOC_NOEXCEPT;
/* A simulated kernel: costs the host host_seconds, runs device_seconds on the compute
 * queue, and when it runs compares `bytes` at `reads` with `expected` (sampled words;
 * a difference counts in check_failures). reads/expected may be NULL (no check).
 * INVALID_ARGUMENT on a device that is not simulated. */
SDALLOC_API sdalloc_status_t sdalloc_sim_launch(sdalloc_stream_device_t* device,
                                                double host_seconds, double device_seconds,
                                                const void* reads, const void* expected,
                                                size_t bytes) SDALLOC_NOEXCEPT;
/* The calling thread's clock on the simulated device, in seconds. */
SDALLOC_API sdalloc_status_t sdalloc_sim_host_seconds(sdalloc_stream_device_t* device,
                                                      double* seconds) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_sim_device_stats(
    sdalloc_stream_device_t* device, sdalloc_sim_device_stats_t* out) SDALLOC_NOEXCEPT;

SDALLOC_API void sdalloc_unit_offload_config_init_sized(sdalloc_unit_offload_config_t* config,
                                                        size_t struct_size) SDALLOC_NOEXCEPT;
SDALLOC_API void sdalloc_unit_offload_config_init(sdalloc_unit_offload_config_t* config)
    SDALLOC_NOEXCEPT;
#define sdalloc_unit_offload_config_init(config) \
  sdalloc_unit_offload_config_init_sized((config), sizeof(sdalloc_unit_offload_config_t))
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_create(
    sdalloc_stream_device_t* device, const sdalloc_unit_offload_config_t* config,
    sdalloc_unit_offload_t** out) SDALLOC_NOEXCEPT;
/* Waits for the device, frees the region and the arena. NULL is a no-op. */
SDALLOC_API void sdalloc_unit_offload_destroy(sdalloc_unit_offload_t* offload) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_add_unit(sdalloc_unit_offload_t* offload,
                                                           size_t bytes, int keep_resident,
                                                           size_t* id) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_seal(sdalloc_unit_offload_t* offload)
    SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_host_image(sdalloc_unit_offload_t* offload,
                                                             size_t unit,
                                                             void** host) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_device_image(sdalloc_unit_offload_t* offload,
                                                               size_t unit,
                                                               void** device) SDALLOC_NOEXCEPT;
/* *version changes whenever device images move; *planned: 1 once a plan is followed (then
 * only streamed units need their enter call), 0 while a step is to be recorded. */
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_layout(sdalloc_unit_offload_t* offload,
                                                         uint64_t* version,
                                                         int* planned) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_streamed(sdalloc_unit_offload_t* offload,
                                                           size_t unit,
                                                           int* streamed) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_begin_step(
    sdalloc_unit_offload_t* offload, sdalloc_stream_t stream) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_enter(sdalloc_unit_offload_t* offload,
                                                        size_t unit) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_end_step(sdalloc_unit_offload_t* offload)
    SDALLOC_NOEXCEPT;
/* The next step is recorded and planned again (another input shape); outside a step. */
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_record_next(sdalloc_unit_offload_t* offload)
    SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_stats(
    sdalloc_unit_offload_t* offload, sdalloc_unit_offload_stats_t* out) SDALLOC_NOEXCEPT;
/* The plan's description (predicted step time, floor), and the registration's refusal if
 * any, NUL-terminated, cut to `size` bytes; *needed (may be NULL) gets the full length + 1. */
SDALLOC_API sdalloc_status_t sdalloc_unit_offload_describe(sdalloc_unit_offload_t* offload,
                                                           char* text, size_t size,
                                                           size_t* needed) SDALLOC_NOEXCEPT;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SDALLOC_SDALLOC_TRANSFER_H_ */
