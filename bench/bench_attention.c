/* bench_attention: forward and backward TFLOP/s of the CUDA backend, and the
 * cold compile time a user waits for before the first launch.
 *
 *   bench_attention [--quick] [--dtype bf16|fp16|fp32] [--L N] [--E N]
 *                   [--variants LIST] [--cached]
 *
 * Shapes B=4, H=16, L=S in {4096, 8192}, E in {64, 128} (--quick: 8192/128
 * only; --L, --E: one of each), inputs in --dtype (default bf16), variants
 * (--variants, comma-separated; default noop,causal):
 *   noop      no score, no mask
 *   causal    samples/causal.score with the BlockMask that interval
 *             analysis builds, as FlexAttention's create_block_mask does
 *   softcap   samples/softcap.score (softcap 30: 30 tanh(s / 30)), no mask
 *   document  samples/document.score (documents packed in one sequence,
 *             causal within each) over 16 documents whose boundaries are
 *             the fixed fractions doc_cuts[] of L (bench/torch_attention.py
 *             cuts the same), its BlockMask built once by
 *             flex_block_mask_create, outside the timed calls, as PyTorch's
 *             create_block_mask is
 * FLOPs follow FlashAttention: forward 4*B*H*L*S*E times the fraction of
 * (q, kv) pairs the mask keeps (causal 1/2, document its exact density);
 * backward 2.5x. Tensors are allocated once per shape and reused by every
 * call.
 *
 * Two times per call, medians of TIMED calls after WARMUP:
 *   kernel  CUDA events recorded on the stream before and after the call:
 *           the device's span of everything the call enqueued (kernels,
 *           fills; the backward's preprocess, main and convert kernels)
 *   call    host wall clock from the call to its completion (synchronised):
 *           kernel plus validation, cache lookup, launch and the runtime's
 *           own per-call workspace (the backward's dQ accumulator, in the
 *           driver's stream-ordered pool; a caller's BlockMask read back
 *           and uploaded in normal form)
 * TFLOP/s come from the kernel time. "compile" is the first call minus the
 * median call: NVRTC with the disk cache off (FLEXC_CACHE_DIR=off); a row
 * whose kernels an earlier row already compiled shows about 0; --cached
 * keeps the kernel cache ($FLEXC_CACHE_DIR, the GPU bundle's filled one),
 * so that column is a cache hit and a module load. Tile shapes follow
 * FLEXC_TILES when set (bench/run_gpu.sh sweeps them). Prints a markdown
 * table; exits 77 when there is no CUDA device. Run from the repository
 * root (or a GPU bundle's).
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
  RtMaskShape shape = {1, 1, L, L, 128, 128, 0, 0};
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

/* The document variant: 16 documents, cut at these fractions of L
 * (bench/torch_attention.py uses the same list). */
static const double doc_cuts[15] = {0.03, 0.11, 0.16, 0.27, 0.31, 0.38, 0.45, 0.52,
                                    0.58, 0.66, 0.71, 0.79, 0.83, 0.91, 0.96};

/* Each token's document id for length L, into ids[0..L). */
static void doc_ids(int32_t *ids, int L) {
  int d = 0;
  for (int i = 0; i < L; i++) {
    while (d < 15 && i >= (int)(doc_cuts[d] * L)) d++;
    ids[i] = d;
  }
}

/* The fraction of (q, kv) pairs the document mask keeps: causal within each
 * document. */
static double doc_density(const int32_t *ids, int L) {
  double kept = 0;
  for (int i = 0, start = 0; i < L; i++) {
    if (i && ids[i] != ids[i - 1]) start = i;
    kept += i - start + 1;
  }
  return kept / ((double)L * L);
}

/* The host BlockMask `m` (flex_block_mask_create's) copied to the device. */
static void mask_upload(DevMask *dm, const flex_block_mask *m) {
  const DLTensor *src[8] = {m->kv_num_blocks, m->kv_indices, m->full_kv_num_blocks,
                            m->full_kv_indices, m->q_num_blocks, m->q_indices,
                            m->full_q_num_blocks, m->full_q_indices};
  const DLTensor **slot[8] = {&dm->m.kv_num_blocks, &dm->m.kv_indices, &dm->m.full_kv_num_blocks,
                              &dm->m.full_kv_indices, &dm->m.q_num_blocks, &dm->m.q_indices,
                              &dm->m.full_q_num_blocks, &dm->m.full_q_indices};
  memset(&dm->m, 0, sizeof dm->m);
  dm->m.block_q = m->block_q, dm->m.block_kv = m->block_kv;
  for (int i = 0; i < 8; i++) {
    memset(&dm->t[i], 0, sizeof dm->t[i]);
    if (!src[i]) continue;
    dev_init(&dm->t[i], src[i]->dtype, src[i]->ndim, src[i]->shape, src[i]->data);
    *slot[i] = &dm->t[i].t;
  }
}

/* One table row: a kernel on one problem; density: the fraction of (q, kv)
 * pairs its mask keeps. */
static int bench_row(const char *variant, flex_kernel *k, const DevMask *dm, Problem *p,
                     double density, const flex_param *params, int nparams,
                     const flex_buffer *buffers, int nbuffers) {
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = FLEX_BACKEND_CUDA;
  a.q = &p->q.t, a.k = &p->k.t, a.v = &p->v.t, a.out = &p->out.t, a.lse = &p->lse.t;
  a.dout = &p->dout.t, a.dq = &p->dq.t, a.dk = &p->dk.t, a.dv = &p->dv.t;
  a.block_mask = dm ? &dm->m : NULL;
  a.params = params, a.nparams = nparams;
  a.buffers = buffers, a.nbuffers = nbuffers;
  double ff, fk, fc, bf, bk, bc;
  double flops = 4.0 * p->B * p->H * (double)p->L * p->L * p->E * density;
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

/* Whether `name` is in the comma-separated list. */
static bool listed(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && !strncmp(p, name, n)) return true;
    p += len + (e ? 1 : 0);
  }
  return false;
}

static flex_kernel *load_sample(const char *path) {
  flex_kernel *k;
  if (flex_kernel_load(&k, path, NULL)) die(path);
  return k;
}

int main(int argc, char **argv) {
  bool quick = false, cached = false;
  int only_L = 0, only_E = 0;
  const char *variants = "noop,causal";
  DLDataType dt = rt_dtype(kDLBfloat, 16);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--cached")) cached = true;
    else if (!strcmp(argv[i], "--L") && i + 1 < argc) only_L = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--E") && i + 1 < argc) only_E = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--variants") && i + 1 < argc) variants = argv[++i];
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
      const char *d = argv[++i];
      dt = !strcmp(d, "fp32") ? rt_dtype(kDLFloat, 32)
         : !strcmp(d, "fp16") ? rt_dtype(kDLFloat, 16) : rt_dtype(kDLBfloat, 16);
    } else {
      fprintf(stderr, "usage: bench_attention [--quick] [--dtype bf16|fp16|fp32] [--L N] [--E N]\n"
                      "                       [--variants noop,causal,softcap,document] [--cached]\n");
      return 2;
    }
  }
  static const char *const known = "noop,causal,softcap,document";
  for (const char *v = variants;;) { /* every name must be a known one */
    char one[32];
    size_t len = strcspn(v, ",");
    snprintf(one, sizeof one, "%.*s", (int)(len < 31 ? len : 31), v);
    if (!len || len > 31 || !listed(known, one)) {
      fprintf(stderr, "bench_attention: --variants takes %s, not '%s'\n", known, variants);
      return 2;
    }
    if (!v[len]) break;
    v += len + 1;
  }
  if (rt_drv_init() != FLEX_OK) {
    printf("bench_attention: skipped: %s\n", flex_last_error());
    return 77;
  }
  if (rt_drv_use_device(0)) die("device 0");
  if (!cached) setenv("FLEXC_CACHE_DIR", "off", 1); /* the first call pays the whole compile */
  char name[256];
  if (rt_drv_device_name(0, name, sizeof name)) die("device name");
  flex_kernel *noop, *causal = load_sample("samples/causal.score");
  flex_kernel *softcap = load_sample("samples/softcap.score");
  flex_kernel *document = load_sample("samples/document.score");
  if (flex_kernel_from_source(&noop, "noop.score", noop_src, strlen(noop_src), NULL))
    die("noop kernel");
  const char *tiles = getenv("FLEXC_TILES");
  printf("# %s, flexc cuda backend, %s inputs, tiles %s, kernel cache %s\n", name,
         rt_dtype_name(dt), tiles && *tiles ? tiles : "from the table", cached ? "on" : "off");
  printf("| variant | B | H | L | E | impl | fwd TF/s | bwd TF/s | fwd kernel ms | fwd call ms "
         "| bwd kernel ms | bwd call ms | fwd compile ms | bwd compile ms |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  fflush(stdout);
  uint64_t x = (uint64_t)time(NULL) | 1;
  int fails = 0;
  const flex_param cap = {"softcap", 30.0};
  for (int li = quick ? 1 : 0; li < 2; li++)
    for (int ei = quick ? 1 : 0; ei < 2; ei++) {
      Problem p;
      int L = li ? 8192 : 4096, E = ei ? 128 : 64;
      if ((only_L && L != only_L) || (only_E && E != only_E)) continue;
      problem_init(&p, 4, 16, L, E, dt, &x);
      if (listed(variants, "noop")) fails += bench_row("noop", noop, NULL, &p, 1.0, NULL, 0, NULL, 0);
      if (listed(variants, "causal")) {
        DevMask dm;
        mask_init(&dm, causal, L);
        fails += bench_row("causal", causal, &dm, &p, 0.5, NULL, 0, NULL, 0);
        mask_free(&dm);
      }
      if (listed(variants, "softcap"))
        fails += bench_row("softcap", softcap, NULL, &p, 1.0, &cap, 1, NULL, 0);
      if (listed(variants, "document")) {
        /* doc: i32[T] on the device for the kernels, on the host for the BlockMask */
        RtArray ids;
        const int64_t n[1] = {L};
        rt_array_init(&ids, rt_dtype(kDLInt, 32), 1, n);
        doc_ids(ids.data, L);
        DLTensor host = rt_array_tensor(&ids);
        DevT dev;
        dev_init(&dev, ids.dtype, 1, n, ids.data);
        flex_buffer hb = {"doc", &host, NULL}, db = {"doc", &dev.t, NULL};
        flex_args ha;
        memset(&ha, 0, sizeof ha);
        ha.backend = FLEX_BACKEND_REFERENCE, ha.buffers = &hb, ha.nbuffers = 1;
        flex_block_mask *bm;
        if (flex_block_mask_create(&bm, document, &ha, 1, 1, L, L, 128, 128, NULL))
          die("document block mask");
        DevMask dm;
        mask_upload(&dm, bm);
        flex_block_mask_free(bm);
        fails += bench_row("document", document, &dm, &p, doc_density(ids.data, L), NULL, 0, &db, 1);
        mask_free(&dm);
        rt_drv_free(dev.p);
        rt_array_free(&ids);
      }
      problem_free(&p);
    }
  flex_kernel_free(noop);
  flex_kernel_free(causal);
  flex_kernel_free(softcap);
  flex_kernel_free(document);
  return fails ? 1 : 0;
}
