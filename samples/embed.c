/* embed: a small program that embeds the flexc runtime.
 *
 * Loads a .score file, makes random fp32 inputs, runs attention forward and
 * backward on the GPU (the CUDA backend) and on the float64 reference, and
 * prints the relative error of every output. Exits 0 when all are within
 * the fp32 tolerances, 1 when not, and 77 when there is no CUDA device.
 *
 *   embed [FILE.score [KERNEL]]      (default: samples/softcap.score)
 *
 * A real program passes its own device tensors (from PyTorch, JAX, CuPy)
 * as DLTensors; this one allocates them through the runtime's driver
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

enum { B = 2, H = 4, HKV = 2, QL = 160, KL = 224, E = 64, EV = 64 };

/* A tensor in two places: host values (float64 for the reference, the
 * device dtype for the device copy) and the device memory. */
typedef struct Pair {
  RtArray ref;          /* float64 values, what the reference reads and writes */
  RtArray half;         /* the device image, host side */
  RtCuDevicePtr dev;    /* device copy */
  DLTensor host_t, dev_t;
} Pair;

static uint64_t rng;
static double normal(void) {
  double u = 0, v = 0;
  while (u <= 1e-300) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    u = (double)(rng >> 11) / 9007199254740992.0;
  }
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  v = (double)(rng >> 11) / 9007199254740992.0;
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static int die(flex_status st, const char *what) {
  fprintf(stderr, "embed: %s failed (status %d): %s\n", what, (int)st, flex_last_error());
  exit(1);
}

/* Make a pair of the given shape; `random` fills it (rounded to the device
 * dtype, so both backends see identical inputs), else it is poisoned. */
static void make(Pair *p, int n, const int64_t *shape, DLDataType dev_dtype, bool random) {
  rt_array_init(&p->ref, rt_dtype(kDLFloat, 64), n, shape);
  rt_array_init(&p->half, dev_dtype, n, shape);
  int64_t cnt = rt_array_count(&p->ref);
  for (int64_t i = 0; i < cnt; i++) {
    rt_array_set(&p->half, i, random ? normal() : NAN);
    rt_array_set(&p->ref, i, random ? rt_array_get(&p->half, i) : NAN);
  }
  size_t bytes = (size_t)cnt * (size_t)rt_dtype_size(dev_dtype);
  flex_status st = rt_drv_alloc(&p->dev, bytes);
  if (!st) st = rt_drv_memcpy_htod(p->dev, p->half.data, bytes, NULL);
  if (st) die(st, "device upload");
  p->host_t = rt_array_tensor(&p->ref);
  p->dev_t = rt_array_tensor(&p->half);
  p->dev_t.data = (void *)(uintptr_t)p->dev;
  p->dev_t.device.device_type = kDLCUDA;
  p->dev_t.device.device_id = 0;
}

/* Relative norm error |x - ref| / |ref| of the device result. */
static double rel_error(Pair *p) {
  int64_t cnt = rt_array_count(&p->ref);
  size_t bytes = (size_t)cnt * (size_t)rt_dtype_size(p->half.dtype);
  flex_status st = rt_drv_memcpy_dtoh(p->half.data, p->dev, bytes, NULL);
  if (!st) st = rt_drv_sync(NULL);
  if (st) die(st, "device download");
  double num = 0, den = 0;
  for (int64_t i = 0; i < cnt; i++) {
    double r = rt_array_get(&p->ref, i), x = rt_array_get(&p->half, i);
    if (isinf(r) && r == x) continue; /* LSE of a fully masked row */
    num += (x - r) * (x - r);
    den += r * r;
  }
  double e = sqrt(num) / (den > 0 ? sqrt(den) : 1);
  return isnan(e) ? INFINITY : e; /* NaN never passes */
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "samples/softcap.score";
  const char *kname = argc > 2 ? argv[2] : NULL;
  flex_status st = rt_drv_init();
  if (st == FLEX_ERR_NO_DEVICE) {
    printf("skipped: %s\n", flex_last_error());
    return 77;
  }
  if (st || (st = rt_drv_use_device(0))) die(st, "CUDA init");
  flex_kernel *k;
  if ((st = flex_kernel_load(&k, path, kname))) die(st, "flex_kernel_load");
  rng = (uint64_t)time(NULL);
  printf("seed %llu, %s, B=%d H=%d HKV=%d Q_LEN=%d KV_LEN=%d E=%d, fp32\n",
         (unsigned long long)rng, path, B, H, HKV, QL, KL, E);
  DLDataType f32 = rt_dtype(kDLFloat, 32);
  const int64_t sq[] = {B, H, QL, E}, sk[] = {B, HKV, KL, E}, sv[] = {B, HKV, KL, EV},
                so[] = {B, H, QL, EV}, sl[] = {B, H, QL};
  Pair q, kk, v, out, lse, dout, dq, dk, dv;
  make(&q, 4, sq, f32, true), make(&kk, 4, sk, f32, true), make(&v, 4, sv, f32, true);
  make(&dout, 4, so, f32, true);
  make(&out, 4, so, f32, false), make(&lse, 3, sl, f32, false);
  make(&dq, 4, sq, f32, false), make(&dk, 4, sk, f32, false), make(&dv, 4, sv, f32, false);

  flex_args a;
  memset(&a, 0, sizeof a);
  Pair *all[] = {&q, &kk, &v, &out, &lse, &dout, &dq, &dk, &dv};
  for (int side = 0; side < 2; side++) { /* 0: CUDA, 1: reference */
    const DLTensor *t[9];
    for (int i = 0; i < 9; i++) t[i] = side ? &all[i]->host_t : &all[i]->dev_t;
    a.backend = side ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_CUDA;
    a.q = t[0], a.k = t[1], a.v = t[2], a.out = t[3], a.lse = t[4];
    a.dout = t[5], a.dq = t[6], a.dk = t[7], a.dv = t[8];
    if ((st = flex_forward(k, &a))) die(st, side ? "reference forward" : "cuda forward");
    if ((st = flex_backward(k, &a))) die(st, side ? "reference backward" : "cuda backward");
  }
  const char *names[] = {"out", "lse", "dq", "dk", "dv"};
  Pair *res[] = {&out, &lse, &dq, &dk, &dv};
  const double tol[] = {1e-4, 1e-4, 1e-3, 1e-3, 1e-3};
  int bad = 0;
  for (int i = 0; i < 5; i++) {
    double e = rel_error(res[i]);
    printf("%-4s rel. error %.3e (tolerance %.0e)%s\n", names[i], e, tol[i],
           e <= tol[i] ? "" : "  FAIL");
    bad += !(e <= tol[i]);
  }
  for (int i = 0; i < 9; i++) {
    rt_drv_free(all[i]->dev);
    rt_array_free(&all[i]->ref);
    rt_array_free(&all[i]->half);
  }
  flex_kernel_free(k);
  return bad ? 1 : 0;
}
