/* ast.c: the AST's name tables, the builders the grammar actions call, and
 * fe_parse(). Builders check what is purely syntactic (a param default is a
 * literal, a body has lets then one return, buffer flags); names and types
 * are sema's job. */
#include <string.h>

#include "fe_internal.h"
#include "parse.h"
#include "lex.h"

/* ---- name tables ---------------------------------------------------------- */

const char *type_name(Type t) {
  static const char *const names[] = {"<error>", "bool", "int", "float"};
  return (unsigned)t < 4 ? names[t] : "<error>";
}

static const char *const dtype_names[] = {"f32", "f16", "bf16", "i32", "i64", "u8", "bool"};

const char *dtype_name(DType t) { return (unsigned)t <= DT_BOOL ? dtype_names[t] : "?"; }

Type dtype_value_type(DType t) {
  switch (t) {
  case DT_F32: case DT_F16: case DT_BF16: return TY_FLOAT;
  case DT_I32: case DT_I64: case DT_U8: return TY_INT;
  case DT_BOOL: return TY_BOOL;
  }
  return TY_ERROR;
}

const char *size_name(SizeName s) {
  static const char *const names[] = {"B", "H", "HKV", "Q_LEN", "KV_LEN",
                                      "TOTAL_Q", "TOTAL_KV", "Q_START", "KV_START"};
  return (unsigned)s < SZ_COUNT ? names[s] : "?";
}

static const char *const builtin_names[BI_COUNT] = {
    [BI_NONE] = "", [BI_ABS] = "abs", [BI_MIN] = "min", [BI_MAX] = "max",
    [BI_CLAMP] = "clamp", [BI_EXP] = "exp", [BI_EXP2] = "exp2", [BI_LOG] = "log",
    [BI_LOG2] = "log2", [BI_SQRT] = "sqrt", [BI_RSQRT] = "rsqrt", [BI_TANH] = "tanh",
    [BI_SIGMOID] = "sigmoid", [BI_SIN] = "sin", [BI_COS] = "cos", [BI_FLOOR] = "floor",
    [BI_CEIL] = "ceil", [BI_ERF] = "erf", [BI_POW] = "pow", [BI_FLOORDIV] = "floordiv",
    [BI_FLOORMOD] = "floormod", [BI_WHERE] = "where", [BI_FLOAT] = "float", [BI_INT] = "int",
    [BI_SUM] = "sum",
};

const char *builtin_name(Builtin b) { return (unsigned)b < BI_COUNT ? builtin_names[b] : "?"; }

Builtin builtin_lookup(const char *name) {
  for (int b = BI_NONE + 1; b < BI_COUNT; b++)
    if (!strcmp(builtin_names[b], name)) return (Builtin)b;
  return BI_NONE;
}

const char *astop_spelling(AstOp op) {
  static const char *const sp[AOP_COUNT] = {
      [AOP_NEG] = "-",  [AOP_NOT] = "!",   [AOP_BNOT] = "~", [AOP_ADD] = "+", [AOP_SUB] = "-",
      [AOP_MUL] = "*",  [AOP_DIV] = "/",   [AOP_MOD] = "%",  [AOP_LT] = "<",  [AOP_LE] = "<=",
      [AOP_GT] = ">",   [AOP_GE] = ">=",   [AOP_EQ] = "==",  [AOP_NE] = "!=", [AOP_AND] = "&&",
      [AOP_OR] = "||",  [AOP_BAND] = "&",  [AOP_BOR] = "|",  [AOP_BXOR] = "^", [AOP_SHL] = "<<",
      [AOP_SHR] = ">>"};
  return (unsigned)op < AOP_COUNT ? sp[op] : "?";
}

bool fe_is_fn(const Decl *d) {
  return d->kind == D_SCORE || d->kind == D_MASK || d->kind == D_SINK || d->kind == D_FUNC;
}

Type fe_param_type(const Decl *fn, int i) {
  if (fn->kind == D_FUNC) return fn->fn.ptypes[i];
  return fn->kind == D_SCORE && i == 0 ? TY_FLOAT : TY_INT;
}

Type fe_return_type(const Decl *fn) {
  return fn->kind == D_FUNC ? fn->fn.rtype : fn->kind == D_MASK ? TY_BOOL : TY_FLOAT;
}

Decl *prog_find(const Program *p, const char *id) {
  for (int i = 0; i < p->ndecls; i++)
    if (!strcmp(p->decls[i]->id, id)) return p->decls[i];
  return NULL;
}

/* ---- expressions ---------------------------------------------------------- */

static Expr *new_expr(Parser *ps, ExprKind k, Loc loc) {
  Expr *e = arena_alloc(ps->a, sizeof *e);
  e->kind = k;
  e->loc = loc;
  e->type = TY_ERROR;
  return e;
}

/* The literal 2147483648 (or 0x80000000) is only valid negated: it waits
 * in ps->big until fe_unary takes it or the declaration ends. */
Expr *fe_int_lit(Parser *ps, int64_t v, Loc loc) {
  Expr *e = new_expr(ps, EX_INT, loc);
  e->ival = v > INT32_MAX ? INT32_MIN : (int32_t)v;
  if (v > INT32_MAX) ARENA_PUSH(ps->a, ps->big, ps->nbig, ps->bigcap, e);
  return e;
}

/* Report the literals 2^31 that no minus took. */
static void flush_big(Parser *ps) {
  for (int i = 0; i < ps->nbig; i++) {
    Loc l = ps->big[i]->loc;
    diag_error(ps->d, l, "integer literal '%.*s' does not fit in a 32-bit int", (int)(l.end - l.start),
               ps->src->text + l.start);
  }
  ps->nbig = 0;
}

Expr *fe_float_lit(Parser *ps, double v, Loc loc) {
  Expr *e = new_expr(ps, EX_FLOAT, loc);
  e->fval = v;
  return e;
}

Expr *fe_bool_lit(Parser *ps, bool v, Loc loc) {
  Expr *e = new_expr(ps, EX_BOOL, loc);
  e->bval = v;
  return e;
}

Expr *fe_name(Parser *ps, const char *id, Loc loc) {
  Expr *e = new_expr(ps, EX_NAME, loc);
  e->name.id = id;
  return e;
}

Expr *fe_unary(Parser *ps, AstOp op, Expr *a, Loc loc) {
  if (op == AOP_NEG && ps->nbig && ps->big[ps->nbig - 1] == a) {
    ps->nbig--; /* -2147483648: the literal already holds INT32_MIN */
    a->loc = loc;
    return a;
  }
  Expr *e = new_expr(ps, EX_UNARY, loc);
  e->op.op = op;
  e->op.a = a;
  return e;
}

Expr *fe_binary(Parser *ps, AstOp op, Expr *a, Expr *b, Loc loc) {
  Expr *e = new_expr(ps, EX_BINARY, loc);
  e->op.op = op;
  e->op.a = a;
  e->op.b = b;
  return e;
}

Expr *fe_cond(Parser *ps, Expr *c, Expr *a, Expr *b, Loc loc) {
  Expr *e = new_expr(ps, EX_COND, loc);
  e->cond.c = c;
  e->cond.a = a;
  e->cond.b = b;
  return e;
}

Expr *fe_call(Parser *ps, const char *id, Loc id_loc, ExprList *args, Loc loc) {
  Expr *e = new_expr(ps, EX_CALL, loc);
  e->call.id = id;
  e->call.id_loc = id_loc;
  e->call.args = args ? args->v : NULL;
  e->call.nargs = args ? args->n : 0;
  return e;
}

Expr *fe_index(Parser *ps, const char *id, Loc id_loc, ExprList *args, Loc loc) {
  Expr *e = new_expr(ps, EX_INDEX, loc);
  e->index.id = id;
  e->index.id_loc = id_loc;
  e->index.args = args->v;
  e->index.nargs = args->n;
  return e;
}

/* Parentheses make no node; the expression's range grows to include them
 * so that messages underline what the user wrote. */
Expr *fe_paren(Parser *ps, Expr *e, Loc loc) {
  (void)ps;
  e->loc = loc;
  return e;
}

ExprList *fe_exprs(Parser *ps, ExprList *l, Expr *e) {
  if (!l) l = arena_alloc(ps->a, sizeof *l);
  ARENA_PUSH(ps->a, l->v, l->n, l->cap, e);
  return l;
}

NameList *fe_names(Parser *ps, NameList *l, const char *id, Loc loc) {
  if (!l) l = arena_alloc(ps->a, sizeof *l);
  int n1 = l->n, n2 = l->n; /* two arrays grow in step */
  ARENA_PUSH(ps->a, l->v, n1, l->cap, id);
  ARENA_PUSH(ps->a, l->locs, n2, l->lcap, loc);
  l->n = n1;
  return l;
}

/* ---- buffers ---------------------------------------------------------------- */

static DimList *push_dim(Parser *ps, DimList *l, Dim d) {
  if (!l) l = arena_alloc(ps->a, sizeof *l);
  ARENA_PUSH(ps->a, l->v, l->n, l->cap, d);
  return l;
}

DimList *fe_dim_lit(Parser *ps, DimList *l, int64_t v, Loc loc) {
  if (v > INT32_MAX)
    diag_error(ps->d, loc, "integer literal '%.*s' does not fit in a 32-bit int", (int)(loc.end - loc.start),
               ps->src->text + loc.start);
  else if (v <= 0) diag_error(ps->d, loc, "a dimension must be positive, not %lld", (long long)v);
  Dim d = {.kind = DIM_LIT, .loc = loc, .value = (int32_t)v};
  return push_dim(ps, l, d);
}

/* Named dimensions start as symbols; sema turns them into consts or
 * predefined sizes when the name is one. */
DimList *fe_dim_name(Parser *ps, DimList *l, const char *id, Loc loc) {
  Dim d = {.kind = DIM_SYM, .loc = loc, .id = id};
  return push_dim(ps, l, d);
}

BufFlags fe_flag(Parser *ps, BufFlags f, bool sorted, Loc loc) {
  bool *have = sorted ? &f.sorted : &f.grad;
  if (*have) diag_error(ps->d, loc, "'%s' is given twice", sorted ? "sorted" : "grad");
  *have = true;
  if (sorted) f.sorted_loc = loc;
  else f.grad_loc = loc;
  return f;
}

/* ---- bodies and kernels -------------------------------------------------- */

Body *fe_body_let(Parser *ps, Body *b, const char *id, Loc idloc, Expr *e) {
  if (!b) b = arena_alloc(ps->a, sizeof *b);
  if (b->ret) {
    diag_error(ps->d, idloc, "'let' after 'return': the 'return' must come last");
    return b;
  }
  Let *l = arena_alloc(ps->a, sizeof *l);
  l->id = id;
  l->loc = idloc;
  l->value = e;
  ARENA_PUSH(ps->a, b->lets, b->nlets, b->cap, l);
  return b;
}

Body *fe_body_return(Parser *ps, Body *b, Expr *e, Loc kwloc) {
  if (!b) b = arena_alloc(ps->a, sizeof *b);
  if (b->ret) {
    diag_error(ps->d, kwloc, "a second 'return': a body ends with exactly one 'return'");
    diag_note(ps->d, b->ret_loc, "the first 'return' is here");
    return b;
  }
  b->ret = e;
  b->ret_loc = kwloc;
  return b;
}

Body *fe_body_assign(Parser *ps, Body *b, const char *id, Loc idloc) {
  diag_error(ps->d, idloc, "'%s' cannot be assigned: names are immutable (use 'let' with a new name)",
             id);
  return b;
}

KItems *fe_kitem_score(Parser *ps, KItems *k, const char *id, Loc loc, Loc whole) {
  if (!k) k = arena_alloc(ps->a, sizeof *k);
  if (k->has_score) {
    diag_error(ps->d, whole, "the kernel sets 'score' twice");
    return k;
  }
  k->has_score = true;
  k->score = id;
  k->score_loc = loc;
  return k;
}

KItems *fe_kitem_sink(Parser *ps, KItems *k, const char *id, Loc loc, Loc whole) {
  if (!k) k = arena_alloc(ps->a, sizeof *k);
  if (k->has_sink) {
    diag_error(ps->d, whole, "the kernel sets 'sink' twice (a kernel has at most one sink)");
    return k;
  }
  k->has_sink = true;
  k->sink = id;
  k->sink_loc = loc;
  return k;
}

KItems *fe_kitem_mask(Parser *ps, KItems *k, Expr *e, Loc whole) {
  if (!k) k = arena_alloc(ps->a, sizeof *k);
  if (k->has_mask) {
    diag_error(ps->d, whole, "the kernel sets 'mask' twice");
    return k;
  }
  k->has_mask = true;
  k->mask = e;
  return k;
}

/* ---- declarations ---------------------------------------------------------- */

static Decl *new_decl(Parser *ps, DeclKind k, const char *id, Loc idloc, Loc whole) {
  flush_big(ps);
  Decl *d = arena_alloc(ps->a, sizeof *d);
  d->kind = k;
  d->id = id;
  d->loc = idloc;
  d->whole = whole;
  d->index = ps->counts[k]++;
  Program *p = ps->prog;
  ARENA_PUSH(ps->a, p->decls, p->ndecls, ps->cap, d);
  /* Errors come in source order: one since the previous declaration ended
   * (a syntax error, a bad character, a misplaced statement) lies in this
   * one, and its checks would report cascades. */
  if (ps->d->errors > ps->errors_done || ps->last_syntax_error > whole.start)
    ARENA_PUSH(ps->a, ps->lost.broken, ps->lost.nbroken, ps->lost.bcap, d);
  return d;
}

void fe_decl_done(Parser *ps) {
  flush_big(ps);
  ps->errors_done = ps->d->errors;
}

static void lose_name(Parser *ps, const char *id) {
  ARENA_PUSH(ps->a, ps->lost.names, ps->lost.nnames, ps->lost.ncap, id);
}

static bool ident_char(char c, bool first) {
  return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (!first && c >= '0' && c <= '9');
}

/* Every identifier-like word in the skipped text may have been the name of
 * a declaration; over-collecting only silences a few cascades. */
void fe_decl_lost(Parser *ps, Loc whole) {
  const char *t = ps->src->text;
  uint32_t i = whole.start, end = whole.end < ps->src->len ? whole.end : (uint32_t)ps->src->len;
  while (i < end) {
    if (!ident_char(t[i], true) || (i > 0 && ident_char(t[i - 1], false))) {
      i++;
      continue;
    }
    uint32_t j = i;
    while (j < end && ident_char(t[j], false)) j++;
    lose_name(ps, arena_strndup(ps->a, t + i, j - i));
    i = j;
  }
}

/* A param default: a number literal, possibly negated. Returns false (after
 * a diagnostic) for anything else. */
static bool literal_value(Parser *ps, Expr *e, bool *is_float, double *v) {
  bool neg = false;
  Expr *x = e;
  if (x->kind == EX_UNARY && x->op.op == AOP_NEG) {
    neg = true;
    x = x->op.a;
  }
  if (x->kind != EX_INT && x->kind != EX_FLOAT) {
    diag_error(ps->d, e->loc, "a param default must be a number literal");
    return false;
  }
  *is_float = x->kind == EX_FLOAT;
  *v = *is_float ? x->fval : (double)x->ival;
  if (neg) *v = -*v;
  return true;
}

void fe_decl_param(Parser *ps, int tok_type, Loc tloc, const char *id, Loc idloc, Expr *def,
                   Loc whole) {
  if (tok_type == FE_TY_BOOL) {
    diag_error(ps->d, tloc, "a param must be int or float, not bool");
    lose_name(ps, id); /* its uses are not news */
    return;
  }
  Decl *d = new_decl(ps, D_PARAM, id, idloc, whole);
  d->param.type = tok_type == FE_TY_INT ? TY_INT : TY_FLOAT;
  bool is_float;
  double v;
  if (!def || !literal_value(ps, def, &is_float, &v)) return;
  if (d->param.type == TY_INT && is_float) {
    diag_error(ps->d, def->loc, "param '%s' is int, but its default is a float", id);
    return;
  }
  d->param.has_default = true;
  d->param.idefault = d->param.type == TY_INT ? (int32_t)v : 0;
  d->param.fdefault = (double)(float)v;
}

void fe_decl_const(Parser *ps, const char *id, Loc idloc, Expr *e, Loc whole) {
  Decl *d = new_decl(ps, D_CONST, id, idloc, whole);
  d->cnst.value = e;
}

static bool parse_dtype(const char *s, DType *out) {
  for (int i = 0; i <= DT_BOOL; i++)
    if (!strcmp(s, dtype_names[i])) {
      *out = (DType)i;
      return true;
    }
  return false;
}

void fe_decl_buffer(Parser *ps, const char *id, Loc idloc, const char *dtype, Loc dloc,
                    DimList *dims, BufFlags f, Loc whole) {
  Decl *d = new_decl(ps, D_BUFFER, id, idloc, whole);
  if (!parse_dtype(dtype, &d->buffer.dtype))
    diag_error(ps->d, dloc, "unknown element type '%s' (expected f32, f16, bf16, i32, i64, u8 or bool)",
               dtype);
  d->buffer.dims = dims->v;
  d->buffer.ndims = dims->n;
  d->buffer.grad = f.grad;
  d->buffer.sorted = f.sorted;
  if (dims->n > 8)
    diag_error(ps->d, idloc, "buffer '%s' has %d dimensions; at most 8 are allowed", id, dims->n);
  Type vt = dtype_value_type(d->buffer.dtype);
  if (f.grad && vt != TY_FLOAT)
    diag_error(ps->d, f.grad_loc, "'grad' is only allowed on float buffers; '%s' is %s", id,
               dtype_name(d->buffer.dtype));
  if (f.sorted && (vt != TY_INT || dims->n != 1))
    diag_error(ps->d, f.sorted_loc, "'sorted' is only allowed on 1-D integer buffers; '%s' is %s with %d dimension%s",
               id, dtype_name(d->buffer.dtype), dims->n, dims->n == 1 ? "" : "s");
}

void fe_decl_fn(Parser *ps, DeclKind kind, const char *id, Loc idloc, NameList *params,
                Body *body, Loc whole) {
  Decl *d = new_decl(ps, kind, id, idloc, whole);
  d->fn.params = params ? params->v : NULL;
  d->fn.param_locs = params ? params->locs : NULL;
  d->fn.nparams = params ? params->n : 0;
  d->fn.lets = body ? body->lets : NULL;
  d->fn.nlets = body ? body->nlets : 0;
  d->fn.ret = body ? body->ret : NULL;
  d->fn.ret_loc = body ? body->ret_loc : idloc;
  bool broken = ps->last_syntax_error > whole.start; /* the return may have been skipped */
  if (!d->fn.ret && !broken) {
    Loc end = {whole.end - 1, whole.end};
    diag_error(ps->d, end, "%s '%s' has no 'return'",
               kind == D_SCORE ? "score" : kind == D_MASK ? "mask" : kind == D_SINK ? "sink" : "function",
               id);
  }
}

static Type fe_type(int ty) { return ty == FE_TY_INT ? TY_INT : ty == FE_TY_FLOAT ? TY_FLOAT : TY_BOOL; }

NameList *fe_tnames(Parser *ps, NameList *l, int ty, const char *id, Loc loc) {
  l = fe_names(ps, l, id, loc);
  int n = l->n - 1;
  Type t = fe_type(ty);
  ARENA_PUSH(ps->a, l->types, n, l->tcap, t);
  return l;
}

void fe_decl_helper(Parser *ps, int rty, const char *id, Loc idloc, NameList *params, Body *body,
                    Loc whole) {
  fe_decl_fn(ps, D_FUNC, id, idloc, params, body, whole);
  Decl *d = ps->prog->decls[ps->prog->ndecls - 1];
  d->fn.ptypes = params ? params->types : NULL;
  d->fn.rtype = fe_type(rty);
}

void fe_decl_kernel(Parser *ps, const char *id, Loc idloc, KItems *k, Loc whole) {
  Decl *d = new_decl(ps, D_KERNEL, id, idloc, whole);
  if (!k) return;
  d->kernel.score = k->score;
  d->kernel.score_loc = k->score_loc;
  d->kernel.mask = k->mask;
  d->kernel.sink = k->sink;
  d->kernel.sink_loc = k->sink_loc;
}

/* ---- scanner hooks and the entry point --------------------------------- */

void fe_open_bracket(Parser *ps, char ch, Loc loc) {
  Bracket b = {ch, loc};
  ARENA_PUSH(ps->a, ps->br, ps->nbr, ps->brcap, b);
}

void fe_close_bracket(Parser *ps, char ch) {
  char open = ch == ')' ? '(' : ch == ']' ? '[' : '{';
  if (ps->nbr > 0 && ps->br[ps->nbr - 1].ch == open) ps->nbr--;
}

Program *fe_parse(Arena *a, const Source *src, Diags *d) {
  Program *p = arena_alloc(a, sizeof *p);
  p->src = src;
  Parser ps = {.a = a, .src = src, .d = d, .prog = p, .errors_done = d->errors};
  yyscan_t scanner;
  if (fe_yylex_init_extra(&ps, &scanner)) PANIC("cannot create the scanner");
  /* A UTF-8 byte order mark (some editors write one) is not part of the text. */
  bool bom = src->len >= 3 && !memcmp(src->text, "\xef\xbb\xbf", 3);
  ps.pos = bom ? 3 : 0;
  YY_BUFFER_STATE buf = fe_yy_scan_bytes(src->text + ps.pos, (int)(src->len - ps.pos), scanner);
  int before = d->errors;
  fe_yyparse(scanner, &ps);
  flush_big(&ps); /* a declaration cut short by the end of the file */
  fe_yy_delete_buffer(buf, scanner);
  fe_yylex_destroy(scanner);
  /* Callers stop at the first failing stage; check what parsed cleanly now
   * so that one run reports every error it can find. */
  if (d->errors > before) fe_check_rest(a, p, d, &ps.lost);
  return p;
}

const char *fe_reserved(Parser *ps, const char *word, Loc loc) {
  diag_error(ps->d, loc, "'%s' is a reserved word; it cannot name a parameter or a let", word);
  return word;
}

/* ---- Python spellings ------------------------------------------------------ */

void fe_py(Parser *ps, FePy what, Loc loc) {
  static const char *const msg[] = {
      [FE_PY_AND] = "'and' is spelled '&&' in .score",
      [FE_PY_OR] = "'or' is spelled '||' in .score",
      [FE_PY_NOT] = "'not' is spelled '!' in .score",
      [FE_PY_IF_EXPR] = "Python's 'a if c else b' is written 'c ? a : b' (or 'where(c, a, b)') in .score",
      [FE_PY_IF] = "there is no 'if' statement in .score: pick a value with 'c ? a : b' or 'where(c, a, b)'",
      [FE_PY_ELIF] = "there is no 'elif' in .score: chain 'c1 ? a : c2 ? b : c'",
      [FE_PY_ELSE] = "there is no 'else' in .score: pick a value with 'c ? a : b' or 'where(c, a, b)'",
      [FE_PY_TRUE] = "'True' is spelled 'true' in .score",
      [FE_PY_FALSE] = "'False' is spelled 'false' in .score",
      [FE_PY_NONE] = "there is no 'None' in .score: a score masks an element by returning -inf, a mask by returning false",
      [FE_PY_DEF] = "there is no 'def' in .score: declare 'score NAME(s, b, h, q, kv) { ... }', 'mask NAME(b, h, q, kv) { ... }' or a helper such as 'float NAME(float x) { ... }'",
      [FE_PY_LAMBDA] = "there is no 'lambda' in .score: declare a helper such as 'float NAME(float x) { return ...; }'",
      [FE_PY_POW] = "'**' is not an operator in .score: write 'pow(a, b)'",
      [FE_PY_FLOORDIV] = "'//' starts a comment in .score: for floor division write 'floordiv(a, b)'",
      [FE_PY_INDEX] = "a buffer with several dimensions is indexed 't[i, j]' in .score, not 't[i][j]'",
      [FE_PY_KWARG] = "there are no keyword arguments in .score: pass every argument by position",
  };
  diag_error(ps->d, loc, "%s", msg[what]);
}

Expr *fe_call2(Parser *ps, const char *id, Expr *a, Expr *b, Loc loc) {
  ExprList *l = fe_exprs(ps, fe_exprs(ps, NULL, a), b);
  return fe_call(ps, id, loc, l, loc);
}

/* A receiver that names a Python module: its functions are builtins here. */
static bool py_module(const Expr *e) {
  static const char *const mods[] = {"math", "torch", "np", "numpy", "F", "tl"};
  if (e->kind != EX_NAME) return false;
  for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++)
    if (!strcmp(e->name.id, mods[i])) return true;
  return false;
}

Expr *fe_method(Parser *ps, Expr *recv, const char *name, Loc nloc, ExprList *args, Loc loc) {
  uint32_t rl = recv->loc.end - recv->loc.start;
  const char *rt = ps->src->text + recv->loc.start;
  if (py_module(recv)) {
    diag_error(ps->d, loc, "'%s.%s' is written '%s' in .score (builtins belong to no module)",
               recv->name.id, name, name);
    return fe_call(ps, name, nloc, args, loc);
  }
  diag_error(ps->d, loc, "there are no methods in .score: write '%s(%.*s%s)' for '%.*s.%s(...)'", name,
             rl > 30 ? 30 : (int)rl, rt, args ? ", ..." : "", rl > 30 ? 30 : (int)rl, rt, name);
  ExprList *l = fe_exprs(ps, NULL, recv);
  for (int i = 0; args && i < args->n; i++) l = fe_exprs(ps, l, args->v[i]);
  return fe_call(ps, name, nloc, l, loc);
}

Expr *fe_attr(Parser *ps, Expr *recv, const char *name, Loc nloc, Loc loc) {
  if (py_module(recv))
    diag_error(ps->d, loc, "'%s.%s' is written '%s' in .score (no modules)", recv->name.id, name, name);
  else
    diag_error(ps->d, loc, "values have no attributes in .score ('.%s')", name);
  return fe_name(ps, name, nloc);
}

Expr *fe_reindex(Parser *ps, Expr *t, ExprList *args, Loc loc) {
  fe_py(ps, FE_PY_INDEX, loc);
  if (t->kind != EX_INDEX) return t;
  ExprList l = {t->index.args, t->index.nargs, t->index.nargs};
  ExprList *m = &l;
  for (int i = 0; args && i < args->n; i++) m = fe_exprs(ps, m, args->v[i]);
  t->index.args = m->v;
  t->index.nargs = m->n;
  t->loc = loc;
  return t;
}
