/* store.h: the one content-addressed store of compiled modules, in memory
 * and on disk (docs/store.md). Every backend keeps what it compiles here:
 * the CUDA backend its cubins, the CPU backend its object code, the
 * emulator its shared objects.
 *
 * Key: SHA-256 over length-prefixed fields (so that no two different tuples
 * hash the same bytes), begun by base_store_key_init with the store's
 * format, flexc's version and the payload's kind; each backend adds what
 * decides its payload (source, options, compiler and its version, target).
 *
 * Memory: a process-wide table. Disk: one file per key,
 * "<64 hex digits>.<kind's extension>", in base_config()->cache_dir
 * (FLEXC_CACHE_DIR), else $XDG_CACHE_HOME/flexc, else ~/.cache/flexc;
 * "off" keeps the store in memory only. A file is written to a temp file in
 * the same directory and renamed into place, and carries a header (magic,
 * format, kind, key, payload length, payload SHA-256) that is verified on
 * every read with the exact length: a corrupt, truncated, extended or
 * foreign file, or one of another kind or key, is a miss, and the next put
 * replaces it. Any I/O failure just means no disk. Nothing is evicted.
 *
 * All functions are thread-safe.
 */
#ifndef FLEXC_BASE_STORE_H
#define FLEXC_BASE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/sha256.h"

/* Bump when the header layout or the meaning of a payload changes. */
#define BASE_STORE_FORMAT 2
/* Bytes of the on-disk header in front of the payload. */
#define BASE_STORE_HEADER_BYTES 88
/* Bytes of a key. */
#define BASE_STORE_KEY_BYTES BASE_SHA256_BYTES

/* What a payload is; part of every key, header and file name, so that two
 * kinds never answer for each other. */
typedef enum BaseStoreKind {
  BASE_STORE_CUBIN,      /* ".cubin": an NVRTC image (cuda/cache.c) */
  BASE_STORE_CPU_OBJECT, /* ".cpu.o": symbol prefix, NUL, ELF object (cpu/jit.c) */
  BASE_STORE_EMU_MODULE, /* ".emu.so": an emulator shared object (emu/build.c) */
  BASE_STORE_KINDS
} BaseStoreKind;

/* The kind's name ("cubin", "cpu object", "emulator module"). */
const char *base_store_kind_name(BaseStoreKind kind);

/* ---- keys ---------------------------------------------------------------- */

/* Begin a key of `kind`: the format, flexc's version and the kind are its
 * first fields. */
void base_store_key_init(BaseSha256 *s, BaseStoreKind kind);
/* Add one field (n bytes, length-prefixed). */
void base_store_key_add(BaseSha256 *s, const void *data, size_t n);
/* Add a text field (NULL counts as ""). */
void base_store_key_str(BaseSha256 *s, const char *text);
/* Finish the key. */
void base_store_key_final(BaseSha256 *s, uint8_t key[BASE_STORE_KEY_BYTES]);

/* ---- payloads --------------------------------------------------------------- */

/* Look up `key` of `kind`, in memory then on disk (a disk hit is kept in
 * memory). On a hit, *bytes is a fresh heap copy (base_free) of *len bytes,
 * followed by one NUL byte not counted in *len. */
bool base_store_get(BaseStoreKind kind, const uint8_t key[BASE_STORE_KEY_BYTES], void **bytes,
                    size_t *len);
/* The same, saying what served it. */
typedef enum BaseStoreHit { BASE_STORE_MISS, BASE_STORE_MEM, BASE_STORE_DISK } BaseStoreHit;
BaseStoreHit base_store_lookup(BaseStoreKind kind, const uint8_t key[BASE_STORE_KEY_BYTES],
                               void **bytes, size_t *len);
/* Keep a payload under `key` of `kind` in memory and (unless off) on disk. */
void base_store_put(BaseStoreKind kind, const uint8_t key[BASE_STORE_KEY_BYTES], const void *bytes,
                    size_t len);

/* The disk directory now in effect into out; false when the disk is off or
 * no directory can be named. */
bool base_store_dir(char *out, size_t cap);
/* The file that holds `key` of `kind` in that directory; false as above. */
bool base_store_path(BaseStoreKind kind, const uint8_t key[BASE_STORE_KEY_BYTES], char *out,
                     size_t cap);
/* Forget every in-memory payload (tests and benchmarks measure the disk). */
void base_store_clear_memory(void);

/* Counters of one kind since the process started (tests, benchmarks). */
typedef struct BaseStoreStats {
  long mem_hits;      /* served from memory */
  long disk_hits;     /* served from a verified disk file */
  long misses;        /* not found anywhere */
  long disk_rejected; /* disk files found but failing verification */
  long disk_writes;   /* files renamed into place */
} BaseStoreStats;
void base_store_stats(BaseStoreKind kind, BaseStoreStats *out);

#endif
