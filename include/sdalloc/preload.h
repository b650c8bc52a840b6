/* sdalloc/preload.h - what libsdalloc_preload.so offers beside the malloc family.
 *
 * Preloaded (LD_PRELOAD=libsdalloc_preload.so, settings in SDALLOC_CONF: docs/preload.md),
 * the library serves requests at or above its threshold from an sdalloc pool and the rest
 * from glibc. A program (or Python through ctypes.CDLL(None)) may look these up with
 * dlsym(RTLD_DEFAULT, ...) to learn whether the drop-in is there and to mark steps.
 * Thread-safe; none of them allocates from the pool.
 */
#ifndef SDALLOC_PRELOAD_H
#define SDALLOC_PRELOAD_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if ptr lies in the drop-in's reserved range (the pool served it), else 0. */
int sdalloc_preload_owns(const void* ptr);
/* The threshold in bytes once the pool is built, 0 before that or when it is off. */
size_t sdalloc_preload_threshold(void);
/* mode:planned: marks the start and end of one step of a repeated loop (the first is recorded,
 * later ones are served from the planned arena). 0 on success; -1 in other modes, when the
 * drop-in is off, for a begin inside a step and for an end outside one. */
int sdalloc_preload_begin_step(void);
int sdalloc_preload_end_step(void);

#ifdef __cplusplus
}
#endif

#endif /* SDALLOC_PRELOAD_H */
