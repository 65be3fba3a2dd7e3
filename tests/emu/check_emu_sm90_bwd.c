/* The sm_90a backward (kernels/flex_bwd_sm90.cuh: K/V once and Q/dO
 * through an mbarrier ring by TMA, wgmma SS for S^T, dP^T and dQ, wgmma RS
 * for dV and dK) on the emulator against the float64 reference, through
 * the public API with flex_args.arch "sm_90a".
 *
 * Samples with a score function (softcap, alibi, relpos_bias with its
 * `grad` buffer), implicit masks (causal, sliding_window, dilated with
 * fully masked rows) and a mask the
 * runtime builds BlockMask lists for (document); fp16 and bf16; head dims
 * 64 and 128 and padded ones (72 / 40); Q_LEN and KV_LEN that miss the
 * 64-row tiles; GQA and MQA; with and without dLSE. Head dims above 128
 * (case `wide`: two consumer warpgroups splitting the dK, dV and dQ
 * columns): E = EV = 256 and 200, E = 256 with EV = 64, E = 160 with EV =
 * 136, over causal, softcap, alibi, relpos_bias, document, dilated and
 * chunked_gelu, a caller's BlockMask and a packed batch at E = 256. Each case runs the
 * forward and the backward on both backends (the emulator's backward reads
 * its own forward's O and LSE), with fresh random inputs (seed printed) and
 * NaN-poisoned outputs; dQ, dK, dV and buffer gradients are compared by
 * relative norm error (fp16 2e-2, bf16 6e-2), NaN never passes, and a
 * fully masked row's dQ must be exactly 0. Each case asserts that flex_bwd
 * was the sm_90a body (rt_run_last_stats().bwd_sm90); the fallback cases
 * (E = 15, deterministic also at E = 256) assert the sm_80 body ran and
 * still matches; a packed (cu_seqlens) batch
 * runs the sm_90a body per sequence, and so does a call with a caller's
 * BlockMask whose blocks its tiles divide.
 *
 * The default run gives every sample both dtypes once with the shapes
 * rotated; --full (CTest check_emu_sm90_bwd_full, label slow) runs the
 * cross product.
 */
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

typedef struct Shape {
  int B, H, HKV, QL, KL, E, EV;
  bool dlse;
} Shape;

static const Shape shapes[] = {
    {2, 4, 2, 77, 131, 64, 64, true},     /* GQA, two query tiles, three key tiles with tails */
    {1, 2, 1, 70, 67, 128, 128, false},   /* MQA, Q_LEN > KV_LEN, both past one tile */
    {1, 2, 2, 45, 100, 72, 40, true},     /* padded head dims (72 -> 128, 40 -> 64), EV != E */
};
#define NSHAPES ((int)(sizeof shapes / sizeof *shapes))

/* Head dims above 128: two consumer warpgroups, each with half of the dK,
 * dV and dQ columns (E and EV padded to 128 per consumer pair). */
static const Shape wide_shapes[] = {
    {1, 2, 1, 100, 130, 256, 256, true},  /* GQA, odd lengths, dLSE */
    {1, 2, 2, 90, 70, 200, 200, false},   /* 200 pads to 256, Q_LEN > KV_LEN */
    {1, 2, 1, 70, 100, 256, 64, true},    /* EV != E: dV's halves 64 columns (EV padded to 128) */
    {1, 1, 1, 66, 80, 160, 136, false},   /* both padded: 160 and 136 to 256 */
};
#define NWIDE ((int)(sizeof wide_shapes / sizeof *wide_shapes))
static const char *const wide_samples[] = {"causal",      "softcap",  "alibi",  "relpos_bias",
                                           "document",    "dilated",  "chunked_gelu"};
#define NWSAMPLES ((int)(sizeof wide_samples / sizeof *wide_samples))

static const char *const samples[] = {"causal",         "softcap", "alibi",      "document",
                                      "sliding_window", "dilated", "relpos_bias"};
#define NSAMPLES ((int)(sizeof samples / sizeof *samples))

typedef struct Extras {
  flex_param params[4];
  int np;
  TlArr buf[2], gemu[2], gref[2];
  bool grad[2];
  flex_buffer fe[2], fr[2];
  int nb;
} Extras;

static TlArr *add_buf(Extras *x, const char *name, DLDataType dt, int nd, int64_t d0, int64_t d1,
                      bool grad) {
  int i = x->nb++;
  int64_t shape[2] = {d0, d1};
  tl_arr_init(&x->buf[i], dt, nd, shape);
  x->grad[i] = grad;
  x->fe[i] = x->fr[i] = (flex_buffer){name, &x->buf[i].t, NULL};
  if (grad) {
    tl_arr_init(&x->gemu[i], rt_dtype(kDLFloat, 32), nd, shape);
    tl_arr_init(&x->gref[i], rt_dtype(kDLFloat, 64), nd, shape);
    tl_arr_poison(&x->gemu[i]), tl_arr_poison(&x->gref[i]);
    x->fe[i].grad = &x->gemu[i].t, x->fr[i].grad = &x->gref[i].t;
  }
  return &x->buf[i];
}

static void sample_extras(Extras *x, const char *name, const Shape *s) {
  DLDataType f32 = rt_dtype(kDLFloat, 32), i32 = rt_dtype(kDLInt, 32);
  memset(x, 0, sizeof *x);
  if (!strcmp(name, "alibi")) tl_arr_uniform(add_buf(x, "slopes", f32, 1, s->H, 0, false), 0.05, 0.5, &rng);
  if (!strcmp(name, "softcap")) x->params[x->np++] = (flex_param){"softcap", 2.5};
  if (!strcmp(name, "sliding_window")) x->params[x->np++] = (flex_param){"window", 10};
  if (!strcmp(name, "dilated")) x->params[x->np++] = (flex_param){"dilation", 3}; /* rows q < h % 3 see nothing */
  if (!strcmp(name, "relpos_bias")) tl_arr_normal(add_buf(x, "rel_bias", f32, 2, s->H, 9, true), &rng);
  if (!strcmp(name, "document")) { /* sorted ids, runs of random length */
    int T = s->QL > s->KL ? s->QL : s->KL;
    TlArr *d = add_buf(x, "doc", i32, 1, T, 0, false);
    int32_t id = 0;
    for (int i = 0; i < T; i++) {
      if (i && tl_uniform(&rng) < 0.05) id++;
      rt_array_set(&d->a, i, id);
    }
  }
}

/* One forward + backward on the emulator (sm_90a, `deterministic` as
 * given) and on the reference; returns whether flex_bwd was the sm_90a body. */
static bool run_shape(const char *sample, int di, const Shape *s, bool deterministic) {
  const TlDtype *d = &tl_dtypes[di];
  DLDataType dt = rt_dtype(d->code, d->bits), f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  char path[256];
  snprintf(path, sizeof path, "samples/%s.score", sample);
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_load(&k, tl_src_path(path), NULL) == FLEX_OK, "%s", flex_last_error());
  int64_t qs[4] = {s->B, s->H, s->QL, s->E}, ks[4] = {s->B, s->HKV, s->KL, s->E};
  int64_t vs[4] = {s->B, s->HKV, s->KL, s->EV}, os[4] = {s->B, s->H, s->QL, s->EV};
  TlArr q, kk, v, dout, dlse, out[2], lse[2], dq[2], dk[2], dv[2];
  tl_arr_init(&q, dt, 4, qs), tl_arr_normal(&q, &rng);
  tl_arr_init(&kk, dt, 4, ks), tl_arr_normal(&kk, &rng);
  tl_arr_init(&v, dt, 4, vs), tl_arr_normal(&v, &rng);
  tl_arr_init(&dout, dt, 4, os), tl_arr_normal(&dout, &rng);
  tl_arr_init(&dlse, f32, 3, qs), tl_arr_normal(&dlse, &rng);
  Extras x;
  sample_extras(&x, sample, s);
  bool sm90 = false;
  for (int i = 1; i >= 0; i--) {
    DLDataType o = i ? f64 : f32;
    tl_arr_init(&out[i], o, 4, os), tl_arr_init(&lse[i], o, 3, qs);
    tl_arr_init(&dq[i], o, 4, qs), tl_arr_init(&dk[i], o, 4, ks), tl_arr_init(&dv[i], o, 4, vs);
    TlArr *outs[] = {&out[i], &lse[i], &dq[i], &dk[i], &dv[i]};
    for (int j = 0; j < 5; j++) tl_arr_poison(outs[j]);
    flex_args a;
    memset(&a, 0, sizeof a);
    a.backend = i ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
    a.arch = i ? NULL : "sm_90a";
    a.deterministic = !i && deterministic;
    a.q = &q.t, a.k = &kk.t, a.v = &v.t, a.out = &out[i].t, a.lse = &lse[i].t;
    a.dout = &dout.t, a.dlse = s->dlse ? &dlse.t : NULL;
    a.dq = &dq[i].t, a.dk = &dk[i].t, a.dv = &dv[i].t;
    a.params = x.params, a.nparams = x.np, a.buffers = i ? x.fr : x.fe, a.nbuffers = x.nb;
    const char *who = i ? "reference" : "emu sm_90a";
    ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "%s forward: %s", who, flex_last_error());
    ck_assert_msg(flex_backward(k, &a) == FLEX_OK, "%s backward: %s", who, flex_last_error());
    if (!i) sm90 = rt_run_last_stats().bwd_sm90;
  }
  double eq = tl_rel_err(&dq[0].a, &dq[1].a), ek = tl_rel_err(&dk[0].a, &dk[1].a);
  double ev = tl_rel_err(&dv[0].a, &dv[1].a), eb = 0;
  for (int i = 0; i < x.nb; i++)
    if (x.grad[i]) {
      double e = tl_rel_err(&x.gemu[i].a, &x.gref[i].a);
      if (!(e <= eb)) eb = e; /* a NaN error must win */
    }
  int rows = s->B * s->H * s->QL, masked = 0;
  for (int r = 0; r < rows; r++) {
    if (rt_array_get(&lse[1].a, r) != -INFINITY) continue;
    masked++;
    for (int e = 0; e < s->E; e++) {
      double g = rt_array_get(&dq[0].a, (int64_t)r * s->E + e);
      ck_assert_msg(g == 0, "%s: fully masked row %d: dq[%d] = %g, want 0", sample, r, e, g);
    }
  }
  fprintf(stderr, "  %-15s %s B%d H%d/%d L%d/%d E%d/%d%s%s: %s body, dq %.2g dk %.2g dv %.2g "
          "dbuf %.2g, %d masked rows\n", sample, d->name, s->B, s->H, s->HKV, s->QL, s->KL, s->E,
          s->EV, s->dlse ? " dlse" : "", deterministic ? " deterministic" : "",
          sm90 ? "sm_90a" : "sm_80", eq, ek, ev, eb, masked);
  ck_assert_msg(eq < d->gtol && ek < d->gtol && ev < d->gtol && eb < d->gtol,
                "%s %s E%d: gradient error dq %g dk %g dv %g dbuf %g", sample, d->name, s->E, eq,
                ek, ev, eb);
  TlArr *all[] = {&q, &kk, &v, &dout, &dlse};
  for (int j = 0; j < 5; j++) tl_arr_free(all[j]);
  for (int i = 0; i < 2; i++) {
    TlArr *outs[] = {&out[i], &lse[i], &dq[i], &dk[i], &dv[i]};
    for (int j = 0; j < 5; j++) tl_arr_free(outs[j]);
  }
  for (int i = 0; i < x.nb; i++) {
    tl_arr_free(&x.buf[i]);
    if (x.grad[i]) tl_arr_free(&x.gemu[i]), tl_arr_free(&x.gref[i]);
  }
  flex_kernel_free(k);
  return sm90;
}

/* Default: every sample x {fp16, bf16}, shapes rotated so that each dtype
 * meets every shape. */
START_TEST(sample_default) {
  int si = _i / 2, di = 1 + _i % 2, shi = (si + _i % 2) % 2;
  ck_assert_msg(run_shape(samples[si], di, &shapes[shi], false), "%s: the sm_80 body ran", samples[si]);
}
END_TEST

START_TEST(sample_full) {
  int si = _i / (2 * NSHAPES), di = 1 + _i / NSHAPES % 2;
  ck_assert_msg(run_shape(samples[si], di, &shapes[_i % NSHAPES], false), "%s: the sm_80 body ran",
                samples[si]);
}
END_TEST

/* Head dims above 128, default: each sample once, the dtypes alternating
 * and the shapes rotated (fp16 and bf16 each meet several shapes). */
START_TEST(wide_default) {
  ck_assert_msg(run_shape(wide_samples[_i], 1 + _i % 2, &wide_shapes[_i % NWIDE], false),
                "%s: the sm_80 body ran", wide_samples[_i]);
}
END_TEST

START_TEST(wide_full) {
  int si = _i / (2 * NWIDE), di = 1 + _i / NWIDE % 2;
  ck_assert_msg(run_shape(wide_samples[si], di, &wide_shapes[_i % NWIDE], false),
                "%s: the sm_80 body ran", wide_samples[si]);
}
END_TEST

/* Padded head dims (72 -> 128, 40 -> 64): TMA zero-fills the panels. */
START_TEST(padded_dims) {
  ck_assert_msg(run_shape("relpos_bias", 2, &shapes[2], false), "the sm_80 body ran");
}
END_TEST

/* What the sm_90a body does not do runs the sm_80 backward, correctly:
 * E = 15 (rows TMA cannot load), a deterministic backward (also at E = 256). */
START_TEST(fallbacks) {
  const Shape unaligned = {1, 2, 1, 37, 70, 15, 16, true}, wide = {1, 2, 1, 20, 40, 256, 64, false};
  ck_assert_msg(!run_shape("causal", 1, &unaligned, false), "E = 15 ran the sm_90a body");
  ck_assert_msg(!run_shape("relpos_bias", 1, &shapes[0], true), "deterministic ran the sm_90a body");
  ck_assert_msg(!run_shape("softcap", 2, &wide, true), "deterministic E = 256 ran the sm_90a body");
}
END_TEST

/* A packed batch (cu_seqlens): one sub-call per sequence over strided
 * views starting mid-tensor, so the backward's four tensor maps are built
 * per sequence with offset bases; sequences of 70, 0, 1 and 150 query
 * rows against 90, 5, 0 and 150 keys (a sequence without queries leaves
 * its dK and dV 0; one without keys launches no flex_bwd). */
static void packed_case(int E) {
  const int lq[4] = {70, 0, 1, 150}, lk[4] = {90, 5, 0, 150}, H = 4, HKV = 2;
  int32_t cq[5] = {0}, ck[5] = {0};
  for (int b = 0; b < 4; b++) cq[b + 1] = cq[b] + lq[b], ck[b + 1] = ck[b] + lk[b];
  DLDataType f16 = rt_dtype(kDLFloat, 16), f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  DLDataType i32 = rt_dtype(kDLInt, 32);
  int64_t qs[3] = {cq[4], H, E}, ks[3] = {ck[4], HKV, E}, ls[2] = {H, cq[4]}, cs[1] = {5};
  TlArr q, k, v, dout, cuq, cuk, out[2], lse[2], dq[2], dk[2], dv[2];
  tl_arr_init(&q, f16, 3, qs), tl_arr_normal(&q, &rng);
  tl_arr_init(&k, f16, 3, ks), tl_arr_normal(&k, &rng);
  tl_arr_init(&v, f16, 3, ks), tl_arr_normal(&v, &rng);
  tl_arr_init(&dout, f16, 3, qs), tl_arr_normal(&dout, &rng);
  tl_arr_init(&cuq, i32, 1, cs), tl_arr_init(&cuk, i32, 1, cs);
  for (int i = 0; i < 5; i++) rt_array_set(&cuq.a, i, cq[i]), rt_array_set(&cuk.a, i, ck[i]);
  flex_kernel *kern = NULL;
  ck_assert(flex_kernel_load(&kern, tl_src_path("samples/causal.score"), NULL) == FLEX_OK);
  bool sm90 = false;
  for (int i = 1; i >= 0; i--) {
    DLDataType o = i ? f64 : f32;
    tl_arr_init(&out[i], o, 3, qs), tl_arr_init(&lse[i], o, 2, ls);
    tl_arr_init(&dq[i], o, 3, qs), tl_arr_init(&dk[i], o, 3, ks), tl_arr_init(&dv[i], o, 3, ks);
    TlArr *outs[] = {&out[i], &lse[i], &dq[i], &dk[i], &dv[i]};
    for (int j = 0; j < 5; j++) tl_arr_poison(outs[j]);
    flex_args a;
    memset(&a, 0, sizeof a);
    a.backend = i ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
    a.arch = i ? NULL : "sm_90a";
    a.q = &q.t, a.k = &k.t, a.v = &v.t, a.out = &out[i].t, a.lse = &lse[i].t, a.dout = &dout.t;
    a.dq = &dq[i].t, a.dk = &dk[i].t, a.dv = &dv[i].t;
    a.cu_seqlens_q = &cuq.t, a.cu_seqlens_kv = &cuk.t;
    ck_assert_msg(flex_forward(kern, &a) == FLEX_OK, "%s", flex_last_error());
    ck_assert_msg(flex_backward(kern, &a) == FLEX_OK, "%s", flex_last_error());
    if (!i) sm90 = rt_run_last_stats().bwd_sm90;
  }
  double eq = tl_rel_err(&dq[0].a, &dq[1].a), ek = tl_rel_err(&dk[0].a, &dk[1].a);
  double ev = tl_rel_err(&dv[0].a, &dv[1].a);
  fprintf(stderr, "  packed causal fp16 E%d lengths 70/0/1/150 x 90/5/0/150: %s body, dq %.2g "
          "dk %.2g dv %.2g\n", E, sm90 ? "sm_90a" : "sm_80", eq, ek, ev);
  ck_assert_msg(sm90, "the packed call did not run the sm_90a backward");
  ck_assert_msg(eq < 2e-2 && ek < 2e-2 && ev < 2e-2, "packed: dq %g dk %g dv %g", eq, ek, ev);
  TlArr *all[] = {&q, &k, &v, &dout, &cuq, &cuk};
  for (int i = 0; i < 6; i++) tl_arr_free(all[i]);
  for (int i = 0; i < 2; i++) {
    TlArr *outs[] = {&out[i], &lse[i], &dq[i], &dk[i], &dv[i]};
    for (int j = 0; j < 5; j++) tl_arr_free(outs[j]);
  }
  flex_kernel_free(kern);
}

START_TEST(packed_batch) { packed_case(64); }
END_TEST

/* The same at E = 256: the two-consumer backward per sequence. */
START_TEST(packed_batch_wide) { packed_case(256); }
END_TEST

/* A caller's BlockMask (the walk's lists, partial blocks tested per
 * element) with 128 x blk blocks at head dim E, dtype di; want: whether
 * the sm_90a backward must run. */
static void block_mask_case(int E, int di, int blk, bool want) {
  const int QL = 200, KL = 300, H = 2;
  const TlDtype *d = &tl_dtypes[di];
  flex_kernel *k = NULL;
  ck_assert(flex_kernel_load(&k, tl_src_path("samples/sliding_window.score"), NULL) == FLEX_OK);
  flex_param win = {"window", 40};
  DLDataType dt = rt_dtype(d->code, d->bits), f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  int64_t qs[4] = {1, H, QL, E}, ks[4] = {1, H, KL, E}, ls[3] = {1, H, QL};
  TlArr q, kk, v, dout;
  tl_arr_init(&q, dt, 4, qs), tl_arr_normal(&q, &rng);
  tl_arr_init(&kk, dt, 4, ks), tl_arr_normal(&kk, &rng);
  tl_arr_init(&v, dt, 4, ks), tl_arr_normal(&v, &rng);
  tl_arr_init(&dout, dt, 4, qs), tl_arr_normal(&dout, &rng);
  TlArr out[2], lse[2], dq[2], dk[2], dv[2];
  flex_block_mask *bm = NULL;
  flex_args a;
  memset(&a, 0, sizeof a);
  a.params = &win, a.nparams = 1;
  ck_assert_msg(flex_block_mask_create(&bm, k, &a, 1, H, QL, KL, 128, blk, NULL) == FLEX_OK, "%s",
                flex_last_error());
  bool sm90 = false;
  for (int i = 1; i >= 0; i--) {
    DLDataType o = i ? f64 : f32;
    tl_arr_init(&out[i], o, 4, qs), tl_arr_init(&lse[i], o, 3, ls);
    tl_arr_init(&dq[i], o, 4, qs), tl_arr_init(&dk[i], o, 4, ks), tl_arr_init(&dv[i], o, 4, ks);
    TlArr *outs[] = {&out[i], &lse[i], &dq[i], &dk[i], &dv[i]};
    for (int j = 0; j < 5; j++) tl_arr_poison(outs[j]);
    a.backend = i ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
    a.arch = i ? NULL : "sm_90a";
    a.q = &q.t, a.k = &kk.t, a.v = &v.t, a.out = &out[i].t, a.lse = &lse[i].t, a.dout = &dout.t;
    a.dq = &dq[i].t, a.dk = &dk[i].t, a.dv = &dv[i].t;
    a.block_mask = bm;
    ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "%d-blocks: %s", blk, flex_last_error());
    ck_assert_msg(flex_backward(k, &a) == FLEX_OK, "%d-blocks: %s", blk, flex_last_error());
    if (!i) sm90 = rt_run_last_stats().bwd_sm90;
  }
  double eq = tl_rel_err(&dq[0].a, &dq[1].a), ek = tl_rel_err(&dk[0].a, &dk[1].a);
  double ev = tl_rel_err(&dv[0].a, &dv[1].a);
  fprintf(stderr, "  sliding_window BlockMask 128x%d %s E%d: %s body, dq %.2g dk %.2g dv %.2g\n", blk,
          d->name, E, sm90 ? "sm_90a" : "sm_80", eq, ek, ev);
  ck_assert_msg(sm90 == want, "%d-blocks E%d: the %s backward ran", blk, E, sm90 ? "sm_90a" : "sm_80");
  ck_assert_msg(eq < d->gtol && ek < d->gtol && ev < d->gtol, "%d-blocks E%d: dq %g dk %g dv %g", blk,
                E, eq, ek, ev);
  for (int i = 0; i < 2; i++) {
    TlArr *outs[] = {&out[i], &lse[i], &dq[i], &dk[i], &dv[i]};
    for (int j = 0; j < 5; j++) tl_arr_free(outs[j]);
  }
  flex_block_mask_free(bm);
  tl_arr_free(&q), tl_arr_free(&kk), tl_arr_free(&v), tl_arr_free(&dout);
  flex_kernel_free(k);
}

/* 128 x 128 blocks run the sm_90a backward (its 64 x 64 tiles divide
 * them); 128 x 64 blocks, which the sm_90a forward's 128-key tiles do not
 * divide, run the sm_80 kernels. */
START_TEST(user_block_mask) {
  block_mask_case(64, 1, 128, true);
  block_mask_case(64, 1, 64, false);
}
END_TEST

/* At E = 256 the sm_90a forward takes 64-key tiles, so 128 x 64 blocks run
 * both sm_90a bodies: the two-consumer backward on the walk's lists. */
START_TEST(user_block_mask_wide) { block_mask_case(256, 2, 64, true); }
END_TEST

int main(int argc, char **argv) {
  rng = tl_seed();
  bool full = false;
  for (int i = 1; i < argc; i++) full |= !strcmp(argv[i], "--full");
  Suite *su = suite_create("emu_sm90_bwd");
  TCase *tc = tcase_create("backward"), *wide = tcase_create("wide"); /* head dims above 128 */
  tcase_set_timeout(tc, 600);
  tcase_set_timeout(wide, 1200);
  if (full) {
    tcase_add_loop_test(tc, sample_full, 0, NSAMPLES * 2 * NSHAPES);
    tcase_add_loop_test(wide, wide_full, 0, NWSAMPLES * 2 * NWIDE);
  } else {
    tcase_add_loop_test(tc, sample_default, 0, NSAMPLES * 2);
    tcase_add_loop_test(wide, wide_default, 0, NWSAMPLES);
    tcase_add_test(wide, user_block_mask_wide);
    tcase_add_test(wide, packed_batch_wide);
    tcase_add_test(tc, padded_dims);
    tcase_add_test(tc, fallbacks);
    tcase_add_test(tc, packed_batch);
    tcase_add_test(tc, user_block_mask);
  }
  suite_add_tcase(su, tc);
  suite_add_tcase(su, wide);
  return tl_run_suite(su);
}
