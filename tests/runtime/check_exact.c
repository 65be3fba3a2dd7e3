/* kernels/exact.cuh, the exact accumulator of a deterministic backward's
 * buffer gradients, on the host (the same C the kernels compile):
 *
 * - sums of random float32 values whose exponents span at most 64 bits
 *   against __float128 (113 significant bits hold every such sum of up to
 *   2^10 terms exactly, so its one rounding to float is the correctly
 *   rounded sum), for positive, negative and cancelling terms;
 * - any order of the same terms, random bit patterns over the whole float
 *   range (subnormals, huge values), gives the same words and the same
 *   value;
 * - non-finite terms and results: inf, -inf, both (NaN), NaN, an overflow
 *   to inf, an exact zero, subnormal results, and the `extra` term.
 * Fresh random terms each run (seed printed). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/exact.cuh"
#include "testlib.h"

static uint64_t rng;

static float sum_of(const float *v, int n, float extra) {
  int64_t w[FLEX_EXACT_WORDS] = {0};
  for (int i = 0; i < n; i++) flex_exact_add_local(w, v[i]);
  return flex_exact_value(w, extra);
}

static uint32_t bits(float f) { return flex_exact_f2u(f); }

START_TEST(correctly_rounded) {
  float v[1024];
  for (int trial = 0; trial < 3000; trial++) {
    int n = 1 + (int)(tl_rand(&rng) % 1024);
    int lo = -149 + (int)(tl_rand(&rng) % 190); /* exponents lo .. lo + 40 (+ 24 significand bits) */
    __float128 ref = 0;
    for (int i = 0; i < n; i++) {
      double m = (double)(tl_rand(&rng) % (1u << 24)) * (trial % 3 == 0 ? 1 : tl_uniform(&rng) < 0.5 ? 1 : -1);
      float x = ldexpf((float)m, lo + (int)(tl_rand(&rng) % 41) - 23);
      if (!isfinite(x)) x = 0.0f;
      v[i] = x;
      ref += (__float128)x;
    }
    float want = (float)ref, got = sum_of(v, n, 0.0f);
    if (want == 0.0f) want = 0.0f; /* an exact zero sum is +0 */
    ck_assert_msg(bits(got) == bits(want), "trial %d, %d terms: %a, correctly rounded %a", trial, n,
                  (double)got, (double)want);
  }
}
END_TEST

START_TEST(order_independent) {
  float v[512];
  for (int trial = 0; trial < 300; trial++) {
    int n = 2 + (int)(tl_rand(&rng) % 511);
    for (int i = 0; i < n; i++) {
      float x = flex_exact_u2f((uint32_t)tl_rand(&rng));
      v[i] = isfinite(x) ? x : 1.5f;
    }
    int64_t w0[FLEX_EXACT_WORDS] = {0};
    for (int i = 0; i < n; i++) flex_exact_add_local(w0, v[i]);
    for (int i = n - 1; i > 0; i--) { /* shuffle */
      int j = (int)(tl_rand(&rng) % (uint64_t)(i + 1));
      float t = v[i];
      v[i] = v[j], v[j] = t;
    }
    int64_t w1[FLEX_EXACT_WORDS] = {0};
    for (int i = 0; i < n; i++) flex_exact_add_local(w1, v[i]);
    ck_assert_msg(!memcmp(w0, w1, sizeof w0), "trial %d: the words depend on the order", trial);
    ck_assert_uint_eq(bits(flex_exact_value(w0, 0.0f)), bits(flex_exact_value(w1, 0.0f)));
  }
}
END_TEST

START_TEST(special_values) {
  const float inf = INFINITY, big = 3.0e38f, tiny = 1.0e-45f; /* tiny: the smallest subnormal */
  float a[] = {1.0f, inf, 2.0f};
  ck_assert(sum_of(a, 3, 0.0f) == inf);
  float b[] = {-inf, 1.0f};
  ck_assert(sum_of(b, 2, 0.0f) == -inf);
  float c[] = {inf, -inf};
  ck_assert(isnan(sum_of(c, 2, 0.0f)));
  float d[] = {1.0f, NAN};
  ck_assert(isnan(sum_of(d, 2, 0.0f)));
  float e[] = {big, big};
  ck_assert(sum_of(e, 2, 0.0f) == inf); /* overflows, as any float order would */
  float f[] = {-big, -big, -big};
  ck_assert(sum_of(f, 3, 0.0f) == -inf);
  float g[] = {big, big, -big, -big, 1.0f};
  ck_assert(sum_of(g, 5, 0.0f) == 1.0f); /* exact: no intermediate overflow */
  float h[] = {1.0e20f, 1.0f, -1.0e20f};
  ck_assert(sum_of(h, 3, 0.0f) == 1.0f); /* exact: float addition would give 0 */
  float z[] = {2.5f, -2.5f};
  ck_assert_uint_eq(bits(sum_of(z, 2, 0.0f)), 0u);
  float s[] = {tiny, tiny, tiny};
  ck_assert(sum_of(s, 3, 0.0f) == 3 * tiny);
  float t[] = {1.1754942e-38f, tiny}; /* the largest subnormal plus the smallest: the smallest normal */
  ck_assert(sum_of(t, 2, 0.0f) == 1.17549435e-38f);
  float u[] = {0.25f};
  ck_assert(sum_of(u, 1, 0.5f) == 0.75f);
  ck_assert(sum_of(u, 0, -2.0f) == -2.0f);
  ck_assert(isnan(sum_of(u, 1, NAN)));
  /* Ties to even: 1 + 2^-24 is a tie between 1 and 1 + 2^-23, so 1; with
   * any more below it, 1 + 2^-23. */
  float tie[] = {1.0f, 0x1p-24f};
  ck_assert(sum_of(tie, 2, 0.0f) == 1.0f);
  float up[] = {1.0f, 0x1p-24f, 0x1p-140f};
  ck_assert(sum_of(up, 3, 0.0f) == 1.0f + 0x1p-23f);
  float odd[] = {1.0f + 0x1p-23f, 0x1p-24f};
  ck_assert(sum_of(odd, 2, 0.0f) == 1.0f + 0x1p-22f);
}
END_TEST

int main(void) {
  rng = tl_seed();
  return TL_MAIN("exact", 0, TL_TEST(correctly_rounded), TL_TEST(order_independent),
                 TL_TEST(special_values));
}
