/* The sm_90a forward (kernels/flex_fwd_sm90.cuh: TMA through an mbarrier
 * ring, wgmma SS for Q K^T, wgmma RS for P V) on the emulator against the
 * float64 reference, through the public API with flex_args.arch "sm_90a".
 *
 * Samples with a score function (softcap, alibi, relpos_bias), implicit
 * masks (causal, sliding_window, dilated with fully masked rows; natten,
 * whose four divisions give one consumer with the overlap) and a mask
 * the runtime builds BlockMask lists for (document), fp16 and bf16, head
 * dims 64, 128, 256 and padded ones (72 / 40 / 136: TMA zero-fills the
 * panel), Q_LEN
 * and KV_LEN that miss the tiles, GQA and MQA, O in q's dtype or float32.
 * Both backends read the same rounded inputs; outputs are NaN-poisoned
 * first; O and LSE are compared by relative norm error (fp16 5e-3, bf16
 * 3e-2), NaN never passes; fully masked rows must be exactly O = 0,
 * LSE = -inf. Each case also asserts that the sm_90a body ran
 * (rt_run_last_stats().fwd_sm90), and one case that a call TMA cannot load
 * (E = 15: rows not 16-byte aligned) falls back to the sm_80 body and still
 * matches.
 *
 * The default run gives every sample both dtypes once with the shapes
 * rotated; --full (CTest check_emu_sm90_fwd_full, label slow) runs the
 * cross product. --cuda runs the same cases on GPU 0 through the CUDA
 * backend (O in q's dtype; exit 77 without a device); CTest
 * check_emu_sm90_fwd_gpu sets FLEXC_CUDA_SM90_FWD=1, so on a 9.0 device it
 * checks the sm_90a body on the hardware, elsewhere the sm_80 one.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/driver.h"
#include "runtime/backend.h"
#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;
static bool on_cuda;  /* --cuda: the GPU (CUDA backend) instead of the emulator */
static bool want_sm90; /* the sm_90a body must run: always on the emulator; on a GPU, a 9.0
                          device with FLEXC_CUDA_SM90_FWD=1 */

typedef struct Shape {
  int B, H, HKV, QL, KL, E, EV;
  bool native_out; /* O in q's dtype instead of float32 */
} Shape;

static const Shape shapes[] = {
    {2, 4, 2, 77, 201, 64, 64, false},  /* GQA, two row tiles, two key tiles with a tail */
    {1, 2, 1, 130, 67, 128, 128, true}, /* MQA, three row tiles, one partial key tile */
    {1, 2, 2, 45, 150, 72, 40, false},  /* padded head dims (72 -> 128, 40 -> 64), EV != E */
    {1, 2, 1, 33, 150, 256, 136, true}, /* wide: 64-key tiles, P V at N = 192 */
};
#define NSHAPES ((int)(sizeof shapes / sizeof *shapes))

static const char *const samples[] = {"causal",  "softcap",     "alibi",          "document",
                                      "dilated", "relpos_bias", "sliding_window", "natten"};
#define NSAMPLES ((int)(sizeof samples / sizeof *samples))

typedef struct Extras {
  flex_param params[4];
  int np;
  TlArr buf[2];
  flex_buffer fb[2];
  int nb;
} Extras;

static TlArr *add_buf(Extras *x, const char *name, DLDataType dt, int nd, int64_t d0, int64_t d1) {
  int i = x->nb++;
  int64_t shape[2] = {d0, d1};
  tl_arr_init(&x->buf[i], dt, nd, shape);
  x->fb[i] = (flex_buffer){name, &x->buf[i].t, NULL};
  return &x->buf[i];
}

static void sample_extras(Extras *x, const char *name, const Shape *s) {
  DLDataType f32 = rt_dtype(kDLFloat, 32), i32 = rt_dtype(kDLInt, 32);
  memset(x, 0, sizeof *x);
  if (!strcmp(name, "alibi")) tl_arr_uniform(add_buf(x, "slopes", f32, 1, s->H, 0), 0.05, 0.5, &rng);
  if (!strcmp(name, "softcap")) x->params[x->np++] = (flex_param){"softcap", 2.5};
  if (!strcmp(name, "sliding_window")) x->params[x->np++] = (flex_param){"window", 10};
  if (!strcmp(name, "dilated")) x->params[x->np++] = (flex_param){"dilation", 3};
  if (!strcmp(name, "relpos_bias")) tl_arr_normal(add_buf(x, "rel_bias", f32, 2, s->H, 9), &rng);
  if (!strcmp(name, "document")) { /* sorted ids, runs of random length */
    int T = s->QL > s->KL ? s->QL : s->KL;
    TlArr *d = add_buf(x, "doc", i32, 1, T, 0);
    int32_t id = 0;
    for (int i = 0; i < T; i++) {
      if (i && tl_uniform(&rng) < 0.05) id++;
      rt_array_set(&d->a, i, id);
    }
  }
}

/* One forward on the emulator (sm_90a) and on the reference; returns
 * whether the sm_90a body ran. */
static bool run_shape(const char *sample, int di, const Shape *s) {
  const TlDtype *d = &tl_dtypes[di];
  DLDataType dt = rt_dtype(d->code, d->bits), f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  char path[256];
  snprintf(path, sizeof path, "samples/%s.score", sample);
  flex_kernel *k = tl_load(path, NULL, NULL);
  int64_t qs[4] = {s->B, s->H, s->QL, s->E}, ks[4] = {s->B, s->HKV, s->KL, s->E};
  int64_t vs[4] = {s->B, s->HKV, s->KL, s->EV}, os[4] = {s->B, s->H, s->QL, s->EV};
  TlArr q, kk, v, out[2], lse[2];
  tl_arr_init(&q, dt, 4, qs), tl_arr_normal(&q, &rng);
  tl_arr_init(&kk, dt, 4, ks), tl_arr_normal(&kk, &rng);
  tl_arr_init(&v, dt, 4, vs), tl_arr_normal(&v, &rng);
  Extras x;
  sample_extras(&x, sample, s);
  bool sm90 = false;
  for (int i = 1; i >= 0; i--) {
    tl_arr_init(&out[i], i ? f64 : s->native_out || on_cuda ? dt : f32, 4, os);
    tl_arr_init(&lse[i], i ? f64 : f32, 3, qs);
    tl_arr_poison(&out[i]), tl_arr_poison(&lse[i]);
    flex_args a;
    memset(&a, 0, sizeof a);
    a.backend = i ? FLEX_BACKEND_REFERENCE : on_cuda ? FLEX_BACKEND_CUDA : FLEX_BACKEND_EMU;
    a.arch = i ? NULL : "sm_90a";
    a.q = &q.t, a.k = &kk.t, a.v = &v.t, a.out = &out[i].t, a.lse = &lse[i].t;
    a.params = x.params, a.nparams = x.np, a.buffers = x.fb, a.nbuffers = x.nb;
    flex_status st = !i && on_cuda ? tl_cuda_call(k, &a, false) : flex_forward(k, &a);
    ck_assert_msg(st == FLEX_OK, "%s forward: %s", i ? "reference" : on_cuda ? "cuda" : "emu sm_90a",
                  flex_last_error());
    if (!i) sm90 = rt_run_last_stats().fwd_sm90;
  }
  double eo = tl_rel_err(&out[0].a, &out[1].a), el = tl_rel_err(&lse[0].a, &lse[1].a);
  int rows = s->B * s->H * s->QL, masked = 0;
  for (int r = 0; r < rows; r++) {
    if (rt_array_get(&lse[1].a, r) != -INFINITY) continue;
    masked++;
    double l = rt_array_get(&lse[0].a, r);
    ck_assert_msg(l == -INFINITY, "%s: fully masked row %d: lse %g, want -inf", sample, r, l);
    for (int e = 0; e < s->EV; e++) {
      double o = rt_array_get(&out[0].a, (int64_t)r * s->EV + e);
      ck_assert_msg(o == 0, "%s: fully masked row %d: out[%d] = %g, want 0", sample, r, e, o);
    }
  }
  fprintf(stderr, "  %-15s %s%s B%d H%d/%d L%d/%d E%d/%d%s: %s body, out %.2g lse %.2g, %d masked rows\n",
          sample, d->name, on_cuda ? " cuda" : "", s->B, s->H, s->HKV, s->QL, s->KL, s->E, s->EV,
          s->native_out ? " native-out" : "", sm90 ? "sm_90a" : "sm_80", eo, el, masked);
  ck_assert_msg(eo < d->tol && el < d->tol, "%s %s E%d: forward error out %g lse %g", sample,
                d->name, s->E, eo, el);
  tl_arr_free(&q), tl_arr_free(&kk), tl_arr_free(&v);
  for (int i = 0; i < 2; i++) tl_arr_free(&out[i]), tl_arr_free(&lse[i]);
  for (int i = 0; i < x.nb; i++) tl_arr_free(&x.buf[i]);
  flex_kernel_free(k);
  return sm90;
}

/* Default: every sample x {fp16, bf16}, shapes rotated so that each dtype
 * meets every shape and each sample two of them. */
START_TEST(sample_default) {
  int si = _i / 2, di = 1 + _i % 2, shi = (si + 2 * (_i % 2)) % NSHAPES;
  ck_assert_msg(run_shape(samples[si], di, &shapes[shi]) == want_sm90, "%s: the wrong body ran",
                samples[si]);
}
END_TEST

START_TEST(sample_full) {
  int si = _i / (2 * NSHAPES), di = 1 + _i / NSHAPES % 2;
  ck_assert_msg(run_shape(samples[si], di, &shapes[_i % NSHAPES]) == want_sm90,
                "%s: the wrong body ran", samples[si]);
}
END_TEST

/* E = 15: rows of 30 bytes cannot be TMA-loaded; the sm_80 body runs, correctly. */
START_TEST(fallback_unaligned) {
  const Shape s = {1, 2, 1, 37, 70, 15, 16, false};
  ck_assert_msg(!run_shape("causal", 1, &s), "E = 15 ran the sm_90a body");
}
END_TEST

/* A packed batch (cu_seqlens): one sub-call per sequence over strided views
 * starting mid-tensor, so the tensor maps are built per sequence with
 * offset bases; sequences of 0, 1, 70 and 150 query rows, one of them with no keys. */
START_TEST(packed_batch) {
  const int lq[4] = {70, 0, 1, 150}, lk[4] = {90, 5, 0, 150}, H = 4, HKV = 2, E = 64, EV = 64;
  int32_t cq[5] = {0}, ck[5] = {0};
  for (int b = 0; b < 4; b++) cq[b + 1] = cq[b] + lq[b], ck[b + 1] = ck[b] + lk[b];
  DLDataType f16 = rt_dtype(kDLFloat, 16), f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  DLDataType i32 = rt_dtype(kDLInt, 32);
  int64_t qs[3] = {cq[4], H, E}, ks[3] = {ck[4], HKV, E}, vs[3] = {ck[4], HKV, EV};
  int64_t os[3] = {cq[4], H, EV}, ls[2] = {H, cq[4]}, cs[1] = {5};
  TlArr q, k, v, cuq, cuk, out[2], lse[2];
  tl_arr_init(&q, f16, 3, qs), tl_arr_normal(&q, &rng);
  tl_arr_init(&k, f16, 3, ks), tl_arr_normal(&k, &rng);
  tl_arr_init(&v, f16, 3, vs), tl_arr_normal(&v, &rng);
  tl_arr_init(&cuq, i32, 1, cs), tl_arr_init(&cuk, i32, 1, cs);
  for (int i = 0; i < 5; i++) rt_array_set(&cuq.a, i, cq[i]), rt_array_set(&cuk.a, i, ck[i]);
  flex_kernel *kern = NULL;
  ck_assert(flex_kernel_load(&kern, tl_src_path("samples/causal.score"), NULL) == FLEX_OK);
  bool sm90 = false;
  for (int i = 1; i >= 0; i--) {
    tl_arr_init(&out[i], i ? f64 : f32, 3, os), tl_arr_init(&lse[i], i ? f64 : f32, 2, ls);
    tl_arr_poison(&out[i]), tl_arr_poison(&lse[i]);
    flex_args a;
    memset(&a, 0, sizeof a);
    a.backend = i ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
    a.arch = i ? NULL : "sm_90a";
    a.q = &q.t, a.k = &k.t, a.v = &v.t, a.out = &out[i].t, a.lse = &lse[i].t;
    a.cu_seqlens_q = &cuq.t, a.cu_seqlens_kv = &cuk.t;
    ck_assert_msg(flex_forward(kern, &a) == FLEX_OK, "%s", flex_last_error());
    if (!i) sm90 = rt_run_last_stats().fwd_sm90;
  }
  double eo = tl_rel_err(&out[0].a, &out[1].a), el = tl_rel_err(&lse[0].a, &lse[1].a);
  fprintf(stderr, "  packed causal fp16 lengths 70/0/1/150 x 90/5/0/150: %s body, out %.2g lse %.2g\n",
          sm90 ? "sm_90a" : "sm_80", eo, el);
  ck_assert_msg(sm90, "the packed call did not run the sm_90a body");
  ck_assert_msg(eo < 5e-3 && el < 5e-3, "packed: out %g lse %g", eo, el);
  TlArr *all[] = {&q, &k, &v, &cuq, &cuk, &out[0], &out[1], &lse[0], &lse[1]};
  for (int i = 0; i < 9; i++) tl_arr_free(all[i]);
  flex_kernel_free(kern);
}
END_TEST

/* A caller's BlockMask: 128 x 128 blocks (the sm_90a tiles divide them)
 * run the sm_90a body and visit only the listed blocks; 128 x 64 blocks
 * (not multiples of its 128-key tiles) fall back to the sm_80 body. */
START_TEST(user_block_mask) {
  const int QL = 200, KL = 300, H = 2, E = 64;
  flex_kernel *k = tl_load("samples/sliding_window.score", NULL, NULL);
  flex_param win = {"window", 40};
  DLDataType f16 = rt_dtype(kDLFloat, 16), f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  int64_t qs[4] = {1, H, QL, E}, ks[4] = {1, H, KL, E}, ls[3] = {1, H, QL};
  TlArr q, kk, v;
  tl_arr_init(&q, f16, 4, qs), tl_arr_normal(&q, &rng);
  tl_arr_init(&kk, f16, 4, ks), tl_arr_normal(&kk, &rng);
  tl_arr_init(&v, f16, 4, ks), tl_arr_normal(&v, &rng);
  for (int blk = 128; blk >= 64; blk /= 2) {
    TlArr out[2], lse[2];
    flex_block_mask *bm = NULL;
    flex_args a;
    memset(&a, 0, sizeof a);
    a.params = &win, a.nparams = 1;
    ck_assert_msg(flex_block_mask_create(&bm, k, &a, 1, H, QL, KL, 128, blk, NULL) == FLEX_OK, "%s",
                  flex_last_error());
    bool sm90 = false;
    for (int i = 1; i >= 0; i--) {
      tl_arr_init(&out[i], i ? f64 : f32, 4, qs), tl_arr_init(&lse[i], i ? f64 : f32, 3, ls);
      tl_arr_poison(&out[i]), tl_arr_poison(&lse[i]);
      a.backend = i ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
      a.arch = i ? NULL : "sm_90a";
      a.q = &q.t, a.k = &kk.t, a.v = &v.t, a.out = &out[i].t, a.lse = &lse[i].t;
      a.block_mask = bm;
      ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "%d-blocks: %s", blk, flex_last_error());
      if (!i) sm90 = rt_run_last_stats().fwd_sm90;
    }
    double eo = tl_rel_err(&out[0].a, &out[1].a), el = tl_rel_err(&lse[0].a, &lse[1].a);
    fprintf(stderr, "  sliding_window BlockMask 128x%d fp16: %s body, out %.2g lse %.2g\n", blk,
            sm90 ? "sm_90a" : "sm_80", eo, el);
    ck_assert_msg(sm90 == (blk == 128), "%d-blocks: the %s body ran", blk, sm90 ? "sm_90a" : "sm_80");
    ck_assert_msg(eo < 5e-3 && el < 5e-3, "%d-blocks: out %g lse %g", blk, eo, el);
    for (int i = 0; i < 2; i++) tl_arr_free(&out[i]), tl_arr_free(&lse[i]);
    flex_block_mask_free(bm);
  }
  tl_arr_free(&q), tl_arr_free(&kk), tl_arr_free(&v);
  flex_kernel_free(k);
}
END_TEST

/* An unknown arch is the caller's error, named, on every backend. */
START_TEST(bad_arch) {
  flex_kernel *k = tl_load("samples/causal.score", NULL, NULL);
  int64_t sh[4] = {1, 1, 8, 16};
  TlArr q, o, l;
  tl_arr_init(&q, rt_dtype(kDLFloat, 16), 4, sh), tl_arr_normal(&q, &rng);
  tl_arr_init(&o, rt_dtype(kDLFloat, 32), 4, sh), tl_arr_init(&l, rt_dtype(kDLFloat, 32), 3, sh);
  for (int i = 0; i < 2; i++) {
    flex_args a;
    memset(&a, 0, sizeof a);
    a.backend = i ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
    a.arch = "sm_91x";
    a.q = a.k = a.v = &q.t, a.out = &o.t, a.lse = &l.t;
    ck_assert_int_eq(flex_forward(k, &a), FLEX_ERR_INVALID);
    ck_assert_msg(strstr(flex_last_error(), "arch 'sm_91x'"), "%s", flex_last_error());
  }
  tl_arr_free(&q), tl_arr_free(&o), tl_arr_free(&l);
  flex_kernel_free(k);
}
END_TEST

int main(int argc, char **argv) {
  rng = tl_seed();
  bool full = false;
  for (int i = 1; i < argc; i++) {
    full |= !strcmp(argv[i], "--full");
    on_cuda |= !strcmp(argv[i], "--cuda");
  }
  want_sm90 = true;
  if (on_cuda) {
    int major = 0, minor = 0, rc = tl_cuda_setup(); /* CK_FORK=no: one process uses the device */
    if (rc) return rc;
    if (rt_drv_compute_capability(0, &major, &minor) != FLEX_OK) {
      printf("device 0: %s\n", flex_last_error());
      return 1;
    }
    const char *on = getenv("FLEXC_CUDA_SM90_FWD");
    want_sm90 = major == 9 && minor == 0 && on && !strcmp(on, "1") && rt_drv_has_tensor_maps();
    fprintf(stderr, "cuda device 0: compute capability %d.%d, sm_90a forward %s\n", major, minor,
            want_sm90 ? "expected" : "not expected");
  }
  Suite *su = suite_create("emu_sm90_fwd");
  TCase *tc = tcase_create("forward");
  tcase_set_timeout(tc, 600);
  if (full) {
    tcase_add_loop_test(tc, sample_full, 0, NSAMPLES * 2 * NSHAPES);
  } else {
    tcase_add_loop_test(tc, sample_default, 0, NSAMPLES * 2);
    tcase_add_test(tc, fallback_unaligned);
    if (!on_cuda) { /* emulator only: the arch field and packed batches on host tensors */
      tcase_add_test(tc, bad_arch);
      tcase_add_test(tc, packed_batch);
      tcase_add_test(tc, user_block_mask);
    }
  }
  suite_add_tcase(su, tc);
  return tl_run_suite(su);
}
