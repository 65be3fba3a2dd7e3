/* lower.c: the checked AST of one kernel -> an IrModule.
 *
 * The module lists every param, buffer and size of the file (slots in
 * declaration order) so that slots mean the same in every kernel. The score
 * and mask functions are built with every user call inlined: a call lowers
 * its arguments in the caller, then the callee's body in a new Frame whose
 * parameters are those values. Lets are lowered once, in order, when their
 * frame is entered (unused ones are left to dead code elimination, but their
 * errors are still reported). Consts become their value, computed by the
 * folder (ir_fold_eval), and so do const buffer dimensions.
 *
 * Every instruction keeps the Loc of the AST node that produced it; the
 * conversions inserted for promotion keep the Loc of the operand.
 */
#include <string.h>

#include "ir.h"

/* One function body being inlined (or a root: the kernel's score or mask). */
typedef struct Frame {
  const Decl *fn;  /* the function whose body this is; NULL for a mask root */
  int args[5];     /* value of each parameter; -1: a root's, created on first use */
  IrArg argbase;   /* roots: the IrArg of parameter 0 (ARG_S or ARG_B) */
  int *lets;       /* value of each let, by position */
  bool constonly;  /* evaluating a constant: anything else makes it not constant */
  int depth;       /* inlining depth (sema rejects recursion; this is a guard) */
} Frame;

/* A const's value, computed once per lowering. */
typedef struct ConstVal {
  const Decl *decl;
  IrVal v;
} ConstVal;

/* State of one lowering. */
typedef struct Lower {
  Arena *a;
  const Program *p;
  Diags *d;
  IrModule *m;
  IrFunc *f;            /* the function being built */
  const Decl **bufs;    /* buffer slot -> its declaration */
  const Decl **params;  /* param slot -> its declaration */
  uint32_t *reported;   /* start offsets of errors already reported (inlining repeats bodies) */
  size_t nreported, capreported;
  ConstVal *consts;     /* consts evaluated so far */
  size_t nconsts, capconsts;
  int errors;           /* errors reported by this lowering */
  bool quiet;           /* don't report module-level errors (ir_lower_check) */
  bool notconst;        /* const evaluation met something that is not constant */
} Lower;

static int expr(Lower *L, Frame *fr, const Expr *e);

/* ---- helpers -------------------------------------------------------------- */

static void error_at(Lower *L, Loc loc, const char *msg) {
  for (size_t i = 0; i < L->nreported; i++)
    if (L->reported[i] == loc.start) return;
  ARENA_PUSH(L->a, L->reported, L->nreported, L->capreported, loc.start);
  L->errors++;
  diag_error(L->d, loc, "%s", msg);
}

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

static int slot_of(const Decl **decls, int n, const Decl *d) {
  for (int i = 0; i < n; i++)
    if (decls[i] == d) return i;
  PANIC("declaration '%s' has no slot", d->id);
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

static bool const_value(Lower *L, const Decl *c, IrVal *out) {
  for (size_t i = 0; i < L->nconsts; i++)
    if (L->consts[i].decl == c) {
      *out = L->consts[i].v;
      return true;
    }
  if (!eval_const(L, c->cnst.value, out)) return false;
  ConstVal cv = {c, *out};
  ARENA_PUSH(L->a, L->consts, L->nconsts, L->capconsts, cv);
  return true;
}

/* Something a constant cannot contain: note it and stand in a zero. */
static int not_const(Lower *L, IrType t, Loc loc) {
  L->notconst = true;
  return konst(L, t, ir_vi(0), loc);
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
  case REF_CONST: {
    IrVal v;
    if (!const_value(L, e->name.decl, &v)) return not_const(L, t, e->loc);
    return konst(L, t, v, e->loc);
  }
  default: break;
  }
  if (fr->constonly) return not_const(L, t, e->loc);
  switch (e->name.ref) {
  case REF_ARG: return arg_value(L, fr, e->name.arg, e->loc);
  case REF_LET: return let_value(fr, e->name.let);
  case REF_PARAM:
    return leaf(L, IR_PARAM, t, slot_of(L->params, L->m->nparams, e->name.decl), e->loc);
  case REF_SIZE: return leaf(L, IR_SIZE, IT_I32, e->name.size, e->loc);
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
  default: break;
  }
  PANIC("operator %s on %s", astop_spelling(op), ir_type_name(t));
}

/* A divisor that is a compile-time constant zero is an error (at run time
 * x / 0 and x % 0 are defined, so only constant ones are caught). */
static void check_divisor(Lower *L, const Expr *div) {
  IrVal v;
  if (!div->constexpr_ || !eval_const(L, div, &v)) return;
  IrType t = irtype(div->type);
  if ((t == IT_I32 && v.i == 0) || (t == IT_F32 && v.f == 0.0) || (t == IT_BOOL && !v.b))
    error_at(L, div->loc, "division by a constant zero");
}

static int binary(Lower *L, Frame *fr, const Expr *e) {
  AstOp op = e->op.op;
  IrType t = irtype(e->op.optype);
  if (op == AOP_DIV || op == AOP_MOD) check_divisor(L, e->op.b);
  bool swap;
  IrOp ir = binop(op, t, &swap);
  int x = operand(L, fr, e->op.a, t);
  int y = operand(L, fr, e->op.b, t);
  return swap ? op2(L, ir, y, x, e->loc) : op2(L, ir, x, y, e->loc);
}

static int unary(Lower *L, Frame *fr, const Expr *e) {
  if (e->op.op == AOP_NOT) return op1(L, IR_NOT, operand(L, fr, e->op.a, IT_BOOL), e->loc);
  CHECK(e->op.op == AOP_NEG);
  IrType t = irtype(e->op.optype == TY_ERROR ? e->type : e->op.optype);
  return op1(L, t == IT_F32 ? IR_NEG_F : IR_NEG_I, operand(L, fr, e->op.a, t), e->loc);
}

/* ---- calls ------------------------------------------------------------------- */

static IrOp float_builtin(Builtin b) {
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
  case BI_POW: return IR_POW;
  default: return IR_NOPS;
  }
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
  default: break;
  }
  IrOp op = float_builtin(e->call.builtin);
  if (op == IR_NOPS) PANIC("builtin %d has no lowering", e->call.builtin);
  if (ir_ops[op].nargs == 1) return op1(L, op, operand(L, fr, a[0], IT_F32), loc);
  return op2(L, op, operand(L, fr, a[0], IT_F32), operand(L, fr, a[1], IT_F32), loc);
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
  for (int i = 0; i < 5; i++) fr.args[i] = args && i < fn->fn.nparams ? args[i] : -1;
  fr.lets = arena_alloc(L->a, sizeof(int) * (size_t)(fn->fn.nlets + 1));
  for (int i = 0; i < fn->fn.nlets; i++) fr.lets[i] = -1;
  for (int i = 0; i < fn->fn.nlets; i++) fr.lets[i] = expr(L, &fr, fn->fn.lets[i]->value);
  return operand(L, &fr, fn->fn.ret, fn->kind == D_SCORE ? IT_F32 : IT_BOOL);
}

static int call(Lower *L, Frame *fr, const Expr *e) {
  if (e->call.builtin != BI_NONE) return builtin(L, fr, e);
  if (fr->constonly) return not_const(L, irtype(e->type), e->loc);
  const Decl *fn = e->call.fn;
  CHECK(fn && e->call.nargs == fn->fn.nparams && fn->fn.nparams <= 5);
  int args[5];
  for (int i = 0; i < e->call.nargs; i++) {
    IrType t = fn->kind == D_SCORE && i == 0 ? IT_F32 : IT_I32;
    args[i] = operand(L, fr, e->call.args[i], t);
  }
  return body(L, fn, args, fr->depth + 1);
}

static int load(Lower *L, Frame *fr, const Expr *e) {
  IrType t = irtype(e->type);
  if (fr->constonly) return not_const(L, t, e->loc);
  int slot = slot_of(L->bufs, L->m->nbuffers, e->index.buf);
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

static void module_error(Lower *L, Loc loc, const char *msg) {
  if (!L->quiet) error_at(L, loc, msg);
  else L->errors++;
}

/* One buffer dimension: a fixed extent or a size slot. */
static IrDim lower_dim(Lower *L, const Decl *b, Dim *dim, int j) {
  IrDim r = {-1, 0};
  IrModule *m = L->m;
  switch (dim->kind) {
  case DIM_LIT: r.fixed = dim->value; break;
  case DIM_CONST: {
    IrVal v;
    bool isint = dim->cdecl && dim->cdecl->cnst.value->type == TY_INT;
    if (!isint || !const_value(L, dim->cdecl, &v)) {
      module_error(L, dim->loc, arena_printf(L->a, "dimension '%s' is not an integer constant", dim->id));
    } else if (v.i <= 0) {
      module_error(L, dim->loc, arena_printf(L->a, "dimension '%s' of buffer '%s' is %d; it must be positive",
                                             dim->id, b->id, (int)v.i));
    } else {
      dim->value = v.i;
      r.fixed = v.i;
    }
    if (r.fixed < 0) r.fixed = 1;
    break;
  }
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
  if (b.ndims > IR_MAXDIMS) {
    module_error(L, d->loc, arena_printf(L->a, "buffer '%s' has %d dimensions; at most %d are supported",
                                         d->id, b.ndims, IR_MAXDIMS));
    b.ndims = IR_MAXDIMS;
  }
  for (int j = 0; j < b.ndims; j++) b.dims[j] = lower_dim(L, d, &d->buffer.dims[j], j);
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
  int np = 0, nb = 0;
  for (int i = 0; i < L->p->ndecls; i++) {
    np += L->p->decls[i]->kind == D_PARAM;
    nb += L->p->decls[i]->kind == D_BUFFER;
  }
  m->params = arena_alloc(L->a, sizeof(IrParam) * (size_t)(np + 1));
  L->params = arena_alloc(L->a, sizeof(Decl *) * (size_t)(np + 1));
  L->bufs = arena_alloc(L->a, sizeof(Decl *) * (size_t)(nb + 1));
  m->sizes = arena_alloc(L->a, sizeof(IrSize) * SZ_COUNT);
  for (int i = 0; i < SZ_COUNT; i++) m->sizes[i] = (IrSize){size_name((SizeName)i), -1, -1};
  m->nsizes = SZ_COUNT;
  for (int i = 0; i < L->p->ndecls; i++) {
    const Decl *d = L->p->decls[i];
    if (d->kind == D_PARAM) {
      IrParam *pp = &m->params[m->nparams];
      L->params[m->nparams++] = d;
      pp->id = d->id;
      pp->type = d->param.type == TY_FLOAT ? IT_F32 : IT_I32;
      pp->has_default = d->param.has_default;
      pp->def = pp->type == IT_F32 ? ir_vf(d->param.fdefault) : ir_vi(d->param.idefault);
    } else if (d->kind == D_BUFFER) {
      L->bufs[m->nbuffers] = d;
      add_buffer(L, d);
    }
  }
  return m;
}

static void lower_init(Lower *L, Arena *a, const Program *p, Diags *d) {
  memset(L, 0, sizeof *L);
  L->a = a;
  L->p = p;
  L->d = d;
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
  for (int i = 0; i < 5; i++) root.args[i] = -1;
  f->ret = mask_expr(L, &root, e);
  return f;
}

IrModule *ir_lower(Arena *a, const Program *p, const Decl *kernel, Diags *d) {
  CHECK(kernel && kernel->kind == D_KERNEL);
  Lower L;
  lower_init(&L, a, p, d);
  IrModule *m = module_new(&L, kernel->id);
  m->score = score_func(&L, kernel->kernel.score_fn);
  m->score_is_identity = kernel->kernel.score_fn == NULL;
  m->mask = kernel->kernel.mask ? mask_func(&L, kernel) : NULL;
  return L.errors ? NULL : m;
}

int ir_lower_check_all(Arena *a, const Program *p, Diags *d) {
  int before = d->errors;
  for (int i = 0; i < p->ndecls; i++) {
    DeclKind k = p->decls[i]->kind;
    if (k == D_SCORE || k == D_MASK || k == D_CONST || k == D_BUFFER) ir_lower_check(a, p, p->decls[i], d);
  }
  return d->errors - before;
}

int ir_lower_check(Arena *a, const Program *p, const Decl *fn, Diags *d) {
  Lower L;
  lower_init(&L, a, p, d);
  L.quiet = fn->kind != D_BUFFER;
  module_new(&L, "check");
  int module_errors = L.errors;
  L.quiet = false;
  if (fn->kind == D_SCORE) score_func(&L, fn);
  else if (fn->kind == D_MASK) {
    L.f = ir_func_new(a, fn->id, IRF_MASK);
    L.f->ret = body(&L, fn, NULL, 0);
  } else if (fn->kind == D_CONST) {
    IrVal v;
    const_value(&L, fn, &v);
  }
  return fn->kind == D_BUFFER ? L.errors : L.errors - module_errors;
}
