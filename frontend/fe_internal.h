/* fe_internal.h: what the scanner, the parser and the AST builders share
 * inside frontend/. Nothing outside frontend/ includes this. */
#ifndef FLEXC_FE_INTERNAL_H
#define FLEXC_FE_INTERNAL_H

#include "frontend.h"

/* Deepest expression nesting sema accepts; deeper trees are diagnosed so
 * that no recursive pass can run out of C stack. */
#define FE_MAX_DEPTH 1000

/* A growable list of expressions (call arguments, indices). */
typedef struct ExprList {
  Expr **v;  /* the expressions */
  int n;     /* used */
  int cap;    /* allocated */
} ExprList;

/* A function's parameter names. */
typedef struct NameList {
  const char **v; /* the names */
  Loc *locs;      /* where each is written */
  Type *types;    /* a helper's parameter types (NULL for score and mask) */
  int n;          /* used */
  int cap, lcap, tcap; /* allocated (names, locations, types) */
} NameList;

/* A buffer's dimensions as written. */
typedef struct DimList {
  Dim *v;     /* the dimensions */
  int n;      /* used */
  int cap;    /* allocated */
} DimList;

/* The `grad` / `sorted` flags after a buffer's dims. */
typedef struct BufFlags {
  bool grad, sorted;        /* present */
  Loc grad_loc, sorted_loc; /* where (valid when present) */
} BufFlags;

/* A function body while it is parsed: lets, then one return. */
typedef struct Body {
  Let **lets;   /* in order */
  int nlets;    /* used */
  int cap;      /* allocated */
  Expr *ret;    /* the return expression (NULL until seen) */
  Loc ret_loc;  /* the `return` keyword */
} Body;

/* The items of a kernel block while it is parsed. */
typedef struct KItems {
  const char *score; /* `score = NAME;` (NULL when absent) */
  Loc score_loc;     /* NAME */
  Expr *mask;        /* `mask = EXPR;` (NULL when absent) */
  const char *sink;  /* `sink = NAME;` (NULL when absent) */
  Loc sink_loc;      /* NAME */
  bool has_score, has_mask, has_sink; /* seen (duplicates are diagnosed) */
} KItems;

/* An open bracket the scanner has seen and not yet closed. */
typedef struct Bracket {
  char ch;  /* '(' '[' or '{' */
  Loc loc;  /* where */
} Bracket;

/* What syntax errors took away, so that checking the rest of the file stays
 * quiet about it (its messages would be cascades, not news). */
typedef struct FeLost {
  Decl **broken;      /* declarations that contain a syntax error: not checked */
  int nbroken, bcap;  /* used, allocated */
  const char **names; /* identifiers written in declarations lost whole */
  int nnames, ncap;   /* used, allocated */
} FeLost;

/* Parser state, shared with the scanner through yyextra. */
typedef struct Parser {
  Arena *a;          /* where the AST lives */
  const Source *src; /* the file */
  Diags *d;          /* where errors go */
  Program *prog;     /* the program being built */
  int cap;           /* allocated slots of prog->decls */
  uint32_t pos;      /* byte offset of the scanner */
  Bracket *br;       /* open brackets, innermost last */
  int nbr;           /* used */
  int brcap;         /* allocated */
  int counts[D_KERNEL + 1]; /* decls per kind so far (Decl.index) */
  uint32_t last_syntax_error; /* 1 + offset of the latest syntax error; 0: none */
  FeLost lost;       /* declarations broken or lost by syntax errors */
  int errors_done;   /* d->errors when the latest declaration ended */
  Expr **big;        /* literals 2^31 not (yet) negated: errors unless a '-' takes them */
  int nbig, bigcap;  /* used, allocated */
} Parser;

/* ---- builders (ast.c), called from the grammar actions ---- */
Expr *fe_int_lit(Parser *ps, int64_t v, Loc loc);
Expr *fe_float_lit(Parser *ps, double v, Loc loc);
Expr *fe_bool_lit(Parser *ps, bool v, Loc loc);
Expr *fe_name(Parser *ps, const char *id, Loc loc);
Expr *fe_unary(Parser *ps, AstOp op, Expr *a, Loc loc);
Expr *fe_binary(Parser *ps, AstOp op, Expr *a, Expr *b, Loc loc);
Expr *fe_cond(Parser *ps, Expr *c, Expr *a, Expr *b, Loc loc);
Expr *fe_call(Parser *ps, const char *id, Loc id_loc, ExprList *args, Loc loc);
Expr *fe_index(Parser *ps, const char *id, Loc id_loc, ExprList *args, Loc loc);
Expr *fe_paren(Parser *ps, Expr *e, Loc loc);
ExprList *fe_exprs(Parser *ps, ExprList *l, Expr *e);
NameList *fe_names(Parser *ps, NameList *l, const char *id, Loc loc);
/* A typed parameter `TYPE NAME` of a helper (ty: FE_TY_*). */
NameList *fe_tnames(Parser *ps, NameList *l, int ty, const char *id, Loc loc);
DimList *fe_dim_lit(Parser *ps, DimList *l, int64_t v, Loc loc);
DimList *fe_dim_name(Parser *ps, DimList *l, const char *id, Loc loc);
BufFlags fe_flag(Parser *ps, BufFlags f, bool sorted, Loc loc);
Body *fe_body_let(Parser *ps, Body *b, const char *id, Loc idloc, Expr *e);
/* `x = e;`: reported (names are immutable); the body is unchanged. */
Body *fe_body_assign(Parser *ps, Body *b, const char *id, Loc idloc);
Body *fe_body_return(Parser *ps, Body *b, Expr *e, Loc kwloc);
KItems *fe_kitem_score(Parser *ps, KItems *k, const char *id, Loc loc, Loc whole);
KItems *fe_kitem_mask(Parser *ps, KItems *k, Expr *e, Loc whole);
KItems *fe_kitem_sink(Parser *ps, KItems *k, const char *id, Loc loc, Loc whole);
void fe_decl_param(Parser *ps, int tok_type, Loc tloc, const char *id, Loc idloc, Expr *def, Loc whole);
void fe_decl_const(Parser *ps, const char *id, Loc idloc, Expr *e, Loc whole);
void fe_decl_buffer(Parser *ps, const char *id, Loc idloc, const char *dtype, Loc dloc,
                    DimList *dims, BufFlags f, Loc whole);
void fe_decl_fn(Parser *ps, DeclKind kind, const char *id, Loc idloc, NameList *params,
                Body *body, Loc whole);
/* `int|float|bool NAME(TYPE a, ...) { BODY }` (rty: FE_TY_*). */
void fe_decl_helper(Parser *ps, int rty, const char *id, Loc idloc, NameList *params, Body *body,
                    Loc whole);
void fe_decl_kernel(Parser *ps, const char *id, Loc idloc, KItems *k, Loc whole);
/* A declaration has ended: errors after this belong to the next one. */
void fe_decl_done(Parser *ps);
/* A declaration skipped whole by error recovery: remember its names. */
void fe_decl_lost(Parser *ps, Loc whole);

/* Python spellings (fe_py): each an error that names the .score spelling. */
typedef enum FePy {
  FE_PY_AND, FE_PY_OR, FE_PY_NOT, FE_PY_IF_EXPR, FE_PY_IF, FE_PY_ELIF, FE_PY_ELSE, FE_PY_TRUE,
  FE_PY_FALSE, FE_PY_NONE, FE_PY_DEF, FE_PY_LAMBDA, FE_PY_POW, FE_PY_FLOORDIV, FE_PY_INDEX,
  FE_PY_KWARG,
} FePy;
/* A reserved word where a name is declared: reported; returns the word. */
const char *fe_reserved(Parser *ps, const char *word, Loc loc);
/* Report the Python spelling `what` at `loc`. */
void fe_py(Parser *ps, FePy what, Loc loc);
/* `recv.name(args)`: a method call or a module function (math.exp, torch.where),
 * reported; read as name(recv, args...) or name(args...). */
Expr *fe_method(Parser *ps, Expr *recv, const char *name, Loc nloc, ExprList *args, Loc loc);
/* `recv.name` (math.pi): reported; read as the name. */
Expr *fe_attr(Parser *ps, Expr *recv, const char *name, Loc nloc, Loc loc);
/* `t[i][j]`: reported; read as t[i, j]. */
Expr *fe_reindex(Parser *ps, Expr *t, ExprList *args, Loc loc);
/* A call with two arguments (a ** b as pow(a, b), a // b as floordiv(a, b)). */
Expr *fe_call2(Parser *ps, const char *id, Expr *a, Expr *b, Loc loc);

/* Parameter type keywords for fe_decl_param. */
enum { FE_TY_INT, FE_TY_FLOAT, FE_TY_BOOL };

/* ---- sema (sema.c) and the call graph (callgraph.c) ---- */
/* A call from one function to another, as sema meets it. */
typedef struct FeCall {
  Decl *from, *to; /* caller, callee */
  Loc loc;         /* the callee's name at the call */
} FeCall;
/* Recursion, call chains too deep and bodies too large once inlined, from
 * every call of the program (in source order); reports to `d`. */
void fe_check_calls(Arena *a, const Program *p, Diags *d, const FeCall *calls, int ncalls);

/* fe_check() after syntax errors: skips the broken declarations and reports
 * no unknown names that a lost declaration may have defined. */
int fe_check_rest(Arena *a, Program *p, Diags *d, const FeLost *lost);
/* Edit distance of a and b, or cap + 1 when it exceeds cap ("did you mean"). */
int fe_edit_distance(const char *a, const char *b, int cap);

/* ---- scanner helpers (lex.l) ---- */
/* Note an opening/closing bracket; the parser uses the stack for messages
 * like "expected ')' to close '(' at line 3". */
void fe_open_bracket(Parser *ps, char ch, Loc loc);
void fe_close_bracket(Parser *ps, char ch);

#endif
