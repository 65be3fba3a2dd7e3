/* bench_determ.c: what a deterministic backward costs against the atomic
 * one (run by hand; figures go to bench/RESULTS.md).
 *
 *   bench_determ [--backend cpu|emu] [--L N] [--E N] [--H N] [--reps N]
 *
 * fp32, B=1, HKV=H/2 (GQA), Q_LEN = KV_LEN = L. For three kernels (an
 * identity score; a causal mask with a learnable per-head slope, `grad`;
 * a relative-position bias table [H, 64], `grad`) the backward with and
 * without flex_args.deterministic, alternating in one process after one
 * warm-up each: the median of --reps runs of each and their ratio, and
 * whether the gradients' bits (dq, dk, dv, the buffer's) changed between
 * runs of the same mode ("varies" / "same"). On the
 * emulator the figures are the CPU's cost of emulating the kernels (float
 * CAS loops against plain adds and 64-bit atomics), not a GPU's.
 * FLEXC_THREADS sets the threads.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/flex.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static const struct {
  const char *name, *src, *buffer;
  int nb; /* the buffer: f32[H] (0) or f32[H, nb] */
} kernels[] = {
    {"identity", "score ident(s, b, h, q, kv) { return s; }\n", NULL, 0},
    {"causal+slope",
     "buffer hb: f32[H] grad;\n"
     "score sloped(s, b, h, q, kv) { return s + hb[h] * float(kv - q); }\n"
     "mask causal(b, h, q, kv) { return q >= kv; }\n",
     "hb", 0},
    {"relpos table",
     "buffer rb: f32[H, 64] grad;\n"
     "score rel(s, b, h, q, kv) { return s + rb[h, clamp(kv - q + 32, 0, 63)]; }\n",
     "rb", 64},
};

static void fill(DLTensor *t, uint64_t *rng, double spread) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  float *f = t->data;
  for (int64_t i = 0; i < n; i++) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    f[i] = (float)(((double)(*rng >> 40) / (double)(1u << 24) * 2.0 - 1.0) * spread);
  }
}

static DLTensor *tensor(flex_backend be, int nd, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  int64_t shape[4] = {d0, d1, d2, d3};
  DLTensor *t = NULL;
  if (flex_tensor_alloc(&t, be, (DLDataType){kDLFloat, 32, 1}, nd, shape, NULL)) {
    fprintf(stderr, "bench_determ: %s\n", flex_last_error());
    exit(1);
  }
  return t;
}

/* FNV-1a over the bytes of the gradients (host memory: cpu and emu). */
static uint64_t hash(const flex_args *a) {
  const DLTensor *t[4] = {a->dq, a->dk, a->dv, a->nbuffers ? a->buffers[0].grad : NULL};
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 4 && t[i]; i++) {
    size_t n = (size_t)(t[i]->dtype.bits / 8);
    for (int d = 0; d < t[i]->ndim; d++) n *= (size_t)t[i]->shape[d];
    for (size_t j = 0; j < n; j++) h = (h ^ ((const unsigned char *)t[i]->data)[j]) * 1099511628211ull;
  }
  return h;
}

static double once(flex_kernel *k, flex_args *a, uint64_t *h) {
  double t0 = now();
  if (flex_backward(k, a)) {
    fprintf(stderr, "bench_determ: %s\n", flex_last_error());
    exit(1);
  }
  double t = now() - t0;
  *h = hash(a);
  return t;
}

int main(int argc, char **argv) {
  flex_backend be = FLEX_BACKEND_CPU;
  int L = 1024, E = 64, H = 8, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--backend") && !flex_backend_parse(argv[i + 1], &be)) return 2;
    if (!strcmp(argv[i], "--L")) L = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--E")) E = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--H")) H = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
  }
  if (!flex_backend_available(be) || reps < 1 || reps > 100 || H < 2 || H % 2) {
    fprintf(stderr, "bench_determ: %s\n", flex_last_error());
    return 1;
  }
  int HKV = H / 2;
  uint64_t rng = 12345;
  DLTensor *q = tensor(be, 4, 1, H, L, E), *k = tensor(be, 4, 1, HKV, L, E);
  DLTensor *v = tensor(be, 4, 1, HKV, L, E), *dout = tensor(be, 4, 1, H, L, E);
  DLTensor *out = tensor(be, 4, 1, H, L, E), *lse = tensor(be, 3, 1, H, L, 0);
  DLTensor *dq = tensor(be, 4, 1, H, L, E), *dk = tensor(be, 4, 1, HKV, L, E);
  DLTensor *dv = tensor(be, 4, 1, HKV, L, E);
  fill(q, &rng, 1), fill(k, &rng, 1), fill(v, &rng, 1), fill(dout, &rng, 1);
  printf("backend %s, fp32, B=1 H=%d HKV=%d L=%d E=%d, median of %d\n", flex_backend_name(be), H,
         HKV, L, E, reps);
  printf("%-14s %12s %16s %8s  %s\n", "kernel", "atomic ms", "deterministic ms", "ratio",
         "bits across runs (atomic, deterministic)");
  for (size_t n = 0; n < sizeof kernels / sizeof *kernels; n++) {
    flex_kernel *kern = NULL;
    if (flex_kernel_from_source(&kern, kernels[n].name, kernels[n].src, strlen(kernels[n].src), NULL)) {
      fprintf(stderr, "bench_determ: %s\n", flex_last_error());
      return 1;
    }
    DLTensor *buf = NULL, *grad = NULL;
    flex_buffer fb;
    flex_args a;
    memset(&a, 0, sizeof a);
    a.backend = be;
    a.q = q, a.k = k, a.v = v, a.out = out, a.lse = lse, a.dout = dout;
    a.dq = dq, a.dk = dk, a.dv = dv;
    if (kernels[n].buffer) {
      int nd = kernels[n].nb ? 2 : 1;
      buf = tensor(be, nd, H, kernels[n].nb, 0, 0), grad = tensor(be, nd, H, kernels[n].nb, 0, 0);
      fill(buf, &rng, 0.05);
      fb = (flex_buffer){kernels[n].buffer, buf, grad};
      a.buffers = &fb, a.nbuffers = 1;
    }
    if (flex_forward(kern, &a)) {
      fprintf(stderr, "bench_determ: %s\n", flex_last_error());
      return 1;
    }
    double t[2][100];
    uint64_t h0[2], h;
    bool varies[2] = {false, false};
    for (int d = 0; d < 2; d++) a.deterministic = d, once(kern, &a, &h0[d]); /* warm-up: build, JIT */
    for (int r = 0; r < reps; r++)
      for (int d = 0; d < 2; d++) {
        a.deterministic = d, t[d][r] = once(kern, &a, &h);
        varies[d] = varies[d] || h != h0[d];
      }
    qsort(t[0], (size_t)reps, sizeof(double), cmp);
    qsort(t[1], (size_t)reps, sizeof(double), cmp);
    double m0 = t[0][reps / 2], m1 = t[1][reps / 2];
    printf("%-14s %12.1f %16.1f %8.3f  %s, %s\n", kernels[n].name, m0 * 1e3, m1 * 1e3, m1 / m0,
           varies[0] ? "varies" : "same", varies[1] ? "varies" : "same");
    flex_tensor_free(buf), flex_tensor_free(grad);
    flex_kernel_free(kern);
  }
  DLTensor *all[] = {q, k, v, dout, out, lse, dq, dk, dv};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) flex_tensor_free(all[i]);
  return 0;
}
