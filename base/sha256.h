/* sha256.h: SHA-256 (FIPS 180-4), for the module store's keys and for
 * verifying stored payloads (store.h), and for the embedded templates'
 * digest (embed.c). Streaming: init, update any number of times, final.
 * Depends on nothing but the C library. */
#ifndef FLEXC_BASE_SHA256_H
#define FLEXC_BASE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define BASE_SHA256_BYTES 32

/* The running state of one digest. */
typedef struct BaseSha256 {
  uint32_t h[8];      /* chaining value */
  uint64_t nbytes;    /* message bytes consumed so far */
  uint8_t block[64];  /* the partial block not yet compressed */
  size_t fill;        /* bytes in block */
} BaseSha256;

/* Start a digest. */
void base_sha256_init(BaseSha256 *s);
/* Feed n bytes. */
void base_sha256_update(BaseSha256 *s, const void *data, size_t n);
/* Finish and write the 32-byte digest; the state is spent afterwards. */
void base_sha256_final(BaseSha256 *s, uint8_t out[BASE_SHA256_BYTES]);
/* One-shot digest of a byte range. */
void base_sha256(const void *data, size_t n, uint8_t out[BASE_SHA256_BYTES]);
/* Lower-case hex of a digest into out (65 bytes with the NUL). */
void base_sha256_hex(const uint8_t d[BASE_SHA256_BYTES], char out[2 * BASE_SHA256_BYTES + 1]);

#endif
