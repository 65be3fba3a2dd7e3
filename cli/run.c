/* flexc run: attention on .npy inputs, results as .npy files.
 *
 *   flexc run FILE [--kernel K] --q Q.npy --k K.npy --v V.npy [--dout DO.npy]
 *             [--dlse DLSE.npy] [--buffer NAME=F.npy]... [--param NAME=VALUE]...
 *             [--scale X] [--dtype fp32|fp16|bf16] [--backend reference|emu|cuda|cpu]
 *             [--arch sm_80|sm_86|sm_89|sm_90|sm_90a] [--check-bounds] [--trust-sorted] [--fast-math]
 *             [--deterministic]
 *             [--dropout P --seed S [--offset O]]
 *             [--cu-seqlens-q CQ.npy --cu-seqlens-kv CK.npy]
 *             [--page-table PT.npy --kv-lens KL.npy] [--repeat N] [--threads N]
 *             [--kv-splits N] --out DIR
 *
 * Q, K, V and dO are cast to --dtype (the reference then computes in float64
 * from the cast values); buffers are converted to their declared dtype.
 * Writes out.npy and lse.npy, and with --dout dq.npy dk.npy dv.npy and
 * d_NAME.npy per `grad` buffer. The reference writes float64, others float32.
 * With --cu-seqlens-q/--cu-seqlens-kv (int32 [B + 1] offsets) the batch is
 * packed (docs/language.md, docs/varlen.md): q is (TOTAL_Q, H, E), k (TOTAL_KV, HKV,
 * E), v (TOTAL_KV, HKV, EV), dout like out; out.npy is (TOTAL_Q, H, EV),
 * lse.npy (H, TOTAL_Q), dq/dk/dv like q/k/v.
 * With --page-table/--kv-lens (int32 [B, MAX_PAGES] and [B]) k and v are
 * page pools (NUM_PAGES, PAGE_SIZE, HKV, E|EV) (docs/language.md, docs/paged.md), q
 * is padded [B, H, Q_LEN, E] or packed with --cu-seqlens-q alone; forward
 * only.
 *
 * --kv-splits N sets flex_args.kv_splits (docs/decoding.md): 0 automatic
 * (the default), 1 never split, N key chunks.
 * --arch picks the architecture the emu backend generates kernels for
 * (default sm_80; sm_90a runs the TMA + wgmma forward); other backends
 * ignore it.
 *
 * --dropout P (in [0, 1)) drops attention weights by the Philox bits of
 * --seed S at --offset O (unsigned 64-bit integers; docs/language.md "Dropout"); the
 * backward uses the same three.
 *
 * --repeat N makes each call N times, each waited for, and prints the
 * median times (a benchmark of any backend without a program of one's
 * own); --threads N sizes the one thread pool of the cpu backend, the
 * BlockMask builder and the emulator (FLEXC_THREADS, set before the first call).
 *
 * --deterministic asks for a deterministic backward (docs/language.md
 * "Determinism"): dq, dk, dv and d_NAME bitwise the same on every run; a
 * forward-only run ignores it.
 *
 * Every tensor is mirrored on the backend (flex_mirror.h: on the cuda
 * backend a device copy, outputs in the dtype of q, lse and gradients in
 * float32), run there, copied back and widened to float32 for the files.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "runtime/flex_mirror.h"

#define MAXNAMED 64

/* The parsed command line. */
typedef struct RunOpts {
  const char *file, *kernel, *q, *k, *v, *dout, *dlse, *out;
  const char *cu_q, *cu_kv; /* packed batch offsets (NULL: padded) */
  const char *pages, *kv_lens; /* paged key/value cache (NULL: contiguous k, v) */
  const char *buf_names[MAXNAMED], *buf_files[MAXNAMED];
  int nbufs;
  flex_param params[MAXNAMED];
  int nparams;
  double scale;
  DLDataType dtype;       /* inputs are cast to this */
  flex_backend backend;
  bool check_bounds;
  bool trust_sorted; /* --trust-sorted: skip verifying `sorted` buffers */
  bool fast_math; /* --fast-math: approximate builtins on emu and cuda */
  bool deterministic; /* --deterministic: a deterministic backward */
  float dropout;  /* --dropout P: 0 none */
  int kv_splits;  /* --kv-splits N: 0 automatic */
  bool have_dropout, have_seed;
  uint64_t seed, offset; /* --seed S, --offset O */
  int repeat;            /* --repeat N: calls timed (the median is printed) */
  int threads;           /* --threads N: cpu and emu worker threads (0: every core) */
  const char *arch;      /* --arch: the emu backend's target (NULL: its default) */
} RunOpts;

/* Everything one run allocates, freed together. */
typedef struct RunState {
  flex_mirror q, k, v, dout, dlse, out, lse, dq, dk, dv; /* host values and the backend's tensors */
  flex_mirror cu_q, cu_kv;                               /* packed batch offsets */
  flex_mirror pages, kv_lens;                            /* page table and key lengths */
  flex_mirror bufs[MAXNAMED], grads[MAXNAMED];           /* by --buffer option */
  flex_buffer fbufs[MAXNAMED];                           /* what the call gets */
} RunState;

static const DLDataType F32 = {kDLFloat, 32, 1}, F64 = {kDLFloat, 64, 1};

static int parse_dtype(const char *s, DLDataType *t) {
  if (!strcmp(s, "fp32")) *t = F32;
  else if (!strcmp(s, "fp16")) *t = (DLDataType){kDLFloat, 16, 1};
  else if (!strcmp(s, "bf16")) *t = (DLDataType){kDLBfloat, 16, 1};
  else return cli_usage_error("--dtype must be fp32, fp16 or bf16, got '%s'", s);
  return 0;
}

static int parse_backend(const char *s, flex_backend *b) {
  if (flex_backend_parse(s, b)) return 0;
  return cli_usage_error("--backend must be reference, emu, cuda or cpu, got '%s'", s);
}

/* One option that takes a value; returns 0, or the exit status. */
static int parse_opt(RunOpts *o, const char *opt, char *val) {
  const char **slot = !strcmp(opt, "--kernel") ? &o->kernel : !strcmp(opt, "--q") ? &o->q
                    : !strcmp(opt, "--k") ? &o->k : !strcmp(opt, "--v") ? &o->v
                    : !strcmp(opt, "--dout") ? &o->dout : !strcmp(opt, "--dlse") ? &o->dlse
                    : !strcmp(opt, "--out") ? &o->out : !strcmp(opt, "--cu-seqlens-q") ? &o->cu_q
                    : !strcmp(opt, "--cu-seqlens-kv") ? &o->cu_kv
                    : !strcmp(opt, "--page-table") ? &o->pages : !strcmp(opt, "--kv-lens") ? &o->kv_lens
                                                                                            : NULL;
  if (slot) {
    *slot = val;
    return 0;
  }
  char *name, *value, *end;
  if (!strcmp(opt, "--buffer") || !strcmp(opt, "--param")) {
    bool buf = opt[2] == 'b';
    if ((buf ? o->nbufs : o->nparams) == MAXNAMED) return cli_usage_error("too many %s options", opt);
    if (!buf) return cli_param(val, &o->params[o->nparams++]);
    if (!cli_split_eq(val, &name, &value))
      return cli_usage_error("--buffer expects NAME=FILE.npy, got '%s'", val);
    o->buf_names[o->nbufs] = name;
    o->buf_files[o->nbufs++] = value;
    return 0;
  }
  if (!strcmp(opt, "--scale")) {
    o->scale = strtod(val, &end);
    if (end == val || *end) return cli_input_error("--scale: '%s' is not a number", val);
    /* The API reads a scale of 0 as "the default", so an explicit zero
     * would silently become 1/sqrt(E). */
    if (o->scale == 0) return cli_input_error("--scale must be nonzero (omit it for 1/sqrt(E))");
    return 0;
  }
  if (!strcmp(opt, "--dropout")) {
    double d = strtod(val, &end);
    if (end == val || *end || !(d >= 0 && d < 1) || !((float)d < 1.0f))
      return cli_input_error("--dropout must be a number in [0, 1), got '%s'", val);
    o->dropout = (float)d, o->have_dropout = true;
    return 0;
  }
  if (!strcmp(opt, "--seed") || !strcmp(opt, "--offset")) {
    errno = 0;
    unsigned long long u = strtoull(val, &end, 0);
    if (end == val || *end || errno || val[0] == '-')
      return cli_input_error("%s must be an unsigned 64-bit integer, got '%s'", opt, val);
    if (opt[2] == 's') o->seed = u, o->have_seed = true;
    else o->offset = u;
    return 0;
  }
  if (!strcmp(opt, "--repeat") || !strcmp(opt, "--threads")) {
    errno = 0;
    long n = strtol(val, &end, 10);
    bool rep = opt[2] == 'r';
    if (end == val || *end || errno || n < 1 || n > (rep ? 100000 : 1024))
      return cli_input_error("%s must be an integer in 1..%d, got '%s'", opt, rep ? 100000 : 1024, val);
    *(rep ? &o->repeat : &o->threads) = (int)n;
    return 0;
  }
  if (!strcmp(opt, "--kv-splits")) {
    errno = 0;
    long n = strtol(val, &end, 10);
    if (end == val || *end || errno || n < 0 || n > 1 << 20)
      return cli_input_error("--kv-splits must be 0 (automatic), 1 (never split) or a number of "
                             "key chunks, got '%s'", val);
    o->kv_splits = (int)n;
    return 0;
  }
  if (!strcmp(opt, "--arch")) {
    static const char *const archs[] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"};
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
      if (!strcmp(val, archs[i])) {
        o->arch = archs[i];
        return 0;
      }
    return cli_usage_error("--arch must be sm_80, sm_86, sm_89, sm_90 or sm_90a, got '%s'", val);
  }
  if (!strcmp(opt, "--dtype")) return parse_dtype(val, &o->dtype);
  if (!strcmp(opt, "--backend")) return parse_backend(val, &o->backend);
  return cli_usage_error("run: unknown option '%s'", opt);
}

static int parse_args(RunOpts *o, int argc, char **argv) {
  memset(o, 0, sizeof *o);
  o->dtype = F32;
  o->repeat = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check-bounds")) o->check_bounds = true;
    else if (!strcmp(argv[i], "--trust-sorted")) o->trust_sorted = true;
    else if (!strcmp(argv[i], "--fast-math")) o->fast_math = true;
    else if (!strcmp(argv[i], "--deterministic")) o->deterministic = true;
    else if (argv[i][0] == '-' && argv[i][1] == '-') {
      if (i + 1 >= argc) return cli_usage_error("%s needs a value", argv[i]);
      int st = parse_opt(o, argv[i], argv[i + 1]);
      if (st) return st;
      i++;
    } else if (!o->file) o->file = argv[i];
    else return cli_usage_error("run: unexpected argument '%s'", argv[i]);
  }
  if (!o->file) return cli_usage_error("run: no .score file given");
  if (!o->q || !o->k || !o->v) return cli_usage_error("run: --q, --k and --v are required");
  if (!o->out) return cli_usage_error("run: --out DIR is required");
  if (!o->pages != !o->kv_lens)
    return cli_usage_error("run: a paged key/value cache needs both --page-table and --kv-lens");
  if (o->pages && o->cu_kv)
    return cli_usage_error("run: --cu-seqlens-kv does not go with --page-table (the keys' lengths "
                           "are --kv-lens; packed queries need only --cu-seqlens-q)");
  if (o->pages && o->dout)
    return cli_usage_error("run: a paged key/value cache is forward only: --dout does not go with "
                           "--page-table");
  if (!o->pages && !o->cu_q != !o->cu_kv)
    return cli_usage_error("run: a packed batch needs both --cu-seqlens-q and --cu-seqlens-kv");
  if (o->have_dropout != o->have_seed)
    return cli_usage_error("run: --dropout and --seed go together");
  if (o->dlse && !o->dout)
    return cli_usage_error("run: --dlse is an input of the backward pass; it needs --dout");
  return 0;
}

/* ---- inputs ------------------------------------------------------------- */

/* One input file mirrored on the backend in `dtype` (host copy in the same dtype). */
static bool read_input(const RunOpts *o, flex_mirror *m, const char *path, const char *role,
                       DLDataType dtype) {
  DLTensor *t = cli_read_npy(path, role, dtype);
  if (!t) return false;
  if (flex_mirror_new(m, o->backend, t, dtype)) {
    fprintf(stderr, "flexc: error: %s: %s\n", path, flex_last_error());
    return false;
  }
  return true;
}

/* An output: host tensor in host_dtype, the backend's in dtype. */
static bool alloc_out(const RunOpts *o, flex_mirror *m, DLDataType dtype, int ndim, int64_t d0,
                      int64_t d1, int64_t d2, int64_t d3) {
  int64_t shape[4] = {d0, d1, d2, d3};
  if (flex_mirror_zeros(m, o->backend, dtype, ndim, shape, dtype)) {
    fprintf(stderr, "flexc: error: %s\n", flex_last_error());
    return false;
  }
  return true;
}

static void free_state(RunState *s) {
  flex_mirror *all[] = {&s->q,   &s->k,   &s->v,  &s->dout, &s->dlse, &s->out,
                        &s->lse, &s->dq,  &s->dk, &s->dv,   &s->cu_q, &s->cu_kv,
                        &s->pages, &s->kv_lens};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) flex_mirror_free(all[i]);
  for (int i = 0; i < MAXNAMED; i++) {
    flex_mirror_free(&s->bufs[i]);
    flex_mirror_free(&s->grads[i]);
  }
}

/* The buffers, each converted to the declared dtype of the kernel. */
static bool read_buffers(const RunOpts *o, const flex_kernel_info *info, RunState *s, bool backward) {
  DLTensor *host[MAXNAMED] = {0};
  if (cli_read_buffers(info, o->nbufs, o->buf_names, o->buf_files, host, s->fbufs)) return false;
  for (int i = 0; i < o->nbufs; i++) {
    if (flex_mirror_new(&s->bufs[i], o->backend, host[i], host[i]->dtype)) {
      fprintf(stderr, "flexc: error: %s: %s\n", o->buf_files[i], flex_last_error());
      for (int j = i + 1; j < o->nbufs; j++) flex_tensor_free(host[j]);
      return false;
    }
    s->fbufs[i].tensor = s->bufs[i].dev;
    const flex_buffer_info *b = NULL;
    for (int j = 0; j < info->nbuffers; j++)
      if (!strcmp(info->buffers[j].name, o->buf_names[i])) b = &info->buffers[j];
    if (backward && b && b->grad) {
      DLDataType g = o->backend == FLEX_BACKEND_REFERENCE ? F64 : F32;
      const DLTensor *t = s->bufs[i].host;
      if (flex_mirror_zeros(&s->grads[i], o->backend, g, t->ndim, t->shape, g)) {
        fprintf(stderr, "flexc: error: %s\n", flex_last_error());
        return false;
      }
      s->fbufs[i].grad = s->grads[i].dev;
    }
  }
  return true;
}

/* Read the inputs, allocate the outputs. */
static bool prepare(const RunOpts *o, const flex_kernel_info *info, RunState *s) {
  DLDataType odt = o->backend == FLEX_BACKEND_REFERENCE ? F64 : F32;
  /* The cuda kernels write out, dq, dk and dv in the dtype of q. */
  DLDataType xdt = o->backend == FLEX_BACKEND_CUDA ? o->dtype : odt;
  bool bwd = o->dout != NULL;
  if (!read_input(o, &s->q, o->q, "q", o->dtype) || !read_input(o, &s->k, o->k, "k", o->dtype) ||
      !read_input(o, &s->v, o->v, "v", o->dtype))
    return false;
  if (bwd && !read_input(o, &s->dout, o->dout, "dout", o->dtype)) return false;
  if (bwd && o->dlse && !read_input(o, &s->dlse, o->dlse, "dlse", odt)) return false;
  const char *names[3] = {o->q, o->k, o->v};
  const flex_mirror *ms[3] = {&s->q, &s->k, &s->v};
  const DLDataType i32 = {kDLInt, 32, 1};
  if (o->pages) { /* pools (NUM_PAGES, PAGE_SIZE, HKV, E|EV) */
    if (!read_input(o, &s->pages, o->pages, "page_table", i32) ||
        !read_input(o, &s->kv_lens, o->kv_lens, "kv_lens", i32))
      return false;
    for (int i = 1; i < 3; i++)
      if (ms[i]->host->ndim != 4) {
        fprintf(stderr, "flexc: error: %s: a paged cache expects a rank-4 pool [pages, page size, "
                        "heads, head dim], got rank %d\n", names[i], ms[i]->host->ndim);
        return false;
      }
  }
  if (o->cu_q) { /* packed: (TOTAL, heads, head dim) */
    if (!read_input(o, &s->cu_q, o->cu_q, "cu_seqlens_q", i32) ||
        (o->cu_kv && !read_input(o, &s->cu_kv, o->cu_kv, "cu_seqlens_kv", i32)))
      return false;
    for (int i = 0; i < (o->pages ? 1 : 3); i++)
      if (ms[i]->host->ndim != 3) {
        fprintf(stderr, "flexc: error: %s: a packed batch expects a rank-3 array [total length, "
                        "heads, head dim], got rank %d\n", names[i], ms[i]->host->ndim);
        return false;
      }
    const int64_t *q = s->q.host->shape, *k = s->k.host->shape, *v = s->v.host->shape;
    if (!alloc_out(o, &s->out, xdt, 3, q[0], q[1], v[s->v.host->ndim - 1], 0) ||
        !alloc_out(o, &s->lse, odt, 2, q[1], q[0], 0, 0))
      return false;
    if (bwd && (!alloc_out(o, &s->dq, xdt, 3, q[0], q[1], q[2], 0) ||
                !alloc_out(o, &s->dk, xdt, 3, k[0], k[1], k[2], 0) ||
                !alloc_out(o, &s->dv, xdt, 3, v[0], v[1], v[2], 0)))
      return false;
    return read_buffers(o, info, s, bwd);
  }
  for (int i = 0; i < (o->pages ? 1 : 3); i++)
    if (ms[i]->host->ndim != 4) {
      fprintf(stderr, "flexc: error: %s: expected a rank-4 array [B, heads, length, head dim], got rank %d\n",
              names[i], ms[i]->host->ndim);
      return false;
    }
  const int64_t *q = s->q.host->shape, *k = s->k.host->shape, *v = s->v.host->shape;
  if (!alloc_out(o, &s->out, xdt, 4, q[0], q[1], q[2], v[3]) ||
      !alloc_out(o, &s->lse, odt, 3, q[0], q[1], q[2], 0))
    return false;
  if (bwd && (!alloc_out(o, &s->dq, xdt, 4, q[0], q[1], q[2], q[3]) ||
              !alloc_out(o, &s->dk, xdt, 4, k[0], k[1], k[2], k[3]) ||
              !alloc_out(o, &s->dv, xdt, 4, v[0], v[1], v[2], v[3])))
    return false;
  return read_buffers(o, info, s, bwd);
}

/* ---- outputs ------------------------------------------------------------ */

/* Copy a result back and write it (float32 when held in a 16-bit float dtype). */
static bool write_result(const char *dir, const char *name, flex_mirror *m) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.npy", dir, name);
  flex_status st = flex_mirror_pull(m, NULL);
  DLTensor *w = NULL;
  const DLTensor *t = m->host;
  if (!st && t->dtype.bits == 16) {
    st = flex_tensor_alloc(&w, FLEX_BACKEND_REFERENCE, F32, t->ndim, t->shape, NULL);
    if (!st) st = flex_tensor_copy(w, t, NULL);
    t = w;
  }
  if (!st) st = flex_npy_save(path, t);
  flex_tensor_free(w);
  if (st) fprintf(stderr, "flexc: error: %s\n", flex_last_error());
  return st == FLEX_OK;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void shape_str(char *out, size_t cap, const DLTensor *t) {
  int w = 0;
  for (int d = 0; d < t->ndim && w >= 0 && (size_t)w < cap; d++)
    w += snprintf(out + w, cap - (size_t)w, "%s%lld", d ? "x" : "", (long long)t->shape[d]);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of n times (sorted in place). */
static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Call `fn` o->repeat times, each waited for; the median time in *ms. */
static bool timed(const RunOpts *o, flex_status (*fn)(flex_kernel *, const flex_args *),
                  flex_kernel *kern, const flex_args *a, double *ms) {
  double *t = malloc(sizeof *t * (size_t)o->repeat);
  if (!t) {
    fprintf(stderr, "flexc: error: out of memory\n");
    return false;
  }
  for (int i = 0; i < o->repeat; i++) {
    double t0 = now();
    if (fn(kern, a)) {
      cli_call_error(flex_last_error());
      free(t);
      return false;
    }
    if (flex_sync(o->backend, NULL)) { /* launches are asynchronous */
      fprintf(stderr, "flexc: error: %s\n", flex_last_error());
      free(t);
      return false;
    }
    t[i] = (now() - t0) * 1e3;
  }
  *ms = median(t, o->repeat);
  free(t);
  return true;
}

static const char *dtype_flag(DLDataType t) {
  return t.code == kDLBfloat ? "bf16" : t.bits == 16 ? "fp16" : "fp32";
}

/* Run forward (and backward), write the results. */
static int execute(const RunOpts *o, flex_kernel *kern, RunState *s) {
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = o->backend;
  a.q = s->q.dev, a.k = s->k.dev, a.v = s->v.dev, a.out = s->out.dev, a.lse = s->lse.dev;
  a.scale = o->scale;
  a.params = o->params, a.nparams = o->nparams;
  a.buffers = s->fbufs, a.nbuffers = o->nbufs;
  a.check_bounds = o->check_bounds;
  a.trust_sorted = o->trust_sorted;
  a.fast_math = o->fast_math;
  a.deterministic = o->deterministic;
  a.arch = o->arch;
  a.dropout_p = o->dropout, a.dropout_seed = o->seed, a.dropout_offset = o->offset;
  a.kv_splits = o->kv_splits;
  a.cu_seqlens_q = s->cu_q.dev, a.cu_seqlens_kv = s->cu_kv.dev; /* NULL when not given */
  a.page_table = s->pages.dev, a.kv_lens = s->kv_lens.dev;
  double fwd_ms = 0, bwd_ms = 0;
  if (!timed(o, flex_forward, kern, &a, &fwd_ms)) return 1;
  if (o->dout) {
    a.dout = s->dout.dev, a.dlse = o->dlse ? s->dlse.dev : NULL;
    a.dq = s->dq.dev, a.dk = s->dk.dev, a.dv = s->dv.dev;
    if (!timed(o, flex_backward, kern, &a, &bwd_ms)) return 1;
  }
  bool ok = write_result(o->out, "out", &s->out) && write_result(o->out, "lse", &s->lse);
  if (ok && o->dout) {
    ok = write_result(o->out, "dq", &s->dq) && write_result(o->out, "dk", &s->dk) &&
         write_result(o->out, "dv", &s->dv);
    for (int i = 0; ok && i < o->nbufs; i++)
      if (s->fbufs[i].grad) {
        char name[256];
        snprintf(name, sizeof name, "d_%s", o->buf_names[i]);
        ok = write_result(o->out, name, &s->grads[i]);
      }
  }
  if (!ok) return 1;
  char qs[96], ks[96], vs[96];
  shape_str(qs, sizeof qs, s->q.host), shape_str(ks, sizeof ks, s->k.host);
  shape_str(vs, sizeof vs, s->v.host);
  printf("%s: q %s k %s v %s (%s): forward %.3f ms", flex_backend_name(o->backend), qs, ks, vs,
         dtype_flag(o->dtype), fwd_ms);
  if (o->dout) printf(", backward %.3f ms", bwd_ms);
  if (o->repeat > 1) printf(" (medians of %d calls)", o->repeat);
  printf(" -> %s\n", o->out);
  return 0;
}

int cli_run(int argc, char **argv) {
  RunOpts o;
  int st = parse_args(&o, argc, argv);
  if (st) return st;
  /* Before the first call: both pools are created on first use. */
  if (o.threads) {
    char n[16];
    snprintf(n, sizeof n, "%d", o.threads);
    setenv("FLEXC_THREADS", n, 1);
  }
  /* Without the backend nothing else is worth doing: say so first. */
  if (!flex_backend_available(o.backend)) {
    fprintf(stderr, "flexc: error: %s\n", flex_last_error());
    return 1;
  }
  flex_kernel *kern;
  if (!cli_load_kernel(&kern, o.file, o.kernel)) return 1;
  flex_kernel_info info;
  flex_kernel_get_info(kern, &info);
  RunState *s = calloc(1, sizeof *s);
  st = 1;
  if (!s) fprintf(stderr, "flexc: error: out of memory\n");
  else if (!cli_make_dir(o.out)) fprintf(stderr, "flexc: error: cannot create %s: %s\n", o.out, strerror(errno));
  else if (prepare(&o, &info, s)) st = execute(&o, kern, s);
  if (s) free_state(s);
  free(s);
  flex_kernel_free(kern);
  return st;
}
