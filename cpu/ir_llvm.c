/* ir_llvm.c: cpu_lower(): flexc's SSA IR to LLVM IR through the LLVM C API.
 *
 * Each IR function becomes a tile function (cpu.h): a loop over the rows and
 * keys of a tile whose body is the function, one LLVM value per IR
 * instruction, so LLVM's loop vectoriser can turn a row of keys into SIMD
 * code for the host. The tile pointer is `noalias` and FlexParams
 * `noalias readonly`, so params, sizes and buffer bases are hoisted out of
 * the loops and buffer reads become gathers.
 *
 * Op -> LLVM, one case per ops.def entry (lower_op):
 *   integer + - * neg abs     plain wrapping add/sub/mul (no nsw)
 *   div.i / mod.i             sdiv/srem behind selects: x/0 = 0, x%0 = x, /-1 negates
 *   f2i                       llvm.fptosi.sat.i32.f32 (saturating, NaN -> 0)
 *   min.f / max.f             llvm.minnum / llvm.maxnum (fminf / fmaxf)
 *   abs.f sqrt floor ceil     llvm.fabs / llvm.sqrt / llvm.floor / llvm.ceil
 *   mod.f                     frem (fmodf)
 *   exp exp2 log log2 sigmoid (as e^-|x| / (1 + e^-|x|) below 0)
 *                             inline polynomials (lower_math below: Cephes-style,
 *                             1-2 ulp, special values handled by selects), so
 *                             that rows vectorise; checked by check_cpu_math
 *   tanh sin cos erf          pure calls of ours naming vector variants (cpu/kern.h),
 *                             which the loop vectoriser calls
 *   pow                       a pure call of libm's powf naming glibc's libmvec
 *                             variants where the JIT found it (vector_call)
 *   bnot band bor bxor        not / and / or / xor
 *   shl / shr                 shl / ashr behind a select: a count outside 0..31 acts as 32
 *   floordiv / floormod       div.i / mod.i, then one step toward minus infinity
 *                             when the remainder is nonzero and the signs differ
 *   rsqrt                     1 / llvm.sqrt (correctly rounded quotient, as ops.def's EVAL)
 * An op missing here (a newer ops.def) is refused with its name, never
 * lowered to something else.
 */
#include <llvm-c/Core.h>

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cpu/cpu.h"

/* State of one module's lowering. */
typedef struct Lw {
  LLVMContextRef ctx;   /* the module's context */
  LLVMModuleRef mod;    /* the module being filled */
  LLVMBuilderRef b;     /* the one builder */
  LLVMTypeRef i1, i8, i16, i32, i64, f32, f16, vd, pi8, pf32; /* types used everywhere */
  const IrModule *m;    /* what is lowered */
  const IrFunc *f;      /* the function being lowered */
  bool checked;         /* checked run: buffer indices tested */
  bool identity;        /* the score is the identity: t = s */
  bool exact;           /* ACCUMs go into exact accumulators (cpu_exact_add) */
  LLVMValueRef fn;      /* the LLVM function being built */
  LLVMValueRef p;       /* FlexParams * as i8 * */
  LLVMValueRef acc;     /* float ** accumulators (joint) */
  LLVMValueRef arg[ARG_COUNT]; /* s, b, h, q, kv, dt of the current element */
  LLVMValueRef *v;      /* value of each instruction */
  LLVMValueRef keep[16]; /* vector variants declared (vector_call) */
  int nkeep;            /* how many */
  char *err;            /* message on failure */
  size_t errlen;        /* its capacity */
} Lw;

/* ---- small helpers ------------------------------------------------------------ */

static void add_attr(Lw *w, LLVMValueRef fn, unsigned idx, const char *name);

static LLVMValueRef ci32(Lw *w, int64_t v) { return LLVMConstInt(w->i32, (unsigned long long)v, 1); }
static LLVMValueRef ci64(Lw *w, int64_t v) { return LLVMConstInt(w->i64, (unsigned long long)v, 1); }
static LLVMValueRef cf(Lw *w, double v) { return LLVMConstReal(w->f32, v); }

/* Call an overloaded intrinsic on f32 (or i32 <- f32 for the saturating cast). */
static LLVMValueRef intr(Lw *w, const char *name, LLVMTypeRef ret, LLVMValueRef *a, unsigned n) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  LLVMTypeRef over[2] = {ret, LLVMTypeOf(a[0])};
  unsigned nover = strstr(name, "fptosi") ? 2 : 1;
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(w->mod, id, over, nover);
  LLVMTypeRef ty = LLVMIntrinsicGetType(w->ctx, id, over, nover);
  return LLVMBuildCall2(w->b, ty, fn, a, n, "");
}
static LLVMValueRef intr1(Lw *w, const char *name, LLVMValueRef x) {
  return intr(w, name, w->f32, &x, 1);
}

/* A field of FlexParams at byte offset `off`, of type `ty`. */
static LLVMValueRef pfield(Lw *w, size_t off, LLVMTypeRef ty) {
  LLVMValueRef idx = ci64(w, (int64_t)off);
  LLVMValueRef at = LLVMBuildGEP2(w->b, w->i8, w->p, &idx, 1, "");
  at = LLVMBuildBitCast(w->b, at, LLVMPointerType(ty, 0), "");
  LLVMValueRef ld = LLVMBuildLoad2(w->b, ty, at, "");
  return ld;
}

static LLVMValueRef fmul(Lw *w, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFMul(w->b, a, b, ""); }
static LLVMValueRef fadd(Lw *w, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFAdd(w->b, a, b, ""); }
static LLVMValueRef fsub(Lw *w, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFSub(w->b, a, b, ""); }
static LLVMValueRef sel(Lw *w, LLVMValueRef c, LLVMValueRef a, LLVMValueRef b) {
  return LLVMBuildSelect(w->b, c, a, b, "");
}
static LLVMValueRef fcmp(Lw *w, LLVMRealPredicate p, LLVMValueRef a, LLVMValueRef b) {
  return LLVMBuildFCmp(w->b, p, a, b, "");
}

/* a * b + c as llvm.fmuladd: one FMA where the target has it. */
static LLVMValueRef fma3(Lw *w, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c) {
  return intr(w, "llvm.fmuladd", w->f32, (LLVMValueRef[]){a, b, c}, 3);
}

/* Horner: c[0] * x^(n-1) + ... + c[n-1], one fmuladd a step. */
static LLVMValueRef horner(Lw *w, LLVMValueRef x, const double *c, int n) {
  LLVMValueRef y = cf(w, c[0]);
  for (int i = 1; i < n; i++) y = fma3(w, y, x, cf(w, c[i]));
  return y;
}

/* ---- float builtins as inline polynomials ---------------------------------------- */

/* 2^n for an i32 n in [-126, 127], as a float. */
static LLVMValueRef pow2i(Lw *w, LLVMValueRef n) {
  LLVMValueRef bits = LLVMBuildShl(w->b, LLVMBuildAdd(w->b, n, ci32(w, 127), ""), ci32(w, 23), "");
  return LLVMBuildBitCast(w->b, bits, w->f32, "");
}

/* e^x (base2: 2^x). Cephes expf's reduction x = n ln2 + r and degree-6
 * polynomial; 2^n applied in two halves so that results down to the
 * subnormals come out; overflow gives +inf, NaN stays NaN. */
static LLVMValueRef lower_exp(Lw *w, LLVMValueRef x, bool base2) {
  static const double P[] = {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3,
                             4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1};
  double hi = base2 ? 128.0 : 88.72283935546875, lo = base2 ? -150.0 : -103.972084045410;
  LLVMValueRef xc = intr(w, "llvm.maxnum", w->f32, (LLVMValueRef[]){x, cf(w, lo)}, 2);
  xc = intr(w, "llvm.minnum", w->f32, (LLVMValueRef[]){xc, cf(w, hi)}, 2);
  LLVMValueRef t = base2 ? xc : fmul(w, xc, cf(w, 1.44269504088896341));
  LLVMValueRef nf = intr1(w, "llvm.floor", fadd(w, t, cf(w, 0.5)));
  LLVMValueRef r;
  if (base2) {
    r = fmul(w, fsub(w, xc, nf), cf(w, 0.693147180559945309));
  } else {
    r = fsub(w, xc, fmul(w, nf, cf(w, 0.693359375)));
    r = fsub(w, r, fmul(w, nf, cf(w, -2.12194440e-4)));
  }
  LLVMValueRef y = horner(w, r, P, 6);
  y = fadd(w, fadd(w, fmul(w, fmul(w, y, r), r), r), cf(w, 1.0));
  LLVMValueRef n = LLVMBuildFPToSI(w->b, nf, w->i32, "");
  LLVMValueRef n1 = LLVMBuildAShr(w->b, n, ci32(w, 1), "");
  LLVMValueRef n2 = LLVMBuildSub(w->b, n, n1, "");
  y = fmul(w, fmul(w, y, pow2i(w, n1)), pow2i(w, n2));
  y = sel(w, fcmp(w, LLVMRealOGT, x, cf(w, hi)), cf(w, INFINITY), y);
  y = sel(w, fcmp(w, LLVMRealOLT, x, cf(w, lo)), cf(w, 0.0), y);
  return sel(w, fcmp(w, LLVMRealUNO, x, x), x, y);
}

/* ln x (base2: log2 x). Cephes logf: x = m 2^e with m in [sqrt(.5), sqrt(2)),
 * degree-9 polynomial in m - 1; subnormals pre-scaled by 2^23; 0 -> -inf,
 * negative -> NaN, +inf -> +inf, NaN -> NaN. */
static LLVMValueRef lower_log(Lw *w, LLVMValueRef x, bool base2) {
  static const double P[] = {7.0376836292E-2, -1.1514610310E-1, 1.1676998740E-1,
                             -1.2420140846E-1, 1.4249322787E-1, -1.6668057665E-1,
                             2.0000714765E-1, -2.4999993993E-1, 3.3333331174E-1};
  LLVMValueRef sub = fcmp(w, LLVMRealOLT, x, cf(w, 1.17549435e-38));
  LLVMValueRef xs = sel(w, sub, fmul(w, x, cf(w, 8388608.0)), x);
  LLVMValueRef bits = LLVMBuildBitCast(w->b, xs, w->i32, "");
  LLVMValueRef e = LLVMBuildSub(w->b, LLVMBuildAnd(w->b, LLVMBuildLShr(w->b, bits, ci32(w, 23), ""),
                                                   ci32(w, 255), ""), ci32(w, 126), "");
  e = LLVMBuildSub(w->b, e, sel(w, sub, ci32(w, 23), ci32(w, 0)), "");
  LLVMValueRef mb = LLVMBuildOr(w->b, LLVMBuildAnd(w->b, bits, ci32(w, 0x007fffff), ""),
                                ci32(w, 0x3f000000), "");
  LLVMValueRef mant = LLVMBuildBitCast(w->b, mb, w->f32, ""); /* [0.5, 1) */
  LLVMValueRef small = fcmp(w, LLVMRealOLT, mant, cf(w, 0.707106781186547524));
  e = LLVMBuildSub(w->b, e, sel(w, small, ci32(w, 1), ci32(w, 0)), "");
  LLVMValueRef mm = fsub(w, sel(w, small, fadd(w, mant, mant), mant), cf(w, 1.0));
  LLVMValueRef z = fmul(w, mm, mm);
  LLVMValueRef y = fmul(w, fmul(w, horner(w, mm, P, 9), mm), z);
  LLVMValueRef ef = LLVMBuildSIToFP(w->b, e, w->f32, "");
  LLVMValueRef r;
  if (base2) { /* log2: (m - 1 + y - z/2) * log2(e) + e */
    LLVMValueRef t = fadd(w, fsub(w, y, fmul(w, z, cf(w, 0.5))), mm);
    r = fadd(w, fmul(w, t, cf(w, 1.44269504088896341)), ef);
  } else {
    y = fadd(w, y, fmul(w, ef, cf(w, -2.12194440e-4)));
    y = fsub(w, y, fmul(w, z, cf(w, 0.5)));
    r = fadd(w, fadd(w, mm, y), fmul(w, ef, cf(w, 0.693359375)));
  }
  r = sel(w, fcmp(w, LLVMRealOEQ, x, cf(w, INFINITY)), x, r);
  r = sel(w, fcmp(w, LLVMRealOEQ, x, cf(w, 0.0)), cf(w, -INFINITY), r);
  r = sel(w, fcmp(w, LLVMRealOLT, x, cf(w, 0.0)), cf(w, NAN), r);
  return sel(w, fcmp(w, LLVMRealUNO, x, x), x, r);
}

/* 1 / (1 + e^-x), as e / (1 + e) with e = e^x below 0 so that it never
 * overflows on the way to a tiny result. */
static LLVMValueRef lower_sigmoid(Lw *w, LLVMValueRef x) {
  LLVMValueRef e = lower_exp(w, LLVMBuildFNeg(w->b, intr1(w, "llvm.fabs", x), ""), false);
  LLVMValueRef d = fadd(w, cf(w, 1.0), e);
  LLVMValueRef num = sel(w, fcmp(w, LLVMRealOGE, x, cf(w, 0.0)), cf(w, 1.0), e);
  return LLVMBuildFDiv(w->b, num, d, "");
}

/* ---- buffers ------------------------------------------------------------------- */

/* Extent of dimension d of buffer bf as i32. */
static LLVMValueRef extent(Lw *w, const IrBuffer *bf, int d) {
  if (bf->dims[d].fixed >= 0) return ci32(w, bf->dims[d].fixed);
  return pfield(w, offsetof(FlexParams, sizes) + 4 * (size_t)bf->dims[d].size, w->i32);
}

/* Row-major element offset (i64) of the access whose indices are args[first..]. */
static LLVMValueRef offset(Lw *w, const IrInst *in, int first) {
  const IrBuffer *bf = &w->m->buffers[in->aux];
  LLVMValueRef off = LLVMBuildSExt(w->b, w->v[in->args[first]], w->i64, "");
  for (int d = 1; d < bf->ndims; d++) {
    off = LLVMBuildMul(w->b, off, LLVMBuildSExt(w->b, extent(w, bf, d), w->i64, ""), "");
    off = LLVMBuildAdd(w->b, off, LLVMBuildSExt(w->b, w->v[in->args[first + d]], w->i64, ""), "");
  }
  return off;
}

/* Checked runs: `ok` when every index is inside its extent; the record call
 * (cpu_bounds_fail) when `fail` holds. */
static LLVMValueRef index_ok(Lw *w, const IrInst *in, int first) {
  const IrBuffer *bf = &w->m->buffers[in->aux];
  LLVMValueRef ok = LLVMConstInt(w->i1, 1, 0);
  for (int d = 0; d < bf->ndims; d++)
    ok = LLVMBuildAnd(w->b, ok, LLVMBuildICmp(w->b, LLVMIntULT, w->v[in->args[first + d]],
                                               extent(w, bf, d), ""), "");
  return ok;
}

static void record_fail(Lw *w, LLVMValueRef fail, const IrInst *in, int i, int first, int flag) {
  int n = w->m->buffers[in->aux].ndims;
  LLVMBasicBlockRef yes = LLVMAppendBasicBlockInContext(w->ctx, w->fn, "bounds_fail");
  LLVMBasicBlockRef cont = LLVMAppendBasicBlockInContext(w->ctx, w->fn, "bounds_ok");
  LLVMBuildCondBr(w->b, fail, yes, cont);
  LLVMPositionBuilderAtEnd(w->b, yes);
  LLVMTypeRef pi32 = LLVMPointerType(w->i32, 0);
  LLVMTypeRef at[11] = {pi32, w->i32, w->i32, w->i32, w->i32, w->i32, w->i32, w->i32, w->i32, w->i32, w->i32};
  LLVMTypeRef fty = LLVMFunctionType(w->vd, at, 11, 0);
  LLVMValueRef fn = LLVMGetNamedFunction(w->mod, "cpu_bounds_fail");
  if (!fn) fn = LLVMAddFunction(w->mod, "cpu_bounds_fail", fty);
  LLVMValueRef a[11];
  a[0] = pfield(w, offsetof(FlexParams, bounds), pi32);
  a[1] = ci32(w, (((int)w->f->kind << 16) | i) | flag);
  a[2] = ci32(w, n);
  for (int d = 0; d < 8; d++) a[3 + d] = d < n ? w->v[in->args[first + d]] : ci32(w, 0);
  LLVMBuildCall2(w->b, fty, fn, a, 11, "");
  LLVMBuildBr(w->b, cont);
  LLVMPositionBuilderAtEnd(w->b, cont);
}

/* The element at `off` of buffer slot `slot`, as the language's type. */
static LLVMValueRef load_elem(Lw *w, const IrBuffer *bf, int slot, LLVMValueRef off) {
  static const int bits[] = {[DT_F32] = 32, [DT_F16] = 16, [DT_BF16] = 16, [DT_I32] = 32,
                             [DT_I64] = 64, [DT_U8] = 8, [DT_BOOL] = 8};
  LLVMTypeRef et = bf->dtype == DT_F32 ? w->f32 : LLVMIntTypeInContext(w->ctx, (unsigned)bits[bf->dtype]);
  LLVMValueRef base = pfield(w, offsetof(FlexParams, buf) + sizeof(void *) * (size_t)slot, w->pi8);
  base = LLVMBuildBitCast(w->b, base, LLVMPointerType(et, 0), "");
  LLVMValueRef x = LLVMBuildLoad2(w->b, et, LLVMBuildGEP2(w->b, et, base, &off, 1, ""), "");
  switch (bf->dtype) {
  case DT_F32: return x;
  case DT_F16: return LLVMBuildFPExt(w->b, LLVMBuildBitCast(w->b, x, w->f16, ""), w->f32, "");
  case DT_BF16:
    return LLVMBuildBitCast(w->b, LLVMBuildShl(w->b, LLVMBuildZExt(w->b, x, w->i32, ""), ci32(w, 16), ""),
                            w->f32, "");
  case DT_I32: return x;
  case DT_I64: return x; /* the caller truncates (and a checked run tests the range) */
  case DT_U8: return LLVMBuildZExt(w->b, x, w->i32, "");
  case DT_BOOL: return LLVMBuildICmp(w->b, LLVMIntNE, x, LLVMConstInt(w->i8, 0, 0), "");
  }
  return x;
}

static LLVMValueRef lower_load(Lw *w, const IrInst *in, int i) {
  const IrBuffer *bf = &w->m->buffers[in->aux];
  LLVMTypeRef rt = in->type == IT_F32 ? w->f32 : in->type == IT_BOOL ? w->i1 : w->i32;
  if (!w->checked) {
    LLVMValueRef x = load_elem(w, bf, in->aux, offset(w, in, 0));
    return bf->dtype == DT_I64 ? LLVMBuildTrunc(w->b, x, w->i32, "") : x;
  }
  LLVMValueRef ok = index_ok(w, in, 0);
  record_fail(w, LLVMBuildNot(w->b, ok, ""), in, i, 0, 0);
  LLVMBasicBlockRef from = LLVMGetInsertBlock(w->b);
  LLVMBasicBlockRef doit = LLVMAppendBasicBlockInContext(w->ctx, w->fn, "load");
  LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(w->ctx, w->fn, "loaded");
  LLVMBuildCondBr(w->b, ok, doit, join);
  LLVMPositionBuilderAtEnd(w->b, doit);
  LLVMValueRef x = load_elem(w, bf, in->aux, offset(w, in, 0));
  if (bf->dtype == DT_I64) {
    LLVMValueRef t = LLVMBuildTrunc(w->b, x, w->i32, "");
    LLVMValueRef wide = LLVMBuildICmp(w->b, LLVMIntNE, LLVMBuildSExt(w->b, t, w->i64, ""), x, "");
    record_fail(w, wide, in, i, 0, FLEX_BOUNDS_I64);
    x = t;
  }
  LLVMBasicBlockRef end = LLVMGetInsertBlock(w->b);
  LLVMBuildBr(w->b, join);
  LLVMPositionBuilderAtEnd(w->b, join);
  LLVMValueRef phi = LLVMBuildPhi(w->b, rt, "");
  LLVMValueRef vals[2] = {LLVMConstNull(rt), x};
  LLVMBasicBlockRef from2[2] = {from, end};
  LLVMAddIncoming(phi, vals, from2, 2);
  return phi;
}

/* acc[slot][offset] += value (the accumulators are the worker's own); a
 * deterministic backward's acc[slot] is the worker's exact accumulator,
 * added to by cpu_exact_add. */
static void lower_accum(Lw *w, const IrInst *in, int i) {
  LLVMBasicBlockRef join = NULL;
  if (w->checked) {
    LLVMValueRef ok = index_ok(w, in, 1);
    record_fail(w, LLVMBuildNot(w->b, ok, ""), in, i, 1, 0);
    LLVMBasicBlockRef doit = LLVMAppendBasicBlockInContext(w->ctx, w->fn, "accum");
    join = LLVMAppendBasicBlockInContext(w->ctx, w->fn, "accumulated");
    LLVMBuildCondBr(w->b, ok, doit, join);
    LLVMPositionBuilderAtEnd(w->b, doit);
  }
  LLVMValueRef slot = ci64(w, in->aux);
  LLVMValueRef bp = LLVMBuildLoad2(w->b, w->pf32, LLVMBuildGEP2(w->b, w->pf32, w->acc, &slot, 1, ""), "");
  LLVMValueRef off = offset(w, in, 1);
  if (w->exact) {
    LLVMTypeRef at[3] = {w->pf32, w->i64, w->f32};
    LLVMTypeRef fty = LLVMFunctionType(w->vd, at, 3, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(w->mod, "cpu_exact_add");
    if (!fn) fn = LLVMAddFunction(w->mod, "cpu_exact_add", fty);
    LLVMValueRef a[3] = {bp, off, w->v[in->args[0]]};
    LLVMBuildCall2(w->b, fty, fn, a, 3, "");
  } else {
    LLVMValueRef at = LLVMBuildGEP2(w->b, w->f32, bp, &off, 1, "");
    LLVMValueRef old = LLVMBuildLoad2(w->b, w->f32, at, "");
    LLVMBuildStore(w->b, fadd(w, old, w->v[in->args[0]]), at);
  }
  if (join) {
    LLVMBuildBr(w->b, join);
    LLVMPositionBuilderAtEnd(w->b, join);
  }
}

/* ---- one instruction ---------------------------------------------------------------- */

static LLVMValueRef idiv(Lw *w, LLVMValueRef a, LLVMValueRef d, bool mod) {
  LLVMValueRef zero = LLVMBuildICmp(w->b, LLVMIntEQ, d, ci32(w, 0), "");
  LLVMValueRef m1 = LLVMBuildICmp(w->b, LLVMIntEQ, d, ci32(w, -1), "");
  LLVMValueRef safe = sel(w, LLVMBuildOr(w->b, zero, m1, ""), ci32(w, 1), d);
  LLVMValueRef q = mod ? LLVMBuildSRem(w->b, a, safe, "") : LLVMBuildSDiv(w->b, a, safe, "");
  LLVMValueRef neg = LLVMBuildSub(w->b, ci32(w, 0), a, "");
  q = sel(w, m1, mod ? ci32(w, 0) : neg, q);
  return sel(w, zero, mod ? a : ci32(w, 0), q);
}

/* Python's // and % from C's: one step toward minus infinity when the
 * remainder is nonzero and the signs differ (kernels/scalar.cuh). */
static LLVMValueRef floordiv(Lw *w, LLVMValueRef a, LLVMValueRef d, bool mod) {
  LLVMValueRef q = idiv(w, a, d, false), r = idiv(w, a, d, true);
  LLVMValueRef nz = LLVMBuildAnd(w->b, LLVMBuildICmp(w->b, LLVMIntNE, d, ci32(w, 0), ""),
                                 LLVMBuildICmp(w->b, LLVMIntNE, r, ci32(w, 0), ""), "");
  LLVMValueRef sd = LLVMBuildICmp(w->b, LLVMIntSLT, d, ci32(w, 0), "");
  LLVMValueRef s1 = LLVMBuildICmp(w->b, LLVMIntSLT, mod ? r : a, ci32(w, 0), "");
  LLVMValueRef adj = LLVMBuildAnd(w->b, nz, LLVMBuildICmp(w->b, LLVMIntNE, s1, sd, ""), "");
  return mod ? sel(w, adj, LLVMBuildAdd(w->b, r, d, ""), r) : sel(w, adj, LLVMBuildSub(w->b, q, ci32(w, 1), ""), q);
}

/* A pure call of the float function `name` of n float arguments (libm's
 * powf; our cpu_tanhf_16, ...). */
static LLVMValueRef pure_call(Lw *w, const char *name, LLVMValueRef *x, unsigned n) {
  LLVMTypeRef args[2] = {w->f32, w->f32};
  LLVMTypeRef fty = LLVMFunctionType(w->f32, args, n, 0);
  LLVMValueRef fn = LLVMGetNamedFunction(w->mod, name);
  if (!fn) {
    fn = LLVMAddFunction(w->mod, name, fty);
    add_attr(w, fn, LLVMAttributeFunctionIndex, "nounwind");
    add_attr(w, fn, LLVMAttributeFunctionIndex, "readnone");
    add_attr(w, fn, LLVMAttributeFunctionIndex, "willreturn");
  }
  return LLVMBuildCall2(w->b, fty, fn, x, n, "");
}

/* The vector variant of the float function `base` on `lanes` lanes, in
 * out: ours (cpu_<base>_v<lanes>, cpu/kern.h), or with `mvec` glibc's
 * libmvec one (_ZGV<isa>N<lanes><v per argument>_<base>f, isa b for 4
 * lanes (SSE), d for 8 (AVX2), e for 16 (AVX-512)), false where the JIT
 * did not find the library. */
static bool variant_name(const char *base, bool mvec, unsigned nargs, int lanes, char *out,
                         size_t cap) {
  if (!mvec) {
    snprintf(out, cap, "cpu_%s_v%d", base, lanes);
    return true;
  }
  if (!cpu_jit_mvec()) return false;
  snprintf(out, cap, "_ZGV%cN%d%s_%sf", lanes == 4 ? 'b' : lanes == 8 ? 'd' : 'e', lanes,
           nargs == 2 ? "vv" : "v", base);
  return true;
}

/* A pure call of `name` naming the vector variants of `base` for the loop
 * vectoriser (LLVM's vector function ABI: _ZGV_LLVM_N<lanes><v per
 * argument>_name), up to the host's width (cpu_jit_lanes), so that a row
 * of keys calls one on 4, 8 or 16 scores at a time; the variants are
 * declared here and kept by keep_variants, as LLVM's own library mappings
 * are. Which functions go where (lower_op):
 *   tanh, sin, cos, erf  ours (cpu/kern.h: written once, the scalar
 *                        cpu_<f>f_<widest> giving the widest variant's
 *                        bits); tanh skips its exp branch for a vector
 *                        below 0.625, the others compute in double
 *   pow                  libm's powf and libmvec's variants (0.62 ulp at
 *                        worst over 13M arguments); libmvec's sinf (2.1
 *                        ulp) and erff (2.3 to 4.0) are less accurate than
 *                        check_cpu's 2 ulp, hence ours. */
static LLVMValueRef vector_call(Lw *w, const char *name, LLVMValueRef *x, unsigned n,
                                const char *base, bool mvec) {
  LLVMValueRef call = pure_call(w, name, x, n);
  char names[512] = "";
  size_t at = 0;
  for (int lanes = 4; lanes <= cpu_jit_lanes(); lanes *= 2) {
    char vn[64];
    if (!variant_name(base, mvec, n, lanes, vn, sizeof vn)) continue;
    if (!LLVMGetNamedFunction(w->mod, vn)) {
      LLVMTypeRef vt = LLVMVectorType(w->f32, (unsigned)lanes), vargs[2] = {vt, vt};
      LLVMValueRef f = LLVMAddFunction(w->mod, vn, LLVMFunctionType(vt, vargs, n, 0));
      if (w->nkeep < (int)(sizeof w->keep / sizeof *w->keep)) w->keep[w->nkeep++] = f;
    }
    at += (size_t)snprintf(names + at, sizeof names - at, "%s_ZGV_LLVM_N%d%s_%s(%s)", at ? "," : "",
                           lanes, n == 2 ? "vv" : "v", name, vn);
  }
  if (at) {
    const char *key = "vector-function-abi-variant";
    LLVMAddCallSiteAttribute(call, LLVMAttributeFunctionIndex,
                             LLVMCreateStringAttribute(w->ctx, key, (unsigned)strlen(key), names,
                                                       (unsigned)at));
  }
  return call;
}

/* Ours: the scalar function of the JIT's width and its variants. */
static LLVMValueRef our_call(Lw *w, const char *base, LLVMValueRef x) {
  char name[32];
  snprintf(name, sizeof name, "cpu_%sf_%d", base, cpu_jit_lanes());
  return vector_call(w, name, &x, 1, base, false);
}

static LLVMValueRef minmax_i(Lw *w, LLVMValueRef a, LLVMValueRef b, bool mx) {
  return sel(w, LLVMBuildICmp(w->b, mx ? LLVMIntSGT : LLVMIntSLT, a, b, ""), a, b);
}

/* The value of instruction i; NULL (with err set) for an op this backend does not know. */
static LLVMValueRef lower_op(Lw *w, int i) {
  const IrInst *in = &w->f->inst[i];
  LLVMValueRef a = in->nargs > 0 ? w->v[in->args[0]] : NULL;
  LLVMValueRef c = in->nargs > 1 ? w->v[in->args[1]] : NULL;
  LLVMBuilderRef B = w->b;
  switch ((IrOp)in->op) {
  case IR_CONST:
    if (in->type == IT_BOOL) return LLVMConstInt(w->i1, in->imm.b, 0);
    if (in->type == IT_I32) return ci32(w, in->imm.i);
    return cf(w, in->imm.f);
  case IR_ARG: return w->arg[in->aux];
  case IR_PARAM:
    if (in->type == IT_F32) return pfield(w, offsetof(FlexParams, pf) + 4 * (size_t)in->aux, w->f32);
    return pfield(w, offsetof(FlexParams, pi) + 4 * (size_t)in->aux, w->i32);
  case IR_SIZE: return pfield(w, offsetof(FlexParams, sizes) + 4 * (size_t)in->aux, w->i32);
  case IR_LOAD: return lower_load(w, in, i);
  case IR_ACCUM: lower_accum(w, in, i); return LLVMConstInt(w->i1, 0, 0);
  case IR_NEG_I: return LLVMBuildSub(B, ci32(w, 0), a, "");
  case IR_NEG_F: return LLVMBuildFNeg(B, a, "");
  case IR_NOT: return LLVMBuildNot(B, a, "");
  case IR_I2F: return LLVMBuildSIToFP(B, a, w->f32, "");
  case IR_B2F: return LLVMBuildUIToFP(B, a, w->f32, "");
  case IR_B2I: return LLVMBuildZExt(B, a, w->i32, "");
  case IR_F2I: return intr(w, "llvm.fptosi.sat", w->i32, &a, 1);
  case IR_ABS_I: return sel(w, LLVMBuildICmp(B, LLVMIntSLT, a, ci32(w, 0), ""), LLVMBuildSub(B, ci32(w, 0), a, ""), a);
  case IR_ABS_F: return intr1(w, "llvm.fabs", a);
  case IR_EXP: return lower_exp(w, a, false);
  case IR_EXP2: return lower_exp(w, a, true);
  case IR_LOG: return lower_log(w, a, false);
  case IR_LOG2: return lower_log(w, a, true);
  case IR_SQRT: return intr1(w, "llvm.sqrt", a);
  case IR_RSQRT: return LLVMBuildFDiv(B, cf(w, 1.0), intr1(w, "llvm.sqrt", a), "");
  case IR_TANH: return our_call(w, "tanh", a);
  case IR_SIGMOID: return lower_sigmoid(w, a);
  case IR_SIN: return our_call(w, "sin", a);
  case IR_COS: return our_call(w, "cos", a);
  case IR_FLOOR: return intr1(w, "llvm.floor", a);
  case IR_CEIL: return intr1(w, "llvm.ceil", a);
  case IR_ADD_I: return LLVMBuildAdd(B, a, c, "");
  case IR_SUB_I: return LLVMBuildSub(B, a, c, "");
  case IR_MUL_I: return LLVMBuildMul(B, a, c, "");
  case IR_DIV_I: return idiv(w, a, c, false);
  case IR_MOD_I: return idiv(w, a, c, true);
  case IR_MIN_I: return minmax_i(w, a, c, false);
  case IR_MAX_I: return minmax_i(w, a, c, true);
  case IR_ADD_F: return fadd(w, a, c);
  case IR_SUB_F: return fsub(w, a, c);
  case IR_MUL_F: return fmul(w, a, c);
  case IR_DIV_F: return LLVMBuildFDiv(B, a, c, "");
  case IR_MOD_F: return LLVMBuildFRem(B, a, c, "");
  case IR_MIN_F: return intr(w, "llvm.minnum", w->f32, (LLVMValueRef[]){a, c}, 2);
  case IR_MAX_F: return intr(w, "llvm.maxnum", w->f32, (LLVMValueRef[]){a, c}, 2);
  case IR_POW: return vector_call(w, "powf", (LLVMValueRef[]){a, c}, 2, "pow", true);
  case IR_LT_I: return LLVMBuildICmp(B, LLVMIntSLT, a, c, "");
  case IR_LE_I: return LLVMBuildICmp(B, LLVMIntSLE, a, c, "");
  case IR_EQ_I: return LLVMBuildICmp(B, LLVMIntEQ, a, c, "");
  case IR_NE_I: return LLVMBuildICmp(B, LLVMIntNE, a, c, "");
  case IR_LT_F: return fcmp(w, LLVMRealOLT, a, c);
  case IR_LE_F: return fcmp(w, LLVMRealOLE, a, c);
  case IR_EQ_F: return fcmp(w, LLVMRealOEQ, a, c);
  case IR_NE_F: return fcmp(w, LLVMRealUNE, a, c);
  case IR_EQ_B: return LLVMBuildICmp(B, LLVMIntEQ, a, c, "");
  case IR_NE_B: return LLVMBuildICmp(B, LLVMIntNE, a, c, "");
  case IR_AND: return LLVMBuildAnd(B, a, c, "");
  case IR_OR: return LLVMBuildOr(B, a, c, "");
  case IR_SELECT: return sel(w, a, c, w->v[in->args[2]]);
  case IR_BNOT: return LLVMBuildNot(B, a, "");
  case IR_BAND: return LLVMBuildAnd(B, a, c, "");
  case IR_BOR: return LLVMBuildOr(B, a, c, "");
  case IR_BXOR: return LLVMBuildXor(B, a, c, "");
  case IR_SHL: /* a count outside 0..31 acts as 32: 0 */
    return sel(w, LLVMBuildICmp(B, LLVMIntULT, c, ci32(w, 32), ""),
               LLVMBuildShl(B, a, LLVMBuildAnd(B, c, ci32(w, 31), ""), ""), ci32(w, 0));
  case IR_SHR: /* arithmetic; a count outside 0..31 acts as 32: the sign */
    return LLVMBuildAShr(B, a, sel(w, LLVMBuildICmp(B, LLVMIntULT, c, ci32(w, 32), ""), c, ci32(w, 31)), "");
  case IR_FLOORDIV: return floordiv(w, a, c, false);
  case IR_FLOORMOD: return floordiv(w, a, c, true);
  case IR_ERF: return our_call(w, "erf", a);
  default: break;
  }
  snprintf(w->err, w->errlen, "the cpu backend has no lowering for IR op '%s'", in->op < IR_NOPS ? ir_ops[in->op].name : "?");
  return NULL;
}

/* Lower every instruction of f (values into w->v); the result's value. */
static LLVMValueRef lower_body(Lw *w, const IrFunc *f) {
  w->f = f;
  for (int i = 0; i < f->n; i++)
    if (!(w->v[i] = lower_op(w, i))) return NULL;
  return w->v[f->ret];
}

/* ---- tile functions ------------------------------------------------------------------ */

enum { TF_SCORE, TF_SCORE_MASK, TF_MASK, TF_JOINT, TF_SINK, TF_SINK_GRAD };

/* A counted loop: returns the induction value inside; close with loop_end. */
typedef struct Loop {
  LLVMBasicBlockRef pre, body, exit; /* blocks around the loop */
  LLVMValueRef iv;                   /* the induction phi (i32) */
} Loop;

static Loop loop_begin(Lw *w, LLVMValueRef n, const char *name) {
  Loop l;
  l.pre = LLVMGetInsertBlock(w->b);
  l.body = LLVMAppendBasicBlockInContext(w->ctx, w->fn, name);
  l.exit = LLVMAppendBasicBlockInContext(w->ctx, w->fn, "exit");
  LLVMBuildCondBr(w->b, LLVMBuildICmp(w->b, LLVMIntSGT, n, ci32(w, 0), ""), l.body, l.exit);
  LLVMPositionBuilderAtEnd(w->b, l.body);
  l.iv = LLVMBuildPhi(w->b, w->i32, name);
  return l;
}

static void loop_end(Lw *w, Loop *l, LLVMValueRef n) {
  LLVMValueRef next = LLVMBuildAdd(w->b, l->iv, ci32(w, 1), "");
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(w->b);
  LLVMBuildCondBr(w->b, LLVMBuildICmp(w->b, LLVMIntSLT, next, n, ""), l->body, l->exit);
  LLVMValueRef in[2] = {ci32(w, 0), next};
  LLVMBasicBlockRef from[2] = {l->pre, latch};
  LLVMAddIncoming(l->iv, in, from, 2);
  LLVMPositionBuilderAtEnd(w->b, l->exit);
}

static void add_attr(Lw *w, LLVMValueRef fn, unsigned idx, const char *name) {
  unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
  LLVMAddAttributeAtIndex(fn, idx, LLVMCreateEnumAttribute(w->ctx, kind, 0));
}

static bool build_tile(Lw *w, int kind, const char *name) {
  LLVMTypeRef pi8 = w->pi8, pf = w->pf32;
  LLVMTypeRef ppf = LLVMPointerType(pf, 0);
  LLVMTypeRef at[12];
  int na = 0;
  const bool accums = kind == TF_JOINT || kind == TF_SINK_GRAD;
  at[na++] = kind == TF_MASK ? pi8 : pf; /* the tile */
  if (kind == TF_JOINT) at[na++] = pf, at[na++] = pf; /* S, P */
  int first_int = na;
  at[na++] = w->i64; /* ld */
  for (int k = 0; k < 6; k++) at[na++] = w->i32; /* m n b h q0 kv0 */
  at[na++] = pi8; /* p */
  if (accums) at[na++] = ppf;
  LLVMValueRef fn = w->fn = LLVMAddFunction(w->mod, name, LLVMFunctionType(w->vd, at, (unsigned)na, 0));
  add_attr(w, fn, 1, "noalias");
  add_attr(w, fn, (unsigned)first_int + 8, "noalias");
  add_attr(w, fn, (unsigned)first_int + 8, "readonly");
  add_attr(w, fn, LLVMAttributeFunctionIndex, "nounwind");
  LLVMValueRef tile = LLVMGetParam(fn, 0);
  LLVMValueRef S = kind == TF_JOINT ? LLVMGetParam(fn, 1) : NULL, P = kind == TF_JOINT ? LLVMGetParam(fn, 2) : NULL;
  LLVMValueRef ld = LLVMGetParam(fn, (unsigned)first_int), m = LLVMGetParam(fn, (unsigned)first_int + 1);
  LLVMValueRef n = LLVMGetParam(fn, (unsigned)first_int + 2);
  w->arg[ARG_B] = LLVMGetParam(fn, (unsigned)first_int + 3);
  w->arg[ARG_H] = LLVMGetParam(fn, (unsigned)first_int + 4);
  LLVMValueRef q0 = LLVMGetParam(fn, (unsigned)first_int + 5), kv0 = LLVMGetParam(fn, (unsigned)first_int + 6);
  w->p = LLVMGetParam(fn, (unsigned)first_int + 7);
  w->acc = accums ? LLVMGetParam(fn, (unsigned)first_int + 8) : NULL;
  LLVMPositionBuilderAtEnd(w->b, LLVMAppendBasicBlockInContext(w->ctx, fn, "entry"));
  /* b is the sequence index of a packed call: the launch's offset added (FlexParams.b0). */
  w->arg[ARG_B] = LLVMBuildAdd(w->b, w->arg[ARG_B], pfield(w, offsetof(FlexParams, b0), w->i32), "b");
  /* a shard's positions (FlexParams.q_off, kv_off: 0 unsharded) */
  q0 = LLVMBuildAdd(w->b, q0, pfield(w, offsetof(FlexParams, q_off), w->i32), "q0");
  kv0 = LLVMBuildAdd(w->b, kv0, pfield(w, offsetof(FlexParams, kv_off), w->i32), "kv0");
  Loop li = loop_begin(w, m, "row");
  w->arg[ARG_Q] = LLVMBuildAdd(w->b, q0, li.iv, "q");
  LLVMValueRef rowoff = LLVMBuildMul(w->b, LLVMBuildSExt(w->b, li.iv, w->i64, ""), ld, "");
  Loop lj = loop_begin(w, n, "key");
  w->arg[ARG_KV] = LLVMBuildAdd(w->b, kv0, lj.iv, "kv");
  LLVMValueRef off = LLVMBuildAdd(w->b, rowoff, LLVMBuildSExt(w->b, lj.iv, w->i64, ""), "");
  LLVMTypeRef et = kind == TF_MASK ? w->i8 : w->f32;
  LLVMValueRef at_tile = LLVMBuildGEP2(w->b, et, tile, &off, 1, "");
  LLVMValueRef result = NULL;
  if (kind == TF_MASK) {
    LLVMValueRef k = lower_body(w, w->m->mask);
    if (!k) return false;
    result = LLVMBuildZExt(w->b, k, w->i8, "");
  } else if (kind == TF_SINK) {
    if (!(result = lower_body(w, w->m->sink))) return false;
  } else if (kind == TF_SINK_GRAD) {
    /* The caller runs it only on rows whose sink weight is not 0. */
    w->arg[ARG_DT] = LLVMBuildLoad2(w->b, w->f32, at_tile, "dt");
    if (!lower_body(w, w->m->sink_grad)) return false;
    result = w->arg[ARG_DT];
  } else if (kind == TF_JOINT) {
    /* Elements with P == 0 are skipped by a branch (their ACCUMs must not
     * run); ds is 0 there. */
    LLVMValueRef pv = LLVMBuildLoad2(w->b, w->f32, LLVMBuildGEP2(w->b, w->f32, P, &off, 1, ""), "");
    LLVMBasicBlockRef from = LLVMGetInsertBlock(w->b);
    LLVMBasicBlockRef live = LLVMAppendBasicBlockInContext(w->ctx, fn, "live");
    LLVMBasicBlockRef join = LLVMAppendBasicBlockInContext(w->ctx, fn, "joined");
    LLVMBuildCondBr(w->b, fcmp(w, LLVMRealUNE, pv, cf(w, 0.0)), live, join);
    LLVMPositionBuilderAtEnd(w->b, live);
    w->arg[ARG_S] = LLVMBuildLoad2(w->b, w->f32, LLVMBuildGEP2(w->b, w->f32, S, &off, 1, ""), "s");
    w->arg[ARG_DT] = LLVMBuildLoad2(w->b, w->f32, at_tile, "dt");
    LLVMValueRef ds = lower_body(w, w->m->joint);
    if (!ds) return false;
    LLVMBasicBlockRef end = LLVMGetInsertBlock(w->b);
    LLVMBuildBr(w->b, join);
    LLVMPositionBuilderAtEnd(w->b, join);
    result = LLVMBuildPhi(w->b, w->f32, "ds");
    LLVMValueRef vals[2] = {cf(w, 0.0), ds};
    LLVMBasicBlockRef bbs[2] = {from, end};
    LLVMAddIncoming(result, vals, bbs, 2);
  } else {
    w->arg[ARG_S] = LLVMBuildLoad2(w->b, w->f32, at_tile, "s");
    LLVMValueRef t = w->arg[ARG_S];
    if (!w->identity && !(t = lower_body(w, w->m->score))) return false;
    if (kind == TF_SCORE_MASK) {
      LLVMValueRef k = lower_body(w, w->m->mask);
      if (!k) return false;
      t = sel(w, k, t, cf(w, -INFINITY));
    }
    result = t;
  }
  LLVMBuildStore(w->b, result, at_tile);
  loop_end(w, &lj, n);
  loop_end(w, &li, m);
  LLVMBuildRetVoid(w->b);
  return true;
}

/* The vector variants vector_call declared, in llvm.compiler.used: nothing
 * calls them until the loop vectoriser does, and the passes before it
 * would drop an unused declaration. */
static void keep_variants(Lw *w) {
  if (!w->nkeep) return;
  LLVMValueRef keep[16];
  for (int i = 0; i < w->nkeep; i++) keep[i] = LLVMConstBitCast(w->keep[i], w->pi8);
  LLVMTypeRef at = LLVMArrayType(w->pi8, (unsigned)w->nkeep);
  LLVMValueRef g = LLVMAddGlobal(w->mod, at, "llvm.compiler.used");
  LLVMSetLinkage(g, LLVMAppendingLinkage);
  LLVMSetSection(g, "llvm.metadata");
  LLVMSetInitializer(g, LLVMConstArray(w->pi8, keep, (unsigned)w->nkeep));
}

bool cpu_lower(void *llvm_module, const IrModule *m, const CpuJitOpts *o, const char *prefix,
               char *err, size_t errlen) {
  Lw w;
  memset(&w, 0, sizeof w);
  int n = m->score->n;
  if (m->mask && m->mask->n > n) n = m->mask->n;
  if (m->joint && m->joint->n > n) n = m->joint->n;
  if (m->sink && m->sink->n > n) n = m->sink->n;
  if (m->sink_grad && m->sink_grad->n > n) n = m->sink_grad->n;
  w.v = base_alloc(sizeof(LLVMValueRef) * (size_t)(n + 1)); /* before the builder: nothing to leak */
  w.mod = (LLVMModuleRef)llvm_module;
  w.ctx = LLVMGetModuleContext(w.mod);
  w.b = LLVMCreateBuilderInContext(w.ctx);
  w.i1 = LLVMInt1TypeInContext(w.ctx), w.i8 = LLVMInt8TypeInContext(w.ctx);
  w.i16 = LLVMInt16TypeInContext(w.ctx), w.i32 = LLVMInt32TypeInContext(w.ctx);
  w.i64 = LLVMInt64TypeInContext(w.ctx), w.f32 = LLVMFloatTypeInContext(w.ctx);
  w.f16 = LLVMHalfTypeInContext(w.ctx), w.vd = LLVMVoidTypeInContext(w.ctx);
  w.pi8 = LLVMPointerType(w.i8, 0), w.pf32 = LLVMPointerType(w.f32, 0);
  w.m = m;
  w.checked = o->check_bounds;
  w.err = err, w.errlen = errlen;
  w.identity = o->identity;
  w.exact = o->exact;
  char name[128];
  bool ok = true;
  if (!o->identity) {
    snprintf(name, sizeof name, "%s_score", prefix);
    ok = build_tile(&w, TF_SCORE, name);
  }
  if (ok && m->mask) {
    snprintf(name, sizeof name, "%s_score_mask", prefix);
    ok = build_tile(&w, TF_SCORE_MASK, name);
    snprintf(name, sizeof name, "%s_mask", prefix);
    if (ok) ok = build_tile(&w, TF_MASK, name);
  }
  if (ok && o->joint && m->joint) {
    snprintf(name, sizeof name, "%s_joint", prefix);
    ok = build_tile(&w, TF_JOINT, name);
  }
  if (ok && m->sink) {
    snprintf(name, sizeof name, "%s_sink", prefix);
    ok = build_tile(&w, TF_SINK, name);
  }
  if (ok && o->sink_grad && m->sink_grad) {
    snprintf(name, sizeof name, "%s_sink_grad", prefix);
    ok = build_tile(&w, TF_SINK_GRAD, name);
  }
  if (ok) keep_variants(&w);
  base_free(w.v);
  LLVMDisposeBuilder(w.b);
  return ok;
}
