/* bench_cpu.c: the CPU backend's speed (run by hand; figures go to
 * bench/RESULTS.md).
 *
 *   bench_cpu [--L 2048,4096] [--E 64,128] [--masks none,causal,softcap] [--reps N]
 *             [--no-bwd] [--jit-only]
 *   bench_cpu --ratios [--dtypes fp32,bf16,fp16] [--L ..] [--E ..] [--masks ..] [--reps N]
 *   bench_cpu --score
 *
 * --ratios is for a shared machine, where absolute times move with the
 * neighbours' load: forwards only, every (mask, dtype) of a shape run once
 * per round, in turn, for --reps rounds (default 7), printing each
 * variant's median time and the medians over rounds of the ratios taken
 * within one round: dtype / fp32 per mask and mask / none per dtype.
 *
 * fp32, B=1, H=8, L=S. For each shape and mask: the forward and backward
 * through the public API (best of --reps runs after one warm-up), their
 * GFLOP/s (FlashAttention's count: 4*B*H*L*S*E forward, halved for causal,
 * backward 2.5x forward), microseconds per query row, the backward/forward
 * ratio, and an sgemm "roofline" measured in the same run: the micro-kernel
 * the forward uses (cpu_kern()->gemm), over the same two products per
 * (head, 64-row tile) with no softmax, on the same thread pool. Then the
 * cold JIT time of score + mask + joint (softcap + causal), a warm cache
 * hit, and the one-time creation of the LLJIT. FLEXC_THREADS sets the threads (default: every core).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu.h"
#include "runtime/flex.h"
#include "runtime/rt.h"
#include "runtime/tensor.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static const char *const sources[3] = {
    "score ident(s, b, h, q, kv) { return s; }\n",
    "mask causal(b, h, q, kv) { return q >= kv; }\n",
    "param float softcap = 20.0;\n"
    "score capped(s, b, h, q, kv) { return softcap * tanh(s / softcap); }\n"
    "mask causal(b, h, q, kv) { return q >= kv; }\n"};
static const char *const mask_names[3] = {"none", "causal", "softcap"};

static DLTensor *tensor(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int nd, uint64_t *rng) {
  int64_t shape[4] = {d0, d1, d2, d3};
  DLTensor *t = NULL;
  if (flex_tensor_alloc(&t, FLEX_BACKEND_CPU, (DLDataType){kDLFloat, 32, 1}, nd, shape, NULL)) {
    fprintf(stderr, "%s\n", flex_last_error());
    exit(1);
  }
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  float *f = t->data;
  for (int64_t i = 0; i < n; i++) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    f[i] = (float)((double)(*rng >> 40) / (double)(1u << 24) * 2.0 - 1.0);
  }
  return t;
}

/* The sgemm roofline: S = Q K^T (64 x 128 tiles, k = E) and O += P V
 * (k = 128) per (head, query tile, key tile), on the pool, in the order the
 * forward runs them (cpu/attn.c): items of four query tiles that walk the
 * keys four tiles at a time, K^T rows padded as the forward pads them (a
 * row stride of a power of two would put a tile's rows in the same cache
 * sets and measure that instead of the products). */
enum { ROOF_GROUP = 4, ROOF_CHUNK = 4 };
typedef struct Roof {
  int L, E, H;                 /* the shape measured */
  int64_t ldk;                 /* row stride of kt */
  float *q, *kt, *v, *scratch; /* operands (zeros: only the time matters) and per-worker tiles */
} Roof;

static size_t roof_scratch(int E) { return 64 * 128 + ROOF_GROUP * 64 * (size_t)E; }

static void roof_item(void *ctx, int64_t item, int worker) {
  Roof *r = ctx;
  const CpuKern *K = cpu_kern();
  int nqt = r->L / 64, ngr = nqt / ROOF_GROUP, nkt = r->L / 128;
  int qt0 = (int)(item % ngr) * ROOF_GROUP;
  float *S = r->scratch + (size_t)worker * roof_scratch(r->E), *O = S + 64 * 128;
  for (int c0 = 0; c0 < nkt; c0 += ROOF_CHUNK)
    for (int i = 0; i < ROOF_GROUP; i++)
      for (int kt = c0; kt < c0 + ROOF_CHUNK && kt < nkt; kt++) {
        int kv0 = kt * 128;
        K->gemm(64, 128, r->E, r->q + (size_t)(qt0 + i) * 64 * r->E, r->E, 1, r->kt + kv0, r->ldk, S,
                128, false);
        K->gemm(64, r->E, 128, S, 128, 1, r->v + (size_t)kv0 * r->E, r->E, O + (size_t)i * 64 * r->E,
                r->E, true);
      }
}

static double roofline(int H, int L, int E) {
  Roof r = {L, E, H, L + 144, NULL, NULL, NULL, NULL};
  r.q = calloc((size_t)L * E, 4), r.kt = calloc((size_t)r.ldk * E, 4), r.v = calloc((size_t)L * E, 4);
  r.scratch = calloc((size_t)base_pool_size() * roof_scratch(E), 4);
  double best = 1e9;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now();
    base_pool_run((int64_t)H * (L / 64 / ROOF_GROUP), roof_item, &r);
    double t = now() - t0;
    if (t < best) best = t;
  }
  free(r.q), free(r.kt), free(r.v), free(r.scratch);
  return 4.0 * H * (double)L * L * E / best / 1e9;
}

/* t as dtype dt (fp32 data rounded once: bf16 or fp16), a new tensor. */
static DLTensor *convert(const DLTensor *t, int dt) {
  DLDataType d = dt == 0 ? (DLDataType){kDLFloat, 32, 1}
                         : dt == 1 ? (DLDataType){kDLBfloat, 16, 1} : (DLDataType){kDLFloat, 16, 1};
  DLTensor *o = NULL;
  if (flex_tensor_alloc(&o, FLEX_BACKEND_CPU, d, t->ndim, t->shape, NULL)) {
    fprintf(stderr, "%s\n", flex_last_error());
    exit(1);
  }
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  const float *f = t->data;
  for (int64_t i = 0; i < n; i++) {
    if (dt == 0) ((float *)o->data)[i] = f[i];
    else ((uint16_t *)o->data)[i] = dt == 1 ? rt_bf16_from_double(f[i]) : rt_half_from_double(f[i]);
  }
  return o;
}

static double median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, cmp);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static const char *const dtype_names[3] = {"fp32", "bf16", "fp16"};

/* --ratios for one shape: forwards of every (mask, dtype), interleaved. */
static void ratios(int L, int E, const bool *masks, const bool *dts, int rounds) {
  enum { MAXR = 64 };
  if (rounds > MAXR) rounds = MAXR;
  if (rounds < 1) rounds = 1;
  const int B = 1, H = 8;
  uint64_t rng = 0x5eed + (uint64_t)L * 131 + (uint64_t)E;
  DLTensor *src[4], *ts[3][4], *lse = tensor(B, H, L, 1, 3, &rng);
  for (int i = 0; i < 4; i++) src[i] = tensor(B, H, L, E, 4, &rng);
  flex_kernel *ks[3] = {NULL, NULL, NULL};
  flex_args args[3][3];
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < 4; i++) ts[d][i] = dts[d] ? convert(src[i], d) : NULL;
  for (int mi = 0; mi < 3; mi++) {
    if (!masks[mi]) continue;
    if (flex_kernel_from_source(&ks[mi], mask_names[mi], sources[mi], strlen(sources[mi]), NULL)) {
      fprintf(stderr, "%s\n", flex_last_error());
      exit(1);
    }
    for (int d = 0; d < 3; d++) {
      flex_args *a = &args[mi][d];
      memset(a, 0, sizeof *a);
      a->backend = FLEX_BACKEND_CPU;
      a->q = ts[d][0], a->k = ts[d][1], a->v = ts[d][2], a->out = ts[d][3], a->lse = lse;
    }
  }
  static double t[3][3][MAXR];
  for (int r = -1; r < rounds; r++) /* round -1 warms up (JIT, pages) */
    for (int x = 0; x < 9; x++) {
      int v = (x + (r < 0 ? 0 : r)) % 9, mi = v / 3, d = v % 3; /* a rotating order */
      if (!masks[mi] || !dts[d]) continue;
      double t0 = now();
      if (flex_forward(ks[mi], &args[mi][d])) {
        fprintf(stderr, "%s\n", flex_last_error());
        exit(1);
      }
      if (r >= 0) t[mi][d][r] = now() - t0;
    }
  printf("\nL=S=%d E=%d B=%d H=%d, forward, %d interleaved rounds: median ms\n", L, E, B, H, rounds);
  double x[MAXR];
  for (int mi = 0; mi < 3; mi++)
    for (int d = 0; d < 3; d++) {
      if (!masks[mi] || !dts[d]) continue;
      memcpy(x, t[mi][d], sizeof(double) * (size_t)rounds);
      printf("  %-8s %-5s %8.1f ms  %6.1f GFLOP/s\n", mask_names[mi], dtype_names[d],
             median(x, rounds) * 1e3, 4.0 * B * H * (double)L * L * E * (mi ? 0.5 : 1.0) / median(x, rounds) / 1e9);
    }
  for (int mi = 0; mi < 3; mi++)
    for (int d = 1; d < 3; d++) {
      if (!masks[mi] || !dts[d] || !dts[0]) continue;
      for (int r = 0; r < rounds; r++) x[r] = t[mi][0][r] / t[mi][d][r];
      printf("  %-8s speed-up %s over fp32 (fp32 time / %s time): median %.2f\n", mask_names[mi],
             dtype_names[d], dtype_names[d], median(x, rounds));
    }
  for (int mi = 1; mi < 3; mi++)
    for (int d = 0; d < 3; d++) {
      if (!masks[mi] || !masks[0] || !dts[d]) continue;
      for (int r = 0; r < rounds; r++) x[r] = t[mi][d][r] / t[0][d][r];
      printf("  %-8s / none forward time, %s: median %.3f\n", mask_names[mi], dtype_names[d],
             median(x, rounds));
    }
  for (int mi = 0; mi < 3; mi++) flex_kernel_free(ks[mi]);
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < 4; i++)
      if (ts[d][i]) flex_tensor_free(ts[d][i]);
  for (int i = 0; i < 4; i++) flex_tensor_free(src[i]);
  flex_tensor_free(lse);
}

static double run(flex_kernel *k, flex_args *a, bool bwd, int reps) {
  double t[16];
  if (reps > 16) reps = 16;
  for (int i = -1; i < reps; i++) {
    double t0 = now();
    flex_status st = bwd ? flex_backward(k, a) : flex_forward(k, a);
    if (st) {
      fprintf(stderr, "%s\n", flex_last_error());
      exit(1);
    }
    if (i >= 0) t[i] = now() - t0;
  }
  qsort(t, (size_t)reps, sizeof *t, cmp);
  return t[0]; /* best of: on a shared machine the other runs measure the neighbours */
}

static int parse_list(const char *s, int *out, int max) {
  int n = 0;
  while (*s && n < max) {
    out[n++] = atoi(s);
    while (*s && *s != ',') s++;
    if (*s == ',') s++;
  }
  return n;
}

/* The JIT test module (softcap + causal, score f_TAG), compiled with its joint. */
static flex_kernel *jit_kernel(long tag, const CpuModule **m) {
  char src[512];
  snprintf(src, sizeof src, "param float softcap = 20.0;\n"
                            "score capped_%ld(s, b, h, q, kv) { return softcap * tanh(s / softcap); }\n"
                            "mask causal(b, h, q, kv) { return q >= kv; }\n", tag);
  flex_kernel *k = NULL;
  CpuJitOpts o = {.joint = true, .identity = false, .check_bounds = false};
  if (flex_kernel_from_source(&k, "jit", src, strlen(src), NULL) || cpu_jit_get(k->mod, &o, m)) {
    fprintf(stderr, "%s\n", flex_last_error());
    flex_kernel_free(k);
    return NULL;
  }
  return k;
}

/* --score: the softcap score alone, the JIT's tile functions over one
 * 64 x 128 tile (as the forward calls them: score on full tiles,
 * score + mask on the diagonal ones) on the calling thread, inputs in
 * [-3, 3) restored before each call (the restore's cost included and
 * printed on its own): best of 30 runs of 200 calls, ns per element. */
static int score_alone(void) {
  const CpuModule *m = NULL;
  flex_kernel *k = jit_kernel(0, &m);
  if (!k) return 1;
  FlexParams p;
  memset(&p, 0, sizeof p);
  p.pf[0] = 20.0f;
  enum { TM = 64, TN = 128, N = TM * TN, CALLS = 200 };
  float *t = malloc(sizeof(float) * N), *s0 = malloc(sizeof(float) * N);
  uint64_t rng = 0x5c0e;
  for (int i = 0; i < N; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    s0[i] = (float)((double)(rng >> 40) / (double)(1u << 24) * 6.0 - 3.0);
  }
  CpuScoreFn fns[3] = {NULL, m->score, m->score_mask};
  const char *names[3] = {"restore only", "score", "score + mask"};
  for (int f = 0; f < 3; f++) {
    double best = 1e9;
    for (int r = 0; r < 30; r++) {
      double t0 = now();
      for (int c = 0; c < CALLS; c++) {
        memcpy(t, s0, sizeof(float) * N);
        if (fns[f]) fns[f](t, TN, TM, TN, 0, 0, TN / 2, 0, &p);
      }
      double dt = now() - t0;
      if (dt < best) best = dt;
    }
    printf("softcap %-13s %.3f ns/element (64 x 128 tiles, one thread)\n", names[f], best / CALLS / N * 1e9);
  }
  free(t), free(s0);
  flex_kernel_free(k);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--score")) return score_alone();
  if (argc == 3 && !strcmp(argv[1], "--jit-child")) { /* the disk-cache measurement */
    cpu_jit_ready();
    const CpuModule *m = NULL;
    double t0 = now();
    flex_kernel *k = jit_kernel(atol(argv[2]), &m);
    if (!k) return 1;
    printf("%.1f ms (object from the disk cache: %s)\n", (now() - t0) * 1e3, m->from_disk ? "yes" : "no");
    flex_kernel_free(k);
    return 0;
  }
  int Ls[4] = {2048, 4096}, Es[4] = {64, 128}, nL = 2, nE = 2, reps = 3;
  bool masks[3] = {true, true, true}, bwd = true, ratio = false, dts[3] = {true, true, true};
  bool reps_set = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--L") && i + 1 < argc) nL = parse_list(argv[++i], Ls, 4);
    else if (!strcmp(argv[i], "--E") && i + 1 < argc) nE = parse_list(argv[++i], Es, 4);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]), reps_set = true;
    else if (!strcmp(argv[i], "--ratios")) ratio = true;
    else if (!strcmp(argv[i], "--dtypes") && i + 1 < argc) {
      const char *m = argv[++i];
      for (int j = 0; j < 3; j++) dts[j] = strstr(m, dtype_names[j]) != NULL;
    }
    else if (!strcmp(argv[i], "--no-bwd")) bwd = false;
    else if (!strcmp(argv[i], "--jit-only")) nL = 0;
    else if (!strcmp(argv[i], "--masks") && i + 1 < argc) {
      const char *m = argv[++i];
      for (int j = 0; j < 3; j++) masks[j] = strstr(m, mask_names[j]) != NULL;
    } else {
      fprintf(stderr, "usage: bench_cpu [--L 2048,4096] [--E 64,128] [--masks none,causal,softcap] "
                      "[--reps N] [--no-bwd] [--jit-only]\n"
                      "       bench_cpu --ratios [--dtypes fp32,bf16,fp16] [--L ..] [--E ..] "
                      "[--masks ..] [--reps N]\n");
      return 2;
    }
  }
  double t_start = now();
  if (!flex_backend_available(FLEX_BACKEND_CPU)) { /* creates the LLJIT */
    fprintf(stderr, "no cpu backend: %s\n", flex_last_error());
    return 1;
  }
  t_start = now() - t_start;
  if (ratio) {
    printf("cpu backend: %d threads, kernels %s\n", base_pool_size(), cpu_kern()->name);
    for (int li = 0; li < nL; li++)
      for (int ei = 0; ei < nE; ei++) ratios(Ls[li], Es[ei], masks, dts, reps_set ? reps : 7);
    return 0;
  }
  printf("cpu backend: %d threads, kernels %s; B=1 H=8 fp32, best of %d\n", base_pool_size(),
         cpu_kern()->name, reps);
  const int B = 1, H = 8;
  for (int li = 0; li < nL; li++)
    for (int ei = 0; ei < nE; ei++) {
      int L = Ls[li], E = Es[ei];
      uint64_t rng = 0x5eed + (uint64_t)L * 131 + (uint64_t)E;
      DLTensor *q = tensor(B, H, L, E, 4, &rng), *kk = tensor(B, H, L, E, 4, &rng);
      DLTensor *v = tensor(B, H, L, E, 4, &rng), *o = tensor(B, H, L, E, 4, &rng);
      DLTensor *lse = tensor(B, H, L, 1, 3, &rng), *dout = tensor(B, H, L, E, 4, &rng);
      DLTensor *dq = tensor(B, H, L, E, 4, &rng), *dk = tensor(B, H, L, E, 4, &rng);
      DLTensor *dv = tensor(B, H, L, E, 4, &rng);
      double roof = roofline(H, L, E);
      printf("\nL=S=%d E=%d: sgemm roofline (same micro-kernel and products, no softmax) %.1f GFLOP/s\n",
             L, E, roof);
      double fwd_dense = 0;
      for (int mi = 0; mi < 3; mi++) {
        if (!masks[mi]) continue;
        flex_kernel *k = NULL;
        if (flex_kernel_from_source(&k, mask_names[mi], sources[mi], strlen(sources[mi]), NULL)) {
          fprintf(stderr, "%s\n", flex_last_error());
          return 1;
        }
        flex_args a;
        memset(&a, 0, sizeof a);
        a.backend = FLEX_BACKEND_CPU;
        a.q = q, a.k = kk, a.v = v, a.out = o, a.lse = lse, a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
        double flops = 4.0 * B * H * (double)L * L * E * (mi ? 0.5 : 1.0);
        double tf = run(k, &a, false, reps);
        if (mi == 0) fwd_dense = tf;
        printf("  %-8s forward  %8.1f ms  %6.1f GFLOP/s  %6.2f us/row (%.0f%% of roofline)%s\n",
               mask_names[mi], tf * 1e3, flops / tf / 1e9, tf / (B * H * (double)L) * 1e6,
               100.0 * flops / tf / 1e9 / roof, "");
        if (mi && fwd_dense > 0)
          printf("           causal / dense forward time %.2f\n", tf / fwd_dense);
        if (bwd) {
          double tb = run(k, &a, true, reps < 2 ? reps : 2);
          printf("  %-8s backward %8.1f ms  %6.1f GFLOP/s  backward/forward %.2f\n", mask_names[mi],
                 tb * 1e3, 2.5 * flops / tb / 1e9, tb / tf);
        }
        flex_kernel_free(k);
      }
      DLTensor *all[] = {q, kk, v, o, lse, dout, dq, dk, dv};
      for (int i = 0; i < 9; i++) flex_tensor_free(all[i]);
    }
  /* Cold JIT of score + mask + joint, and a warm hit. A fresh name keeps
   * the IR text new (the caches are keyed by it). */
  long tag = (long)time(NULL) * 1000 + (long)(now() * 1e3) % 1000;
  const CpuModule *m = NULL;
  double t0 = now();
  flex_kernel *k = jit_kernel(tag, &m);
  if (!k) return 1;
  double cold = now() - t0;
  double hits[101];
  for (int i = 0; i < 101; i++) {
    t0 = now();
    CpuJitOpts o = {.joint = true, .identity = false, .check_bounds = false};
    cpu_jit_get(k->mod, &o, &m);
    hits[i] = now() - t0;
  }
  qsort(hits, 101, sizeof *hits, cmp);
  /* The same module in a new process (the object code from the disk
   * cache), and a new module in a new process with the disk cache off
   * (LLVM's first compile in a process included). */
  char line[2][256] = {"", ""}, cmd[1024];
  for (int i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd, "%s'%s' --jit-child %ld", i ? "FLEXC_CACHE_DIR=off " : "", argv[0],
             i ? tag + 1 : tag);
    FILE *child = popen(cmd, "r");
    if (child && !fgets(line[i], sizeof line[i], child)) line[i][0] = 0;
    if (child) pclose(child);
  }
  printf("\nJIT (softcap + causal: score, score+mask, mask, joint): cold %.1f ms, warm hit %.4f ms "
         "(median of 101); creating the LLJIT (once per process) %.1f ms\n", cold * 1e3,
         hits[50] * 1e3, t_start * 1e3);
  printf("the same module in a new process: %s", line[0][0] ? line[0] : "(no answer)\n");
  printf("a new module in a new process, disk cache off: %s", line[1][0] ? line[1] : "(no answer)\n");
  flex_kernel_free(k);
  return 0;
}
