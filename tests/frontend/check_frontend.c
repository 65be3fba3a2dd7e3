/* Front end suite: lexing edge cases, precedence, typing, every kind of
 * diagnostic with its exact line and column, error recovery, kernel choice. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "testlib.h"

/* One parsed (and, without syntax errors, checked) file. */
typedef struct Run {
  Arena a;
  Source src;
  Diags d;
  Program *p;
  char *text;
} Run;

static Run *run_n(const char *text, size_t len, bool check) {
  Run *r = base_alloc(sizeof *r);
  r->text = base_alloc(len + 1);
  memcpy(r->text, text, len);
  r->src = (Source){.path = "t.score", .text = r->text, .len = len};
  r->d.src = &r->src;
  r->p = fe_parse(&r->a, &r->src, &r->d);
  if (check && !r->d.errors) fe_check(&r->a, r->p, &r->d);
  return r;
}

static Run *run(const char *text) { return run_n(text, strlen(text), true); }

static const char *diags(Run *r) { return r->d.text.data ? r->d.text.data : ""; }

static void done(Run *r) {
  diag_free(&r->d);
  arena_free(&r->a);
  base_free(r->text);
  base_free(r);
}

/* The expression `return`ed by the first function of a checked file. */
static Expr *ret_of(Run *r) {
  ck_assert_msg(r->d.errors == 0, "unexpected errors:\n%s", diags(r));
  for (int i = 0; i < r->p->ndecls; i++)
    if (r->p->decls[i]->kind == D_SCORE || r->p->decls[i]->kind == D_MASK) return r->p->decls[i]->fn.ret;
  ck_abort_msg("no function");
  return NULL;
}

static Expr *const_of(Run *r, const char *id) {
  Decl *d = prog_find(r->p, id);
  ck_assert_ptr_nonnull(d);
  ck_assert_int_eq(d->kind, D_CONST);
  return d->cnst.value;
}

/* ---- lexing ----------------------------------------------------------------- */

START_TEST(lex_numbers) {
  Run *r = run("const a = 0x1F;\nconst b = 1.0;\nconst c = .5;\nconst d = 2e-3;\nconst e = 1.5e+2;\n"
               "const f = 2147483647;\nconst g = 0.1;\n");
  ck_assert_msg(r->d.errors == 0, "%s", diags(r));
  ck_assert_int_eq(const_of(r, "a")->ival, 31);
  ck_assert(const_of(r, "b")->fval == 1.0);
  ck_assert(const_of(r, "c")->fval == 0.5);
  ck_assert(const_of(r, "d")->fval == (double)2e-3f);
  ck_assert(const_of(r, "e")->fval == 150.0);
  ck_assert_int_eq(const_of(r, "f")->ival, 2147483647);
  ck_assert(const_of(r, "g")->fval == (double)0.1f); /* rounded to binary32 */
  ck_assert(const_of(r, "g")->fval != 0.1);
  ck_assert_int_eq(const_of(r, "g")->type, TY_FLOAT);
  ck_assert(const_of(r, "g")->constexpr_);
  done(r);
}
END_TEST

START_TEST(lex_errors) {
  Run *r = run("const a = 2147483648;\nconst b = 0x80000000;\nconst c = 3.4e39;\n/* open");
  ck_assert_int_eq(r->d.errors, 4);
  const char *t = diags(r);
  ck_assert_ptr_nonnull(strstr(t, "t.score:1:11: error: integer literal '2147483648' does not fit in a 32-bit int\n"));
  ck_assert_ptr_nonnull(strstr(t, "t.score:2:11: error: integer literal '0x80000000'"));
  ck_assert_ptr_nonnull(strstr(t, "t.score:3:11: error: float literal '3.4e39' is too large"));
  ck_assert_ptr_nonnull(strstr(t, "t.score:4:1: error: unterminated comment"));
  done(r);
}
END_TEST

START_TEST(lex_nul_and_garbage) {
  static const char src[] = "mask m(b, h, q, kv) { return q\0 >= kv; }\n\x01\xff";
  Run *r = run_n(src, sizeof src - 1, true);
  ck_assert_int_eq(r->d.errors, 3);
  ck_assert_ptr_nonnull(strstr(diags(r), "t.score:1:31: error: unexpected byte 0x00\n"
                                         "    mask m(b, h, q, kv) { return q? >= kv; }\n"
                                         "                                  ^\n"));
  done(r);
}
END_TEST

START_TEST(lex_long_identifier) {
  size_t n = 100000;
  Buf b = {0};
  buf_puts(&b, "mask m(b, h, q, kv) { return ");
  for (size_t i = 0; i < n; i++) buf_put(&b, "x", 1);
  buf_puts(&b, " > q; }\n");
  Run *r = run(b.data);
  ck_assert_int_eq(r->d.errors, 1);
  ck_assert_ptr_nonnull(strstr(diags(r), "t.score:1:30: error: unknown name 'xxxx"));
  done(r);
  buf_free(&b);
}
END_TEST

START_TEST(comments_and_keywords) {
  Run *r = run("# hash\n// slashes\n/* block\n * more */ mask where_ok(b, h, q, kv) { let where_ = 1; "
               "return where(q > kv, true, false); }\n");
  ck_assert_msg(r->d.errors == 0, "%s", diags(r));
  ck_assert_int_eq(ret_of(r)->call.builtin, BI_WHERE);
  done(r);
  r = run("param int grad = 1;\n");
  ck_assert_ptr_nonnull(strstr(diags(r), "t.score:1:11: error: unexpected 'grad', expected identifier\n"));
  done(r);
}
END_TEST

/* ---- precedence ------------------------------------------------------------ */

START_TEST(prec_left_assoc) {
  Run *r = run("param int a = 1;\nparam int b = 2;\nparam int c = 3;\n"
               "mask m(x, h, q, kv) { return a - b - c > 0; }\n");
  Expr *e = ret_of(r);
  ck_assert_int_eq(e->kind, EX_BINARY);
  ck_assert_int_eq(e->op.op, AOP_GT);
  Expr *s = e->op.a; /* (a - b) - c */
  ck_assert_int_eq(s->op.op, AOP_SUB);
  ck_assert_int_eq(s->op.b->kind, EX_NAME);
  ck_assert_str_eq(s->op.b->name.id, "c");
  ck_assert_int_eq(s->op.a->op.op, AOP_SUB);
  ck_assert_str_eq(s->op.a->op.a->name.id, "a");
  ck_assert_int_eq(s->type, TY_INT);
  ck_assert_int_eq(s->op.a->op.a->name.ref, REF_PARAM);
  done(r);
}
END_TEST

START_TEST(prec_logic) {
  Run *r = run("mask m(b, h, q, kv) { let a = q > 0; let bb = kv > 0; let c = q > kv; return !a && bb || c; }\n");
  Expr *e = ret_of(r); /* ((!a) && bb) || c */
  ck_assert_int_eq(e->op.op, AOP_OR);
  ck_assert_int_eq(e->op.a->op.op, AOP_AND);
  ck_assert_int_eq(e->op.a->op.a->kind, EX_UNARY);
  ck_assert_int_eq(e->op.a->op.a->op.op, AOP_NOT);
  ck_assert_int_eq(e->op.b->name.ref, REF_LET);
  ck_assert_int_eq(e->type, TY_BOOL);
  done(r);
}
END_TEST

START_TEST(prec_cond_right_assoc) {
  Run *r = run("score f(s, b, h, q, kv) { let c = q > 0; let d = kv > 0; return c ? s : d ? 1 : 2; }\n");
  Expr *e = ret_of(r); /* c ? s : (d ? 1 : 2) */
  ck_assert_int_eq(e->kind, EX_COND);
  ck_assert_int_eq(e->cond.a->name.ref, REF_ARG);
  ck_assert_int_eq(e->cond.b->kind, EX_COND);
  ck_assert_int_eq(e->cond.b->type, TY_INT);
  ck_assert_int_eq(e->type, TY_FLOAT); /* promoted */
  done(r);
}
END_TEST

START_TEST(prec_arith_unary) {
  Run *r = run("score f(s, b, h, q, kv) { return -s * 2.0 + 1.0 / 3.0 % 4.0 < s == true ? 1.0 : 0.0; }\n");
  Expr *e = ret_of(r);
  Expr *eq = e->cond.c;
  ck_assert_int_eq(eq->op.op, AOP_EQ);
  Expr *lt = eq->op.a;
  ck_assert_int_eq(lt->op.op, AOP_LT);
  Expr *add = lt->op.a;
  ck_assert_int_eq(add->op.op, AOP_ADD);
  ck_assert_int_eq(add->op.a->op.op, AOP_MUL);
  ck_assert_int_eq(add->op.a->op.a->op.op, AOP_NEG);
  ck_assert_int_eq(add->op.b->op.op, AOP_MOD); /* (1.0 / 3.0) % 4.0 */
  ck_assert_int_eq(add->op.b->op.a->op.op, AOP_DIV);
  ck_assert(add->op.b->constexpr_);
  ck_assert(!add->constexpr_);
  done(r);
}
END_TEST

/* ---- typing ----------------------------------------------------------------- */

START_TEST(types_and_refs) {
  Run *r = run("param float t = 2;\nconst k = min(3, 4.0) + pi;\nbuffer x: f32[H, N];\nbuffer y: u8[N];\n"
               "score f(s, b, h, q, kv) { return x[h, clamp(kv, 0, N - 1)] + float(y[q]) * t + k + int(s); }\n");
  Expr *e = ret_of(r);
  ck_assert_int_eq(e->type, TY_FLOAT);
  Expr *k = const_of(r, "k");
  ck_assert_int_eq(k->type, TY_FLOAT);
  ck_assert(k->constexpr_);
  ck_assert_int_eq(k->op.a->call.builtin, BI_MIN);
  ck_assert_int_eq(k->op.a->call.argtype, TY_FLOAT);
  Expr *conv = e->op.b; /* int(s) */
  ck_assert_int_eq(conv->call.builtin, BI_INT);
  ck_assert_int_eq(conv->type, TY_INT);
  Expr *load = e->op.a->op.a->op.a;
  ck_assert_int_eq(load->kind, EX_INDEX);
  ck_assert_ptr_eq(load->index.buf, prog_find(r->p, "x"));
  Expr *n = load->index.args[1]->call.args[2]->op.a;
  ck_assert_int_eq(n->name.ref, REF_SYM);
  ck_assert_ptr_eq(n->name.decl, prog_find(r->p, "x"));
  ck_assert_int_eq(n->name.dim, 1);
  Decl *y = prog_find(r->p, "y");
  ck_assert_int_eq(y->buffer.dims[0].kind, DIM_SYM);
  ck_assert_int_eq(prog_find(r->p, "x")->buffer.dims[0].kind, DIM_SIZE);
  ck_assert(prog_find(r->p, "t")->param.fdefault == 2.0);
  done(r);
}
END_TEST

START_TEST(int_score_promoted) {
  Run *r = run("score f(s, b, h, q, kv) { return q - kv; }\n");
  Expr *e = ret_of(r);
  ck_assert_int_eq(e->kind, EX_CALL);
  ck_assert_int_eq(e->call.builtin, BI_FLOAT);
  ck_assert_int_eq(e->type, TY_FLOAT);
  done(r);
}
END_TEST

START_TEST(param_defaults) {
  Run *r = run("param float a = -1.5;\nparam int b = -7;\nparam float c;\n");
  ck_assert_msg(r->d.errors == 0, "%s", diags(r));
  ck_assert(prog_find(r->p, "a")->param.fdefault == -1.5);
  ck_assert_int_eq(prog_find(r->p, "b")->param.idefault, -7);
  ck_assert(!prog_find(r->p, "c")->param.has_default);
  ck_assert_int_eq(prog_find(r->p, "c")->index, 2);
  done(r);
}
END_TEST

/* ---- diagnostics ----------------------------------------------------------- */

/* Each source must give exactly one error whose first line is `want`. */
static const struct {
  const char *src, *want;
} one_error[] = {
    {"mask m(b, h, q, kv) {\n  return (q >= kv;\n}\n", "t.score:2:18: error: expected ')' to close '(' at line 2, got ';'"},
    {"mask m(b, h, q, kv) { return float(q); }\n", "t.score:1:30: error: mask 'm' must return bool, not float"},
    {"buffer t: f32[H, H];\nscore f(s, b, h, q, kv) { return t[h]; }\n", "t.score:2:34: error: buffer 't' has 2 dimensions but is indexed with 1"},
    {"score f(s, b, h, q, kv) {\n    return foo;\n}\n", "t.score:2:12: error: unknown name 'foo'"},
    {"param int x;\nconst x = 1;\n", "t.score:2:7: error: 'x' is already defined"},
    {"mask f(b, h, q, kv) { return g(b, h, q, kv); }\nmask g(b, h, q, kv) { return f(b, h, q, kv); }\n", "t.score:1:30: error: recursion: 'f' calls itself (through 'g')"},
    {"mask f(b, h, q, kv) { return f(b, h, q, kv); }\n", "t.score:1:30: error: recursion: 'f' calls itself"},
    {"mask a(b, h, q, kv) { return c(b, h, q, kv); }\nmask c(b, h, q, kv) { return d(b, h, q, kv); }\nmask d(b, h, q, kv) { return c(b, h, q, kv) || e(b, h, q, kv); }\nmask e(b, h, q, kv) { return true; }\n", "t.score:2:30: error: recursion: 'c' calls itself (through 'd')"},
    {"score f(s, b, h, q, kv) { return s; }\nmask g(b, h, q, kv) { return g2(b, h, q, kv); }\nscore f2(s, b, h, q, kv) { return f2(s, b, h, q, kv); }\nmask g2(b, h, q, kv) { return true; }\n", "t.score:3:35: error: recursion: 'f2' calls itself"},
    {"buffer t: bool[H] grad;\n", "t.score:1:19: error: 'grad' is only allowed on float buffers; 't' is bool"},
    {"buffer t: i32[H, H] sorted;\n", "t.score:1:21: error: 'sorted' is only allowed on 1-D integer buffers; 't' is i32 with 2 dimensions"},
    {"score f(s, b, h, q, kv) { return s; }\nscore g(s, b, h, q, kv) { return f(s, b, h, q); }\n", "t.score:2:34: error: function 'f' takes 5 arguments, got 4"},
    {"score f(s, b, h, q) { return s; }\n", "t.score:1:7: error: score function must have 5 parameters (s, b, h, q, kv), got 4"},
    {"param int w = 1;\nmask m(b, h, q, kv) { let w = 2; return true; }\n", "t.score:2:27: error: 'w' shadows the param 'w'"},
    {"mask m(b, h, q, kv) { let pi = 2; return true; }\n", "t.score:1:27: error: 'pi' is a predefined name and cannot be redefined"},
    {"mask m(b, h, q, kv) { return q && true; }\n", "t.score:1:30: error: operands of '&&' must be bool, not int"},
    {"score f(s, b, h, q, kv) { return exp(true); }\n", "t.score:1:38: error: argument 1 of 'exp' must be float, not bool"},
    {"score f(s, b, h, q, kv) { return min(s); }\n", "t.score:1:34: error: 'min' takes 2 arguments, got 1"},
    {"buffer t: f32[N];\nscore f(s, b, h, q, kv) { return t[s]; }\n", "t.score:2:36: error: index 1 of 't' must be int, not float"},
    {"param int p;\nconst c = 2 * p;\n", "t.score:2:15: error: const 'c' must be a compile-time constant"},
    {"buffer t: f32[1,2,3,4,5,6,7,8,9];\n", "t.score:1:8: error: buffer 't' has 9 dimensions; at most 8 are allowed"},
    {"param int n = 2.5;\n", "t.score:1:15: error: param 'n' is int, but its default is a float"},
    {"kernel k { score = m; }\nmask m(b, h, q, kv) { return true; }\n", "t.score:1:20: error: 'm' is a mask function, not a score function"},
    {"mask m(b, h, q, kv) { return true; }\nkernel k { mask = m || 1; }\n", "t.score:2:24: error: a kernel's mask may only combine mask names"},
    {"mask m(b, h, q, kv) { return q >= kv ? true : 1; }\n", "t.score:1:30: error: the branches of '?:' have different types: bool and int"},
    {"const a = b;\nconst b = a;\n", "t.score:1:7: error: const 'a' is defined in terms of itself"},
    {"mask m(b, h, q, kv) { return true; return false; }\n", "t.score:1:36: error: a second 'return'"},
};

START_TEST(error_messages) {
  for (size_t i = 0; i < sizeof one_error / sizeof one_error[0]; i++) {
    Run *r = run(one_error[i].src);
    const char *t = diags(r);
    ck_assert_msg(r->d.errors == 1, "case %zu: %d errors:\n%s", i, r->d.errors, t);
    ck_assert_msg(!strncmp(t, one_error[i].want, strlen(one_error[i].want)), "case %zu: got\n%s\nwant\n%s", i, t,
                  one_error[i].want);
    done(r);
  }
}
END_TEST

START_TEST(caret_rendering) {
  Run *r = run("mask m(b, h, q, kv) {\n\tlet x\t= 1;\n\treturn\tx + 2;\n}\n");
  ck_assert_str_eq(diags(r), "t.score:3:9: error: mask 'm' must return bool, not int\n"
                             "    \treturn\tx + 2;\n"
                             "    \t      \t^~~~~\n");
  done(r);
}
END_TEST

START_TEST(note_for_duplicate) {
  Run *r = run("param float x = 1.0;\nbuffer x: f32[H];\n");
  ck_assert_str_eq(diags(r), "t.score:2:8: error: 'x' is already defined\n"
                             "    buffer x: f32[H];\n"
                             "           ^\n"
                             "t.score:1:13: note: 'x' was first defined here\n"
                             "    param float x = 1.0;\n"
                             "                ^\n");
  done(r);
}
END_TEST

START_TEST(several_errors) {
  Run *r = run("param float a = 1.0\nconst c = 2;\nmask m(b, h, q, kv) {\n  let x = (q + ;\n  return q >= kv;\n}\n"
               "const k = 3 +;\n");
  ck_assert_int_eq(r->d.errors, 3);
  const char *t = diags(r);
  ck_assert_ptr_nonnull(strstr(t, "t.score:2:1: error: expected ';' before 'const'\n"));
  ck_assert_ptr_nonnull(strstr(t, "t.score:4:16: error: unexpected ';', expected an expression\n"));
  ck_assert_ptr_nonnull(strstr(t, "t.score:7:14: error: unexpected ';', expected an expression\n"));
  done(r);
  r = run("score f(s, b, h, q, kv) { return s + u + v; }\nmask m(b, h, q, kv) { return 1; }\n");
  ck_assert_int_eq(r->d.errors, 3);
  done(r);
}
END_TEST

/* After a syntax error the clean declarations are still checked; broken
 * ones are not, and names lost with a declaration cause no cascade. */
START_TEST(recovery_checks_the_rest) {
  Run *r = run("const c = 2 * ;\nmask m(b, h, q, kv) { return q + kv; }\n"
               "score f(s, b, h, q, kv) {\n  let x = s + ;\n  return x && true;\n}\n"
               "kernel k { score = f; mask = m && gone && n; }\nmask n(b, h, q, kv) { return q >= c; }\n");
  const char *t = diags(r);
  ck_assert_msg(r->d.errors == 4, "%s", t);
  ck_assert_ptr_nonnull(strstr(t, "t.score:1:15: error: unexpected ';', expected an expression\n"));
  ck_assert_ptr_nonnull(strstr(t, "t.score:4:15: error: unexpected ';', expected an expression\n"));
  ck_assert_ptr_nonnull(strstr(t, "t.score:2:30: error: mask 'm' must return bool, not int\n"));
  ck_assert_ptr_nonnull(strstr(t, "t.score:7:35: error: unknown mask 'gone'\n"));
  ck_assert_ptr_null(strstr(t, "'c'"));
  ck_assert_ptr_null(strstr(t, "'x'"));
  done(r);
  /* A bad character breaks its declaration like a syntax error does. */
  r = run("mask m(b, h, q, kv) { return q >= kv\x01; }\nmask n(b, h, q, kv) { return 1; }\n");
  t = diags(r);
  ck_assert_msg(r->d.errors == 2, "%s", t);
  ck_assert_ptr_nonnull(strstr(t, "mask 'n' must return bool, not int"));
  done(r);
}
END_TEST

START_TEST(error_limit) {
  Buf b = {0};
  for (int i = 0; i < 80; i++) buf_printf(&b, "const c%d = nope;\n", i);
  Run *r = run(b.data);
  ck_assert_int_eq(r->d.errors, 80);
  const char *t = diags(r);
  const char *stop = strstr(t, "too many errors; stopping\n");
  ck_assert_ptr_nonnull(stop);
  ck_assert_str_eq(stop, "too many errors; stopping\n");
  ck_assert_ptr_nonnull(strstr(t, "t.score:50:"));
  ck_assert_ptr_null(strstr(t, "t.score:51:"));
  done(r);
  buf_free(&b);
}
END_TEST

START_TEST(deep_nesting) {
  Buf b = {0};
  buf_puts(&b, "const c = ");
  for (int i = 0; i < 20000; i++) buf_puts(&b, "(");
  buf_puts(&b, "1");
  for (int i = 0; i < 20000; i++) buf_puts(&b, ")");
  buf_puts(&b, ";\n");
  Run *r = run(b.data);
  ck_assert_msg(r->d.errors == 0, "%s", diags(r));
  done(r);
  b.len = 0;
  buf_puts(&b, "const c = ");
  for (int i = 0; i < 20000; i++) buf_puts(&b, "-(");
  buf_puts(&b, "1");
  for (int i = 0; i < 20000; i++) buf_puts(&b, ")");
  buf_puts(&b, ";\n");
  r = run(b.data);
  ck_assert_int_eq(r->d.errors, 1);
  /* level d >= 1 is the parenthesised operand of a '-', at column 12 + 2 (d - 1) */
  ck_assert_ptr_nonnull(strstr(diags(r), "t.score:1:2012: error: expression nested too deeply"));
  done(r);
  buf_free(&b);
}
END_TEST

/* ---- kernels --------------------------------------------------------------- */

START_TEST(pick_kernels) {
  Run *r = run("score f(s, b, h, q, kv) { return s; }\nmask m(b, h, q, kv) { return true; }\n");
  Decl *k = fe_pick_kernel(&r->a, r->p, NULL, &r->d);
  ck_assert_ptr_nonnull(k);
  ck_assert(k->kernel.implicit);
  ck_assert_str_eq(k->id, "default");
  ck_assert_ptr_eq(k->kernel.score_fn, prog_find(r->p, "f"));
  ck_assert_int_eq(k->kernel.mask->name.ref, REF_MASK);
  done(r);

  r = run("mask a(b, h, q, kv) { return true; }\nmask c(b, h, q, kv) { return true; }\n"
          "kernel k1 { mask = a; }\nkernel k2 { mask = a && !c; }\n");
  ck_assert_msg(r->d.errors == 0, "%s", diags(r));
  ck_assert_ptr_null(fe_pick_kernel(&r->a, r->p, NULL, &r->d));
  ck_assert_str_eq(diags(r), "t.score: error: the file has 2 kernels ('k1' and 'k2'); pick one with --kernel NAME\n");
  k = fe_pick_kernel(&r->a, r->p, "k2", &r->d);
  ck_assert_ptr_eq(k, prog_find(r->p, "k2"));
  ck_assert_int_eq(k->kernel.mask->op.b->op.a->name.ref, REF_MASK);
  ck_assert_ptr_null(fe_pick_kernel(&r->a, r->p, "zz", &r->d));
  ck_assert_ptr_nonnull(strstr(diags(r), "no kernel named 'zz'; the file's kernels are 'k1' and 'k2'"));
  done(r);

  r = run("mask a(b, h, q, kv) { return true; }\nmask c(b, h, q, kv) { return true; }\n");
  ck_assert_ptr_null(fe_pick_kernel(&r->a, r->p, NULL, &r->d));
  ck_assert_ptr_nonnull(strstr(diags(r), "2 mask functions ('a' and 'c')"));
  done(r);

  r = run("");
  k = fe_pick_kernel(&r->a, r->p, NULL, &r->d);
  ck_assert_ptr_nonnull(k);
  ck_assert_ptr_null(k->kernel.score_fn);
  ck_assert_ptr_null(k->kernel.mask);
  done(r);
}
END_TEST

int main(void) {
  return TL_MAIN("frontend", 0, TL_TEST(lex_numbers), TL_TEST(lex_errors), TL_TEST(lex_nul_and_garbage),
                 TL_TEST(lex_long_identifier), TL_TEST(comments_and_keywords), TL_TEST(prec_left_assoc),
                 TL_TEST(prec_logic), TL_TEST(prec_cond_right_assoc), TL_TEST(prec_arith_unary),
                 TL_TEST(types_and_refs), TL_TEST(int_score_promoted), TL_TEST(param_defaults),
                 TL_TEST(error_messages), TL_TEST(caret_rendering), TL_TEST(note_for_duplicate),
                 TL_TEST(several_errors), TL_TEST(recovery_checks_the_rest), TL_TEST(error_limit),
                 TL_TEST(deep_nesting), TL_TEST(pick_kernels));
}
