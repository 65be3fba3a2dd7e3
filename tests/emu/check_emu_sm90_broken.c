/* The emulator against bugs in the sm_90a forward and backward: the
 * generated source for sm_90a with kernels/flex_fwd_sm90.cuh or
 * flex_bwd_sm90.cuh (as embedded) mutated the way a kernel change could
 * break its pipeline or layouts, compiled and launched on the emulator with
 * its tensor maps (rt_launch_fwd_tma, rt_launch_bwd_tma; the backward's
 * cases run the whole sequence: flex_fwd, flex_bwd_pre, flex_bwd,
 * flex_bwd_dq, and compare dQ, dK and dV). Each mutation
 * must be caught: the launch fails (a TMA refill of a stage an in-flight
 * wgmma reads, a deadlock, a broken rule) or the result leaves the
 * tolerance against the float64 reference. The unmutated controls (plain
 * and race-check) must pass, so a detection means the mutation. A mutation
 * whose text is not in the template exactly once fails the test.
 *
 * Not caught, and so not listed: a consumer that skips its wait on a
 * stage's `full` phase. The emulator lands a bulk copy once no thread of
 * the block can move, and the consumers always block first (on the Q
 * barrier, or in a wgmma.wait_group, which is released only after pending
 * copies land), so every copy has landed before they read it. In the
 * backward, a consumer that skips the `dsbar` wait before the dQ wgmma:
 * the wgmma needs all 128 threads at the same instruction, so in the
 * emulator every warp has written its dS by then. A consumer that skips
 * its wait for `dqempty` before restaging dQ: the dQ warp becomes runnable
 * at the consumers' `dqfull` arrival and reduces (and reads) the buffer
 * before they can stage into it again two tiles later, so no emulated
 * schedule restages a buffer under a pending reduction.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/params.cuh"
#include "runtime/launch.h"
#include "runtime/npy.h"
#include "runtime/rt.h"
#include "testlib_mutant.h"

static uint64_t rng;

/* A mask that keeps every row alive (it drops one element in eight): the
 * per-element path runs on every tile, and its pattern repeats only every
 * 32 rows and keys, so one warp's 16 differ from the next's. No score
 * function, so the body is the two-consumer one with the S / P V overlap;
 * no division, so the backward's consumers split the keys at E = 128 (a
 * dividing walk does not fit the producer's 24 registers). */
static const char kSource[] = "mask m(b, h, q, kv) { return ((q * 7 + kv * 3) & 31) < 28; }\n";
/* No score and no mask: the backward's interior tiles take its steady body. */
static const char kIdentity[] = "score identity(s, b, h, q, kv) { return s; }\n";

enum { B = 1, H = 2, HKV = 1, QL = 70, KL = 400, E = 64 }; /* GQA, 2 row tiles, 4 key tiles */

typedef struct Case {
  const char *what;  /* the bug, in words */
  const char *from;  /* text of the template that must occur exactly once (NULL: clean) */
  const char *to;    /* its replacement */
  TlDetect detect;   /* TL_PASS (the control), TL_FAILS (the launch), TL_WRONG (the result, or the launch) */
} Case;

static const Case cases[] = {
    {"clean", NULL, NULL, TL_PASS},
    {"stage freed before the wait that retires its P V",
     "    flex_wgmma_wait<0>();\n    if (GEN ? prev : OVERLAP) flex_mbar_arrive(emptyb + ps);",
     "    if (GEN ? prev : OVERLAP) flex_mbar_arrive(emptyb + ps);\n    flex_wgmma_wait<0>();", TL_FAILS},
    {"S read before the wait that retires it (P V still pending too)", "flex_wgmma_wait<1>();",
     "flex_wgmma_wait<2>();", TL_WRONG},
    {"producer refills a stage without waiting for `empty`",
     "if (i >= 2) flex_mbar_wait(emptyb + s,", "if (i < 0) flex_mbar_wait(emptyb + s,", TL_WRONG},
    {"V k16 step of 8 rows instead of 16", "flex_wgmma_desc_at(dv, ks * 2048)",
     "flex_wgmma_desc_at(dv, ks * 1024)", TL_WRONG},
    {"V descriptor advanced by part of 16 bytes (the emulator's descriptor check)",
     "flex_wgmma_desc_at(dv, ks * 2048)", "flex_wgmma_desc_at(dv, ks * 2048 + 8)", TL_FAILS},
    {"K descriptor without the 128-byte swizzle",
     "c.dK = flex_wgmma_desc(flex_smem_addr(sK), 16, 1024, 128)",
     "c.dK = flex_wgmma_desc(flex_smem_addr(sK), 16, 1024, 0)", TL_WRONG},
    {"mask rows of warp 0 for every warp", "(live, p, b, h, r0 + 16 * w + g,", "(live, p, b, h, r0 + g,",
     TL_WRONG},
    {"P fragment halves swapped", "a[ks][1] = El::pack(sacc[8 * ks + 2], sacc[8 * ks + 3]);",
     "a[ks][1] = El::pack(sacc[8 * ks + 4], sacc[8 * ks + 5]);", TL_WRONG},
    {"second consumer reads the first one's Q", "flex_smem_addr(sQ + c.cw * QBYTES)",
     "flex_smem_addr(sQ)", TL_WRONG},
    {"second consumer's rows start at the first one's", "c.r0 = m0 + 64 * c.cw,", "c.r0 = m0,",
     TL_WRONG},
    {"`empty` expects one consumer warpgroup", "flex_mbar_init(emptyb + s, 128 * NC);",
     "flex_mbar_init(emptyb + s, 128);", TL_FAILS},
    {"no wgmma.fence before the last P V",
     "      flex_wgmma_fence();\n      flex_fwd_sm90_pv<El, EVPT, BN>(o, a, flex_wgmma_desc_at(dV, ps * VBYTES));",
     "      flex_fwd_sm90_pv<El, EVPT, BN>(o, a, flex_wgmma_desc_at(dV, ps * VBYTES));", TL_FAILS},
    {"nobody gives the first consumer its first turn",
     "if (NC > 1 && c.cw == 0) flex_bar_arrive<1, 256>();", "", TL_FAILS},
    {"a consumer hands the turn to itself", "c.bar_other = 2 - c.cw", "c.bar_other = 1 + c.cw", TL_FAILS},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

/* Mutations of flex_bwd_sm90.cuh (the first is the control), at head dim
 * EB = 128: two consumers split 128 keys (KS), dK and dV fill two panels,
 * a tile is one step of 64 query rows and dQ goes through bulk reductions
 * by the dQ warp. */
enum { EB = 128 };
static const Case bwd_cases[] = {
    {"clean backward", NULL, NULL, TL_PASS},
    {"stage freed (and dS published) before the wait that retires dV and dK",
     "      flex_wgmma_wait<0>();\n    };", "    };", TL_WRONG},
    {"dS written without the 128-byte swizzle", "(((2 * w + ((lane >> 3) & 1)) ^ (lane & 7)) << 4)",
     "((2 * w + ((lane >> 3) & 1)) << 4)", TL_WRONG},
    {"dS rows of a block's second 8 queries written over its first", "((lane >> 4) * 8 + (lane & 7)) * 128",
     "(lane & 7) * 128", TL_WRONG},
    {"dQ's K k16 step of 8 keys instead of 16", "flex_wgmma_desc_at(nKq, ks * 2048)",
     "flex_wgmma_desc_at(nKq, ks * 1024)", TL_WRONG},
    {"P^T and dS^T fragment halves swapped",
     "El::pack(d[8 * ks + 2 * i], d[8 * ks + 2 * i + 1])",
     "El::pack(d[8 * ks + 2 * i + 1], d[8 * ks + 2 * i])", TL_WRONG},
    {"mask keys of warp 0 for every warp", "(live, p, b, h, n0 + kc + 16 * w + g, m0 + 2 * t4, full)",
     "(live, p, b, h, n0 + kc + g, m0 + 2 * t4, full)", TL_WRONG},
    {"LSE left in the natural-log domain", ": lse * FLEX_LOG2E;", ": lse;", TL_WRONG},
    {"no wgmma.fence before dV and dK", "      flex_wgmma_fence();\n#pragma unroll\n      for (int ks = 0; ks < BM / 16; ks++)\n        W::template rs<VC",
     "#pragma unroll\n      for (int ks = 0; ks < BM / 16; ks++)\n        W::template rs<VC", TL_FAILS},
    {"producer refills a stage without waiting for `empty`",
     "        if (i >= 2) flex_mbar_wait(emptyb + s,", "        if (i < 0) flex_mbar_wait(emptyb + s,",
     TL_WRONG},
    /* the loader warp stages each tile's LSE and D */
    {"`full` completes on the walker's arrival alone", "flex_mbar_init(fullb + s, 33);",
     "flex_mbar_init(fullb + s, 1);", TL_FAILS},
    {"the loader warp stages a tile before the walker published it",
     "    flex_mbar_wait(wordsb + s, (uint32_t)(i >> 1) & 1);\n", "", TL_WRONG},
    {"every tile's LSE and D from stage 0's records", "flex_lds_f32x4(ld, ald + s * 512 + 64 * j);",
     "flex_lds_f32x4(ld, ald + 64 * j);", TL_WRONG},
    {"a row's D in its LSE's place", "      rec[2] = dls;", "      rec[0] = dls;", TL_WRONG},
    /* dQ through bulk reductions (E % 4 == 0, one consumer): the consumers
     * stage, the dQ warp reduces */
    {"dQ rows reduced once the first consumer thread staged its own",
     "flex_mbar_init(dqfull + s, 128 * NC);", "flex_mbar_init(dqfull + s, 1);", TL_FAILS},
    /* two consumers splitting the keys */
    {"second consumer's keys start at the first one's", "const int kc = KS ? 64 * cw : 0;",
     "const int kc = 0;", TL_WRONG},
    {"second consumer's dS written over the first one's panel", "(KS ? cw * PANEL : 0) + ((lane",
     "0 + ((lane", TL_WRONG},
    {"second consumer's dQ from the first one's panel of K", "flex_wgmma_desc_at(nK, KS ? cw * PANELKV : 0)",
     "flex_wgmma_desc_at(nK, 0)", TL_WRONG},
    {"second consumer's dQ staged over the first one's columns", "(KS ? DQN * cw : 0)", "0", TL_WRONG},
    {"`dsbar` expects one consumer warpgroup (keys split)", "flex_mbar_init(dsbar, 128 * NC);",
     "flex_mbar_init(dsbar, 128);", TL_FAILS},
    {"dQ's last row of a tile never added", "for (int r = l; r < 64; r += 32)",
     "for (int r = l; r < 63; r += 32)", TL_WRONG},
    {"dQ warp reading the other buffer", "sdq + (s * 64 + r) * RF", "sdq + ((1 - s) * 64 + r) * RF",
     TL_WRONG},
};
#define NBWD ((int)(sizeof bwd_cases / sizeof *bwd_cases))

/* Mutations of the two-consumer backward (head dim EW = 256: consumer c
 * owns dK, dV and dQ columns 128 c .. 128 c + 127, both compute S^T and
 * dP^T, consumer 0 writes dS). */
enum { EW = 256 };
static const Case bwd2_cases[] = {
    {"clean two-consumer backward", NULL, NULL, TL_PASS},
    {"second consumer's dK from the first one's Q panels", "qcol = KS ? 0 : cw * (KC / 64) * PANEL,",
     "qcol = 0,", TL_WRONG},
    {"second consumer's dV from the first one's dO panels", "ocol = KS ? 0 : cw * (VC / 64) * PANEL;",
     "ocol = 0;", TL_WRONG},
    {"second consumer's dQ columns skipped", "c < (cw + 1) * (KP / NC)", "c < KP / NC", TL_WRONG},
    {"second consumer's dK and dV stored at the first one's columns",
     "const int kcol = KS ? 0 : cw * KC, vcol = KS ? 0 : cw * VC;", "const int kcol = 0, vcol = 0;",
     TL_WRONG},
    {"`empty` expects one consumer warpgroup", "flex_mbar_init(emptyb + s, 128 * NC);",
     "flex_mbar_init(emptyb + s, 128);", TL_FAILS},
    {"`dsbar` expects one consumer warpgroup", "flex_mbar_init(dsbar, 128 * NC);",
     "flex_mbar_init(dsbar, 128);", TL_FAILS},
};
#define NBWD2 ((int)(sizeof bwd2_cases / sizeof *bwd2_cases))

/* Mutations of the backward's steady body (an identity score at EB: of
 * the 3 x 2 tiles of QB x KB, those inside both sequences take it). */
static const Case steady_cases[] = {
    {"clean steady backward", NULL, NULL, TL_PASS},
    {"steady P without the row's LSE", "flex_nonpos(fmaf(qk, scale_log2, -lse2))",
     "flex_nonpos(fmaf(qk, scale_log2, 0.0f))", TL_WRONG},
    {"steady dS without D", "xs * fmaf(dpt[e], p.scale, -dl)", "xs * dpt[e] * p.scale", TL_WRONG},
    {"steady P left out of dV (dS's place)", "              dpt[e] = xs * fmaf(dpt[e], p.scale, -dl);\n              st[e] = xs;",
     "              dpt[e] = xs * fmaf(dpt[e], p.scale, -dl);\n              st[e] = dpt[e];", TL_WRONG},
    /* (sending every tile to the steady body is not a mutation to catch:
     * with the tile's LSE staged, +inf past Q_LEN, it is right at the
     * sequence ends too; flex_bwd_sm90.cuh says why it is not done) */
    {"steady LSE and D of query pair t4 for every thread", "flex_smem_addr(sld) + 16 * t4",
     "flex_smem_addr(sld)", TL_WRONG},
    {"steady D of the first tile's rows in every tile", "flex_gload(p.delta + row)",
     "flex_gload(p.delta + row - m0)", TL_WRONG},
};
#define NSTEADY ((int)(sizeof steady_cases / sizeof *steady_cases))

/* The generated sm_90a kernels (the backward too when bwd, at head dim e)
 * for `c`, the mutated template spliced in where it is included (its
 * include guard hides the original). */
static char *mutated_source(const flex_kernel *k, const Case *c, bool bwd, int e, CgOptions *o) {
  char err[256];
  ck_assert_msg(cg_options_init(o, k->mod, CG_FP16, e, e, CG_SM90A, bwd, err, sizeof err), "%s", err);
  ck_assert_msg(o->fwd_sm90 && (!bwd || o->bwd_sm90), "sm_90a fp16 did not pick the sm_90a kernels");
  if (k->mod->mask) o->mask_mode = CG_MASK_DENSE; /* no block lists here; no mask: none */
  o->out_f32 = true; /* O is compared in float32 */
  o->source = c->what;
  Buf gen = {0};
  cg_emit_cuda(&gen, k->mod, o);
  const char *file = bwd ? "flex_bwd_sm90.cuh" : "flex_fwd_sm90.cuh";
  char at[64];
  snprintf(at, sizeof at, "#include \"%s\"\n", file);
  char *src = tl_mutant_source(gen.data, at, c->from ? file : NULL, c->from, c->to);
  buf_free(&gen);
  return src;
}

static const char *emu_tmap(void *ctx, FlexTmapBytes *map, const void *base, const uint64_t dims[4],
                            const uint64_t strides[3], const uint32_t box[4]) {
  (void)ctx;
  return emu_tensor_map_encode((FlexTensorMap *)map, 2, 4, base, dims, strides, box, 128);
}

/* The call the kernels run on: fp16 q, k, v, dO (and dQ, dK, dV), O and
 * LSE float32, B x H x ql x kl at head dim e; the reference's results
 * (forward, and backward when bwd) computed. */
static void call_init(TlCall *t, const char *src, int ql, int kl, int e, bool bwd) {
  const TlCase tc = {.name = "broken90.score", .src = src, .s = {B, H, HKV, ql, kl, e, e},
                     .dt = &tl_dtypes[1], .backend = FLEX_BACKEND_EMU, .native_grads = true};
  tl_call_init(t, &tc, &rng);
  ck_assert_msg(tl_call_run(t, 1, false) == FLEX_OK, "reference: %s", flex_last_error());
  ck_assert_msg(!bwd || tl_call_run(t, 1, true) == FLEX_OK, "reference: %s", flex_last_error());
}

/* The launch parameters of call t (its tested side). */
static FlexParams params_of(TlCall *t) {
  const TlShape *s = &t->c.s;
  FlexParams p;
  memset(&p, 0, sizeof p);
  p.out = t->out[0].t.data, p.lse = t->lse[0].t.data;
  p.q = t->q.t.data, p.k = t->k.t.data, p.v = t->v.t.data;
  p.dout = t->dout.t.data, p.dq = t->dq[0].t.data, p.dk = t->dk[0].t.data, p.dv = t->dv[0].t.data;
  p.sq = p.so = p.sdo = p.sdq = (FlexStrides){(int64_t)H * s->QL * s->E, (int64_t)s->QL * s->E, s->E};
  p.sk = p.sv = p.sdk = p.sdv = (FlexStrides){(int64_t)HKV * s->KL * s->E, (int64_t)s->KL * s->E, s->E};
  p.lse_b = H * s->QL, p.lse_h = s->QL;
  int32_t sizes[5] = {B, H, HKV, s->QL, s->KL};
  memcpy(p.sizes, sizes, sizeof sizes);
  p.B = B, p.H = H, p.HKV = HKV, p.G = H / HKV, p.q_len = s->QL, p.kv_len = s->KL, p.E = p.EV = s->E;
  p.scale = (float)(1.0 / sqrt((double)s->E));
  p.vec16 = 1;
  p.dq_splits = 1;
  return p;
}

/* Build (plain or race-check) and run case c on fresh inputs; the relative
 * error of O and LSE against the reference into *err (inf when the launch
 * failed), the launch's message into msg. */
static flex_status run_case(const void *ctx, bool race, char *msg, double *err) {
  const Case *c = ctx;
  TlCall t;
  call_init(&t, kSource, QL, KL, E, false);
  CgOptions o;
  char *src = mutated_source(t.kern, c, false, E, &o);
  EmuModule *m = tl_mutant_build(src, race, c->what);
  FlexParams p = params_of(&t);
  FlexFwdTma tm;
  ck_assert_msg(rt_launch_fwd_tma(&o, &p, emu_tmap, NULL, &tm) == FLEX_OK, "%s", flex_last_error());
  EmuRange r[5] = {{(uintptr_t)p.q, (uint64_t)B * H * QL * E * 2, "q"},
                   {(uintptr_t)p.k, (uint64_t)B * HKV * KL * E * 2, "k"},
                   {(uintptr_t)p.v, (uint64_t)B * HKV * KL * E * 2, "v"},
                   {(uintptr_t)p.out, (uint64_t)B * H * QL * E * 4, "out"},
                   {(uintptr_t)p.lse, (uint64_t)B * H * QL * 4, "lse"}};
  flex_status st = tl_mutant_launch(m, "flex_fwd", &tm, cg_launch_fwd(&o, B, H, QL), r, 5, msg);
  double eo = tl_rel_err(&t.out[0].a, &t.out[1].a), el = tl_rel_err(&t.lse[0].a, &t.lse[1].a);
  *err = st != FLEX_OK ? INFINITY : eo >= el ? eo : el;
  fprintf(stderr, "  %-52s %s: status %d, error %.3g%s%.200s\n", c->what, race ? "race-check" : "plain",
          st, *err, msg[0] ? ": " : "", msg);
  tl_call_free(&t);
  base_free(src);
  return st;
}

START_TEST(mutation) { tl_mutant_expect(cases[_i].what, cases[_i].detect, 5e-3, run_case, &cases[_i]); }
END_TEST

/* A backward case: the mutation, its head dim and the kernel's source;
 * no_dnorm: the launch without FlexParams.dnorm (every tile general). */
typedef struct BwdCase {
  const Case *c;
  int e;
  const char *src;
  bool no_dnorm;
} BwdCase;

/* As run_case for a backward case at head dim eb: the forward (sm_90a,
 * unmutated), then flex_bwd_pre, the (mutated) flex_bwd and flex_bwd_dq;
 * *err is the largest relative error of dQ, dK and dV against the
 * reference. */
static flex_status run_bwd_case(const void *ctx, bool race, char *msg, double *err) {
  const Case *c = ((const BwdCase *)ctx)->c;
  const int eb = ((const BwdCase *)ctx)->e;
  enum { QB = 70, KB = 150 }; /* two query tiles, three key tiles, both with tails */
  TlCall t;
  call_init(&t, ((const BwdCase *)ctx)->src, QB, KB, eb, true);
  CgOptions o;
  char *src = mutated_source(t.kern, c, true, eb, &o);
  EmuModule *m = tl_mutant_build(src, race, c->what);
  int64_t sd[1] = {2 * (int64_t)B * H * QB}, sa[1] = {(int64_t)B * H * QB * eb}; /* D, then sum |dO| */
  TlArr delta, acc;
  tl_arr_init(&delta, rt_dtype(kDLFloat, 32), 1, sd), tl_arr_init(&acc, rt_dtype(kDLFloat, 32), 1, sa);
  tl_arr_poison(&delta), tl_arr_poison(&acc);
  FlexParams p = params_of(&t);
  p.delta = delta.t.data, p.dq_acc = acc.t.data;
  p.dnorm = ((const BwdCase *)ctx)->no_dnorm ? NULL : (float *)delta.t.data + (int64_t)B * H * QB;
  FlexFwdTma tf;
  FlexBwdTma tb;
  ck_assert_msg(rt_launch_fwd_tma(&o, &p, emu_tmap, NULL, &tf) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(rt_launch_bwd_tma(&o, &p, emu_tmap, NULL, &tb) == FLEX_OK, "%s", flex_last_error());
  const uint64_t nq = (uint64_t)B * H * QB, nk = (uint64_t)B * HKV * KB;
  EmuRange r[11] = {{(uintptr_t)p.q, nq * eb * 2, "q"},          {(uintptr_t)p.k, nk * eb * 2, "k"},
                    {(uintptr_t)p.v, nk * eb * 2, "v"},          {(uintptr_t)p.out, nq * eb * 4, "out"},
                    {(uintptr_t)p.lse, nq * 4, "lse"},          {(uintptr_t)p.dout, nq * eb * 2, "dout"},
                    {(uintptr_t)p.dq, nq * eb * 2, "dq"},        {(uintptr_t)p.dk, nk * eb * 2, "dk"},
                    {(uintptr_t)p.dv, nk * eb * 2, "dv"},        {(uintptr_t)p.delta, nq * 8, "delta"},
                    {(uintptr_t)p.dq_acc, nq * eb * 4, "dq_acc"}};
  flex_status st = tl_mutant_launch(m, "flex_fwd", &tf, cg_launch_fwd(&o, B, H, QB), r, 11, msg);
  if (!st) st = tl_mutant_launch(m, "flex_bwd_pre", &p, cg_launch_bwd_pre(&o, B, H, QB), r, 11, msg);
  if (!st) st = tl_mutant_launch(m, "flex_bwd", &tb, cg_launch_bwd(&o, B, HKV, KB), r, 11, msg);
  if (!st) st = tl_mutant_launch(m, "flex_bwd_dq", &p, cg_launch_bwd_dq(&o, B, H, QB), r, 11, msg);
  double e[3] = {tl_rel_err(&t.dq[0].a, &t.dq[1].a), tl_rel_err(&t.dk[0].a, &t.dk[1].a),
                 tl_rel_err(&t.dv[0].a, &t.dv[1].a)};
  *err = 0;
  for (int i = 0; i < 3; i++)
    if (!(e[i] <= *err)) *err = e[i]; /* NaN wins */
  if (st) *err = INFINITY;
  fprintf(stderr, "  %-52s %s: status %d, dq %.3g dk %.3g dv %.3g%s%.200s\n", c->what,
          race ? "race-check" : "plain", st, e[0], e[1], e[2], msg[0] ? ": " : "", msg);
  tl_arr_free(&delta), tl_arr_free(&acc);
  tl_call_free(&t);
  base_free(src);
  return st;
}

START_TEST(bwd_mutation) {
  const BwdCase bc = {&bwd_cases[_i], EB, kSource, false};
  tl_mutant_expect(bc.c->what, bc.c->detect, 2e-2, run_bwd_case, &bc);
}
END_TEST

START_TEST(steady_mutation) {
  const BwdCase bc = {&steady_cases[_i], EB, kIdentity, false};
  tl_mutant_expect(bc.c->what, bc.c->detect, 2e-2, run_bwd_case, &bc);
}
END_TEST

/* Without a row's sum |dO| (FlexParams.dnorm NULL, which the runtime never
 * passes to this kernel but a caller of the launch may) the flags send
 * every tile to the general body, which must still be right: the control,
 * plain and race-checked, must pass. */
START_TEST(steady_without_dnorm) {
  static const Case c = {"clean steady backward without sum |dO|", NULL, NULL, TL_PASS};
  const BwdCase bc = {&c, EB, kIdentity, true};
  tl_mutant_expect(bc.c->what, bc.c->detect, 2e-2, run_bwd_case, &bc);
}
END_TEST

START_TEST(bwd2_mutation) {
  CgOptions o;
  flex_kernel *k = tl_load(NULL, "broken90.score", kSource);
  char *src = mutated_source(k, &bwd2_cases[0], true, EW, &o); /* else the cases test the one-consumer body */
  ck_assert_msg(o.bwd_sm90 && cg_bwd_sm90_consumers(&o) == 2 && o.bwd.threads == 384,
                "E = %d: not the two-consumer sm_90a backward", EW);
  base_free(src);
  flex_kernel_free(k);
  const BwdCase bc = {&bwd2_cases[_i], EW, kSource, false};
  tl_mutant_expect(bc.c->what, bc.c->detect, 2e-2, run_bwd_case, &bc);
}
END_TEST

int main(void) {
  rng = tl_seed();
  return TL_MAIN("emu_sm90_broken", 0, TL_CASE("mutations", 300), TL_LOOP(mutation, NCASES),
                 TL_LOOP(bwd_mutation, NBWD), TL_LOOP(steady_mutation, NSTEADY), TL_TEST(steady_without_dnorm),
                 TL_CASE("two_consumers", 600), /* the backward above head dim 128 */
                 TL_LOOP(bwd2_mutation, NBWD2));
}
