/* bench_blockmask: BlockMask build time against a dense element-wise mask
 * evaluation, for the packed-document causal mask of samples/document.score
 * (sorted document ids with random lengths) at 32k tokens.
 *
 *   bench_blockmask [TOKENS] [--full]     (run from the source tree or a
 *                                          build folder inside it)
 *
 * The dense side evaluates the mask with the interpreter on every
 * (q, kv) pair; without --full it runs every 64th query row and scales the
 * time by 64 (the work per row is the same), and says so.
 *
 *   bench_blockmask --longformer TOKENS [REPEATS]
 *
 * A mask the analysis cannot decide: Longformer's sliding window (256) with
 * global tokens flagged in a `bool` buffer over the keys (16 random
 * positions), built with RT_MASK_EVAL element by element, first as the
 * builder was (one thread, the plain interpreter), then threaded and
 * row-vectorised, in the same process; the two masks must be identical.
 * Each side is timed REPEATS times (default 3), best wall time kept. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/blockmask.h"
#include "runtime/rt.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int longformer(int n, int reps) {
  static const char *src = "param int window = 256;\n"
                           "buffer g: bool[KV_LEN];\n"
                           "mask longformer(b, h, q, kv) { return abs(q - kv) < window || g[q] || g[kv]; }\n";
  flex_kernel *k = NULL;
  if (n < 1 || flex_kernel_from_source(&k, "longformer.score", src, strlen(src), NULL)) {
    fprintf(stderr, "bench_blockmask: %s\n", n < 1 ? "bad token count" : flex_last_error());
    return 1;
  }
  const IrModule *m = k->mod;
  uint8_t *g = calloc((size_t)n, 1);
  const char *seed = getenv("FLEXC_SEED");
  uint64_t x = (seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL)) | 1;
  printf("longformer: seed %llu (FLEXC_SEED=N repeats the global positions)\n", (unsigned long long)x);
  for (int i = 0; i < 16; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    g[x % (uint64_t)n] = 1;
  }
  int32_t sizes[16] = {1, 1, 1, n, n};
  for (int s = SZ_COUNT; s < m->nsizes && s < 16; s++) sizes[s] = n;
  IrVal params[1] = {ir_vi(256)};
  IrBufView bufs[1] = {{g, DT_BOOL, 1, {n}, {1}, NULL}};
  IrIntervalEnv env = {params, sizes, bufs};
  RtMaskShape shape = {1, 1, n, n, 128, 128, 0, 0};
  RtBlockMask bm[2];
  RtMaskStats st[2];
  double best[2] = {1e300, 1e300};
  for (int side = 0; side < 2; side++) {
    rt_block_mask_eval_config(side == 0 ? 1 : 0, side == 1);
    for (int r = 0; r < reps; r++) {
      double t0 = now_ms();
      if (rt_block_mask_build(&bm[side], m, &env, &shape, RT_MASK_EVAL, &st[side]) != FLEX_OK) {
        fprintf(stderr, "bench_blockmask: %s\n", flex_last_error());
        return 1;
      }
      double t = now_ms() - t0;
      if (t < best[side]) best[side] = t;
      if (r + 1 < reps) rt_block_mask_free(&bm[side]);
    }
  }
  bool same = rt_block_mask_equal(&bm[0], &bm[1]);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("longformer mask, %d tokens, window 256, 16 global tokens, blocks 128x128, %ld cores\n", n, cores);
  printf("blocks: %lld total, %lld full, %lld partial, %lld empty; %lld left open by the analysis\n",
         (long long)st[1].total, (long long)st[1].full, (long long)st[1].partial, (long long)st[1].empty,
         (long long)st[1].undecided);
  printf("element-wise, 1 thread, plain interpreter:  %10.2f ms (%lld evaluations)\n", best[0],
         (long long)st[0].evaluated);
  printf("element-wise, threaded, row-vectorised:     %10.2f ms (%lld evaluations)\n", best[1],
         (long long)st[1].evaluated);
  printf("speed-up: %.1fx; masks identical: %s\n", best[0] / best[1], same ? "yes" : "NO");
  rt_block_mask_free(&bm[0]);
  rt_block_mask_free(&bm[1]);
  free(g);
  flex_kernel_free(k);
  return same ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "--longformer"))
    return longformer(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 3);
  int n = argc > 1 && argv[1][0] != '-' ? atoi(argv[1]) : 32768;
  bool full = argc > 1 && !strcmp(argv[argc - 1], "--full");
  flex_kernel *k = NULL;
  const char *paths[] = {"samples/document.score", "../samples/document.score"};
  for (int i = 0; i < 2 && !k && n >= 1; i++) flex_kernel_load(&k, paths[i], "packed_causal");
  if (!k) {
    fprintf(stderr, "bench_blockmask: %s\n", n < 1 ? "bad token count" : flex_last_error());
    return 1;
  }
  const IrModule *m = k->mod;
  int32_t *doc = malloc((size_t)n * 4);
  const char *seed = getenv("FLEXC_SEED"); /* the layout is random; its seed is printed */
  uint64_t x = (seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL)) | 1;
  printf("documents: seed %llu (FLEXC_SEED=N repeats a layout)\n", (unsigned long long)x);
  int id = 0, left = 0;
  for (int i = 0; i < n; i++) { /* documents of 1..4096 tokens */
    if (left == 0) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      left = 1 + (int)(x % 4096);
      id += i > 0;
    }
    doc[i] = id;
    left--;
  }
  int32_t sizes[16] = {1, 1, 1, n, n};
  for (int s = SZ_COUNT; s < m->nsizes && s < 16; s++) sizes[s] = n;
  IrBufView bufs[1] = {{doc, DT_I32, 1, {n}, {1}, NULL}};
  IrIntervalEnv env = {NULL, sizes, bufs};
  RtMaskShape shape = {1, 1, n, n, 128, 128, 0, 0};
  RtBlockMask bm;
  RtMaskStats st;
  char err[256];
  double t0 = now_ms();
  if (rt_block_mask_build(&bm, m, &env, &shape, RT_MASK_EVAL, &st) != FLEX_OK) {
    fprintf(stderr, "bench_blockmask: %s\n", err);
    return 1;
  }
  double t_build = now_ms() - t0;

  IrEnv ev;
  memset(&ev, 0, sizeof ev);
  ev.sizes = sizes;
  ev.bufs = bufs;
  ev.mod = m;
  IrVal *vals = calloc((size_t)m->mask->n, sizeof *vals);
  int step = full ? 1 : 64;
  int64_t kept = 0, rows = 0;
  t0 = now_ms();
  for (int q = 0; q < n; q += step, rows++)
    for (int kv = 0; kv < n; kv++) {
      ev.args[ARG_Q] = ir_vi(q);
      ev.args[ARG_KV] = ir_vi(kv);
      kept += ir_eval(m->mask, &ev, vals).b;
    }
  double t_dense = (now_ms() - t0) * (double)n / (double)rows;

  printf("document mask, %d tokens, %d documents, blocks 128x128\n", n, id + 1);
  printf("blocks: %lld total, %lld full, %lld partial, %lld empty (%lld element evaluations)\n",
         (long long)st.total, (long long)st.full, (long long)st.partial, (long long)st.empty,
         (long long)st.evaluated);
  printf("blockmask build: %10.2f ms\n", t_build);
  printf("dense evaluation: %9.2f ms%s (kept %lld)\n", t_dense,
         full ? "" : " (every 64th row timed, scaled by 64)", (long long)kept);
  printf("ratio dense / build: %.1fx\n", t_dense / t_build);
  rt_block_mask_free(&bm);
  free(vals);
  free(doc);
  flex_kernel_free(k);
  return 0;
}
