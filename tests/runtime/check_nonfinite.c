/* Non-finite values are never hidden (docs/language.md, "Semantics"): a NaN, +inf or
 * -inf in Q, K, V, dO or a float buffer, placed at a fresh random position
 * each run, forward and backward, on the float64 reference and on the
 * emulator (the generated CUDA: fp32 SIMT and fp16 tensor-core kernels).
 *
 * The reference is checked against the rule itself: a NaN in a row's
 * unmasked t makes LSE and O NaN, a +inf makes LSE +inf and O NaN, and
 * no such row becomes finite, -inf, or fully masked; an element the mask
 * removes never contributes (its outputs stay finite).
 *
 * The emulator is checked against the reference element by element: where
 * the reference is NaN the emulator is NaN, where it is +-inf the emulator
 * is the same infinity, and the elements finite on both sides meet the
 * project's relative-norm tolerance. Where the non-finite element is one
 * the mask removes (or that t = -inf removes), docs/language.md lets a kernel's tile
 * arithmetic (0 * NaN) make an output NaN; such a case accepts NaN where
 * the reference is finite, and nothing else: never another finite number.
 * The emulator's outputs start as a finite sentinel, so an output it never
 * writes cannot pass as "NaN, allowed". */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;

enum { T_Q, T_K, T_V, T_DO, T_BUF };
static const char *const tnames[] = {"q", "k", "v", "dout", "buffer"};

/* A kernel and where its poisoned element goes. */
typedef struct Case {
  const char *name;
  const char *src;
  const char *buffer; /* f32[KV_LEN] when grad, else f32[H] (NULL: none) */
  bool grad;          /* the buffer is `grad` */
  bool masked;        /* the element sits where the mask removes it */
} Case;

/* Mask of the masked cases: query rows 0..4 see no key; keys >= 32 are
 * masked for every row (QL = 37). */
#define SHIFTED "mask shifted(b, h, q, kv) { return q >= kv + 5; }\n"

static const Case cases[] = {
    {"identity", "score ident(s, b, h, q, kv) { return s; }\n", NULL, false, false},
    {"bias", "buffer bias: f32[KV_LEN] grad;\nscore sb(s, b, h, q, kv) { return s + bias[kv]; }\n", "bias",
     true, false},
    {"alibi",
     "buffer slopes: f32[H];\nscore al(s, b, h, q, kv) { return s + slopes[h] * float(kv - q); }\n",
     "slopes", false, false},
    {"shifted", SHIFTED, NULL, false, true},
};
enum { NCASES = sizeof cases / sizeof *cases };

enum { B = 1, H = 4, HKV = 2, QL = 37, KL = 70, E = 16 };
static const double SENTINEL = 4096.0; /* exact in fp16, bf16, fp32 */

/* Every element of x the sentinel. */
static void sentinel(TlArr *x) {
  for (int64_t i = 0; i < rt_array_count(&x->a); i++) rt_array_set(&x->a, i, SENTINEL);
}

/* The call of case c in dtype dt: outputs in q's dtype, the emulator's
 * (and its buffer gradient) starting as the sentinel. */
static void call_init(TlCall *t, const Case *c, const TlDtype *d) {
  const TlCase tc = {.name = c->name, .src = c->src, .s = {B, H, HKV, QL, KL, E, E}, .dt = d,
                     .backend = FLEX_BACKEND_EMU, .native_out = true, .native_grads = true};
  tl_call_init(t, &tc, &rng);
  TlArr *outs[] = {&t->out[0], &t->lse[0], &t->dq[0], &t->dk[0], &t->dv[0]};
  for (int i = 0; i < 5; i++) sentinel(outs[i]);
  if (!c->buffer) return;
  int64_t bs[1] = {c->grad ? KL : H};
  TlArr *b = tl_call_buffer(t, c->buffer, rt_dtype(kDLFloat, 32), 1, bs, c->grad);
  for (int64_t i = 0; i < bs[0]; i++)
    rt_array_set(&b->a, i, c->grad ? tl_normal(&rng) : 0.05 + 0.2 * (double)i);
  if (c->grad) sentinel(&t->gbuf[0][0]);
}

/* Put v at element i of x (the input both calls read); returns i. */
static int64_t poison(TlArr *x, int64_t i, double v) {
  rt_array_set(&x->a, i, v);
  return i;
}

static int64_t idx4(int d1, int d2, int d3, int D1, int D2, int D3, int b) {
  return (((int64_t)b * D1 + d1) * D2 + d2) * D3 + d3;
}

static int pick(int lo, int hi) { return lo + (int)(tl_rand(&rng) % (uint64_t)(hi - lo)); }

/* Side 0 of c's output `o` (tl_call outputs: 0 out .. 4 dv, 5 the buffer
 * gradient) against the reference by the rule above; what: for messages. */
static void compare(const char *what, const char *label, TlCall *c, int o, double tol, bool allow_nan) {
  TlArr *xs[6] = {&c->out[0], &c->lse[0], &c->dq[0], &c->dk[0], &c->dv[0], &c->gbuf[0][0]};
  TlArr *rs[6] = {&c->out[1], &c->lse[1], &c->dq[1], &c->dk[1], &c->dv[1], &c->gbuf[1][0]};
  const RtArray *xa = &xs[o]->a, *ra = &rs[o]->a;
  double num = 0, den = 0;
  int64_t n = rt_array_count(xa), finite = 0, extra_nan = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = rt_array_get(xa, i), r = rt_array_get(ra, i);
    if (isnan(r)) {
      ck_assert_msg(isnan(x), "%s: %s[%lld]: reference NaN, emulator %g", label, what, (long long)i, x);
    } else if (isinf(r)) {
      ck_assert_msg(x == r, "%s: %s[%lld]: reference %g, emulator %g", label, what, (long long)i, r, x);
    } else if (isnan(x)) {
      ck_assert_msg(allow_nan, "%s: %s[%lld]: reference %g, emulator NaN", label, what, (long long)i, r);
      extra_nan++;
    } else {
      ck_assert_msg(isfinite(x), "%s: %s[%lld]: reference %g, emulator %g", label, what, (long long)i, r, x);
      num += (x - r) * (x - r), den += r * r, finite++;
    }
  }
  double err = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
  fprintf(stderr, "    %s: %lld finite, err %.2g, %lld NaN where the reference is finite\n", what,
          (long long)finite, err, (long long)extra_nan);
  ck_assert_msg(err < tol, "%s: %s: relative error %g over the finite elements (tol %g)", label, what,
                err, tol);
}

static int64_t count_nonfinite(const RtArray *a) {
  int64_t n = 0;
  for (int64_t i = 0; i < rt_array_count(a); i++) n += !isfinite(rt_array_get(a, i));
  return n;
}

/* The reference forward against the rule; qrow: the poisoned Q row's flat
 * row index (B*H*QL numbering) or -1. */
static void check_reference_forward(const char *label, const TlCall *t, const Case *c, int which,
                                    double val, int64_t qrow, bool removed) {
  for (int64_t r = 0; r < B * H * QL; r++) {
    double lse = rt_array_get(&t->lse[1].a, r);
    int i = (int)(r % QL);
    bool masked_row = c->masked && i < 5;
    if (masked_row) {
      ck_assert_msg(lse == -INFINITY, "%s: reference LSE of fully masked row %lld is %g", label,
                    (long long)r, lse);
    } else {
      ck_assert_msg(lse != -INFINITY, "%s: reference row %lld became fully masked (LSE -inf)", label,
                    (long long)r);
    }
    bool nonfinite_row = isnan(lse) || lse == INFINITY;
    for (int e = 0; e < E; e++) {
      double o = rt_array_get(&t->out[1].a, r * E + e);
      if (masked_row) ck_assert_msg(o == 0.0, "%s: reference O of a fully masked row is %g", label, o);
      /* A NaN or +inf LSE: O is NaN (docs/language.md). */
      if (nonfinite_row) ck_assert_msg(isnan(o), "%s: row %lld has LSE %g but O %g", label, (long long)r, lse, o);
    }
  }
  if (removed) {
    /* What the mask removes never contributes: every O finite. */
    ck_assert_msg(count_nonfinite(&t->out[1].a) == 0,
                  "%s: a masked non-finite element reached the reference's O", label);
    return;
  }
  if (which == T_Q && isnan(val))
    ck_assert_msg(isnan(rt_array_get(&t->lse[1].a, qrow)), "%s: NaN in Q kept, but LSE is %g", label,
                  rt_array_get(&t->lse[1].a, qrow));
  if (which != T_DO)
    ck_assert_msg(count_nonfinite(&t->out[1].a) > 0, "%s: a kept non-finite input left O finite", label);
}

static void run_case(int ci, int di, int which, double val) {
  const Case *c = &cases[ci];
  const TlDtype *d = &tl_dtypes[di];
  char label[160];
  TlCall t;
  call_init(&t, c, d);
  int b = 0, h = pick(0, H), hk = pick(0, HKV), e = pick(0, E);
  /* Kept positions anywhere; masked ones: Q and dO rows 0..4 (no key at
   * all), K and V keys 32..69 (masked for every row). */
  int i = c->masked ? pick(0, 5) : pick(0, QL), j = c->masked ? pick(32, KL) : pick(0, KL);
  int64_t qrow = -1;
  switch (which) {
  case T_Q: poison(&t.q, idx4(h, i, e, H, QL, E, b), val), qrow = ((int64_t)b * H + h) * QL + i; break;
  case T_K: poison(&t.k, idx4(hk, j, e, HKV, KL, E, b), val); break;
  case T_V: poison(&t.v, idx4(hk, j, e, HKV, KL, E, b), val); break;
  case T_DO: poison(&t.dout, idx4(h, i, e, H, QL, E, b), val); break;
  default: poison(&t.buf[0], c->grad ? j : h, val); break;
  }
  snprintf(label, sizeof label, "%s %s: %g in %s at h %d hkv %d q %d kv %d e %d", c->name, d->name,
           val, tnames[which], h, hk, i, j, e);
  fprintf(stderr, "  %s\n", label);

  /* A bias of -inf on key j is a score of -inf: the element is removed as a
   * mask would (docs/language.md). */
  bool removed = c->masked || (which == T_BUF && c->grad && val == -INFINITY);

  /* Forward on both. */
  tl_call_forward(&t);
  check_reference_forward(label, &t, c, which, val, qrow, removed);
  /* An infinity in Q or K makes some s = -inf: those elements are removed
   * too, and a kernel's 0 * inf there may give NaN. */
  bool allow = removed || which == T_K || which == T_Q;
  compare("out", label, &t, TL_OUT, d->tol, allow);
  compare("lse", label, &t, TL_LSE, d->tol, allow);

  /* Backward: both read the reference's O and LSE, rounded as the kernels read them. */
  tl_call_ref_outputs(&t);
  tl_call_backward(&t);
  int64_t bad = count_nonfinite(&t.dq[1].a) + count_nonfinite(&t.dk[1].a) + count_nonfinite(&t.dv[1].a);
  if (removed)
    ck_assert_msg(bad == 0, "%s: a masked non-finite element reached the reference's gradients", label);
  else
    ck_assert_msg(bad > 0, "%s: a kept non-finite input left every gradient finite", label);
  compare("dq", label, &t, TL_DQ, d->gtol, allow);
  compare("dk", label, &t, TL_DK, d->gtol, allow);
  compare("dv", label, &t, TL_DV, d->gtol, allow);
  if (c->grad) compare("dbias", label, &t, TL_DBUF, d->gtol, allow);
  tl_call_free(&t);
}

static const double values[3] = {NAN, INFINITY, -INFINITY};

/* _i = (dtype fp32 or fp16) * 3 + value: Q, K, V, dO on the identity
 * score, kept. */
START_TEST(kept_inputs) {
  int di = _i / 3 == 0 ? 0 : 1;
  for (int w = T_Q; w <= T_DO; w++) run_case(0, di, w, values[_i % 3]);
}
END_TEST

/* Float buffers: a grad buffer and a buffer multiplied by kv - q. */
START_TEST(kept_buffers) {
  int di = _i / 3 == 0 ? 0 : 1;
  run_case(1, di, T_BUF, values[_i % 3]);
  run_case(2, di, T_BUF, values[_i % 3]);
}
END_TEST

/* Q, K, V, dO where the mask removes them. */
START_TEST(masked_inputs) {
  int di = _i / 3 == 0 ? 0 : 1;
  for (int w = T_Q; w <= T_DO; w++) run_case(3, di, w, values[_i % 3]);
}
END_TEST

int main(void) {
  rng = tl_seed();
  tl_one_process(); /* the emulator's modules serve several tests */
  return TL_MAIN("nonfinite", 300, TL_LOOP(kept_inputs, 6), TL_LOOP(kept_buffers, 6),
                 TL_LOOP(masked_inputs, 6));
}
