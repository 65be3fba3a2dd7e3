/* sema.c: fe_check(): name resolution and type checking.
 *
 * Names resolve in this order: let bindings, function parameters, top-level
 * declarations, predefined names (B H HKV Q_LEN KV_LEN TOTAL_Q TOTAL_KV Q_START KV_START inf pi), then the
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

/* Checker state for one program. */
typedef struct Sema {
  Arena *a;
  Program *p;
  Diags *d;
  Decl *fn;         /* function being checked, NULL outside bodies */
  int nvis;         /* lets of fn visible so far */
  bool too_deep;    /* nesting error already reported for this expression */
  int *cstate;      /* per decl position: 0 unchecked, 1 checking, 2 done */
  Expr **sums;      /* the sum(...) calls whose index is in scope, innermost last */
  int nsums, sumcap;
  Sym *syms;        /* size symbols */
  int nsyms, symcap;
  FeCall *edges;    /* calls between functions (callgraph.c checks them) */
  int nedges, edgecap;
  const FeLost *lost; /* after syntax errors: what they took away (NULL: nothing) */
} Sema;

static Type check_expr(Sema *s, Expr *e, int depth);

static const char *kind_name(DeclKind k) {
  static const char *const n[] = {"param", "const", "buffer", "score function",
                                  "mask function", "sink function", "function", "kernel"};
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
  for (int i = 0; i < s->nsums; i++) {
    const Expr *ix = s->sums[i]->call.args[0];
    if (!strcmp(ix->name.id, id)) {
      diag_error(s->d, loc, "'%s' is already defined", id);
      diag_note(s->d, ix->loc, "'%s' was first defined here", id);
      return;
    }
  }
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
  int nvis = s->nvis, nsums = s->nsums;
  bool deep = s->too_deep;
  s->fn = NULL;
  s->nsums = 0;
  s->too_deep = false;
  Type t = check_expr(s, c->cnst.value, 0);
  s->fn = fn;
  s->nvis = nvis;
  s->nsums = nsums;
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

/* ---- "did you mean" ----------------------------------------------------------- */

/* What an unknown name could have meant. */
typedef enum Want { W_VALUE, W_FUNCTION, W_BUFFER, W_MASK, W_SCORE, W_SINK } Want;

/* Edit distance of a and b (insertions, deletions, substitutions), or
 * more than `cap` when it exceeds it (the parser's keyword guesses use it too). */
int fe_edit_distance(const char *a, const char *b, int cap) {
  int la = (int)strlen(a), lb = (int)strlen(b);
  if (la > 64 || lb > 64 || abs(la - lb) > cap) return cap + 1;
  int row[65];
  for (int j = 0; j <= lb; j++) row[j] = j;
  for (int i = 1; i <= la; i++) {
    int diag = row[0], best = row[0] = i;
    for (int j = 1; j <= lb; j++) {
      int up = row[j];
      int v = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < v) v = up + 1;
      if (row[j - 1] + 1 < v) v = row[j - 1] + 1;
      row[j] = v;
      diag = up;
      if (v < best) best = v;
    }
    if (best > cap) return cap + 1;
  }
  return row[lb];
}

typedef struct Guess {
  const char *id; /* the best candidate so far (NULL: none) */
  int d;          /* its distance */
  int cap;        /* the largest distance that still counts as a typo */
} Guess;

static void consider(Guess *g, const char *id, const char *cand) {
  if (!strcmp(id, cand)) return;
  int d = fe_edit_distance(id, cand, g->cap);
  if (d <= g->cap && (!g->id || d < g->d)) g->id = cand, g->d = d;
}

/* Spellings from Python and PyTorch, with what .score writes instead. */
static const char *alias_of(const char *id) {
  static const char *const al[][2] = {
      {"clip", "clamp"}, {"minimum", "min"}, {"maximum", "max"}, {"power", "pow"},
      {"fmin", "min"}, {"fmax", "max"}, {"clamp_min", "max"}, {"clamp_max", "min"},
      {"relu", "max(x, 0.0)"}, {"square", "x * x"}, {"log1p", "log(1.0 + x)"},
      {"expm1", "exp(x) - 1.0"}, {"softplus", "log(1.0 + exp(x))"},
      {"gelu", "0.5 * x * (1.0 + erf(x / sqrt(2.0)))"}, {"trunc", "int"}, {"select", "where"},
      {"fmod", "x % y"}, {"remainder", "floormod"}, {"floor_divide", "floordiv"},
      {"bitwise_and", "a & b"}, {"bitwise_or", "a | b"}, {"bitwise_xor", "a ^ b"},
      {"logical_and", "a && b"}, {"logical_or", "a || b"}, {"logical_not", "!a"},
  };
  for (size_t i = 0; i < sizeof al / sizeof al[0]; i++)
    if (!strcmp(id, al[i][0])) return al[i][1];
  return NULL;
}

/* " (did you mean 'x'?)" for an unknown `id` that is one or two edits from
 * a name that would fit where it stands, a Python alias's spelling, or "". */
static const char *did_you_mean(Sema *s, const char *id, Want want) {
  const char *al = want == W_FUNCTION ? alias_of(id) : NULL;
  if (al) return arena_printf(s->a, strchr(al, ' ') || strchr(al, '(') || strchr(al, '!')
                                        ? " (write '%s')" : " (did you mean '%s'?)", al);
  size_t len = strlen(id);
  Guess g = {NULL, 0, len <= 3 ? 1 : len <= 6 ? 2 : 3};
  Decl *fn = s->fn;
  if (want == W_VALUE) {
    for (int i = 0; fn && i < s->nvis; i++) consider(&g, id, fn->fn.lets[i]->id);
    for (int i = 0; i < s->nsums; i++) consider(&g, id, s->sums[i]->call.args[0]->name.id);
    for (int i = 0; fn && i < fn->fn.nparams; i++) consider(&g, id, fn->fn.params[i]);
    for (int i = 0; i < SZ_COUNT; i++) consider(&g, id, size_name((SizeName)i));
    consider(&g, id, "inf");
    consider(&g, id, "pi");
    for (int i = 0; i < s->nsyms; i++) consider(&g, id, s->syms[i].id);
  }
  if (want == W_FUNCTION)
    for (int b = BI_NONE + 1; b < BI_COUNT; b++) consider(&g, id, builtin_name((Builtin)b));
  for (int i = 0; i < s->p->ndecls; i++) {
    const Decl *d = s->p->decls[i];
    bool fits = want == W_VALUE    ? d->kind == D_PARAM || d->kind == D_CONST
                : want == W_FUNCTION ? fe_is_fn(d)
                : want == W_BUFFER   ? d->kind == D_BUFFER
                : want == W_MASK     ? d->kind == D_MASK
                : want == W_SINK     ? d->kind == D_SINK
                                     : d->kind == D_SCORE;
    if (fits) consider(&g, id, d->id);
  }
  if (!g.id || (size_t)g.d >= len) return "";
  return arena_printf(s->a, " (did you mean '%s'?)", g.id);
}

/* ---- names ------------------------------------------------------------------ */

static Type check_name(Sema *s, Expr *e) {
  const char *id = e->name.id;
  Decl *fn = s->fn;
  for (int i = s->nsums - 1; i >= 0; i--)
    if (!strcmp(s->sums[i]->call.args[0]->name.id, id)) {
      e->name.ref = REF_SUM;
      e->name.sum = s->sums[i];
      return TY_INT;
    }
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
      return fe_param_type(fn, i);
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
  if (!lost_name(s, id)) diag_error(s->d, e->loc, "unknown name '%s'%s", id, did_you_mean(s, id, W_VALUE));
  return TY_ERROR;
}

/* What a name that is not a declaration means here, for messages about it
 * being called or indexed; NULL when it means nothing. */
static const char *value_kind(const Sema *s, const char *id) {
  Decl *fn = s->fn;
  for (int i = 0; i < s->nsums; i++)
    if (!strcmp(s->sums[i]->call.args[0]->name.id, id)) return "sum index";
  for (int i = 0; fn && i < s->nvis; i++)
    if (!strcmp(fn->fn.lets[i]->id, id)) return "let";
  for (int i = 0; fn && i < fn->fn.nparams; i++)
    if (!strcmp(fn->fn.params[i], id)) return "function parameter";
  if (predefined(id)) return "predefined name";
  for (int i = 0; i < s->nsyms; i++)
    if (!strcmp(s->syms[i].id, id)) return "size symbol";
  return NULL;
}

/* `id` called or indexed but not a function / buffer (`what`): say what it
 * is instead, or that it is unknown. */
static void report_not(Sema *s, const char *id, Loc loc, const char *what) {
  Decl *d = prog_find(s->p, id);
  const char *vk = d ? kind_name(d->kind) : value_kind(s, id);
  if (vk) diag_error(s->d, loc, "'%s' is a %s, not a %s", id, vk, what);
  else if (!lost_name(s, id))
    diag_error(s->d, loc, "unknown %s '%s'%s", what, id,
               did_you_mean(s, id, what[0] == 'f' ? W_FUNCTION : W_BUFFER));
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
  if (e->op.op == AOP_BNOT) {
    if (t == TY_INT) return t;
    diag_error(s->d, e->op.a->loc, "operator '~' needs int, not %s%s", type_name(t),
               t == TY_BOOL ? " (for bool, write '!')" : "");
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
  if (op == AOP_BAND || op == AOP_BOR || op == AOP_BXOR) {
    /* two ints (bitwise) or two bools (logic that evaluates both sides) */
    if (ta == tb && (ta == TY_INT || ta == TY_BOOL)) return e->op.optype = ta;
    diag_error(s->d, e->loc, "operands of '%s' must be two ints or two bools, not %s and %s", sp,
               type_name(ta), type_name(tb));
    return TY_ERROR;
  }
  if (op == AOP_SHL || op == AOP_SHR) {
    Expr *bad = ta != TY_INT ? e->op.a : tb != TY_INT ? e->op.b : NULL;
    if (bad) {
      diag_error(s->d, bad->loc, "operator '%s' needs ints, not %s", sp, type_name(bad->type));
      return TY_ERROR;
    }
    return e->op.optype = TY_INT;
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
  case BI_MIN: case BI_MAX: case BI_POW: case BI_FLOORDIV: case BI_FLOORMOD: return 2;
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
  bool int_only = b == BI_FLOORDIV || b == BI_FLOORMOD;
  Type t = float_only ? TY_FLOAT : TY_INT;
  for (int i = 0; i < n; i++) {
    if (int_only && args[i]->type != TY_INT) {
      diag_error(s->d, args[i]->loc, "argument %d of '%s' must be int, not %s", i + 1, nm,
                 type_name(args[i]->type));
      return TY_ERROR;
    }
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

/* A call of a score, mask or helper function: arity and argument types (an
 * int argument promotes to a float parameter; nothing else converts). */
static Type check_user_call(Sema *s, Expr *e, Decl *f) {
  int want = f->kind == D_SCORE ? 5 : f->kind == D_MASK ? 4 : f->kind == D_SINK ? 3 : f->fn.nparams;
  e->call.fn = f;
  if (e->call.nargs != want) {
    diag_error(s->d, e->loc, "function '%s' takes %d argument%s, got %d", f->id, want,
               want == 1 ? "" : "s", e->call.nargs);
    return TY_ERROR;
  }
  bool ok = true;
  for (int i = 0; i < want; i++) {
    Type t = e->call.args[i]->type, want_t = fe_param_type(f, i);
    if (t == TY_ERROR || t == want_t || (want_t == TY_FLOAT && t == TY_INT)) continue;
    diag_error(s->d, e->call.args[i]->loc, "argument %d of '%s' must be %s, not %s", i + 1, f->id,
               type_name(want_t), type_name(t));
    ok = false;
  }
  if (s->fn) {
    FeCall ed = {s->fn, f, e->call.id_loc};
    ARENA_PUSH(s->a, s->edges, s->nedges, s->edgecap, ed);
  }
  if (!ok) return TY_ERROR;
  return fe_return_type(f);
}

/* sum(i, LO, HI, EXPR): i is a new int name seen only in EXPR; LO and HI
 * are int constants (their values are checked with the other values, by
 * ir_check_values); the type is EXPR's, int or float. */
static Type check_sum(Sema *s, Expr *e, int depth) {
  Expr **a = e->call.args;
  e->call.builtin = BI_SUM;
  if (e->call.nargs != 4) {
    diag_error(s->d, e->loc, "'sum' takes 4 arguments, sum(i, LO, HI, EXPR), got %d", e->call.nargs);
    return TY_ERROR;
  }
  if (a[0]->kind != EX_NAME) {
    diag_error(s->d, a[0]->loc, "the first argument of 'sum' must be a new name: the index, as in sum(i, 0, 8, EXPR)");
    return TY_ERROR;
  }
  check_fresh(s, a[0]->name.id, a[0]->loc, s->fn ? s->fn->fn.nparams : 0, s->fn ? s->nvis : 0);
  a[0]->type = TY_INT;
  bool ok = true;
  for (int k = 1; k <= 2; k++) {
    Type t = check_expr(s, a[k], depth + 1);
    if (t == TY_ERROR) ok = false;
    else if (t != TY_INT || !a[k]->constexpr_) {
      diag_error(s->d, a[k]->loc, "the %s bound of 'sum' must be an int constant (literals and consts), not %s",
                 k == 1 ? "lower" : "upper", t != TY_INT ? type_name(t) : "a run-time value");
      ok = false;
    }
  }
  ARENA_PUSH(s->a, s->sums, s->nsums, s->sumcap, e);
  Type t = check_expr(s, a[3], depth + 1);
  s->nsums--;
  if (t == TY_BOOL) {
    diag_error(s->d, a[3]->loc, "the terms of 'sum' must be int or float, not bool");
    return TY_ERROR;
  }
  e->call.argtype = t;
  return ok ? t : TY_ERROR;
}

static Type check_call(Sema *s, Expr *e, int depth) {
  Decl *fd = prog_find(s->p, e->call.id);
  if (!strcmp(e->call.id, "sum") && !(fd && fe_is_fn(fd))) return check_sum(s, e, depth);
  bool all_const = true;
  for (int i = 0; i < e->call.nargs; i++) {
    check_expr(s, e->call.args[i], depth + 1);
    all_const = all_const && e->call.args[i]->constexpr_;
  }
  Decl *d = prog_find(s->p, e->call.id);
  if (d && fe_is_fn(d)) return check_user_call(s, e, d);
  Builtin b = builtin_lookup(e->call.id);
  if (b != BI_NONE) {
    e->call.builtin = b;
    e->constexpr_ = all_const;
    return check_builtin(s, e, b);
  }
  report_not(s, e->call.id, e->call.id_loc, "function");
  return TY_ERROR;
}

static Type check_index(Sema *s, Expr *e, int depth) {
  for (int i = 0; i < e->index.nargs; i++) check_expr(s, e->index.args[i], depth + 1);
  Decl *d = prog_find(s->p, e->index.id);
  if (!d || d->kind != D_BUFFER) {
    report_not(s, e->index.id, e->index.id_loc, "buffer");
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
  static const char *const sig[] = {[D_SCORE] = "score function must have 5 parameters (s, b, h, q, kv)",
                                    [D_MASK] = "mask function must have 4 parameters (b, h, q, kv)",
                                    [D_SINK] = "sink function must have 3 parameters (b, h, q)"};
  int want = score ? 5 : f->kind == D_MASK ? 4 : 3;
  if (f->kind != D_FUNC && f->fn.nparams != want)
    diag_error(s->d, f->loc, "%s, got %d", sig[f->kind], f->fn.nparams);
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
    Type rt = fe_return_type(f);
    if (rt == TY_FLOAT && t == TY_INT) {
      /* An int result is promoted, so lowering always sees a float. */
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
    } else if ((score || f->kind == D_SINK) && t == TY_BOOL) {
      diag_error(s->d, r->loc, "%s '%s' must return float, not bool", score ? "score" : "sink", f->id);
    } else if (f->kind == D_MASK && t != TY_BOOL && t != TY_ERROR) {
      diag_error(s->d, r->loc, "mask '%s' must return bool, not %s", f->id, type_name(t));
    } else if (f->kind == D_FUNC && t != rt && t != TY_ERROR && !(rt == TY_FLOAT && t == TY_INT)) {
      diag_error(s->d, r->loc, "function '%s' must return %s, not %s%s", f->id, type_name(rt),
                 type_name(t), rt == TY_INT && t == TY_FLOAT ? " (convert with int(...))" : "");
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
        diag_error(s->d, e->loc, "unknown mask '%s'%s", e->name.id, did_you_mean(s, e->name.id, W_MASK));
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
      diag_error(s->d, k->kernel.score_loc, "unknown score function '%s'%s", k->kernel.score,
                 did_you_mean(s, k->kernel.score, W_SCORE));
  }
  if (k->kernel.mask) check_mask_expr(s, k->kernel.mask, 0);
  if (k->kernel.sink) {
    Decl *d = prog_find(s->p, k->kernel.sink);
    if (d && d->kind == D_SINK)
      k->kernel.sink_fn = d;
    else if (d)
      diag_error(s->d, k->kernel.sink_loc, "'%s' is a %s, not a sink function", d->id,
                 kind_name(d->kind));
    else if (!lost_name(s, k->kernel.sink))
      diag_error(s->d, k->kernel.sink_loc, "unknown sink function '%s'%s", k->kernel.sink,
                 did_you_mean(s, k->kernel.sink, W_SINK));
  }
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
    } else if (fe_is_fn(d) && builtin_lookup(d->id) != BI_NONE) {
      diag_error(s->d, d->loc, "'%s' is a builtin function; pick another name", d->id);
    }
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
    else if (fe_is_fn(x)) check_fn(&s, x);
    else if (x->kind == D_KERNEL && !x->kernel.implicit) check_kernel(&s, x);
  }
  fe_check_calls(a, p, d, s.edges, s.nedges);
  return d->errors - before;
}

int fe_check(Arena *a, Program *p, Diags *d) { return check_program(a, p, d, NULL); }

int fe_check_rest(Arena *a, Program *p, Diags *d, const FeLost *lost) {
  return check_program(a, p, d, lost);
}
