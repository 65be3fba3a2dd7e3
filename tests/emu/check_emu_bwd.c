/* Backward on the emulator against the float64 reference: the generated
 * fp16/bf16 tensor-core backward (and the fp32 SIMT one as a control) for
 * an identity score, soft-capping, ALiBi with a causal mask, a relative
 * bias table with a `grad` buffer, and a window mask with fully masked
 * rows, on odd shapes (head dims 15 and 72, and 136 for the 32-key
 * tiles; Q_LEN 37, KV_LEN 70, GQA, MQA, with and without dLSE), and the
 * window mask through a caller's BlockMask of 64-key blocks.
 *
 * Both backends get the very same inputs: q, k, v, dO (and dLSE) drawn in
 * the tested dtype, and O and LSE from the reference forward rounded to
 * the dtype the kernels read, so the comparison measures the backward
 * alone. Outputs are poisoned with NaN first; every element counts. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;

/* A kernel under test and the extras it needs. */
typedef struct Sample {
  const char *name;  /* for messages */
  const char *path;  /* samples/ file, or NULL for `src` */
  const char *src;   /* inline source when path is NULL */
  const char *param; /* a float param to set (NULL: none) */
  double param_value;
  const char *buffer; /* a buffer to pass (NULL: none): f32[H] or, with `nb`, f32[H, nb] */
  int nb;             /* second dim of the buffer (0: 1-D) */
  bool grad;          /* the buffer is `grad`: check its gradient too */
  int masked_rows;    /* leading query rows the mask hides entirely */
} Sample;

static const Sample samples[] = {
    {"identity", NULL, "score ident(s, b, h, q, kv) { return s; }\n", NULL, 0, NULL, 0, false, 0},
    {"softcap", "samples/softcap.score", NULL, "softcap", 3.0, NULL, 0, false, 0},
    {"alibi", "samples/alibi.score", NULL, NULL, 0, "slopes", 0, false, 0},
    {"relpos_bias", "samples/relpos_bias.score", NULL, NULL, 0, "rel_bias", 33, true, 0},
    {"window", NULL,
     "param int window = 40;\n"
     "mask shifted_window(b, h, q, kv) { return q >= kv + 5 && q - kv < window; }\n",
     NULL, 0, NULL, 0, false, 5},
};
enum { NSAMPLES = sizeof samples / sizeof *samples };

/* Shapes: two head dims (two modules per sample and dtype), GQA and MQA. */
typedef struct Shape {
  int B, H, HKV, QL, KL, E;
  bool dlse;
} Shape;

static const Shape shapes[] = {
    {1, 4, 2, 37, 70, 15, true},  /* GQA, dLSE */
    {2, 3, 1, 37, 70, 15, false}, /* MQA */
    {1, 4, 1, 37, 70, 72, true},  /* MQA, dLSE */
    {2, 4, 2, 37, 70, 72, false}, /* GQA */
};
enum { NSHAPES = sizeof shapes / sizeof *shapes };

/* Tested dtypes and their gradient tolerances. */
static const struct {
  uint8_t code, bits;
  double tol;
  const char *name;
} dtypes[] = {{kDLFloat, 16, 2e-2, "fp16"}, {kDLBfloat, 16, 6e-2, "bf16"}, {kDLFloat, 32, 1e-3, "fp32"}};

/* The rows of dq for query i < n of every (batch, head) are exactly zero. */
static bool rows_zero(const TlPair *dq, const Shape *s, int n) {
  for (int bh = 0; bh < s->B * s->H; bh++)
    for (int i = 0; i < n; i++)
      for (int e = 0; e < s->E; e++)
        if (rt_array_get(&dq->x, ((int64_t)bh * s->QL + i) * s->E + e) != 0.0) return false;
  return true;
}

static flex_kernel *load(const Sample *sm) { return tl_load(sm->path, sm->name, sm->src); }

/* Every tensor of one call. */
typedef struct Tensors {
  TlPair q, k, v, dout, out, lse, dlse, dq, dk, dv, grad;
  RtArray buf;        /* the sample's buffer (fp32), shared by both backends */
  DLTensor tbuf;
  flex_param prm;
  flex_buffer fb[2];  /* emulator, reference */
} Tensors;

static void tensors_init(Tensors *t, const Sample *sm, const Shape *s, DLDataType dt) {
  int64_t qs[4] = {s->B, s->H, s->QL, s->E}, ks[4] = {s->B, s->HKV, s->KL, s->E};
  int64_t ls[3] = {s->B, s->H, s->QL}, bs[2] = {s->H, sm->nb};
  DLDataType f32 = rt_dtype(kDLFloat, 32);
  memset(t, 0, sizeof *t);
  tl_pair_init(&t->q, dt, 4, qs, true, &rng), tl_pair_init(&t->k, dt, 4, ks, true, &rng);
  tl_pair_init(&t->v, dt, 4, ks, true, &rng), tl_pair_init(&t->dout, dt, 4, qs, true, &rng);
  tl_pair_init(&t->out, dt, 4, qs, false, &rng), tl_pair_init(&t->lse, f32, 3, ls, false, &rng);
  tl_pair_init(&t->dlse, f32, 3, ls, true, &rng), tl_pair_init(&t->dq, dt, 4, qs, false, &rng);
  tl_pair_init(&t->dk, dt, 4, ks, false, &rng), tl_pair_init(&t->dv, dt, 4, ks, false, &rng);
  t->prm = (flex_param){sm->param, sm->param_value};
  if (!sm->buffer) return;
  rt_array_init(&t->buf, f32, sm->nb ? 2 : 1, bs);
  for (int64_t i = 0; i < rt_array_count(&t->buf); i++)
    rt_array_set(&t->buf, i, sm->nb ? 0.5 * tl_normal(&rng) : 0.05 + 0.5 * tl_uniform(&rng));
  t->tbuf = rt_array_tensor(&t->buf);
  tl_pair_init(&t->grad, f32, sm->nb ? 2 : 1, bs, false, &rng);
  t->fb[0] = (flex_buffer){sm->buffer, &t->tbuf, sm->grad ? &t->grad.tx : NULL};
  t->fb[1] = (flex_buffer){sm->buffer, &t->tbuf, sm->grad ? &t->grad.tref : NULL};
}

static void tensors_free(Tensors *t, const Sample *sm) {
  TlPair *all[] = {&t->q, &t->k, &t->v, &t->dout, &t->out,
                   &t->lse, &t->dlse, &t->dq, &t->dk, &t->dv};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tl_pair_free(all[i]);
  if (sm->buffer) rt_array_free(&t->buf), tl_pair_free(&t->grad);
}

/* Arguments for the emulator (ref == false) or the reference. */
static flex_args args_for(Tensors *t, const Sample *sm, const Shape *s, bool ref) {
  flex_args a;
  memset(&a, 0, sizeof a);
#define T(P) (ref ? &t->P.tref : &t->P.tx)
  a.backend = ref ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
  a.q = T(q), a.k = T(k), a.v = T(v), a.out = T(out), a.lse = T(lse), a.dout = T(dout);
  a.dlse = s->dlse ? T(dlse) : NULL;
  a.dq = T(dq), a.dk = T(dk), a.dv = T(dv);
#undef T
  if (sm->param) a.params = &t->prm, a.nparams = 1;
  if (sm->buffer) a.buffers = &t->fb[ref ? 1 : 0], a.nbuffers = 1;
  return a;
}

/* Reference forward, then O and LSE rounded to what the kernels read, into both twins. */
static void forward(flex_kernel *k, Tensors *t, const Sample *sm, const Shape *s) {
  flex_args r = args_for(t, sm, s, true);
  ck_assert_msg(flex_forward(k, &r) == FLEX_OK, "reference forward: %s", flex_last_error());
  TlPair *ol[] = {&t->out, &t->lse};
  for (int j = 0; j < 2; j++)
    for (int64_t i = 0; i < rt_array_count(&ol[j]->x); i++) {
      rt_array_set(&ol[j]->x, i, rt_array_get(&ol[j]->ref, i));
      rt_array_set(&ol[j]->ref, i, rt_array_get(&ol[j]->x, i));
    }
}

/* One backward through both backends; fails on any error above tol.
 * block_kv > 0: both get a BlockMask of the sample's mask made by
 * flex_block_mask_create with 128-row blocks of block_kv keys. */
static void run_case_mask(int si, int di, const Shape *s, int block_kv) {
  const Sample *sm = &samples[si];
  DLDataType dt = rt_dtype(dtypes[di].code, dtypes[di].bits);
  flex_kernel *k = load(sm);
  Tensors t;
  tensors_init(&t, sm, s, dt);
  forward(k, &t, sm, s);
  flex_args r = args_for(&t, sm, s, true), a = args_for(&t, sm, s, false);
  flex_block_mask *bm = NULL;
  if (block_kv > 0) {
    ck_assert_msg(flex_block_mask_create(&bm, k, &r, s->B, s->H, s->QL, s->KL, 128, block_kv, NULL) ==
                      FLEX_OK, "%s", flex_last_error());
    r.block_mask = a.block_mask = bm;
  }
  ck_assert_msg(flex_backward(k, &r) == FLEX_OK, "reference backward: %s", flex_last_error());
  ck_assert_msg(flex_backward(k, &a) == FLEX_OK, "emu backward: %s", flex_last_error());
  double eq = tl_pair_err(&t.dq), ek = tl_pair_err(&t.dk), ev = tl_pair_err(&t.dv);
  double eg = sm->grad ? tl_pair_err(&t.grad) : 0.0, tol = dtypes[di].tol;
  fprintf(stderr, "  %s %s B%d H%d HKV%d E%d%s: dq %.2g dk %.2g dv %.2g%s", sm->name,
          dtypes[di].name, s->B, s->H, s->HKV, s->E, s->dlse ? " dlse" : "", eq, ek, ev,
          sm->grad ? "" : "\n");
  if (sm->grad) fprintf(stderr, " d%s %.2g\n", sm->buffer, eg);
  ck_assert_msg(eq < tol && ek < tol && ev < tol && eg < tol,
                "%s %s E=%d H=%d HKV=%d: gradient error dq %g dk %g dv %g grad %g (tol %g)",
                sm->name, dtypes[di].name, s->E, s->H, s->HKV, eq, ek, ev, eg, tol);
  ck_assert_msg(rows_zero(&t.dq, s, sm->masked_rows), "%s: fully masked rows got nonzero dq",
                sm->name);
  if (bm) flex_block_mask_free(bm);
  tensors_free(&t, sm);
  flex_kernel_free(k);
}

static void run_case(int si, int di, const Shape *s) { run_case_mask(si, di, s, 0); }

/* _i = sample * 3 + dtype: every shape. */
START_TEST(backward) {
  for (int i = 0; i < NSHAPES; i++) run_case(_i / 3, _i % 3, &shapes[i]);
}
END_TEST

/* The race-checking build of the 16-bit kernels: the grad buffer's and
 * dQ's atomics, fully masked rows, GQA. */
START_TEST(backward_racecheck) {
  setenv("FLEXC_EMU_RACECHECK", "1", 1);
  run_case(_i == 0 ? 3 : 4, _i, &shapes[_i == 0 ? 2 : 0]);
  unsetenv("FLEXC_EMU_RACECHECK");
}
END_TEST

/* Head dim 136 (padded 144): 32-key tiles, column groups that do not
 * split evenly over the warps. */
START_TEST(backward_wide) {
  const Shape s = {1, 2, 1, 37, 70, 136, true};
  run_case(_i == 0 ? 0 : 2, _i, &s);
}
END_TEST

/* A caller's BlockMask of 64-key blocks: the backward's 128-key tiles
 * narrow to 64 keys (cg_fit_mask_blocks, the forward's too) instead of refusing the call;
 * lengths of several full and partial blocks (fp16, then bf16). */
START_TEST(backward_block_mask) {
  const Shape s = {1, 2, 1, 150, 300, 64, true};
  run_case_mask(4, _i, &s, 64);
}
END_TEST

int main(void) {
  rng = tl_seed();
  Suite *s = suite_create("emu_bwd");
  TCase *tc = tcase_create("backward");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, backward, 0, NSAMPLES * 3);
  tcase_add_loop_test(tc, backward_wide, 0, 2);
  tcase_add_loop_test(tc, backward_racecheck, 0, 2);
  tcase_add_loop_test(tc, backward_block_mask, 0, 2);
  suite_add_tcase(s, tc);
  return tl_run_suite(s);
}
