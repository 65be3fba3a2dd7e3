/* values.c: ir_check_values(), the half of checking that needs values.
 *
 * After names and types (fe_check), every const is evaluated once, with the
 * folder's semantics (ir_const_eval), and its value kept in the AST
 * (Decl.cnst.folded); every const buffer dimension gets its extent
 * (Dim.value). Errors that only a value reveals are reported here, in this
 * order: inside consts (declaration order), then dimensions (buffer order),
 * then function bodies (declaration order, each body once: lets, then the
 * return):
 *
 *   - a divisor of `/` or `%` that is a constant expression equal to zero;
 *   - a const dimension that is not positive;
 *   - the bounds of a sum(i, LO, HI, EXPR) outside 0 <= HI - LO <= 4096
 *     (kept in the call as sum_lo, sum_hi);
 *   - a function too large once its sums are unrolled and its calls
 *     inlined (more than 2^20 expression nodes, the call graph's limit).
 *
 * Lowering then only reads these values and cannot fail on user input.
 */
#include <string.h>

#include "ir.h"

/* State of one check. */
typedef struct Values {
  Arena *a;
  Program *p;
  Diags *d;
} Values;

static void walk(Values *V, const Expr *e);

/* The value of a const, evaluated (and its errors reported) on first use. */
static void need_const(Values *V, Decl *c) {
  if (c->cnst.folded) return;
  walk(V, c->cnst.value);
  IrVal v;
  bool ok = ir_const_eval(V->a, V->p, c->cnst.value, &v);
  CHECK(ok); /* sema: every const is a constant expression */
  Expr *lit = arena_alloc(V->a, sizeof *lit);
  *lit = (Expr){.loc = c->cnst.value->loc, .type = c->cnst.value->type, .constexpr_ = true};
  switch (lit->type) {
  case TY_INT: lit->kind = EX_INT; lit->ival = v.i; break;
  case TY_FLOAT: lit->kind = EX_FLOAT; lit->fval = v.f; break;
  case TY_BOOL: lit->kind = EX_BOOL; lit->bval = v.b; break;
  case TY_ERROR: PANIC("const '%s' has no type", c->id);
  }
  c->cnst.folded = lit;
}

/* A divisor that is a compile-time constant zero is an error (at run time
 * x / 0 and x % 0 are defined, so only constant ones are caught). */
static void check_divisor(Values *V, const Expr *div) {
  IrVal v;
  if (!div->constexpr_ || !ir_const_eval(V->a, V->p, div, &v)) return;
  bool zero = div->type == TY_INT ? v.i == 0 : div->type == TY_FLOAT ? v.f == 0.0 : !v.b;
  if (zero) diag_error(V->d, div->loc, "division by a constant zero");
}

/* The bounds of a sum: int constants with 0 <= HI - LO <= IR_MAX_SUM. */
static void check_sum(Values *V, Expr *e) {
  IrVal lo, hi;
  bool ok = ir_const_eval(V->a, V->p, e->call.args[1], &lo) && ir_const_eval(V->a, V->p, e->call.args[2], &hi);
  CHECK(ok); /* sema: int constant expressions */
  int64_t n = (int64_t)hi.i - lo.i;
  if (n < 0 || n > IR_MAX_SUM) {
    diag_error(V->d, e->loc, "sum runs over %lld values (from %d to %d); HI - LO must be between 0 and %d",
               (long long)n, (int)lo.i, (int)hi.i, IR_MAX_SUM);
    e->call.sum_lo = e->call.sum_hi = 0;
    return;
  }
  e->call.sum_lo = lo.i;
  e->call.sum_hi = hi.i;
}

/* Every value error inside `e`, in evaluation order; a divisor is checked
 * after its own inside and before the dividend. */
static void walk(Values *V, const Expr *e) {
  switch (e->kind) {
  case EX_INT: case EX_FLOAT: case EX_BOOL: return;
  case EX_NAME:
    if (e->name.ref == REF_CONST) need_const(V, e->name.decl);
    return;
  case EX_UNARY: walk(V, e->op.a); return;
  case EX_BINARY:
    if (e->op.op == AOP_DIV || e->op.op == AOP_MOD) {
      walk(V, e->op.b);
      check_divisor(V, e->op.b);
      walk(V, e->op.a);
      return;
    }
    walk(V, e->op.a);
    walk(V, e->op.b);
    return;
  case EX_COND:
    walk(V, e->cond.c);
    walk(V, e->cond.a);
    walk(V, e->cond.b);
    return;
  case EX_CALL:
    for (int i = 0; i < e->call.nargs; i++) walk(V, e->call.args[i]);
    if (e->call.builtin == BI_SUM) check_sum(V, (Expr *)e);
    return;
  case EX_INDEX:
    for (int i = 0; i < e->index.nargs; i++) walk(V, e->index.args[i]);
    return;
  }
  PANIC("expression kind %d", e->kind);
}

static void check_dims(Values *V, const Decl *b) {
  for (int i = 0; i < b->buffer.ndims; i++) {
    Dim *dm = &b->buffer.dims[i];
    if (dm->kind != DIM_CONST) continue;
    need_const(V, dm->cdecl);
    int32_t v = dm->cdecl->cnst.folded->ival;
    if (v <= 0)
      diag_error(V->d, dm->loc, "dimension '%s' of buffer '%s' is %d; it must be positive", dm->id,
                 b->id, (int)v);
    else dm->value = v;
  }
}

static void check_body(Values *V, const Decl *f) {
  for (int i = 0; i < f->fn.nlets; i++) walk(V, f->fn.lets[i]->value);
  if (f->fn.ret) walk(V, f->fn.ret);
}

/* ---- the size of a function once unrolled and inlined ---------------------- */

enum { MAX_UNROLLED = 1 << 20 }; /* the call graph's limit on inlined size */

static int64_t fn_size(Values *V, const Decl *f, int64_t *memo);

/* Expression nodes of `e` with every sum unrolled and every call inlined,
 * saturating just above MAX_UNROLLED. */
static int64_t unrolled(Values *V, const Expr *e, int64_t *memo) {
  int64_t n = 1;
  switch (e->kind) {
  case EX_UNARY: n += unrolled(V, e->op.a, memo); break;
  case EX_BINARY: n += unrolled(V, e->op.a, memo) + unrolled(V, e->op.b, memo); break;
  case EX_COND:
    n += unrolled(V, e->cond.c, memo) + unrolled(V, e->cond.a, memo) + unrolled(V, e->cond.b, memo);
    break;
  case EX_CALL:
    if (e->call.builtin == BI_SUM) {
      int64_t terms = (int64_t)e->call.sum_hi - e->call.sum_lo;
      n += terms * unrolled(V, e->call.args[3], memo);
      break;
    }
    for (int i = 0; i < e->call.nargs; i++) n += unrolled(V, e->call.args[i], memo);
    if (e->call.builtin == BI_NONE) n += fn_size(V, e->call.fn, memo);
    break;
  case EX_INDEX:
    for (int i = 0; i < e->index.nargs; i++) n += unrolled(V, e->index.args[i], memo);
    break;
  default: break;
  }
  return n > MAX_UNROLLED ? MAX_UNROLLED + 1 : n;
}

static int64_t fn_size(Values *V, const Decl *f, int64_t *memo) {
  int at = 0;
  while (V->p->decls[at] != f) at++;
  if (memo[at] >= 0) return memo[at];
  int64_t n = f->fn.ret ? unrolled(V, f->fn.ret, memo) : 0;
  for (int i = 0; i < f->fn.nlets; i++) n += unrolled(V, f->fn.lets[i]->value, memo);
  return memo[at] = n > MAX_UNROLLED ? MAX_UNROLLED + 1 : n;
}

/* Reported once, at the first function over the limit. */
static void check_sizes(Values *V) {
  int64_t *memo = arena_alloc(V->a, sizeof(int64_t) * (size_t)(V->p->ndecls + 1));
  for (int i = 0; i < V->p->ndecls; i++) memo[i] = -1;
  for (int i = 0; i < V->p->ndecls; i++) {
    const Decl *f = V->p->decls[i];
    if (fe_is_fn(f) && fn_size(V, f, memo) > MAX_UNROLLED) {
      diag_error(V->d, f->loc,
                 "'%s' is too large once its sums are unrolled and its calls inlined (more than %d expression nodes)",
                 f->id, MAX_UNROLLED);
      return;
    }
  }
}

int ir_check_values(Arena *a, Program *p, Diags *d) {
  int before = d->errors;
  Values V = {a, p, d};
  for (int i = 0; i < p->ndecls; i++)
    if (p->decls[i]->kind == D_CONST) need_const(&V, p->decls[i]);
  for (int i = 0; i < p->ndecls; i++)
    if (p->decls[i]->kind == D_BUFFER) check_dims(&V, p->decls[i]);
  for (int i = 0; i < p->ndecls; i++)
    if (fe_is_fn(p->decls[i])) check_body(&V, p->decls[i]);
  check_sizes(&V);
  return d->errors - before;
}
