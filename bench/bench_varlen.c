/* bench_varlen: a packed variable-length batch against the same data as one
 * padded batch and as one long sequence with a document mask.
 *
 *   bench_varlen [--scale S] [--backend emu|cuda|cpu|reference] [--fwd-only]
 *                [--reps N] [--tile MxN]
 *
 * Sequences of lengths {4096, 512 x 8, 64 x 16} divided by S (default 1),
 * causal self-attention, H = 2, E = 64, fp16 (fp32 on the reference). Three
 * calls on the same tokens:
 *   packed   cu_seqlens, the causal mask per sequence (one launch set per
 *            sequence, runtime/varlen.c)
 *   padded   B = 25 sequences padded to the longest, mask
 *            `kv <= q && kv < len[b]` (padded rows are computed and dropped)
 *   document one sequence of all the tokens, mask
 *            `doc[q] == doc[kv] && kv <= q` with `doc` sorted
 * Each call runs once untimed first (kernel build or cache lookup), then N
 * times (default 1), the least time kept. For each: tiles visited
 * (rt_run_last_stats, summed over a packed call's sequences), wall time, the
 * tiles relative to sum over sequences of len^2 / 2 (the causal work;
 * constant when work is proportional to it), and the forward tiles that
 * tiles of M query rows x N keys (default 64x64, the cpu backend's forward
 * tile at E = 64; the emulator's is 128x64) predict for each layout: the
 * tiles each sequence's causal triangle touches (packed), each sequence's
 * causal keys against the longest's query rows (padded: padded keys are
 * masked, padded queries are not), every tile pair that some sequence's
 * causal triangle touches (document); times H, one walk per head.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/backend.h"
#include "runtime/flex.h"
#include "runtime/tensor.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static const char *const SRC =
    "buffer len: i32[B];\n"
    "buffer doc: i32[T] sorted;\n"
    "mask causal(b, h, q, kv) { return kv <= q; }\n"
    "mask padded(b, h, q, kv) { return kv <= q && kv < len[b]; }\n"
    "mask document(b, h, q, kv) { return doc[q] == doc[kv] && kv <= q; }\n"
    "kernel packed { mask = causal; }\n"
    "kernel padded_batch { mask = padded; }\n"
    "kernel one_sequence { mask = document; }\n";

static DLTensor *alloc_t(flex_backend be, DLDataType dt, int nd, const int64_t *shape) {
  DLTensor *t;
  if (flex_tensor_alloc(&t, be, dt, nd, shape, NULL)) {
    fprintf(stderr, "bench_varlen: %s\n", flex_last_error());
    exit(1);
  }
  return t;
}

/* A host tensor filled by f(i), copied to the backend. */
static DLTensor *filled(flex_backend be, DLDataType dt, int nd, const int64_t *shape,
                        double (*f)(int64_t, void *), void *ctx) {
  bool ints = dt.code == kDLInt;
  DLTensor *h = alloc_t(FLEX_BACKEND_REFERENCE, ints ? dt : rt_dtype(kDLFloat, 64), nd, shape);
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  for (int64_t i = 0; i < n; i++) {
    if (ints) ((int32_t *)h->data)[i] = (int32_t)f(i, ctx);
    else ((double *)h->data)[i] = f(i, ctx);
  }
  DLTensor *t = alloc_t(be, dt, nd, shape);
  if (flex_tensor_copy(t, h, NULL)) {
    fprintf(stderr, "bench_varlen: %s\n", flex_last_error());
    exit(1);
  }
  flex_tensor_free(h);
  return t;
}

static double rnd(int64_t i, void *ctx) {
  (void)ctx;
  uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + 12345;
  x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
  return ((double)(x >> 11) / 9007199254740992.0 - 0.5) * 2.0;
}

static double from_ints(int64_t i, void *ctx) { return ((const int32_t *)ctx)[i]; }

typedef struct Result {
  const char *name;
  uint64_t fwd_tiles, bwd_tiles;
  double fwd_ms, bwd_ms;
} Result;

static void report(const Result *r, double causal_work, uint64_t predicted) {
  printf("%-9s fwd tiles %10llu  bwd tiles %10llu  predicted %10llu  fwd %10.1f ms  bwd %10.1f ms  "
         "fwd tiles per 1e6 causal pairs %.2f\n",
         r->name, (unsigned long long)r->fwd_tiles, (unsigned long long)r->bwd_tiles,
         (unsigned long long)predicted, r->fwd_ms, r->bwd_ms, r->fwd_tiles / (causal_work / 1e6));
}

/* Key tiles of n keys that query tile i of m rows meets under a causal
 * mask when the keys stop at `len`. */
static uint64_t causal_row(int i, int len, int m, int n) {
  int last = (i + 1) * m - 1 < len - 1 ? (i + 1) * m - 1 : len - 1;
  return last < 0 ? 0 : (uint64_t)(last / n + 1);
}

/* m x n tiles that the causal triangle of each sequence touches. */
static uint64_t tiles_packed(const int32_t *lens, int nseq, int m, int n) {
  uint64_t s = 0;
  for (int b = 0; b < nseq; b++)
    for (int i = 0; i * m < lens[b]; i++) s += causal_row(i, lens[b], m, n);
  return s;
}

/* Padded to the longest: every sequence's query tiles up to the longest,
 * each against its own keys at or below the diagonal. */
static uint64_t tiles_padded(const int32_t *lens, int nseq, int m, int n) {
  uint64_t s = 0;
  for (int b = 0; b < nseq; b++)
    for (int i = 0; i * m < lens[0]; i++) s += causal_row(i, lens[b], m, n);
  return s;
}

/* One sequence of all the tokens: tile pairs (i, j) holding a query and a
 * key of one sequence with the key at or before the query. */
static uint64_t tiles_document(const int32_t *cu, int nseq, int m, int n) {
  int T = cu[nseq];
  uint64_t s = 0;
  for (int i = 0; i * m < T; i++)
    for (int j = 0; j * n < T; j++) {
      bool hit = false;
      for (int b = 0; b < nseq && !hit; b++) {
        int q0 = cu[b] > i * m ? cu[b] : i * m, q1 = cu[b + 1] < (i + 1) * m ? cu[b + 1] : (i + 1) * m;
        int k0 = cu[b] > j * n ? cu[b] : j * n, k1 = cu[b + 1] < (j + 1) * n ? cu[b + 1] : (j + 1) * n;
        hit = q0 < q1 && k0 < k1 && k0 <= q1 - 1;
      }
      s += hit;
    }
  return s;
}

/* Forward (and backward) of `a` with kernel k, the least of `reps` timed
 * runs, tiles from the stats. */
static void measure(Result *r, flex_kernel *k, flex_args *a, bool bwd, int reps) {
  /* a first call builds (or finds in the cache) the kernels: not timed */
  if (flex_forward(k, a) || (bwd && flex_backward(k, a)) || flex_sync(a->backend, NULL)) {
    fprintf(stderr, "bench_varlen: %s: %s\n", r->name, flex_last_error());
    exit(1);
  }
  for (int i = 0; i < reps; i++) {
    double t0 = now_ms();
    if (flex_forward(k, a) || flex_sync(a->backend, NULL)) {
      fprintf(stderr, "bench_varlen: %s: %s\n", r->name, flex_last_error());
      exit(1);
    }
    double ms = now_ms() - t0;
    if (!i || ms < r->fwd_ms) r->fwd_ms = ms;
    r->fwd_tiles = rt_run_last_stats().fwd_tiles;
    if (!bwd) continue;
    t0 = now_ms();
    if (flex_backward(k, a) || flex_sync(a->backend, NULL)) {
      fprintf(stderr, "bench_varlen: %s bwd: %s\n", r->name, flex_last_error());
      exit(1);
    }
    ms = now_ms() - t0;
    if (!i || ms < r->bwd_ms) r->bwd_ms = ms;
    r->bwd_tiles = rt_run_last_stats().bwd_tiles;
  }
}

/* Time k on a self-attention call (q = k = v = dO) of rank nd, shape qs
 * and LSE shape ls, packed by the offsets cu (both sides) or, without
 * them, reading one int32 buffer. */
static void measure_call(Result *r, flex_kernel *k, flex_backend be, DLDataType dt, DLDataType odt,
                         int nd, const int64_t *qs, const int64_t *ls, DLTensor *cu,
                         const char *bname, DLTensor *buf, bool bwd, int reps) {
  DLTensor *q = filled(be, dt, nd, qs, rnd, NULL), *out = alloc_t(be, odt, nd, qs);
  DLTensor *lse = alloc_t(be, rt_dtype(kDLFloat, 32), nd - 1, ls);
  DLTensor *dq = alloc_t(be, odt, nd, qs), *dk = alloc_t(be, odt, nd, qs), *dv = alloc_t(be, odt, nd, qs);
  flex_buffer fb = {bname, buf, NULL};
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = be;
  a.q = a.k = a.v = q, a.out = out, a.lse = lse;
  a.dout = q, a.dq = dq, a.dk = dk, a.dv = dv;
  if (cu) a.cu_seqlens_q = a.cu_seqlens_kv = cu;
  else a.buffers = &fb, a.nbuffers = 1;
  measure(r, k, &a, bwd, reps);
  DLTensor *all[] = {q, out, lse, dq, dk, dv};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) flex_tensor_free(all[i]);
}

int main(int argc, char **argv) {
  int scale = 1, reps = 1, tile_m = 64, tile_n = 64;
  bool bwd = true;
  flex_backend be = FLEX_BACKEND_EMU;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--scale") && i + 1 < argc) scale = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--backend") && i + 1 < argc && flex_backend_parse(argv[i + 1], &be)) i++;
    else if (!strcmp(argv[i], "--fwd-only")) bwd = false;
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--tile") && i + 1 < argc) {
      if (sscanf(argv[++i], "%dx%d", &tile_m, &tile_n) != 2) tile_m = tile_n = 0;
    }
    else {
      fprintf(stderr, "usage: bench_varlen [--scale S] [--backend emu|cuda|cpu|reference] "
                      "[--fwd-only] [--reps N] [--tile MxN]\n");
      return 2;
    }
  }
  if (reps < 1 || tile_m < 1 || tile_n < 1) {
    fprintf(stderr, "bench_varlen: --reps must be >= 1, --tile MxN with M, N >= 1\n");
    return 2;
  }
  if (scale < 1 || 64 % scale) {
    fprintf(stderr, "bench_varlen: --scale must divide 64\n");
    return 2;
  }
  if (!flex_backend_available(be)) {
    fprintf(stderr, "bench_varlen: %s\n", flex_last_error());
    return 1;
  }
  enum { NSEQ = 25 };
  int32_t lens[NSEQ], cu[NSEQ + 1];
  int n = 0;
  lens[n++] = 4096 / scale;
  for (int i = 0; i < 8; i++) lens[n++] = 512 / scale;
  for (int i = 0; i < 16; i++) lens[n++] = 64 / scale;
  cu[0] = 0;
  double work = 0;
  for (int i = 0; i < NSEQ; i++) {
    cu[i + 1] = cu[i] + lens[i];
    work += (double)lens[i] * (lens[i] + 1) / 2;
  }
  int T = cu[NSEQ], L = lens[0], H = 2, E = 64;
  DLDataType dt = be == FLEX_BACKEND_REFERENCE ? rt_dtype(kDLFloat, 32) : rt_dtype(kDLFloat, 16);
  DLDataType odt = be == FLEX_BACKEND_CUDA ? dt : rt_dtype(kDLFloat, 32);
  DLDataType i32 = rt_dtype(kDLInt, 32);
  printf("bench_varlen: backend %s, lengths {%d, %d x 8, %d x 16} (scale 1/%d), TOTAL %d, H %d, "
         "E %d, %s, causal pairs %.0f\n", flex_backend_name(be), lens[0], lens[1], lens[9], scale, T, H,
         E, be == FLEX_BACKEND_REFERENCE ? "fp32" : "fp16", work);
  flex_kernel *kp, *kb, *kd;
  if (flex_kernel_from_source(&kp, "bench_varlen", SRC, strlen(SRC), "packed") ||
      flex_kernel_from_source(&kb, "bench_varlen", SRC, strlen(SRC), "padded_batch") ||
      flex_kernel_from_source(&kd, "bench_varlen", SRC, strlen(SRC), "one_sequence")) {
    fprintf(stderr, "bench_varlen: %s\n", flex_last_error());
    return 1;
  }
  Result res[3] = {{"packed", 0, 0, 0, 0}, {"padded", 0, 0, 0, 0}, {"document", 0, 0, 0, 0}};
  DLTensor *cq = NULL, *len = NULL, *doc = NULL;
  /* packed */
  {
    int64_t qs[3] = {T, H, E}, ls[2] = {H, T}, cs = NSEQ + 1;
    cq = filled(be, i32, 1, &cs, from_ints, cu);
    measure_call(&res[0], kp, be, dt, odt, 3, qs, ls, cq, NULL, NULL, bwd, reps);
  }
  /* padded: B = 25 x L */
  {
    int64_t qs[4] = {NSEQ, H, L, E}, ls[3] = {NSEQ, H, L}, bs = NSEQ;
    len = filled(be, i32, 1, &bs, from_ints, lens);
    measure_call(&res[1], kb, be, dt, odt, 4, qs, ls, NULL, "len", len, bwd, reps);
  }
  /* one long sequence, document mask */
  {
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
    for (int s = 0; s < NSEQ; s++)
      for (int i = cu[s]; i < cu[s + 1]; i++) ids[i] = s;
    int64_t qs[4] = {1, H, T, E}, ls[3] = {1, H, T}, ts = T;
    doc = filled(be, i32, 1, &ts, from_ints, ids);
    measure_call(&res[2], kd, be, dt, odt, 4, qs, ls, NULL, "doc", doc, bwd, reps);
    free(ids);
  }
  flex_tensor_free(cq), flex_tensor_free(len), flex_tensor_free(doc);
  uint64_t pred[3] = {tiles_packed(lens, NSEQ, tile_m, tile_n) * (uint64_t)H,
                      tiles_padded(lens, NSEQ, tile_m, tile_n) * (uint64_t)H,
                      tiles_document(cu, NSEQ, tile_m, tile_n) * (uint64_t)H};
  printf("predicted: forward tiles of %d query rows x %d keys\n", tile_m, tile_n);
  for (int i = 0; i < 3; i++) report(&res[i], work, pred[i]);
  flex_kernel_free(kp), flex_kernel_free(kb), flex_kernel_free(kd);
  return 0;
}
