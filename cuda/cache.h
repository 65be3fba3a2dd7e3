/* cache.h: the compiled-kernel cache, in memory and on disk.
 *
 * Key: SHA-256 of (cache format version, flexc version, the full CUDA source,
 * the compile options, the NVRTC version, the target arch), each field
 * length-prefixed so that no two different tuples hash the same bytes.
 *
 * Disk: one file per key, "<hex key>.cubin", in $FLEXC_CACHE_DIR, else
 * $XDG_CACHE_HOME/flexc, else ~/.cache/flexc; FLEXC_CACHE_DIR=off turns the
 * disk cache off. Files are written to a temp file in the same directory and
 * renamed into place, and carry a header (magic, format version, key,
 * payload length, payload SHA-256) that is verified on every read: a corrupt,
 * truncated or foreign file is a miss (and is replaced by the next put),
 * never trusted. Any I/O failure just means no disk cache.
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

#include "cuda/driver.h"
#include "runtime/flex.h"
#include "cuda/sha256.h"

/* Bump when the header layout or the meaning of a payload changes. */
#define RT_CACHE_FORMAT 1
/* Bytes of the on-disk header in front of the payload. */
#define RT_CACHE_HEADER_BYTES 88

/* The key of one compilation (see above). */
void rt_cache_key(uint8_t key[RT_SHA256_BYTES], const char *source, size_t source_len,
                  const char *options, const char *nvrtc_version, const char *arch);

/* Look up `key`, in memory then on disk (a disk hit is kept in memory).
 * On a hit, *bytes is a fresh heap copy (base_free) of *len bytes. */
bool rt_cache_get(const uint8_t key[RT_SHA256_BYTES], void **bytes, size_t *len);
/* Store a payload under `key` in memory and (unless off) on disk. */
void rt_cache_put(const uint8_t key[RT_SHA256_BYTES], const void *bytes, size_t len);

/* The disk directory now in effect into out; false when disk caching is off
 * or no directory can be named. */
bool rt_cache_dir(char *out, size_t cap);
/* The file that holds `key` in the current directory; false as above. */
bool rt_cache_path(const uint8_t key[RT_SHA256_BYTES], char *out, size_t cap);
/* Forget every in-memory entry (benchmarks and tests measure the disk). */
void rt_cache_clear_memory(void);

/* Counters since the process started (for tests and benchmarks). */
typedef struct RtCacheStats {
  long mem_hits;      /* served from memory */
  long disk_hits;     /* served from a verified disk file */
  long misses;        /* not found anywhere */
  long disk_rejected; /* disk files found but failing verification */
  long disk_writes;   /* files renamed into place */
} RtCacheStats;
void rt_cache_stats(RtCacheStats *out);

/* ---- compiling through the cache ------------------------------------------ */

/* The compiled image (cubin) of `source` for `arch` ("sm_80", "sm_90a"):
 * from the cache, else compiled by NVRTC with `options` (space-separated,
 * part of the key) and stored. *image is a heap copy (base_free); *hit says
 * whether the cache served it. FLEX_ERR_COMPILE with NVRTC's log on failure. */
flex_status rt_cache_compile(const char *source, size_t source_len, const char *options,
                             const char *arch, void **image, size_t *image_len, bool *hit);
/* rt_cache_compile, then the image loaded into the current context of
 * `device` (one module per image and device for the life of the process). */
flex_status rt_cuda_module_for(const char *source, size_t source_len, const char *options,
                               const char *arch, int device, RtCuModule *out);

#endif
