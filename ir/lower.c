/* lower.c: the checked AST of one kernel -> an IrModule.
 *
 * The module lists every param, buffer and size of the file (slots in
 * declaration order) so that slots mean the same in every kernel. The score
 * and mask functions are built with every user call inlined: a call lowers
 * its arguments in the caller, then the callee's body in a new Frame whose
 * parameters are those values. Lets are lowered once, in order, when their
 * frame is entered (unused ones are left to dead code elimination, but their
 * values are still checked). Consts and const buffer dimensions become the
 * values checking computed (ir_check_values): lowering reports nothing, and
 * whatever it finds wrong is a compiler bug, asserted.
 *
 * Every instruction keeps the Loc of the AST node that produced it; the
 * conversions inserted for promotion keep the Loc of the operand.
 */
#include <string.h>

#include "ir.h"

/* One function body being inlined (or a root: the kernel's score or mask). */
typedef struct Frame {
  const Decl *fn;  /* the function whose body this is; NULL for a mask root */
  int *args;       /* value of each parameter; -1: a root's, created on first use */
  IrArg argbase;   /* roots: the IrArg of parameter 0 (ARG_S or ARG_B) */
  int *lets;       /* value of each let, by position */
  const Expr **sum_of; /* the sums being unrolled here, innermost last ... */
  int *sum_at;     /* ... and the value of each one's index */
  int nsums, sumcap, atcap;
  bool constonly;  /* evaluating a constant: anything else makes it not constant */
  int depth;       /* inlining depth (sema rejects recursion; this is a guard) */
} Frame;

/* State of one lowering. */
typedef struct Lower {
  Arena *a;
  const Program *p;
  IrModule *m;
  IrFunc *f;            /* the function being built */
  bool notconst;        /* const evaluation met something that is not constant */
} Lower;

static int expr(Lower *L, Frame *fr, const Expr *e);

/* ---- helpers -------------------------------------------------------------- */

static IrType irtype(Type t) {
  switch (t) {
  case TY_BOOL: return IT_BOOL;
  case TY_INT: return IT_I32;
  case TY_FLOAT: return IT_F32;
  case TY_ERROR: break;
  }
  PANIC("lowering an expression sema did not type");
}

/* Stamp the location on a new instruction. */
static int at(Lower *L, int v, Loc loc) {
  L->f->inst[v].loc = loc;
  return v;
}
static int op1(Lower *L, IrOp op, int x, Loc loc) { return at(L, ir_op1(L->a, L->f, op, x), loc); }
static int op2(Lower *L, IrOp op, int x, int y, Loc loc) {
  return at(L, ir_op2(L->a, L->f, op, x, y), loc);
}
static int op3(Lower *L, IrOp op, int x, int y, int z, Loc loc) {
  return at(L, ir_op3(L->a, L->f, op, x, y, z), loc);
}
static int leaf(Lower *L, IrOp op, IrType t, int aux, Loc loc) {
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = (uint16_t)op;
  in.type = (uint8_t)t;
  in.aux = aux;
  in.loc = loc;
  return ir_push(L->a, L->f, in);
}
static int konst(Lower *L, IrType t, IrVal v, Loc loc) {
  switch (t) {
  case IT_BOOL: return at(L, ir_const_b(L->a, L->f, v.b), loc);
  case IT_I32: return at(L, ir_const_i(L->a, L->f, v.i), loc);
  case IT_F32: return at(L, ir_const_f(L->a, L->f, v.f), loc);
  case IT_VOID: break;
  }
  PANIC("void constant");
}

/* Convert a value to type `to` (promotion, float(), int()). */
static int convert(Lower *L, int v, IrType to, Loc loc) {
  IrType from = (IrType)L->f->inst[v].type;
  if (from == to) return v;
  if (from == IT_I32 && to == IT_F32) return op1(L, IR_I2F, v, loc);
  if (from == IT_BOOL && to == IT_F32) return op1(L, IR_B2F, v, loc);
  if (from == IT_BOOL && to == IT_I32) return op1(L, IR_B2I, v, loc);
  if (from == IT_F32 && to == IT_I32) return op1(L, IR_F2I, v, loc);
  PANIC("no conversion from %s to %s", ir_type_name(from), ir_type_name(to));
}

/* An operand lowered and converted to `t`. */
static int operand(Lower *L, Frame *fr, const Expr *e, IrType t) {
  return convert(L, expr(L, fr, e), t, e->loc);
}

/* A param's or buffer's slot: its position among the file's declarations
 * of its kind (Decl.index). */
static int slot_of(const Decl *d, int n) {
  CHECK(d->index >= 0 && d->index < n);
  return d->index;
}

static int size_slot(const IrModule *m, const char *id) {
  for (int i = SZ_COUNT; i < m->nsizes; i++)
    if (!strcmp(m->sizes[i].id, id)) return i;
  return -1;
}

/* ---- constants -------------------------------------------------------------- */

/* The value of a constant expression (literals, consts, inf, pi and builtins
 * of them): lowered into a scratch function and folded. False when `e`
 * turned out not to be constant. */
static bool eval_const(Lower *L, const Expr *e, IrVal *out) {
  IrFunc *saved = L->f;
  bool saved_nc = L->notconst;
  L->f = ir_func_new(L->a, "const", IRF_SCORE);
  L->notconst = false;
  Frame fr;
  memset(&fr, 0, sizeof fr);
  fr.constonly = true;
  L->f->ret = expr(L, &fr, e);
  bool ok = !L->notconst && ir_fold_eval(L->a, L->f, out);
  L->f = saved;
  L->notconst = saved_nc;
  return ok;
}

bool ir_const_eval(Arena *a, const Program *p, const Expr *e, IrVal *out) {
  Lower L;
  memset(&L, 0, sizeof L);
  L.a = a;
  L.p = p;
  return eval_const(&L, e, out);
}

/* Something a constant cannot contain: note it and stand in a zero. */
static int not_const(Lower *L, IrType t, Loc loc) {
  L->notconst = true;
  return konst(L, t, ir_vi(0), loc);
}

/* A const's value, as checking folded it. */
static int const_ref(Lower *L, const Expr *e) {
  const Expr *v = e->name.decl->cnst.folded;
  CHECK(v && v->type == e->type);
  IrVal x = v->kind == EX_INT ? ir_vi(v->ival) : v->kind == EX_FLOAT ? ir_vf(v->fval) : ir_vb(v->bval);
  return konst(L, irtype(e->type), x, e->loc);
}

/* ---- names ---------------------------------------------------------------- */

static int arg_value(Lower *L, Frame *fr, int i, Loc loc) {
  if (fr->args[i] < 0) {
    IrArg arg = (IrArg)(fr->argbase + i);
    fr->args[i] = leaf(L, IR_ARG, arg == ARG_S ? IT_F32 : IT_I32, arg, loc);
  }
  return fr->args[i];
}

static int let_value(Frame *fr, const Let *let) {
  for (int i = 0; i < fr->fn->fn.nlets; i++)
    if (fr->fn->fn.lets[i] == let) {
      CHECK(fr->lets[i] >= 0);
      return fr->lets[i];
    }
  PANIC("let '%s' is not in the current function", let->id);
}

static int name(Lower *L, Frame *fr, const Expr *e) {
  IrType t = irtype(e->type);
  switch (e->name.ref) {
  case REF_INF: return konst(L, IT_F32, ir_vf(INFINITY), e->loc);
  case REF_PI: return konst(L, IT_F32, ir_vf(3.14159265358979323846), e->loc);
  case REF_CONST: return const_ref(L, e);
  default: break;
  }
  if (fr->constonly) return not_const(L, t, e->loc);
  switch (e->name.ref) {
  case REF_ARG: return arg_value(L, fr, e->name.arg, e->loc);
  case REF_LET: return let_value(fr, e->name.let);
  case REF_PARAM:
    return leaf(L, IR_PARAM, t, slot_of(e->name.decl, L->m->nparams), e->loc);
  case REF_SIZE: return leaf(L, IR_SIZE, IT_I32, e->name.size, e->loc);
  case REF_SUM:
    for (int i = fr->nsums - 1; i >= 0; i--)
      if (fr->sum_of[i] == e->name.sum) return fr->sum_at[i];
    PANIC("sum index '%s' outside its sum", e->name.id);
  case REF_SYM: {
    int s = size_slot(L->m, e->name.decl->buffer.dims[e->name.dim].id);
    CHECK(s >= 0);
    return leaf(L, IR_SIZE, IT_I32, s, e->loc);
  }
  default: break;
  }
  PANIC("name '%s' with reference kind %d in an expression", e->name.id, e->name.ref);
}

/* ---- operators -------------------------------------------------------------- */

/* The IR op for a binary AST op on operands of type t; `swap` for > and >=. */
static IrOp binop(AstOp op, IrType t, bool *swap) {
  bool fl = t == IT_F32, in = t == IT_I32, bo = t == IT_BOOL;
  *swap = op == AOP_GT || op == AOP_GE;
  switch (op) {
  case AOP_ADD: if (in || fl) return fl ? IR_ADD_F : IR_ADD_I; break;
  case AOP_SUB: if (in || fl) return fl ? IR_SUB_F : IR_SUB_I; break;
  case AOP_MUL: if (in || fl) return fl ? IR_MUL_F : IR_MUL_I; break;
  case AOP_DIV: if (in || fl) return fl ? IR_DIV_F : IR_DIV_I; break;
  case AOP_MOD: if (in || fl) return fl ? IR_MOD_F : IR_MOD_I; break;
  case AOP_LT: case AOP_GT: if (in || fl) return fl ? IR_LT_F : IR_LT_I; break;
  case AOP_LE: case AOP_GE: if (in || fl) return fl ? IR_LE_F : IR_LE_I; break;
  case AOP_EQ: return bo ? IR_EQ_B : fl ? IR_EQ_F : IR_EQ_I;
  case AOP_NE: return bo ? IR_NE_B : fl ? IR_NE_F : IR_NE_I;
  case AOP_AND: if (bo) return IR_AND; break;
  case AOP_OR: if (bo) return IR_OR; break;
  case AOP_BAND: return bo ? IR_AND : IR_BAND; /* on bools: logic, both sides evaluated */
  case AOP_BOR: return bo ? IR_OR : IR_BOR;
  case AOP_BXOR: return bo ? IR_NE_B : IR_BXOR;
  case AOP_SHL: if (in) return IR_SHL; break;
  case AOP_SHR: if (in) return IR_SHR; break;
  default: break;
  }
  PANIC("operator %s on %s", astop_spelling(op), ir_type_name(t));
}

static int binary(Lower *L, Frame *fr, const Expr *e) {
  AstOp op = e->op.op;
  IrType t = irtype(e->op.optype);
  bool swap;
  IrOp ir = binop(op, t, &swap);
  int x = operand(L, fr, e->op.a, t);
  int y = operand(L, fr, e->op.b, t);
  return swap ? op2(L, ir, y, x, e->loc) : op2(L, ir, x, y, e->loc);
}

static int unary(Lower *L, Frame *fr, const Expr *e) {
  if (e->op.op == AOP_NOT) return op1(L, IR_NOT, operand(L, fr, e->op.a, IT_BOOL), e->loc);
  if (e->op.op == AOP_BNOT) return op1(L, IR_BNOT, operand(L, fr, e->op.a, IT_I32), e->loc);
  CHECK(e->op.op == AOP_NEG);
  IrType t = irtype(e->op.optype == TY_ERROR ? e->type : e->op.optype);
  return op1(L, t == IT_F32 ? IR_NEG_F : IR_NEG_I, operand(L, fr, e->op.a, t), e->loc);
}

/* ---- calls ------------------------------------------------------------------- */

static IrOp builtin_op(Builtin b) {
  switch (b) {
  case BI_EXP: return IR_EXP;
  case BI_EXP2: return IR_EXP2;
  case BI_LOG: return IR_LOG;
  case BI_LOG2: return IR_LOG2;
  case BI_SQRT: return IR_SQRT;
  case BI_RSQRT: return IR_RSQRT;
  case BI_TANH: return IR_TANH;
  case BI_SIGMOID: return IR_SIGMOID;
  case BI_SIN: return IR_SIN;
  case BI_COS: return IR_COS;
  case BI_FLOOR: return IR_FLOOR;
  case BI_CEIL: return IR_CEIL;
  case BI_ERF: return IR_ERF;
  case BI_POW: return IR_POW;
  case BI_FLOORDIV: return IR_FLOORDIV;
  case BI_FLOORMOD: return IR_FLOORMOD;
  default: return IR_NOPS;
  }
}

/* sum(i, LO, HI, EXPR): EXPR once per i, added up in index order (0 when
 * the range is empty); folding and CSE share what the terms share. */
static int sum(Lower *L, Frame *fr, const Expr *e) {
  IrType t = irtype(e->type);
  int acc = -1;
  ARENA_PUSH(L->a, fr->sum_of, fr->nsums, fr->sumcap, e);
  int n = fr->nsums - 1;
  ARENA_PUSH(L->a, fr->sum_at, n, fr->atcap, -1);
  for (int32_t i = e->call.sum_lo; i < e->call.sum_hi; i++) {
    fr->sum_at[fr->nsums - 1] = konst(L, IT_I32, ir_vi(i), e->call.args[0]->loc);
    int v = operand(L, fr, e->call.args[3], t);
    acc = acc < 0 ? v : op2(L, t == IT_F32 ? IR_ADD_F : IR_ADD_I, acc, v, e->loc);
  }
  fr->nsums--;
  return acc >= 0 ? acc : konst(L, t, t == IT_F32 ? ir_vf(0.0) : ir_vi(0), e->loc);
}

static int builtin(Lower *L, Frame *fr, const Expr *e) {
  Expr **a = e->call.args;
  IrType at = e->call.argtype == TY_ERROR ? irtype(e->type) : irtype(e->call.argtype);
  bool fl = at == IT_F32;
  Loc loc = e->loc;
  switch (e->call.builtin) {
  case BI_ABS: return op1(L, fl ? IR_ABS_F : IR_ABS_I, operand(L, fr, a[0], at), loc);
  case BI_MIN: case BI_MAX: {
    IrOp op = e->call.builtin == BI_MIN ? (fl ? IR_MIN_F : IR_MIN_I) : (fl ? IR_MAX_F : IR_MAX_I);
    return op2(L, op, operand(L, fr, a[0], at), operand(L, fr, a[1], at), loc);
  }
  case BI_CLAMP: {
    int x = operand(L, fr, a[0], at), lo = operand(L, fr, a[1], at);
    int hi = operand(L, fr, a[2], at);
    int m = op2(L, fl ? IR_MAX_F : IR_MAX_I, x, lo, loc);
    return op2(L, fl ? IR_MIN_F : IR_MIN_I, m, hi, loc);
  }
  case BI_WHERE: {
    IrType t = irtype(e->type);
    int c = operand(L, fr, a[0], IT_BOOL);
    int x = operand(L, fr, a[1], t), y = operand(L, fr, a[2], t);
    return op3(L, IR_SELECT, c, x, y, loc);
  }
  case BI_FLOAT: return convert(L, expr(L, fr, a[0]), IT_F32, loc);
  case BI_INT: return convert(L, expr(L, fr, a[0]), IT_I32, loc);
  case BI_SUM: return sum(L, fr, e);
  default: break;
  }
  IrOp op = builtin_op(e->call.builtin);
  if (op == IR_NOPS) PANIC("builtin %d has no lowering", e->call.builtin);
  IrType t = ir_letter_type(ir_ops[op].atype);
  if (ir_ops[op].nargs == 1) return op1(L, op, operand(L, fr, a[0], t), loc);
  return op2(L, op, operand(L, fr, a[0], t), operand(L, fr, a[1], t), loc);
}

/* The body of `fn` with its parameters bound to `args` (NULL: a root, whose
 * parameters are the function's own arguments). */
static int body(Lower *L, const Decl *fn, const int *args, int depth) {
  if (depth > 256) PANIC("inlining '%s' did not terminate", fn->id);
  Frame fr;
  memset(&fr, 0, sizeof fr);
  fr.fn = fn;
  fr.depth = depth;
  fr.argbase = fn->kind == D_SCORE ? ARG_S : ARG_B;
  int n = fn->fn.nparams > 5 ? fn->fn.nparams : 5;
  fr.args = arena_alloc(L->a, sizeof(int) * (size_t)n);
  for (int i = 0; i < n; i++) fr.args[i] = args && i < fn->fn.nparams ? args[i] : -1;
  fr.lets = arena_alloc(L->a, sizeof(int) * (size_t)(fn->fn.nlets + 1));
  for (int i = 0; i < fn->fn.nlets; i++) fr.lets[i] = -1;
  for (int i = 0; i < fn->fn.nlets; i++) fr.lets[i] = expr(L, &fr, fn->fn.lets[i]->value);
  return operand(L, &fr, fn->fn.ret, irtype(fe_return_type(fn)));
}

static int call(Lower *L, Frame *fr, const Expr *e) {
  if (e->call.builtin != BI_NONE) return builtin(L, fr, e);
  if (fr->constonly) return not_const(L, irtype(e->type), e->loc);
  const Decl *fn = e->call.fn;
  CHECK(fn && e->call.nargs == fn->fn.nparams);
  int *args = arena_alloc(L->a, sizeof(int) * (size_t)(fn->fn.nparams + 1));
  for (int i = 0; i < e->call.nargs; i++)
    args[i] = operand(L, fr, e->call.args[i], irtype(fe_param_type(fn, i)));
  return body(L, fn, args, fr->depth + 1);
}

static int load(Lower *L, Frame *fr, const Expr *e) {
  IrType t = irtype(e->type);
  if (fr->constonly) return not_const(L, t, e->loc);
  int slot = slot_of(e->index.buf, L->m->nbuffers);
  CHECK(e->index.nargs == L->m->buffers[slot].ndims);
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = IR_LOAD;
  in.type = (uint8_t)t;
  in.aux = slot;
  in.nargs = (uint8_t)e->index.nargs;
  for (int i = 0; i < e->index.nargs; i++) in.args[i] = operand(L, fr, e->index.args[i], IT_I32);
  in.loc = e->loc;
  L->m->buffers[slot].used = true;
  return ir_push(L->a, L->f, in);
}

static int expr(Lower *L, Frame *fr, const Expr *e) {
  switch (e->kind) {
  case EX_INT: return konst(L, IT_I32, ir_vi(e->ival), e->loc);
  case EX_FLOAT: return konst(L, IT_F32, ir_vf(e->fval), e->loc);
  case EX_BOOL: return konst(L, IT_BOOL, ir_vb(e->bval), e->loc);
  case EX_NAME: return name(L, fr, e);
  case EX_UNARY: return unary(L, fr, e);
  case EX_BINARY: return binary(L, fr, e);
  case EX_COND: {
    IrType t = irtype(e->type);
    int c = operand(L, fr, e->cond.c, IT_BOOL);
    int x = operand(L, fr, e->cond.a, t), y = operand(L, fr, e->cond.b, t);
    return op3(L, IR_SELECT, c, x, y, e->loc);
  }
  case EX_CALL: return call(L, fr, e);
  case EX_INDEX: return load(L, fr, e);
  }
  PANIC("expression kind %d", e->kind);
}

/* ---- the module ------------------------------------------------------------- */

/* One buffer dimension: a fixed extent or a size slot. */
static IrDim lower_dim(Lower *L, const Dim *dim, int j) {
  IrDim r = {-1, 0};
  IrModule *m = L->m;
  switch (dim->kind) {
  case DIM_LIT: r.fixed = dim->value; break;
  case DIM_CONST: CHECK(dim->value > 0); r.fixed = dim->value; break; /* ir_check_values */
  case DIM_SIZE: r.size = dim->size; break;
  case DIM_SYM: {
    r.size = size_slot(m, dim->id);
    if (r.size < 0) {
      IrSize s = {dim->id, m->nbuffers, j}; /* m->nbuffers: the buffer being added */
      int cap = m->nsizes;
      ARENA_PUSH(L->a, m->sizes, m->nsizes, cap, s);
      r.size = m->nsizes - 1;
    }
    break;
  }
  }
  return r;
}

static void add_buffer(Lower *L, const Decl *d) {
  IrModule *m = L->m;
  IrBuffer b;
  memset(&b, 0, sizeof b);
  b.id = d->id;
  b.dtype = d->buffer.dtype;
  b.grad = d->buffer.grad;
  b.sorted = d->buffer.sorted;
  b.loc = d->loc;
  b.ndims = d->buffer.ndims;
  CHECK(b.ndims <= IR_MAXDIMS); /* sema */
  for (int j = 0; j < b.ndims; j++) b.dims[j] = lower_dim(L, &d->buffer.dims[j], j);
  int cap = m->nbuffers;
  ARENA_PUSH(L->a, m->buffers, m->nbuffers, cap, b);
}

/* A module with every param, buffer and size of the file and no functions. */
static IrModule *module_new(Lower *L, const char *kernel) {
  IrModule *m = arena_alloc(L->a, sizeof *m);
  L->m = m;
  m->arena = L->a;
  m->prog = L->p;
  m->kernel = kernel;
  int np = 0;
  for (int i = 0; i < L->p->ndecls; i++) np += L->p->decls[i]->kind == D_PARAM;
  m->params = arena_alloc(L->a, sizeof(IrParam) * (size_t)(np + 1));
  m->sizes = arena_alloc(L->a, sizeof(IrSize) * SZ_COUNT);
  for (int i = 0; i < SZ_COUNT; i++) m->sizes[i] = (IrSize){size_name((SizeName)i), -1, -1};
  m->nsizes = SZ_COUNT;
  for (int i = 0; i < L->p->ndecls; i++) {
    const Decl *d = L->p->decls[i];
    if (d->kind == D_PARAM) {
      CHECK(d->index == m->nparams);
      IrParam *pp = &m->params[m->nparams++];
      pp->id = d->id;
      pp->type = d->param.type == TY_FLOAT ? IT_F32 : IT_I32;
      pp->has_default = d->param.has_default;
      pp->def = pp->type == IT_F32 ? ir_vf(d->param.fdefault) : ir_vi(d->param.idefault);
    } else if (d->kind == D_BUFFER) {
      CHECK(d->index == m->nbuffers);
      add_buffer(L, d);
    }
  }
  return m;
}

/* ---- functions ---------------------------------------------------------------- */

static IrFunc *score_func(Lower *L, const Decl *fn) {
  IrFunc *f = ir_func_new(L->a, fn ? fn->id : "identity", IRF_SCORE);
  L->f = f;
  if (fn) {
    f->ret = body(L, fn, NULL, 0);
  } else {
    Loc none = {0, 0};
    f->ret = leaf(L, IR_ARG, IT_F32, ARG_S, none);
  }
  return f;
}

/* A kernel's mask expression: mask names combined with && || !. */
static int mask_expr(Lower *L, Frame *root, const Expr *e) {
  switch (e->kind) {
  case EX_NAME: {
    CHECK(e->name.ref == REF_MASK);
    int args[4];
    for (int i = 0; i < 4; i++) args[i] = arg_value(L, root, i, e->loc);
    return body(L, e->name.decl, args, 1);
  }
  case EX_UNARY:
    CHECK(e->op.op == AOP_NOT);
    return op1(L, IR_NOT, mask_expr(L, root, e->op.a), e->loc);
  case EX_BINARY: {
    CHECK(e->op.op == AOP_AND || e->op.op == AOP_OR);
    int x = mask_expr(L, root, e->op.a), y = mask_expr(L, root, e->op.b);
    return op2(L, e->op.op == AOP_AND ? IR_AND : IR_OR, x, y, e->loc);
  }
  default: break;
  }
  PANIC("mask expression kind %d", e->kind);
}

static IrFunc *mask_func(Lower *L, const Decl *kernel) {
  const Expr *e = kernel->kernel.mask;
  const char *nm = e->kind == EX_NAME ? e->name.id : kernel->id;
  IrFunc *f = ir_func_new(L->a, nm, IRF_MASK);
  L->f = f;
  Frame root;
  memset(&root, 0, sizeof root);
  root.argbase = ARG_B;
  int args[5] = {-1, -1, -1, -1, -1};
  root.args = args;
  f->ret = mask_expr(L, &root, e);
  return f;
}

/* A kernel's sink function (b, h, q) -> its logit. */
static IrFunc *sink_func(Lower *L, const Decl *fn) {
  IrFunc *f = ir_func_new(L->a, fn->id, IRF_SINK);
  L->f = f;
  f->ret = body(L, fn, NULL, 0);
  return f;
}

IrModule *ir_lower(Arena *a, const Program *p, const Decl *kernel) {
  CHECK(kernel && kernel->kind == D_KERNEL);
  Lower L;
  memset(&L, 0, sizeof L);
  L.a = a;
  L.p = p;
  IrModule *m = module_new(&L, kernel->id);
  m->score = score_func(&L, kernel->kernel.score_fn);
  m->score_is_identity = kernel->kernel.score_fn == NULL;
  m->mask = kernel->kernel.mask ? mask_func(&L, kernel) : NULL;
  m->sink = kernel->kernel.sink_fn ? sink_func(&L, kernel->kernel.sink_fn) : NULL;
  return m;
}
