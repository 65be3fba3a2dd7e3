/* sema.c: fe_check(): name resolution and type checking.
 *
 * Names resolve in this order: let bindings, function parameters, top-level
 * declarations, predefined names (B H HKV Q_LEN KV_LEN inf pi), then the
 * free size symbols that buffer dimensions introduce. A let or parameter may
 * not shadow any of them. Every checked Expr gets its type, constexpr_ flag
 * and referent; an int returned from a score is wrapped in float(). */
#include <stdlib.h>
#include <string.h>

#include "fe_internal.h"

/* A free size symbol: a fresh name in a buffer's dimensions. */
typedef struct Sym {
  const char *id; /* the name */
  Decl *buf;      /* the first buffer that uses it */
  int dim;        /* which of its dimensions */
  Loc loc;        /* where it was first written */
} Sym;

/* A call from one function to another (for the recursion check). */
typedef struct Edge {
  Decl *from, *to; /* caller, callee */
  Loc loc;         /* the callee's name at the call */
} Edge;

/* Checker state for one program. */
typedef struct Sema {
  Arena *a;
  Program *p;
  Diags *d;
  Decl *fn;         /* function being checked, NULL outside bodies */
  int nvis;         /* lets of fn visible so far */
  bool too_deep;    /* nesting error already reported for this expression */
  int *cstate;      /* per decl position: 0 unchecked, 1 checking, 2 done */
  Sym *syms;        /* size symbols */
  int nsyms, symcap;
  Edge *edges;      /* calls between functions */
  int nedges, edgecap;
  const FeLost *lost; /* after syntax errors: what they took away (NULL: nothing) */
} Sema;

static Type check_expr(Sema *s, Expr *e, int depth);

static const char *kind_name(DeclKind k) {
  static const char *const n[] = {"param", "const", "buffer", "score function",
                                  "mask function", "kernel"};
  return n[k];
}

static int decl_pos(const Program *p, const Decl *d) {
  for (int i = 0; i < p->ndecls; i++)
    if (p->decls[i] == d) return i;
  PANIC("declaration '%s' is not in the program", d->id);
}

static bool predef_size(const char *id, SizeName *out) {
  for (int i = 0; i < SZ_COUNT; i++)
    if (!strcmp(id, size_name((SizeName)i))) {
      *out = (SizeName)i;
      return true;
    }
  return false;
}

static bool predefined(const char *id) {
  SizeName sz;
  return predef_size(id, &sz) || !strcmp(id, "inf") || !strcmp(id, "pi");
}

static Sym *find_sym(Sema *s, const char *id) {
  for (int i = 0; i < s->nsyms; i++)
    if (!strcmp(s->syms[i].id, id)) return &s->syms[i];
  return NULL;
}

/* A name that a declaration lost to a syntax error may have defined: an
 * "unknown" message about it would be a cascade. */
static bool lost_name(const Sema *s, const char *id) {
  for (int i = 0; s->lost && i < s->lost->nnames; i++)
    if (!strcmp(s->lost->names[i], id)) return true;
  return false;
}

static bool broken(const Sema *s, const Decl *d) {
  for (int i = 0; s->lost && i < s->lost->nbroken; i++)
    if (s->lost->broken[i] == d) return true;
  return false;
}

static bool is_num(Type t) { return t == TY_INT || t == TY_FLOAT; }
static Type promote(Type a, Type b) { return a == TY_FLOAT || b == TY_FLOAT ? TY_FLOAT : TY_INT; }

/* ---- shadowing ------------------------------------------------------------- */

/* A let or parameter named `id` at `loc`: report any earlier name it would
 * shadow. `params`/`nparams` and the first `nlets` lets are the function's
 * names already in scope. */
static void check_fresh(Sema *s, const char *id, Loc loc, int nparams, int nlets) {
  Decl *fn = s->fn;
  for (int i = 0; i < nlets; i++)
    if (!strcmp(fn->fn.lets[i]->id, id)) {
      diag_error(s->d, loc, "'%s' is already defined", id);
      diag_note(s->d, fn->fn.lets[i]->loc, "'%s' was first defined here", id);
      return;
    }
  for (int i = 0; i < nparams; i++)
    if (!strcmp(fn->fn.params[i], id)) {
      diag_error(s->d, loc, "'%s' is already defined", id);
      diag_note(s->d, fn->fn.param_locs[i], "'%s' was first defined here", id);
      return;
    }
  Decl *d = prog_find(s->p, id);
  if (d) {
    diag_error(s->d, loc, "'%s' shadows the %s '%s'", id, kind_name(d->kind), id);
    diag_note(s->d, d->loc, "'%s' is declared here", id);
  } else if (predefined(id)) {
    diag_error(s->d, loc, "'%s' is a predefined name and cannot be redefined", id);
  } else {
    Sym *sym = find_sym(s, id);
    if (!sym) return;
    diag_error(s->d, loc, "'%s' shadows the size symbol '%s' of buffer '%s'", id, id, sym->buf->id);
    diag_note(s->d, sym->loc, "'%s' is introduced here", id);
  }
}

/* ---- consts ---------------------------------------------------------------- */

/* The first leaf that keeps `e` from being a compile-time constant. */
static const Expr *non_const_leaf(const Expr *e) {
  if (e->constexpr_ || e->type == TY_ERROR) return NULL;
  const Expr *r = NULL;
  switch (e->kind) {
  case EX_UNARY: return non_const_leaf(e->op.a);
  case EX_BINARY:
    r = non_const_leaf(e->op.a);
    return r ? r : non_const_leaf(e->op.b);
  case EX_COND:
    r = non_const_leaf(e->cond.c);
    if (!r) r = non_const_leaf(e->cond.a);
    return r ? r : non_const_leaf(e->cond.b);
  case EX_CALL:
    if (e->call.builtin == BI_NONE) return e;
    for (int i = 0; i < e->call.nargs && !r; i++) r = non_const_leaf(e->call.args[i]);
    return r ? r : e;
  default: return e;
  }
}

/* Check a const's value once (consts may be used before their declaration;
 * a cycle is an error). */
static Type check_const(Sema *s, Decl *c) {
  int pos = decl_pos(s->p, c);
  if (s->cstate[pos] == 1) {
    diag_error(s->d, c->loc, "const '%s' is defined in terms of itself", c->id);
    s->cstate[pos] = 2;
    c->cnst.value->type = TY_ERROR;
    return TY_ERROR;
  }
  if (s->cstate[pos] == 2) return c->cnst.value->type;
  s->cstate[pos] = 1;
  Decl *fn = s->fn;
  int nvis = s->nvis;
  bool deep = s->too_deep;
  s->fn = NULL;
  s->too_deep = false;
  Type t = check_expr(s, c->cnst.value, 0);
  s->fn = fn;
  s->nvis = nvis;
  s->too_deep = deep;
  if (s->cstate[pos] == 2) return TY_ERROR; /* a cycle was reported inside */
  s->cstate[pos] = 2;
  const Expr *leaf = t == TY_ERROR ? NULL : non_const_leaf(c->cnst.value);
  if (leaf) {
    diag_error(s->d, leaf->loc,
               "const '%s' must be a compile-time constant (literals, consts, inf, pi and builtins of them)",
               c->id);
    c->cnst.value->type = TY_ERROR;
    return TY_ERROR;
  }
  return t;
}

/* ---- names ------------------------------------------------------------------ */

static Type check_name(Sema *s, Expr *e) {
  const char *id = e->name.id;
  Decl *fn = s->fn;
  for (int i = s->nvis - 1; fn && i >= 0; i--)
    if (!strcmp(fn->fn.lets[i]->id, id)) {
      e->name.ref = REF_LET;
      e->name.let = fn->fn.lets[i];
      e->constexpr_ = e->name.let->value->constexpr_;
      return e->name.let->value->type;
    }
  for (int i = 0; fn && i < fn->fn.nparams; i++)
    if (!strcmp(fn->fn.params[i], id)) {
      e->name.ref = REF_ARG;
      e->name.arg = i;
      return fn->kind == D_SCORE && i == 0 ? TY_FLOAT : TY_INT;
    }
  Decl *d = prog_find(s->p, id);
  if (d) {
    switch (d->kind) {
    case D_PARAM:
      e->name.ref = REF_PARAM;
      e->name.decl = d;
      return d->param.type;
    case D_CONST:
      e->name.ref = REF_CONST;
      e->name.decl = d;
      e->constexpr_ = true;
      return check_const(s, d);
    case D_BUFFER:
      diag_error(s->d, e->loc, "buffer '%s' must be indexed, as in %s[...]", id, id);
      return TY_ERROR;
    default:
      diag_error(s->d, e->loc, "'%s' is a %s, not a value", id, kind_name(d->kind));
      return TY_ERROR;
    }
  }
  SizeName sz;
  if (predef_size(id, &sz)) {
    e->name.ref = REF_SIZE;
    e->name.size = sz;
    return TY_INT;
  }
  if (!strcmp(id, "inf") || !strcmp(id, "pi")) {
    e->name.ref = id[0] == 'i' ? REF_INF : REF_PI;
    e->constexpr_ = true;
    return TY_FLOAT;
  }
  Sym *sym = find_sym(s, id);
  if (sym) {
    e->name.ref = REF_SYM;
    e->name.decl = sym->buf;
    e->name.dim = sym->dim;
    return TY_INT;
  }
  if (!lost_name(s, id)) diag_error(s->d, e->loc, "unknown name '%s'", id);
  return TY_ERROR;
}

/* What a name that is not a declaration means here, for messages about it
 * being called or indexed; NULL when it means nothing. */
static const char *value_kind(const Sema *s, const char *id) {
  Decl *fn = s->fn;
  for (int i = 0; fn && i < s->nvis; i++)
    if (!strcmp(fn->fn.lets[i]->id, id)) return "let";
  for (int i = 0; fn && i < fn->fn.nparams; i++)
    if (!strcmp(fn->fn.params[i], id)) return "function parameter";
  if (predefined(id)) return "predefined name";
  for (int i = 0; i < s->nsyms; i++)
    if (!strcmp(s->syms[i].id, id)) return "size symbol";
  return NULL;
}

/* ---- operators -------------------------------------------------------------- */

static Type check_unary(Sema *s, Expr *e, int depth) {
  Type t = check_expr(s, e->op.a, depth + 1);
  e->constexpr_ = e->op.a->constexpr_;
  e->op.optype = t;
  if (t == TY_ERROR) return t;
  if (e->op.op == AOP_NOT) {
    if (t == TY_BOOL) return t;
    diag_error(s->d, e->op.a->loc, "operator '!' needs bool, not %s", type_name(t));
    return TY_ERROR;
  }
  if (is_num(t)) return t;
  diag_error(s->d, e->op.a->loc, "operator '-' needs a number, not bool");
  return TY_ERROR;
}

static Type check_binary(Sema *s, Expr *e, int depth) {
  AstOp op = e->op.op;
  Type ta = check_expr(s, e->op.a, depth + 1);
  Type tb = check_expr(s, e->op.b, depth + 1);
  e->constexpr_ = e->op.a->constexpr_ && e->op.b->constexpr_;
  if (ta == TY_ERROR || tb == TY_ERROR) return TY_ERROR;
  const char *sp = astop_spelling(op);
  if (op == AOP_AND || op == AOP_OR) {
    Expr *bad = ta != TY_BOOL ? e->op.a : tb != TY_BOOL ? e->op.b : NULL;
    if (bad) {
      diag_error(s->d, bad->loc, "operands of '%s' must be bool, not %s", sp, type_name(bad->type));
      return TY_ERROR;
    }
    e->op.optype = TY_BOOL;
    return TY_BOOL;
  }
  if ((op == AOP_EQ || op == AOP_NE) && ta == TY_BOOL && tb == TY_BOOL) {
    e->op.optype = TY_BOOL;
    return TY_BOOL;
  }
  if ((op == AOP_EQ || op == AOP_NE) && (ta == TY_BOOL) != (tb == TY_BOOL)) {
    diag_error(s->d, e->loc, "cannot compare %s with %s", type_name(ta), type_name(tb));
    return TY_ERROR;
  }
  Expr *bad = ta == TY_BOOL ? e->op.a : tb == TY_BOOL ? e->op.b : NULL;
  if (bad) {
    diag_error(s->d, bad->loc, "operator '%s' needs numbers, not bool", sp);
    return TY_ERROR;
  }
  e->op.optype = promote(ta, tb);
  return op >= AOP_LT ? TY_BOOL : e->op.optype;
}

/* The common type of two branches ('?:' and where): numbers promote, bool
 * goes only with bool. */
static Type branch_type(Sema *s, Expr *e, const char *what, Expr *a, Expr *b) {
  if (a->type == TY_ERROR || b->type == TY_ERROR) return TY_ERROR;
  if (a->type == TY_BOOL && b->type == TY_BOOL) return TY_BOOL;
  if (is_num(a->type) && is_num(b->type)) return promote(a->type, b->type);
  diag_error(s->d, e->loc, "the branches of %s have different types: %s and %s", what,
             type_name(a->type), type_name(b->type));
  return TY_ERROR;
}

static bool need_bool_cond(Sema *s, Expr *c, const char *what) {
  if (c->type == TY_ERROR || c->type == TY_BOOL) return c->type == TY_BOOL;
  diag_error(s->d, c->loc, "the condition of %s must be bool, not %s", what, type_name(c->type));
  return false;
}

static Type check_cond(Sema *s, Expr *e, int depth) {
  check_expr(s, e->cond.c, depth + 1);
  check_expr(s, e->cond.a, depth + 1);
  check_expr(s, e->cond.b, depth + 1);
  e->constexpr_ = e->cond.c->constexpr_ && e->cond.a->constexpr_ && e->cond.b->constexpr_;
  bool ok = need_bool_cond(s, e->cond.c, "'?:'");
  Type t = branch_type(s, e, "'?:'", e->cond.a, e->cond.b);
  return ok ? t : TY_ERROR;
}

/* ---- calls and loads ------------------------------------------------------- */

static int builtin_arity(Builtin b) {
  switch (b) {
  case BI_MIN: case BI_MAX: case BI_POW: return 2;
  case BI_CLAMP: case BI_WHERE: return 3;
  default: return 1;
  }
}

/* Overload resolution for a builtin whose arguments are already checked. */
static Type check_builtin(Sema *s, Expr *e, Builtin b) {
  Expr **args = e->call.args;
  int n = e->call.nargs;
  const char *nm = builtin_name(b);
  if (n != builtin_arity(b)) {
    diag_error(s->d, e->loc, "'%s' takes %d argument%s, got %d", nm, builtin_arity(b),
               builtin_arity(b) == 1 ? "" : "s", n);
    return TY_ERROR;
  }
  for (int i = 0; i < n; i++)
    if (args[i]->type == TY_ERROR) return TY_ERROR;
  if (b == BI_FLOAT || b == BI_INT) {
    e->call.argtype = args[0]->type;
    return b == BI_FLOAT ? TY_FLOAT : TY_INT;
  }
  if (b == BI_WHERE) {
    bool ok = need_bool_cond(s, args[0], "'where'");
    Type t = branch_type(s, e, "'where'", args[1], args[2]);
    e->call.argtype = t;
    return ok ? t : TY_ERROR;
  }
  bool float_only = b >= BI_EXP && b <= BI_POW;
  Type t = float_only ? TY_FLOAT : TY_INT;
  for (int i = 0; i < n; i++) {
    if (args[i]->type == TY_BOOL) {
      diag_error(s->d, args[i]->loc, "argument %d of '%s' must be %s, not bool", i + 1, nm,
                 float_only ? "float" : "int or float");
      return TY_ERROR;
    }
    t = promote(t, args[i]->type);
  }
  e->call.argtype = t;
  return t;
}

/* A call of a score or mask function: arity and argument types. */
static Type check_user_call(Sema *s, Expr *e, Decl *f) {
  int want = f->kind == D_SCORE ? 5 : 4;
  e->call.fn = f;
  if (e->call.nargs != want) {
    diag_error(s->d, e->loc, "function '%s' takes %d arguments, got %d", f->id, want, e->call.nargs);
    return TY_ERROR;
  }
  bool ok = true;
  for (int i = 0; i < want; i++) {
    Type t = e->call.args[i]->type;
    bool score_arg = f->kind == D_SCORE && i == 0;
    if (t == TY_ERROR || t == TY_INT || (score_arg && t == TY_FLOAT)) continue;
    diag_error(s->d, e->call.args[i]->loc, "argument %d of '%s' must be %s, not %s", i + 1, f->id,
               score_arg ? "float" : "int", type_name(t));
    ok = false;
  }
  if (s->fn) {
    Edge ed = {s->fn, f, e->call.id_loc};
    ARENA_PUSH(s->a, s->edges, s->nedges, s->edgecap, ed);
  }
  if (!ok) return TY_ERROR;
  return f->kind == D_SCORE ? TY_FLOAT : TY_BOOL;
}

static Type check_call(Sema *s, Expr *e, int depth) {
  bool all_const = true;
  for (int i = 0; i < e->call.nargs; i++) {
    check_expr(s, e->call.args[i], depth + 1);
    all_const = all_const && e->call.args[i]->constexpr_;
  }
  Decl *d = prog_find(s->p, e->call.id);
  if (d && (d->kind == D_SCORE || d->kind == D_MASK)) return check_user_call(s, e, d);
  Builtin b = builtin_lookup(e->call.id);
  if (b != BI_NONE) {
    e->call.builtin = b;
    e->constexpr_ = all_const;
    return check_builtin(s, e, b);
  }
  const char *vk = d ? NULL : value_kind(s, e->call.id);
  if (d)
    diag_error(s->d, e->call.id_loc, "'%s' is a %s, not a function", d->id, kind_name(d->kind));
  else if (vk)
    diag_error(s->d, e->call.id_loc, "'%s' is a %s, not a function", e->call.id, vk);
  else if (!lost_name(s, e->call.id))
    diag_error(s->d, e->call.id_loc, "unknown function '%s'", e->call.id);
  return TY_ERROR;
}

static Type check_index(Sema *s, Expr *e, int depth) {
  for (int i = 0; i < e->index.nargs; i++) check_expr(s, e->index.args[i], depth + 1);
  Decl *d = prog_find(s->p, e->index.id);
  if (!d || d->kind != D_BUFFER) {
    const char *vk = d ? NULL : value_kind(s, e->index.id);
    if (d)
      diag_error(s->d, e->index.id_loc, "'%s' is a %s, not a buffer", d->id, kind_name(d->kind));
    else if (vk)
      diag_error(s->d, e->index.id_loc, "'%s' is a %s, not a buffer", e->index.id, vk);
    else if (!lost_name(s, e->index.id))
      diag_error(s->d, e->index.id_loc, "unknown buffer '%s'", e->index.id);
    return TY_ERROR;
  }
  e->index.buf = d;
  if (e->index.nargs != d->buffer.ndims) {
    diag_error(s->d, e->loc, "buffer '%s' has %d dimension%s but is indexed with %d", d->id,
               d->buffer.ndims, d->buffer.ndims == 1 ? "" : "s", e->index.nargs);
    return TY_ERROR;
  }
  bool ok = true;
  for (int i = 0; i < e->index.nargs; i++) {
    Type t = e->index.args[i]->type;
    if (t == TY_INT || t == TY_ERROR) continue;
    diag_error(s->d, e->index.args[i]->loc, "index %d of '%s' must be int, not %s", i + 1, d->id,
               type_name(t));
    ok = false;
  }
  return ok ? dtype_value_type(d->buffer.dtype) : TY_ERROR;
}

/* Check `e` and record its type. Depth is capped so that no recursive pass
 * (this one, lowering) can exhaust the C stack. */
static Type check_expr(Sema *s, Expr *e, int depth) {
  if (depth > FE_MAX_DEPTH) {
    if (!s->too_deep)
      diag_error(s->d, e->loc, "expression nested too deeply (more than %d levels)", FE_MAX_DEPTH);
    s->too_deep = true;
    return e->type = TY_ERROR;
  }
  Type t = TY_ERROR;
  switch (e->kind) {
  case EX_INT: e->constexpr_ = true; t = TY_INT; break;
  case EX_FLOAT: e->constexpr_ = true; t = TY_FLOAT; break;
  case EX_BOOL: e->constexpr_ = true; t = TY_BOOL; break;
  case EX_NAME: t = check_name(s, e); break;
  case EX_UNARY: t = check_unary(s, e, depth); break;
  case EX_BINARY: t = check_binary(s, e, depth); break;
  case EX_COND: t = check_cond(s, e, depth); break;
  case EX_CALL: t = check_call(s, e, depth); break;
  case EX_INDEX: t = check_index(s, e, depth); break;
  }
  return e->type = t;
}

static Type check_root(Sema *s, Expr *e) {
  s->too_deep = false;
  return check_expr(s, e, 0);
}

/* ---- declarations ----------------------------------------------------------- */

static void check_dims(Sema *s, Decl *b) {
  for (int i = 0; i < b->buffer.ndims; i++) {
    Dim *dm = &b->buffer.dims[i];
    if (dm->kind == DIM_LIT) continue;
    Decl *d = prog_find(s->p, dm->id);
    if (d && d->kind == D_CONST) {
      dm->kind = DIM_CONST;
      dm->cdecl = d;
      Type t = check_const(s, d);
      if (t != TY_INT && t != TY_ERROR)
        diag_error(s->d, dm->loc, "dimension '%s' must be an int const, not %s", dm->id, type_name(t));
    } else if (d) {
      diag_error(s->d, dm->loc,
                 "'%s' is a %s; a dimension is an int literal, a const, a predefined size or a new size name",
                 dm->id, kind_name(d->kind));
    } else if (predef_size(dm->id, &dm->size)) {
      dm->kind = DIM_SIZE;
    } else if (predefined(dm->id)) {
      diag_error(s->d, dm->loc, "'%s' is a float constant, not a size", dm->id);
    } else if (!find_sym(s, dm->id)) {
      Sym sym = {dm->id, b, i, dm->loc};
      ARENA_PUSH(s->a, s->syms, s->nsyms, s->symcap, sym);
    }
  }
}

static void check_fn(Sema *s, Decl *f) {
  bool score = f->kind == D_SCORE;
  int want = score ? 5 : 4;
  if (f->fn.nparams != want)
    diag_error(s->d, f->loc, "%s", score
                   ? arena_printf(s->a, "score function must have 5 parameters (s, b, h, q, kv), got %d", f->fn.nparams)
                   : arena_printf(s->a, "mask function must have 4 parameters (b, h, q, kv), got %d", f->fn.nparams));
  s->fn = f;
  s->nvis = 0;
  for (int i = 0; i < f->fn.nparams; i++) check_fresh(s, f->fn.params[i], f->fn.param_locs[i], i, 0);
  for (int i = 0; i < f->fn.nlets; i++) {
    s->nvis = i;
    check_root(s, f->fn.lets[i]->value);
    check_fresh(s, f->fn.lets[i]->id, f->fn.lets[i]->loc, f->fn.nparams, i);
  }
  s->nvis = f->fn.nlets;
  Expr *r = f->fn.ret;
  if (r) {
    Type t = check_root(s, r);
    if (score && t == TY_INT) {
      /* An int score is promoted, so lowering always sees a float. */
      Expr *c = arena_alloc(s->a, sizeof *c);
      Expr **args = arena_alloc(s->a, sizeof *args);
      args[0] = r;
      *c = (Expr){.kind = EX_CALL, .loc = r->loc, .type = TY_FLOAT, .constexpr_ = r->constexpr_};
      c->call.id = "float";
      c->call.id_loc = r->loc;
      c->call.args = args;
      c->call.nargs = 1;
      c->call.builtin = BI_FLOAT;
      c->call.argtype = TY_INT;
      f->fn.ret = c;
    } else if (score && t == TY_BOOL) {
      diag_error(s->d, r->loc, "score '%s' must return float, not bool", f->id);
    } else if (!score && t != TY_BOOL && t != TY_ERROR) {
      diag_error(s->d, r->loc, "mask '%s' must return bool, not %s", f->id, type_name(t));
    }
  }
  s->fn = NULL;
  s->nvis = 0;
}

/* A kernel's mask: mask names combined with && || ! and parentheses. */
static bool check_mask_expr(Sema *s, Expr *e, int depth) {
  if (depth > FE_MAX_DEPTH) {
    diag_error(s->d, e->loc, "expression nested too deeply (more than %d levels)", FE_MAX_DEPTH);
    return false;
  }
  bool ok = true;
  if (e->kind == EX_NAME) {
    Decl *d = prog_find(s->p, e->name.id);
    if (d && d->kind == D_MASK) {
      e->name.ref = REF_MASK;
      e->name.decl = d;
    } else {
      if (d)
        diag_error(s->d, e->loc, "'%s' is a %s, not a mask", d->id, kind_name(d->kind));
      else if (!lost_name(s, e->name.id))
        diag_error(s->d, e->loc, "unknown mask '%s'", e->name.id);
      ok = false;
    }
  } else if (e->kind == EX_UNARY && e->op.op == AOP_NOT) {
    ok = check_mask_expr(s, e->op.a, depth + 1);
    e->op.optype = TY_BOOL;
  } else if (e->kind == EX_BINARY && (e->op.op == AOP_AND || e->op.op == AOP_OR)) {
    ok = check_mask_expr(s, e->op.a, depth + 1);
    ok = check_mask_expr(s, e->op.b, depth + 1) && ok;
    e->op.optype = TY_BOOL;
  } else {
    diag_error(s->d, e->loc, "a kernel's mask may only combine mask names with '&&', '||', '!' and parentheses");
    return false;
  }
  e->type = ok ? TY_BOOL : TY_ERROR;
  return ok;
}

static void check_kernel(Sema *s, Decl *k) {
  if (k->kernel.score) {
    Decl *d = prog_find(s->p, k->kernel.score);
    if (d && d->kind == D_SCORE)
      k->kernel.score_fn = d;
    else if (d)
      diag_error(s->d, k->kernel.score_loc, "'%s' is a %s, not a score function", d->id,
                 kind_name(d->kind));
    else if (!lost_name(s, k->kernel.score))
      diag_error(s->d, k->kernel.score_loc, "unknown score function '%s'", k->kernel.score);
  }
  if (k->kernel.mask) check_mask_expr(s, k->kernel.mask, 0);
}

/* Top-level names: one namespace, no predefined names, and functions may
 * not take a builtin's name. */
static void check_namespace(Sema *s) {
  for (int i = 0; i < s->p->ndecls; i++) {
    Decl *d = s->p->decls[i];
    Decl *first = prog_find(s->p, d->id);
    if (first != d) {
      diag_error(s->d, d->loc, "'%s' is already defined", d->id);
      diag_note(s->d, first->loc, "'%s' was first defined here", d->id);
    } else if (predefined(d->id)) {
      diag_error(s->d, d->loc, "'%s' is a predefined name and cannot be redefined", d->id);
    } else if ((d->kind == D_SCORE || d->kind == D_MASK) && builtin_lookup(d->id) != BI_NONE) {
      diag_error(s->d, d->loc, "'%s' is a builtin function; pick another name", d->id);
    }
  }
}

/* ---- the call graph: recursion and inlining limits --------------------------- */

/* Calls are inlined, so a chain of calls deeper than this, or a function
 * whose inlined body has more expression nodes than FE_MAX_INLINED, is an
 * error (lowering would exhaust its guard, or memory, instead). */
#define FE_MAX_CALL_DEPTH 200
#define FE_MAX_INLINED (1 << 20)

/* The functions of a program and the calls between them, by caller. */
typedef struct CallGraph {
  Decl **fn;     /* score and mask functions, in source order */
  Decl **byptr;  /* the same, sorted by address (slot lookup) */
  int *slotof;   /* slot of byptr[i] */
  int n;         /* functions */
  int *first;    /* out[first[v] .. first[v+1]) are v's calls, in source order */
  Edge **out;    /* every call, grouped by caller */
  int *to;       /* slot of out[i]->to */
} CallGraph;

static int cmp_ptr(const void *x, const void *y) {
  uintptr_t a = (uintptr_t) * (Decl *const *)x, b = (uintptr_t) * (Decl *const *)y;
  return a < b ? -1 : a > b;
}

static int slot_of(const CallGraph *g, const Decl *d) {
  int lo = 0, hi = g->n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (g->byptr[mid] == d) return g->slotof[mid];
    if ((uintptr_t)g->byptr[mid] < (uintptr_t)d) lo = mid + 1;
    else hi = mid - 1;
  }
  PANIC("function '%s' is not in the program", d->id);
}

static void graph_build(Sema *s, CallGraph *g) {
  Arena *a = s->a;
  int nd = s->p->ndecls;
  g->fn = arena_alloc(a, sizeof(Decl *) * (size_t)(nd + 1));
  g->n = 0;
  for (int i = 0; i < nd; i++)
    if (s->p->decls[i]->kind == D_SCORE || s->p->decls[i]->kind == D_MASK) g->fn[g->n++] = s->p->decls[i];
  g->byptr = arena_alloc(a, sizeof(Decl *) * (size_t)(g->n + 1));
  if (g->n) memcpy(g->byptr, g->fn, sizeof(Decl *) * (size_t)g->n);
  qsort(g->byptr, (size_t)g->n, sizeof(Decl *), cmp_ptr);
  g->slotof = arena_alloc(a, sizeof(int) * (size_t)(g->n + 1));
  for (int i = 0; i < g->n; i++) g->slotof[i] = -1;
  for (int v = 0; v < g->n; v++) { /* slot v of fn[v]: find it in byptr */
    Decl **hit = bsearch(&g->fn[v], g->byptr, (size_t)g->n, sizeof(Decl *), cmp_ptr);
    g->slotof[hit - g->byptr] = v;
  }
  g->first = arena_alloc(a, sizeof(int) * (size_t)(g->n + 2));
  memset(g->first, 0, sizeof(int) * (size_t)(g->n + 2));
  int *from = arena_alloc(a, sizeof(int) * (size_t)(s->nedges + 1));
  for (int e = 0; e < s->nedges; e++) {
    from[e] = slot_of(g, s->edges[e].from);
    g->first[from[e] + 2]++;
  }
  for (int v = 0; v < g->n; v++) g->first[v + 2] += g->first[v + 1];
  g->out = arena_alloc(a, sizeof(Edge *) * (size_t)(s->nedges + 1));
  g->to = arena_alloc(a, sizeof(int) * (size_t)(s->nedges + 1));
  for (int e = 0; e < s->nedges; e++) { /* stable counting sort by caller */
    int at = g->first[from[e] + 1]++;
    g->out[at] = &s->edges[e];
    g->to[at] = slot_of(g, s->edges[e].to);
  }
}

/* Is there a call path from `root` back to itself? Iterative DFS; on success
 * the path (edges) is left in `path`, its length returned; 0 if none. */
static int find_cycle(Sema *s, const CallGraph *g, int root, Edge **path, bool *seen) {
  int *next = arena_alloc(s->a, sizeof(int) * (size_t)(g->n + 1));
  int *node = arena_alloc(s->a, sizeof(int) * (size_t)(g->n + 1));
  int top = 0;
  node[0] = root;
  next[0] = g->first[root];
  memset(seen, 0, (size_t)g->n);
  while (top >= 0) {
    int e = next[top]++;
    if (e >= g->first[node[top] + 1]) {
      top--;
      continue;
    }
    path[top] = g->out[e];
    if (g->to[e] == root) return top + 1;
    if (seen[g->to[e]]) continue;
    seen[g->to[e]] = true;
    top++;
    node[top] = g->to[e];
    next[top] = g->first[node[top]];
  }
  return 0;
}

static void report_recursion(Sema *s, const CallGraph *g) {
  bool *reported = arena_alloc(s->a, (size_t)g->n + 1);
  bool *seen = arena_alloc(s->a, (size_t)g->n + 1);
  Edge **path = arena_alloc(s->a, sizeof(Edge *) * (size_t)(g->n + 1));
  memset(reported, 0, (size_t)g->n + 1);
  for (int v = 0; v < g->n; v++) {
    if (reported[v]) continue;
    int len = find_cycle(s, g, v, path, seen);
    if (!len) continue;
    Buf b = {0};
    for (int k = 1; k < len; k++) {
      buf_printf(&b, "%s'%s'", k == 1 ? " (through " : ", ", path[k]->from->id);
      reported[slot_of(g, path[k]->from)] = true;
    }
    if (len > 1) buf_puts(&b, ")");
    diag_error(s->d, path[0]->loc, "recursion: '%s' calls itself%s", g->fn[v]->id, b.data ? b.data : "");
    buf_free(&b);
    reported[v] = true;
  }
}

/* Expression nodes of `e`, not counting what its calls inline. Below
 * FE_MAX_DEPTH nothing is counted: such a tree is already an error, and the
 * cap keeps the recursion off the end of the stack. */
static int64_t expr_nodes(const Expr *e, int depth) {
  int64_t n = 1;
  if (depth > FE_MAX_DEPTH) return n;
  switch (e->kind) {
  case EX_UNARY: n += expr_nodes(e->op.a, depth + 1); break;
  case EX_BINARY: n += expr_nodes(e->op.a, depth + 1) + expr_nodes(e->op.b, depth + 1); break;
  case EX_COND: n += expr_nodes(e->cond.c, depth + 1) + expr_nodes(e->cond.a, depth + 1) + expr_nodes(e->cond.b, depth + 1); break;
  case EX_CALL:
    for (int i = 0; i < e->call.nargs; i++) n += expr_nodes(e->call.args[i], depth + 1);
    break;
  case EX_INDEX:
    for (int i = 0; i < e->index.nargs; i++) n += expr_nodes(e->index.args[i], depth + 1);
    break;
  default: break;
  }
  return n;
}

static int64_t fn_nodes(const Decl *f) {
  int64_t n = f->fn.ret ? expr_nodes(f->fn.ret, 0) : 0;
  for (int i = 0; i < f->fn.nlets; i++) n += expr_nodes(f->fn.lets[i]->value, 0);
  return n;
}

/* Longest call chain and inlined size of every function, by an iterative
 * post-order DFS; returns whether a call cycle was met (its edges are left
 * out of both measures; report_recursion names it). */
static bool measure_calls(Sema *s, const CallGraph *g, int *depth, int64_t *size) {
  Arena *a = s->a;
  char *color = arena_alloc(a, (size_t)g->n + 1); /* 0 new, 1 on the stack, 2 done */
  int *node = arena_alloc(a, sizeof(int) * (size_t)(g->n + 1));
  int *next = arena_alloc(a, sizeof(int) * (size_t)(g->n + 1));
  memset(color, 0, (size_t)g->n + 1);
  bool cycle = false;
  for (int r = 0; r < g->n; r++) {
    if (color[r]) continue;
    int top = 0;
    node[0] = r;
    next[0] = g->first[r];
    color[r] = 1;
    depth[r] = 0;
    size[r] = fn_nodes(g->fn[r]);
    while (top >= 0) {
      int v = node[top], e = next[top]++;
      if (e >= g->first[v + 1]) {
        color[v] = 2;
        top--;
        continue;
      }
      int w = g->to[e];
      if (color[w] == 0) {
        color[w] = 1;
        depth[w] = 0;
        size[w] = fn_nodes(g->fn[w]);
        next[top]--; /* come back to this edge once w is done */
        top++;
        node[top] = w;
        next[top] = g->first[w];
      } else if (color[w] == 1) {
        cycle = true;
      } else {
        if (depth[w] + 1 > depth[v]) depth[v] = depth[w] + 1;
        size[v] += size[w];
        if (size[v] > FE_MAX_INLINED) size[v] = FE_MAX_INLINED + 1;
      }
    }
  }
  return cycle;
}

/* Recursion is an error; so are calls that inline too deep or too much.
 * Each limit is reported once, at the first function over it. */
static void check_calls(Sema *s) {
  CallGraph g;
  graph_build(s, &g);
  int *depth = arena_alloc(s->a, sizeof(int) * (size_t)(g.n + 1));
  int64_t *size = arena_alloc(s->a, sizeof(int64_t) * (size_t)(g.n + 1));
  if (measure_calls(s, &g, depth, size)) {
    report_recursion(s, &g);
    return;
  }
  for (int v = 0; v < g.n; v++)
    if (depth[v] > FE_MAX_CALL_DEPTH) {
      diag_error(s->d, g.fn[v]->loc,
                 "calls nested too deeply: '%s' starts a chain of %d calls (at most %d; calls are inlined)",
                 g.fn[v]->id, depth[v], FE_MAX_CALL_DEPTH);
      break;
    }
  for (int v = 0; v < g.n; v++)
    if (size[v] > FE_MAX_INLINED) {
      diag_error(s->d, g.fn[v]->loc,
                 "'%s' is too large once its calls are inlined (more than %d expression nodes)",
                 g.fn[v]->id, FE_MAX_INLINED);
      break;
    }
}

static int check_program(Arena *a, Program *p, Diags *d, const FeLost *lost) {
  int before = d->errors;
  Sema s = {.a = a, .p = p, .d = d, .lost = lost};
  s.cstate = arena_alloc(a, sizeof(int) * (size_t)(p->ndecls + 1));
  check_namespace(&s);
  for (int i = 0; i < p->ndecls; i++)
    if (p->decls[i]->kind == D_BUFFER) check_dims(&s, p->decls[i]);
  for (int i = 0; i < p->ndecls; i++) {
    Decl *x = p->decls[i];
    if (broken(&s, x)) continue;
    if (x->kind == D_CONST) check_const(&s, x);
    else if (x->kind == D_SCORE || x->kind == D_MASK) check_fn(&s, x);
    else if (x->kind == D_KERNEL && !x->kernel.implicit) check_kernel(&s, x);
  }
  check_calls(&s);
  return d->errors - before;
}

int fe_check(Arena *a, Program *p, Diags *d) { return check_program(a, p, d, NULL); }

int fe_check_rest(Arena *a, Program *p, Diags *d, const FeLost *lost) {
  return check_program(a, p, d, lost);
}
