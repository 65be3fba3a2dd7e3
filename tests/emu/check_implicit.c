/* Masks that cost nothing in the kernels, on the emulator against the
 * float64 reference through the public API:
 *
 *  - implicit masks (the analysis decides the mask, the walk classifies
 *    tiles itself): causal, lower-right causal, sliding window, prefix LM,
 *    document (sorted ids), NATTEN, dilated, NATTEN in Morton order (bit
 *    operations in int helpers); forward and backward;
 *  - the same masks as explicit user BlockMasks (built with
 *    runtime/blockmask.c, passed as DLTensors, q side left for the runtime
 *    to derive on half of them);
 *  - an undecidable mask (an unsorted buffer) through the builder kernels,
 *    whose block counts must equal the CPU builder's;
 *  - visited tiles == live tiles (BlockMask at the kernel's tile sizes),
 *    forward and backward, for causal and a sliding window.
 *
 * Fresh random inputs every run, NaN-poisoned outputs, relative norm error
 * per tensor; NaN never passes. One dtype per case (rotating) keeps the
 * number of emulator compiles, and so the run time, small.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "runtime/blockmask.h"
#include "runtime/flex.h"
#include "runtime/backend.h"
#include "runtime/launch.h"
#include "runtime/npy.h"
#include "runtime/rt.h"
#include "testlib.h"

static uint64_t rng;

/* One mask under test. */
typedef struct Case {
  const char *name;
  const char *src;      /* .score text */
  const char *pname[2]; /* params (NULL: none) */
  double pval[2];
  bool doc;             /* has a `doc` buffer of QL ids (sorted, or shuffled when !sorted ids) */
  bool shuffled;        /* doc ids in random order (the undecidable case) */
} Case;

static const Case cases[] = {
    {"causal", "mask m(b, h, q, kv) { return q >= kv; }", {0}, {0}, false, false},
    {"lower_right", "mask m(b, h, q, kv) { return q + (KV_LEN - Q_LEN) >= kv; }", {0}, {0}, false, false},
    {"sliding_window", "param int window = 40;\nmask m(b, h, q, kv) { return q >= kv && q - kv < window; }",
     {"window"}, {37}, false, false},
    {"prefix_lm", "param int prefix = 9;\nmask m(b, h, q, kv) { return kv < prefix || q >= kv; }",
     {"prefix"}, {45}, false, false},
    {"document", "buffer doc: i32[T] sorted;\nmask m(b, h, q, kv) { return doc[q] == doc[kv] && q >= kv; }",
     {0}, {0}, true, false},
    {"natten", "param int width = 16;\nparam int radius = 2;\nmask m(b, h, q, kv) {\n"
               "  let dr = q / width - kv / width;\n  let dc = q % width - kv % width;\n"
               "  return abs(dr) <= radius && abs(dc) <= radius;\n}",
     {"width", "radius"}, {16, 2}, false, false},
    {"dilated", "param int dilation = 3;\nmask m(b, h, q, kv) { return q >= kv && (q - kv) % dilation == h % dilation; }",
     {"dilation"}, {3}, false, false},
    /* attention-gym's NATTEN over a Morton (Z) order image, written with bit
     * operations in typed int helpers (tests/frontend/cases/ir_natten_morton) */
    {"natten_morton", "const RADIUS = 1;\nint compact(int v) {\n  let a = v & 0x55555555;\n"
                      "  let b = (a | (a >> 1)) & 0x33333333;\n  let c = (b | (b >> 2)) & 0x0F0F0F0F;\n"
                      "  let d = (c | (c >> 4)) & 0x00FF00FF;\n  return (d | (d >> 8)) & 0x0000FFFF;\n}\n"
                      "bool near(int a, int b) { return abs(a - b) <= RADIUS; }\n"
                      "mask m(b, h, q_idx, kv_idx) {\n  return near(compact(q_idx), compact(kv_idx)) && "
                      "near(compact(q_idx >> 1), compact(kv_idx >> 1));\n}",
     {0}, {0}, false, false},
    {"unsorted", "buffer doc: i32[T];\nmask m(b, h, q, kv) { return doc[q] == doc[kv]; }", {0}, {0}, true, true},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

enum { B = 1, H = 2, HKV = 1, QL = 150, KL = 150, E = 16 };

/* One case's call, and the user BlockMask the emulator may get. */
typedef struct Run {
  TlCall c;              /* the call: [0] the emulator, [1] the reference */
  RtBlockMask bm;        /* the user mask (when given) */
  DLTensor bt[8];        /* its arrays as DLTensors */
  int64_t bshape[8][4];  /* their shapes */
  flex_block_mask um;    /* what the emulator gets */
  bool have_bm;
} Run;

static void run_init(Run *r, const Case *c, const TlDtype *d) {
  memset(r, 0, sizeof *r);
  const TlCase tc = {.name = c->name, .src = c->src, .s = {B, H, HKV, QL, KL, E, E}, .dt = d,
                     .backend = FLEX_BACKEND_EMU};
  tl_call_init(&r->c, &tc, &rng);
  for (int i = 0; i < 2 && c->pname[i]; i++) tl_call_param(&r->c, c->pname[i], c->pval[i]);
  if (c->doc) { /* runs of random length; shuffled ids break the sorted promise on purpose */
    int64_t n = QL;
    TlArr *doc = tl_call_buffer(&r->c, "doc", rt_dtype(kDLInt, 32), 1, &n, false);
    int id = 0;
    for (int i = 0; i < QL; i++) {
      if (i && tl_uniform(&rng) < 0.08) id++;
      rt_array_set(&doc->a, i, c->shuffled ? (int)(tl_uniform(&rng) * 3) : id);
    }
  }
}

static void run_free(Run *r) {
  if (r->have_bm) rt_block_mask_free(&r->bm);
  tl_call_free(&r->c);
}

/* The kernels' tile options for this dtype (what the emulator generates). */
static CgOptions options(const Run *r, const TlDtype *d) {
  CgOptions o;
  char err[256];
  CgDtype cd = d->code == kDLBfloat ? CG_BF16 : d->bits == 16 ? CG_FP16 : CG_FP32;
  ck_assert(cg_options_init(&o, r->c.kern->mod, cd, E, E, CG_SM80, true, err, sizeof err));
  return o;
}

/* The mask at block sizes bq x bk on the CPU (exact: analysis + evaluation). */
static RtMaskStats cpu_mask(Run *r, int bq, int bk, RtBlockMask *out) {
  Arena arena = {0};
  RtCall c;
  ck_assert_msg(rt_validate(&c, &arena, r->c.kern, &r->c.a[1], false, NULL) == FLEX_OK, "%s",
                flex_last_error());
  IrIntervalEnv env = {c.params, c.sizes, c.bufs};
  RtMaskShape shape = {B, H, QL, KL, bq, bk, 0, 0};
  RtMaskStats st;
  RtBlockMask bm;
  ck_assert_msg(rt_block_mask_build(&bm, r->c.kern->mod, &env, &shape, RT_MASK_EVAL, &st) ==
                    FLEX_OK, "%s", flex_last_error());
  if (out) *out = bm;
  else rt_block_mask_free(&bm);
  arena_free(&arena);
  return st;
}

/* Hand the emulator the CPU-built mask as DLTensors (q side only when with_q). */
static void give_user_mask(Run *r, const TlDtype *d, bool with_q) {
  CgOptions o = options(r, d);
  int bq, bk;
  cg_mask_blocks(&o, &bq, &bk);
  cpu_mask(r, bq, bk, &r->bm);
  r->have_bm = true;
  RtBlockMask *b = &r->bm;
  int32_t *arr[8] = {b->kv_num_blocks, b->kv_indices, b->full_kv_num_blocks, b->full_kv_indices,
                     b->q_num_blocks, b->q_indices, b->full_q_num_blocks, b->full_q_indices};
  int rows[8] = {b->nq, b->nq, b->nq, b->nq, b->nkv, b->nkv, b->nkv, b->nkv};
  int cols[8] = {0, b->nkv, 0, b->nkv, 0, b->nq, 0, b->nq};
  const DLTensor *tp[8];
  for (int i = 0; i < 8; i++) {
    int64_t *s = r->bshape[i];
    s[0] = b->B, s[1] = b->H, s[2] = rows[i], s[3] = cols[i];
    r->bt[i] = (DLTensor){.data = arr[i], .device = {kDLCPU, 0}, .ndim = cols[i] ? 4 : 3,
                          .dtype = rt_dtype(kDLInt, 32), .shape = s};
    tp[i] = arr[i] && (with_q || i < 4) ? &r->bt[i] : NULL;
  }
  r->um = (flex_block_mask){bq, bk, tp[0], tp[1], tp[2], tp[3], tp[4], tp[5], tp[6], tp[7]};
  r->c.a[0].block_mask = &r->um;
}

/* Forward and backward on both backends; every output within tolerance. */
static void compare(Run *r, const Case *c, const char *how, RtRunStats *fs, RtRunStats *bs) {
  tl_call_forward(&r->c);
  if (fs) *fs = rt_run_last_stats();
  tl_call_backward(&r->c);
  if (bs) *bs = rt_run_last_stats();
  char label[64];
  snprintf(label, sizeof label, "%s %s", c->name, how);
  tl_call_check(&r->c, TL_FWD | TL_BWD, label);
}

/* ---- implicit masks ------------------------------------------------------------- */

START_TEST(implicit_mask) {
  const Case *c = &cases[_i];
  const TlDtype *d = &tl_dtypes[_i % 3];
  Run r;
  run_init(&r, c, d);
  RtRunStats fs, bs;
  compare(&r, c, "implicit", &fs, &bs);
  ck_assert_msg(fs.mode == CG_MASK_IMPLICIT && bs.mode == CG_MASK_IMPLICIT, "%s: mode %d", c->name,
                fs.mode);
  /* vec16 exactly when its conditions hold (16-bit, E % 8 == 0, aligned rows). */
  bool aligned = ((uintptr_t)r.c.q.a.data | (uintptr_t)r.c.k.a.data | (uintptr_t)r.c.v.a.data |
                  (uintptr_t)r.c.dout.a.data) % 16 == 0;
  ck_assert_int_eq(fs.vec16, d->bits == 16 && aligned);
  run_free(&r);
}
END_TEST

/* ---- explicit user BlockMasks ---------------------------------------------------- */

START_TEST(user_mask) {
  const Case *c = &cases[_i];
  const TlDtype *d = &tl_dtypes[(_i + 1) % 3];
  Run r;
  run_init(&r, c, d);
  give_user_mask(&r, d, _i % 2 == 0);
  RtRunStats fs;
  compare(&r, c, _i % 2 ? "user(kv)" : "user", &fs, NULL);
  ck_assert_int_eq(fs.mode, CG_MASK_LISTS);
  ck_assert(!fs.built);
  run_free(&r);
}
END_TEST

/* ---- undecidable: the builder kernels --------------------------------------------- */

START_TEST(builder) {
  const Case *c = &cases[NCASES - 1];
  const TlDtype *d = &tl_dtypes[_i];
  Run r;
  run_init(&r, c, d);
  RtRunStats fs, bs;
  compare(&r, c, "built", &fs, &bs);
  ck_assert(fs.built && bs.built);
  CgOptions o = options(&r, d);
  int bq, bk;
  cg_mask_blocks(&o, &bq, &bk);
  RtMaskStats st = cpu_mask(&r, bq, bk, NULL);
  ck_assert(!st.decidable);
  ck_assert_msg(fs.blocks[0] == st.empty && fs.blocks[1] == st.full && fs.blocks[2] == st.partial,
                "built %lld/%lld/%lld, cpu %lld/%lld/%lld (empty/full/partial)",
                (long long)fs.blocks[0], (long long)fs.blocks[1], (long long)fs.blocks[2],
                (long long)st.empty, (long long)st.full, (long long)st.partial);
  run_free(&r);
}
END_TEST

/* ---- visited tiles == live tiles -------------------------------------------------- */

START_TEST(visited_tiles) {
  const Case *c = &cases[_i == 0 ? 0 : 2]; /* causal, sliding window */
  const TlDtype *d = &tl_dtypes[1];
  Run r;
  run_init(&r, c, d);
  RtRunStats fs, bs;
  compare(&r, c, "count", &fs, &bs);
  CgOptions o = options(&r, d);
  RtMaskStats f = cpu_mask(&r, o.fwd.block_m, o.fwd.block_n, NULL);
  RtMaskStats b = cpu_mask(&r, o.bwd.block_m, o.bwd.block_n, NULL);
  int64_t scale = (int64_t)B * H / (f.total / ((QL + o.fwd.block_m - 1) / o.fwd.block_m) /
                                    ((KL + o.fwd.block_n - 1) / o.fwd.block_n));
  int64_t live_f = (f.full + f.partial) * scale, live_b = (b.full + b.partial) * scale;
  int64_t all_f = (int64_t)B * H * ((QL + o.fwd.block_m - 1) / o.fwd.block_m) *
                  ((KL + o.fwd.block_n - 1) / o.fwd.block_n);
  fprintf(stderr, "  %s: forward visited %llu live %lld of %lld; backward visited %llu live %lld\n",
          c->name, (unsigned long long)fs.fwd_tiles, (long long)live_f, (long long)all_f,
          (unsigned long long)bs.bwd_tiles, (long long)live_b);
  ck_assert(live_f < all_f); /* the mask must skip something to mean anything */
  ck_assert_int_eq((int64_t)fs.fwd_tiles, live_f);
  ck_assert_int_eq((int64_t)bs.bwd_tiles, live_b);
  run_free(&r);
}
END_TEST

/* ---- float masks: built lists, not an implicit walk ------------------------------- */

/* The forward tiles inside the live blocks of the mask built at the
 * kernels' mask blocks (cg_mask_blocks: the larger of the forward's and the
 * backward's tiles, which both divide), cut at Q_LEN and KV_LEN: what a
 * walk of the built lists visits. */
static int64_t fwd_tiles_of_live_blocks(Run *r, const CgOptions *o) {
  int bq, bk;
  cg_mask_blocks(o, &bq, &bk);
  RtBlockMask m;
  cpu_mask(r, bq, bk, &m);
  const int fm = o->fwd.block_m, fn = o->fwd.block_n;
  int64_t n = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int qb = 0; qb < m.nq; qb++) { /* B or H of 1 in the mask: broadcast */
        const int64_t row = ((int64_t)(m.B == 1 ? 0 : b) * m.H + (m.H == 1 ? 0 : h)) * m.nq + qb;
        const int rows = QL - qb * bq < bq ? QL - qb * bq : bq;
        const int cnt[2] = {m.kv_num_blocks[row], m.has_full ? m.full_kv_num_blocks[row] : 0};
        const int32_t *idx[2] = {m.kv_indices + row * m.nkv,
                                 m.has_full ? m.full_kv_indices + row * m.nkv : NULL};
        for (int j = 0; j < 2; j++)
          for (int i = 0; i < cnt[j]; i++) {
            const int kb = idx[j][i], keys = KL - kb * bk < bk ? KL - kb * bk : bk;
            n += (int64_t)((rows + fm - 1) / fm) * ((keys + fn - 1) / fn);
          }
      }
  rt_block_mask_free(&m);
  return n;
}

/* The device classifier treats floats as unknown, so a float mask walked
 * implicitly would visit every tile; it gets exact built lists instead, and
 * visits only the tiles of live mask blocks (the live forward tiles
 * themselves where the mask blocks are the forward's tiles). */
START_TEST(float_mask_built) {
  const Case c = {"float_band",
                  "mask m(b, h, q, kv) { return abs(float(q) * 0.75 - float(kv)) < 20.0; }",
                  {0}, {0}, false, false};
  const TlDtype *d = &tl_dtypes[_i];
  Run r;
  run_init(&r, &c, d);
  RtRunStats fs, bs;
  compare(&r, &c, "float", &fs, &bs);
  ck_assert_msg(fs.mode == CG_MASK_LISTS && fs.built && bs.built, "mode %d built %d", fs.mode, fs.built);
  CgOptions o = options(&r, d);
  RtMaskStats f = cpu_mask(&r, o.fwd.block_m, o.fwd.block_n, NULL);
  int64_t all_f = (int64_t)B * H * ((QL + o.fwd.block_m - 1) / o.fwd.block_m) *
                  ((KL + o.fwd.block_n - 1) / o.fwd.block_n);
  int64_t live_f = (f.full + f.partial) * (int64_t)B * H * ((QL + o.fwd.block_m - 1) / o.fwd.block_m) *
                   ((KL + o.fwd.block_n - 1) / o.fwd.block_n) / f.total;
  fprintf(stderr, "  float_band %s: forward visited %llu, live %lld of %lld\n", d->name,
          (unsigned long long)fs.fwd_tiles, (long long)live_f, (long long)all_f);
  ck_assert(live_f < all_f);
  const int64_t want = fwd_tiles_of_live_blocks(&r, &o);
  ck_assert(want < all_f);
  int bq, bk;
  cg_mask_blocks(&o, &bq, &bk);
  if (bq == o.fwd.block_m && bk == o.fwd.block_n) ck_assert_int_eq(want, live_f);
  ck_assert_int_eq((int64_t)fs.fwd_tiles, want);
  run_free(&r);
}
END_TEST

/* ---- the builder source compiles for the GPU ---------------------------------------- */

START_TEST(builder_source) {
  const Case *c = &cases[NCASES - 1];
  Run r;
  run_init(&r, c, &tl_dtypes[1]);
  CgOptions o = options(&r, &tl_dtypes[1]);
  o.mask_mode = CG_MASK_LISTS;
  o.mask_builder = true;
  Buf src = {0};
  cg_emit_cuda(&src, r.c.kern->mod, &o);
  ck_assert_ptr_nonnull(strstr(src.data, "flex_mask_build(const FlexParams p)"));
  ck_assert_ptr_nonnull(strstr(src.data, "flex_mask_lists(const FlexParams p)"));
  ck_assert_ptr_nonnull(strstr(src.data, "flex_mask_block("));
  buf_free(&src);
  run_free(&r);
}
END_TEST

int main(void) {
  rng = tl_seed();
  tl_one_process();
  return TL_MAIN("implicit", 600, TL_LOOP(implicit_mask, NCASES - 1), TL_LOOP(user_mask, NCASES - 1),
                 TL_LOOP(builder, 2), TL_LOOP(visited_tiles, 2), TL_LOOP(float_mask_built, 3),
                 TL_TEST(builder_source));
}
