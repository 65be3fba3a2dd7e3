/* Split-KV decoding on the emulator (docs/decoding.md): the key range cut
 * into chunks run by separate CTAs, their partial O and LSE merged by
 * flex_fwd_combine, against the float64 reference.
 *
 *  - decoding shapes: Q_LEN 1, 4 and 16, KV_LEN up to 3000 (fp32; the
 *    16-bit kernels are slower to emulate, up to 1500), GQA 8:1 and
 *    H = HKV; lower-right causal with ALiBi, a sliding window with a tanh
 *    softcap, no mask, and a mask reading buffers (a BlockMask built on
 *    the device) with a fully masked row and long runs of dead keys, so
 *    that some chunks of every row have no live key; fp32 (flex_fwd_simt),
 *    fp16 and bf16 (flex_fwd_tc); dropout;
 *  - per case the splits 1, 2, 3, 7 and automatic: O and LSE (every
 *    element, LSE's -inf rows included) within the dtype's tolerance of
 *    the reference, and each split within it of the unsplit run; the run
 *    statistics say how many chunks ran (a forced count clamped to the
 *    key tiles) and that the chunks together visited exactly the unsplit
 *    run's tiles;
 *  - +inf and NaN logits in one chunk of a row: LSE +inf / NaN and O NaN,
 *    as the unsplit kernel gives (docs/language.md);
 *  - a paged K/V cache and a packed (varlen) batch, split per sequence;
 *  - grouped-query packing: on exactly for GQA calls without lists or
 *    dropout; packed against unpacked ($FLEXC_PACK_GQA=0) results and tile
 *    counts, with a per-head window and ALiBi;
 *  - kv_splits < 0 is FLEX_ERR_INVALID with a message; the reference and
 *    cpu backends accept and ignore a count.
 *
 * Fresh random inputs every run (tl_seed); outputs are poisoned with NaN
 * before every run.
 *
 * --cuda runs the decoding shapes, the grouped-query packing, the paged
 * and the packed splits on the GPU (132 SMs on an H100: the automatic
 * counts are its own); it exits 77 where there is no CUDA device. Each of
 * those runs every split of a case before asserting anything, so that a
 * case compiles the same kernels whatever its results (the GPU run's
 * kernel cache is filled by running them over a stand-in driver). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"
#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;
static flex_backend dev = FLEX_BACKEND_EMU; /* the backend under test (--cuda: the GPU) */

/* Lower-right causal (query i is absolute position i + KV_LEN - Q_LEN) with ALiBi. */
static const char *const causal_alibi =
    "buffer slopes: f32[H];\n"
    "score alibi(s, b, h, q, kv) { return s + slopes[h] * float(kv - (q + KV_LEN - Q_LEN)); }\n"
    "mask causal(b, h, q, kv) { return q + KV_LEN - Q_LEN >= kv; }\n";
/* A lower-right sliding window with a tanh softcap. */
static const char *const window_softcap =
    "param int window = 300;\nparam float cap = 5.0;\n"
    "score softcap(s, b, h, q, kv) { return cap * tanh(s / cap); }\n"
    "mask sliding(b, h, q, kv) { let d = q + KV_LEN - Q_LEN - kv; return d >= 0 && d < window; }\n";
/* A window per head (wider for later heads) with ALiBi: under grouped-query
 * packing the classifier and both functions must see each row's own head. */
static const char *const head_window =
    "buffer slopes: f32[H];\n"
    "score alibi(s, b, h, q, kv) { return s + slopes[h] * float(kv - (q + KV_LEN - Q_LEN)); }\n"
    "mask hwin(b, h, q, kv) { let d = q + KV_LEN - Q_LEN - kv; return d >= 0 && d < 40 * (h + 1); }\n";
/* No mask, identity score. */
static const char *const plain = "score ident(s, b, h, q, kv) { return s; }\n";
/* Undecidable: the runtime builds the BlockMask (the walk's list mode). */
static const char *const live_mask =
    "buffer qlive: i32[Q_LEN];\nbuffer klive: i32[KV_LEN];\n"
    "mask live(b, h, q, kv) { return qlive[q] != 0 && klive[kv] != 0; }\n";
/* A bias per element: +inf and NaN logits placed by the test. */
static const char *const bias_score =
    "buffer bias: f32[Q_LEN, KV_LEN];\n"
    "score biased(s, b, h, q, kv) { return s + bias[q, kv]; }\n";

typedef enum Bufs { B_NONE, B_SLOPES, B_LIVE, B_BIAS } Bufs;

typedef struct Case {
  const char *name, *src;
  Bufs bufs;
  int dt; /* tl_dtypes index: 0 fp32, 1 fp16, 2 bf16 */
  int B, H, HKV, QL, KL, E, EV;
  float drop;
} Case;

static flex_kernel *load(const char *src) { return tl_load(NULL, "splitkv", src); }

/* The buffers of a case (host arrays shared by both backends). */
typedef struct Buffers {
  RtArray a[2];
  DLTensor t[2];
  flex_buffer fb[2];
  int n;
} Buffers;

static void buffers_init(Buffers *bf, const Case *c) {
  memset(bf, 0, sizeof *bf);
  DLDataType f32 = rt_dtype(kDLFloat, 32), i32 = rt_dtype(kDLInt, 32);
  if (c->bufs == B_SLOPES) {
    int64_t s[1] = {c->H};
    rt_array_init(&bf->a[0], f32, 1, s);
    for (int h = 0; h < c->H; h++) rt_array_set(&bf->a[0], h, exp2(-8.0 * (h + 1) / c->H));
    bf->fb[0].name = "slopes", bf->n = 1;
  } else if (c->bufs == B_LIVE) {
    /* Query row 1 (row 0 of a single query) sees nothing; keys live in a
     * few random runs, so that most chunks of a row have no live key. */
    int64_t sq[1] = {c->QL}, sk[1] = {c->KL};
    rt_array_init(&bf->a[0], i32, 1, sq), rt_array_init(&bf->a[1], i32, 1, sk);
    for (int i = 0; i < c->QL; i++) rt_array_set(&bf->a[0], i, c->QL == 1 || i != 1);
    for (int run = 0; run < 3; run++) {
      int len = 8 + (int)(tl_uniform(&rng) * 40), at = (int)(tl_uniform(&rng) * (c->KL - len));
      for (int j = at; j < at + len; j++) rt_array_set(&bf->a[1], j, 1);
    }
    bf->fb[0].name = "qlive", bf->fb[1].name = "klive", bf->n = 2;
  } else if (c->bufs == B_BIAS) {
    int64_t s[2] = {c->QL, c->KL};
    rt_array_init(&bf->a[0], f32, 2, s);
    for (int64_t e = 0; e < (int64_t)c->QL * c->KL; e++)
      rt_array_set(&bf->a[0], e, tl_uniform(&rng) - 0.5);
    /* row 0: one +inf logit; row 1: one NaN; each in a random chunk */
    rt_array_set(&bf->a[0], (int64_t)(tl_uniform(&rng) * c->KL), INFINITY);
    rt_array_set(&bf->a[0], c->KL + (int64_t)(tl_uniform(&rng) * c->KL), NAN);
    bf->fb[0].name = "bias", bf->n = 1;
  }
  for (int i = 0; i < bf->n; i++) {
    bf->t[i] = rt_array_tensor(&bf->a[i]);
    bf->fb[i].tensor = &bf->t[i];
  }
}

static void buffers_free(Buffers *bf) {
  for (int i = 0; i < bf->n; i++) rt_array_free(&bf->a[i]);
}

/* Relative norm error of x against y, both host arrays of the same count;
 * equal infinities (LSE of a fully masked row) are exact; NaN fails. */
static double rel_err(const RtArray *x, const RtArray *y) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < rt_array_count(x); i++) {
    double a = rt_array_get(x, i), b = rt_array_get(y, i);
    if (isinf(b) && a == b) continue;
    if (!isfinite(a) || !isfinite(b)) return INFINITY;
    num += (a - b) * (a - b), den += b * b;
  }
  return den > 0 ? sqrt(num / den) : INFINITY;
}

static void copy_array(RtArray *dst, const RtArray *src) {
  for (int64_t i = 0; i < rt_array_count(src); i++) rt_array_set(dst, i, rt_array_get(src, i));
}

/* Every element NaN: an output the run does not write fails. */
static void poison(TlPair *p) {
  for (int64_t i = 0; i < rt_array_count(&p->x); i++) rt_array_set(&p->x, i, NAN);
}

/* The tensors of one call, each as the backend sees it (x) and as float64
 * for the reference (ref), and the emulator's and the reference's argument
 * blocks wired to them; lse has rank - 1 dimensions. */
typedef struct Run {
  TlPair q, k, v, out, lse;
  flex_args a, r;
} Run;

static void run_init(Run *u, DLDataType dt, int rank, const int64_t *qs, const int64_t *ks,
                     const int64_t *vs, const int64_t *os, const int64_t *ls, const Buffers *bf) {
  memset(u, 0, sizeof *u);
  tl_pair_init(&u->q, dt, rank, qs, true, &rng), tl_pair_init(&u->k, dt, rank, ks, true, &rng);
  tl_pair_init(&u->v, dt, rank, vs, true, &rng), tl_pair_init(&u->out, dt, rank, os, false, &rng);
  tl_pair_init(&u->lse, rt_dtype(kDLFloat, 32), rank - 1, ls, false, &rng);
  flex_args *a = &u->a, *r = &u->r;
  a->backend = dev, r->backend = FLEX_BACKEND_REFERENCE;
  a->q = &u->q.tx, a->k = &u->k.tx, a->v = &u->v.tx, a->out = &u->out.tx, a->lse = &u->lse.tx;
  r->q = &u->q.tref, r->k = &u->k.tref, r->v = &u->v.tref, r->out = &u->out.tref;
  r->lse = &u->lse.tref;
  if (bf) a->buffers = r->buffers = bf->fb, a->nbuffers = r->nbuffers = bf->n;
}

static void run_free(Run *u) {
  TlPair *all[] = {&u->q, &u->k, &u->v, &u->out, &u->lse};
  for (int i = 0; i < 5; i++) tl_pair_free(all[i]);
}

/* a's forward with O and LSE poisoned first; its relative errors against
 * the reference's (which ran before) in *eo and *el. */
static void run_forward(Run *u, flex_kernel *k, const char *what, double *eo, double *el) {
  poison(&u->out), poison(&u->lse);
  ck_assert_msg(tl_call(k, &u->a, false) == FLEX_OK, "%s: %s", what, flex_last_error());
  *eo = rel_err(&u->out.x, &u->out.ref), *el = rel_err(&u->lse.x, &u->lse.ref);
}

static void run_reference(Run *u, flex_kernel *k) {
  ck_assert_msg(flex_forward(k, &u->r) == FLEX_OK, "reference: %s", flex_last_error());
}

static const Case cases[] = {
    {"gqa8 q1 causal alibi fp32", causal_alibi, B_SLOPES, 0, 1, 8, 1, 1, 1000, 64, 64, 0},
    {"gqa8 q4 window softcap bf16", window_softcap, B_NONE, 2, 1, 8, 1, 4, 777, 64, 64, 0},
    {"mha q16 causal alibi fp16", causal_alibi, B_SLOPES, 1, 1, 4, 4, 16, 1500, 64, 48, 0},
    {"gqa8 q1 plain fp32", plain, B_NONE, 0, 1, 8, 1, 1, 3000, 64, 64, 0},
    {"gqa8 q1 plain fp16", plain, B_NONE, 1, 1, 8, 1, 1, 1200, 64, 64, 0},
    {"gqa8 q16 head window fp32", head_window, B_SLOPES, 0, 2, 8, 1, 16, 500, 32, 32, 0},
    {"gqa4 q16 head window bf16", head_window, B_SLOPES, 2, 1, 8, 2, 16, 450, 64, 64, 0},
    {"mha q4 live lists fp32", live_mask, B_LIVE, 0, 2, 2, 2, 4, 700, 32, 40, 0},
    {"gqa8 q16 live lists bf16", live_mask, B_LIVE, 2, 1, 8, 1, 16, 900, 64, 64, 0},
    {"gqa4 q4 causal dropout fp32", causal_alibi, B_SLOPES, 0, 1, 4, 1, 4, 500, 32, 32, 0.25f},
    {"gqa4 q4 causal dropout bf16", causal_alibi, B_SLOPES, 2, 1, 4, 1, 4, 600, 64, 64, 0.25f},
};

/* One case, splits 1, 2, 3, 7 and automatic. */
START_TEST(decoding) {
  const Case *c = &cases[_i];
  const TlDtype *td = &tl_dtypes[c->dt];
  flex_kernel *k = load(c->src);
  int64_t qs[4] = {c->B, c->H, c->QL, c->E}, ks[4] = {c->B, c->HKV, c->KL, c->E};
  int64_t vs[4] = {c->B, c->HKV, c->KL, c->EV}, os[4] = {c->B, c->H, c->QL, c->EV};
  int64_t ls[3] = {c->B, c->H, c->QL};
  RtArray o1, l1; /* the unsplit run */
  rt_array_init(&o1, rt_dtype(kDLFloat, 64), 4, os), rt_array_init(&l1, rt_dtype(kDLFloat, 64), 3, ls);
  Buffers bf;
  buffers_init(&bf, c);
  Run u;
  run_init(&u, rt_dtype(td->code, td->bits), 4, qs, ks, vs, os, ls, &bf);
  uint64_t seed = tl_rand(&rng);
  u.a.dropout_p = u.r.dropout_p = c->drop, u.a.dropout_seed = u.r.dropout_seed = seed;
  run_reference(&u, k);
  /* every case has more than 7 key tiles (BN <= 64), so a forced count runs as given */
  const int splits[5] = {1, 2, 3, 7, 0};
  RtRunStats st[5];
  double eo[5], el[5], so[5], sl[5];
  for (int t = 0; t < 5; t++) {
    u.a.kv_splits = splits[t];
    run_forward(&u, k, c->name, &eo[t], &el[t]);
    st[t] = rt_run_last_stats();
    so[t] = t ? rel_err(&u.out.x, &o1) : 0, sl[t] = t ? rel_err(&u.lse.x, &l1) : 0;
    fprintf(stderr, "  %-30s splits %d -> %2d%s (tiles %llu): out %.2g lse %.2g; vs unsplit %.2g %.2g\n",
            c->name, splits[t], st[t].kv_splits, st[t].pack_gqa ? " packed" : "",
            (unsigned long long)st[t].fwd_tiles, eo[t], el[t], so[t], sl[t]);
    if (t == 0) copy_array(&o1, &u.out.x), copy_array(&l1, &u.lse.x);
  }
  for (int t = 0; t < 5; t++) {
    /* grouped-query packing: on for GQA without lists or dropout (every case has Q_LEN <= 16) */
    bool pack = c->H > c->HKV && c->bufs != B_LIVE && c->drop == 0 && !getenv("FLEXC_PACK_GQA");
    ck_assert_msg(st[t].pack_gqa == pack, "%s: packed %d, want %d", c->name, st[t].pack_gqa, pack);
    if (splits[t]) {
      ck_assert_msg(st[t].kv_splits == splits[t], "%s: kv_splits %d ran %d chunks", c->name,
                    splits[t], st[t].kv_splits);
    } else {
      /* a decoding grid is far below the device's SMs (108 on the emulator, 132 on an H100):
       * it splits, each chunk >= 2 tiles */
      ck_assert_msg(st[t].kv_splits >= 2 && st[t].kv_splits <= CG_SPLIT_MAX &&
                        st[t].kv_splits * 2 * 32 <= c->KL + 63,
                    "%s: automatic split ran %d chunks", c->name, st[t].kv_splits);
    }
    ck_assert_msg(st[t].fwd_tiles == st[0].fwd_tiles, "%s split %d: %llu tiles visited, unsplit %llu",
                  c->name, st[t].kv_splits, (unsigned long long)st[t].fwd_tiles,
                  (unsigned long long)st[0].fwd_tiles);
    ck_assert_msg(eo[t] < td->tol && el[t] < td->tol, "%s split %d: out %g lse %g (tol %g)", c->name,
                  st[t].kv_splits, eo[t], el[t], td->tol);
    ck_assert_msg(so[t] < td->tol && sl[t] < td->tol, "%s split %d against unsplit: out %g lse %g",
                  c->name, st[t].kv_splits, so[t], sl[t]);
  }
  if (c->bufs == B_LIVE) /* the fully masked row: O = 0, LSE = -inf */
    for (int h = 0; h < c->H && c->QL > 1; h++) {
      ck_assert(rt_array_get(&u.lse.x, (int64_t)h * c->QL + 1) == -INFINITY);
      for (int e = 0; e < c->EV; e++)
        ck_assert(rt_array_get(&u.out.x, ((int64_t)h * c->QL + 1) * c->EV + e) == 0.0);
    }
  run_free(&u);
  rt_array_free(&o1), rt_array_free(&l1);
  buffers_free(&bf);
  flex_kernel_free(k);
}
END_TEST

/* Grouped-query packing against the same call unpacked ($FLEXC_PACK_GQA=0):
 * both against the reference and each other, and the packed walk visits
 * 1 / G of the tiles (each K/V tile once per group: the masks here do not
 * depend on the head, or, for the head window, the unpacked count is at
 * least the packed one). _i: cases[] index of a GQA case. */
START_TEST(gqa_packing) {
  static const int which[4] = {0, 1, 5, 6}; /* causal fp32, window bf16, head windows fp32 / bf16 */
  const Case *c = &cases[which[_i]];
  const TlDtype *td = &tl_dtypes[c->dt];
  flex_kernel *k = load(c->src);
  int64_t qs[4] = {c->B, c->H, c->QL, c->E}, ks[4] = {c->B, c->HKV, c->KL, c->E};
  int64_t vs[4] = {c->B, c->HKV, c->KL, c->EV}, os[4] = {c->B, c->H, c->QL, c->EV};
  int64_t ls[3] = {c->B, c->H, c->QL};
  RtArray o1, l1; /* the packed run */
  rt_array_init(&o1, rt_dtype(kDLFloat, 64), 4, os), rt_array_init(&l1, rt_dtype(kDLFloat, 64), 3, ls);
  Buffers bf;
  buffers_init(&bf, c);
  Run u;
  run_init(&u, rt_dtype(td->code, td->bits), 4, qs, ks, vs, os, ls, &bf);
  u.a.kv_splits = 1;
  run_reference(&u, k);
  uint64_t tiles[2];
  bool packed[2];
  double eo[2], el[2], so[2], sl[2];
  for (int t = 0; t < 2; t++) {
    if (t) setenv("FLEXC_PACK_GQA", "0", 1);
    run_forward(&u, k, c->name, &eo[t], &el[t]);
    RtRunStats st = rt_run_last_stats();
    tiles[t] = st.fwd_tiles, packed[t] = st.pack_gqa;
    so[t] = t ? rel_err(&u.out.x, &o1) : 0, sl[t] = t ? rel_err(&u.lse.x, &l1) : 0;
    fprintf(stderr, "  %-30s %s: tiles %llu, out %.2g lse %.2g; packed vs unpacked %.2g %.2g\n",
            c->name, t ? "unpacked" : "packed  ", (unsigned long long)st.fwd_tiles, eo[t], el[t],
            so[t], sl[t]);
    if (t == 0) copy_array(&o1, &u.out.x), copy_array(&l1, &u.lse.x);
  }
  for (int t = 0; t < 2; t++) {
    ck_assert(packed[t] == (t == 0));
    ck_assert_msg(eo[t] < td->tol && el[t] < td->tol, "%s: out %g lse %g", c->name, eo[t], el[t]);
    ck_assert_msg(so[t] < td->tol && sl[t] < td->tol, "%s: packed vs unpacked out %g lse %g", c->name,
                  so[t], sl[t]);
  }
  unsetenv("FLEXC_PACK_GQA");
  const uint64_t G = (uint64_t)(c->H / c->HKV);
  if (c->src == head_window) ck_assert(tiles[1] >= tiles[0] && tiles[0] > 0);
  else ck_assert_msg(tiles[1] == G * tiles[0], "unpacked %llu tiles, packed %llu, G %llu",
                     (unsigned long long)tiles[1], (unsigned long long)tiles[0], (unsigned long long)G);
  run_free(&u);
  rt_array_free(&o1), rt_array_free(&l1);
  buffers_free(&bf);
  flex_kernel_free(k);
}
END_TEST

/* +inf and NaN logits in one chunk of rows 0 and 1: LSE +inf and NaN, O
 * NaN, whatever the split; the other rows as the reference. _i: fp32, bf16. */
START_TEST(nonfinite_logits) {
  const Case c = {"bias", bias_score, B_BIAS, _i ? 2 : 0, 1, 2, 1, 4, 400, 32, 32, 0};
  const TlDtype *td = &tl_dtypes[c.dt];
  flex_kernel *k = load(c.src);
  int64_t qs[4] = {1, c.H, c.QL, c.E}, ks[4] = {1, c.HKV, c.KL, c.E}, ls[3] = {1, c.H, c.QL};
  Buffers bf;
  buffers_init(&bf, &c);
  Run u;
  run_init(&u, rt_dtype(td->code, td->bits), 4, qs, ks, ks, qs, ls, &bf);
  run_reference(&u, k);
  const int splits[3] = {1, 5, 0};
  for (int t = 0; t < 3; t++) {
    double eo, el; /* not finite here: the rows are checked one by one below */
    u.a.kv_splits = splits[t];
    run_forward(&u, k, "nonfinite", &eo, &el);
    int ran = rt_run_last_stats().kv_splits;
    ck_assert(splits[t] != 5 || ran == 5);
    double num = 0, den = 0;
    for (int h = 0; h < c.H; h++)
      for (int i = 0; i < c.QL; i++) {
        int64_t row = (int64_t)h * c.QL + i;
        double l = rt_array_get(&u.lse.x, row), lr = rt_array_get(&u.lse.ref, row);
        if (i == 0) ck_assert_msg(l == INFINITY && lr == INFINITY, "split %d h %d: LSE %g, ref %g", ran, h, l, lr);
        if (i == 1) ck_assert_msg(isnan(l) && isnan(lr), "split %d h %d: LSE %g, ref %g", ran, h, l, lr);
        for (int e = 0; e < c.EV; e++) {
          double o = rt_array_get(&u.out.x, row * c.EV + e), orf = rt_array_get(&u.out.ref, row * c.EV + e);
          if (i < 2) {
            ck_assert_msg(isnan(o) && isnan(orf), "split %d h %d row %d: O %g, ref %g", ran, h, i, o, orf);
          } else {
            ck_assert_msg(isfinite(o), "split %d h %d row %d: O %g", ran, h, i, o);
            num += (o - orf) * (o - orf), den += orf * orf;
          }
        }
        if (i >= 2) ck_assert_msg(fabs(l - lr) <= td->tol * (1 + fabs(lr)), "lse %g ref %g", l, lr);
      }
    double err = sqrt(num / den);
    fprintf(stderr, "  nonfinite %s splits %d -> %d: rows 0, 1 +inf / NaN; others %.2g\n", td->name,
            splits[t], ran, err);
    ck_assert_msg(den > 0 && err < td->tol, "split %d: finite rows err %g", ran, err);
  }
  run_free(&u);
  buffers_free(&bf);
  flex_kernel_free(k);
}
END_TEST

/* A paged cache: B = 2 sequences of kv_lens 700 and 333 in pages of 64
 * scattered over a pool in reverse order; GQA 8:1, Q_LEN 1 and 4; the
 * reference gathers the same pool. _i: fp32, bf16. */
START_TEST(paged_split) {
  const TlDtype *td = &tl_dtypes[_i ? 2 : 0];
  DLDataType i32 = rt_dtype(kDLInt, 32);
  enum { B = 2, H = 8, HKV = 1, E = 64, PS = 64, MP = 12, NP = 2 * MP };
  const int lens[B] = {700, 333}, QL = _i ? 4 : 1;
  const Case c = {"paged", causal_alibi, B_SLOPES, 0, B, H, HKV, QL, 700, E, E, 0};
  flex_kernel *k = load(c.src);
  int64_t qs[4] = {B, H, QL, E}, ps[4] = {NP, PS, HKV, E}, ls[3] = {B, H, QL};
  int64_t pts[2] = {B, MP}, kls[1] = {B};
  RtArray pt, kl;
  rt_array_init(&pt, i32, 2, pts), rt_array_init(&kl, i32, 1, kls);
  for (int b = 0; b < B; b++) {
    rt_array_set(&kl, b, lens[b]);
    for (int i = 0; i < MP; i++) rt_array_set(&pt, b * MP + i, NP - 1 - (b * MP + i)); /* reversed */
  }
  DLTensor tpt = rt_array_tensor(&pt), tkl = rt_array_tensor(&kl);
  Buffers bf;
  buffers_init(&bf, &c);
  Run u;
  run_init(&u, rt_dtype(td->code, td->bits), 4, qs, ps, ps, qs, ls, &bf);
  u.a.page_table = u.r.page_table = &tpt, u.a.kv_lens = u.r.kv_lens = &tkl;
  u.r.kv_splits = 3; /* accepted and ignored by the reference */
  run_reference(&u, k);
  const int splits[3] = {1, 3, 0};
  int ran[3];
  double eo[3], el[3];
  for (int t = 0; t < 3; t++) {
    u.a.kv_splits = splits[t];
    run_forward(&u, k, "paged", &eo[t], &el[t]);
    ran[t] = rt_run_last_stats().kv_splits;
    fprintf(stderr, "  paged %s Q_LEN %d splits %d -> %d: out %.2g lse %.2g\n", td->name, QL,
            splits[t], ran[t], eo[t], el[t]);
  }
  for (int t = 0; t < 3; t++) {
    ck_assert(splits[t] == 0 ? ran[t] > 1 : ran[t] == splits[t]);
    ck_assert_msg(eo[t] < td->tol && el[t] < td->tol, "paged split %d: out %g lse %g", ran[t], eo[t],
                  el[t]);
  }
  run_free(&u);
  rt_array_free(&pt), rt_array_free(&kl);
  buffers_free(&bf);
  flex_kernel_free(k);
}
END_TEST

/* A packed batch of three sequences (1, 4 and 2 queries; 900, 130 and 40
 * keys), a sliding window with a softcap, split per sequence. _i: fp32, fp16. */
START_TEST(varlen_split) {
  const TlDtype *td = &tl_dtypes[_i ? 1 : 0];
  DLDataType i32 = rt_dtype(kDLInt, 32);
  enum { NS = 3, H = 8, HKV = 1, E = 32 };
  static const int32_t cq[NS + 1] = {0, 1, 5, 7}, ck[NS + 1] = {0, 900, 1030, 1070};
  const int TQ = cq[NS], TK = ck[NS];
  flex_kernel *k = load(window_softcap);
  int64_t qs[3] = {TQ, H, E}, ks[3] = {TK, HKV, E}, ls[2] = {H, TQ}, cs[1] = {NS + 1};
  RtArray cuq, cuk;
  rt_array_init(&cuq, i32, 1, cs), rt_array_init(&cuk, i32, 1, cs);
  for (int s = 0; s <= NS; s++) rt_array_set(&cuq, s, cq[s]), rt_array_set(&cuk, s, ck[s]);
  DLTensor tcq = rt_array_tensor(&cuq), tck = rt_array_tensor(&cuk);
  flex_param win = {"window", 500};
  Run u;
  run_init(&u, rt_dtype(td->code, td->bits), 3, qs, ks, ks, qs, ls, NULL);
  u.a.cu_seqlens_q = u.r.cu_seqlens_q = &tcq, u.a.cu_seqlens_kv = u.r.cu_seqlens_kv = &tck;
  u.a.params = u.r.params = &win, u.a.nparams = u.r.nparams = 1;
  run_reference(&u, k);
  const int splits[3] = {1, 2, 0};
  int ran[3];
  double eo[3], el[3];
  for (int t = 0; t < 3; t++) {
    u.a.kv_splits = splits[t];
    run_forward(&u, k, "packed", &eo[t], &el[t]);
    ran[t] = rt_run_last_stats().kv_splits; /* the most of any sequence */
    fprintf(stderr, "  packed %s splits %d -> %d: out %.2g lse %.2g\n", td->name, splits[t], ran[t],
            eo[t], el[t]);
  }
  for (int t = 0; t < 3; t++) {
    ck_assert(splits[t] == 0 ? ran[t] > 2 : ran[t] == splits[t]);
    ck_assert_msg(eo[t] < td->tol && el[t] < td->tol, "packed split %d: out %g lse %g", ran[t], eo[t],
                  el[t]);
  }
  run_free(&u);
  rt_array_free(&cuq), rt_array_free(&cuk);
  flex_kernel_free(k);
}
END_TEST

/* A forced count above the key tiles runs one chunk per tile: fp32 tiles
 * are 32 keys (docs/kernels.md), so 100 keys are 4 tiles. */
START_TEST(clamped) {
  const TlDtype *td = &tl_dtypes[0];
  flex_kernel *k = load(causal_alibi);
  const Case c = {"clamp", causal_alibi, B_SLOPES, 0, 1, 2, 2, 3, 100, 16, 16, 0};
  int64_t s[4] = {1, 2, 3, 16}, ks[4] = {1, 2, 100, 16}, ls[3] = {1, 2, 3};
  Buffers bf;
  buffers_init(&bf, &c);
  Run u;
  run_init(&u, rt_dtype(kDLFloat, 32), 4, s, ks, ks, s, ls, &bf);
  u.a.kv_splits = 7;
  run_reference(&u, k);
  double eo, el;
  run_forward(&u, k, "clamped", &eo, &el);
  ck_assert_int_eq(rt_run_last_stats().kv_splits, 4);
  ck_assert_msg(eo < td->tol && el < td->tol, "out %g lse %g", eo, el);
  run_free(&u);
  buffers_free(&bf);
  flex_kernel_free(k);
}
END_TEST

/* --arch sm_90a: the wgmma forward runs a call unsplit and unpacked; one
 * that asks for chunks runs on the sm_80 forward, split; both match the
 * reference (docs/decoding.md "Where it applies"). */
START_TEST(sm90a_falls_back) {
  const TlDtype *td = &tl_dtypes[1];
  flex_kernel *k = load(causal_alibi);
  const Case c = {"sm90a", causal_alibi, B_SLOPES, 1, 1, 2, 2, 4, 600, 64, 64, 0};
  int64_t s[4] = {1, 2, 4, 64}, ks[4] = {1, 2, 600, 64}, ls[3] = {1, 2, 4};
  Buffers bf;
  buffers_init(&bf, &c);
  const int want[2] = {3, 0};
  for (int t = 0; t < 2; t++) {
    Run u;
    run_init(&u, rt_dtype(td->code, td->bits), 4, s, ks, ks, s, ls, &bf);
    u.a.arch = "sm_90a";
    u.a.kv_splits = want[t];
    run_reference(&u, k);
    double eo, el;
    run_forward(&u, k, "sm_90a", &eo, &el);
    RtRunStats st = rt_run_last_stats();
    ck_assert_msg(st.fwd_sm90 == (want[t] == 0), "kv_splits %d: sm_90a body %d", want[t], st.fwd_sm90);
    ck_assert_int_eq(st.kv_splits, want[t] ? want[t] : 1);
    fprintf(stderr, "  sm_90a kv_splits %d: out %.2e lse %.2e\n", want[t], eo, el);
    ck_assert_msg(eo < td->tol && el < td->tol, "kv_splits %d: out %g lse %g", want[t], eo, el);
    run_free(&u);
  }
  buffers_free(&bf);
  flex_kernel_free(k);
}
END_TEST

/* The cpu backend (where built) computes rows whole: a forced count is
 * accepted and ignored (one chunk ran), the result still the reference's. */
START_TEST(cpu_ignores) {
  if (!rt_cpu_available()) {
    fprintf(stderr, "  cpu backend not built or not starting: %s\n", flex_last_error());
    return;
  }
  const Case *c = &cases[0];
  flex_kernel *k = load(c->src);
  int64_t qs[4] = {c->B, c->H, c->QL, c->E}, ks[4] = {c->B, c->HKV, c->KL, c->E};
  int64_t ls[3] = {c->B, c->H, c->QL};
  Buffers bf;
  buffers_init(&bf, c);
  Run u;
  run_init(&u, rt_dtype(kDLFloat, 32), 4, qs, ks, ks, qs, ls, &bf);
  u.a.backend = FLEX_BACKEND_CPU;
  u.a.kv_splits = 7;
  run_reference(&u, k);
  double eo, el;
  run_forward(&u, k, "cpu", &eo, &el);
  RtRunStats st = rt_run_last_stats();
  fprintf(stderr, "  cpu kv_splits 7 -> %d chunk(s): out %.2g lse %.2g\n", st.kv_splits, eo, el);
  ck_assert_int_eq(st.kv_splits, 1);
  ck_assert(!st.pack_gqa);
  ck_assert_msg(eo < 1e-4 && el < 1e-4, "cpu: out %g lse %g", eo, el);
  run_free(&u);
  buffers_free(&bf);
  flex_kernel_free(k);
}
END_TEST

/* kv_splits < 0: FLEX_ERR_INVALID naming it, on the emulator and the reference. */
START_TEST(negative_splits) {
  flex_kernel *k = load(plain);
  int64_t s[4] = {1, 2, 3, 16}, ls[3] = {1, 2, 3};
  Run u;
  run_init(&u, rt_dtype(kDLFloat, 32), 4, s, s, s, s, ls, NULL);
  flex_args *both[2] = {&u.a, &u.r};
  for (int i = 0; i < 2; i++) {
    both[i]->kv_splits = -2;
    ck_assert_int_eq(flex_forward(k, both[i]), FLEX_ERR_INVALID);
    ck_assert_msg(strstr(flex_last_error(), "kv_splits") && strstr(flex_last_error(), "-2"), "%s",
                  flex_last_error());
  }
  run_free(&u);
  flex_kernel_free(k);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("splitkv");
  TCase *t = tcase_create("emu");
  tcase_set_timeout(t, 600);
  tcase_add_loop_test(t, decoding, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_loop_test(t, gqa_packing, 0, 4);
  tcase_add_loop_test(t, nonfinite_logits, 0, 2);
  tcase_add_loop_test(t, paged_split, 0, 2);
  tcase_add_loop_test(t, varlen_split, 0, 2);
  tcase_add_test(t, clamped);
  tcase_add_test(t, sm90a_falls_back);
  tcase_add_test(t, negative_splits);
  tcase_add_test(t, cpu_ignores);
  suite_add_tcase(s, t);
  return s;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--cuda")) {
    int rc = tl_cuda_setup();
    if (rc) return rc;
    rng = tl_seed();
    dev = FLEX_BACKEND_CUDA;
    Suite *s = suite_create("cuda_splitkv");
    TCase *t = tcase_create("cuda");
    tcase_add_loop_test(t, decoding, 0, (int)(sizeof cases / sizeof cases[0]));
    tcase_add_loop_test(t, gqa_packing, 0, 4);
    tcase_add_loop_test(t, paged_split, 0, 2);
    tcase_add_loop_test(t, varlen_split, 0, 2);
    suite_add_tcase(s, t);
    return tl_run_suite(s);
  }
  if (!rt_emu_available()) {
    fprintf(stderr, "no host C++ compiler for the emulator: %s\n", flex_last_error());
    return 77;
  }
  rng = tl_seed();
  return tl_run_suite(suite());
}
