/* interp.c: the float64 interpreter, the engine of the reference backend.
 *
 * ir_eval() walks a function's instructions in order. Its switch is
 * generated from the EVAL column of ops.def, so a new op needs no edit here.
 * Floats are evaluated in binary64, ints wrap at 32 bits, and the DSL's
 * integer division rules come from ir.h. Buffer reads (ir_load) and
 * gradient adds (ir_accum) are range-checked on every access: a failure is
 * recorded in the environment (the first one wins) and evaluation continues
 * with zero, so an unchecked run can never read out of bounds either.
 */
#include <stdio.h>
#include <string.h>

#include "ir.h"

double ir_half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0) v = ldexp((double)man, -24); /* subnormal: man * 2^-24 */
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = ldexp((double)(man | 0x400), exp - 25);
  return sign ? -v : v;
}

double ir_bf16_to_double(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16; /* bf16 is the top half of a binary32 */
  float f;
  memcpy(&f, &bits, sizeof f);
  return (double)f;
}

void ir_access_error(char *p, size_t cap, const char *what, const IrModule *m, const Source *src,
                     const IrInst *in, const int64_t *idx, int n, const int64_t *shape, int ndims) {
  const char *name = m ? m->buffers[in->aux].id : "?";
  int w = snprintf(p, cap, "%s buffer '%s' [", what, name);
  for (int d = 0; d < n && w > 0 && (size_t)w < cap; d++)
    w += snprintf(p + w, cap - (size_t)w, "%s%lld", d ? ", " : "", (long long)idx[d]);
  if (w > 0 && (size_t)w < cap) snprintf(p + w, cap - (size_t)w, "]");
  if (n > 0 && shape) {
    size_t k = strlen(p);
    snprintf(p + k, cap - k, " (shape [");
    for (int d = 0; d < ndims; d++) {
      k = strlen(p);
      snprintf(p + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    }
    k = strlen(p);
    snprintf(p + k, cap - k, "])");
  }
  if (src) {
    int line, col;
    src_linecol(src, in->loc.start, &line, &col);
    size_t k = strlen(p);
    if (k < cap) snprintf(p + k, cap - k, " at %s:%d:%d", src->path, line, col);
  }
}

/* Record the first failure: `what` about buffer slot `buf` at indices `idx`. */
static void fail(IrEnv *env, const IrInst *in, const char *what, const int64_t *idx, int n) {
  if (env->failed) return;
  env->failed = true;
  const IrBufView *bv = &env->bufs[in->aux];
  ir_access_error(env->error, sizeof env->error, what, env->mod, env->src, in, idx, n, bv->shape,
                  bv->ndims);
}

/* Element offset of the indices given by operands first..first+n-1, or -1
 * (after recording the failure) when one is out of range. */
static int64_t offset_of(IrEnv *env, const IrInst *in, const IrVal *vals, int first, int n,
                         bool dense, const char *what) {
  const IrBufView *bv = &env->bufs[in->aux];
  int64_t idx[IR_MAXDIMS], off = 0;
  bool ok = bv->ndims == n;
  for (int d = 0; d < n; d++) idx[d] = vals[in->args[first + d]].i;
  for (int d = 0; ok && d < n; d++) {
    if (idx[d] < 0 || idx[d] >= bv->shape[d]) ok = false;
    else off = dense ? off * bv->shape[d] + idx[d] : off + idx[d] * bv->strides[d];
  }
  if (!ok) {
    fail(env, in, what, idx, n);
    return -1;
  }
  return off;
}

/* The zero of an instruction's type. */
static IrVal zero_of(const IrInst *in) {
  if (in->type == IT_F32) return ir_vf(0.0);
  if (in->type == IT_BOOL) return ir_vb(false);
  return ir_vi(0);
}

IrVal ir_load(IrEnv *env, const IrInst *in, const IrVal *vals) {
  const IrBufView *bv = &env->bufs[in->aux];
  if (!bv->data) {
    fail(env, in, "read of unbound", NULL, 0);
    return zero_of(in);
  }
  int64_t off = offset_of(env, in, vals, 0, in->nargs, false, "out-of-range read of");
  if (off < 0) return zero_of(in);
  const char *p = bv->data;
  switch (bv->dtype) {
  case DT_F32: { float v; memcpy(&v, p + off * 4, 4); return ir_vf(v); }
  case DT_F16: { uint16_t v; memcpy(&v, p + off * 2, 2); return ir_vf(ir_half_to_double(v)); }
  case DT_BF16: { uint16_t v; memcpy(&v, p + off * 2, 2); return ir_vf(ir_bf16_to_double(v)); }
  case DT_I32: { int32_t v; memcpy(&v, p + off * 4, 4); return ir_vi(v); }
  case DT_I64: {
    int64_t v;
    memcpy(&v, p + off * 8, 8);
    if (v < INT32_MIN || v > INT32_MAX) {
      int64_t idx[IR_MAXDIMS];
      for (int d = 0; d < in->nargs; d++) idx[d] = vals[in->args[d]].i;
      fail(env, in, "i64 value that does not fit in 32 bits read from", idx, in->nargs);
      return zero_of(in);
    }
    return ir_vi((int32_t)v);
  }
  case DT_U8: return ir_vi((uint8_t)p[off]);
  case DT_BOOL: return ir_vb(p[off] != 0);
  }
  PANIC("bad buffer dtype %d", (int)bv->dtype);
}

IrVal ir_accum(IrEnv *env, const IrInst *in, const IrVal *vals) {
  const IrBufView *bv = &env->bufs[in->aux];
  int64_t off = offset_of(env, in, vals, 1, in->nargs - 1, true,
                          "out-of-range gradient of");
  if (off >= 0 && bv->grad) bv->grad[off] += vals[in->args[0]].f;
  return ir_vf(0.0);
}

IrVal ir_eval(const IrFunc *f, IrEnv *env, IrVal *vals) {
  IrVal none = ir_vi(0);
  for (int i = 0; i < f->n; i++) {
    const IrInst *in = &f->inst[i];
    /* Operands by position; ops.def's EVAL column reads them as a, b, c. */
    IrVal a = in->nargs > 0 ? vals[in->args[0]] : none;
    IrVal b = in->nargs > 1 ? vals[in->args[1]] : none;
    IrVal c = in->nargs > 2 ? vals[in->args[2]] : none;
    (void)a, (void)b, (void)c;
    switch ((IrOp)in->op) {
#define X(op, name, n, r, t, fl, ev, cu, iv)                                       \
  case IR_##op: vals[i] = (ev); break;
#include "ops.def"
#undef X
    default: PANIC("ir_eval: bad op %d in %s", (int)in->op, f->name);
    }
  }
  CHECK(f->ret >= 0 && f->ret < f->n);
  return vals[f->ret];
}
