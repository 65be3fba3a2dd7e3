/* embed: a small program that embeds the flexc runtime.
 *
 * Loads a .score file, makes random inputs, runs attention forward and
 * backward on a device backend (the GPU, or the emulator that runs the same
 * generated CUDA on the CPU) and on the float64 reference, and prints the
 * relative error of every output against the reference.
 *
 *   embed [--backend auto|cuda|emu] [--dtype fp32|fp16|bf16] [FILE.score [KERNEL]]
 *
 * --backend auto (the default) uses the GPU when there is one and the
 * emulator otherwise, and says which. Float buffers the kernel reads are
 * filled with small random values; other buffers need a real program.
 * Exit status: 0 all within tolerance, 1 not (or an error), 77 when the CUDA
 * backend was asked for and there is no device. The seed is printed;
 * FLEXC_SEED=N reruns one.
 *
 * A real program passes its own tensors (from PyTorch, JAX, CuPy) as
 * DLTensors; this one allocates device memory through the runtime's driver
 * loader so that it needs nothing but the library.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/driver.h"
#include "runtime/flex.h"
#include "runtime/npy.h"
#include "runtime/rt.h"

/* Shapes: big enough to cross several tiles, small enough for the emulator. */
typedef struct Shape {
  int B, H, HKV, QL, KL, E, EV;
} Shape;
static const Shape gpu_shape = {2, 4, 2, 160, 224, 64, 64};
static const Shape emu_shape = {1, 2, 1, 96, 130, 64, 64};

/* A tensor in two places: float64 values for the reference, and the image
 * the device backend reads or writes (device dtype; on the GPU, a copy). */
typedef struct Pair {
  RtArray ref;        /* float64 values: what the reference reads and writes */
  RtArray img;        /* host image in the device backend's dtype */
  RtCuDevicePtr dev;  /* device copy (CUDA backend only) */
  DLTensor ref_t;      /* the float64 values */
  DLTensor img_t;      /* the host image */
  DLTensor dev_t;      /* what the device backend gets (the host image on the emulator) */
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
static flex_status make(Pair *p, bool gpu, int n, const int64_t *shape, DLDataType dt,
                        double scale) {
  rt_array_init(&p->ref, rt_dtype(kDLFloat, 64), n, shape);
  rt_array_init(&p->img, dt, n, shape);
  int64_t cnt = rt_array_count(&p->ref);
  for (int64_t i = 0; i < cnt; i++) {
    rt_array_set(&p->img, i, scale > 0 ? scale * normal() : NAN);
    rt_array_set(&p->ref, i, scale > 0 ? rt_array_get(&p->img, i) : NAN);
  }
  p->ref_t = rt_array_tensor(&p->ref);
  p->img_t = p->dev_t = rt_array_tensor(&p->img);
  p->dev = 0;
  if (!gpu) return FLEX_OK;
  size_t bytes = (size_t)cnt * (size_t)rt_dtype_size(dt);
  flex_status st = rt_drv_alloc(&p->dev, bytes);
  if (!st) st = rt_drv_memcpy_htod(p->dev, p->img.data, bytes, NULL);
  p->dev_t.data = (void *)(uintptr_t)p->dev;
  p->dev_t.device.device_type = kDLCUDA;
  p->dev_t.device.device_id = 0;
  return st;
}

static void drop(Pair *p) {
  if (p->dev) rt_drv_free(p->dev);
  rt_array_free(&p->ref);
  rt_array_free(&p->img);
}

/* Relative norm error |x - ref| / |ref| of the device result; NaN never passes. */
static double rel_error(Pair *p, bool gpu) {
  int64_t cnt = rt_array_count(&p->ref);
  if (gpu) {
    size_t bytes = (size_t)cnt * (size_t)rt_dtype_size(p->img.dtype);
    if (rt_drv_memcpy_dtoh(p->img.data, p->dev, bytes, NULL) || rt_drv_sync(NULL)) return INFINITY;
  }
  double num = 0, den = 0;
  for (int64_t i = 0; i < cnt; i++) {
    double r = rt_array_get(&p->ref, i), x = rt_array_get(&p->img, i);
    if (isinf(r) && r == x) continue; /* LSE of a fully masked row */
    num += (x - r) * (x - r);
    den += r * r;
  }
  double e = den > 0 ? sqrt(num) / sqrt(den) : INFINITY; /* an all-zero reference proves nothing */
  return isnan(e) ? INFINITY : e;
}

int main(int argc, char **argv) {
  const char *backend = "auto", *dtype = "fp32", *path = "samples/gemma2.score", *kname = NULL;
  int pos = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
    else if (argv[i][0] == '-') {
      fprintf(stderr, "usage: embed [--backend auto|cuda|emu] [--dtype fp32|fp16|bf16] [FILE [KERNEL]]\n");
      return 2;
    } else if (pos++ == 0) path = argv[i];
    else kname = argv[i];
  }
  int di = !strcmp(dtype, "fp32") ? 0 : !strcmp(dtype, "fp16") ? 1 : !strcmp(dtype, "bf16") ? 2 : -1;
  if (di < 0 || (strcmp(backend, "auto") && strcmp(backend, "cuda") && strcmp(backend, "emu"))) {
    fprintf(stderr, "embed: unknown --backend '%s' or --dtype '%s'\n", backend, dtype);
    return 2;
  }
  const DLDataType dts[] = {rt_dtype(kDLFloat, 32), rt_dtype(kDLFloat, 16), rt_dtype(kDLBfloat, 16)};
  const double tol[] = {1e-4, 5e-3, 3e-2}, gtol[] = {1e-3, 2e-2, 6e-2};
  DLDataType dt = dts[di];

  bool gpu = strcmp(backend, "emu") != 0;
  if (gpu) {
    flex_status st = rt_drv_init();
    if (!st) st = rt_drv_use_device(0);
    if (st) {
      if (!strcmp(backend, "cuda")) {
        printf("skipped: %s\n", flex_last_error());
        return 77;
      }
      printf("no usable GPU (%s): using the emulator\n", flex_last_error());
      gpu = false;
    }
  }
  char gpu_name[128] = "";
  if (gpu) rt_drv_device_name(0, gpu_name, sizeof gpu_name);

  flex_kernel *k;
  flex_status st = flex_kernel_load(&k, path, kname);
  if (st) return fail(st, "flex_kernel_load");
  const Shape S = gpu ? gpu_shape : emu_shape;
  const char *seed = getenv("FLEXC_SEED"); /* rerun a printed seed */
  rng = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
  printf("backend %s%s%s, %s (kernel %s), %s, B=%d H=%d HKV=%d Q_LEN=%d KV_LEN=%d E=%d EV=%d, seed %llu\n",
         gpu ? "cuda" : "emu (generated CUDA run on the CPU)", gpu ? " on " : "", gpu_name, path,
         k->mod->kernel, dtype, S.B, S.H, S.HKV, S.QL, S.KL, S.E, S.EV, (unsigned long long)rng);

  const int64_t sq[] = {S.B, S.H, S.QL, S.E}, sk[] = {S.B, S.HKV, S.KL, S.E},
                sv[] = {S.B, S.HKV, S.KL, S.EV}, so[] = {S.B, S.H, S.QL, S.EV},
                sl[] = {S.B, S.H, S.QL};
  /* Outputs: the input dtype on the GPU; float32 on the emulator. */
  DLDataType odt = gpu ? dt : dts[0], f32 = dts[0];
  enum { Q, K, V, DOUT, OUT, LSE, DQ, DK, DV, NT };
  Pair t[NT];
  memset(t, 0, sizeof t);
  st = make(&t[Q], gpu, 4, sq, dt, 1.0);
  if (!st) st = make(&t[K], gpu, 4, sk, dt, 1.0);
  if (!st) st = make(&t[V], gpu, 4, sv, dt, 1.0);
  if (!st) st = make(&t[DOUT], gpu, 4, so, dt, 1.0);
  if (!st) st = make(&t[OUT], gpu, 4, so, odt, 0);
  if (!st) st = make(&t[LSE], gpu, 3, sl, f32, 0);
  if (!st) st = make(&t[DQ], gpu, 4, sq, odt, 0);
  if (!st) st = make(&t[DK], gpu, 4, sk, odt, 0);
  if (!st) st = make(&t[DV], gpu, 4, sv, odt, 0);
  if (st) return fail(st, "allocation");

  /* Float buffers get small random values; anything else needs real data. */
  const IrModule *m = k->mod;
  int nb = 0;
  Pair bufs[8];
  flex_buffer fb[2][8];
  memset(bufs, 0, sizeof bufs);
  for (int i = 0; i < m->nbuffers && !st; i++) {
    const IrBuffer *ib = &m->buffers[i];
    if (!ib->used) continue;
    if (nb == 8 || dtype_value_type(ib->dtype) != TY_FLOAT) {
      fprintf(stderr, "embed: buffer '%s' (%s) needs real data; pass it from your program\n",
              ib->id, dtype_name(ib->dtype));
      return 1;
    }
    int64_t shape[IR_MAXDIMS];
    const int32_t sizes[SZ_COUNT] = {S.B, S.H, S.HKV, S.QL, S.KL};
    for (int d = 0; d < ib->ndims; d++) {
      const IrDim *dim = &ib->dims[d];
      if (dim->fixed < 0 && dim->size >= SZ_COUNT) {
        fprintf(stderr, "embed: buffer '%s' has a free size; pass it from your program\n", ib->id);
        return 1;
      }
      shape[d] = dim->fixed >= 0 ? dim->fixed : sizes[dim->size];
    }
    st = make(&bufs[nb], gpu, ib->ndims, shape, f32, 0.1);
    fb[0][nb] = (flex_buffer){ib->id, &bufs[nb].dev_t, NULL};
    fb[1][nb] = (flex_buffer){ib->id, &bufs[nb].img_t, NULL}; /* buffers keep their dtype */
    nb++;
  }
  if (st) return fail(st, "buffer allocation");

  for (int side = 0; side < 2; side++) { /* 0: the device backend, 1: the reference */
    flex_args a;
    memset(&a, 0, sizeof a);
    const DLTensor *x[NT];
    for (int i = 0; i < NT; i++) x[i] = side ? &t[i].ref_t : &t[i].dev_t;
    a.backend = side ? FLEX_BACKEND_REFERENCE : gpu ? FLEX_BACKEND_CUDA : FLEX_BACKEND_EMU;
    a.q = x[Q], a.k = x[K], a.v = x[V], a.out = x[OUT], a.lse = x[LSE];
    a.dout = x[DOUT], a.dq = x[DQ], a.dk = x[DK], a.dv = x[DV];
    a.buffers = fb[side], a.nbuffers = nb;
    double t0 = now();
    if ((st = flex_forward(k, &a))) return fail(st, side ? "reference forward" : "forward");
    if ((st = flex_backward(k, &a))) return fail(st, side ? "reference backward" : "backward");
    if (!side && gpu) rt_drv_sync(NULL);
    printf("%-9s forward + backward: %.2f s (compile included)\n",
           side ? "reference" : flex_backend_name(a.backend), now() - t0);
  }
  const char *names[] = {"out", "lse", "dq", "dk", "dv"};
  const int res[] = {OUT, LSE, DQ, DK, DV};
  int bad = 0;
  for (int i = 0; i < 5; i++) {
    double lim = i < 2 ? tol[di] : gtol[di], e = rel_error(&t[res[i]], gpu);
    printf("%-4s relative error %.3e (tolerance %.0e)%s\n", names[i], e, lim, e <= lim ? "" : "  FAIL");
    bad += !(e <= lim);
  }
  printf("%s\n", bad ? "FAILED" : "ok: matches the float64 reference");
  for (int i = 0; i < NT; i++) drop(&t[i]);
  for (int i = 0; i < nb; i++) drop(&bufs[i]);
  flex_kernel_free(k);
  return bad ? 1 : 0;
}
