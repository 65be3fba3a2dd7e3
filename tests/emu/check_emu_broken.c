/* The emulator against real kernel bugs: the generated forward kernel, with
 * one template (kernels/flex_fwd.cuh or kernels/tile.cuh, as embedded in the
 * library) mutated the way a kernel change could break it, is compiled and
 * launched on the emulator. Each negative test fails unless the emulator
 * catches its bug: a race-check report, a bounds-check failure, or a result
 * outside the tolerance against the float64 reference. The positive
 * controls run the unmutated source through the same path and must pass,
 * so a detection means the mutation, not the harness.
 *
 * A mutation names its exact text; if a template no longer contains it
 * exactly once the test fails, so an edited template gets its mutation
 * updated instead of silently testing nothing.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/params.cuh"
#include "runtime/npy.h"
#include "runtime/rt.h"
#include "testlib_mutant.h"

static uint64_t rng;

/* A score and a mask that keep every row alive (the mask drops about one
 * element in eleven), so the dense per-element mask path runs too. */
static const char kSource[] = "score sc(s, b, h, q, kv) { return s + 0.25 * float((q + 2 * kv) % 5); }\n"
                              "mask m(b, h, q, kv) { return (q + kv) % 11 != 3; }\n";

/* The steady loop's cases (Case.steady): an identity score and no mask,
 * so that full interior tiles take flex_fwd_tc's steady loop. */
static const char kPlain[] = "score ident(s, b, h, q, kv) { return s; }\n";

enum { B = 1, H = 2, HKV = 1 };
/* GQA, key tiles with ragged tails: 37 x 150 (every tile is an edge tile,
 * the general loop), or for the steady cases 256 x 400 (two full row tiles,
 * three interior key tiles and an edge one). */
static int QL = 37, KL = 150;

/* One test: a template edit, the problem it runs on, and what must happen. */
typedef struct Case {
  const char *what;  /* the bug, in words */
  const char *file;  /* embedded template to edit (NULL: none) */
  const char *from;  /* text that must occur exactly once */
  const char *to;    /* its replacement */
  CgDtype dtype;     /* CG_FP16 (tensor cores) or CG_FP32 (SIMT) */
  int E;             /* head dim (= EV) */
  bool padded;       /* rows 16 elements apart, NaN between E and 16 */
  bool vec16;        /* the cp.async tile path */
  TlDetect detect;   /* expected outcome */
  bool steady;       /* kPlain at 256 x 400: the steady loop runs */
  bool big;          /* inputs near 3e4: every row's max near 2^33 in the exp2 domain, where
                      * the first form's rounded reference is off by hundreds */
} Case;

static const Case cases[] = {
    {"clean fp16", NULL, NULL, NULL, CG_FP16, 64, false, false, TL_PASS, false, false},
    {"clean fp16 cp.async", NULL, NULL, NULL, CG_FP16, 64, false, true, TL_PASS, false, false},
    {"clean fp16 cp.async E=15 in 16-wide rows", NULL, NULL, NULL, CG_FP16, 15, true, true, TL_PASS,
     false, false},
    {"clean fp32", NULL, NULL, NULL, CG_FP32, 15, false, false, TL_PASS, false, false},
    {"clean fp16 steady loop", NULL, NULL, NULL, CG_FP16, 64, false, true, TL_PASS, true, false},
    {"clean fp16 steady loop, rows past 2^16", NULL, NULL, NULL, CG_FP16, 64, false, true, TL_PASS,
     true, true},
    {"no barrier between the tile wait and its readers", "flex_fwd.cuh",
     "            flex_cp_async_wait<0>();\n            __syncthreads();\n",
     "            flex_cp_async_wait<0>();\n", CG_FP16, 64, false, false, TL_RACE, false, false},
    {"steady loop: no barrier between the tile wait and its readers", "flex_fwd.cuh",
     "          flex_cp_async_wait<0>();\n          __syncthreads();\n",
     "          flex_cp_async_wait<0>();\n", CG_FP16, 64, false, true, TL_RACE, true, false},
    {"steady loop: next tile's loads issued before the barrier", "flex_fwd.cuh",
     "          flex_cp_async_wait<0>();\n          __syncthreads();\n          if (pf >= 0) {\n"
     "            copyK.load_fast((st ^ 1) * KSTAGE, k, p.sk.row, pf);\n"
     "            copyV.load_fast(vstage(st ^ 1), v, p.sv.row, pf);\n          }\n",
     "          if (pf >= 0) {\n            copyK.load_fast((st ^ 1) * KSTAGE, k, p.sk.row, pf);\n"
     "            copyV.load_fast(vstage(st ^ 1), v, p.sv.row, pf);\n          }\n"
     "          flex_cp_async_wait<1>();\n          __syncthreads();\n",
     CG_FP16, 64, false, true, TL_RACE, true, false},
    {"steady loop takes the tile at the key end", "flex_fwd.cuh",
     "(MASK_MODE == FLEX_MASK_NONE || cfull) && c < c1 &&\n                c + BN <= p.kv_len &&",
     "(MASK_MODE == FLEX_MASK_NONE || cfull) && c < c1 &&", CG_FP16, 64, false, true, TL_WRONG, true,
     false},
    {"rows past 2^16 kept in the steady loop's first form", "flex_fwd.cuh",
     "if (!GEN && SCORE_ID && __any_sync(0xffffffffu, big)) return true;", "", CG_FP16, 64, false,
     true, TL_WRONG, true, true},
    {"rows past 2^16 without x - a in the general step", "flex_fwd.cuh",
     "          for (int c = 0; c < 4; c++) s[m][j][c] -= a[c >> 1];",
     "          for (int c = 0; c < 4; c++) s[m][j][c] -= 0.0f * a[c >> 1];", CG_FP16, 64, false, true,
     TL_WRONG, true, true},
    {"fp32: no barrier between writing P and reading it", "flex_fwd.cuh",
     "      sP[r * PS + tr + TPR * j] = keep ? pj : 0.0f;\n    }\n    __syncthreads();\n",
     "      sP[r * PS + tr + TPR * j] = keep ? pj : 0.0f;\n    }\n", CG_FP32, 15, false, false, TL_RACE,
     false, false},
    {"V loaded with ldmatrix without .trans", "flex_fwd.cuh", "flex_ldsm_x4_trans(bv,",
     "flex_ldsm_x4(bv,", CG_FP16, 64, false, false, TL_WRONG, false, false},
    {"K ldmatrix rows from the wrong lanes", "flex_fwd.cuh",
     "(((lane & 7) + (lane >> 4) * 8) * KS", "(((lane & 7) + ((lane >> 3) & 1) * 8) * KS",
     CG_FP16, 64, false, false, TL_WRONG, false, false},
    {"Q ldmatrix column half off", "flex_fwd.cuh", "* QS + (lane >> 4) * 8) * 2;",
     "* QS + ((lane >> 3) & 1) * 8) * 2;", CG_FP16, 64, false, false, TL_WRONG, false, false},
    {"interior cp.async chunks read past the last rows", "tile.cuh",
     "const bool ok = row0 + r + k * RS < nrows;", "const bool ok = row0 + r + k * RS <= nrows + 64;",
     CG_FP16, 64, false, true, TL_BOUNDS, false, false},
    {"tile row tail off by one", "tile.cuh",
     "      T x = 0;\n      if (row0 + r < nrows && c < ncols) x",
     "      T x = 0;\n      if (row0 + r <= nrows && c < ncols) x", CG_FP16, 64, false, false, TL_BOUNDS,
     false, false},
    {"key tail off by one in the logit", "flex_fwd.cuh", "if (kj >= p.kv_len || qi >= p.q_len)",
     "if (kj > p.kv_len || qi >= p.q_len)", CG_FP32, 15, false, false, TL_WRONG, false, false},
    {"output rows past Q_LEN stored", "flex_fwd.cuh", "    if (qi >= p.q_len) continue;\n", "\n",
     CG_FP16, 64, false, false, TL_BOUNDS, false, false},
    {"fp32: output rows past Q_LEN stored", "flex_fwd.cuh", "  if (qi >= p.q_len) return;\n", "\n",
     CG_FP32, 15, false, false, TL_BOUNDS, false, false},
    {"cp.async chunk straddling the last column", "tile.cuh",
     "if (row_ok && c < ncols && c + 8 > ncols) {", "if (false) {", CG_FP16, 15, true, true, TL_WRONG,
     false, false},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

/* The generated forward source for `c`, with its mutation spliced in
 * where the template would be included (its include guard hides the original). */
static char *mutated_source(const flex_kernel *k, const Case *c, CgOptions *o) {
  char err[256];
  ck_assert_msg(cg_options_init(o, k->mod, c->dtype, c->E, c->E, CG_SM80, false, err, sizeof err),
                "%s", err);
  if (!c->steady) o->mask_mode = CG_MASK_DENSE;
  o->source = c->what;
  Buf gen = {0};
  cg_emit_cuda(&gen, k->mod, o);
  char *src = tl_mutant_source(gen.data, "#include \"flex_fwd.cuh\"\n", c->file, c->from, c->to);
  buf_free(&gen);
  return src;
}

/* Inputs (rows W elements apart), outputs and the float64 reference. */
typedef struct Data {
  int W;                        /* row pitch of q, k, v */
  RtArray q, k, v, out, lse;    /* emulator side */
  RtArray rout, rlse;           /* reference outputs */
} Data;

static DLTensor view(RtArray *a, int64_t heads, int64_t rows, int E, int W, int64_t *shape,
                     int64_t *strides) {
  shape[0] = B, shape[1] = heads, shape[2] = rows, shape[3] = E;
  strides[3] = 1, strides[2] = W, strides[1] = rows * W, strides[0] = heads * rows * W;
  DLTensor t = rt_array_tensor(a);
  t.shape = shape, t.strides = strides, t.ndim = 4;
  return t;
}

static void data_init(Data *d, const Case *c) {
  DLDataType dt = c->dtype == CG_FP32 ? rt_dtype(kDLFloat, 32) : rt_dtype(kDLFloat, 16);
  DLDataType f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  d->W = c->padded ? 16 : c->E;
  int64_t sq[4] = {B, H, QL, d->W}, sk[4] = {B, HKV, KL, d->W}, so[4] = {B, H, QL, c->E};
  int64_t sl[3] = {B, H, QL};
  rt_array_init(&d->q, dt, 4, sq), rt_array_init(&d->k, dt, 4, sk), rt_array_init(&d->v, dt, 4, sk);
  RtArray *in[] = {&d->q, &d->k, &d->v};
  for (int i = 0; i < 3; i++)
    for (int64_t j = 0; j < rt_array_count(in[i]); j++)
      rt_array_set(in[i], j, j % d->W < c->E ? (c->big ? 3e4 + 3e3 * tl_normal(&rng) : tl_normal(&rng)) : NAN);
  rt_array_init(&d->out, dt, 4, so), rt_array_init(&d->lse, f32, 3, sl);
  rt_array_init(&d->rout, f64, 4, so), rt_array_init(&d->rlse, f64, 3, sl);
  for (int64_t j = 0; j < rt_array_count(&d->out); j++) rt_array_set(&d->out, j, NAN);
  for (int64_t j = 0; j < rt_array_count(&d->lse); j++) rt_array_set(&d->lse, j, NAN);
}

static void data_free(Data *d) {
  RtArray *all[] = {&d->q, &d->k, &d->v, &d->out, &d->lse, &d->rout, &d->rlse};
  for (int i = 0; i < 7; i++) rt_array_free(all[i]);
}

static void reference(flex_kernel *k, Data *d, const Case *c) {
  int64_t s[3][4], st[3][4];
  DLTensor q = view(&d->q, H, QL, c->E, d->W, s[0], st[0]);
  DLTensor kk = view(&d->k, HKV, KL, c->E, d->W, s[1], st[1]);
  DLTensor v = view(&d->v, HKV, KL, c->E, d->W, s[2], st[2]);
  DLTensor o = rt_array_tensor(&d->rout), l = rt_array_tensor(&d->rlse);
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = FLEX_BACKEND_REFERENCE;
  a.q = &q, a.k = &kk, a.v = &v, a.out = &o, a.lse = &l;
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "reference: %s", flex_last_error());
}

/* Launch flex_fwd of module m on d; the launch error goes to msg. */
static flex_status launch(EmuModule *m, const CgOptions *o, Data *d, const Case *c, char *msg) {
  FlexParams p;
  memset(&p, 0, sizeof p);
  int W = d->W, es = c->dtype == CG_FP32 ? 4 : 2;
  p.out = d->out.data, p.lse = d->lse.data;
  p.q = d->q.data, p.k = d->k.data, p.v = d->v.data;
  p.sq = (FlexStrides){(int64_t)H * QL * W, (int64_t)QL * W, W};
  p.sk = p.sv = (FlexStrides){(int64_t)HKV * KL * W, (int64_t)KL * W, W};
  p.so = (FlexStrides){(int64_t)H * QL * c->E, (int64_t)QL * c->E, c->E};
  p.lse_b = H * QL, p.lse_h = QL;
  int32_t sizes[5] = {B, H, HKV, QL, KL};
  memcpy(p.sizes, sizes, sizeof sizes);
  p.B = B, p.H = H, p.HKV = HKV, p.G = H / HKV, p.q_len = QL, p.kv_len = KL, p.E = p.EV = c->E;
  p.scale = (float)(1.0 / sqrt((double)c->E));
  p.vec16 = c->vec16;
  ck_assert(!c->vec16 || ((uintptr_t)p.q % 16 == 0 && (uintptr_t)p.k % 16 == 0 &&
                          (uintptr_t)p.v % 16 == 0 && W * es % 16 == 0));
  /* Exactly the bytes each tensor spans: a padded row's tail is inside, the
   * last row's padding is not. */
  EmuRange r[5] = {
      {(uintptr_t)p.q, (uint64_t)(((int64_t)B * H * QL - 1) * W + c->E) * es, "q"},
      {(uintptr_t)p.k, (uint64_t)(((int64_t)B * HKV * KL - 1) * W + c->E) * es, "k"},
      {(uintptr_t)p.v, (uint64_t)(((int64_t)B * HKV * KL - 1) * W + c->E) * es, "v"},
      {(uintptr_t)p.out, (uint64_t)rt_array_count(&d->out) * es, "out"},
      {(uintptr_t)p.lse, (uint64_t)rt_array_count(&d->lse) * 4, "lse"}};
  return tl_mutant_launch(m, "flex_fwd", &p, cg_launch_fwd(o, B, H, QL), r, 5, msg);
}

/* Relative norm error of the emulator's out and lse (tl_rel_err: NaN, a
 * shape mismatch or an all-zero reference give infinity). */
static double result_err(const Data *d) {
  double eo = tl_rel_err(&d->out, &d->rout), el = tl_rel_err(&d->lse, &d->rlse);
  return eo >= el ? eo : el;
}

/* Build (plain or race-check) and run case c; returns the launch status. */
static flex_status run_case(const void *ctx, bool race, char *msg, double *err) {
  const Case *c = ctx;
  QL = c->steady ? 256 : 37, KL = c->steady ? 400 : 150;
  flex_kernel *k = tl_load(NULL, "broken.score", c->steady ? kPlain : kSource);
  CgOptions o;
  char *src = mutated_source(k, c, &o);
  EmuModule *m = tl_mutant_build(src, race, c->what);
  Data d;
  data_init(&d, c);
  reference(k, &d, c);
  flex_status st = launch(m, &o, &d, c, msg);
  *err = st == FLEX_OK ? result_err(&d) : INFINITY;
  fprintf(stderr, "  %-48s %s: status %d, error %.3g%s%s\n", c->what, race ? "race-check" : "plain",
          st, *err, msg[0] ? ": " : "", msg);
  data_free(&d);
  base_free(src);
  flex_kernel_free(k);
  return st;
}

START_TEST(mutation) {
  const Case *c = &cases[_i];
  tl_mutant_expect(c->what, c->detect, c->dtype == CG_FP32 ? 1e-4 : 5e-3, run_case, c);
}
END_TEST

int main(void) {
  rng = tl_seed();
  return TL_MAIN("emu_broken", 120, TL_LOOP(mutation, NCASES));
}
