/* NVRTC suite: generated kernels compile for sm_80 and sm_90a, use tensor
 * cores for fp16/bf16, do not spill, and fit each arch's shared memory.
 *
 * The full matrix (every sample x fp16/bf16/fp32 x head dims 16, 64, 128,
 * 256, 72 x both archs) takes many minutes on two cores, so a default run
 * checks a few combinations drawn from the printed seed; FLEXC_NVRTC_FULL=1
 * (the `slow` test check_nvrtc_full) runs all of it; one Check test per
 * sample. Each combination is compiled with or without dropout
 * (FLEX_DROPOUT) and with or without a deterministic backward
 * (FLEX_DETERMINISTIC; each drawn in a default run, all four in the full
 * one). Skips (77)
 * without NVRTC.
 * Grouped-query attention changes no generated code (G is a launch value),
 * so it needs no axis of its own here. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "cuda/nvrtc.h"
#include "runtime/rt.h"
#include "testlib.h"

static const int head_dims[] = {16, 64, 128, 256, 72};
static const CgArch archs[] = {CG_SM80, CG_SM90A};
enum { NDIMS = 5, NARCHS = 2, NDTYPES = 3, MAXSAMPLES = 64 };

static char samples[MAXSAMPLES][512];
static int nsamples;

static void find_samples(void) {
  if (nsamples) return; /* once per process */
  const char *dir = tl_src_path("samples");
  DIR *d = opendir(dir);
  ck_assert_msg(d != NULL, "cannot open %s", dir);
  struct dirent *e;
  while ((e = readdir(d)) && nsamples < MAXSAMPLES) {
    size_t n = strlen(e->d_name);
    if (n > 6 && !strcmp(e->d_name + n - 6, ".score"))
      snprintf(samples[nsamples++], sizeof samples[0], "%s/%s", dir, e->d_name);
  }
  closedir(d);
  ck_assert_int_gt(nsamples, 0);
}

/* Spills ptxas reports today inside the gated set (see spill_gated), with
 * the most bytes each may take: a kernel not listed must not spill, a
 * listed one must not spill more (bench/RESULTS.md, "spills"). */
static const struct KnownSpill {
  const char *sample, *entry;
  CgArch arch;
  int E, stores, loads; /* E = 0: any head dim */
} known_spills[] = {
    /* exp(temp[h]) per element at 128 x 32, E = 128 */
    {"head_temperature.score", "flex_fwd", CG_SM80, 128, 20, 36},
    /* the NATTEN masks' classifiers (6 and 15 integer divisions on 64-bit
     * intervals), inlined in every thread of the sm_80 bodies; hidden until
     * rt_ptxas_parse read the kernel's own properties line */
    {"natten_tiled.score", "flex_fwd", CG_SM80, 128, 8, 40},
    {"natten_tiled.score", "flex_fwd", CG_SM80, 72, 32, 48},
    {"natten_tiled.score", "flex_bwd", CG_SM80, 16, 40, 68},
    {"natten_gym.score", "flex_fwd", CG_SM80, 72, 48, 64},
    /* the BlockMask builder's kernel over natten_tiled's integer divisions
     * (12/12 bytes, found by the random sample of a full-suite run; on
     * sm_90a 4/4, found the same way): it reads no head dim, so E = 0
     * stands for every one */
    {"natten_tiled.score", "flex_mask_build", CG_SM80, 0, 12, 12},
    {"natten_tiled.score", "flex_mask_build", CG_SM90A, 0, 4, 4},
    /* a score function reading a buffer, K/V through the page table, 128 x 32 */
    {"paged_forward_compiles", "flex_fwd", CG_SM80, 128, 12, 28},
};

/* The kernels whose spills fail the test: fp16/bf16 at head dims to 128
 * without dropout or the deterministic backward, the shapes the tile table
 * is tuned for. Outside it (fp32's SIMT bodies, E = 256, dropout's Philox
 * rounds, deterministic dQ slices) spills are printed, not failed: they
 * cost speed, never results. */
static bool spill_gated(CgDtype dt, int E, bool dropout, bool det) {
  return dt != CG_FP32 && E <= 128 && !dropout && !det;
}

static void check_spills(const char *path, const RtPtxasInfo *in, CgArch arch, int E, bool gated) {
  const char *sample = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  if (in->spill_stores == 0 && in->spill_loads == 0) return;
  fprintf(stderr, "    %s spills %d/%d bytes (%s)\n", in->name, in->spill_stores, in->spill_loads,
          gated ? "gated" : "not gated");
  if (!gated) return;
  for (size_t i = 0; i < sizeof known_spills / sizeof *known_spills; i++) {
    const struct KnownSpill *ks = &known_spills[i];
    if (!strcmp(ks->sample, sample) && !strcmp(ks->entry, in->name) && ks->arch == arch &&
        (ks->E == E || ks->E == 0)) {
      ck_assert_msg(in->spill_stores <= ks->stores && in->spill_loads <= ks->loads,
                    "%s %s: spills %d/%d bytes, more than the %d/%d recorded", sample, in->name,
                    in->spill_stores, in->spill_loads, ks->stores, ks->loads);
      return;
    }
  }
  ck_abort_msg("%s %s E=%d %s spills %d/%d bytes", sample, in->name, E, cg_arch_name(arch),
               in->spill_stores, in->spill_loads);
}

/* Compile one combination and check the report. */
static void check_one(const char *path, CgDtype dt, int E, CgArch arch, bool dropout, bool det) {
  fprintf(stderr, "  %s %s E=%d %s%s%s\n", strrchr(path, '/') + 1, cg_dtype_name(dt), E,
          cg_arch_name(arch), dropout ? " dropout" : "", det ? " deterministic" : "");
  flex_kernel *k;
  ck_assert_msg(flex_kernel_load(&k, path, NULL) == FLEX_OK, "%s", flex_last_error());
  CgOptions o;
  char err[256];
  ck_assert_msg(cg_options_init(&o, k->mod, dt, E, E, arch, true, err, sizeof err), "%s", err);
  o.dropout = dropout;
  o.deterministic = det;
  ck_assert_msg(cg_options_retile(&o, err, sizeof err), "%s", err);
  /* Masked kernels also carry the BlockMask builder entries (the runtime
   * emits them for masks the analysis cannot decide): compile them too. */
  o.mask_builder = k->mod->mask != NULL;
  bool has_buffers = false;
  for (int i = 0; i < k->mod->nbuffers; i++) has_buffers |= k->mod->buffers[i].used;
  Buf src = {0};
  cg_emit_cuda(&src, k->mod, &o);
  flex_kernel_free(k);
  ck_assert(dropout == (strstr(src.data, "#define FLEX_DROPOUT 1") != NULL));
  ck_assert(det == (strstr(src.data, "#define FLEX_DETERMINISTIC 1") != NULL));
  RtNvrtcResult r;
  flex_status st = rt_nvrtc_compile(&r, src.data, cg_arch_name(arch), RT_NVRTC_CUBIN, true);
  ck_assert_msg(st == FLEX_OK, "%s", flex_last_error());
  RtPtxasInfo info[8];
  int n = rt_ptxas_parse(r.log.data ? r.log.data : "", info, 8);
  /* flex_fwd, flex_fwd_combine, three backward entries, the builder's two,
   * flex_sorted_check for a `sorted` buffer, and flex_grad_exact for a
   * deterministic backward with `grad` buffers */
  ck_assert_int_eq(n, (o.mask_builder ? 7 : 5) + o.sorted_check + (det && o.grad_buffers));
  for (int i = 0; i < n; i++) {
    check_spills(path, &info[i], arch, E, spill_gated(dt, E, dropout, det));
    ck_assert_int_gt(info[i].registers, 0);
    ck_assert_msg(!info[i].wgmma_serial, "%s: ptxas serialised its wgmma:\n%s", info[i].name,
                  r.log.data);
  }
  size_t limit = cg_arch_smem_limit(arch);
  ck_assert_uint_le(cg_launch_fwd(&o, 1, 1, 1).smem, limit);
  ck_assert_uint_le(cg_launch_bwd(&o, 1, 1, 1).smem, limit);
  rt_nvrtc_free(&r);
  if (dt != CG_FP32) { /* tensor cores: mma.sync, or only wgmma when both bodies are sm_90a's */
    st = rt_nvrtc_compile(&r, src.data, cg_arch_name(arch), RT_NVRTC_PTX, false);
    ck_assert_msg(st == FLEX_OK, "%s", flex_last_error());
    if (o.fwd_sm90 && o.bwd_sm90)
      ck_assert_msg(strstr(r.image.data, "wgmma.mma_async") != NULL, "no wgmma in PTX");
    else
      ck_assert_msg(strstr(r.image.data, "mma.sync.aligned.m16n8k16") != NULL, "no mma.sync in PTX");
    rt_nvrtc_free(&r);
  }
  buf_free(&src);
  /* Checked runs (--check-bounds) use a variant with tested buffer accesses. */
  if (o.grad_buffers || has_buffers) {
    o.check_bounds = true;
    o.source = path; /* the first kernel (whose name o held) is freed */
    Buf chk = {0};
    flex_kernel *k2;
    ck_assert_msg(flex_kernel_load(&k2, path, NULL) == FLEX_OK, "%s", flex_last_error());
    cg_emit_cuda(&chk, k2->mod, &o);
    flex_kernel_free(k2);
    ck_assert_msg(strstr(chk.data, "flex_bounds_fail") != NULL, "no checked loads emitted");
    st = rt_nvrtc_compile(&r, chk.data, cg_arch_name(arch), RT_NVRTC_CUBIN, true);
    ck_assert_msg(st == FLEX_OK, "checked variant: %s", flex_last_error());
    rt_nvrtc_free(&r);
    buf_free(&chk);
  }
}

START_TEST(sampled_matrix) {
  /* One test per sample (so each gets Check's timeout of its own): by
   * default one random dtype, head dim and arch; FLEXC_NVRTC_FULL=1 all. */
  find_samples();
  if (_i >= nsamples) return;
  bool full = getenv("FLEXC_NVRTC_FULL") != NULL;
  uint64_t st = tl_seed() + (uint64_t)_i;
  int per = NDTYPES * NDIMS * NARCHS * 4;
  for (int j = 0; j < (full ? per : 1); j++) {
    int c = full ? j : (int)(tl_rand(&st) % (uint64_t)per), rest = c / NDTYPES / NDIMS / NARCHS;
    check_one(samples[_i], (CgDtype)(c % NDTYPES), head_dims[c / NDTYPES % NDIMS],
              archs[c / NDTYPES / NDIMS % NARCHS], rest & 1, rest >> 1);
  }
}
END_TEST

/* PTX of one forward+backward source for gemma2 (tanh) and a score using
 * exp, sin and pow, with or without fast math. */
static char *ptx_of(const char *text, bool fast) {
  flex_kernel *k;
  ck_assert_msg(flex_kernel_from_source(&k, "fast.score", text, strlen(text), NULL) == FLEX_OK, "%s",
                flex_last_error());
  CgOptions o;
  char err[256];
  ck_assert_msg(cg_options_init(&o, k->mod, CG_BF16, 64, 64, CG_SM80, true, err, sizeof err), "%s", err);
  o.fast_math = fast;
  Buf src = {0};
  cg_emit_cuda(&src, k->mod, &o);
  flex_kernel_free(k);
  RtNvrtcResult r;
  flex_status st = rt_nvrtc_compile(&r, src.data, "sm_80", RT_NVRTC_PTX, false);
  ck_assert_msg(st == FLEX_OK, "%s", flex_last_error());
  buf_free(&src);
  char *ptx = strdup(r.image.data);
  rt_nvrtc_free(&r);
  return ptx;
}

/* Fast math is an opt-in: the hardware tanh, the approximate exp/sin and
 * the approximate division appear only with it. */
START_TEST(fast_math_opt_in) {
  const char *text = "param float cap = 30.0;\n"
                     "score f(s, b, h, q, kv) {\n"
                     "  return cap * tanh(s / cap) + 0.1 * sin(float(q)) + pow(sigmoid(s), 2.0);\n"
                     "}\n";
  char *exact = ptx_of(text, false), *fast = ptx_of(text, true);
  ck_assert_msg(strstr(exact, "tanh.approx.f32") == NULL, "tanh.approx without fast math");
  ck_assert_msg(strstr(exact, "sin.approx.f32") == NULL, "sin.approx without fast math");
  ck_assert_msg(strstr(fast, "tanh.approx.f32") != NULL, "no tanh.approx with fast math");
  ck_assert_msg(strstr(fast, "sin.approx.f32") != NULL, "no sin.approx with fast math");
  /* `/` is IEEE division (div.rn) unless fast math asks for __fdividef */
  ck_assert_msg(strstr(exact, "div.approx.f32") == NULL, "div.approx without fast math");
  ck_assert_msg(strstr(fast, "div.approx.f32") != NULL, "no div.approx with fast math");
  ck_assert_msg(strlen(fast) < strlen(exact), "fast-math PTX (%zu) not shorter than exact (%zu)",
                strlen(fast), strlen(exact));
  free(exact);
  free(fast);
}
END_TEST

/* The paged forward (CgOptions.paged: K/V tiles through a page table,
 * docs/paged.md) compiles for every dtype; fp32 without spills, fp16 and
 * bf16 within the spills recorded in known_spills. */
START_TEST(paged_forward_compiles) {
  static const CgDtype dts[3] = {CG_FP16, CG_BF16, CG_FP32};
  const char *text = "buffer sb: f32[B];\n"
                     "score sc(s, b, h, q, kv) { return s + sb[b]; }\n"
                     "mask lr(b, h, q, kv) { return q + KV_LEN - Q_LEN >= kv; }\n";
  flex_kernel *k;
  ck_assert_msg(flex_kernel_from_source(&k, "paged.score", text, strlen(text), NULL) == FLEX_OK, "%s",
                flex_last_error());
  CgOptions o;
  char err[256];
  ck_assert_msg(cg_options_init(&o, k->mod, dts[_i], 128, 128, CG_SM80, false, err, sizeof err), "%s", err);
  o.paged = true;
  Buf src = {0};
  cg_emit_cuda(&src, k->mod, &o);
  flex_kernel_free(k);
  ck_assert_msg(strstr(src.data, ", true>(p)") != NULL, "no paged instantiation");
  RtNvrtcResult r;
  flex_status st = rt_nvrtc_compile(&r, src.data, "sm_80", RT_NVRTC_CUBIN, true);
  ck_assert_msg(st == FLEX_OK, "%s", flex_last_error());
  RtPtxasInfo info[8];
  int n = rt_ptxas_parse(r.log.data ? r.log.data : "", info, 8);
  ck_assert_int_eq(n, 2); /* flex_fwd and flex_fwd_combine */
  for (int i = 0; i < n; i++) {
    fprintf(stderr, "  paged %s %s E=128 sm_80: %d registers, spills %d/%d\n", info[i].name,
            cg_dtype_name(dts[_i]), info[i].registers, info[i].spill_stores, info[i].spill_loads);
    check_spills("paged_forward_compiles", &info[i], CG_SM80, 128, dts[_i] != CG_FP32);
  }
  rt_nvrtc_free(&r);
  buf_free(&src);
  /* the unpaged forward of the same kernel, for comparison */
  ck_assert(flex_kernel_from_source(&k, "paged.score", text, strlen(text), NULL) == FLEX_OK);
  o.paged = false;
  o.source = NULL;
  cg_emit_cuda(&src, k->mod, &o);
  flex_kernel_free(k);
  ck_assert_msg(rt_nvrtc_compile(&r, src.data, "sm_80", RT_NVRTC_CUBIN, true) == FLEX_OK, "%s",
                flex_last_error());
  ck_assert_int_eq(rt_ptxas_parse(r.log.data ? r.log.data : "", info, 8), 2);
  for (int i = 0; i < 2; i++)
    if (!strcmp(info[i].name, "flex_fwd"))
      fprintf(stderr, "  unpaged flex_fwd %s E=128 sm_80: %d registers, spills %d/%d\n",
              cg_dtype_name(dts[_i]), info[i].registers, info[i].spill_stores, info[i].spill_loads);
  rt_nvrtc_free(&r);
  buf_free(&src);
}
END_TEST

/* FLEXC_CUDA_WATCHDOG (CgOptions.watchdog): the sm_90a kernels' mbarrier
 * waits print and trap after 2^33 cycles. The generated source says so in
 * its header (a key of its own in the kernel cache), compiles with NVRTC,
 * and its PTX holds the printf and the trap; without it, neither. */
START_TEST(watchdog_compiles) {
  flex_kernel *k;
  ck_assert_msg(flex_kernel_load(&k, tl_src_path("samples/causal.score"), NULL) == FLEX_OK, "%s",
                flex_last_error());
  for (int on = 0; on < 2; on++) {
    CgOptions o;
    char err[256];
    ck_assert_msg(cg_options_init(&o, k->mod, CG_BF16, 128, 128, CG_SM90A, true, err, sizeof err), "%s", err);
    o.watchdog = on;
    Buf src = {0};
    cg_emit_cuda(&src, k->mod, &o);
    ck_assert_int_eq(strstr(src.data, "#define FLEX_WATCHDOG 1\n") != NULL, on);
    ck_assert_int_eq(strstr(src.data, ", watchdog (") != NULL, on);
    RtNvrtcResult r;
    ck_assert_msg(rt_nvrtc_compile(&r, src.data, "sm_90a", RT_NVRTC_PTX, false) == FLEX_OK, "%s",
                  flex_last_error());
    const char *ptx = r.image.data;
    ck_assert_msg(ptx && (strstr(ptx, "vprintf") != NULL) == on && (strstr(ptx, "trap;") != NULL) == on,
                  "watchdog %d: vprintf %d, trap %d", on, ptx && strstr(ptx, "vprintf"),
                  ptx && strstr(ptx, "trap;"));
    rt_nvrtc_free(&r);
    buf_free(&src);
  }
  flex_kernel_free(k);
}
END_TEST

/* Grouped-query packing (CgOptions.pack_gqa, docs/decoding.md): the user's
 * functions under their flex_user_ names with the mapping wrappers, ALiBi
 * and a head-dependent implicit window, paged or not, compile at E = 128
 * for every dtype without spills. */
START_TEST(packed_forward_compiles) {
  static const CgDtype dts[3] = {CG_FP16, CG_BF16, CG_FP32};
  const char *text = "buffer slopes: f32[H];\n"
                     "score al(s, b, h, q, kv) { return s + slopes[h] * float(kv - q); }\n"
                     "mask w(b, h, q, kv) { let d = q + KV_LEN - Q_LEN - kv; return d >= 0 && d < 64 * (h + 1); }\n";
  for (int paged = 0; paged < 2; paged++) {
    flex_kernel *k;
    ck_assert_msg(flex_kernel_from_source(&k, "pack.score", text, strlen(text), NULL) == FLEX_OK, "%s",
                  flex_last_error());
    CgOptions o;
    char err[256];
    ck_assert_msg(cg_options_init(&o, k->mod, dts[_i], 128, 128, CG_SM80, false, err, sizeof err), "%s", err);
    o.pack_gqa = true, o.paged = paged;
    /* packing decides the tiles too (no bias folded: cg_bias_folded) */
    ck_assert_msg(cg_options_retile(&o, err, sizeof err), "%s", err);
    Buf src = {0};
    cg_emit_cuda(&src, k->mod, &o);
    flex_kernel_free(k);
    ck_assert(strstr(src.data, "flex_user_mask_block(") && strstr(src.data, "p.pack_q_len"));
    RtNvrtcResult r;
    flex_status st = rt_nvrtc_compile(&r, src.data, "sm_80", RT_NVRTC_CUBIN, true);
    ck_assert_msg(st == FLEX_OK, "%s", flex_last_error());
    RtPtxasInfo info[8];
    int n = rt_ptxas_parse(r.log.data ? r.log.data : "", info, 8);
    ck_assert_int_eq(n, 2);
    for (int i = 0; i < n; i++) {
      fprintf(stderr, "  packed%s %s %s E=128 sm_80: %d registers, spills %d/%d\n", paged ? " paged" : "",
              info[i].name, cg_dtype_name(dts[_i]), info[i].registers, info[i].spill_stores,
              info[i].spill_loads);
      ck_assert_msg(info[i].spill_stores == 0 && info[i].spill_loads == 0, "%s spills", info[i].name);
    }
    rt_nvrtc_free(&r);
    buf_free(&src);
  }
}
END_TEST

/* The sm_90 / sm_90a wrappers of arch.cuh (tests/codegen/sm90_wrappers.cu)
 * compile for sm_90a through ptxas, and their instructions reach the PTX. */
START_TEST(sm90_wrappers) {
  char *text = NULL;
  size_t len = 0;
  ck_assert(base_read_file(tl_src_path("tests/codegen/sm90_wrappers.cu"), &text, &len) == 0);
  RtNvrtcResult r;
  ck_assert_msg(rt_nvrtc_compile(&r, text, "sm_90a", RT_NVRTC_PTX, false) == FLEX_OK, "%s",
                flex_last_error());
  static const char *want[] = {"wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
                               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
                               "wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                               "wgmma.wait_group.sync.aligned", "cp.async.bulk.tensor.2d",
                               "cp.async.bulk.tensor.3d", "cp.async.bulk.tensor.4d",
                               "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx",
                               "mbarrier.expect_tx", "mbarrier.init", "elect.sync",
                               "fence.proxy.async", "setmaxnreg.inc", "setmaxnreg.dec",
                               "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32",
                               "cp.async.bulk.commit_group", "cp.async.bulk.wait_group.read"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    ck_assert_msg(strstr(r.image.data, want[i]) != NULL, "no %s in the PTX", want[i]);
  rt_nvrtc_free(&r);
  ck_assert_msg(rt_nvrtc_compile(&r, text, "sm_90a", RT_NVRTC_CUBIN, true) == FLEX_OK, "%s",
                flex_last_error());
  rt_nvrtc_free(&r);
  base_free(text);
}
END_TEST

/* flexc emit --arch sm_90a --target ptx (flex_emit): the fp16/bf16
 * forward is the TMA + wgmma body (and nothing of mma.sync), for head dims
 * 64, 128 and a padded 72, with an identity score and with a score
 * function; dropout keeps the sm_80 body. */
START_TEST(sm90_forward_ptx) {
  static const char *const files[] = {"samples/causal.score", "samples/relpos_bias.score"};
  static const int dims[] = {64, 128, 72};
  const char *file = files[_i % 2];
  int E = dims[_i / 2 % 3];
  bool bf16 = _i / 6 % 2, dropout = _i >= 12;
  flex_kernel *k = tl_load(file, NULL, NULL);
  flex_emit_options eo = {.target = FLEX_TARGET_PTX, .arch = "sm_90a",
                          .dtype = {bf16 ? kDLBfloat : kDLFloat, 16, 1}, .head_dim = E,
                          .forward_only = true, .dropout = dropout};
  char *ptx = NULL;
  size_t len = 0;
  ck_assert_msg(flex_emit(k, &eo, &ptx, &len, NULL) == FLEX_OK, "%s", flex_last_error());
  fprintf(stderr, "  %s %s E=%d sm_90a%s: %zu bytes of PTX\n", file, bf16 ? "bf16" : "fp16", E,
          dropout ? " dropout" : "", len);
  bool wgmma = strstr(ptx, "wgmma.mma_async.sync.aligned") != NULL;
  bool tma = strstr(ptx, "cp.async.bulk.tensor.4d") != NULL;
  bool mbar = strstr(ptx, "mbarrier.try_wait.parity") != NULL;
  bool mma = strstr(ptx, "mma.sync.aligned.m16n8k16") != NULL;
  if (dropout) {
    ck_assert_msg(!wgmma && !tma && mma, "dropout: the forward must be the sm_80 body");
  } else {
    ck_assert_msg(wgmma && tma && mbar, "no wgmma.mma_async / cp.async.bulk.tensor / mbarrier "
                  "in the sm_90a forward (%d %d %d)", wgmma, tma, mbar);
    ck_assert_msg(!mma, "mma.sync in the sm_90a forward");
  }
  flex_free(ptx);
  flex_kernel_free(k);
}
END_TEST

/* The PTX of one entry: from its `.entry NAME(` to the next entry. */
static const char *entry_ptx(const char *ptx, const char *name, size_t *len) {
  char key[64];
  snprintf(key, sizeof key, ".entry %s(", name);
  const char *at = strstr(ptx, key);
  ck_assert_msg(at, "no %s in the PTX", key);
  const char *next = strstr(at + 1, ".entry ");
  *len = next ? (size_t)(next - at) : strlen(at);
  return at;
}

static bool has(const char *text, size_t len, const char *what) {
  size_t n = strlen(what);
  for (size_t i = 0; i + n <= len; i++)
    if (!memcmp(text + i, what, n)) return true;
  return false;
}

/* flexc emit --arch sm_90a --target ptx with the backward: flex_bwd is the
 * TMA + wgmma body (nothing of mma.sync) for fp16 and bf16, head dims 64
 * (one consumer), 128 and a padded 72 (two splitting the keys) and 256
 * (two splitting the columns; two consumers: setmaxnreg), identity
 * score and a score function with a grad buffer; a deterministic backward
 * keeps the sm_80 body. */
START_TEST(sm90_backward_ptx) {
  static const char *const files[] = {"samples/causal.score", "samples/relpos_bias.score"};
  static const int dims[] = {64, 128, 72, 256};
  const char *file = files[_i % 2];
  int E = dims[_i / 2 % 4];
  bool bf16 = _i % 3 == 1, det = _i >= 8, sm80 = det;
  flex_kernel *k;
  ck_assert_msg(flex_kernel_load(&k, tl_src_path(file), NULL) == FLEX_OK, "%s", flex_last_error());
  flex_emit_options eo = {.target = FLEX_TARGET_PTX, .arch = "sm_90a",
                          .dtype = {bf16 ? kDLBfloat : kDLFloat, 16, 1}, .head_dim = E,
                          .deterministic = det};
  char *ptx = NULL;
  size_t len = 0, n = 0;
  ck_assert_msg(flex_emit(k, &eo, &ptx, &len, NULL) == FLEX_OK, "%s", flex_last_error());
  const char *b = entry_ptx(ptx, "flex_bwd", &n);
  fprintf(stderr, "  %s %s E=%d sm_90a%s: flex_bwd %zu bytes of PTX\n", file, bf16 ? "bf16" : "fp16",
          E, det ? " deterministic" : "", n);
  bool wgmma = has(b, n, "wgmma.mma_async.sync.aligned"), tma = has(b, n, "cp.async.bulk.tensor.4d");
  bool mbar = has(b, n, "mbarrier.try_wait.parity"), mma = has(b, n, "mma.sync.aligned.m16n8k16");
  if (sm80) { /* the deterministic key tile is a .func of its own: mma.sync anywhere (the
                 sm_90a forward has none) */
    ck_assert_msg(!wgmma && !tma && strstr(ptx, "mma.sync.aligned.m16n8k16"),
                  "the backward must be the sm_80 body");
  } else {
    ck_assert_msg(wgmma && tma && mbar, "no wgmma.mma_async / cp.async.bulk.tensor / mbarrier "
                  "in the sm_90a backward (%d %d %d)", wgmma, tma, mbar);
    ck_assert_msg(!mma, "mma.sync in the sm_90a backward");
    ck_assert_msg(has(b, n, "setmaxnreg.inc") == (E > 64), "setmaxnreg in flex_bwd must mean "
                  "two consumer warpgroups (E > 64: the keys split up to 128, the columns above), "
                  "E = %d", E);
  }
  flex_free(ptx);
  flex_kernel_free(k);
}
END_TEST

/* The sm_90a kernels keep their wgmma asynchronous: ptxas reports
 * (C7514 and kin) when it must make each wgmma wait for the one before,
 * e.g. when accumulators are read where a wgmma may still own them; the
 * kernels would then run at a fraction of the tensor cores. Identity
 * scores (two consumer warpgroups, S of one tile overlapping P V of the
 * last) and a score function, both dtypes, head dims 64, 128 and 256 (the
 * backward's two consumer warpgroups). */
START_TEST(sm90_wgmma_pipelined) {
  static const char *const files[] = {"samples/causal.score", "samples/relpos_bias.score"};
  const char *file = files[_i % 2];
  CgDtype dt = _i / 2 % 2 ? CG_BF16 : CG_FP16;
  static const int dims[] = {128, 64, 256};
  int E = dims[_i / 4];
  flex_kernel *k = tl_load(file, NULL, NULL);
  CgOptions o;
  char err[256];
  ck_assert_msg(cg_options_init(&o, k->mod, dt, E, E, CG_SM90A, true, err, sizeof err), "%s", err);
  ck_assert_msg(o.fwd_sm90, "%s: not the sm_90a forward", file); /* else the test proves nothing */
  Buf src = {0};
  cg_emit_cuda(&src, k->mod, &o);
  flex_kernel_free(k);
  RtNvrtcResult r;
  ck_assert_msg(rt_nvrtc_compile(&r, src.data, "sm_90a", RT_NVRTC_CUBIN, true) == FLEX_OK, "%s",
                flex_last_error());
  RtPtxasInfo info[8];
  int n = rt_ptxas_parse(r.log.data ? r.log.data : "", info, 8);
  ck_assert_int_gt(n, 0);
  for (int i = 0; i < n; i++)
    ck_assert_msg(!info[i].wgmma_serial, "%s %s E=%d: ptxas serialised %s's wgmma:\n%s", file,
                  cg_dtype_name(dt), E, info[i].name, r.log.data);
  fprintf(stderr, "  %s %s E=%d sm_90a: %d entries, no wgmma serialised\n", file, cg_dtype_name(dt), E, n);
  rt_nvrtc_free(&r);
  buf_free(&src);
}
END_TEST

/* One entry's figures from a log: ptxas's own form, NVRTC's properties
 * line, and an entry followed by the functions it calls (whose lines must
 * not overwrite its own). */
START_TEST(ptxas_parser) {
  static const struct {
    const char *log;
    int regs, stack, stores, loads, smem;
  } cases[] = {
      {"ptxas info    : 0 bytes gmem\n"
       "ptxas info    : Compiling entry function 'flex_fwd' for 'sm_80'\n"
       "ptxas info    : Function properties for flex_fwd\n"
       "    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
       "ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]\n",
       168, 8, 12, 16, 1024},
      {"ptxas info    : Compiling entry function 'flex_fwd' for 'sm_80'\n"
       "ptxas info    : Function properties for flex_fwd\n"
       "ptxas         .     232 bytes stack frame, 248 bytes spill stores, 424 bytes spill loads\n"
       "ptxas info    : Used 255 registers, used 1 barriers\n",
       255, 232, 248, 424, 0},
      {"ptxas info    : Compiling entry function 'flex_fwd' for 'sm_90a'\n"
       "ptxas info    : Function properties for flex_fwd\n"
       "    240 bytes stack frame, 644 bytes spill stores, 824 bytes spill loads\n"
       "ptxas info    : Used 168 registers, used 3 barriers, 240 bytes cumulative stack size\n"
       "ptxas info    : Compile time = 276.007 ms\n"
       "ptxas info    : Function properties for _Z11flex_iv_div7FlexIvIS_\n"
       "    0 bytes stack frame, 14 bytes spill stores, 12 bytes spill loads\n"
       "ptxas info    : Function properties for _Z14flex_iv_div_nz7FlexIvIxx\n"
       "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 4 bytes spill loads\n",
       168, 240, 644, 824, 0},
  };
  RtPtxasInfo info[2];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ck_assert_int_eq(rt_ptxas_parse(cases[i].log, info, 2), 1);
    ck_assert_str_eq(info[0].name, "flex_fwd");
    ck_assert_int_eq(info[0].registers, cases[i].regs);
    ck_assert_int_eq(info[0].stack, cases[i].stack);
    ck_assert_int_eq(info[0].spill_stores, cases[i].stores);
    ck_assert_int_eq(info[0].spill_loads, cases[i].loads);
    ck_assert_int_eq(info[0].smem, cases[i].smem);
    ck_assert(!info[0].wgmma_serial);
  }
  /* sm_90a advisories come before the entries they name */
  const char *log90 =
      "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized due to non wgmma instructions reading accumulator registers of  a wgmma between "
      "start and end of the pipeline stage in the function 'flex_bwd'\n"
      "ptxas info    : Compiling entry function 'flex_fwd' for 'sm_90a'\n"
      "ptxas info    : Used 168 registers, used 1 barriers\n"
      "ptxas info    : Compiling entry function 'flex_bwd' for 'sm_90a'\n"
      "ptxas info    : Used 178 registers, used 1 barriers\n";
  ck_assert_int_eq(rt_ptxas_parse(log90, info, 2), 2);
  ck_assert_str_eq(info[1].name, "flex_bwd");
  ck_assert(!info[0].wgmma_serial && info[1].wgmma_serial);
}
END_TEST

int main(void) {
  bool have = rt_nvrtc_version() >= 0;
  int n = have ? 1 : 0; /* the compile tests need NVRTC */
  /* Default run: fifteen samples, two or three NVRTC compiles each, on two
   * cores other jobs share. CK_RUN_CASE=sm90 runs the sm90 case only. */
  int rc = TL_MAIN("nvrtc", 0, TL_CASE("parse", 0), TL_TEST(ptxas_parser),
                   TL_CASE("compile", getenv("FLEXC_NVRTC_FULL") ? 7200 : 600), TL_LOOP(fast_math_opt_in, n),
                   TL_LOOP(paged_forward_compiles, 3 * n), TL_LOOP(packed_forward_compiles, 3 * n),
                   TL_LOOP(sampled_matrix, MAXSAMPLES * n), TL_CASE("sm90", 300), TL_LOOP(sm90_wrappers, n), TL_LOOP(watchdog_compiles, n),
                   TL_LOOP(sm90_forward_ptx, 14 * n), TL_LOOP(sm90_backward_ptx, 10 * n),
                   TL_LOOP(sm90_wgmma_pipelined, 12 * n));
  if (rc || have) return rc;
  fprintf(stderr, "NVRTC not available (%s): the compile tests are skipped\n", flex_last_error());
  return 77;
}
