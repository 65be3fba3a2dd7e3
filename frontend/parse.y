/* parse.y: the .score grammar (see docs/frontend.md for the EBNF).
 *
 * A pure parser over the reentrant scanner in lex.l. Every action is one
 * call to a builder in ast.c. Error productions at declaration, statement
 * and kernel-item level let one run report several syntax errors; syntax
 * messages come from fe_yyreport_syntax_error below. */
%define api.pure full
%define api.prefix {fe_yy}
%define api.location.type {Loc}
%define parse.error custom
%locations
%expect 0
%lex-param {yyscan_t scanner}
%parse-param {yyscan_t scanner} {Parser *ps}

%code requires {
#include "frontend/fe_internal.h"
#ifndef YY_TYPEDEF_YY_SCANNER_T
#define YY_TYPEDEF_YY_SCANNER_T
typedef void *yyscan_t;
#endif
}

%code {
#include <stdio.h>
#include <string.h>
int fe_yylex(FE_YYSTYPE *lval, FE_YYLTYPE *lloc, yyscan_t scanner);
static void fe_yyerror(FE_YYLTYPE *lloc, yyscan_t scanner, Parser *ps, const char *msg);
/* A location spans its first to its last symbol; empty rules sit at the end
 * of what came before. */
#define YYLLOC_DEFAULT(Cur, Rhs, N)                                            \
  do {                                                                         \
    if (N) {                                                                   \
      (Cur).start = YYRHSLOC(Rhs, 1).start;                                    \
      (Cur).end = YYRHSLOC(Rhs, N).end;                                        \
    } else {                                                                   \
      (Cur).start = (Cur).end = YYRHSLOC(Rhs, 0).end;                          \
    }                                                                          \
  } while (0)
/* 20 000 nested parentheses need about 40 000 stack entries; deeper input
 * is diagnosed as nested too deeply instead of exhausting memory. */
#define YYMAXDEPTH 200000
#define YYINITDEPTH 256
#define YYMALLOC(n) base_realloc(NULL, (n))
#define YYFREE base_free
static Loc span(Loc a, Loc b) { Loc l = {a.start, b.end}; return l; }
}

%initial-action { @$.start = @$.end = 0; }

%union {
  int64_t ival;      /* INTLIT */
  double fval;       /* FLOATLIT */
  const char *id;    /* IDENT */
  int ty;            /* FE_TY_* */
  Expr *expr;
  ExprList *exprs;
  NameList *names;
  DimList *dims;
  BufFlags flags;
  Body *body;
  KItems *kitems;
}

%token PARAM "'param'" CONST "'const'" BUFFER "'buffer'" SCORE "'score'"
%token MASK "'mask'" KERNEL "'kernel'" LET "'let'" RETURN "'return'"
%token TRUE "'true'" FALSE "'false'" INT "'int'" FLOAT "'float'" BOOL "'bool'"
%token GRAD "'grad'" SORTED "'sorted'" SINK "'sink'"
%token <id> IDENT "identifier"
%token <ival> INTLIT "integer"
%token <fval> FLOATLIT "number"
%token EQ "'=='" NE "'!='" LE "'<='" GE "'>='" AND "'&&'" OR "'||'" SHL "'<<'" SHR "'>>'"
/* Python spellings, each an error naming the .score spelling (fe_py) */
%token PY_AND "'and'" PY_OR "'or'" PY_NOT "'not'" PY_IF "'if'" PY_ELIF "'elif'" PY_ELSE "'else'"
%token PY_TRUE "'True'" PY_FALSE "'False'" PY_NONE "'None'" PY_DEF "'def'" PY_LAMBDA "'lambda'"
%token PY_POW "'**'" PY_FLOORDIV "'//'" PY_INF "'float(\"inf\")'"

%type <expr> expr primary opt_default index
%type <id> name binder member
%type <exprs> args opt_args
%type <names> params opt_params tparams opt_tparams
%type <dims> dims
%type <flags> flags
%type <body> body
%type <kitems> kitems
%type <ty> ptype
%type <id> dtype

/* C precedence, loosest first; `?:` groups to the right. */
%right '?' ':' PY_IF PY_ELSE
%left OR PY_OR
%left AND PY_AND
%left '|'
%left '^'
%left '&'
%left EQ NE
%left '<' LE '>' GE
%left SHL SHR
%left '+' '-'
%left '*' '/' '%' PY_FLOORDIV
%precedence UNARY PY_NOT
%right PY_POW

%%

/* file := decl* */
file
  : %empty
  | file decl  { fe_decl_done(ps); }
  ;

/* decl := param | const | buffer | score | mask | sink | helper | kernel
 * helper := ptype identifier '(' [ ptype identifier (',' ptype identifier)* ] ')' '{' body '}'
 * A broken declaration is skipped up to its ';' or '}'. */
decl
  : PARAM ptype IDENT opt_default ';'  { fe_decl_param(ps, $2, @2, $3, @3, $4, @$); }
  | CONST IDENT '=' expr ';'           { fe_decl_const(ps, $2, @2, $4, @$); }
  | BUFFER IDENT ':' dtype '[' dims ']' flags ';' { fe_decl_buffer(ps, $2, @2, $4, @4, $6, $8, @$); }
  | SCORE name '(' opt_params ')' '{' body '}'  { fe_decl_fn(ps, D_SCORE, $2, @2, $4, $7, @$); }
  | MASK name '(' opt_params ')' '{' body '}'   { fe_decl_fn(ps, D_MASK, $2, @2, $4, $7, @$); }
  | SINK name '(' opt_params ')' '{' body '}'   { fe_decl_fn(ps, D_SINK, $2, @2, $4, $7, @$); }
  | ptype IDENT '(' opt_tparams ')' '{' body '}' { fe_decl_helper(ps, $1, $2, @2, $4, $7, @$); }
  | KERNEL IDENT '{' kitems '}'        { fe_decl_kernel(ps, $2, @2, $4, @$); }
  | error ';'                          { fe_decl_lost(ps, @$); }
  | error '}'                          { fe_decl_lost(ps, @$); }
  ;

/* ptype := 'int' | 'float' | 'bool' (bool is rejected with a message) */
ptype
  : INT    { $$ = FE_TY_INT; }
  | FLOAT  { $$ = FE_TY_FLOAT; }
  | BOOL   { $$ = FE_TY_BOOL; }
  ;

/* opt_default := [ '=' expr ]   (the builder requires a literal) */
opt_default
  : %empty    { $$ = NULL; }
  | '=' expr  { $$ = $2; }
  ;

/* dtype := identifier | 'bool'   (f32 f16 bf16 i32 i64 u8 are identifiers) */
dtype
  : IDENT  { $$ = $1; }
  | BOOL   { $$ = "bool"; }
  ;

/* dims := dim (',' dim)*     dim := integer | identifier */
dims
  : INTLIT            { $$ = fe_dim_lit(ps, NULL, $1, @1); }
  | IDENT             { $$ = fe_dim_name(ps, NULL, $1, @1); }
  | dims ',' INTLIT   { $$ = fe_dim_lit(ps, $1, $3, @3); }
  | dims ',' IDENT    { $$ = fe_dim_name(ps, $1, $3, @3); }
  ;

/* flags := ('grad' | 'sorted')* */
flags
  : %empty         { $$ = (BufFlags){0}; }
  | flags GRAD     { $$ = fe_flag(ps, $1, false, @2); }
  | flags SORTED   { $$ = fe_flag(ps, $1, true, @2); }
  ;

/* opt_params := [ identifier (',' identifier)* ] */
opt_params
  : %empty  { $$ = NULL; }
  | params  { $$ = $1; }
  ;
params
  : binder            { $$ = fe_names(ps, NULL, $1, @1); }
  | params ',' binder { $$ = fe_names(ps, $1, $3, @3); }
  ;
opt_tparams
  : %empty   { $$ = NULL; }
  | tparams  { $$ = $1; }
  ;
tparams
  : ptype binder             { $$ = fe_tnames(ps, NULL, $1, $2, @2); }
  | tparams ',' ptype binder { $$ = fe_tnames(ps, $1, $3, $4, @4); }
  ;

/* body := stmt*    stmt := 'let' identifier '=' expr ';' | 'return' expr ';'
 * (the builder insists on lets first and exactly one return; an assignment
 * `identifier '=' expr ';'` is parsed only to say that names are immutable) */
body
  : %empty                          { $$ = NULL; }
  | body LET binder '=' expr ';'    { $$ = fe_body_let(ps, $1, $3, @3, $5); }
  | body RETURN expr ';'            { $$ = fe_body_return(ps, $1, $3, @2); }
  | body name '=' expr ';'          { $$ = fe_body_assign(ps, $1, $2, @2); }
  | body error ';'                  { $$ = $1; }
  ;

/* kitems := kitem*
 * kitem := 'score' '=' identifier ';' | 'mask' '=' expr ';' | 'sink' '=' identifier ';' */
kitems
  : %empty                        { $$ = NULL; }
  | kitems SCORE '=' name ';'     { $$ = fe_kitem_score(ps, $1, $4, @4, @2); }
  | kitems SINK '=' name ';'      { $$ = fe_kitem_sink(ps, $1, $4, @4, @2); }
  | kitems MASK '=' expr ';'      { $$ = fe_kitem_mask(ps, $1, $4, @2); }
  | kitems error ';'              { $$ = $1; }
  ;

/* expr := expr '?' expr ':' expr | expr binop expr | ('-' | '!' | '~') expr | primary */
expr
  : expr '?' expr ':' expr      { $$ = fe_cond(ps, $1, $3, $5, @$); }
  | expr OR expr                { $$ = fe_binary(ps, AOP_OR, $1, $3, @$); }
  | expr AND expr               { $$ = fe_binary(ps, AOP_AND, $1, $3, @$); }
  | expr '|' expr               { $$ = fe_binary(ps, AOP_BOR, $1, $3, @$); }
  | expr '^' expr               { $$ = fe_binary(ps, AOP_BXOR, $1, $3, @$); }
  | expr '&' expr               { $$ = fe_binary(ps, AOP_BAND, $1, $3, @$); }
  | expr EQ expr                { $$ = fe_binary(ps, AOP_EQ, $1, $3, @$); }
  | expr NE expr                { $$ = fe_binary(ps, AOP_NE, $1, $3, @$); }
  | expr '<' expr               { $$ = fe_binary(ps, AOP_LT, $1, $3, @$); }
  | expr LE expr                { $$ = fe_binary(ps, AOP_LE, $1, $3, @$); }
  | expr '>' expr               { $$ = fe_binary(ps, AOP_GT, $1, $3, @$); }
  | expr GE expr                { $$ = fe_binary(ps, AOP_GE, $1, $3, @$); }
  | expr SHL expr               { $$ = fe_binary(ps, AOP_SHL, $1, $3, @$); }
  | expr SHR expr               { $$ = fe_binary(ps, AOP_SHR, $1, $3, @$); }
  | expr '+' expr               { $$ = fe_binary(ps, AOP_ADD, $1, $3, @$); }
  | expr '-' expr               { $$ = fe_binary(ps, AOP_SUB, $1, $3, @$); }
  | expr '*' expr               { $$ = fe_binary(ps, AOP_MUL, $1, $3, @$); }
  | expr '/' expr               { $$ = fe_binary(ps, AOP_DIV, $1, $3, @$); }
  | expr '%' expr               { $$ = fe_binary(ps, AOP_MOD, $1, $3, @$); }
  | '-' expr %prec UNARY        { $$ = fe_unary(ps, AOP_NEG, $2, @$); }
  | '!' expr %prec UNARY        { $$ = fe_unary(ps, AOP_NOT, $2, @$); }
  | '~' expr %prec UNARY        { $$ = fe_unary(ps, AOP_BNOT, $2, @$); }
  /* Python spellings: reported, then read as what they mean */
  | expr PY_OR expr             { fe_py(ps, FE_PY_OR, @2); $$ = fe_binary(ps, AOP_OR, $1, $3, @$); }
  | expr PY_AND expr            { fe_py(ps, FE_PY_AND, @2); $$ = fe_binary(ps, AOP_AND, $1, $3, @$); }
  | PY_NOT expr                 { fe_py(ps, FE_PY_NOT, @1); $$ = fe_unary(ps, AOP_NOT, $2, @$); }
  | expr PY_POW expr            { fe_py(ps, FE_PY_POW, @2); $$ = fe_call2(ps, "pow", $1, $3, @$); }
  | expr PY_FLOORDIV expr       { fe_py(ps, FE_PY_FLOORDIV, @2); $$ = fe_call2(ps, "floordiv", $1, $3, @$); }
  | expr PY_IF expr PY_ELSE expr { fe_py(ps, FE_PY_IF_EXPR, @2); $$ = fe_cond(ps, $3, $1, $5, @$); }
  | primary                     { $$ = $1; }
  ;

/* primary := integer | number | 'true' | 'false' | identifier
 *          | identifier '(' [args] ')' | ('int' | 'float') '(' [args] ')'
 *          | identifier '[' args ']' | '(' expr ')' */
primary
  : INTLIT                      { $$ = fe_int_lit(ps, $1, @1); }
  | FLOATLIT                    { $$ = fe_float_lit(ps, $1, @1); }
  | TRUE                        { $$ = fe_bool_lit(ps, true, @1); }
  | FALSE                       { $$ = fe_bool_lit(ps, false, @1); }
  | name                        { $$ = fe_name(ps, $1, @1); }
  | name '(' opt_args ')'       { $$ = fe_call(ps, $1, @1, $3, @$); }
  | INT '(' opt_args ')'        { $$ = fe_call(ps, "int", @1, $3, @$); }
  | FLOAT '(' opt_args ')'      { $$ = fe_call(ps, "float", @1, $3, @$); }
  | index                       { $$ = $1; }
  | '(' expr ')'                { $$ = fe_paren(ps, $2, @$); }
  | PY_TRUE                     { fe_py(ps, FE_PY_TRUE, @1); $$ = fe_bool_lit(ps, true, @1); }
  | PY_FALSE                    { fe_py(ps, FE_PY_FALSE, @1); $$ = fe_bool_lit(ps, false, @1); }
  | PY_NONE                     { fe_py(ps, FE_PY_NONE, @1); $$ = fe_float_lit(ps, 0.0, @1); }
  | PY_INF                      { $$ = fe_name(ps, "inf", @1); /* reported by the scanner */ }
  | primary '.' member '(' opt_args ')' { $$ = fe_method(ps, $1, $3, @3, $5, @$); }
  | primary '.' member          { $$ = fe_attr(ps, $1, $3, @3, @$); }
  ;

/* index := identifier '[' args ']'   (t[i][j] is reported and read as t[i, j]) */
index
  : name '[' args ']'           { $$ = fe_index(ps, $1, @1, $3, @$); }
  | index '[' args ']'          { $$ = fe_reindex(ps, $1, $3, @$); }
  ;

/* name := identifier | 'score' | 'mask' | 'sink' | 'grad' | 'sorted'
 * (those five are keywords only where a declaration, a kernel binding or a
 * buffer attribute is expected: a function may be named `sink`, a mask of
 * sink tokens, say) */
name
  : IDENT   { $$ = $1; }
  | SCORE   { $$ = "score"; }
  | MASK    { $$ = "mask"; }
  | SINK    { $$ = "sink"; }
  | GRAD    { $$ = "grad"; }
  | SORTED  { $$ = "sorted"; }
  ;

/* member := name | 'int' | 'float'   (x.float(), reported as a method call) */
member
  : name    { $$ = $1; }
  | INT     { $$ = "int"; }
  | FLOAT   { $$ = "float"; }
  ;

/* binder := name, where a parameter or a let is named; a reserved word
 * there is reported as one (and read as a name) */
binder
  : name    { $$ = $1; }
  | PARAM   { $$ = fe_reserved(ps, "param", @1); }
  | CONST   { $$ = fe_reserved(ps, "const", @1); }
  | BUFFER  { $$ = fe_reserved(ps, "buffer", @1); }
  | KERNEL  { $$ = fe_reserved(ps, "kernel", @1); }
  | LET     { $$ = fe_reserved(ps, "let", @1); }
  | RETURN  { $$ = fe_reserved(ps, "return", @1); }
  | TRUE    { $$ = fe_reserved(ps, "true", @1); }
  | FALSE   { $$ = fe_reserved(ps, "false", @1); }
  | INT     { $$ = fe_reserved(ps, "int", @1); }
  | FLOAT   { $$ = fe_reserved(ps, "float", @1); }
  | BOOL    { $$ = fe_reserved(ps, "bool", @1); }
  ;

/* args := expr (',' expr)* */
opt_args
  : %empty  { $$ = NULL; }
  | args    { $$ = $1; }
  ;
args
  : expr           { $$ = fe_exprs(ps, NULL, $1); }
  | args ',' expr  { $$ = fe_exprs(ps, $1, $3); }
  | name '=' expr  { fe_py(ps, FE_PY_KWARG, @1); $$ = fe_exprs(ps, NULL, $3); }
  | args ',' name '=' expr { fe_py(ps, FE_PY_KWARG, @3); $$ = fe_exprs(ps, $1, $5); }
  ;

%%

/* The name of a token for messages ("';'", "identifier", "end of file"). */
static const char *tok_name(yysymbol_kind_t k) {
  if (k == YYSYMBOL_YYEOF) return "end of file";
  return yysymbol_name(k);
}

/* Is `k` the character token spelled `c`? (Bison numbers them itself.) */
static bool is_char(yysymbol_kind_t k, char c) {
  const char *nm = yysymbol_name(k);
  return nm[0] == '\'' && nm[1] == c && nm[2] == '\'' && !nm[3];
}

/* Tokens that can start an expression: collapsed into "an expression". */
static bool starts_expr(yysymbol_kind_t k) {
  switch (k) {
  case YYSYMBOL_INTLIT: case YYSYMBOL_FLOATLIT: case YYSYMBOL_IDENT: case YYSYMBOL_TRUE:
  case YYSYMBOL_FALSE: case YYSYMBOL_INT: case YYSYMBOL_FLOAT: case YYSYMBOL_SCORE:
  case YYSYMBOL_MASK: case YYSYMBOL_SINK: case YYSYMBOL_GRAD: case YYSYMBOL_SORTED:
    return true;
  default:
    return is_char(k, '(') || is_char(k, '-') || is_char(k, '!') || is_char(k, '~');
  }
}

/* The Python spelling a token is (its message), or -1. Python tokens are
 * never listed as expected. */
static int py_token(yysymbol_kind_t k) {
  switch (k) {
  case YYSYMBOL_PY_AND: return FE_PY_AND;
  case YYSYMBOL_PY_OR: return FE_PY_OR;
  case YYSYMBOL_PY_NOT: return FE_PY_NOT;
  case YYSYMBOL_PY_IF: return FE_PY_IF;
  case YYSYMBOL_PY_ELIF: return FE_PY_ELIF;
  case YYSYMBOL_PY_ELSE: return FE_PY_ELSE;
  case YYSYMBOL_PY_TRUE: return FE_PY_TRUE;
  case YYSYMBOL_PY_FALSE: return FE_PY_FALSE;
  case YYSYMBOL_PY_NONE: return FE_PY_NONE;
  case YYSYMBOL_PY_DEF: return FE_PY_DEF;
  case YYSYMBOL_PY_LAMBDA: return FE_PY_LAMBDA;
  case YYSYMBOL_PY_POW: return FE_PY_POW;
  case YYSYMBOL_PY_FLOORDIV: return FE_PY_FLOORDIV;
  case YYSYMBOL_PY_INF: return -2; /* the scanner reported it */
  default: return -1;
  }
}

/* The innermost bracket still open before the lookahead token. */
static const Bracket *open_bracket(Parser *ps, yysymbol_kind_t look) {
  int i = ps->nbr - 1;
  bool look_opens = is_char(look, '(') || is_char(look, '[') || is_char(look, '{');
  if (look_opens) i--;
  return i >= 0 ? &ps->br[i] : NULL;
}

/* The keyword a misspelled word meant ('parm' for 'param', 'retrun' for
 * 'return'), written to out: the closest of the keyword tokens among `exp`
 * (or `only` when not NULL), within the typo distance sema's "did you
 * mean" uses. False when none is that close. */
static bool keyword_guess(const char *word, int len, const yysymbol_kind_t *exp, int n,
                          const char *only, char out[16]) {
  char w[32];
  if (len < 2 || len >= (int)sizeof w) return false;
  memcpy(w, word, (size_t)len);
  w[len] = 0;
  int cap = len <= 3 ? 1 : len <= 6 ? 2 : 3, bestd = cap + 1;
  for (int i = 0; i < (only ? 1 : n); i++) {
    char k[16];
    if (only) {
      snprintf(k, sizeof k, "%s", only);
    } else {
      const char *nm = yysymbol_name(exp[i]);
      size_t l = strlen(nm);
      if (py_token(exp[i]) != -1 || l < 4 || l - 2 >= sizeof k || nm[0] != '\'' ||
          nm[l - 1] != '\'' || nm[1] < 'a' || nm[1] > 'z')
        continue; /* not a word keyword */
      snprintf(k, sizeof k, "%.*s", (int)l - 2, nm + 1);
    }
    int d = fe_edit_distance(w, k, cap);
    if (d > 0 && d < len && d < bestd) bestd = d, snprintf(out, 16, "%s", k);
  }
  return bestd <= cap;
}

/* The word just before offset `at` when it starts a statement (it follows
 * '{', ';' or '}'): its [start, end), else false. */
static bool statement_word(const Source *src, uint32_t at, uint32_t *start, uint32_t *end) {
  const char *t = src->text;
  uint32_t e = at;
  while (e > 0 && (t[e - 1] == ' ' || t[e - 1] == '\t' || t[e - 1] == '\n' || t[e - 1] == '\r')) e--;
  uint32_t b = e;
  while (b > 0 && (t[b - 1] == '_' || (t[b - 1] >= 'a' && t[b - 1] <= 'z') ||
                   (t[b - 1] >= 'A' && t[b - 1] <= 'Z') || (t[b - 1] >= '0' && t[b - 1] <= '9')))
    b--;
  uint32_t p = b;
  while (p > 0 && (t[p - 1] == ' ' || t[p - 1] == '\t' || t[p - 1] == '\n' || t[p - 1] == '\r')) p--;
  if (b == e || p == 0 || (t[p - 1] != '{' && t[p - 1] != ';' && t[p - 1] != '}')) return false;
  *start = b, *end = e;
  return true;
}

/* "unexpected X, expected A, B or C", or "expected ')' to close '(' at line
 * N" when the parser wanted the bracket that closes an open one, "expected
 * ';' before X" when a ';' would have ended the statement, and "did you
 * mean 'param'?" for a misspelled keyword. */
static int yyreport_syntax_error(const yypcontext_t *ctx, yyscan_t scanner, Parser *ps) {
  (void)scanner;
  yysymbol_kind_t look = yypcontext_token(ctx);
  Loc loc = *yypcontext_location(ctx);
  ps->last_syntax_error = loc.start + 1;
  int py = py_token(look);
  if (py != -1) { /* a Python word where it cannot even be read as meant */
    if (py >= 0) fe_py(ps, (FePy)py, loc);
    return 0;
  }
  yysymbol_kind_t exp[YYNTOKENS];
  int n = yypcontext_expected_tokens(ctx, exp, YYNTOKENS);
  bool want_assign = false, want_semi = false;
  for (int i = 0; i < n; i++) {
    want_assign = want_assign || is_char(exp[i], '=');
    want_semi = want_semi || is_char(exp[i], ';');
  }
  uint32_t ws, we;
  if (want_assign && look != YYSYMBOL_YYEOF && statement_word(ps->src, loc.start, &ws, &we)) {
    /* `retrun s;` parses as the start of an assignment to `retrun` */
    char g[16];
    if (keyword_guess(ps->src->text + ws, (int)(we - ws), exp, n, "return", g) ||
        keyword_guess(ps->src->text + ws, (int)(we - ws), exp, n, "let", g)) {
      Loc wl = {ws, we};
      diag_error(ps->d, wl, "unknown statement '%.*s'; did you mean '%s'?", (int)(we - ws),
                 ps->src->text + ws, g);
      return 0;
    }
  }
  if (look == YYSYMBOL_IDENT) {
    char g[16];
    if (keyword_guess(ps->src->text + loc.start, (int)(loc.end - loc.start), exp, n, NULL, g)) {
      diag_error(ps->d, loc, "unexpected identifier '%.*s'; did you mean '%s'?",
                 (int)(loc.end - loc.start), ps->src->text + loc.start, g);
      return 0;
    }
  }
  const Bracket *br = open_bracket(ps, look);
  static const char closer[] = {['('] = ')', ['['] = ']', ['{'] = '}'};
  for (int i = 0; br && i < n; i++) {
    if (is_char(exp[i], closer[(int)br->ch])) {
      int line, col;
      src_linecol(ps->src, br->loc.start, &line, &col);
      diag_error(ps->d, loc, "expected '%c' to close '%c' at line %d, got %s", closer[(int)br->ch],
                 br->ch, line, tok_name(look));
      diag_note(ps->d, br->loc, "the '%c' is here", br->ch);
      return 0;
    }
  }
  if (want_semi) {
    Buf b = {0};
    buf_printf(&b, "expected ';' before %s", tok_name(look));
    if (look == YYSYMBOL_IDENT || look == YYSYMBOL_INTLIT || look == YYSYMBOL_FLOATLIT) {
      uint32_t len = loc.end - loc.start;
      buf_printf(&b, " '%.*s'", len > 40 ? 40 : (int)len, ps->src->text + loc.start);
    }
    diag_error(ps->d, loc, "%s", b.data);
    buf_free(&b);
    return 0;
  }
  const char *what[YYNTOKENS];
  int shown = 0;
  bool said_expr = false, any_expr = false;
  for (int i = 0; i < n; i++) any_expr = any_expr || exp[i] == YYSYMBOL_INTLIT;
  for (int i = 0; i < n; i++) {
    if (py_token(exp[i]) != -1) continue;
    if (!any_expr || !starts_expr(exp[i])) what[shown++] = tok_name(exp[i]);
    else if (!said_expr) what[shown++] = "an expression";
    said_expr = said_expr || starts_expr(exp[i]);
  }
  Buf b = {0};
  buf_printf(&b, "unexpected %s", tok_name(look));
  if (look == YYSYMBOL_IDENT || look == YYSYMBOL_INTLIT || look == YYSYMBOL_FLOATLIT) {
    uint32_t len = loc.end - loc.start;
    buf_printf(&b, " '%.*s'", len > 40 ? 40 : (int)len, ps->src->text + loc.start);
  }
  for (int i = 0; n > 0 && shown <= 6 && i < shown; i++)
    buf_printf(&b, "%s%s", i == 0 ? ", expected " : i == shown - 1 ? " or " : ", ", what[i]);
  diag_error(ps->d, loc, "%s", b.data);
  buf_free(&b);
  return 0;
}

/* Only "memory exhausted" arrives here (syntax errors go through
 * yyreport_syntax_error): the parse stack hit YYMAXDEPTH. */
static void fe_yyerror(FE_YYLTYPE *lloc, yyscan_t scanner, Parser *ps, const char *msg) {
  (void)scanner;
  (void)msg;
  diag_error(ps->d, *lloc, "expression nested too deeply");
}
