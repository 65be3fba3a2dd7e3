/* frontend.h: the .score front end, in pipeline order.
 *
 *   1. source   a file's bytes and the mapping from byte offsets to lines
 *   2. diag     FILE:LINE:COL: error: MESSAGE, the source line, a ^~~~ underline
 *   3. lex      flex scanner (lex.l), reentrant, byte-range locations
 *   4. parse    bison parser (parse.y), pure, error recovery, builds the AST
 *   5. sema     name resolution and type checking (sema.c), annotates the AST
 *
 * The AST is the door to ir/lower.c: after fe_check() succeeds every Expr has
 * its type and every name its referent, and lowering needs nothing else.
 */
#ifndef FLEXC_FRONTEND_H
#define FLEXC_FRONTEND_H

#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"

/* ---- 1. source ---------------------------------------------------------- */

/* A byte range [start, end) in the source. */
typedef struct Loc {
  uint32_t start, end;
} Loc;

/* One input file. */
typedef struct Source {
  const char *path; /* as given by the user; used in diagnostics */
  const char *text; /* the bytes (may contain NULs); text[len] == 0 */
  size_t len;       /* byte count */
} Source;

/* 1-based line and column (in bytes) of a byte offset. */
void src_linecol(const Source *src, uint32_t off, int *line, int *col);

/* ---- 2. diagnostics ----------------------------------------------------- */

/* Collects the diagnostics of one run as rendered text. */
typedef struct Diags {
  const Source *src; /* the file the locations refer to */
  Buf text;          /* every rendered diagnostic, in order */
  int errors;        /* number of errors so far */
  int limit;         /* stop recording after this many (0: default 50) */
  bool dropped;      /* the last error was not recorded (a repeat): drop its notes */
} Diags;

/* Report an error at `loc`: renders "FILE:LINE:COL: error: MSG", the source
 * line, and a caret underline of the range (clipped to its first line). */
void diag_error(Diags *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Report an error that has no source location ("FILE: error: MSG"). */
void diag_error_noloc(Diags *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Attach a note to the last error ("FILE:LINE:COL: note: MSG" + caret). */
void diag_note(Diags *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_free(Diags *d);

/* ---- 3-4. the AST --------------------------------------------------------- */

/* Language types. TY_ERROR marks an expression whose type could not be
 * determined (an error was already reported; suppresses cascades). */
typedef enum Type { TY_ERROR, TY_BOOL, TY_INT, TY_FLOAT } Type;
const char *type_name(Type t); /* "bool", "int", "float", "<error>" */

/* Buffer element types as written in `buffer NAME: DTYPE[...]`. */
typedef enum DType { DT_F32, DT_F16, DT_BF16, DT_I32, DT_I64, DT_U8, DT_BOOL } DType;
const char *dtype_name(DType t);  /* "f32", ... */
Type dtype_value_type(DType t);   /* the language type a load yields */

/* Predefined integer sizes, bound at launch. */
/* TOTAL_Q .. KV_START: packed batches (docs/language.md); Q_LEN, KV_LEN, 0, 0 in an ordinary call */
typedef enum SizeName {
  SZ_B, SZ_H, SZ_HKV, SZ_Q_LEN, SZ_KV_LEN, SZ_TOTAL_Q, SZ_TOTAL_KV, SZ_Q_START, SZ_KV_START, SZ_COUNT
} SizeName;
const char *size_name(SizeName s); /* "B", "H", ... */

/* Builtin functions. Overloads are resolved by sema into Expr.type and the
 * argument types (after promotion). */
typedef enum Builtin {
  BI_NONE,
  BI_ABS, BI_MIN, BI_MAX, BI_CLAMP,               /* int or float */
  BI_EXP, BI_EXP2, BI_LOG, BI_LOG2, BI_SQRT, BI_RSQRT, BI_TANH, BI_SIGMOID,
  BI_SIN, BI_COS, BI_FLOOR, BI_CEIL, BI_ERF, BI_POW, /* float only */
  BI_FLOORDIV, BI_FLOORMOD,                       /* int only */
  BI_WHERE,                                       /* any type */
  BI_FLOAT, BI_INT,                               /* conversions float(x), int(x) */
  BI_SUM,                                         /* sum(i, LO, HI, EXPR) */
  BI_COUNT
} Builtin;
const char *builtin_name(Builtin b);
Builtin builtin_lookup(const char *name); /* BI_NONE if not a builtin */

/* Unary and binary operators. */
typedef enum AstOp {
  AOP_NEG, AOP_NOT, AOP_BNOT,                            /* unary: - ! ~ */
  AOP_ADD, AOP_SUB, AOP_MUL, AOP_DIV, AOP_MOD,
  AOP_LT, AOP_LE, AOP_GT, AOP_GE, AOP_EQ, AOP_NE,
  AOP_AND, AOP_OR,
  AOP_BAND, AOP_BOR, AOP_BXOR, AOP_SHL, AOP_SHR,        /* & | ^ << >> */
  AOP_COUNT
} AstOp;
const char *astop_spelling(AstOp op); /* "-", "!", "+", ... */

typedef struct Expr Expr;
typedef struct Decl Decl;
typedef struct Let Let;

/* Expression kinds; the comment names the valid union member. */
typedef enum ExprKind {
  EX_INT,   /* ival */
  EX_FLOAT, /* fval */
  EX_BOOL,  /* bval */
  EX_NAME,  /* name */
  EX_UNARY, /* op (b unused) */
  EX_BINARY,/* op */
  EX_COND,  /* cond: c ? a : b */
  EX_CALL,  /* call: builtin or user function */
  EX_INDEX, /* index: buffer load NAME[i, j, ...] */
} ExprKind;

/* What an EX_NAME refers to after sema. */
typedef enum RefKind {
  REF_NONE,  /* unresolved (error reported) */
  REF_ARG,   /* function parameter: arg = 0..4 for score (s,b,h,q,kv), 0..3 for mask (b,h,q,kv) */
  REF_LET,   /* let binding: let */
  REF_PARAM, /* runtime param: decl */
  REF_CONST, /* compile-time const: decl */
  REF_SIZE,  /* predefined size: size */
  REF_SYM,   /* free size symbol of a buffer dimension: decl (the buffer), dim */
  REF_INF,   /* the float constant inf */
  REF_PI,    /* the float constant pi (rounded to binary32) */
  REF_MASK,  /* inside a kernel's mask expression: decl (a mask function) */
  REF_SUM,   /* the index of an enclosing sum(i, LO, HI, EXPR): sum (the call) */
} RefKind;

struct Expr {
  ExprKind kind;
  Loc loc;          /* the whole expression */
  Type type;        /* set by sema (TY_ERROR before) */
  bool constexpr_;  /* set by sema: built only from literals, consts, inf, pi and builtins of them */
  union {
    int32_t ival;   /* EX_INT */
    double fval;    /* EX_FLOAT: the literal's value rounded to binary32 */
    bool bval;      /* EX_BOOL */
    struct {
      const char *id;  /* the identifier */
      RefKind ref;     /* set by sema */
      int arg;         /* REF_ARG: parameter position */
      Let *let;        /* REF_LET */
      Decl *decl;      /* REF_PARAM, REF_CONST, REF_SYM, REF_MASK */
      int dim;         /* REF_SYM: which dimension of decl */
      SizeName size;   /* REF_SIZE */
      Expr *sum;       /* REF_SUM: the sum(...) call that binds it */
    } name;
    struct {
      AstOp op;
      Expr *a, *b;     /* b is NULL for unary */
      Type optype;     /* set by sema: the operand type after promotion */
    } op;
    struct {
      Expr *c, *a, *b;
    } cond;
    struct {
      const char *id;  /* the callee's name */
      Loc id_loc;      /* the callee's name only */
      Expr **args;
      int nargs;
      Builtin builtin; /* set by sema: BI_NONE for a user function */
      Decl *fn;        /* set by sema: the score, mask or helper function called */
      Type argtype;    /* set by sema: common operand type for overloaded builtins */
      int32_t sum_lo, sum_hi; /* BI_SUM: the bounds, set by ir_check_values */
    } call;
    struct {
      const char *id;  /* the buffer's name */
      Loc id_loc;
      Expr **args;
      int nargs;
      Decl *buf;       /* set by sema */
    } index;
  };
};

/* `let NAME = EXPR;` inside a body. */
struct Let {
  const char *id;
  Loc loc;       /* the name */
  Expr *value;
};

/* A buffer dimension: a literal, a const, a predefined size, or a fresh
 * symbol bound from the tensor's actual shape at launch. */
typedef enum DimKind { DIM_LIT, DIM_CONST, DIM_SIZE, DIM_SYM } DimKind;
typedef struct Dim {
  DimKind kind;
  Loc loc;
  int32_t value;  /* DIM_LIT; DIM_CONST once ir_check_values evaluates it */
  const char *id; /* DIM_CONST, DIM_SIZE, DIM_SYM: as written */
  Decl *cdecl;    /* DIM_CONST: the const (set by sema) */
  SizeName size;  /* DIM_SIZE */
} Dim;

/* Top-level declarations; the comment names the valid union member. */
typedef enum DeclKind {
  D_PARAM,  /* param */
  D_CONST,  /* cnst */
  D_BUFFER, /* buffer */
  D_SCORE,  /* fn */
  D_MASK,   /* fn */
  D_SINK,   /* fn: an attention sink's logit, sink NAME(b, h, q) -> float */
  D_FUNC,   /* fn: a typed helper, int|float|bool NAME(TYPE a, ...) */
  D_KERNEL, /* kernel */
} DeclKind;

struct Decl {
  DeclKind kind;
  const char *id;
  Loc loc;      /* the name */
  Loc whole;    /* the whole declaration */
  int index;    /* position among the file's decls of the same kind (params: runtime slot) */
  union {
    struct {
      Type type;       /* TY_INT or TY_FLOAT */
      bool has_default;
      double fdefault; /* TY_FLOAT default (binary32-rounded) */
      int32_t idefault;/* TY_INT default */
    } param;
    struct {
      Expr *value;     /* the defining expression (constexpr) */
      Expr *folded;    /* its value as a literal, set by ir_check_values */
    } cnst;
    struct {
      DType dtype;
      Dim *dims;
      int ndims;
      bool grad;       /* the backward returns d loss / d buffer */
      bool sorted;     /* 1-D integer, non-decreasing */
    } buffer;
    struct {
      const char **params; /* parameter names (5 for score, 4 for mask) */
      Loc *param_locs;
      Type *ptypes;        /* D_FUNC: parameter types (score, mask: fe_param_type) */
      Type rtype;          /* D_FUNC: the return type */
      int nparams;
      Let **lets;
      int nlets;
      Expr *ret;           /* the return expression */
      Loc ret_loc;         /* the `return` keyword */
    } fn;
    struct {
      const char *score;   /* NULL when absent */
      Loc score_loc;
      Decl *score_fn;      /* set by sema */
      Expr *mask;          /* NULL when absent; EX_NAME (REF_MASK), EX_UNARY !, EX_BINARY && || */
      const char *sink;    /* NULL when absent */
      Loc sink_loc;
      Decl *sink_fn;       /* set by sema */
      bool implicit;       /* the implicit `default` kernel (no kernel block in the file) */
    } kernel;
  };
};

/* A parsed file. */
typedef struct Program {
  const Source *src;
  Decl **decls; /* in source order */
  int ndecls;
} Program;

/* Look up a top-level declaration by name (NULL if none). */
Decl *prog_find(const Program *p, const char *id);
/* The type of parameter i of a score, mask, sink or helper function, and
 * what it returns (score: float, int, int, int, int -> float; mask: int x4
 * -> bool; sink: int x3 -> float). */
Type fe_param_type(const Decl *fn, int i);
Type fe_return_type(const Decl *fn);
/* Whether d is a function (score, mask, sink or helper). */
bool fe_is_fn(const Decl *d);

/* ---- entry points ------------------------------------------------------- */

/* Parse a whole file. Always returns a Program (possibly partial); syntax
 * errors go to `d`. Everything is allocated in `a`. */
Program *fe_parse(Arena *a, const Source *src, Diags *d);

/* Resolve names and check types of the whole program, annotating the AST.
 * Returns the number of errors reported (0: the program is well-formed). */
int fe_check(Arena *a, Program *p, Diags *d);

/* Pick the kernel a run means (docs/language.md "Which kernel a file means"): the
 * named one, the only one, or the implicit `default` kernel (synthesised in
 * `a` and appended to the program). NULL after reporting an error. */
Decl *fe_pick_kernel(Arena *a, Program *p, const char *name, Diags *d);

#endif
