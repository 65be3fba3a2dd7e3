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
  const char *name;   /* for messages */
  const char *sample; /* samples/ file, or NULL for `src` */
  const char *src;    /* inline source when sample is NULL */
  const char *param;  /* a float param to set (NULL: none) */
  double param_value;
  const char *buffer; /* a buffer to pass (NULL: none): f32[H] or, with `nb`, f32[H, nb] */
  int nb;             /* second dim of the buffer (0: 1-D) */
  bool grad;          /* the buffer is `grad`: check its gradient too */
  int masked_rows;    /* leading query rows the mask hides entirely */
} Sample;

static const Sample samples[] = {
    {"identity", NULL, "score ident(s, b, h, q, kv) { return s; }\n", NULL, 0, NULL, 0, false, 0},
    {"softcap", "softcap", NULL, "softcap", 3.0, NULL, 0, false, 0},
    {"alibi", "alibi", NULL, NULL, 0, "slopes", 0, false, 0},
    {"relpos_bias", "relpos_bias", NULL, NULL, 0, "rel_bias", 33, true, 0},
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

/* Tested dtypes: fp16, bf16, fp32 (tl_dtypes indices). */
static const int dtypes[3] = {1, 2, 0};

/* One backward through both backends, from the reference forward's O and
 * LSE; fails on any error above the gradient tolerance. block_kv > 0: both
 * get a BlockMask of the sample's mask made by flex_block_mask_create with
 * 128-row blocks of block_kv keys. */
static void run_case_mask(int si, int di, const Shape *s, int block_kv) {
  const Sample *sm = &samples[si];
  const TlCase tc = {.sample = sm->sample, .name = sm->name, .src = sm->src,
                     .s = {s->B, s->H, s->HKV, s->QL, s->KL, s->E, s->E}, .dt = &tl_dtypes[dtypes[di]],
                     .backend = FLEX_BACKEND_EMU, .dlse = s->dlse, .native_out = true, .native_grads = true};
  TlCall c;
  tl_call_init(&c, &tc, &rng);
  if (sm->param) tl_call_param(&c, sm->param, sm->param_value);
  if (sm->buffer) {
    int64_t shape[2] = {s->H, sm->nb};
    TlArr *b = tl_call_buffer(&c, sm->buffer, rt_dtype(kDLFloat, 32), sm->nb ? 2 : 1, shape, sm->grad);
    for (int64_t i = 0; i < rt_array_count(&b->a); i++)
      rt_array_set(&b->a, i, sm->nb ? 0.5 * tl_normal(&rng) : 0.05 + 0.5 * tl_uniform(&rng));
  }
  tl_call_ref_outputs(&c);
  if (block_kv > 0) tl_call_block_mask(&c, NULL, 128, block_kv);
  tl_call_backward(&c);
  tl_call_check(&c, TL_BWD, sm->name);
  ck_assert_msg(c.masked == s->B * s->H * sm->masked_rows, "%s: %d fully masked rows, want %d", sm->name,
                c.masked, s->B * s->H * sm->masked_rows);
  tl_call_free(&c);
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
  return TL_MAIN("emu_bwd", 120, TL_LOOP(backward, NSAMPLES * 3), TL_LOOP(backward_wide, 2),
                 TL_LOOP(backward_racecheck, 2), TL_LOOP(backward_block_mask, 2));
}
