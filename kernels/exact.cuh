/* exact.cuh: exact, order-independent sums of float32 values, for the
 * buffer gradients of a deterministic backward (docs/kernels.md,
 * "Deterministic backward").
 *
 * Every finite float32 is an integer multiple of 2^-149 (the smallest
 * subnormal) below 2^128, so an integer of 277 bits holds it exactly. The
 * accumulator of one element is FLEX_EXACT_WORDS signed 64-bit words:
 * twelve limbs of 24 bits (limb i weighs 2^(24 i - 149)) and a flag word.
 * A value's 24-bit significand, shifted by its exponent, spans at most two
 * adjacent limbs; each limb gets a signed part below 2^24, so 2^39 adds to
 * one element cannot overflow a limb. Integer adds are associative: every
 * order of the same adds leaves the same words, and flex_exact_value
 * rounds their sum once (to nearest, ties to even), so the result is the
 * correctly rounded sum whatever the order. Non-finite values set flags
 * instead: NaN, or both infinities, give NaN; one infinity gives it, as
 * any IEEE order would. An exact zero sum is +0.
 *
 * Plain C shared by the kernels (CUDA and the emulator's host C++) and the
 * CPU backend (C11): the atomic adds themselves are each side's own
 * (common.cuh flex_exact_add, cpu/attn.c).
 */
#ifndef FLEX_EXACT_CUH
#define FLEX_EXACT_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FLEX_EXACT_FN __device__ __forceinline__
FLEX_EXACT_FN uint32_t flex_exact_f2u(float v) { return __float_as_uint(v); }
FLEX_EXACT_FN float flex_exact_u2f(uint32_t u) { return __uint_as_float(u); }
#else
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#define FLEX_EXACT_FN static inline
FLEX_EXACT_FN uint32_t flex_exact_f2u(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}
FLEX_EXACT_FN float flex_exact_u2f(uint32_t u) {
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}
#endif

#define FLEX_EXACT_LIMBS 12 /* 24-bit limbs: 288 bits over the 277 a float32 needs */
#define FLEX_EXACT_WORDS 13 /* the limbs, then the flag word */
#define FLEX_EXACT_POS_INF 1u
#define FLEX_EXACT_NEG_INF 2u
#define FLEX_EXACT_NAN 4u

/* Where v goes: *lo into limb i and *hi into limb i + 1, i returned; -1
 * for a zero (nothing to add) or a non-finite v (*flag says which). */
FLEX_EXACT_FN int flex_exact_split(float v, int64_t *lo, int64_t *hi, uint32_t *flag) {
  const uint32_t u = flex_exact_f2u(v), ex = (u >> 23) & 255u, man = u & 0x7fffffu;
  *flag = 0;
  *lo = *hi = 0;
  if (ex == 255u) {
    *flag = man ? FLEX_EXACT_NAN : (u >> 31) ? FLEX_EXACT_NEG_INF : FLEX_EXACT_POS_INF;
    return -1;
  }
  if (!ex && !man) return -1;
  /* v = M 2^(s - 149): M the significand (implicit bit on normals), s
   * the shift in units of 2^-149 (0 for subnormals). */
  const uint64_t M = ex ? (man | 0x800000u) : man;
  const int s = ex ? (int)ex - 1 : 0;
  const uint64_t x = M << (s % 24); /* below 2^47 */
  int64_t l = (int64_t)(x & 0xffffffu), h = (int64_t)(x >> 24);
  if (u >> 31) l = -l, h = -h;
  *lo = l, *hi = h;
  return s / 24;
}

/* Add v into the words w without atomics (the finaliser's own copy). */
FLEX_EXACT_FN void flex_exact_add_local(int64_t w[FLEX_EXACT_WORDS], float v) {
  int64_t lo, hi;
  uint32_t flag;
  const int i = flex_exact_split(v, &lo, &hi, &flag);
  if (i >= 0) w[i] += lo, w[i + 1] += hi;
  w[FLEX_EXACT_LIMBS] |= (int64_t)flag;
}

/* The sum the words hold plus `extra` (a value already in float32, as a
 * caller's accumulated gradient), rounded once to float32. */
FLEX_EXACT_FN float flex_exact_value(const int64_t *acc, float extra) {
  int64_t w[FLEX_EXACT_WORDS];
  for (int i = 0; i < FLEX_EXACT_WORDS; i++) w[i] = acc[i];
  flex_exact_add_local(w, extra);
  const uint32_t f = (uint32_t)w[FLEX_EXACT_LIMBS];
  const float inf = flex_exact_u2f(0x7f800000u);
  if ((f & FLEX_EXACT_NAN) || (f & 3u) == 3u) return flex_exact_u2f(0x7fc00000u);
  if (f & FLEX_EXACT_POS_INF) return inf;
  if (f & FLEX_EXACT_NEG_INF) return -inf;
  /* Carries: digits d[i] in [0, 2^24), the rest in `top` (floor division). */
  int64_t d[FLEX_EXACT_LIMBS], top = 0;
  for (int i = 0; i < FLEX_EXACT_LIMBS; i++) {
    const int64_t c = w[i] + top;
    d[i] = c & 0xffffff;
    top = (c - d[i]) / 16777216;
  }
  const bool neg = top < 0;
  if (neg) { /* magnitude = -(top 2^288 + D) = (-top) 2^288 - D */
    int64_t borrow = 0;
    for (int i = 0; i < FLEX_EXACT_LIMBS; i++) {
      int64_t x = -d[i] - borrow;
      borrow = x < 0;
      d[i] = x < 0 ? x + 16777216 : x;
    }
    top = -top - borrow;
  }
  if (top != 0) return neg ? -inf : inf; /* at least 2^288 units = 2^139 */
  int t = FLEX_EXACT_LIMBS - 1;
  while (t >= 0 && !d[t]) t--;
  if (t < 0) return 0.0f;
  /* A window of the top two digits (48 bits: at least 25 significant
   * when t >= 1), the digits below only as a sticky bit. */
  uint64_t win = (uint64_t)d[t];
  int base = 0;
  bool sticky = false;
  if (t >= 1) {
    win = win << 24 | (uint64_t)d[t - 1];
    base = 24 * (t - 1);
    for (int i = 0; i < t - 1; i++) sticky = sticky || d[i] != 0;
  }
  int q = 0;
  while (win >> (q + 1)) q++;
  uint64_t m = win;
  int e = base - 149;
  if (q > 23) { /* round the window to 24 bits, to nearest, ties to even */
    const int sh = q - 23;
    const uint64_t rem = win & ((1ull << sh) - 1), half = 1ull << (sh - 1);
    m = win >> sh;
    if (rem > half || (rem == half && (sticky || (m & 1)))) m++;
    e += sh;
    if (m == 1ull << 24) m >>= 1, e++;
  }
  const float r = ldexpf((float)m, e); /* m < 2^24: exact, or inf past the range */
  return neg ? -r : r;
}

#endif /* FLEX_EXACT_CUH */
