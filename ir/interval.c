/* interval.c: ir_interval_mask(): classify a block of a mask as empty, full
 * or partial by evaluating the mask over the block's ranges with interval
 * arithmetic (docs/blockmask.md). One transfer function per op; an op with
 * no precise rule gets the top of its type, which is always sound. */
#include "interval.h"

#include "kernels/interval.cuh"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- lattice helpers ------------------------------------------------------ */

static IrAbs abs_bool(bool may_false, bool may_true) {
  IrAbs r = {0};
  r.may_false = may_false;
  r.may_true = may_true;
  return r;
}

/* An int range; a result that may leave the i32 range may have wrapped, so
 * it becomes the whole range. */
static IrAbs abs_int(int64_t lo, int64_t hi) {
  IrAbs r = {0};
  if (lo < INT32_MIN || hi > INT32_MAX || lo > hi) lo = INT32_MIN, hi = INT32_MAX;
  r.lo = lo;
  r.hi = hi;
  return r;
}

/* A float range. A zero end point covers both zeros: fmin/fmax and the
 * corner rules may return either zero on a tie (libm and compilers differ),
 * and a range collapsed to one signed zero would count as a single value
 * for concrete evaluation, where the sign matters (1.0 / x). */
static IrAbs abs_flt(double lo, double hi, bool nan) {
  IrAbs r = {0};
  if (isnan(lo) || isnan(hi) || lo > hi) lo = -INFINITY, hi = INFINITY, nan = true;
  if (lo == 0) lo = -0.0;
  if (hi == 0) hi = 0.0;
  r.flo = lo;
  r.fhi = hi;
  r.nan = nan;
  return r;
}

static IrAbs abs_top(IrType t) {
  if (t == IT_BOOL) return abs_bool(true, true);
  if (t == IT_F32) return abs_flt(-INFINITY, INFINITY, true);
  return abs_int(INT32_MIN, INT32_MAX);
}

/* The abstract value of one concrete value. */
static IrAbs abs_point(IrType t, IrVal v) {
  if (t == IT_BOOL) return abs_bool(!v.b, v.b);
  if (t == IT_F32) { /* exact, signed zeros included */
    IrAbs r = abs_flt(v.f, v.f, isnan(v.f));
    if (!isnan(v.f)) r.flo = r.fhi = v.f;
    return r;
  }
  return abs_int(v.i, v.i);
}

/* Whether x is a single concrete value, and which. */
static bool is_point(IrType t, IrAbs x, IrVal *v) {
  if (t == IT_BOOL) {
    *v = ir_vb(x.may_true);
    return x.may_true != x.may_false;
  }
  if (t == IT_F32) {
    *v = ir_vf(x.flo);
    return !x.nan && x.flo == x.fhi && signbit(x.flo) == signbit(x.fhi);
  }
  *v = ir_vi((int32_t)x.lo);
  return x.lo == x.hi;
}

static IrAbs abs_join(IrType t, IrAbs x, IrAbs y) {
  if (t == IT_BOOL) return abs_bool(x.may_false || y.may_false, x.may_true || y.may_true);
  if (t == IT_F32) return abs_flt(fmin(x.flo, y.flo), fmax(x.fhi, y.fhi), x.nan || y.nan);
  return abs_int(x.lo < y.lo ? x.lo : y.lo, x.hi > y.hi ? x.hi : y.hi);
}

/* ---- integer and boolean transfer functions --------------------------------- */

/* The rules live in kernels/interval.cuh, shared with the device classifier. */
static FlexIvI to_iv(IrAbs a) {
  FlexIvI r = {a.lo, a.hi};
  return r;
}
static FlexIvB to_ivb(IrAbs a) { return flex_ivb(a.may_false, a.may_true); }
static IrAbs from_iv(FlexIvI r) { return abs_int(r.lo, r.hi); }
static IrAbs from_ivb(FlexIvB r) { return abs_bool(r.may_false, r.may_true); }

/* The rule of ops.def's IV column, when the op has one: operands and
 * result converted by their types (FlexIvI for ints, FlexIvB for bools). */
#define IV_ARGS_I FlexIvI x = to_iv(a), y = to_iv(b)
#define IV_ARGS_B FlexIvB x = to_ivb(a), y = to_ivb(b)
#define IV_ARGS_F int x = 0, y = 0
#define IV_ARGS_T int x = 0, y = 0
#define IV_ARGS_V int x = 0, y = 0
#define IV_FROM(v) _Generic((v), FlexIvI: from_iv, FlexIvB: from_ivb)(v)
#define IV0 false
#define IV1(fn) (*out = IV_FROM(fn(x)), true)
#define IV2(fn) (*out = IV_FROM(fn(x, y)), true)
static bool tf_shared(IrOp op, IrAbs a, IrAbs b, IrAbs *out) {
  switch (op) {
#define X(o, name, n, r, at, fl, ev, cu, iv)                                   \
  case IR_##o: {                                                               \
    IV_ARGS_##at;                                                              \
    (void)x, (void)y;                                                          \
    return iv;                                                                 \
  }
#include "ops.def"
#undef X
  case IR_NOPS: break;
  }
  return false;
}
#undef IV0
#undef IV1
#undef IV2

/* NaN compares false; ordered ranges decide the rest. */
static IrAbs tf_cmp_f(IrOp op, IrAbs a, IrAbs b) {
  bool nan = a.nan || b.nan;
  switch (op) {
  case IR_LT_F: return abs_bool(nan || !(a.fhi < b.flo), a.flo < b.fhi);
  case IR_LE_F: return abs_bool(nan || !(a.fhi <= b.flo), a.flo <= b.fhi);
  case IR_EQ_F: {
    bool disjoint = a.fhi < b.flo || b.fhi < a.flo;
    bool same = a.flo == a.fhi && b.flo == b.fhi && a.flo == b.flo;
    return abs_bool(nan || !same, !disjoint);
  }
  case IR_NE_F: {
    IrAbs e = tf_cmp_f(IR_EQ_F, a, b);
    return abs_bool(e.may_true, e.may_false);
  }
  default: return abs_top(IT_BOOL);
  }
}

static IrAbs tf_int1(IrOp op, IrAbs a) {
  switch (op) {
  case IR_F2I: { /* monotone, saturating; NaN gives 0 */
    IrAbs r = abs_int(ir_f2i(a.flo), ir_f2i(a.fhi));
    return a.nan ? abs_join(IT_I32, r, abs_int(0, 0)) : r;
  }
  default: return abs_top(IT_I32);
  }
}

/* ---- float transfer functions --------------------------------------------- */

/* Ops that are non-decreasing in their operand on their whole domain, with
 * the interpreter's own rounding at the end points. */
static double mono_inc(IrOp op, double x) {
  switch (op) {
  case IR_EXP: return exp(x);
  case IR_EXP2: return exp2(x);
  case IR_LOG: return log(x);
  case IR_LOG2: return log2(x);
  case IR_SQRT: return sqrt(x);
  case IR_TANH: return tanh(x);
  case IR_SIGMOID: return 1.0 / (1.0 + exp(-x));
  case IR_ERF: return erf(x);
  case IR_FLOOR: return floor(x);
  case IR_CEIL: return ceil(x);
  default: PANIC("interval: %d is not monotone", (int)op);
  }
}

static IrAbs tf_flt1(IrOp op, IrAbs a) {
  switch (op) {
  case IR_NEG_F: return abs_flt(-a.fhi, -a.flo, a.nan);
  case IR_I2F: /* exact in the interpreter, rounded to binary32 on devices: cover both */
    return abs_flt(fmin((double)a.lo, (double)(float)a.lo), fmax((double)a.hi, (double)(float)a.hi), false);
  case IR_B2F: return abs_flt(a.may_false ? 0.0 : 1.0, a.may_true ? 1.0 : 0.0, false);
  case IR_ABS_F:
    if (a.flo >= 0) return a;
    if (a.fhi <= 0) return abs_flt(-a.fhi, -a.flo, a.nan);
    return abs_flt(0.0, fmax(-a.flo, a.fhi), a.nan);
  case IR_LOG: case IR_LOG2: case IR_SQRT: {
    /* NaN below zero; the domain's part of the range is still monotone. */
    if (a.fhi < 0) return abs_top(IT_F32);
    double lo = a.flo < 0 ? 0.0 : a.flo;
    return abs_flt(mono_inc(op, lo), mono_inc(op, a.fhi), a.nan || a.flo < 0);
  }
  case IR_RSQRT: {
    if (a.fhi < 0 || a.flo <= 0) return abs_top(IT_F32); /* NaN, or +-inf at zero */
    return abs_flt(1.0 / sqrt(a.fhi), 1.0 / sqrt(a.flo), a.nan);
  }
  case IR_EXP: case IR_EXP2: case IR_TANH: case IR_SIGMOID: case IR_ERF: case IR_FLOOR: case IR_CEIL:
    return abs_flt(mono_inc(op, a.flo), mono_inc(op, a.fhi), a.nan);
  case IR_SIN: case IR_COS:
    return abs_flt(-1.0, 1.0, a.nan || isinf(a.flo) || isinf(a.fhi));
  default: return abs_top(IT_F32);
  }
}

/* Bounds of an op whose extremes over a box lie at its corners. A NaN at a
 * corner (inf - inf, 0 * inf) makes the result unknown. */
static IrAbs corners(double c0, double c1, double c2, double c3, bool nan) {
  if (isnan(c0) || isnan(c1) || isnan(c2) || isnan(c3)) return abs_top(IT_F32);
  return abs_flt(fmin(fmin(c0, c1), fmin(c2, c3)), fmax(fmax(c0, c1), fmax(c2, c3)), nan);
}

static bool has_zero(IrAbs x) { return x.flo <= 0 && x.fhi >= 0; }
static bool has_inf(IrAbs x) { return isinf(x.flo) || isinf(x.fhi); }

/* fmin/fmax return the other operand when one is NaN. */
static IrAbs tf_minmax_f(IrOp op, IrAbs a, IrAbs b) {
  IrAbs r = op == IR_MIN_F ? abs_flt(fmin(a.flo, b.flo), fmin(a.fhi, b.fhi), a.nan && b.nan)
                           : abs_flt(fmax(a.flo, b.flo), fmax(a.fhi, b.fhi), a.nan && b.nan);
  IrAbs bn = b, an = a;
  bn.nan = an.nan = false;
  if (a.nan) r = abs_join(IT_F32, r, bn);
  if (b.nan) r = abs_join(IT_F32, r, an);
  return r;
}

static IrAbs tf_flt2(IrOp op, IrAbs a, IrAbs b) {
  bool nan = a.nan || b.nan;
  switch (op) {
  case IR_ADD_F: return corners(a.flo + b.flo, a.flo + b.fhi, a.fhi + b.flo, a.fhi + b.fhi, nan);
  case IR_SUB_F: return corners(a.flo - b.fhi, a.flo - b.flo, a.fhi - b.fhi, a.fhi - b.flo, nan);
  case IR_MUL_F:
    if ((has_zero(a) && has_inf(b)) || (has_zero(b) && has_inf(a))) return abs_top(IT_F32);
    return corners(a.flo * b.flo, a.flo * b.fhi, a.fhi * b.flo, a.fhi * b.fhi, nan);
  case IR_DIV_F:
    if (has_zero(b) || (has_inf(a) && has_inf(b))) return abs_top(IT_F32);
    return corners(a.flo / b.flo, a.flo / b.fhi, a.fhi / b.flo, a.fhi / b.fhi, nan);
  case IR_MOD_F: {
    if (has_zero(b) || has_inf(a)) return abs_top(IT_F32);
    double m = fmax(fabs(b.flo), fabs(b.fhi)); /* |r| < |b|, |r| <= |a|, sign of a */
    return abs_flt(a.flo >= 0 ? 0.0 : fmax(a.flo, -m), a.fhi <= 0 ? 0.0 : fmin(a.fhi, m), nan);
  }
  case IR_MIN_F: case IR_MAX_F: return tf_minmax_f(op, a, b);
  default: return abs_top(IT_F32);
  }
}

/* ---- leaves and loads ------------------------------------------------------- */

/* Unknown value of a buffer's element type. */
static IrAbs load_top(DType dt) {
  switch (dt) {
  case DT_F32: case DT_F16: case DT_BF16: return abs_top(IT_F32);
  case DT_U8: return abs_int(0, 255);
  case DT_BOOL: return abs_bool(true, true);
  default: return abs_top(IT_I32);
  }
}

/* One element, read by the interpreter's own loader; false when it fails
 * (an i64 that does not fit, say). */
static bool load_at(const IrModule *m, const IrIntervalEnv *env, const IrInst *in,
                    const int64_t *idx, IrVal *out) {
  IrEnv e;
  memset(&e, 0, sizeof e);
  e.bufs = env->bufs;
  e.mod = m;
  IrInst li = *in;
  IrVal vals[IR_MAXDIMS];
  for (int d = 0; d < in->nargs; d++) {
    li.args[d] = d;
    vals[d] = ir_vi((int32_t)idx[d]);
  }
  *out = ir_load(&e, &li, vals);
  return !e.failed;
}

/* A load: exact when every index is one value; a `sorted` buffer is
 * bounded by its values at the index range's end points; else its dtype. */
static IrAbs tf_load(const IrModule *m, const IrIntervalEnv *env, const IrInst *in,
                     const IrAbs *vals) {
  const IrBuffer *buf = &m->buffers[in->aux];
  IrAbs top = load_top(buf->dtype);
  if (!env->bufs || !env->bufs[in->aux].data) return top;
  const IrBufView *bv = &env->bufs[in->aux];
  if (bv->ndims != in->nargs) return top;
  int64_t lo[IR_MAXDIMS], hi[IR_MAXDIMS];
  bool point = true;
  for (int d = 0; d < in->nargs; d++) {
    IrAbs ix = vals[in->args[d]];
    if (ix.lo < 0 || ix.hi >= bv->shape[d]) return top; /* may be out of range */
    lo[d] = ix.lo;
    hi[d] = ix.hi;
    point = point && ix.lo == ix.hi;
  }
  IrVal vlo, vhi;
  if (point) return load_at(m, env, in, lo, &vlo) ? abs_point((IrType)in->type, vlo) : top;
  if (!buf->sorted || in->nargs != 1 || in->type != IT_I32) return top;
  if (!load_at(m, env, in, lo, &vlo) || !load_at(m, env, in, hi, &vhi)) return top;
  if (vlo.i > vhi.i) return top; /* a broken promise: stay sound */
  return abs_int(vlo.i, vhi.i);
}

static IrAbs tf_leaf(const IrIntervalEnv *env, const IrInst *in,
                     const IrAbs *args) {
  IrType t = (IrType)in->type;
  switch ((IrOp)in->op) {
  case IR_CONST: return abs_point(t, in->imm);
  case IR_ARG: return args[in->aux];
  case IR_PARAM: return env->params ? abs_point(t, env->params[in->aux]) : abs_top(t);
  case IR_SIZE: return env->sizes ? abs_int(env->sizes[in->aux], env->sizes[in->aux])
                                  : abs_int(0, INT32_MAX);
  default: return abs_top(t);
  }
}

/* ---- the evaluator ----------------------------------------------------------- */

/* Operand type of an instruction (the first operand's for mixed ops). */
static IrType arg_type(const IrFunc *f, const IrInst *in, int k) {
  return (IrType)f->inst[in->args[k]].type;
}

static IrAbs transfer(const IrModule *m, const IrIntervalEnv *env, const IrFunc *f,
                      const IrInst *in, const IrAbs *vals, const IrAbs *args) {
  IrOp op = (IrOp)in->op;
  IrType t = (IrType)in->type;
  if (in->nargs == 0 || op == IR_LOAD || op == IR_ACCUM)
    return op == IR_LOAD ? tf_load(m, env, in, vals) : tf_leaf(env, in, args);
  IrAbs a = vals[in->args[0]];
  IrAbs b = in->nargs > 1 ? vals[in->args[1]] : a;
  IrAbs c = in->nargs > 2 ? vals[in->args[2]] : a;
  /* Every operand one value: the interpreter's own answer. */
  IrVal pv[3];
  bool all = true;
  for (int k = 0; k < in->nargs && k < 3; k++)
    all = all && is_point(arg_type(f, in, k), vals[in->args[k]], &pv[k]);
  if (all) return abs_point(t, ir_op_eval(in, pv[0], in->nargs > 1 ? pv[1] : pv[0],
                                          in->nargs > 2 ? pv[2] : pv[0]));
  IrAbs r;
  if (tf_shared(op, a, b, &r)) return r;
  switch (op) {
  case IR_SELECT:
    if (!a.may_false) return b;
    if (!a.may_true) return c;
    return abs_join(t, b, c);
  case IR_LT_F: case IR_LE_F: case IR_EQ_F: case IR_NE_F: return tf_cmp_f(op, a, b);
  default: break;
  }
  if (t == IT_I32) return in->nargs == 1 ? tf_int1(op, a) : abs_top(t);
  if (t == IT_F32) return in->nargs == 2 ? tf_flt2(op, a, b) : tf_flt1(op, a);
  return abs_top(t);
}

/* Mark the instructions the result depends on. */
static void mark_live(const IrFunc *f, bool *live) {
  memset(live, 0, (size_t)f->n * sizeof *live);
  live[f->ret] = true;
  for (int i = f->ret; i >= 0; i--) {
    if (!live[i]) continue;
    for (int k = 0; k < f->inst[i].nargs; k++) live[f->inst[i].args[k]] = true;
  }
}

/* ---- enumeration of one-argument values ---------------------------------------- */

/* An int or bool value that depends on one argument only (q, say), through
 * no load and no float, is evaluated at every value of that argument when
 * its range is small: the exact set, where the per-op rules would lose the
 * correlation between the operands (`x | (x >> 1)`, the deinterleaving of a
 * Morton index). Masks too large for the table (ENUM_CELLS) are left to
 * the per-op rules. */
enum { ENUM_MAX = 256, ENUM_CELLS = 1 << 16 }; /* values per argument; values x instructions */

typedef struct Enum {
  unsigned *deps; /* per instruction: the arguments it depends on (bit ARG_*), LOAD_DEP */
  bool *exact;    /* per instruction: enumerated */
  IrVal *cv[ARG_COUNT]; /* per argument: range x f->n concrete values, or NULL */
} Enum;
#define LOAD_DEP (1u << ARG_COUNT)

static bool enumerable(const IrInst *in) {
  return in->nargs > 0 && in->op != IR_LOAD && in->type != IT_F32 && in->type != IT_VOID;
}

/* Try to give value i its exact set over argument `a` (range [lo, hi]). */
static void enumerate(const IrFunc *f, const IrInst *in, int i, IrArg a, int64_t lo, int64_t hi,
                      Enum *E, IrAbs *vals) {
  IrVal pt[3] = {ir_vi(0), ir_vi(0), ir_vi(0)};
  for (int k = 0; k < in->nargs; k++) { /* each operand: enumerated, the argument, or one value */
    int o = in->args[k];
    const IrInst *oi = &f->inst[o];
    bool arg = oi->op == IR_ARG && oi->aux == (int)a;
    if (!arg && !E->exact[o] && (E->deps[o] || !is_point((IrType)oi->type, vals[o], &pt[k]))) return;
  }
  int64_t n = hi - lo + 1;
  if (!E->cv[a]) E->cv[a] = base_alloc((size_t)n * (size_t)f->n * sizeof(IrVal));
  IrAbs r = {0};
  for (int64_t x = 0; x < n; x++) {
    IrVal *cv = E->cv[a] + x * f->n, op[3] = {pt[0], pt[1], pt[2]};
    for (int k = 0; k < in->nargs; k++) {
      int o = in->args[k];
      const IrInst *oi = &f->inst[o];
      op[k] = oi->op == IR_ARG && oi->aux == (int)a ? ir_vi((int32_t)(lo + x)) : E->exact[o] ? cv[o] : pt[k];
    }
    cv[i] = ir_op_eval(in, op[0], in->nargs > 1 ? op[1] : op[0], in->nargs > 2 ? op[2] : op[0]);
    IrAbs p = abs_point((IrType)in->type, cv[i]);
    r = x ? abs_join((IrType)in->type, r, p) : p;
  }
  vals[i] = r;
  E->exact[i] = true;
}

IrAbs ir_interval_eval(const IrModule *m, const IrFunc *f, const IrIntervalEnv *env,
                       const IrAbs *args, IrAbs *vals) {
  bool stack[256], *live = f->n <= 256 ? stack : base_alloc((size_t)f->n);
  mark_live(f, live);
  Enum E;
  memset(&E, 0, sizeof E);
  E.deps = base_alloc((size_t)f->n * sizeof *E.deps);
  E.exact = base_alloc((size_t)f->n);
  for (int i = 0; i <= f->ret; i++) {
    if (!live[i]) continue;
    const IrInst *in = &f->inst[i];
    vals[i] = transfer(m, env, f, in, vals, args);
    unsigned d = in->op == IR_ARG ? 1u << in->aux : in->op == IR_LOAD ? LOAD_DEP : 0;
    for (int k = 0; k < in->nargs; k++) d |= E.deps[in->args[k]];
    E.deps[i] = d;
    E.exact[i] = false;
    for (int a = ARG_B; a <= ARG_KV; a++) {
      int64_t lo = args[a].lo, hi = args[a].hi;
      if (d == 1u << a && enumerable(in) && hi > lo && hi - lo < ENUM_MAX &&
          (hi - lo + 1) * f->n <= ENUM_CELLS)
        enumerate(f, in, i, (IrArg)a, lo, hi, &E, vals);
    }
  }
  for (int a = 0; a < ARG_COUNT; a++) base_free(E.cv[a]);
  base_free(E.deps);
  base_free(E.exact);
  if (live != stack) base_free(live);
  return vals[f->ret];
}

/* ---- block classification ------------------------------------------------------ */

static FlexBlockClass classify(const IrModule *m, const IrIntervalEnv *env, const int *r, IrAbs *vals) {
  IrAbs args[ARG_COUNT];
  for (int k = 0; k < ARG_COUNT; k++) args[k] = abs_top(k == ARG_S || k == ARG_DT ? IT_F32 : IT_I32);
  args[ARG_B] = abs_int(r[0], r[1]);
  args[ARG_H] = abs_int(r[2], r[3]);
  args[ARG_Q] = abs_int(r[4], r[5]);
  args[ARG_KV] = abs_int(r[6], r[7]);
  IrAbs v = ir_interval_eval(m, m->mask, env, args, vals);
  if (!v.may_true) return FLEX_BLOCK_EMPTY;
  if (!v.may_false) return FLEX_BLOCK_FULL;
  return FLEX_BLOCK_PARTIAL;
}

/* Bit set of the arguments each live instruction depends on. */
static unsigned deps_of(const IrFunc *f, int i, unsigned *deps) {
  const IrInst *in = &f->inst[i];
  unsigned d = in->op == IR_ARG ? 1u << in->aux : 0;
  for (int k = 0; k < in->nargs; k++) d |= deps[in->args[k]];
  return deps[i] = d;
}

/* The divisor of the first `x / d` or `x % d` (d one value >= 2) whose x
 * reads argument `arg`: splitting the arg's range at multiples of d gives
 * pieces on which x / d is one value (grids: row = x / W, col = x % W). */
static int64_t split_divisor(const IrFunc *f, const IrAbs *vals, IrArg arg) {
  unsigned stack[256], *deps = f->n <= 256 ? stack : base_alloc((size_t)f->n * sizeof *deps);
  bool lstack[256], *live = f->n <= 256 ? lstack : base_alloc((size_t)f->n);
  mark_live(f, live);
  int64_t found = 0;
  for (int i = 0; i <= f->ret && !found; i++) {
    deps_of(f, i, deps);
    const IrInst *in = &f->inst[i];
    bool div = in->op == IR_DIV_I || in->op == IR_MOD_I || in->op == IR_FLOORDIV || in->op == IR_FLOORMOD;
    if (!live[i] || !div || !(deps[in->args[0]] & (1u << arg))) continue;
    IrAbs d = vals[in->args[1]];
    if (d.lo == d.hi && (d.lo >= 2 || d.lo <= -2)) found = d.lo < 0 ? -d.lo : d.lo;
  }
  if (deps != stack) base_free(deps);
  if (live != lstack) base_free(live);
  return found;
}

enum { MAX_PIECES = 16 };

/* Split [lo, hi] at multiples of d; returns the piece count (0: too many). */
static int pieces(int lo, int hi, int64_t d, int *cut) {
  int n = 0;
  cut[n++] = lo;
  if (d >= 2 && lo >= 0)
    for (int64_t x = ((int64_t)lo / d + 1) * d; x <= hi; x += d) {
      if (n == MAX_PIECES) return 0;
      cut[n++] = (int)x;
    }
  cut[n] = hi + 1;
  return n;
}

/* A small case split over grid rows, for masks that map q or kv to (x / W,
 * x % W): on each piece the row is one value and the column a plain range. */
static FlexBlockClass split_classify(const IrModule *m, const IrIntervalEnv *env, const int *r,
                            IrAbs *vals) {
  int64_t dq = split_divisor(m->mask, vals, ARG_Q), dk = split_divisor(m->mask, vals, ARG_KV);
  if (!dq && !dk) return FLEX_BLOCK_PARTIAL;
  int cq[MAX_PIECES + 1], ck[MAX_PIECES + 1];
  int nq = pieces(r[4], r[5], dq, cq), nk = pieces(r[6], r[7], dk, ck);
  if (nq == 0 || nk == 0 || nq * nk == 1) return FLEX_BLOCK_PARTIAL;
  bool any_full = false, any_empty = false;
  for (int i = 0; i < nq; i++)
    for (int j = 0; j < nk; j++) {
      int s[8] = {r[0], r[1], r[2], r[3], cq[i], cq[i + 1] - 1, ck[j], ck[j + 1] - 1};
      FlexBlockClass t = classify(m, env, s, vals);
      if (t == FLEX_BLOCK_PARTIAL) return t;
      any_full |= t == FLEX_BLOCK_FULL;
      any_empty |= t == FLEX_BLOCK_EMPTY;
      if (any_full && any_empty) return FLEX_BLOCK_PARTIAL;
    }
  return any_full ? FLEX_BLOCK_FULL : FLEX_BLOCK_EMPTY;
}

FlexBlockClass ir_interval_mask(const IrModule *m, const IrIntervalEnv *env, int b0, int b1, int h0,
                       int h1, int q0, int q1, int kv0, int kv1) {
  if (!m->mask) return FLEX_BLOCK_FULL;
  CHECK(b0 <= b1 && h0 <= h1 && q0 <= q1 && kv0 <= kv1);
  static const IrIntervalEnv none;
  if (!env) env = &none;
  int r[8] = {b0, b1, h0, h1, q0, q1, kv0, kv1};
  IrAbs stack[128], *vals = m->mask->n <= 128 ? stack : base_alloc((size_t)m->mask->n * sizeof *vals);
  FlexBlockClass t = classify(m, env, r, vals);
  if (t == FLEX_BLOCK_PARTIAL) t = split_classify(m, env, r, vals);
  if (vals != stack) base_free(vals);
  return t;
}

/* ---- static facts ------------------------------------------------------------- */

/* Whether some live instruction of the mask satisfies pred (with m). */
static bool mask_has(const IrModule *m, bool (*pred)(const IrModule *, const IrInst *, int),
                     int arg) {
  if (!m->mask) return false;
  const IrFunc *f = m->mask;
  bool stack[256], *live = f->n <= 256 ? stack : base_alloc((size_t)f->n);
  mark_live(f, live);
  bool found = false;
  for (int i = 0; i <= f->ret && !found; i++) found = live[i] && pred(m, &f->inst[i], arg);
  if (live != stack) base_free(live);
  return found;
}

static bool unsorted_load(const IrModule *m, const IrInst *in, int arg) {
  (void)arg;
  return in->op == IR_LOAD && !m->buffers[in->aux].sorted;
}
static bool float_value(const IrModule *m, const IrInst *in, int arg) {
  (void)m, (void)arg;
  return in->type == IT_F32;
}
static bool reads_arg(const IrModule *m, const IrInst *in, int arg) {
  (void)m;
  return in->op == IR_ARG && in->aux == arg;
}

bool ir_interval_decidable(const IrModule *m) { return !mask_has(m, unsorted_load, 0); }

bool ir_interval_device_decidable(const IrModule *m) {
  return !mask_has(m, unsorted_load, 0) && !mask_has(m, float_value, 0);
}

bool ir_interval_uses_arg(const IrModule *m, IrArg arg) { return mask_has(m, reads_arg, (int)arg); }
