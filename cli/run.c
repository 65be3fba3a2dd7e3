/* flexc run: attention on .npy inputs, results as .npy files.
 *
 *   flexc run FILE [--kernel K] --q Q.npy --k K.npy --v V.npy [--dout DO.npy]
 *             [--dlse DLSE.npy] [--buffer NAME=F.npy]... [--param NAME=VALUE]...
 *             [--scale X] [--dtype fp32|fp16|bf16] [--backend reference|emu|cuda]
 *             [--check-bounds] [--fast-math] --out DIR
 *
 * Q, K, V and dO are cast to --dtype (the reference then computes in float64
 * from the cast values); buffers are converted to their declared dtype.
 * Writes out.npy and lse.npy, and with --dout dq.npy dk.npy dv.npy and
 * d_NAME.npy per `grad` buffer. The reference writes float64, others float32.
 *
 * The cuda backend reads and writes device memory: every tensor is mirrored
 * on the device (outputs in the dtype of q, lse and gradients in float32),
 * run there, copied back and widened to float32 for the files.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "runtime/driver.h"
#include "runtime/npy.h"
#include "runtime/rt.h"

#define MAXNAMED 64

/* The parsed command line. */
typedef struct RunOpts {
  const char *file, *kernel, *q, *k, *v, *dout, *dlse, *out;
  const char *buf_names[MAXNAMED], *buf_files[MAXNAMED];
  int nbufs;
  flex_param params[MAXNAMED];
  int nparams;
  double scale;
  DLDataType dtype;       /* inputs are cast to this */
  flex_backend backend;
  bool check_bounds;
  bool fast_math; /* --fast-math: approximate builtins on emu and cuda */
} RunOpts;

/* Everything one run allocates, freed together. */
typedef struct RunState {
  RtArray q, k, v, dout, dlse, out, lse, dq, dk, dv;
  RtArray bufs[MAXNAMED], grads[MAXNAMED];
  DLTensor tq, tk, tv, tdout, tdlse, tout, tlse, tdq, tdk, tdv;
  DLTensor tbufs[MAXNAMED], tgrads[MAXNAMED];
  flex_buffer fbufs[MAXNAMED];
  RtCuDevicePtr dev[10 + 2 * MAXNAMED]; /* cuda backend: device copies (0: none) */
  int ndev;                              /* entries of dev in use */
} RunState;

/* NAME=VALUE into its halves (the string is modified). */
static bool split_eq(char *s, char **name, char **value) {
  char *eq = strchr(s, '=');
  if (!eq || eq == s || !eq[1]) return false;
  *eq = 0;
  *name = s;
  *value = eq + 1;
  return true;
}

static int parse_dtype(const char *s, DLDataType *t) {
  if (!strcmp(s, "fp32")) *t = rt_dtype(kDLFloat, 32);
  else if (!strcmp(s, "fp16")) *t = rt_dtype(kDLFloat, 16);
  else if (!strcmp(s, "bf16")) *t = rt_dtype(kDLBfloat, 16);
  else return cli_usage_error("--dtype must be fp32, fp16 or bf16, got '%s'", s);
  return 0;
}

static int parse_backend(const char *s, flex_backend *b) {
  for (int i = 0; i < 3; i++)
    if (!strcmp(s, flex_backend_name((flex_backend)i))) {
      *b = (flex_backend)i;
      return 0;
    }
  return cli_usage_error("--backend must be reference, emu or cuda, got '%s'", s);
}

/* One option that takes a value; returns 0, or the exit status. */
static int parse_opt(RunOpts *o, const char *opt, char *val) {
  const char **slot = !strcmp(opt, "--kernel") ? &o->kernel : !strcmp(opt, "--q") ? &o->q
                    : !strcmp(opt, "--k") ? &o->k : !strcmp(opt, "--v") ? &o->v
                    : !strcmp(opt, "--dout") ? &o->dout : !strcmp(opt, "--dlse") ? &o->dlse
                    : !strcmp(opt, "--out") ? &o->out : NULL;
  if (slot) {
    *slot = val;
    return 0;
  }
  char *name, *value, *end;
  if (!strcmp(opt, "--buffer") || !strcmp(opt, "--param")) {
    bool buf = opt[2] == 'b';
    if (!split_eq(val, &name, &value)) return cli_usage_error("%s expects NAME=VALUE, got '%s'", opt, val);
    if ((buf ? o->nbufs : o->nparams) == MAXNAMED) return cli_usage_error("too many %s options", opt);
    if (buf) {
      o->buf_names[o->nbufs] = name;
      o->buf_files[o->nbufs++] = value;
      return 0;
    }
    double x = strtod(value, &end);
    if (*end) return cli_input_error("--param %s: '%s' is not a number", name, value);
    o->params[o->nparams].name = name;
    o->params[o->nparams++].value = x;
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
  if (!strcmp(opt, "--dtype")) return parse_dtype(val, &o->dtype);
  if (!strcmp(opt, "--backend")) return parse_backend(val, &o->backend);
  return cli_usage_error("run: unknown option '%s'", opt);
}

static int parse_args(RunOpts *o, int argc, char **argv) {
  memset(o, 0, sizeof *o);
  o->dtype = rt_dtype(kDLFloat, 32);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check-bounds")) o->check_bounds = true;
    else if (!strcmp(argv[i], "--fast-math")) o->fast_math = true;
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
  if (o->dlse && !o->dout)
    return cli_usage_error("run: --dlse is an input of the backward pass; it needs --dout");
  return 0;
}

/* ---- inputs ------------------------------------------------------------- */

/* Read a .npy file whose dtype must be one of `codes`, converted to `to`
 * (with a range check for integers). Returns false after printing why. */
static bool read_as(const char *path, const char *role, DLDataType to, RtArray *out) {
  char err[512];
  RtArray raw;
  if (rt_npy_read(path, &raw, err, sizeof err)) {
    fprintf(stderr, "flexc: error: %s\n", err);
    return false;
  }
  bool want_float = to.code == kDLFloat || to.code == kDLBfloat;
  bool is_float = raw.dtype.code == kDLFloat;
  bool is_int = raw.dtype.code == kDLInt;
  bool is_boolish = raw.dtype.code == kDLBool || raw.dtype.code == kDLUInt;
  bool ok = want_float ? is_float
          : to.code == kDLBool ? is_boolish
          : to.code == kDLUInt ? is_int || is_boolish : is_int;
  if (!ok) {
    fprintf(stderr, "flexc: error: %s: %s needs %s data, got %s\n", path, role,
            want_float ? "float16, float32 or float64"
            : to.code == kDLBool ? "bool or uint8" : "int32 or int64",
            rt_dtype_name(raw.dtype));
    rt_array_free(&raw);
    return false;
  }
  rt_array_init(out, to, raw.ndim, raw.shape);
  double lo = to.code == kDLUInt ? 0 : to.bits == 32 ? -2147483648.0 : -9.3e18;
  double hi = to.code == kDLUInt ? 255 : to.bits == 32 ? 2147483647.0 : 9.3e18;
  for (int64_t i = 0; i < rt_array_count(&raw); i++) {
    double x = rt_array_get(&raw, i);
    if (!want_float && to.code != kDLBool && (x < lo || x > hi)) {
      fprintf(stderr, "flexc: error: %s: element %lld (%.0f) does not fit in %s\n", path,
              (long long)i, x, rt_dtype_name(to));
      rt_array_free(&raw);
      return false;
    }
    if (to.code == kDLInt && to.bits == 64 && raw.dtype.bits == 64) {
      memcpy((char *)out->data + i * 8, (char *)raw.data + i * 8, 8); /* exact, beyond 2^53 */
      continue;
    }
    rt_array_set(out, i, x);
  }
  rt_array_free(&raw);
  return true;
}

static bool read_tensor(const char *path, const char *role, DLDataType to, RtArray *a,
                        DLTensor *t) {
  if (!read_as(path, role, to, a)) return false;
  *t = rt_array_tensor(a);
  return true;
}

/* The buffers, each converted to the declared dtype of the kernel. */
static bool read_buffers(const RunOpts *o, const flex_kernel *kern, RunState *s, bool backward) {
  const IrModule *m = kern->mod;
  for (int i = 0; i < o->nbufs; i++) {
    const IrBuffer *ib = NULL;
    for (int j = 0; j < m->nbuffers; j++)
      if (!strcmp(m->buffers[j].id, o->buf_names[i])) ib = &m->buffers[j];
    static const uint8_t codes[] = {kDLFloat, kDLFloat, kDLBfloat, kDLInt, kDLInt, kDLUInt, kDLBool};
    static const uint8_t bits[] = {32, 16, 16, 32, 64, 8, 8};
    /* An undeclared name is read as is; validation then names the buffers. */
    DLDataType to = ib ? rt_dtype(codes[ib->dtype], bits[ib->dtype]) : rt_dtype(kDLFloat, 32);
    char role[128];
    snprintf(role, sizeof role, "buffer '%s'", o->buf_names[i]);
    if (!read_tensor(o->buf_files[i], role, to, &s->bufs[i], &s->tbufs[i])) return false;
    s->fbufs[i].name = o->buf_names[i];
    s->fbufs[i].tensor = &s->tbufs[i];
    if (backward && ib && ib->grad) {
      DLDataType g = o->backend == FLEX_BACKEND_REFERENCE ? rt_dtype(kDLFloat, 64) : rt_dtype(kDLFloat, 32);
      rt_array_init(&s->grads[i], g, s->bufs[i].ndim, s->bufs[i].shape);
      s->tgrads[i] = rt_array_tensor(&s->grads[i]);
      s->fbufs[i].grad = &s->tgrads[i];
    }
  }
  return true;
}

/* ---- outputs ------------------------------------------------------------ */

static bool write_out(const char *dir, const char *name, const RtArray *a) {
  char path[4096], err[512];
  snprintf(path, sizeof path, "%s/%s.npy", dir, name);
  if (rt_npy_write(path, a, err, sizeof err)) {
    fprintf(stderr, "flexc: error: %s\n", err);
    return false;
  }
  return true;
}

static void alloc_out(RtArray *a, DLTensor *t, DLDataType dt, int ndim, int64_t d0, int64_t d1,
                      int64_t d2, int64_t d3) {
  int64_t shape[4] = {d0, d1, d2, d3};
  rt_array_init(a, dt, ndim, shape);
  *t = rt_array_tensor(a);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void free_state(RunState *s) {
  for (int i = 0; i < s->ndev; i++) rt_drv_free(s->dev[i]);
  RtArray *all[] = {&s->q, &s->k, &s->v, &s->dout, &s->dlse, &s->out, &s->lse, &s->dq, &s->dk, &s->dv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) rt_array_free(all[i]);
  for (int i = 0; i < MAXNAMED; i++) {
    rt_array_free(&s->bufs[i]);
    rt_array_free(&s->grads[i]);
  }
}

/* Read the inputs, allocate the outputs. */
static bool prepare(const RunOpts *o, const flex_kernel *kern, RunState *s) {
  DLDataType f64 = rt_dtype(kDLFloat, 64), f32 = rt_dtype(kDLFloat, 32);
  DLDataType odt = o->backend == FLEX_BACKEND_REFERENCE ? f64 : f32;
  /* The cuda kernels write out, dq, dk and dv in the dtype of q. */
  DLDataType xdt = o->backend == FLEX_BACKEND_CUDA ? o->dtype : odt;
  bool bwd = o->dout != NULL;
  if (!read_tensor(o->q, "q", o->dtype, &s->q, &s->tq) ||
      !read_tensor(o->k, "k", o->dtype, &s->k, &s->tk) ||
      !read_tensor(o->v, "v", o->dtype, &s->v, &s->tv))
    return false;
  if (bwd && !read_tensor(o->dout, "dout", o->dtype, &s->dout, &s->tdout)) return false;
  if (bwd && o->dlse && !read_tensor(o->dlse, "dlse", odt, &s->dlse, &s->tdlse)) return false;
  const char *names[3] = {o->q, o->k, o->v};
  const RtArray *arrs[3] = {&s->q, &s->k, &s->v};
  for (int i = 0; i < 3; i++)
    if (arrs[i]->ndim != 4) {
      fprintf(stderr, "flexc: error: %s: expected a rank-4 array [B, heads, length, head dim], got rank %d\n",
              names[i], arrs[i]->ndim);
      return false;
    }
  const int64_t *q = s->q.shape, *k = s->k.shape, *v = s->v.shape;
  alloc_out(&s->out, &s->tout, xdt, 4, q[0], q[1], q[2], v[3]);
  alloc_out(&s->lse, &s->tlse, odt, 3, q[0], q[1], q[2], 0);
  if (bwd) {
    alloc_out(&s->dq, &s->tdq, xdt, 4, q[0], q[1], q[2], q[3]);
    alloc_out(&s->dk, &s->tdk, xdt, 4, k[0], k[1], k[2], k[3]);
    alloc_out(&s->dv, &s->tdv, xdt, 4, v[0], v[1], v[2], v[3]);
  }
  return read_buffers(o, kern, s, bwd);
}

/* ---- the cuda backend's device copies ----------------------------------- */

/* One host array and the tensor the call sees; `out` marks results. */
typedef struct Pair {
  RtArray *a;
  DLTensor *t;
  bool out;
} Pair;

/* Every tensor of the run; returns the count. */
static int pairs_of(const RunOpts *o, RunState *s, Pair *p) {
  int n = 0;
  bool bwd = o->dout != NULL;
  p[n++] = (Pair){&s->q, &s->tq, false};
  p[n++] = (Pair){&s->k, &s->tk, false};
  p[n++] = (Pair){&s->v, &s->tv, false};
  p[n++] = (Pair){&s->out, &s->tout, true};
  p[n++] = (Pair){&s->lse, &s->tlse, true};
  if (bwd) {
    p[n++] = (Pair){&s->dout, &s->tdout, false};
    if (o->dlse) p[n++] = (Pair){&s->dlse, &s->tdlse, false};
    p[n++] = (Pair){&s->dq, &s->tdq, true};
    p[n++] = (Pair){&s->dk, &s->tdk, true};
    p[n++] = (Pair){&s->dv, &s->tdv, true};
  }
  for (int i = 0; i < o->nbufs; i++) {
    p[n++] = (Pair){&s->bufs[i], &s->tbufs[i], false};
    if (s->fbufs[i].grad) p[n++] = (Pair){&s->grads[i], &s->tgrads[i], true};
  }
  return n;
}

static size_t bytes_of(const RtArray *a) {
  return (size_t)rt_array_count(a) * (size_t)rt_dtype_size(a->dtype);
}

static bool drv_failed(flex_status st) {
  if (st) fprintf(stderr, "flexc: error: %s\n", flex_last_error());
  return st != FLEX_OK;
}

/* Copy every tensor to device 0 (outputs too: the kernels may read them)
 * and point the call's tensors at the copies. */
static bool to_device(const RunOpts *o, RunState *s) {
  Pair p[10 + 2 * MAXNAMED];
  int n = pairs_of(o, s, p);
  for (int i = 0; i < n; i++) {
    size_t bytes = bytes_of(p[i].a);
    p[i].t->device.device_type = kDLCUDA;
    p[i].t->device.device_id = 0;
    if (!bytes) continue;
    RtCuDevicePtr d = 0;
    if (drv_failed(rt_drv_alloc(&d, bytes))) return false;
    s->dev[s->ndev++] = d;
    if (drv_failed(rt_drv_memcpy_htod(d, p[i].a->data, bytes, NULL))) return false;
    p[i].t->data = (void *)(uintptr_t)d;
  }
  return !drv_failed(rt_drv_sync(NULL));
}

/* Copy the results back into their host arrays. */
static bool from_device(const RunOpts *o, RunState *s) {
  Pair p[10 + 2 * MAXNAMED];
  int n = pairs_of(o, s, p);
  for (int i = 0; i < n; i++) {
    size_t bytes = bytes_of(p[i].a);
    if (p[i].out && bytes &&
        drv_failed(rt_drv_memcpy_dtoh(p[i].a->data, (RtCuDevicePtr)(uintptr_t)p[i].t->data,
                                      bytes, NULL)))
      return false;
  }
  return !drv_failed(rt_drv_sync(NULL));
}

/* Write a result as float32 when it is held in a 16-bit float dtype. */
static bool write_result(const char *dir, const char *name, const RtArray *a) {
  if (a->dtype.bits != 16) return write_out(dir, name, a);
  RtArray w;
  rt_array_init(&w, rt_dtype(kDLFloat, 32), a->ndim, a->shape);
  for (int64_t i = 0; i < rt_array_count(a); i++) rt_array_set(&w, i, rt_array_get(a, i));
  bool ok = write_out(dir, name, &w);
  rt_array_free(&w);
  return ok;
}

static void shape_str(char *out, size_t cap, const RtArray *a) {
  int w = 0;
  for (int d = 0; d < a->ndim && w >= 0 && (size_t)w < cap; d++)
    w += snprintf(out + w, cap - (size_t)w, "%s%lld", d ? "x" : "", (long long)a->shape[d]);
}

/* Run forward (and backward), write the results. */
static int execute(const RunOpts *o, flex_kernel *kern, RunState *s) {
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = o->backend;
  a.q = &s->tq, a.k = &s->tk, a.v = &s->tv, a.out = &s->tout, a.lse = &s->tlse;
  a.scale = o->scale;
  a.params = o->params, a.nparams = o->nparams;
  a.buffers = s->fbufs, a.nbuffers = o->nbufs;
  a.check_bounds = o->check_bounds;
  a.fast_math = o->fast_math;
  bool cuda = o->backend == FLEX_BACKEND_CUDA;
  if (cuda && !to_device(o, s)) return 1;
  double t0 = now();
  if (flex_forward(kern, &a)) {
    fprintf(stderr, "flexc: error: %s\n", flex_last_error());
    return 1;
  }
  if (cuda && drv_failed(rt_drv_sync(NULL))) return 1; /* launches are asynchronous */
  double t1 = now(), t2 = t1;
  if (o->dout) {
    a.dout = &s->tdout, a.dlse = o->dlse ? &s->tdlse : NULL;
    a.dq = &s->tdq, a.dk = &s->tdk, a.dv = &s->tdv;
    if (flex_backward(kern, &a)) {
      fprintf(stderr, "flexc: error: %s\n", flex_last_error());
      return 1;
    }
    if (cuda && drv_failed(rt_drv_sync(NULL))) return 1;
    t2 = now();
  }
  if (cuda && !from_device(o, s)) return 1;
  bool ok = write_result(o->out, "out", &s->out) && write_out(o->out, "lse", &s->lse);
  if (ok && o->dout) {
    ok = write_result(o->out, "dq", &s->dq) && write_result(o->out, "dk", &s->dk) &&
         write_result(o->out, "dv", &s->dv);
    for (int i = 0; ok && i < o->nbufs; i++)
      if (s->fbufs[i].grad) {
        char name[256];
        snprintf(name, sizeof name, "d_%s", o->buf_names[i]);
        ok = write_out(o->out, name, &s->grads[i]);
      }
  }
  if (!ok) return 1;
  char qs[96], ks[96], vs[96];
  shape_str(qs, sizeof qs, &s->q), shape_str(ks, sizeof ks, &s->k), shape_str(vs, sizeof vs, &s->v);
  printf("%s: q %s k %s v %s (%s): forward %.3f ms", flex_backend_name(o->backend), qs, ks, vs,
         rt_dtype_name(o->dtype), (t1 - t0) * 1e3);
  if (o->dout) printf(", backward %.3f ms", (t2 - t1) * 1e3);
  printf(" -> %s\n", o->out);
  return 0;
}

int cli_run(int argc, char **argv) {
  RunOpts o;
  int st = parse_args(&o, argc, argv);
  if (st) return st;
  /* Without a device nothing else is worth doing: say so first. */
  if (o.backend == FLEX_BACKEND_CUDA && (rt_drv_init() || rt_drv_use_device(0))) {
    fprintf(stderr, "flexc: error: %s\n", flex_last_error());
    return 1;
  }
  flex_kernel *kern;
  if (!cli_load_kernel(&kern, o.file, o.kernel)) return 1;
  RunState *s = base_alloc(sizeof *s);
  st = 1;
  if (!cli_make_dir(o.out)) fprintf(stderr, "flexc: error: cannot create %s: %s\n", o.out, strerror(errno));
  else if (prepare(&o, kern, s)) st = execute(&o, kern, s);
  free_state(s);
  base_free(s);
  flex_kernel_free(kern);
  return st;
}
