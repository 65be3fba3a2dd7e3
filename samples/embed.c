/* embed: a small program that embeds the flexc runtime.
 *
 * Loads a .score file, makes random inputs, runs attention forward and
 * backward on a backend (the GPU, the CPU backend, or the emulator that
 * runs the generated CUDA on the CPU) and on the float64 reference, and
 * prints the relative error of every output against the reference.
 *
 *   embed [--backend auto|cuda|cpu|emu] [--dtype fp32|fp16|bf16] [FILE.score [KERNEL]]
 *
 * --backend auto (the default) uses the GPU when there is one, else the CPU
 * backend where this build has it, else the emulator, and says which. Float buffers the kernel reads are
 * filled with small random values; other buffers need a real program.
 * Exit status: 0 all within tolerance, 1 not (or an error), 77 when the CUDA
 * backend was asked for and there is no device. The seed is printed;
 * FLEXC_SEED=N reruns one.
 *
 * A real program passes its own tensors (from PyTorch, JAX, CuPy) as
 * DLTensors; this one lets the runtime allocate them (flex_tensor_alloc,
 * through flex_mirror.h) so that it needs nothing but the library, and it
 * learns the kernel's buffers from flex_kernel_get_info.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flexc/flex.h>
#include <flexc/flex_mirror.h>

/* Shapes: big enough to cross several tiles, small enough for the emulator. */
typedef struct Shape {
  int B, H, HKV, QL, KL, E, EV;
} Shape;
static const Shape full_shape = {2, 4, 2, 160, 224, 64, 64};
static const Shape emu_shape = {1, 2, 1, 96, 130, 64, 64};

static const DLDataType F32 = {kDLFloat, 32, 1}, F64 = {kDLFloat, 64, 1};

/* A tensor in two places: float64 values for the reference, and the
 * device backend's tensor (flex_mirror: a host image in the device dtype,
 * and on the GPU a copy). */
typedef struct Pair {
  DLTensor *ref;   /* float64 values: what the reference reads and writes */
  flex_mirror dev; /* the device backend's side */
} Pair;

static uint64_t rng;
static double normal(void) {
  double u = 0, v;
  while (u <= 1e-300) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    u = (double)(rng >> 11) / 9007199254740992.0;
  }
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  v = (double)(rng >> 11) / 9007199254740992.0;
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(flex_status st, const char *what) {
  fprintf(stderr, "embed: %s failed (status %d): %s\n", what, (int)st, flex_last_error());
  return 1;
}

/* Make a pair; `scale` > 0 fills it with scaled normals (rounded to the
 * device dtype so both backends see identical inputs), 0 poisons it. */
static flex_status make(Pair *p, flex_backend b, int n, const int64_t *shape, DLDataType dt,
                        double scale) {
  DLTensor *ref;
  memset(p, 0, sizeof *p);
  flex_status st = flex_tensor_alloc(&ref, FLEX_BACKEND_REFERENCE, F64, n, shape, NULL);
  if (st) return st;
  p->ref = ref;
  int64_t cnt = 1;
  for (int d = 0; d < n; d++) cnt *= shape[d];
  for (int64_t i = 0; i < cnt; i++) ((double *)ref->data)[i] = scale > 0 ? scale * normal() : NAN;
  st = flex_mirror_zeros(&p->dev, b, dt, n, shape, dt);
  if (!st) st = flex_tensor_copy(p->dev.host, ref, NULL); /* round to dt */
  if (!st) st = flex_tensor_copy(ref, p->dev.host, NULL); /* the reference sees the rounded values */
  if (!st) st = flex_mirror_push(&p->dev, NULL);
  return st;
}

static void drop(Pair *p) {
  flex_mirror_free(&p->dev);
  flex_tensor_free(p->ref);
}

/* Relative norm error |x - ref| / |ref| of the device result; NaN never passes. */
static double rel_error(Pair *p) {
  DLTensor *x;
  if (flex_mirror_pull(&p->dev, NULL) ||
      flex_tensor_alloc(&x, FLEX_BACKEND_REFERENCE, F64, p->ref->ndim, p->ref->shape, NULL))
    return INFINITY;
  if (flex_tensor_copy(x, p->dev.host, NULL)) {
    flex_tensor_free(x);
    return INFINITY;
  }
  int64_t cnt = 1;
  for (int d = 0; d < x->ndim; d++) cnt *= x->shape[d];
  double num = 0, den = 0;
  for (int64_t i = 0; i < cnt; i++) {
    double r = ((const double *)p->ref->data)[i], v = ((const double *)x->data)[i];
    if (isinf(r) && r == v) continue; /* LSE of a fully masked row */
    num += (v - r) * (v - r);
    den += r * r;
  }
  flex_tensor_free(x);
  double e = den > 0 ? sqrt(num) / sqrt(den) : INFINITY; /* an all-zero reference proves nothing */
  return isnan(e) ? INFINITY : e;
}

/* A buffer's shape from its declared dimensions; false for a free size. */
static bool buffer_shape(const flex_buffer_info *b, const Shape *S, int64_t *shape) {
  for (int d = 0; d < b->ndim; d++) {
    const char *n = b->dim_name[d];
    if (!n) shape[d] = b->extent[d];
    else if (!strcmp(n, "B")) shape[d] = S->B;
    else if (!strcmp(n, "H")) shape[d] = S->H;
    else if (!strcmp(n, "HKV")) shape[d] = S->HKV;
    else if (!strcmp(n, "Q_LEN")) shape[d] = S->QL;
    else if (!strcmp(n, "KV_LEN")) shape[d] = S->KL;
    else return false;
  }
  return true;
}

int main(int argc, char **argv) {
  const char *backend = "auto", *dtype = "fp32", *path = "samples/gemma2.score", *kname = NULL;
  int pos = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
    else if (argv[i][0] == '-') {
      fprintf(stderr, "usage: embed [--backend auto|cuda|cpu|emu] [--dtype fp32|fp16|bf16] [FILE [KERNEL]]\n");
      return 2;
    } else if (pos++ == 0) path = argv[i];
    else kname = argv[i];
  }
  int di = !strcmp(dtype, "fp32") ? 0 : !strcmp(dtype, "fp16") ? 1 : !strcmp(dtype, "bf16") ? 2 : -1;
  if (di < 0 || (strcmp(backend, "auto") && strcmp(backend, "cuda") && strcmp(backend, "cpu") &&
                 strcmp(backend, "emu"))) {
    fprintf(stderr, "embed: unknown --backend '%s' or --dtype '%s'\n", backend, dtype);
    return 2;
  }
  const DLDataType dts[] = {F32, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}};
  const double tol[] = {1e-4, 5e-3, 3e-2}, gtol[] = {1e-3, 2e-2, 6e-2};
  DLDataType dt = dts[di];

  bool automatic = !strcmp(backend, "auto");
  bool gpu = automatic || !strcmp(backend, "cuda");
  if (gpu && !flex_backend_available(FLEX_BACKEND_CUDA)) {
    if (!automatic) {
      printf("skipped: %s\n", flex_last_error());
      return 77;
    }
    printf("no usable GPU (%s)\n", flex_last_error());
    gpu = false;
  }
  bool cpu = !gpu && (automatic || !strcmp(backend, "cpu"));
  if (cpu && !flex_backend_available(FLEX_BACKEND_CPU)) {
    if (!automatic) return fail(FLEX_ERR_UNSUPPORTED, "the cpu backend");
    printf("no CPU backend in this build (%s): using the emulator\n", flex_last_error());
    cpu = false;
  }
  flex_backend dev_backend = gpu ? FLEX_BACKEND_CUDA : cpu ? FLEX_BACKEND_CPU : FLEX_BACKEND_EMU;
  char dev_name[128] = "";
  if (gpu) flex_device_name(FLEX_BACKEND_CUDA, dev_name, sizeof dev_name);

  flex_kernel *k;
  flex_status st = flex_kernel_load(&k, path, kname);
  if (st) return fail(st, "flex_kernel_load");
  flex_kernel_info info;
  flex_kernel_get_info(k, &info);
  const Shape S = gpu || cpu ? full_shape : emu_shape;
  const char *seed = getenv("FLEXC_SEED"); /* rerun a printed seed */
  rng = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
  printf("backend %s%s%s, %s (kernel %s), %s, B=%d H=%d HKV=%d Q_LEN=%d KV_LEN=%d E=%d EV=%d, seed %llu\n",
         gpu ? "cuda" : cpu ? "cpu" : "emu (generated CUDA run on the CPU)", gpu ? " on " : "", dev_name, path,
         info.name, dtype, S.B, S.H, S.HKV, S.QL, S.KL, S.E, S.EV, (unsigned long long)rng);

  const int64_t sq[] = {S.B, S.H, S.QL, S.E}, sk[] = {S.B, S.HKV, S.KL, S.E},
                sv[] = {S.B, S.HKV, S.KL, S.EV}, so[] = {S.B, S.H, S.QL, S.EV},
                sl[] = {S.B, S.H, S.QL};
  /* Outputs: the input dtype on the GPU; float32 on the host backends. */
  DLDataType odt = gpu ? dt : F32;
  enum { Q, K, V, DOUT, OUT, LSE, DQ, DK, DV, NT };
  Pair t[NT];
  memset(t, 0, sizeof t);
  st = make(&t[Q], dev_backend, 4, sq, dt, 1.0);
  if (!st) st = make(&t[K], dev_backend, 4, sk, dt, 1.0);
  if (!st) st = make(&t[V], dev_backend, 4, sv, dt, 1.0);
  if (!st) st = make(&t[DOUT], dev_backend, 4, so, dt, 1.0);
  if (!st) st = make(&t[OUT], dev_backend, 4, so, odt, 0);
  if (!st) st = make(&t[LSE], dev_backend, 3, sl, F32, 0);
  if (!st) st = make(&t[DQ], dev_backend, 4, sq, odt, 0);
  if (!st) st = make(&t[DK], dev_backend, 4, sk, odt, 0);
  if (!st) st = make(&t[DV], dev_backend, 4, sv, odt, 0);
  if (st) return fail(st, "allocation");

  /* Float buffers get small random values; anything else needs real data. */
  int nb = 0;
  Pair bufs[8];
  flex_buffer fb[2][8];
  memset(bufs, 0, sizeof bufs);
  for (int i = 0; i < info.nbuffers && !st; i++) {
    const flex_buffer_info *b = &info.buffers[i];
    if (!b->used) continue;
    int64_t shape[FLEX_MAX_DIMS];
    bool is_float = b->dtype.code == kDLFloat || b->dtype.code == kDLBfloat;
    if (nb == 8 || !is_float || !buffer_shape(b, &S, shape)) {
      fprintf(stderr, "embed: buffer '%s' needs real data (%s); pass it from your program\n",
              b->name, !is_float ? "not a float buffer" : "a free size");
      return 1;
    }
    st = make(&bufs[nb], dev_backend, b->ndim, shape, b->dtype, 0.1);
    fb[0][nb] = (flex_buffer){b->name, bufs[nb].dev.dev, NULL};
    fb[1][nb] = (flex_buffer){b->name, bufs[nb].dev.host, NULL}; /* buffers keep their dtype */
    nb++;
  }
  if (st) return fail(st, "buffer allocation");

  for (int side = 0; side < 2; side++) { /* 0: the device backend, 1: the reference */
    flex_args a;
    memset(&a, 0, sizeof a);
    const DLTensor *x[NT];
    for (int i = 0; i < NT; i++) x[i] = side ? t[i].ref : t[i].dev.dev;
    a.backend = side ? FLEX_BACKEND_REFERENCE : dev_backend;
    a.q = x[Q], a.k = x[K], a.v = x[V], a.out = x[OUT], a.lse = x[LSE];
    a.dout = x[DOUT], a.dq = x[DQ], a.dk = x[DK], a.dv = x[DV];
    a.buffers = fb[side], a.nbuffers = nb;
    double t0 = now();
    if ((st = flex_forward(k, &a))) return fail(st, side ? "reference forward" : "forward");
    if ((st = flex_backward(k, &a))) return fail(st, side ? "reference backward" : "backward");
    if ((st = flex_sync(a.backend, NULL))) return fail(st, "sync");
    printf("%-9s forward + backward: %.2f s (compile included)\n",
           side ? "reference" : flex_backend_name(a.backend), now() - t0);
  }
  const char *names[] = {"out", "lse", "dq", "dk", "dv"};
  const int res[] = {OUT, LSE, DQ, DK, DV};
  int bad = 0;
  for (int i = 0; i < 5; i++) {
    double lim = i < 2 ? tol[di] : gtol[di], e = rel_error(&t[res[i]]);
    printf("%-4s relative error %.3e (tolerance %.0e)%s\n", names[i], e, lim, e <= lim ? "" : "  FAIL");
    bad += !(e <= lim);
  }
  printf("%s\n", bad ? "FAILED" : "ok: matches the float64 reference");
  for (int i = 0; i < NT; i++) drop(&t[i]);
  for (int i = 0; i < nb; i++) drop(&bufs[i]);
  flex_kernel_free(k);
  return bad ? 1 : 0;
}
