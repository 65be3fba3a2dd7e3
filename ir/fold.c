/* fold.c: exact constant folding and algebraic simplification.
 *
 * The function is rebuilt front to back; every instruction goes through
 * add(), which canonicalises it (constants second for commutative ops),
 * evaluates it when all operands are constants, and tries the identities
 * below. A rewrite that builds a new instruction sends it through add() again,
 * so chains like `!(a < b)` -> `b <= a` simplify fully in one pass.
 *
 * Exactness (docs/ir.md has the full list):
 *   - ints wrap at 32 bits and follow the DSL's division rules (ops.def EVAL);
 *   - float results are rounded to binary32 after binary64 evaluation, which
 *     is exactly the device's result for + - * / sqrt and the conversions
 *     (53 >= 2*24 + 2, so the double rounding is innocuous);
 *   - OPF_INEXACT ops (transcendentals) are never folded by ir_fold, because
 *     the device's expf/tanhf/... are not correctly rounded; ir_fold_eval
 *     folds them for `const` values, which are defined that way;
 *   - the sign of a zero is not preserved (x + 0.0 -> x, 0.0 * finite -> 0.0):
 *     the DSL compares values, and -0.0 == 0.0;
 *   - NaN and inf are preserved: x * 0.0 folds only for x known finite,
 *     x - x folds only for ints.
 */
#include <string.h>

#include "ir.h"

/* State of one folding run. */
typedef struct Fold {
  Arena *a;
  IrFunc *out;   /* the function being rebuilt */
  bool all;      /* also fold OPF_INEXACT ops (const evaluation) */
} Fold;

static int add(Fold *F, IrInst in);

/* ---- helpers -------------------------------------------------------------- */

static const IrInst *cst(const Fold *F, int x) {
  const IrInst *in = &F->out->inst[x];
  return in->op == IR_CONST ? in : NULL;
}
static bool is_i(const Fold *F, int x, int32_t v) {
  const IrInst *c = cst(F, x);
  return c && c->type == IT_I32 && c->imm.i == v;
}
/* Compares by value, so 0.0 also matches -0.0 (signs of zero are ignored). */
static bool is_f(const Fold *F, int x, double v) {
  const IrInst *c = cst(F, x);
  return c && c->type == IT_F32 && c->imm.f == v;
}
static bool is_b(const Fold *F, int x, bool v) {
  const IrInst *c = cst(F, x);
  return c && c->type == IT_BOOL && c->imm.b == v;
}
/* A float value that can never be inf or NaN. */
static bool finite(const Fold *F, int x) {
  const IrInst *in = &F->out->inst[x];
  if (in->op == IR_CONST) return isfinite(in->imm.f);
  return in->op == IR_I2F || in->op == IR_B2F;
}

static int konst(Fold *F, IrType t, IrVal v, Loc loc) {
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = IR_CONST;
  in.type = (uint8_t)t;
  in.imm = v;
  if (t == IT_F32) in.imm.f = (double)(float)v.f;
  in.loc = loc;
  return ir_push(F->a, F->out, in);
}

static int mk(Fold *F, IrOp op, IrType t, int n, int x, int y, int z, Loc loc) {
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = (uint16_t)op;
  in.type = (uint8_t)t;
  in.nargs = (uint8_t)n;
  in.args[0] = x;
  in.args[1] = y;
  in.args[2] = z;
  in.loc = loc;
  return add(F, in);
}
static int mk1(Fold *F, IrOp op, IrType t, int x, Loc loc) { return mk(F, op, t, 1, x, 0, 0, loc); }
static int mk2(Fold *F, IrOp op, IrType t, int x, int y, Loc loc) { return mk(F, op, t, 2, x, y, 0, loc); }

/* The negated comparison, exact for every input (NaN included): only
 * equality flips for floats, since !(a < b) is not b <= a when one is NaN. */
static IrOp negated_cmp(IrOp op, bool *swap) {
  *swap = false;
  switch (op) {
  case IR_LT_I: *swap = true; return IR_LE_I;
  case IR_LE_I: *swap = true; return IR_LT_I;
  case IR_EQ_I: return IR_NE_I;
  case IR_NE_I: return IR_EQ_I;
  case IR_EQ_F: return IR_NE_F;
  case IR_NE_F: return IR_EQ_F;
  case IR_EQ_B: return IR_NE_B;
  case IR_NE_B: return IR_EQ_B;
  default: return IR_NOPS;
  }
}

/* ---- simplification --------------------------------------------------------- */

/* --x is x; |x| of |x| or of -x is |x| (ints and floats alike). */
static int simplify_sign(Fold *F, const IrInst *in, IrOp neg, IrOp abs) {
  const IrInst *x = &F->out->inst[in->args[0]];
  if (in->op == neg && x->op == neg) return x->args[0];
  if (in->op == abs && x->op == abs) return in->args[0];
  if (in->op == abs && x->op == neg) return mk1(F, abs, (IrType)in->type, x->args[0], in->loc);
  return -1;
}

/* Identities of integer arithmetic (all exact under wrapping). */
static int simplify_int(Fold *F, const IrInst *in) {
  int x = in->args[0], y = in->args[1];
  IrType t = IT_I32;
  switch ((IrOp)in->op) {
  case IR_ADD_I: if (is_i(F, y, 0)) return x; break;
  case IR_SUB_I:
    if (is_i(F, y, 0)) return x;
    if (x == y) return konst(F, t, ir_vi(0), in->loc);
    if (is_i(F, x, 0)) return mk1(F, IR_NEG_I, t, y, in->loc);
    if (cst(F, y)) {
      int c = konst(F, t, ir_vi(ir_wrap(-(int64_t)cst(F, y)->imm.i)), in->loc);
      return mk2(F, IR_ADD_I, t, x, c, in->loc);
    }
    break;
  case IR_MUL_I:
    if (is_i(F, y, 1)) return x;
    if (is_i(F, y, 0)) return y;
    if (is_i(F, y, -1)) return mk1(F, IR_NEG_I, t, x, in->loc);
    break;
  case IR_DIV_I:
    if (is_i(F, y, 0)) return y; /* x / 0 == 0 */
    if (is_i(F, y, 1)) return x;
    if (is_i(F, y, -1)) return mk1(F, IR_NEG_I, t, x, in->loc);
    break;
  case IR_MOD_I:
    if (is_i(F, y, 0)) return x; /* x % 0 == x */
    if (is_i(F, y, 1) || is_i(F, y, -1)) return konst(F, t, ir_vi(0), in->loc);
    break;
  case IR_MIN_I: case IR_MAX_I: if (x == y) return x; break;
  case IR_BAND:
    if (is_i(F, y, -1) || x == y) return x;
    if (is_i(F, y, 0)) return y;
    break;
  case IR_BOR: if (is_i(F, y, 0) || x == y) return x; break;
  case IR_BXOR:
    if (is_i(F, y, 0)) return x;
    if (x == y) return konst(F, t, ir_vi(0), in->loc);
    break;
  case IR_SHL: case IR_SHR: if (is_i(F, y, 0)) return x; break;
  case IR_NEG_I: case IR_ABS_I: return simplify_sign(F, in, IR_NEG_I, IR_ABS_I);
  default: break;
  }
  return -1;
}

/* Identities of float arithmetic: exact in value (zero signs aside), and
 * NaN/inf preserving. */
static int simplify_float(Fold *F, const IrInst *in) {
  int x = in->args[0], y = in->args[1];
  IrType t = IT_F32;
  switch ((IrOp)in->op) {
  case IR_ADD_F: if (is_f(F, y, 0.0)) return x; break;
  case IR_SUB_F:
    if (is_f(F, y, 0.0)) return x;
    if (is_f(F, x, 0.0)) return mk1(F, IR_NEG_F, t, y, in->loc);
    break;
  case IR_MUL_F:
    if (is_f(F, y, 1.0)) return x;
    if (is_f(F, y, -1.0)) return mk1(F, IR_NEG_F, t, x, in->loc);
    if (is_f(F, y, 0.0) && finite(F, x)) return konst(F, t, ir_vf(0.0), in->loc);
    break;
  case IR_DIV_F:
    if (is_f(F, y, 1.0)) return x;
    if (is_f(F, y, -1.0)) return mk1(F, IR_NEG_F, t, x, in->loc);
    break;
  case IR_MIN_F: case IR_MAX_F: if (x == y) return x; break;
  case IR_NEG_F: case IR_ABS_F: return simplify_sign(F, in, IR_NEG_F, IR_ABS_F);
  case IR_I2F:
    if (F->out->inst[x].op == IR_B2I) return mk1(F, IR_B2F, t, F->out->inst[x].args[0], in->loc);
    break;
  default: break;
  }
  return -1;
}

/* Identities of bool logic and comparisons. */
static int simplify_bool(Fold *F, const IrInst *in) {
  int x = in->args[0], y = in->args[1];
  IrType t = IT_BOOL;
  IrOp op = (IrOp)in->op;
  switch (op) {
  case IR_AND:
    if (is_b(F, y, true) || x == y) return x;
    if (is_b(F, y, false)) return y;
    break;
  case IR_OR:
    if (is_b(F, y, false) || x == y) return x;
    if (is_b(F, y, true)) return y;
    break;
  case IR_NOT: {
    const IrInst *xi = &F->out->inst[x];
    if (xi->op == IR_NOT) return xi->args[0];
    bool swap;
    IrOp neg = negated_cmp((IrOp)xi->op, &swap);
    if (neg != IR_NOPS)
      return mk2(F, neg, t, xi->args[swap], xi->args[!swap], in->loc);
    break;
  }
  case IR_EQ_B:
    if (is_b(F, y, true)) return x;
    if (is_b(F, y, false)) return mk1(F, IR_NOT, t, x, in->loc);
    break;
  case IR_NE_B:
    if (is_b(F, y, false)) return x;
    if (is_b(F, y, true)) return mk1(F, IR_NOT, t, x, in->loc);
    break;
  default: break;
  }
  /* x op x for ints and bools (floats: NaN != NaN). */
  if (x == y && in->nargs == 2) {
    if (op == IR_EQ_I || op == IR_LE_I || op == IR_EQ_B) return konst(F, t, ir_vb(true), in->loc);
    if (op == IR_NE_I || op == IR_LT_I || op == IR_NE_B) return konst(F, t, ir_vb(false), in->loc);
  }
  return -1;
}

static int simplify_select(Fold *F, const IrInst *in) {
  int c = in->args[0], x = in->args[1], y = in->args[2];
  if (cst(F, c)) return cst(F, c)->imm.b ? x : y;
  if (x == y) return x;
  if (in->type == IT_BOOL) {
    if (is_b(F, x, true) && is_b(F, y, false)) return c;
    if (is_b(F, x, false) && is_b(F, y, true)) return mk1(F, IR_NOT, IT_BOOL, c, in->loc);
  }
  if (F->out->inst[c].op == IR_NOT)
    return mk(F, IR_SELECT, (IrType)in->type, 3, F->out->inst[c].args[0], y, x, in->loc);
  return -1;
}

/* int(float(b)) and friends: conversions of bools are exact both ways. */
static int simplify_conv(Fold *F, const IrInst *in) {
  const IrInst *xi = &F->out->inst[in->args[0]];
  if (in->op == IR_F2I && xi->op == IR_B2F) return mk1(F, IR_B2I, IT_I32, xi->args[0], in->loc);
  return -1;
}

/* op(op(x, c1), c2) -> op(x, op(c1, c2)) for associative commutative ops. */
static int reassociate(Fold *F, const IrInst *in) {
  const IrOpInfo *oi = &ir_ops[in->op];
  if (!(oi->flags & OPF_ASSOC) || !cst(F, in->args[1])) return -1;
  const IrInst *xi = &F->out->inst[in->args[0]];
  if (xi->op != in->op || !cst(F, xi->args[1])) return -1;
  IrVal v = ir_op_eval(in, cst(F, xi->args[1])->imm, cst(F, in->args[1])->imm, ir_vi(0));
  int k = konst(F, (IrType)in->type, v, in->loc);
  return mk2(F, (IrOp)in->op, (IrType)in->type, xi->args[0], k, in->loc);
}

static int simplify(Fold *F, const IrInst *in) {
  int r = reassociate(F, in);
  if (r < 0 && in->op == IR_SELECT) r = simplify_select(F, in);
  if (r < 0 && in->op == IR_F2I) r = simplify_conv(F, in);
  if (r < 0 && in->type == IT_I32) r = simplify_int(F, in);
  if (r < 0 && in->type == IT_F32) r = simplify_float(F, in);
  if (r < 0 && in->type == IT_BOOL) r = simplify_bool(F, in);
  return r;
}

/* ---- the pass ----------------------------------------------------------------- */

static bool foldable(const Fold *F, const IrInst *in) {
  int fl = ir_ops[in->op].flags;
  if (fl & (OPF_LEAF | OPF_EFFECT)) return false;
  if (in->op == IR_LOAD || ((fl & OPF_INEXACT) && !F->all)) return false;
  for (int i = 0; i < in->nargs; i++)
    if (!cst(F, in->args[i])) return false;
  return true;
}

/* Append `in` (operands already in F->out) in simplest form; returns the
 * index of its value. */
static int add(Fold *F, IrInst in) {
  if ((ir_ops[in.op].flags & OPF_COMM) && in.nargs == 2) {
    int x = in.args[0], y = in.args[1];
    bool cx = cst(F, x) != NULL, cy = cst(F, y) != NULL;
    if ((cx && !cy) || (cx == cy && x > y)) {
      in.args[0] = y;
      in.args[1] = x;
    }
  }
  if (foldable(F, &in)) {
    IrVal v[3] = {ir_vi(0), ir_vi(0), ir_vi(0)};
    for (int i = 0; i < in.nargs; i++) v[i] = cst(F, in.args[i])->imm;
    return konst(F, (IrType)in.type, ir_op_eval(&in, v[0], v[1], v[2]), in.loc);
  }
  if (!(ir_ops[in.op].flags & (OPF_LEAF | OPF_EFFECT)) && in.op != IR_LOAD) {
    int r = simplify(F, &in);
    if (r >= 0) return r;
  }
  return ir_push(F->a, F->out, in);
}

static void run(Arena *a, IrFunc *f, bool all) {
  IrFunc out = *f;
  out.inst = NULL;
  out.n = out.cap = 0;
  Fold F = {a, &out, all};
  int *map = arena_alloc(a, sizeof(int) * (size_t)(f->n ? f->n : 1));
  for (int i = 0; i < f->n; i++) {
    IrInst in = f->inst[i];
    for (int j = 0; j < in.nargs; j++) in.args[j] = map[in.args[j]];
    map[i] = add(&F, in);
  }
  out.ret = f->ret >= 0 ? map[f->ret] : -1;
  *f = out;
  ir_dce(a, f);
}

void ir_fold(Arena *a, IrFunc *f) { run(a, f, false); }

bool ir_fold_eval(Arena *a, IrFunc *f, IrVal *out) {
  run(a, f, true);
  if (f->ret < 0 || f->inst[f->ret].op != IR_CONST) return false;
  *out = f->inst[f->ret].imm;
  return true;
}
