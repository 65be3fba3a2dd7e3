/* sha256.h: SHA-256 (FIPS 180-4), for the kernel cache's keys and for
 * verifying cached payloads. Streaming: init, update any number of times,
 * final. */
#ifndef FLEXC_SHA256_H
#define FLEXC_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define RT_SHA256_BYTES 32

/* The running state of one digest. */
typedef struct RtSha256 {
  uint32_t h[8];      /* chaining value */
  uint64_t nbytes;    /* message bytes consumed so far */
  uint8_t block[64];  /* the partial block not yet compressed */
  size_t fill;        /* bytes in block */
} RtSha256;

/* Start a digest. */
void rt_sha256_init(RtSha256 *s);
/* Feed n bytes. */
void rt_sha256_update(RtSha256 *s, const void *data, size_t n);
/* Finish and write the 32-byte digest; the state is spent afterwards. */
void rt_sha256_final(RtSha256 *s, uint8_t out[RT_SHA256_BYTES]);
/* One-shot digest of a byte range. */
void rt_sha256(const void *data, size_t n, uint8_t out[RT_SHA256_BYTES]);
/* Lower-case hex of a digest into out (65 bytes with the NUL). */
void rt_sha256_hex(const uint8_t d[RT_SHA256_BYTES], char out[2 * RT_SHA256_BYTES + 1]);

#endif
