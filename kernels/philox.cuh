/* philox.cuh: Philox4x32-10 and the dropout keep rule of docs/language.md ("Dropout").
 *
 * One definition of the bits for every backend: the kernels include it as
 * CUDA (NVRTC) and as the emulator's host C++, the reference and the tests
 * as C11. Plain C: no templates, no intrinsics (the 64-bit products below
 * are mul.wide.u32 on the device).
 *
 * Element (b, h, i, j) of a call with H query heads is kept when
 * u >= p, u = (r >> 8) * 2^-24, r = word j & 3 of
 * Philox4x32-10(key (seed_lo, seed_hi),
 *               counter (j >> 2, i, b * H + h, offset_lo + offset_hi));
 * the four keys j = 4n .. 4n + 3 share one Philox call.
 */
#ifndef FLEX_PHILOX_CUH
#define FLEX_PHILOX_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FLEX_PHILOX_FN __device__ __forceinline__
#else
#include <stdbool.h>
#include <stdint.h>
#define FLEX_PHILOX_FN static inline
#endif

#define FLEX_PHILOX_M0 0xD2511F53u
#define FLEX_PHILOX_M1 0xCD9E8D57u
#define FLEX_PHILOX_W0 0x9E3779B9u
#define FLEX_PHILOX_W1 0xBB67AE85u

/* One Philox round of counter c under key (k0, k1). */
FLEX_PHILOX_FN void flex_philox_round(uint32_t c[4], uint32_t k0, uint32_t k1) {
  const uint64_t p0 = (uint64_t)FLEX_PHILOX_M0 * c[0], p1 = (uint64_t)FLEX_PHILOX_M1 * c[2];
  const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
  const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
  c[0] = hi1 ^ c[1] ^ k0;
  c[1] = lo1;
  c[2] = hi0 ^ c[3] ^ k1;
  c[3] = lo0;
}

/* Philox4x32-10 of counter c (in place) under key (k0, k1): ten rounds,
 * the key bumped by (W0, W1) between rounds. Written out (no loop) so the
 * kernels' fully unrolled tiles keep c in registers. */
FLEX_PHILOX_FN void flex_philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
#define FLEX_PHILOX_R(n) flex_philox_round(c, k0 + (n) * FLEX_PHILOX_W0, k1 + (n) * FLEX_PHILOX_W1)
  FLEX_PHILOX_R(0u), FLEX_PHILOX_R(1u), FLEX_PHILOX_R(2u), FLEX_PHILOX_R(3u), FLEX_PHILOX_R(4u);
  FLEX_PHILOX_R(5u), FLEX_PHILOX_R(6u), FLEX_PHILOX_R(7u), FLEX_PHILOX_R(8u), FLEX_PHILOX_R(9u);
#undef FLEX_PHILOX_R
}

/* The fourth counter word of a 64-bit offset: its halves added, wrapping. */
FLEX_PHILOX_FN uint32_t flex_dropout_ctr3(uint64_t offset) {
  return (uint32_t)offset + (uint32_t)(offset >> 32);
}

/* The four words for keys j4 * 4 .. j4 * 4 + 3 of row i of head bh = b * H + h. */
FLEX_PHILOX_FN void flex_dropout_words(uint32_t r[4], uint32_t seed_lo, uint32_t seed_hi,
                                       uint32_t ctr3, uint32_t bh, uint32_t i, uint32_t j4) {
  r[0] = j4, r[1] = i, r[2] = bh, r[3] = ctr3;
  flex_philox4x32_10(r, seed_lo, seed_hi);
}

/* Word k (0..3) of r, by selects: a variable index would put r in local memory on the device. */
FLEX_PHILOX_FN uint32_t flex_dropout_word(const uint32_t r[4], uint32_t k) {
  return k & 2 ? (k & 1 ? r[3] : r[2]) : (k & 1 ? r[1] : r[0]);
}

/* The keep rule of one word: u = (r >> 8) * 2^-24 (exact in float), kept when u >= p. */
FLEX_PHILOX_FN bool flex_dropout_keep(uint32_t r, float p) {
  return (float)(r >> 8) * 5.9604644775390625e-08f >= p;
}

#endif /* FLEX_PHILOX_CUH */
