/* Generated kernels on the emulator against the float64 reference, through
 * the public API: every .score kernel under samples/, forward and backward, fp32,
 * fp16 and bf16, on shapes that do not fit the tiles (head dim 15, Q_LEN 37,
 * KV_LEN 70), grouped (GQA) and single (MQA) key/value heads, EV != E,
 * fully masked rows, a given dLSE, and `grad` buffers.
 *
 * Both backends read the SAME input tensors (already rounded to the dtype;
 * the reference decodes fp16/bf16 exactly), so the error measured is the
 * kernels' own. Outputs are NaN-poisoned before each run; each tensor is
 * compared by relative norm error, NaN never passes, and fully masked rows
 * must come back exactly as docs/language.md says (O = 0, LSE = -inf, dQ = 0).
 *
 * The default run covers every sample with every dtype once, the shape
 * variants spread over them; FLEXC_EMU_FULL=1 (or --full) runs the whole
 * cross product; --timing runs the timing case only (seconds, no assertion).
 * --tiles runs every row of the tile table (codegen/kernel.c) and every
 * shape of bench/tile_sweep.txt (through FLEXC_TILES) on lengths with
 * interior and edge tiles.
 * --sm90 has the emulator generate for sm_90a (the TMA + wgmma forward and
 * backward): every sample in fp16 and bf16 on shapes_sm90 (head dims 64,
 * 128, 256 and padded ones), asserting that both sm_90a bodies ran; with
 * --full every sample x dtype x shape.
 * --cuda runs the same cases on the GPU instead of the emulator (the
 * tensors mirrored on the device by tl_cuda_call; outputs in q's dtype, as
 * the CUDA backend wants); it exits 77 where there is no CUDA device.
 * --matrix (the GPU run's, bench/run_gpu.sh) runs every sample x fp16/bf16
 * x head dims 64 and 128 on GQA and MQA shapes of odd lengths, forward and
 * backward, and every masked sample once more with a caller's BlockMask
 * (flex_block_mask_create, 128 x 128 blocks) given to both sides; --one
 * runs one small case of it (relpos_bias: a score and a `grad` buffer,
 * bf16, E = 64), the one compute-sanitizer checks. With --cuda on a device
 * of compute capability 9.0 and FLEXC_CUDA_SM90_FWD=1 / _BWD=1 set, every
 * case asserts that the sm_90a bodies ran, as --sm90 does on the emulator.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/codegen.h"
#include "cuda/driver.h"
#include "runtime/backend.h"
#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;
static bool on_cuda; /* --cuda: the device backend is the GPU, not the emulator */
static bool on_cpu;  /* --cpu: the device backend is the CPU backend (cpu/) */
static bool full;    /* --full (or FLEXC_EMU_FULL=1): the whole cross product */
static bool on_sm90; /* --sm90: the emulator generates for sm_90a (fp16 / bf16, shapes_sm90) */
static bool want_sm90; /* --cuda on a 9.0 device with the sm_90a bodies turned on: assert they ran */

/* One problem shape and the optional features it turns on. */
typedef struct Shape {
  int B, H, HKV, QL, KL, E, EV; /* sizes (H % HKV == 0) */
  bool dlse;                    /* give dLSE to the backward */
  bool native_out;              /* emu outputs in q's dtype instead of float32 */
  bool caller_mask;             /* a caller's BlockMask (flex_block_mask_create) on both sides */
} Shape;

static double call_scale; /* flex_args.scale of every call (0: 1/sqrt(E)); odd_scales sets it */

static const Shape shapes[] = {
    {2, 4, 2, 37, 70, 15, 24, true, false, false},  /* GQA, odd E, EV != E, ragged tails */
    {1, 3, 1, 70, 37, 16, 16, false, true, false},  /* MQA, Q_LEN > KV_LEN */
    {2, 2, 2, 65, 33, 40, 72, true, true, false},   /* MHA, one row past a 64-row tile */
    {1, 2, 1, 21, 130, 72, 33, false, false, false}, /* several key tiles, E > EV */
    {1, 2, 2, 17, 19, 160, 136, true, false, false}, /* head dims over 128: the halved tiles */
};
#define NSHAPES ((int)(sizeof shapes / sizeof *shapes))

/* --sm90: the head dims of the sm_90a kernels (64, 128, 256 and padded
 * ones), lengths that miss the 64-row and 64/128-key tiles. */
static const Shape shapes_sm90[] = {
    {2, 4, 2, 77, 130, 64, 64, true, false, false},   /* GQA, dLSE */
    {1, 2, 1, 45, 150, 128, 128, false, true, false}, /* MQA, O in q's dtype */
    {1, 2, 2, 33, 67, 256, 256, true, false, false},  /* two backward consumers */
    {2, 2, 1, 65, 100, 72, 40, false, false, false},  /* padded to 128 / 64, E != EV */
};
#define NSHAPES_SM90 ((int)(sizeof shapes_sm90 / sizeof *shapes_sm90))
#define NDEFAULT_SHAPES 4 /* the default run spreads shapes 0..3 over the samples */

/* --matrix: head dims 64 and 128, GQA and MQA, lengths that miss every tile. */
static const Shape shapes_matrix[] = {
    {2, 4, 2, 77, 130, 64, 64, true, true, false},    /* GQA, dLSE */
    {1, 4, 1, 130, 77, 128, 128, false, true, false}, /* MQA, Q_LEN > KV_LEN */
};
#define NSHAPES_MATRIX ((int)(sizeof shapes_matrix / sizeof *shapes_matrix))
/* ... and a caller's BlockMask: several blocks each way, GQA */
static const Shape shape_caller_mask = {2, 4, 2, 300, 260, 64, 64, true, true, true};

static const char *const samples[] = {"alibi", "causal", "causal_lower_right", "chunked_gelu",
                                      "dilated", "document", "gemma2", "head_temperature",
                                      "natten", "prefix_lm", "relpos_bias", "sliding_window",
                                      "softcap", "natten_gym", "natten_tiled", "paged",
                                      "sink_gptoss", "sink_window", "sink_per_query"};
#define NSAMPLES ((int)(sizeof samples / sizeof *samples))

/* Params and buffers of one sample, valid for the shape. */
typedef struct Extras {
  flex_param params[8];
  int np;
  TlArr buf[3], gemu[3], gref[3]; /* buffer data; gradients (emu float32, reference float64) */
  bool grad[3];                 /* buffer i is `grad` */
  flex_buffer fe[3], fr[3];     /* as given to the emu and the reference */
  int nb;
} Extras;

static void add_param(Extras *x, const char *name, double v) {
  x->params[x->np++] = (flex_param){name, v};
}

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

/* Sorted document ids for `n` tokens: runs of random length. */
static void fill_docs(TlArr *d, int n) {
  int32_t id = 0;
  for (int i = 0; i < n; i++) {
    if (i && tl_uniform(&rng) < 0.12) id++;
    rt_array_set(&d->a, i, id);
  }
}

static void sample_extras(Extras *x, const char *name, const Shape *s) {
  DLDataType f32 = rt_dtype(kDLFloat, 32), i32 = rt_dtype(kDLInt, 32);
  memset(x, 0, sizeof *x);
  if (!strcmp(name, "alibi") || !strcmp(name, "gemma2"))
    tl_arr_uniform(add_buf(x, "slopes", f32, 1, s->H, 0, false), 0.05, 0.5, &rng);
  if (!strcmp(name, "gemma2")) add_param(x, "softcap", 4.0), add_param(x, "window", 13);
  if (!strcmp(name, "dilated")) add_param(x, "dilation", 3); /* rows q < h % 3 see nothing */
  if (!strcmp(name, "document")) {
    int T = s->QL > s->KL ? s->QL : s->KL;
    fill_docs(add_buf(x, "doc", i32, 1, T, 0, false), T);
  }
  if (!strcmp(name, "head_temperature")) {
    tl_arr_normal(add_buf(x, "temp", f32, 1, s->H, 0, true), &rng);
    TlArr *len = add_buf(x, "lengths", i32, 1, s->B, 0, false);
    /* Batch 0 is all padding when there are two (empty rows); other lengths
     * are at least 2: with one key every row's softmax is constant and the
     * true dq, dk and d_temp are exactly zero, which a relative error cannot
     * measure. */
    for (int b = 0; b < s->B; b++)
      rt_array_set(&len->a, b, s->B > 1 && b == 0 ? 0 : 2 + (int)(tl_uniform(&rng) * (s->KL - 1)));
  }
  if (!strcmp(name, "natten")) add_param(x, "width", 8), add_param(x, "radius", 1);
  if (!strcmp(name, "natten_gym") || !strcmp(name, "natten_tiled")) {
    add_param(x, "width", 8), add_param(x, "height", 8);
    add_param(x, "kernel_w", 3), add_param(x, "kernel_h", 5);
  }
  if (!strcmp(name, "natten_tiled")) add_param(x, "tile_w", 4), add_param(x, "tile_h", 4);
  if (!strcmp(name, "paged")) {
    /* Pages of 8 keys; every third physical page belongs to another
     * sequence (-1), the others are placed at shuffled logical positions. */
    add_param(x, "page_size", 8);
    int pages = (s->KL + 7) / 8;
    TlArr *l = add_buf(x, "logical", i32, 2, s->B, pages, false);
    for (int b = 0; b < s->B; b++)
      for (int pg = 0; pg < pages; pg++)
        rt_array_set(&l->a, (int64_t)b * pages + pg, (pg + b) % 3 == 0 ? -1 : (pg * 5 + b) % pages);
  }
  if (!strcmp(name, "prefix_lm")) add_param(x, "prefix", 9);
  if (!strcmp(name, "relpos_bias"))
    tl_arr_normal(add_buf(x, "rel_bias", f32, 2, s->H, 9, true), &rng);
  if (!strcmp(name, "sliding_window")) add_param(x, "window", 10);
  /* Learned sinks around the rows' own logits (0 to a few), some above
   * every key's: the keys' weights then sum well below 1. */
  if (!strncmp(name, "sink_", 5) && strcmp(name, "sink_per_query"))
    tl_arr_uniform(add_buf(x, "sinks", f32, 1, s->H, 0, true), -1.0, 3.0, &rng);
  if (!strcmp(name, "sink_window")) add_param(x, "window", 6);
  if (!strcmp(name, "sink_per_query")) {
    tl_arr_uniform(add_buf(x, "base", f32, 1, s->H, 0, true), -1.0, 1.0, &rng);
    tl_arr_uniform(add_buf(x, "growth", f32, 1, s->H, 0, true), 0.0, 0.5, &rng);
  }
  if (!strcmp(name, "softcap")) add_param(x, "softcap", 2.5);
}

static void extras_free(Extras *x) {
  for (int i = 0; i < x->nb; i++) {
    tl_arr_free(&x->buf[i]);
    if (x->grad[i]) tl_arr_free(&x->gemu[i]), tl_arr_free(&x->gref[i]);
  }
}

/* Everything one case reads and writes; [0] is the emulator's, [1] the reference's. */
typedef struct Run {
  TlArr q, k, v, dout, dlse;
  TlArr out[2], lse[2], dq[2], dk[2], dv[2];
  flex_args a[2];
  Extras x;
  flex_block_mask *mask; /* the caller's BlockMask (Shape.caller_mask), NULL: none */
} Run;

static void run_init(Run *r, const Shape *s, DLDataType dt, const char *sample, flex_kernel *k) {
  DLDataType f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  DLDataType od = s->native_out || on_cuda ? dt : f32;
  int64_t qs[4] = {s->B, s->H, s->QL, s->E}, ks[4] = {s->B, s->HKV, s->KL, s->E};
  int64_t vs[4] = {s->B, s->HKV, s->KL, s->EV}, os[4] = {s->B, s->H, s->QL, s->EV};
  memset(r, 0, sizeof *r);
  tl_arr_init(&r->q, dt, 4, qs), tl_arr_normal(&r->q, &rng);
  tl_arr_init(&r->k, dt, 4, ks), tl_arr_normal(&r->k, &rng);
  tl_arr_init(&r->v, dt, 4, vs), tl_arr_normal(&r->v, &rng);
  tl_arr_init(&r->dout, dt, 4, os), tl_arr_normal(&r->dout, &rng);
  tl_arr_init(&r->dlse, f32, 3, qs), tl_arr_normal(&r->dlse, &rng); /* [B, H, QL] */
  for (int i = 0; i < 2; i++) {
    DLDataType o = i ? f64 : od;
    tl_arr_init(&r->out[i], o, 4, os);
    tl_arr_init(&r->lse[i], i ? f64 : f32, 3, qs);
    tl_arr_init(&r->dq[i], o, 4, qs);
    tl_arr_init(&r->dk[i], o, 4, ks);
    tl_arr_init(&r->dv[i], o, 4, vs);
    TlArr *outs[] = {&r->out[i], &r->lse[i], &r->dq[i], &r->dk[i], &r->dv[i]};
    for (int j = 0; j < 5; j++) tl_arr_poison(outs[j]);
  }
  sample_extras(&r->x, sample, s);
  for (int i = 0; i < 2; i++) {
    flex_args *a = &r->a[i];
    a->backend = i ? FLEX_BACKEND_REFERENCE : on_cpu ? FLEX_BACKEND_CPU : FLEX_BACKEND_EMU;
    a->q = &r->q.t, a->k = &r->k.t, a->v = &r->v.t, a->dout = &r->dout.t;
    a->dlse = s->dlse ? &r->dlse.t : NULL;
    a->out = &r->out[i].t, a->lse = &r->lse[i].t;
    a->dq = &r->dq[i].t, a->dk = &r->dk[i].t, a->dv = &r->dv[i].t;
    a->params = r->x.params, a->nparams = r->x.np;
    a->buffers = i ? r->x.fr : r->x.fe, a->nbuffers = r->x.nb;
    a->scale = call_scale;
    a->arch = !i && on_sm90 ? "sm_90a" : NULL;
  }
  if (s->caller_mask) {
    flex_status st = flex_block_mask_create(&r->mask, k, &r->a[1], s->B, s->H, s->QL, s->KL, 0, 0, NULL);
    ck_assert_msg(st == FLEX_OK, "%s: block mask: %s", sample, flex_last_error());
    r->a[0].block_mask = r->a[1].block_mask = r->mask;
  }
}

static void run_free(Run *r) {
  TlArr *all[] = {&r->q, &r->k, &r->v, &r->dout, &r->dlse};
  for (int j = 0; j < 5; j++) tl_arr_free(all[j]);
  for (int i = 0; i < 2; i++) {
    TlArr *outs[] = {&r->out[i], &r->lse[i], &r->dq[i], &r->dk[i], &r->dv[i]};
    for (int j = 0; j < 5; j++) tl_arr_free(outs[j]);
  }
  extras_free(&r->x);
  if (r->mask) flex_block_mask_free(r->mask);
}

/* Rows the reference left fully masked must be exactly O = 0, LSE = -inf
 * (and dQ = 0 after the backward). Returns how many there were. */
static int check_masked_rows(const Run *r, const Shape *s, bool backward) {
  int rows = s->B * s->H * s->QL, masked = 0;
  for (int i = 0; i < rows; i++) {
    if (rt_array_get(&r->lse[1].a, i) != -INFINITY) continue;
    masked++;
    double l = rt_array_get(&r->lse[0].a, i);
    ck_assert_msg(l == -INFINITY, "fully masked row %d: emu lse %g, want -inf", i, l);
    for (int e = 0; e < s->EV; e++) {
      double o = rt_array_get(&r->out[0].a, (int64_t)i * s->EV + e);
      ck_assert_msg(o == 0, "fully masked row %d: emu out[%d] = %g, want 0", i, e, o);
    }
    for (int e = 0; backward && e < s->E; e++) {
      double g = rt_array_get(&r->dq[0].a, (int64_t)i * s->E + e);
      ck_assert_msg(g == 0, "fully masked row %d: emu dq[%d] = %g, want 0", i, e, g);
    }
  }
  return masked;
}

/* One (sample, dtype, shape) case: forward (and backward) on both backends. */
static void run_shape_dir(int si, int di, const Shape *s, bool backward) {
  const TlDtype *d = &tl_dtypes[di];
  char path[256];
  snprintf(path, sizeof path, "samples/%s.score", samples[si]);
  flex_kernel *k = tl_load(path, NULL, NULL);
  Run r;
  run_init(&r, s, rt_dtype(d->code, d->bits), samples[si], k);
  for (int i = 1; i >= 0; i--) {
    const char *who = i ? "reference" : on_cuda ? "cuda" : on_cpu ? "cpu" : "emu";
    bool gpu = on_cuda && i == 0;
    flex_status f = gpu ? tl_cuda_call(k, &r.a[i], false) : flex_forward(k, &r.a[i]);
    ck_assert_msg(f == FLEX_OK, "%s forward: %s", who, flex_last_error());
    if ((on_sm90 || want_sm90) && !i) /* every sample runs the TMA + wgmma forward */
      ck_assert_msg(rt_run_last_stats().fwd_sm90, "%s: the sm_90a forward did not run", samples[si]);
    if (!backward) continue;
    flex_status b = gpu ? tl_cuda_call(k, &r.a[i], true) : flex_backward(k, &r.a[i]);
    ck_assert_msg(b == FLEX_OK, "%s backward: %s", who, flex_last_error());
    /* ... and the sm_90a backward, except above head dim 128 under a mask
     * with more than two divisions (cg_bwd_sm90_ok: the sm_80 body) */
    bool heavy = !strncmp(samples[si], "natten", 6); /* 4, 6 and 15 divisions */
    bool want_bwd = !(heavy && (s->E > 128 || s->EV > 128));
    if ((on_sm90 || want_sm90) && !i)
      ck_assert_msg(rt_run_last_stats().bwd_sm90 == want_bwd, "%s: the sm_90a backward %s",
                    samples[si], want_bwd ? "did not run" : "ran");
  }
  double eo = tl_rel_err(&r.out[0].a, &r.out[1].a), el = tl_rel_err(&r.lse[0].a, &r.lse[1].a);
  double eq = tl_rel_err(&r.dq[0].a, &r.dq[1].a), ek = tl_rel_err(&r.dk[0].a, &r.dk[1].a);
  double ev = tl_rel_err(&r.dv[0].a, &r.dv[1].a), eb = 0;
  for (int i = 0; i < r.x.nb; i++)
    if (r.x.grad[i]) {
      double e = tl_rel_err(&r.x.gemu[i].a, &r.x.gref[i].a);
      if (!(e <= eb)) eb = e; /* a NaN error must win, not vanish as in fmax */
    }
  int masked = check_masked_rows(&r, s, backward);
  fprintf(stderr,
          "  %-18s %s%s B%d H%d/%d L%d/%d E%d/%d%s%s%s: out %.2g lse %.2g dq %.2g dk %.2g dv %.2g"
          " dbuf %.2g, %d masked rows\n",
          samples[si], d->name, on_cuda ? want_sm90 ? " cuda sm_90a bodies" : " cuda" : on_cpu ? " cpu" : "",
          s->B, s->H, s->HKV, s->QL, s->KL, s->E, s->EV, s->dlse ? " dlse" : "",
          s->native_out ? " native-out" : "", s->caller_mask ? " caller BlockMask" : "", eo, el, eq,
          ek, ev, eb, masked);
  ck_assert_msg(eo < d->tol && el < d->tol, "%s %s: forward error out %g lse %g", samples[si],
                d->name, eo, el);
  ck_assert_msg(!backward || (eq < d->gtol && ek < d->gtol && ev < d->gtol && eb < d->gtol),
                "%s %s: gradient error dq %g dk %g dv %g dbuf %g", samples[si], d->name, eq, ek, ev,
                eb);
  run_free(&r);
  flex_kernel_free(k);
}

static void run_shape(int si, int di, const Shape *s) { run_shape_dir(si, di, s, true); }

static void run_case(int si, int di, int shi) { run_shape(si, di, &shapes[shi]); }

/* --sm90: every sample in fp16 and bf16 on the sm_90a kernels; the default
 * run rotates the shapes, --full runs them all. */
START_TEST(sample_sm90) {
  int n = full ? NSHAPES_SM90 : 1, si = _i / (2 * n), di = 1 + _i / n % 2;
  run_shape(si, di, &shapes_sm90[full ? _i % n : (si + di) % NSHAPES_SM90]);
}
END_TEST

/* --matrix: sample x fp16/bf16 x shapes_matrix (head dims 64 and 128). */
START_TEST(sample_matrix) {
  int si = _i / (2 * NSHAPES_MATRIX), di = 1 + _i / NSHAPES_MATRIX % 2;
  run_shape(si, di, &shapes_matrix[_i % NSHAPES_MATRIX]);
}
END_TEST

/* --matrix: every sample with a mask once with a caller's BlockMask, fp16
 * and bf16 alternating. */
static int masked[NSAMPLES], nmasked; /* the samples with a mask (main fills it) */

START_TEST(sample_caller_mask) { run_shape(masked[_i], 1 + _i % 2, &shape_caller_mask); }
END_TEST

/* --one: one small case of the matrix (relpos_bias, bf16, E = 64). */
START_TEST(sample_one) { run_shape(10, 2, &shapes_matrix[0]); }
END_TEST

/* Default matrix: sample x dtype, shape variants rotated over them. */
START_TEST(sample_default) {
  int si = _i / 3, di = _i % 3;
  run_case(si, di, (si + di) % NDEFAULT_SHAPES);
}
END_TEST

/* Full matrix: sample x dtype x shape. */
START_TEST(sample_full) {
  int si = _i / (3 * NSHAPES), di = _i / NSHAPES % 3;
  run_case(si, di, _i % NSHAPES);
}
END_TEST

/* The list above names every .score file in samples/, so "every sample" stays true. */
START_TEST(samples_listed) {
  DIR *d = opendir(tl_src_path("samples"));
  ck_assert_ptr_nonnull(d);
  struct dirent *e;
  int found = 0;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 7 || strcmp(e->d_name + n - 6, ".score")) continue;
    found++;
    bool listed = false;
    for (int i = 0; i < NSAMPLES; i++)
      listed |= strlen(samples[i]) == n - 6 && !strncmp(samples[i], e->d_name, n - 6);
    ck_assert_msg(listed, "samples/%s is not in check_emu_kernels' list", e->d_name);
  }
  closedir(d);
  ck_assert_int_eq(found, NSAMPLES);
}
END_TEST

/* Head dims over 128 (the halved tiles) for two samples in the default run. */
START_TEST(large_head_dim) { run_case(_i ? 9 : 5, _i ? 1 : 2, 4); }
END_TEST

/* Scales the tensor-core forward folds into Q instead of the exponent
 * (kernels/flex_fwd.cuh): a negative one (forward and backward), and one
 * whose log2-domain value underflows fp32, so every logit is 0 and rows
 * are uniform (forward only: its gradients, ~1e-46, are below fp32's
 * range); an identity score (causal) and a score function (alibi), fp16
 * and bf16. */
START_TEST(odd_scales) {
  const int si = _i / 4 % 2 ? 0 : 1, di = _i % 2 ? 1 : 2;
  const Shape *s = on_sm90 ? &shapes_sm90[_i % 2] : &shapes[_i % 2];
  call_scale = _i / 2 % 2 ? 1e-46 : -0.3;
  fprintf(stderr, "  scale %g\n", call_scale);
  run_shape_dir(si, di, s, call_scale < 0);
  call_scale = 0;
}
END_TEST

/* ---- tiles: every row of the tile table and every sweep shape ---------- */

static int sample_index(const char *name) {
  for (int i = 0; i < NSAMPLES; i++)
    if (!strcmp(samples[i], name)) return i;
  ck_abort_msg("no sample %s", name);
  return 0;
}

/* Three kernels per tile shape: causal (the implicit walk, full and partial
 * tiles), relpos_bias (a score, a grad buffer, no mask) and paged (BlockMask
 * lists built on the device); lengths that give interior tiles (the
 * unpredicated loads) and ragged tails, GQA. */
static void run_tiles(const char *spec, int di, int E, int bm, int bn) {
  ck_assert_int_eq(setenv("FLEXC_TILES", spec, 1), 0);
  fprintf(stderr, " tiles %s, E=%d:\n", spec, E);
  const int L = 2 * (bm > bn ? bm : bn);
  const Shape s[3] = {{1, 2, 1, L + 13, L + bn, E, E, false, false, false},
                      {1, 2, 2, L, L - 5, E, E, true, false, false},
                      {2, 2, 1, L + 3, L, E, E, false, true, false}};
  const char *names[3] = {"causal", "relpos_bias", "paged"};
  for (int i = 0; i < 3; i++) run_shape(sample_index(names[i]), di, &s[i]);
  unsetenv("FLEXC_TILES");
}

/* Row _i of the tile table, at its largest head dim. fp16 and bf16 rows
 * alternate the two dtypes. */
START_TEST(tile_table_row) {
  int n;
  const CgTileRow *r = &cg_tile_table(&n)[_i];
  char spec[96];
  snprintf(spec, sizeof spec, "fwd=%dx%dx%d,bwd=%dx%dx%d", r->fwd.block_m, r->fwd.block_n,
           r->fwd.threads / 32, r->bwd.block_m, r->bwd.block_n, r->bwd.threads / 32);
  int di = r->dtype == CG_FP32 ? 0 : 1 + _i % 2; /* tl_dtypes: fp32, fp16, bf16 */
  run_tiles(spec, di, r->max_dim, r->fwd.block_m, r->bwd.block_n);
}
END_TEST

/* Line _i of bench/tile_sweep.txt at E=128, bf16 and fp16 alternately. */
START_TEST(tile_sweep_line) {
  FILE *f = fopen(tl_src_path("bench/tile_sweep.txt"), "r");
  ck_assert_ptr_nonnull(f);
  char line[128];
  int k = 0;
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    if (!line[0] || line[0] == '#') continue;
    found = k++ == _i;
  }
  fclose(f);
  if (!found) return; /* fewer lines than the loop's bound */
  int fm = 0, fn = 0, fw = 0, bm = 0, bn = 0, bw = 0;
  ck_assert_int_eq(sscanf(line, "fwd=%dx%dx%d,bwd=%dx%dx%d", &fm, &fn, &fw, &bm, &bn, &bw), 6);
  run_tiles(line, 1 + _i % 2, 128, fm, bn);
}
END_TEST

/* The timing case: B=1, H=2, L=S=256, E=64, fp16, forward and backward. */
static void timing(void) {
  Shape s = {1, 2, 2, 256, 256, 64, 64, false, false, false};
  flex_kernel *k = NULL;
  if (flex_kernel_load(&k, tl_src_path("samples/causal.score"), NULL) != FLEX_OK) {
    fprintf(stderr, "%s\n", flex_last_error());
    exit(EXIT_FAILURE);
  }
  Run r;
  run_init(&r, &s, rt_dtype(kDLFloat, 16), "causal", k);
  struct timespec t0, t1, t2;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  flex_status f = flex_forward(k, &r.a[0]);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  flex_status b = f ? f : flex_backward(k, &r.a[0]);
  clock_gettime(CLOCK_MONOTONIC, &t2);
  if (f || b) fprintf(stderr, "emu failed: %s\n", flex_last_error());
  double tf = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  double tb = (double)(t2.tv_sec - t1.tv_sec) + (double)(t2.tv_nsec - t1.tv_nsec) * 1e-9;
  printf("emu timing (causal, fp16, B=1 H=2 L=S=256 E=64, build included): forward %.2f s, "
         "backward %.2f s, total %.2f s\n", tf, tb, tf + tb);
  run_free(&r);
  flex_kernel_free(k);
  if (f || b) exit(EXIT_FAILURE);
}

int main(int argc, char **argv) {
  rng = tl_seed();
  for (int i = 1; i < argc; i++) {
    full |= !strcmp(argv[i], "--full");
    on_cuda |= !strcmp(argv[i], "--cuda");
    on_cpu |= !strcmp(argv[i], "--cpu");
    on_sm90 |= !strcmp(argv[i], "--sm90");
  }
  if (on_cpu && !flex_backend_available(FLEX_BACKEND_CPU)) {
    printf("skipped: %s\n", flex_last_error());
    return 77;
  }
  bool matrix = false, one = false;
  for (int i = 1; i < argc; i++) {
    matrix |= !strcmp(argv[i], "--matrix");
    one |= !strcmp(argv[i], "--one");
  }
  if (on_cuda) {
    int rc = tl_cuda_setup();
    if (rc) return rc;
    int major = 0, minor = 0;
    const char *f = getenv("FLEXC_CUDA_SM90_FWD"), *b = getenv("FLEXC_CUDA_SM90_BWD");
    want_sm90 = !rt_drv_compute_capability(0, &major, &minor) && major == 9 && minor == 0 && f &&
                !strcmp(f, "1") && b && !strcmp(b, "1");
  }
  const char *env = getenv("FLEXC_EMU_FULL");
  if (env && *env && strcmp(env, "0")) full = true;
  if (argc > 1 && !strcmp(argv[1], "--timing")) {
    timing();
    return EXIT_SUCCESS;
  }
  Suite *s = suite_create("emu_kernels");
  TCase *tc = tcase_create("samples");
  tcase_set_timeout(tc, 300);
  bool tiles = argc > 1 && !strcmp(argv[1], "--tiles");
  if (tiles) {
    int n;
    cg_tile_table(&n);
    tcase_add_loop_test(tc, tile_table_row, 0, n);
    tcase_add_loop_test(tc, tile_sweep_line, 0, 16);
  } else if (one) {
    tcase_add_test(tc, sample_one);
  } else if (matrix) {
    tcase_add_test(tc, samples_listed);
    tcase_add_loop_test(tc, sample_matrix, 0, NSAMPLES * 2 * NSHAPES_MATRIX);
    for (int i = 0; i < NSAMPLES; i++) {
      char path[64];
      flex_kernel *k = NULL;
      flex_kernel_info info;
      snprintf(path, sizeof path, "samples/%s.score", samples[i]);
      if (flex_kernel_load(&k, tl_src_path(path), NULL) || flex_kernel_get_info(k, &info)) {
        fprintf(stderr, "%s: %s\n", path, flex_last_error());
        return EXIT_FAILURE;
      }
      if (info.features & FLEX_FEATURE_MASK) masked[nmasked++] = i;
      flex_kernel_free(k);
    }
    tcase_add_loop_test(tc, sample_caller_mask, 0, nmasked);
  } else if (on_sm90) {
    tcase_add_loop_test(tc, sample_sm90, 0, NSAMPLES * 2 * (full ? NSHAPES_SM90 : 1));
    tcase_add_loop_test(tc, odd_scales, 0, 8);
  } else if (full) {
    tcase_add_loop_test(tc, sample_full, 0, NSAMPLES * 3 * NSHAPES);
  } else {
    tcase_add_test(tc, samples_listed);
    tcase_add_loop_test(tc, sample_default, 0, NSAMPLES * 3);
    tcase_add_loop_test(tc, large_head_dim, 0, 2);
    tcase_add_loop_test(tc, odd_scales, 0, 8);
  }
  suite_add_tcase(s, tc);
  return tl_run_suite(s);
}
