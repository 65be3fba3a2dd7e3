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
 * emulator every warp has written its dS by then.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "emu/emu_host.h"
#include "kernels/params.cuh"
#include "runtime/embedded.h"
#include "runtime/launch.h"
#include "runtime/npy.h"
#include "runtime/rt.h"
#include "testlib.h"

static uint64_t rng;

/* A mask that keeps every row alive (it drops about one element in
 * eleven): the per-element path runs on every tile. No score function, so
 * the body is the two-consumer one with the S / P V overlap. */
static const char kSource[] = "mask m(b, h, q, kv) { return (q + kv) % 11 != 3; }\n";

enum { B = 1, H = 2, HKV = 1, QL = 70, KL = 400, E = 64 }; /* GQA, 2 row tiles, 4 key tiles */

typedef struct Case {
  const char *what; /* the bug, in words */
  const char *from; /* text of flex_fwd_sm90.cuh that must occur exactly once (NULL: clean) */
  const char *to;   /* its replacement */
  bool launch_fails; /* the emulator must fail the launch (else: a wrong result or a failure) */
} Case;

static const Case cases[] = {
    {"clean", NULL, NULL, false},
    {"stage freed before the wait that retires its P V",
     "    flex_wgmma_wait<0>();\n    if (prev) flex_mbar_arrive(emptyb + ps);",
     "    if (prev) flex_mbar_arrive(emptyb + ps);\n    flex_wgmma_wait<0>();", true},
    {"S read before the wait that retires it (P V still pending too)", "flex_wgmma_wait<1>();",
     "flex_wgmma_wait<2>();", false},
    {"producer refills a stage without waiting for `empty`",
     "if (i >= 2) flex_mbar_wait(emptyb + s,", "if (i < 0) flex_mbar_wait(emptyb + s,", false},
    {"V k16 step of 8 rows instead of 16", "aV + ks * 2048", "aV + ks * 1024", false},
    {"K descriptor without the 128-byte swizzle",
     "(kk / 4) * PANEL_KV + off, 16, 1024, 128)", "(kk / 4) * PANEL_KV + off, 16, 1024, 0)", false},
    {"mask rows of warp 0 for every warp", "(live, p, b, h, r0 + 16 * w + g,", "(live, p, b, h, r0 + g,",
     false},
    {"P fragment halves swapped", "a[ks][1] = El::pack(sacc[8 * ks + 2], sacc[8 * ks + 3]);",
     "a[ks][1] = El::pack(sacc[8 * ks + 4], sacc[8 * ks + 5]);", false},
    {"second consumer reads the first one's Q", "c.aQ = flex_smem_addr(sQ + c.cw * QBYTES)",
     "c.aQ = flex_smem_addr(sQ)", false},
    {"second consumer's rows start at the first one's", "c.r0 = m0 + 64 * c.cw,", "c.r0 = m0,",
     false},
    {"`empty` expects one consumer warpgroup", "flex_mbar_init(emptyb + s, 128 * NC);",
     "flex_mbar_init(emptyb + s, 128);", true},
    {"no wgmma.fence before the last P V",
     "      flex_wgmma_fence();\n      flex_fwd_sm90_pv<El, EVPT, BN>(o, a, aV + ps * VBYTES);",
     "      flex_fwd_sm90_pv<El, EVPT, BN>(o, a, aV + ps * VBYTES);", true},
    {"nobody gives the first consumer its first turn",
     "if (NC > 1 && c.cw == 0) flex_bar_arrive<1, 256>();", "", true},
    {"a consumer hands the turn to itself", "  if (cw == 0) flex_bar_arrive<2, 256>();",
     "  if (cw == 0) flex_bar_arrive<1, 256>();", true},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

/* Mutations of flex_bwd_sm90.cuh (the first is the control), at head dim
 * EB = 128: dK and dV fill two panels and a tile runs in two steps of 32
 * query rows. */
enum { EB = 128 };
static const Case bwd_cases[] = {
    {"clean backward", NULL, NULL, false},
    {"stage freed (and dS published) before the wait that retires dV and dK",
     "      flex_wgmma_wait<0>();\n    }\n    flex_mbar_arrive(emptyb + s);",
     "    }\n    flex_mbar_arrive(emptyb + s);", false},
    {"dS written without the 128-byte swizzle", "(((2 * w + r) ^ (2 * t4 + c)) << 4)", "((2 * w + r) << 4)",
     false},
    {"dQ's K k16 step of 8 keys instead of 16", "aK + c * PANEL + ks * 2048", "aK + c * PANEL + ks * 1024",
     false},
    {"P^T and dS^T fragment halves swapped",
     "El::pack(d[8 * ks + 2 * i], d[8 * ks + 2 * i + 1])",
     "El::pack(d[8 * ks + 2 * i + 1], d[8 * ks + 2 * i])", false},
    {"mask keys of warp 0 for every warp", "(live, p, b, h, n0 + 16 * w + g, mh + 2 * t4, full)",
     "(live, p, b, h, n0 + g, mh + 2 * t4, full)", false},
    {"LSE left in the natural-log domain", ": lse * FLEX_LOG2E;", ": lse;", false},
    {"no wgmma.fence before dV and dK", "      flex_wgmma_fence();\n#pragma unroll\n      for (int ks = 0; ks < QH / 16; ks++)\n        W::template rs<VC",
     "#pragma unroll\n      for (int ks = 0; ks < QH / 16; ks++)\n        W::template rs<VC", true},
    {"producer refills a stage without waiting for `empty`",
     "        if (i >= 2) flex_mbar_wait(emptyb + s,", "        if (i < 0) flex_mbar_wait(emptyb + s,",
     false},
    {"S^T of every step from the first step's Q rows", "aQ + s * KBYTES + qoff + off",
     "aQ + s * KBYTES + off", false},
};
#define NBWD ((int)(sizeof bwd_cases / sizeof *bwd_cases))

/* Mutations of the two-consumer backward (head dim EW = 256: consumer c
 * owns dK, dV and dQ columns 128 c .. 128 c + 127, both compute S^T and
 * dP^T, consumer 0 writes dS). */
enum { EW = 256 };
static const Case bwd2_cases[] = {
    {"clean two-consumer backward", NULL, NULL, false},
    {"second consumer's dK from the first one's Q panels", "qcol = cw * (KC / 64) * PANEL,",
     "qcol = 0,", false},
    {"second consumer's dV from the first one's dO panels", "ocol = cw * (VC / 64) * PANEL;",
     "ocol = 0;", false},
    {"second consumer's dQ columns skipped", "c < (cw + 1) * (KP / NC)", "c < KP / NC", false},
    {"second consumer's dK and dV stored at the first one's columns",
     "hk * p.sdk.h + cw * KC,\n    *dvp = (T *)p.dv + b * p.sdv.b + hk * p.sdv.h + cw * VC;",
     "hk * p.sdk.h,\n    *dvp = (T *)p.dv + b * p.sdv.b + hk * p.sdv.h;", false},
    {"`empty` expects one consumer warpgroup", "flex_mbar_init(emptyb + s, 128 * NC);",
     "flex_mbar_init(emptyb + s, 128);", true},
    {"`dsbar` expects one consumer warpgroup", "flex_mbar_init(dsbar, 128 * NC);",
     "flex_mbar_init(dsbar, 128);", true},
};
#define NBWD2 ((int)(sizeof bwd2_cases / sizeof *bwd2_cases))

/* The generated sm_90a forward for `c`, the mutated template spliced in
 * where it is included (its include guard hides the original). */
static char *mutated_source(const flex_kernel *k, const Case *c, CgOptions *o) {
  char err[256];
  ck_assert_msg(cg_options_init(o, k->mod, CG_FP16, E, E, CG_SM90A, false, err, sizeof err), "%s", err);
  ck_assert_msg(o->fwd_sm90, "sm_90a fp16 did not pick the sm_90a forward");
  o->mask_mode = CG_MASK_DENSE;
  o->out_f32 = true; /* O is compared in float32 */
  o->source = c->what;
  Buf gen = {0}, out = {0}, edit = {0};
  cg_emit_cuda(&gen, k->mod, o);
  if (!c->from) return gen.data;
  tl_replace_once(&edit, tl_embedded("flex_fwd_sm90.cuh"), c->from, c->to);
  buf_puts(&edit, "\n");
  tl_replace_once(&out, gen.data, "#include \"flex_fwd_sm90.cuh\"\n", edit.data);
  buf_free(&gen);
  buf_free(&edit);
  return out.data;
}

static const char *emu_tmap(void *ctx, FlexTmapBytes *map, const void *base, const uint64_t dims[4],
                            const uint64_t strides[3], const uint32_t box[4]) {
  (void)ctx;
  return emu_tensor_map_encode((FlexTensorMap *)map, 2, 4, base, dims, strides, box, 128);
}

/* Build (plain or race-check) and run case c on fresh inputs; the relative
 * error of O and LSE against the reference into *err (inf when the launch
 * failed), the launch's message into msg. */
static flex_status run_case(const Case *c, bool race, char *msg, double *err) {
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "broken90.score", kSource, strlen(kSource), NULL) ==
                FLEX_OK, "%s", flex_last_error());
  CgOptions o;
  char *src = mutated_source(k, c, &o);
  EmuBuildOpts bo = {.racecheck = race};
  Buf log = {0};
  EmuModule *m = NULL;
  ck_assert_msg(emu_module_get(&m, src, &bo, &log) == FLEX_OK, "%s: does not build:\n%s", c->what,
                log.data ? log.data : "");
  DLDataType f16 = rt_dtype(kDLFloat, 16), f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  int64_t sq[4] = {B, H, QL, E}, sk[4] = {B, HKV, KL, E}, sl[3] = {B, H, QL};
  TlArr q, kk, v, out, lse, rout, rlse;
  tl_arr_init(&q, f16, 4, sq), tl_arr_normal(&q, &rng);
  tl_arr_init(&kk, f16, 4, sk), tl_arr_normal(&kk, &rng);
  tl_arr_init(&v, f16, 4, sk), tl_arr_normal(&v, &rng);
  tl_arr_init(&out, f32, 4, sq), tl_arr_init(&lse, f32, 3, sl);
  tl_arr_init(&rout, f64, 4, sq), tl_arr_init(&rlse, f64, 3, sl);
  tl_arr_poison(&out), tl_arr_poison(&lse), tl_arr_poison(&rout), tl_arr_poison(&rlse);
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = FLEX_BACKEND_REFERENCE;
  a.q = &q.t, a.k = &kk.t, a.v = &v.t, a.out = &rout.t, a.lse = &rlse.t;
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "reference: %s", flex_last_error());

  FlexParams p;
  memset(&p, 0, sizeof p);
  p.out = out.t.data, p.lse = lse.t.data, p.q = q.t.data, p.k = kk.t.data, p.v = v.t.data;
  p.sq = p.so = (FlexStrides){(int64_t)H * QL * E, (int64_t)QL * E, E};
  p.sk = p.sv = (FlexStrides){(int64_t)HKV * KL * E, (int64_t)KL * E, E};
  p.lse_b = H * QL, p.lse_h = QL;
  int32_t sizes[5] = {B, H, HKV, QL, KL};
  memcpy(p.sizes, sizes, sizeof sizes);
  p.B = B, p.H = H, p.HKV = HKV, p.G = H / HKV, p.q_len = QL, p.kv_len = KL, p.E = p.EV = E;
  p.scale = (float)(1.0 / sqrt((double)E));
  p.vec16 = 1;
  FlexFwdTma t;
  ck_assert_msg(rt_launch_fwd_tma(&o, &p, emu_tmap, NULL, &t) == FLEX_OK, "%s", flex_last_error());
  EmuRange r[5] = {{(uintptr_t)p.q, (uint64_t)B * H * QL * E * 2, "q"},
                   {(uintptr_t)p.k, (uint64_t)B * HKV * KL * E * 2, "k"},
                   {(uintptr_t)p.v, (uint64_t)B * HKV * KL * E * 2, "v"},
                   {(uintptr_t)p.out, (uint64_t)B * H * QL * E * 4, "out"},
                   {(uintptr_t)p.lse, (uint64_t)B * H * QL * 4, "lse"}};
  CgLaunch g = cg_launch_fwd(&o, B, H, QL);
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = "flex_fwd";
  L.params = &t;
  L.grid = (EmuDim){g.grid[0], g.grid[1], g.grid[2]};
  L.block = (EmuDim){g.block[0], g.block[1], g.block[2]};
  L.smem_bytes = g.smem;
  L.ranges = r;
  L.nranges = 5;
  flex_status st = emu_module_launch(m, &L, NULL);
  snprintf(msg, EMU_ERR_LEN, "%s", L.error);
  double eo = tl_rel_err(&out.a, &rout.a), el = tl_rel_err(&lse.a, &rlse.a);
  *err = st != FLEX_OK ? INFINITY : eo >= el ? eo : el;
  fprintf(stderr, "  %-52s %s: status %d, error %.3g%s%.200s\n", c->what, race ? "race-check" : "plain",
          st, *err, msg[0] ? ": " : "", msg);
  TlArr *all[] = {&q, &kk, &v, &out, &lse, &rout, &rlse};
  for (int i = 0; i < 7; i++) tl_arr_free(all[i]);
  buf_free(&log);
  base_free(src);
  flex_kernel_free(k);
  return st;
}

START_TEST(mutation) {
  const Case *c = &cases[_i];
  char msg[EMU_ERR_LEN];
  double err;
  if (!c->from) { /* the control, plain and race-checked */
    for (int race = 0; race < 2; race++) {
      flex_status st = run_case(c, race, msg, &err);
      ck_assert_msg(st == FLEX_OK, "%s: %s", c->what, msg);
      ck_assert_msg(err < 5e-3, "%s: error %g", c->what, err);
    }
    return;
  }
  flex_status st = run_case(c, false, msg, &err);
  if (c->launch_fails)
    ck_assert_msg(st != FLEX_OK, "%s went undetected (error %g)", c->what, err);
  else
    ck_assert_msg(st != FLEX_OK || !(err < 5e-3), "%s went undetected (error %g)", c->what, err);
}
END_TEST

/* The generated sm_90a forward + backward at head dim eb with
 * flex_bwd_sm90.cuh mutated by c. */
static char *mutated_bwd_source(const flex_kernel *k, const Case *c, int eb, CgOptions *o) {
  char err[256];
  ck_assert_msg(cg_options_init(o, k->mod, CG_FP16, eb, eb, CG_SM90A, true, err, sizeof err), "%s", err);
  ck_assert_msg(o->fwd_sm90 && o->bwd_sm90, "sm_90a fp16 did not pick the sm_90a kernels");
  o->mask_mode = CG_MASK_DENSE;
  o->out_f32 = true;
  o->source = c->what;
  Buf gen = {0}, out = {0}, edit = {0};
  cg_emit_cuda(&gen, k->mod, o);
  if (!c->from) return gen.data;
  tl_replace_once(&edit, tl_embedded("flex_bwd_sm90.cuh"), c->from, c->to);
  buf_puts(&edit, "\n");
  tl_replace_once(&out, gen.data, "#include \"flex_bwd_sm90.cuh\"\n", edit.data);
  buf_free(&gen);
  buf_free(&edit);
  return out.data;
}

/* One launch of entry `name` with `params` on the emulator. */
static flex_status launch_one(EmuModule *m, const char *name, const void *params, CgLaunch g,
                              EmuRange *r, int nr, char *msg) {
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = name;
  L.params = params;
  L.grid = (EmuDim){g.grid[0], g.grid[1], g.grid[2]};
  L.block = (EmuDim){g.block[0], g.block[1], g.block[2]};
  L.smem_bytes = g.smem;
  L.ranges = r;
  L.nranges = nr;
  flex_status st = emu_module_launch(m, &L, NULL);
  snprintf(msg, EMU_ERR_LEN, "%.1000s", L.error); /* the emulator's message names the kernel */
  return st;
}

/* As run_case for a backward case at head dim eb: the forward (sm_90a,
 * unmutated), then flex_bwd_pre, the (mutated) flex_bwd and flex_bwd_dq;
 * *err is the largest relative error of dQ, dK and dV against the
 * reference. */
static flex_status run_bwd_case(const Case *c, int eb, bool race, char *msg, double *err) {
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "broken90.score", kSource, strlen(kSource), NULL) ==
                FLEX_OK, "%s", flex_last_error());
  CgOptions o;
  char *src = mutated_bwd_source(k, c, eb, &o);
  EmuBuildOpts bo = {.racecheck = race};
  Buf log = {0};
  EmuModule *m = NULL;
  ck_assert_msg(emu_module_get(&m, src, &bo, &log) == FLEX_OK, "%s: does not build:\n%s", c->what,
                log.data ? log.data : "");
  enum { QB = 70, KB = 150 }; /* two query tiles, three key tiles, both with tails */
  DLDataType f16 = rt_dtype(kDLFloat, 16), f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  int64_t sq[4] = {B, H, QB, eb}, sk[4] = {B, HKV, KB, eb}, sl[3] = {B, H, QB};
  int64_t sd[1] = {(int64_t)B * H * QB}, sa[1] = {(int64_t)B * H * QB * eb};
  TlArr q, kk, v, dout, out, lse, dq, dk, dv, delta, acc, rout, rlse, rdq, rdk, rdv;
  tl_arr_init(&q, f16, 4, sq), tl_arr_normal(&q, &rng);
  tl_arr_init(&kk, f16, 4, sk), tl_arr_normal(&kk, &rng);
  tl_arr_init(&v, f16, 4, sk), tl_arr_normal(&v, &rng);
  tl_arr_init(&dout, f16, 4, sq), tl_arr_normal(&dout, &rng);
  tl_arr_init(&out, f32, 4, sq), tl_arr_init(&lse, f32, 3, sl);
  tl_arr_init(&dq, f16, 4, sq), tl_arr_init(&dk, f16, 4, sk), tl_arr_init(&dv, f16, 4, sk);
  tl_arr_init(&delta, f32, 1, sd), tl_arr_init(&acc, f32, 1, sa);
  tl_arr_init(&rout, f64, 4, sq), tl_arr_init(&rlse, f64, 3, sl);
  tl_arr_init(&rdq, f64, 4, sq), tl_arr_init(&rdk, f64, 4, sk), tl_arr_init(&rdv, f64, 4, sk);
  TlArr *all[] = {&q, &kk, &v, &dout, &out, &lse, &dq, &dk, &dv, &delta, &acc, &rout, &rlse, &rdq, &rdk, &rdv};
  for (int i = 4; i < 16; i++) tl_arr_poison(all[i]);
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = FLEX_BACKEND_REFERENCE;
  a.q = &q.t, a.k = &kk.t, a.v = &v.t, a.out = &rout.t, a.lse = &rlse.t;
  a.dout = &dout.t, a.dq = &rdq.t, a.dk = &rdk.t, a.dv = &rdv.t;
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "reference: %s", flex_last_error());
  ck_assert_msg(flex_backward(k, &a) == FLEX_OK, "reference: %s", flex_last_error());

  FlexParams p;
  memset(&p, 0, sizeof p);
  p.out = out.t.data, p.lse = lse.t.data, p.q = q.t.data, p.k = kk.t.data, p.v = v.t.data;
  p.dout = dout.t.data, p.dq = dq.t.data, p.dk = dk.t.data, p.dv = dv.t.data;
  p.delta = delta.t.data, p.dq_acc = acc.t.data;
  p.sq = p.so = p.sdo = p.sdq = (FlexStrides){(int64_t)H * QB * eb, (int64_t)QB * eb, eb};
  p.sk = p.sv = p.sdk = p.sdv = (FlexStrides){(int64_t)HKV * KB * eb, (int64_t)KB * eb, eb};
  p.lse_b = H * QB, p.lse_h = QB;
  int32_t sizes[5] = {B, H, HKV, QB, KB};
  memcpy(p.sizes, sizes, sizeof sizes);
  p.B = B, p.H = H, p.HKV = HKV, p.G = H / HKV, p.q_len = QB, p.kv_len = KB, p.E = p.EV = eb;
  p.scale = (float)(1.0 / sqrt((double)eb));
  p.vec16 = 1;
  p.dq_splits = 1;
  FlexFwdTma tf;
  FlexBwdTma tb;
  ck_assert_msg(rt_launch_fwd_tma(&o, &p, emu_tmap, NULL, &tf) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(rt_launch_bwd_tma(&o, &p, emu_tmap, NULL, &tb) == FLEX_OK, "%s", flex_last_error());
  const uint64_t nq = (uint64_t)B * H * QB, nk = (uint64_t)B * HKV * KB;
  EmuRange r[11] = {{(uintptr_t)p.q, nq * eb * 2, "q"},          {(uintptr_t)p.k, nk * eb * 2, "k"},
                    {(uintptr_t)p.v, nk * eb * 2, "v"},          {(uintptr_t)p.out, nq * eb * 4, "out"},
                    {(uintptr_t)p.lse, nq * 4, "lse"},          {(uintptr_t)p.dout, nq * eb * 2, "dout"},
                    {(uintptr_t)p.dq, nq * eb * 2, "dq"},        {(uintptr_t)p.dk, nk * eb * 2, "dk"},
                    {(uintptr_t)p.dv, nk * eb * 2, "dv"},        {(uintptr_t)p.delta, nq * 4, "delta"},
                    {(uintptr_t)p.dq_acc, nq * eb * 4, "dq_acc"}};
  flex_status st = launch_one(m, "flex_fwd", &tf, cg_launch_fwd(&o, B, H, QB), r, 11, msg);
  if (!st) st = launch_one(m, "flex_bwd_pre", &p, cg_launch_bwd_pre(&o, B, H, QB), r, 11, msg);
  if (!st) st = launch_one(m, "flex_bwd", &tb, cg_launch_bwd(&o, B, HKV, KB), r, 11, msg);
  if (!st) st = launch_one(m, "flex_bwd_dq", &p, cg_launch_bwd_dq(&o, B, H, QB), r, 11, msg);
  double e[3] = {tl_rel_err(&dq.a, &rdq.a), tl_rel_err(&dk.a, &rdk.a), tl_rel_err(&dv.a, &rdv.a)};
  *err = 0;
  for (int i = 0; i < 3; i++)
    if (!(e[i] <= *err)) *err = e[i]; /* NaN wins */
  if (st) *err = INFINITY;
  fprintf(stderr, "  %-52s %s: status %d, dq %.3g dk %.3g dv %.3g%s%.200s\n", c->what,
          race ? "race-check" : "plain", st, e[0], e[1], e[2], msg[0] ? ": " : "", msg);
  for (int i = 0; i < 16; i++) tl_arr_free(all[i]);
  buf_free(&log);
  base_free(src);
  flex_kernel_free(k);
  return st;
}

/* Backward case c at head dim eb, its control plain and race-checked. */
static void check_bwd_case(const Case *c, int eb) {
  char msg[EMU_ERR_LEN];
  double err;
  if (!c->from) { /* the control, plain and race-checked */
    for (int race = 0; race < 2; race++) {
      flex_status st = run_bwd_case(c, eb, race, msg, &err);
      ck_assert_msg(st == FLEX_OK, "%s: %s", c->what, msg);
      ck_assert_msg(err < 2e-2, "%s: error %g", c->what, err);
    }
    return;
  }
  flex_status st = run_bwd_case(c, eb, false, msg, &err);
  if (c->launch_fails)
    ck_assert_msg(st != FLEX_OK, "%s went undetected (error %g)", c->what, err);
  else
    ck_assert_msg(st != FLEX_OK || !(err < 2e-2), "%s went undetected (error %g)", c->what, err);
}

START_TEST(bwd_mutation) { check_bwd_case(&bwd_cases[_i], EB); }
END_TEST

START_TEST(bwd2_mutation) {
  CgOptions o;
  char *src = NULL;
  flex_kernel *k = NULL;
  ck_assert(flex_kernel_from_source(&k, "broken90.score", kSource, strlen(kSource), NULL) == FLEX_OK);
  src = mutated_bwd_source(k, &bwd2_cases[0], EW, &o); /* else the cases test the one-consumer body */
  ck_assert_msg(o.bwd_sm90 && cg_bwd_sm90_consumers(&o) == 2 && o.bwd.threads == 384,
                "E = %d: not the two-consumer sm_90a backward", EW);
  base_free(src);
  flex_kernel_free(k);
  check_bwd_case(&bwd2_cases[_i], EW);
}
END_TEST

int main(void) {
  rng = tl_seed();
  Suite *s = suite_create("emu_sm90_broken");
  TCase *tc = tcase_create("mutations");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, mutation, 0, NCASES);
  tcase_add_loop_test(tc, bwd_mutation, 0, NBWD);
  suite_add_tcase(s, tc);
  TCase *two = tcase_create("two_consumers"); /* the backward above head dim 128 */
  tcase_set_timeout(two, 600);
  tcase_add_loop_test(two, bwd2_mutation, 0, NBWD2);
  suite_add_tcase(s, two);
  return tl_run_suite(s);
}
