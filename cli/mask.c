/* flexc mask: the block sparsity of a kernel's mask.
 *
 *   flexc mask FILE [--kernel K] --shape B,H,Q_LEN,KV_LEN [--block-size M,N]
 *              [--param NAME=VALUE]... [--buffer NAME=F.npy]... [--out DIR]
 *
 * Builds the BlockMask the way the runtime does (interval analysis, then
 * element-wise evaluation of the blocks it leaves open), prints the block
 * counts and density, and with --out writes the eight int32 arrays as .npy.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "runtime/blockmask.h"
#include "runtime/npy.h"
#include "runtime/rt.h"

enum { MAXNAMED = 32 };

/* The parsed command line. */
typedef struct Opts {
  const char *file, *kernel, *out;
  int shape[4];                  /* B, H, Q_LEN, KV_LEN */
  int block[2];                  /* M, N */
  const char *pname[MAXNAMED];   /* --param names */
  double pval[MAXNAMED];         /* and values */
  int np;
  const char *bname[MAXNAMED];   /* --buffer names */
  const char *bpath[MAXNAMED];   /* and files */
  int nb;
} Opts;

/* "a,b,..." into n positive ints; false if malformed. */
static bool parse_ints(const char *s, int *out, int n) {
  for (int i = 0; i < n; i++) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > (1L << 30) || *end != (i + 1 < n ? ',' : '\0')) return false;
    out[i] = (int)v;
    s = end + 1;
  }
  return true;
}

/* NAME=VALUE: splits in place (the argument string is ours to edit). */
static char *split_eq(char *arg) {
  char *eq = strchr(arg, '=');
  if (!eq || eq == arg || !eq[1]) return NULL;
  *eq = 0;
  return eq + 1;
}

static int parse_opts(int argc, char **argv, Opts *o) {
  memset(o, 0, sizeof *o);
  o->block[0] = o->block[1] = 128;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || !a[1]) {
      if (o->file) return cli_usage_error("mask: one FILE only ('%s')", a);
      o->file = a;
      continue;
    }
    if (i + 1 >= argc) return cli_usage_error("mask: %s needs a value", a);
    char *v = argv[++i];
    if (!strcmp(a, "--kernel")) o->kernel = v;
    else if (!strcmp(a, "--out")) o->out = v;
    else if (!strcmp(a, "--shape")) {
      if (!parse_ints(v, o->shape, 4)) return cli_usage_error("mask: --shape wants B,H,Q_LEN,KV_LEN (positive), got '%s'", v);
    } else if (!strcmp(a, "--block-size")) {
      if (!parse_ints(v, o->block, 2)) return cli_usage_error("mask: --block-size wants M,N (positive), got '%s'", v);
    } else if (!strcmp(a, "--param") || !strcmp(a, "--buffer")) {
      bool buf = a[2] == 'b';
      char *val = split_eq(v);
      if (!val) return cli_usage_error("mask: %s wants NAME=%s, got '%s'", a, buf ? "FILE" : "VALUE", v);
      if ((buf ? o->nb : o->np) == MAXNAMED) return cli_usage_error("mask: too many %s options", a);
      if (buf) {
        o->bname[o->nb] = v;
        o->bpath[o->nb++] = val;
      } else {
        char *end;
        o->pname[o->np] = v;
        o->pval[o->np++] = strtod(val, &end);
        if (*end) return cli_usage_error("mask: --param %s: '%s' is not a number", v, val);
      }
    } else
      return cli_usage_error("mask: unknown option '%s'", a);
  }
  if (!o->file) return cli_usage_error("mask: no FILE");
  if (!o->shape[0]) return cli_usage_error("mask: --shape B,H,Q_LEN,KV_LEN is required");
  return 0;
}

/* Whether the mask reads a value of the given leaf op and slot. */
static bool mask_reads(const IrModule *m, IrOp op, int slot) {
  for (int i = 0; m->mask && i < m->mask->n; i++)
    if (m->mask->inst[i].op == op && m->mask->inst[i].aux == slot) return true;
  return false;
}

/* Everything bound for the build. */
typedef struct Bound {
  IrVal *params;
  int32_t *sizes;
  IrBufView *bufs;
  RtArray *arrays; /* the files as read */
  void **data;     /* converted to each buffer's dtype */
} Bound;

static int bind_params(const IrModule *m, const Opts *o, Bound *bd) {
  for (int k = 0; k < o->np; k++) {
    int s = 0;
    while (s < m->nparams && strcmp(m->params[s].id, o->pname[k])) s++;
    if (s == m->nparams) return fprintf(stderr, "flexc: error: no param named '%s'\n", o->pname[k]), 1;
    if (m->params[s].type == IT_I32) {
      double v = o->pval[k];
      if (v != floor(v) || v < INT32_MIN || v > INT32_MAX)
        return fprintf(stderr, "flexc: error: param '%s' is int; %g is not\n", o->pname[k], v), 1;
      bd->params[s] = ir_vi((int32_t)v);
    } else {
      bd->params[s] = ir_vf((double)(float)o->pval[k]);
    }
  }
  for (int s = 0; s < m->nparams; s++) {
    bool given = false;
    for (int k = 0; k < o->np; k++) given = given || !strcmp(m->params[s].id, o->pname[k]);
    if (given) continue;
    if (m->params[s].has_default) bd->params[s] = m->params[s].def;
    else if (mask_reads(m, IR_PARAM, s))
      return fprintf(stderr, "flexc: error: param '%s' has no default; pass --param %s=VALUE\n",
                     m->params[s].id, m->params[s].id), 1;
  }
  return 0;
}

/* Does the file's dtype suit the buffer (DESIGN.md: floats for float
 * buffers, int32/int64 for int ones, bool/uint8 for bool ones)? */
static bool dtype_ok(DType want, DLDataType got) {
  switch (want) {
  case DT_F32: case DT_F16: case DT_BF16: return got.code == kDLFloat;
  case DT_I32: case DT_I64: return got.code == kDLInt && (got.bits == 32 || got.bits == 64);
  case DT_U8: return (got.code == kDLUInt && got.bits == 8) || (got.code == kDLInt && got.bits >= 32);
  case DT_BOOL: return got.code == kDLBool || (got.code == kDLUInt && got.bits == 8);
  }
  return false;
}

/* The array converted to the buffer's dtype (base_alloc). */
static void *convert(const RtArray *a, DType dt) {
  int64_t n = rt_array_count(a);
  int sz = dt == DT_I64 ? 8 : dt == DT_F32 || dt == DT_I32 ? 4 : dt == DT_U8 || dt == DT_BOOL ? 1 : 2;
  char *p = base_alloc((size_t)(n ? n : 1) * (size_t)sz);
  for (int64_t i = 0; i < n; i++) {
    double v = rt_array_get(a, i);
    switch (dt) {
    case DT_F32: ((float *)p)[i] = (float)v; break;
    case DT_F16: ((uint16_t *)p)[i] = rt_half_from_double(v); break;
    case DT_BF16: ((uint16_t *)p)[i] = rt_bf16_from_double(v); break;
    case DT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case DT_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case DT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    }
  }
  return p;
}

/* One --buffer: read, check rank, dtype and fixed extents, bind symbols. */
static int bind_buffer(const IrModule *m, int s, const char *path, Bound *bd) {
  char err[512];
  const IrBuffer *b = &m->buffers[s];
  RtArray *a = &bd->arrays[s];
  if (rt_npy_read(path, a, err, sizeof err)) return fprintf(stderr, "flexc: error: %s\n", err), 1;
  if (a->ndim != b->ndims || !dtype_ok(b->dtype, a->dtype))
    return fprintf(stderr, "flexc: error: buffer '%s' is %s with %d dimensions; %s has %s with %d\n",
                   b->id, dtype_name(b->dtype), b->ndims, path, rt_dtype_name(a->dtype), a->ndim), 1;
  IrBufView *bv = &bd->bufs[s];
  bv->dtype = b->dtype;
  bv->ndims = b->ndims;
  for (int d = b->ndims - 1; d >= 0; d--) {
    bv->shape[d] = a->shape[d];
    bv->strides[d] = d == b->ndims - 1 ? 1 : bv->strides[d + 1] * a->shape[d + 1];
    int64_t want = b->dims[d].fixed;
    int slot = b->dims[d].size;
    if (want < 0 && slot < SZ_COUNT) want = bd->sizes[slot];
    else if (want < 0 && m->sizes[slot].buffer == s && m->sizes[slot].dim == d)
      bd->sizes[slot] = (int32_t)a->shape[d]; /* this buffer defines the symbol */
    if (want >= 0 && a->shape[d] != want)
      return fprintf(stderr, "flexc: error: buffer '%s' dimension %d is %lld in %s, expected %lld\n",
                     b->id, d, (long long)a->shape[d], path, (long long)want), 1;
  }
  bd->data[s] = convert(a, b->dtype);
  bv->data = bd->data[s];
  return 0;
}

static int bind_buffers(const IrModule *m, const Opts *o, Bound *bd) {
  for (int k = 0; k < o->nb; k++) {
    int s = 0;
    while (s < m->nbuffers && strcmp(m->buffers[s].id, o->bname[k])) s++;
    if (s == m->nbuffers) return fprintf(stderr, "flexc: error: no buffer named '%s'\n", o->bname[k]), 1;
    if (bd->bufs[s].data) return fprintf(stderr, "flexc: error: buffer '%s' given twice\n", o->bname[k]), 1;
    if (bind_buffer(m, s, o->bpath[k], bd)) return 1;
  }
  for (int s = 0; s < m->nbuffers; s++)
    if (!bd->bufs[s].data && mask_reads(m, IR_LOAD, s))
      return fprintf(stderr, "flexc: error: the mask reads buffer '%s'; pass --buffer %s=FILE.npy\n",
                     m->buffers[s].id, m->buffers[s].id), 1;
  return 0;
}

/* Write the eight arrays into dir, created when missing. */
static int write_arrays(const RtBlockMask *bm, const char *dir) {
  if (!cli_make_dir(dir)) return fprintf(stderr, "flexc: error: %s: cannot create directory\n", dir), 1;
  const char *names[8] = {"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"};
  int32_t *arrs[8] = {bm->kv_num_blocks, bm->kv_indices, bm->full_kv_num_blocks,
                      bm->full_kv_indices, bm->q_num_blocks, bm->q_indices,
                      bm->full_q_num_blocks, bm->full_q_indices};
  for (int k = 0; k < 8; k++) {
    bool qside = k >= 4, idx = k % 2 == 1;
    RtArray a = {rt_dtype(kDLInt, 32), idx ? 4 : 3, {bm->B, bm->H, qside ? bm->nkv : bm->nq,
                 qside ? bm->nq : bm->nkv}, arrs[k]};
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/%s.npy", dir, names[k]);
    if (rt_npy_write(path, &a, err, sizeof err)) return fprintf(stderr, "flexc: error: %s\n", err), 1;
  }
  return 0;
}

static void report(const IrModule *m, const Opts *o, const RtBlockMask *bm, const RtMaskStats *st,
                   double ms) {
  printf("kernel: %s   mask: %s\n", m->kernel, m->mask ? m->mask->name : "(none)");
  printf("shape: B=%d H=%d Q_LEN=%d KV_LEN=%d   block: %dx%d   stored B=%d H=%d\n", o->shape[0],
         o->shape[1], o->shape[2], o->shape[3], bm->block_q, bm->block_kv, bm->B, bm->H);
  printf("blocks: %lld total, %lld visited (%lld full, %lld partial), %lld empty\n",
         (long long)st->total, (long long)(st->full + st->partial), (long long)st->full,
         (long long)st->partial, (long long)st->empty);
  printf("density: %.6f\n", st->total ? (double)(st->full + st->partial) / (double)st->total : 0.0);
  if (st->undecided == st->partial && st->decidable)
    printf("analysis: decided every block (no element-wise evaluation needed); %s\n",
           ir_interval_device_decidable(m)
               ? "implicit mask possible"
               : "the kernels still build block lists (the device classifier treats floats as unknown)");
  else
    printf("analysis: %s; %lld of %lld open blocks resolved element-wise (%lld evaluations)\n",
           st->decidable ? "decidable" : "not decidable (reads a buffer that is not `sorted`)",
           (long long)st->refined, (long long)st->undecided, (long long)st->evaluated);
  printf("time: %.3f ms\n", ms);
}

int cli_mask(int argc, char **argv) {
  Opts o;
  int rc = parse_opts(argc, argv, &o);
  if (rc) return rc;
  flex_kernel *k;
  if (!cli_load_kernel(&k, o.file, o.kernel)) return 1;
  const IrModule *m = k->mod;
  Bound bd;
  bd.params = base_alloc(sizeof *bd.params * (size_t)(m->nparams + 1));
  bd.sizes = base_alloc(sizeof *bd.sizes * (size_t)(m->nsizes + 1));
  bd.bufs = base_alloc(sizeof *bd.bufs * (size_t)(m->nbuffers + 1));
  bd.arrays = base_alloc(sizeof *bd.arrays * (size_t)(m->nbuffers + 1));
  bd.data = base_alloc(sizeof *bd.data * (size_t)(m->nbuffers + 1));
  int32_t pre[SZ_COUNT] = {o.shape[0], o.shape[1], o.shape[1], o.shape[2], o.shape[3]};
  memcpy(bd.sizes, pre, sizeof pre);
  rc = bind_params(m, &o, &bd);
  if (!rc) rc = bind_buffers(m, &o, &bd);
  if (!rc) {
    IrIntervalEnv env = {bd.params, bd.sizes, bd.bufs};
    RtMaskShape shape = {o.shape[0], o.shape[1], o.shape[2], o.shape[3], o.block[0], o.block[1]};
    RtBlockMask bm;
    RtMaskStats st;
    char err[512];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    flex_status fs = rt_block_mask_build(&bm, m, &env, &shape, RT_MASK_EVAL, &st, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (fs != FLEX_OK) {
      fprintf(stderr, "flexc: error: %s\n", err);
      rc = 1;
    } else {
      report(m, &o, &bm, &st, (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
      if (o.out) rc = write_arrays(&bm, o.out);
      rt_block_mask_free(&bm);
    }
  }
  for (int s = 0; s < m->nbuffers; s++) {
    if (bd.arrays[s].data) rt_array_free(&bd.arrays[s]);
    base_free(bd.data[s]);
  }
  base_free(bd.params), base_free(bd.sizes), base_free(bd.bufs), base_free(bd.arrays), base_free(bd.data);
  flex_kernel_free(k);
  return rc;
}
