/* sdalloc/torch_shim.h - libsdalloc_torch.so: sdalloc as PyTorch's CUDA allocator.
 *
 * The functions PyTorch's CUDAPluggableAllocator loads by name, with the exact signatures it
 * calls (torch >= 2.0), and the optional hooks its C++ allocator object takes:
 *
 *     a = torch.cuda.memory.CUDAPluggableAllocator("libsdalloc_torch.so",
 *                                                  "sdalloc_torch_malloc_raising",
 *                                                  "sdalloc_torch_free")
 *     a.allocator().set_record_stream_fn(<address of sdalloc_torch_record_stream>)  # etc.
 *     torch.cuda.memory.change_current_allocator(a)   # before the first CUDA allocation
 *
 * The Python package does this for you: sdalloc.torch.install(mode="pool") (every hook,
 * and wrappers for the torch.cuda calls no hook reaches; docs/pytorch.md).
 *
 * One pool per device (built by make_pool on the device's first allocation: mode:auto is a
 * VirtualMemoryPool where the memory maps page by page, docs/pools.md), configured once per
 * process, PyTorch-style, from the environment variable SDALLOC_CONF or from
 * sdalloc_torch_configure():
 *     SDALLOC_CONF="backend:cuda,mode:vmm,memory_fraction:0.9"
 * Keys (each one row of one table in the code, src/torch_shim/shim_config.cpp and
 * src/config/pool_conf.cpp; docs/pytorch.md holds that table with every default and meaning,
 * and a test checks both lists against it):
 *   backend, mode, capacity, memory_fraction, replan_after, max_plans, plan_nodes,
 *   granularity, min_segment, huge_threshold, initial_reservation, release_before_growth,
 *   consolidate; retired in 0.2, accepted and ignored with one warning line: small_pool,
 *   small_granularity, spare_pages, grow_arena, cut_free_ends, segments.
 * A malformed SDALLOC_CONF makes every allocation fail (nullptr) with a message naming the
 * key, readable with sdalloc_torch_last_error() and printed once to stderr.
 *
 * Contract: no function here throws or aborts; failures return nullptr / a status and leave
 * a message for sdalloc_torch_last_error(). All functions are thread-safe. Pools live until
 * the process exits (PyTorch may free tensors from its own static destructors, after this
 * library's would have run, so they are never destroyed).
 *
 * The library is self-contained (it carries the whole C API of sdalloc.h too, bound to its
 * own copy): use sdalloc_torch_pool(device) with the sdalloc_* functions of THIS library
 * for statistics, layouts and event traces of the shim's pools.
 *
 * cudaStream_t: declared here as CUDA's runtime does (a pointer to struct CUstream_st), so
 * the library needs no CUDA header to be used, and the ABI is the same with or without one.
 */
#ifndef SDALLOC_TORCH_SHIM_H_
#define SDALLOC_TORCH_SHIM_H_

#include "sdalloc/sdalloc.h"
#include "sdalloc/sdalloc_transfer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st* cudaStream_t;

/* ---- the allocator PyTorch calls ----------------------------------------------------- */

/* size bytes on `device`, usable on `stream` at once; nullptr on failure (out of memory,
 * bad configuration, no CUDA), with the reason in sdalloc_torch_last_error(). Zero bytes:
 * nullptr, which PyTorch accepts for empty tensors. */
SDALLOC_API void* sdalloc_torch_malloc(size_t size, int device,
                                       cudaStream_t stream) SDALLOC_NOEXCEPT;

/* As sdalloc_torch_malloc, but a failure THROWS a C++ exception derived from std::bad_alloc
 * whose what() is "CUDA out of memory (sdalloc): cannot allocate N bytes on device D: ..."
 * (out of memory: with sdalloc's request, live, reserved and largest free bytes) or
 * "sdalloc: cannot allocate ..." (bad configuration, no CUDA). This is the function
 * sdalloc.torch.install() hands PyTorch: CUDAPluggableAllocator::malloc wraps what the
 * allocation function returns without a null check, so a nullptr would become a tensor at
 * address 0 and the first kernel would die with a sticky illegal-address error. PyTorch's
 * Python bindings turn the exception into a RuntimeError (not torch.cuda.OutOfMemoryError,
 * which only a c10::OutOfMemoryError, i.e. a library built against torch, produces).
 * Never hand this one to torch.cuda.MemPool: PyTorch's caching allocator checks for
 * nullptr there and raises OutOfMemoryError itself. Zero bytes: nullptr, no exception. */
SDALLOC_API void* sdalloc_torch_malloc_raising(size_t size, int device, cudaStream_t stream);

/* Frees ptr (from sdalloc_torch_malloc on the same device) on stream. `size` is the size
 * PyTorch allocated. A pointer that is not live is reported (message, stderr) and ignored. */
SDALLOC_API void sdalloc_torch_free(void* ptr, size_t size, int device,
                                    cudaStream_t stream) SDALLOC_NOEXCEPT;

/* ---- optional hooks (CUDAPluggableAllocator's set_*_fn signatures) ------------------- */

/* set_init_fn: called once with the device count; nothing to do (pools are lazy). */
SDALLOC_API void sdalloc_torch_init(int device_count) SDALLOC_NOEXCEPT;
/* set_reset_fn (torch.cuda.empty_cache): returns every wholly free cached segment of every
 * device's pool to the device. */
SDALLOC_API void sdalloc_torch_empty_cache(void) SDALLOC_NOEXCEPT;
/* set_record_stream_fn (Tensor.record_stream): the live block ptr is also used by `stream`. */
SDALLOC_API void sdalloc_torch_record_stream(void* ptr, cudaStream_t stream) SDALLOC_NOEXCEPT;
/* set_memory_fraction_fn (torch.cuda.set_per_process_memory_fraction): caps the device's
 * pool at fraction x the device's memory. Errors as sdalloc_torch_set_memory_fraction. */
SDALLOC_API void sdalloc_torch_memory_fraction_hook(double fraction, int device) SDALLOC_NOEXCEPT;

/* ---- control, for the Python package ------------------------------------------------- */

/* Sets the configuration (SDALLOC_CONF syntax; NULL or "" means the defaults), replacing
 * SDALLOC_CONF. Errors: INVALID_ARGUMENT for a malformed text (the message names the key)
 * or once any pool exists (the configuration is fixed by the first allocation). */
SDALLOC_API sdalloc_status_t sdalloc_torch_configure(const char* conf) SDALLOC_NOEXCEPT;
/* The configuration in effect (or that will be), in SDALLOC_CONF syntax with every key.
 * Static storage, valid until the next configure call. "" if the configuration is bad. */
SDALLOC_API const char* sdalloc_torch_config(void) SDALLOC_NOEXCEPT;
/* Whether this library was built with the CUDA backend (1) or host only (0). */
SDALLOC_API int sdalloc_torch_has_cuda(void) SDALLOC_NOEXCEPT;
/* The pool of `device` (-1 to 63), or NULL when that device has not allocated yet. */
SDALLOC_API sdalloc_pool_t* sdalloc_torch_pool(int device) SDALLOC_NOEXCEPT;
/* Creates the pool of `device` now if it does not exist, and stores it in *out.
 * Errors: as sdalloc_torch_malloc's failures. */
SDALLOC_API sdalloc_status_t sdalloc_torch_get_pool(int device,
                                                    sdalloc_pool_t** out) SDALLOC_NOEXCEPT;
/* Like the hook, with a status: INVALID_ARGUMENT for a fraction outside (0, 1], a device out
 * of range, or a host backend without `capacity`. Applies to the pool now or when created. */
SDALLOC_API sdalloc_status_t sdalloc_torch_set_memory_fraction(double fraction,
                                                               int device) SDALLOC_NOEXCEPT;
/* Like empty_cache, with the bytes released stored in *released (optional). */
SDALLOC_API sdalloc_status_t sdalloc_torch_trim(size_t* released) SDALLOC_NOEXCEPT;
/* The message of this thread's most recent failure in this library, "" if none. */
SDALLOC_API const char* sdalloc_torch_last_error(void) SDALLOC_NOEXCEPT;

/* Pages the mode:vmm pool of `device` has unmapped or moved away since its creation (each
 * waits for the page's stream; none should happen in a steady-state step); 0 for other
 * pools. */
SDALLOC_API uint64_t sdalloc_torch_vmm_unmaps(int device) SDALLOC_NOEXCEPT;

/* ---- CUDA graph capture ----------------------------------------------------------------
 * On a backend:cuda pool every allocation and free first asks cudaStreamIsCapturing (legal
 * during a capture). An allocation on a capturing stream (or one the runtime cannot tell
 * about) is refused: nullptr, or for sdalloc_torch_malloc_raising an exception, whose
 * message points to sdalloc.torch.mempool(), since cudaMalloc, event queries or
 * synchronisation would invalidate the capture and a graph's memory would be reused after
 * it. A block freed on a capturing stream is quarantined: kept for the process's life, as
 * a replay of the graph may still use it. */

/* Bytes quarantined so far (freed during a capture). */
SDALLOC_API size_t sdalloc_torch_quarantined_bytes(void) SDALLOC_NOEXCEPT;

/* For tests without a GPU: `query` answers whether a stream is capturing (nonzero) in place
 * of the CUDA runtime, for every backend; NULL restores the runtime (backend:cuda only). */
typedef int (*sdalloc_torch_capture_query_fn)(cudaStream_t stream);
SDALLOC_API void sdalloc_torch_set_capture_query_for_testing(sdalloc_torch_capture_query_fn query)
    SDALLOC_NOEXCEPT;

/* ---- weight offload on a CUDA device (sdalloc.torch.offload(..., device="cuda")) ------
 * The C API layer's engines (sdalloc_transfer.h) use the host copy backend; these make an
 * engine on the CUDA copy backend and an offloader whose device memory is on a CUDA
 * device, to be used with the sdalloc_transfer_* and sdalloc_offload_* functions of THIS
 * library (which carries them). Messages of failures: this library's sdalloc_last_error().
 *
 *   sdalloc_torch_transfer_engine_create_cuda(&config, 0, &engine);
 *   sdalloc_torch_offload_create_cuda(engine, &offload_config, 0, compute_stream, &offload);
 *   sdalloc_offload_add_weight(offload, host_weight, bytes, &id);        // per weight
 *   sdalloc_offload_begin_step(offload);
 *   sdalloc_offload_acquire(offload, ids, n, device_pointers);           // per layer, then
 *   ... launch the layer on compute_stream ...
 *   sdalloc_offload_end_step(offload);
 *
 * The offloader is stream-ordered: acquire() makes compute_stream wait for the layer's
 * loads (cudaStreamWaitEvent on the copy's event) and returns without blocking the host;
 * loads run on the engine's copy stream into a CachingPool over cudaMalloc (with CUDA
 * events, capped at budget + max(budget / 4, 64 MiB)); an eviction frees on compute_stream,
 * so its memory is loaded into again only after the work queued there before it (the
 * layers that read the weight). The layers must run on compute_stream. Weights are
 * registered in place (cudaHostRegister) in the background; loads go through pinned
 * staging until then. Destroy the offloader after compute_stream has finished with the
 * weights, and before its engine.
 * Errors: INVALID_ARGUMENT for a NULL output, engine or config, a config not from its
 * _init, a budget of 0, an engine not made by sdalloc_torch_transfer_engine_create_cuda
 * or for another device, no usable CUDA driver or device here ("no CUDA device to offload
 * to: ..."), or a library built without CUDA ("built without CUDA"). */
SDALLOC_API sdalloc_status_t
sdalloc_torch_transfer_engine_create_cuda(const sdalloc_transfer_config_t* config, int device,
                                          sdalloc_transfer_engine_t** out) SDALLOC_NOEXCEPT;
SDALLOC_API sdalloc_status_t sdalloc_torch_offload_create_cuda(
    sdalloc_transfer_engine_t* engine, const sdalloc_offload_config_t* config, int device,
    cudaStream_t compute_stream, sdalloc_offload_t** out) SDALLOC_NOEXCEPT;
/* The unit offloader's device on CUDA device `device` (sdalloc_unit_offload_* of
 * sdalloc_transfer.h, which this library carries): compute_stream is the stream the forward
 * runs on, copies go on a non-blocking stream of its own, events order them. Errors as
 * sdalloc_torch_transfer_engine_create_cuda's (no usable device, built without CUDA). */
SDALLOC_API sdalloc_status_t sdalloc_torch_stream_device_create_cuda(
    int device, cudaStream_t compute_stream, sdalloc_stream_device_t** out) SDALLOC_NOEXCEPT;
/* Bytes the offloader's device memory holds now (its pool's segments: resident weights,
 * blocks waiting for the compute stream, cached blocks); for an offloader of either kind. */
SDALLOC_API sdalloc_status_t
sdalloc_torch_offload_reserved_bytes(sdalloc_offload_t* offload, size_t* reserved) SDALLOC_NOEXCEPT;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SDALLOC_TORCH_SHIM_H_ */
