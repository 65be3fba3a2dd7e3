/* bench_attention: forward and backward TFLOP/s of the CUDA backend, and the
 * cold compile time a user waits for before the first launch.
 *
 *   bench_attention [--quick] [--dtype bf16|fp16|fp32] [--L N] [--E N]
 *
 * Shapes B=4, H=16, L=S in {4096, 8192}, E in {64, 128} (--quick: 8192/128
 * only; --L, --E: one of each), inputs in --dtype (default bf16), variants
 * `noop` (no mask) and `causal` (samples/causal.score with the BlockMask
 * that interval analysis builds, as FlexAttention's create_block_mask
 * does). FLOPs follow FlashAttention: forward 4*B*H*L*S*E, halved for
 * causal; backward 2.5x. Tensors are allocated once per shape and reused by
 * every call.
 *
 * Two times per call, medians of TIMED calls after WARMUP:
 *   kernel  CUDA events recorded on the stream before and after the call:
 *           the device's span of everything the call enqueued (kernels,
 *           fills; the backward's preprocess, main and convert kernels)
 *   call    host wall clock from the call to its completion (synchronised):
 *           kernel plus validation, cache lookup, launch and the runtime's
 *           own per-call workspace allocation (the backward's dQ
 *           accumulator), which the runtime does not yet pool
 * TFLOP/s come from the kernel time. "compile" is the first call minus the
 * median call: NVRTC with the disk cache off (FLEXC_CACHE_DIR=off); a row
 * whose kernels an earlier row already compiled shows about 0. Tile shapes
 * follow FLEXC_TILES when set (bench/run_gpu.sh sweeps them). Prints a
 * markdown table; exits 77 when there is no CUDA device. Run from the
 * repository root.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/blockmask.h"
#include "cuda/driver.h"
#include "runtime/npy.h"
#include "runtime/rt.h"

enum { WARMUP = 3, TIMED = 10 };

/* One device tensor and its DLTensor view. */
typedef struct DevT {
  RtCuDevicePtr p;
  int64_t shape[4];
  DLTensor t;
} DevT;

/* The device tensors of one shape. */
typedef struct Problem {
  int B, H, L, E;
  DevT q, k, v, out, lse, dout, dq, dk, dv;
} Problem;

/* A block mask's eight int32 arrays on the device. */
typedef struct DevMask {
  DevT t[8];
  flex_block_mask m;
} DevMask;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void die(const char *what) {
  fprintf(stderr, "bench_attention: %s: %s\n", what, flex_last_error());
  exit(1);
}

/* Allocate a device tensor; with `host` non-NULL copy it in. */
static void dev_init(DevT *d, DLDataType dt, int nd, const int64_t *shape, const void *host) {
  memset(d, 0, sizeof *d);
  size_t n = 1;
  for (int i = 0; i < nd; i++) d->shape[i] = shape[i], n *= (size_t)shape[i];
  size_t bytes = n * (size_t)rt_dtype_size(dt);
  if (rt_drv_alloc(&d->p, bytes ? bytes : 4)) die("cuMemAlloc");
  if (host && bytes && rt_drv_memcpy_htod(d->p, host, bytes, NULL)) die("copy to device");
  d->t.data = (void *)(uintptr_t)d->p;
  d->t.device.device_type = kDLCUDA;
  d->t.ndim = nd;
  d->t.dtype = dt;
  d->t.shape = d->shape;
}

/* Random values in [-1, 1) (xorshift: fast enough for 64M elements). */
static void dev_random(DevT *d, DLDataType dt, const int64_t *shape, uint64_t *x) {
  RtArray a;
  rt_array_init(&a, dt, 4, shape);
  for (int64_t i = 0; i < rt_array_count(&a); i++) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    rt_array_set(&a, i, (double)(*x >> 11) * 0x1p-52 - 1.0);
  }
  dev_init(d, dt, 4, shape, a.data);
  rt_array_free(&a);
}

static void problem_init(Problem *p, int B, int H, int L, int E, DLDataType dt, uint64_t *x) {
  p->B = B, p->H = H, p->L = L, p->E = E;
  const int64_t s4[4] = {B, H, L, E}, s3[3] = {B, H, L};
  dev_random(&p->q, dt, s4, x), dev_random(&p->k, dt, s4, x), dev_random(&p->v, dt, s4, x);
  dev_random(&p->dout, dt, s4, x);
  /* The cuda backend writes out, dq, dk, dv in the input dtype, lse in fp32. */
  dev_init(&p->out, dt, 4, s4, NULL), dev_init(&p->dq, dt, 4, s4, NULL);
  dev_init(&p->dk, dt, 4, s4, NULL), dev_init(&p->dv, dt, 4, s4, NULL);
  dev_init(&p->lse, rt_dtype(kDLFloat, 32), 3, s3, NULL);
}

static void problem_free(Problem *p) {
  DevT *all[] = {&p->q, &p->k, &p->v, &p->out, &p->lse, &p->dout, &p->dq, &p->dk, &p->dv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) rt_drv_free(all[i]->p);
}

/* The kernel's BlockMask for L x L, built on the host by interval analysis
 * and copied to the device. */
static void mask_init(DevMask *dm, const flex_kernel *k, int L) {
  int32_t sizes[16] = {1, 1, 1, L, L};
  IrIntervalEnv env = {NULL, sizes, NULL};
  RtMaskShape shape = {1, 1, L, L, 128, 128};
  RtBlockMask bm;
  char err[256];
  if (rt_block_mask_build(&bm, k->mod, &env, &shape, RT_MASK_ANALYSIS, NULL)) {
    fprintf(stderr, "bench_attention: block mask: %s\n", err);
    exit(1);
  }
  const int32_t *arr[8] = {bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                           bm.full_kv_indices, bm.q_num_blocks, bm.q_indices,
                           bm.full_q_num_blocks, bm.full_q_indices};
  const DLTensor **slot[8] = {&dm->m.kv_num_blocks, &dm->m.kv_indices, &dm->m.full_kv_num_blocks,
                              &dm->m.full_kv_indices, &dm->m.q_num_blocks, &dm->m.q_indices,
                              &dm->m.full_q_num_blocks, &dm->m.full_q_indices};
  memset(&dm->m, 0, sizeof dm->m);
  dm->m.block_q = bm.block_q, dm->m.block_kv = bm.block_kv;
  for (int i = 0; i < 8; i++) {
    memset(&dm->t[i], 0, sizeof dm->t[i]);
    if (!arr[i]) continue;
    bool kv = i < 4, num = i % 2 == 0;
    int64_t sh[4] = {bm.B, bm.H, kv ? bm.nq : bm.nkv, kv ? bm.nkv : bm.nq};
    dev_init(&dm->t[i], rt_dtype(kDLInt, 32), num ? 3 : 4, sh, arr[i]);
    *slot[i] = &dm->t[i].t;
  }
  rt_block_mask_free(&bm);
}

static void mask_free(DevMask *dm) {
  for (int i = 0; i < 8; i++) rt_drv_free(dm->t[i].p);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Call times of forward (bwd false) or backward: the first call's wall
 * milliseconds, and the median kernel (event) and call (wall) times.
 * Returns false after printing the failure. */
static bool time_calls(flex_kernel *k, const flex_args *a, bool bwd, double *first, double *kern,
                       double *call) {
  double t[WARMUP + TIMED], e[WARMUP + TIMED];
  RtCuEvent e0, e1;
  if (rt_drv_event_create(&e0) || rt_drv_event_create(&e1)) die("cuEventCreate");
  for (int i = 0; i < WARMUP + TIMED; i++) {
    double t0 = now_ms();
    flex_status st = rt_drv_event_record(e0, NULL);
    if (!st) st = bwd ? flex_backward(k, a) : flex_forward(k, a);
    if (!st) st = rt_drv_event_record(e1, NULL);
    float ms = 0;
    if (!st) st = rt_drv_event_elapsed(&ms, e0, e1);
    if (!st) st = rt_drv_sync(NULL);
    if (st) {
      fprintf(stderr, "bench_attention: %s: %s\n", bwd ? "backward" : "forward", flex_last_error());
      return false;
    }
    t[i] = now_ms() - t0;
    e[i] = ms;
  }
  rt_drv_event_destroy(e0);
  rt_drv_event_destroy(e1);
  *first = t[0];
  qsort(t + WARMUP, TIMED, sizeof(double), cmp_double);
  qsort(e + WARMUP, TIMED, sizeof(double), cmp_double);
  *call = t[WARMUP + TIMED / 2];
  *kern = e[WARMUP + TIMED / 2];
  return true;
}

/* One table row: a kernel on one problem. */
static int bench_row(const char *variant, flex_kernel *k, const DevMask *dm, Problem *p,
                     bool causal) {
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = FLEX_BACKEND_CUDA;
  a.q = &p->q.t, a.k = &p->k.t, a.v = &p->v.t, a.out = &p->out.t, a.lse = &p->lse.t;
  a.dout = &p->dout.t, a.dq = &p->dq.t, a.dk = &p->dk.t, a.dv = &p->dv.t;
  a.block_mask = dm ? &dm->m : NULL;
  double ff, fk, fc, bf, bk, bc;
  double flops = 4.0 * p->B * p->H * (double)p->L * p->L * p->E * (causal ? 0.5 : 1.0);
  printf("| %s | %d | %d | %d | %d | flexc ", variant, p->B, p->H, p->L, p->E);
  if (!time_calls(k, &a, false, &ff, &fk, &fc)) {
    printf("| failed | failed | | | | | | |\n");
    return 1;
  }
  if (!time_calls(k, &a, true, &bf, &bk, &bc)) {
    printf("| %.0f | failed | %.3f | %.3f | | | %.0f | |\n", flops / fk / 1e9, fk, fc, ff - fc);
    return 1;
  }
  printf("| %.0f | %.0f | %.3f | %.3f | %.3f | %.3f | %.0f | %.0f |\n", flops / fk / 1e9,
         2.5 * flops / bk / 1e9, fk, fc, bk, bc, ff - fc, bf - bc);
  fflush(stdout);
  return 0;
}

static const char noop_src[] = "score identity(s, b, h, q, kv) { return s; }\n";

int main(int argc, char **argv) {
  bool quick = false;
  int only_L = 0, only_E = 0;
  DLDataType dt = rt_dtype(kDLBfloat, 16);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--L") && i + 1 < argc) only_L = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--E") && i + 1 < argc) only_E = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
      const char *d = argv[++i];
      dt = !strcmp(d, "fp32") ? rt_dtype(kDLFloat, 32)
         : !strcmp(d, "fp16") ? rt_dtype(kDLFloat, 16) : rt_dtype(kDLBfloat, 16);
    } else {
      fprintf(stderr, "usage: bench_attention [--quick] [--dtype bf16|fp16|fp32] [--L N] [--E N]\n");
      return 2;
    }
  }
  if (rt_drv_init() != FLEX_OK) {
    printf("bench_attention: skipped: %s\n", flex_last_error());
    return 77;
  }
  if (rt_drv_use_device(0)) die("device 0");
  setenv("FLEXC_CACHE_DIR", "off", 1); /* the first call pays the whole compile */
  char name[256];
  if (rt_drv_device_name(0, name, sizeof name)) die("device name");
  flex_kernel *noop, *causal;
  if (flex_kernel_from_source(&noop, "noop.score", noop_src, strlen(noop_src), NULL))
    die("noop kernel");
  if (flex_kernel_load(&causal, "samples/causal.score", NULL)) die("samples/causal.score");
  const char *tiles = getenv("FLEXC_TILES");
  printf("# %s, flexc cuda backend, %s inputs, tiles %s\n", name, rt_dtype_name(dt),
         tiles && *tiles ? tiles : "from the table");
  printf("| variant | B | H | L | E | impl | fwd TF/s | bwd TF/s | fwd kernel ms | fwd call ms "
         "| bwd kernel ms | bwd call ms | fwd compile ms | bwd compile ms |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  uint64_t x = (uint64_t)time(NULL) | 1;
  int fails = 0;
  for (int li = quick ? 1 : 0; li < 2; li++)
    for (int ei = quick ? 1 : 0; ei < 2; ei++) {
      Problem p;
      int L = li ? 8192 : 4096, E = ei ? 128 : 64;
      if ((only_L && L != only_L) || (only_E && E != only_E)) continue;
      problem_init(&p, 4, 16, L, E, dt, &x);
      DevMask dm;
      mask_init(&dm, causal, L);
      fails += bench_row("noop", noop, NULL, &p, false);
      fails += bench_row("causal", causal, &dm, &p, true);
      mask_free(&dm);
      problem_free(&p);
    }
  flex_kernel_free(noop);
  flex_kernel_free(causal);
  return fails ? 1 : 0;
}
