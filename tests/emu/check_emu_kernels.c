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
 * --sample NAME, --dtype fp32|fp16|bf16 and --repeat N narrow the default
 * matrix and run it N times on fresh inputs (a seed loop in one process).
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
  TlShape s;        /* sizes */
  bool dlse;        /* give dLSE to the backward */
  bool native_out;  /* emu outputs in q's dtype instead of float32 */
  bool caller_mask; /* a caller's BlockMask (flex_block_mask_create) on both sides */
} Shape;

static double call_scale; /* flex_args.scale of every call (0: 1/sqrt(E)); odd_scales sets it */

static const Shape shapes[] = {
    {{2, 4, 2, 37, 70, 15, 24}, true, false, false},  /* GQA, odd E, EV != E, ragged tails */
    {{1, 3, 1, 70, 37, 16, 16}, false, true, false},  /* MQA, Q_LEN > KV_LEN */
    {{2, 2, 2, 65, 33, 40, 72}, true, true, false},   /* MHA, one row past a 64-row tile */
    {{1, 2, 1, 21, 130, 72, 33}, false, false, false}, /* several key tiles, E > EV */
    {{1, 2, 2, 17, 19, 160, 136}, true, false, false}, /* head dims over 128: the halved tiles */
};
#define NSHAPES ((int)(sizeof shapes / sizeof *shapes))

/* --sm90: the head dims of the sm_90a kernels (64, 128, 256 and padded
 * ones), lengths that miss the 64-row and 64/128-key tiles; the first
 * also has a 128-key tile past the first inside both lengths, which the
 * forward's steady loop takes (its first tile always runs in the general
 * loop). */
static const Shape shapes_sm90[] = {
    {{2, 4, 2, 77, 290, 64, 64}, true, false, false},   /* GQA, dLSE; a steady key tile (the second) */
    {{1, 2, 1, 45, 150, 128, 128}, false, true, false}, /* MQA, O in q's dtype */
    {{1, 2, 2, 33, 67, 256, 256}, true, false, false},  /* two backward consumers */
    {{2, 2, 1, 65, 100, 72, 40}, false, false, false},  /* padded to 128 / 64, E != EV */
};
#define NSHAPES_SM90 ((int)(sizeof shapes_sm90 / sizeof *shapes_sm90))
#define NDEFAULT_SHAPES 4 /* the default run spreads shapes 0..3 over the samples */

/* --matrix: head dims 64 and 128, GQA and MQA, lengths that miss every tile. */
static const Shape shapes_matrix[] = {
    {{2, 4, 2, 77, 130, 64, 64}, true, true, false},    /* GQA, dLSE */
    {{1, 4, 1, 130, 77, 128, 128}, false, true, false}, /* MQA, Q_LEN > KV_LEN */
};
#define NSHAPES_MATRIX ((int)(sizeof shapes_matrix / sizeof *shapes_matrix))
/* ... and a caller's BlockMask: several blocks each way, GQA */
static const Shape shape_caller_mask = {{2, 4, 2, 300, 260, 64, 64}, true, true, true};

static const char *const samples[] = {"alibi", "causal", "causal_lower_right", "chunked_gelu",
                                      "dilated", "document", "gemma2", "head_temperature",
                                      "natten", "prefix_lm", "relpos_bias", "sliding_window",
                                      "softcap", "natten_gym", "natten_tiled", "paged",
                                      "sink_gptoss", "sink_window", "sink_per_query"};
#define NSAMPLES ((int)(sizeof samples / sizeof *samples))

/* One (sample, dtype, shape) case: forward (and backward) on both backends. */
static void run_shape_dir(int si, int di, const Shape *s, bool backward) {
  const TlCase tc = {.sample = samples[si], .s = s->s, .dt = &tl_dtypes[di],
                     .backend = on_cuda ? FLEX_BACKEND_CUDA : on_cpu ? FLEX_BACKEND_CPU : FLEX_BACKEND_EMU,
                     .arch = on_sm90 ? "sm_90a" : NULL, .dlse = s->dlse,
                     .native_out = s->native_out || on_cuda, .native_grads = s->native_out || on_cuda,
                     .scale = call_scale};
  const bool sm90 = on_sm90 || want_sm90; /* the sm_90a bodies must run */
  TlCall c;
  tl_call_init(&c, &tc, &rng);
  tl_call_sample_extras(&c);
  if (s->caller_mask) tl_call_block_mask(&c, NULL, 0, 0); /* 128 x 128 blocks */
  tl_call_forward(&c);
  if (sm90) /* every sample runs the TMA + wgmma forward */
    ck_assert_msg(rt_run_last_stats().fwd_sm90, "%s: the sm_90a forward did not run", samples[si]);
  if (backward) {
    tl_call_backward(&c);
    /* ... and the sm_90a backward, except above head dim 128 under a mask
     * with more than two divisions (cg_bwd_sm90_ok: the sm_80 body) */
    bool heavy = !strncmp(samples[si], "natten", 6); /* 4, 6 and 15 divisions */
    bool want_bwd = !(heavy && (s->s.E > 128 || s->s.EV > 128));
    if (sm90)
      ck_assert_msg(rt_run_last_stats().bwd_sm90 == want_bwd, "%s: the sm_90a backward %s",
                    samples[si], want_bwd ? "did not run" : "ran");
  }
  char label[64];
  snprintf(label, sizeof label, "%s%s", samples[si], s->caller_mask ? " +BlockMask" : "");
  tl_call_check(&c, backward ? TL_FWD | TL_BWD : TL_FWD, label);
  tl_call_free(&c);
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

static int only_sample = -1; /* --sample NAME: the default matrix runs that sample alone */
static int only_dtype = -1;  /* --dtype fp32|fp16|bf16: ... and that dtype alone */

/* Default matrix: sample x dtype, shape variants rotated over them; --repeat
 * N runs it N times over, each time on fresh inputs (a seed loop in one
 * process). */
START_TEST(sample_default) {
  int si = _i / 3 % NSAMPLES, di = _i % 3, round = _i / (3 * NSAMPLES);
  if ((only_sample >= 0 && si != only_sample) || (only_dtype >= 0 && di != only_dtype)) return;
  if (round > 0) {
    /* round r's cases draw from FLEXC_SEED + r * golden: with --sample and
     * --dtype, that seed replays the case alone */
    rng = tl_seed() + 0x9e3779b97f4a7c15ull * (uint64_t)round;
    fprintf(stderr, "round %d: FLEXC_SEED=%llu\n", round, (unsigned long long)rng);
  }
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
  const Shape s[3] = {{{1, 2, 1, L + 13, L + bn, E, E}, false, false, false},
                      {{1, 2, 2, L, L - 5, E, E}, true, false, false},
                      {{2, 2, 1, L + 3, L, E, E}, false, true, false}};
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
  const TlCase tc = {.sample = "causal", .s = {1, 2, 2, 256, 256, 64, 64}, .dt = &tl_dtypes[1],
                     .backend = FLEX_BACKEND_EMU};
  TlCall c;
  tl_call_init(&c, &tc, &rng);
  struct timespec t0, t1, t2;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  flex_status f = flex_forward(c.kern, &c.a[0]);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  flex_status b = f ? f : flex_backward(c.kern, &c.a[0]);
  clock_gettime(CLOCK_MONOTONIC, &t2);
  if (f || b) fprintf(stderr, "emu failed: %s\n", flex_last_error());
  double tf = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  double tb = (double)(t2.tv_sec - t1.tv_sec) + (double)(t2.tv_nsec - t1.tv_nsec) * 1e-9;
  printf("emu timing (causal, fp16, B=1 H=2 L=S=256 E=64, build included): forward %.2f s, "
         "backward %.2f s, total %.2f s\n", tf, tb, tf + tb);
  tl_call_free(&c);
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
  int repeat = 1;
  for (int i = 1; i < argc; i++) {
    matrix |= !strcmp(argv[i], "--matrix");
    one |= !strcmp(argv[i], "--one");
    const char *v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(argv[i], "--sample")) {
      for (int j = 0; j < NSAMPLES; j++)
        if (!strcmp(samples[j], v)) only_sample = j;
      if (only_sample < 0) return fprintf(stderr, "--sample: no sample named '%s'\n", v), EXIT_FAILURE;
    }
    if (!strcmp(argv[i], "--dtype")) {
      for (int j = 0; j < 3; j++)
        if (!strcmp(tl_dtypes[j].name, v)) only_dtype = j;
      if (only_dtype < 0) return fprintf(stderr, "--dtype: fp32, fp16 or bf16, got '%s'\n", v), EXIT_FAILURE;
    }
    if (!strcmp(argv[i], "--repeat") && (repeat = atoi(v)) < 1)
      return fprintf(stderr, "--repeat: a positive count, got '%s'\n", v), EXIT_FAILURE;
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
  if (argc > 1 && !strcmp(argv[1], "--tiles")) {
    int n;
    cg_tile_table(&n);
    return TL_MAIN("emu_kernels", 300, TL_LOOP(tile_table_row, n), TL_LOOP(tile_sweep_line, 16));
  }
  if (one) return TL_MAIN("emu_kernels", 300, TL_TEST(sample_one));
  if (matrix) {
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
    return TL_MAIN("emu_kernels", 300, TL_TEST(samples_listed),
                   TL_LOOP(sample_matrix, NSAMPLES * 2 * NSHAPES_MATRIX), TL_LOOP(sample_caller_mask, nmasked));
  }
  if (on_sm90)
    return TL_MAIN("emu_kernels", 300, TL_LOOP(sample_sm90, NSAMPLES * 2 * (full ? NSHAPES_SM90 : 1)),
                   TL_LOOP(odd_scales, 8));
  if (full) return TL_MAIN("emu_kernels", 300, TL_LOOP(sample_full, NSAMPLES * 3 * NSHAPES));
  if (only_sample >= 0 || only_dtype >= 0 || repeat > 1)
    return TL_MAIN("emu_kernels", 300, TL_LOOP(sample_default, NSAMPLES * 3 * repeat));
  return TL_MAIN("emu_kernels", 300, TL_TEST(samples_listed), TL_LOOP(sample_default, NSAMPLES * 3),
                 TL_LOOP(large_head_dim, 2), TL_LOOP(odd_scales, 8));
}
