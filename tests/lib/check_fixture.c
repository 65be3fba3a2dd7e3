/* The call fixture itself (testlib_call.c) must be able to fail: a call
 * compared with itself passes, and each way a backend can be wrong fails
 * the comparison — one element off, one NaN (an output never written) in
 * each output and buffer gradient, a fully masked row that is not exactly
 * O = 0, LSE = -inf, dQ = 0, an infinity the reference does not have —
 * while an error below the tolerance passes. The tested side is the
 * reference too (fast, and bit for bit the other side), then edited. */
#include <check.h>
#include <math.h>
#include <stdio.h>

#include "testlib.h"

static uint64_t rng;

/* relpos_bias (a grad buffer) or dilated (fully masked rows: q < h % 3),
 * fp32, GQA, dLSE, forward and backward on both sides. */
static void call_init(TlCall *c, const char *sample) {
  const TlCase tc = {.sample = sample, .s = {2, 4, 2, 9, 11, 8, 6}, .backend = FLEX_BACKEND_REFERENCE,
                     .dlse = true};
  tl_call_init(c, &tc, &rng);
  tl_call_sample_extras(c);
  tl_call_forward(c);
  tl_call_backward(c);
}

/* Side s's array of output i (TL_OUT .. TL_DV, TL_DBUF). */
static RtArray *output(TlCall *c, int s, int i) {
  TlArr *o[TL_NERR] = {&c->out[s], &c->lse[s], &c->dq[s], &c->dk[s], &c->dv[s], &c->gbuf[s][0]};
  return &o[i]->a;
}

START_TEST(identical_passes) {
  const char *samples[2] = {"relpos_bias", "dilated"};
  for (int i = 0; i < 2; i++) {
    TlCall c;
    call_init(&c, samples[i]);
    tl_call_check(&c, TL_FWD | TL_BWD, samples[i]);
    ck_assert(i == 0 ? c.masked == 0 : c.masked > 0); /* dilated's rows q < h % 3 */
    for (int j = 0; j < TL_NERR; j++) /* O and gradients rounded to float32 */
      ck_assert_msg(c.err[j] < 1e-6, "error %d: %g", j, c.err[j]);
    tl_call_free(&c);
  }
}
END_TEST

/* _i: the output edited. One element off by a tenth of the norm fails;
 * one off by 1e-7 of it passes; one NaN fails, and so does +inf. */
START_TEST(each_output_can_fail) {
  TlCall c;
  call_init(&c, "relpos_bias");
  RtArray *x = output(&c, 0, _i);
  int64_t n = rt_array_count(x), at = (int64_t)(tl_rand(&rng) % (uint64_t)n);
  double ss = 0, v = rt_array_get(x, at);
  for (int64_t i = 0; i < n; i++) ss += rt_array_get(x, i) * rt_array_get(x, i);
  unsigned what = _i < TL_DQ ? TL_FWD : TL_BWD;
  const double bad[4] = {v + 0.1 * sqrt(ss), v + 1e-7 * sqrt(ss), NAN, INFINITY};
  for (int k = 0; k < 4; k++) {
    rt_array_set(x, at, bad[k]);
    bool pass = tl_call_compare(&c, what, "edited");
    ck_assert_msg(pass == (k == 1), "output %d element %lld = %g: compare %s", _i, (long long)at, bad[k],
                  pass ? "passed" : "failed");
    ck_assert_int_eq(tl_mismatches("edited", x, output(&c, 1, _i), _i < TL_DQ ? 1e-4 : 1e-3, 0), k != 1);
    rt_array_set(x, at, v);
  }
  ck_assert(tl_call_compare(&c, what, "restored"));
  tl_call_free(&c);
}
END_TEST

/* An output the backend never writes keeps its NaN poison and fails. */
START_TEST(unwritten_fails) {
  TlCall c;
  call_init(&c, "relpos_bias");
  tl_call_poison(&c, 0);
  ck_assert(!tl_call_compare(&c, TL_FWD, "unwritten"));
  ck_assert(!tl_call_compare(&c, TL_BWD, "unwritten"));
  tl_call_free(&c);
}
END_TEST

/* A fully masked row must be exact on the tested side: _i = 0 its LSE
 * finite, 1 an O element tiny but nonzero, 2 a dQ element tiny but nonzero. */
START_TEST(masked_rows_exact) {
  TlCall c;
  call_init(&c, "dilated");
  int64_t row = -1;
  for (int64_t r = 0; r < rt_array_count(&c.lse[1].a) && row < 0; r++)
    if (rt_array_get(&c.lse[1].a, r) == -INFINITY) row = r;
  ck_assert_int_ge(row, 0);
  RtArray *x = _i == 0 ? &c.lse[0].a : _i == 1 ? &c.out[0].a : &c.dq[0].a;
  int64_t at = _i == 0 ? row : row * (_i == 1 ? c.c.s.EV : c.c.s.E) + 1;
  rt_array_set(x, at, _i == 0 ? -1e30 : 1e-30);
  ck_assert(!tl_call_compare(&c, _i < 2 ? TL_FWD : TL_BWD, "masked row"));
  tl_call_free(&c);
}
END_TEST

/* The norm error's own rules (tl_rel_err). */
START_TEST(rel_err_rules) {
  int64_t n = 4;
  TlArr x, r;
  tl_arr_init(&x, rt_dtype(kDLFloat, 32), 1, &n), tl_arr_init(&r, rt_dtype(kDLFloat, 64), 1, &n);
  ck_assert(isinf(tl_rel_err(&x.a, &r.a))); /* an all-zero reference proves nothing */
  tl_arr_normal(&r, &rng);
  for (int i = 0; i < 4; i++) rt_array_set(&x.a, i, rt_array_get(&r.a, i));
  ck_assert(tl_rel_err(&x.a, &r.a) < 1e-6);
  rt_array_set(&r.a, 2, -INFINITY), rt_array_set(&x.a, 2, -INFINITY); /* equal infinities are exact */
  ck_assert(tl_rel_err(&x.a, &r.a) < 1e-6);
  rt_array_set(&x.a, 2, 0.0);
  ck_assert(isinf(tl_rel_err(&x.a, &r.a)));
  tl_arr_free(&x), tl_arr_free(&r);
}
END_TEST

int main(void) {
  rng = tl_seed();
  return TL_MAIN("fixture", 60, TL_TEST(identical_passes), TL_LOOP(each_output_can_fail, TL_NERR),
                 TL_TEST(unwritten_fails), TL_LOOP(masked_rows_exact, 3), TL_TEST(rel_err_rules));
}
