/* cache.h: the CUDA backend's compiled kernels, through the module store
 * (base/store.h, docs/store.md): the key of a cubin, NVRTC compilation on a
 * miss, and module loading.
 *
 * Key (kind BASE_STORE_CUBIN): the full CUDA source, the digest of every
 * embedded template header, the compile options, NVRTC's flags and version
 * and the target arch, each a length-prefixed field after the store's own
 * (format, flexc version, kind).
 *
 * $FLEXC_CACHE_LOG (a file): every rt_cache_compile lookup that memory did
 * not serve appends a line, "disk-hit" or "miss" with the key, arch and the
 * source's header, so that a run of many processes can count what the disk
 * cache served.
 *
 * All functions are thread-safe.
 */
#ifndef FLEXC_CACHE_H
#define FLEXC_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/store.h"
#include "cuda/driver.h"
#include "runtime/flex.h"

/* The store key of one compilation (see above). */
void rt_cache_key(uint8_t key[BASE_STORE_KEY_BYTES], const char *source, size_t source_len,
                  const char *options, const char *nvrtc_version, const char *arch);

/* The compiled image (cubin) of `source` for `arch` ("sm_80", "sm_90a"):
 * from the store, else compiled by NVRTC with `options` (space-separated,
 * part of the key) and stored. *image is a heap copy (base_free); *hit says
 * whether the store served it. FLEX_ERR_COMPILE with NVRTC's log on failure. */
flex_status rt_cache_compile(const char *source, size_t source_len, const char *options,
                             const char *arch, void **image, size_t *image_len, bool *hit);
/* rt_cache_compile, then the image loaded into the current context of
 * `device` (one module per image and device for the life of the process). */
flex_status rt_cuda_module_for(const char *source, size_t source_len, const char *options,
                               const char *arch, int device, RtCuModule *out);

#endif
