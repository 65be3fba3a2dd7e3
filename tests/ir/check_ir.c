/* The IR: folding exactness, simplification, CSE, DCE, lowering (calls
 * inlined, masks combined, constant zero divisors), the verifier and the
 * printer. Folding is checked against C's own binary32/int32 arithmetic and,
 * on random integer DAGs, against the interpreter before and after the
 * passes. */
#include <check.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "testlib.h"

/* ---- helpers ---------------------------------------------------------------- */

static Arena arena;

static void teardown(void) { arena_free(&arena); }

static IrFunc *fn(IrFuncKind k) { return ir_func_new(&arena, "t", k); }

static int arg(IrFunc *f, IrArg a) {
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = IR_ARG;
  in.aux = a;
  in.type = a == ARG_S || a == ARG_DT ? IT_F32 : IT_I32;
  return ir_push(&arena, f, in);
}

static int count_op(const IrFunc *f, IrOp op) {
  int n = 0;
  for (int i = 0; i < f->n; i++) n += f->inst[i].op == op;
  return n;
}

/* The folded constant of a one-op function, or a failure. */
static IrVal folded(IrFunc *f) {
  ir_fold(&arena, f);
  ck_assert_int_eq(f->n, 1);
  ck_assert_int_eq(f->inst[f->ret].op, IR_CONST);
  return f->inst[f->ret].imm;
}

static int32_t fold_i2(IrOp op, int32_t a, int32_t b) {
  IrFunc *f = fn(IRF_SCORE);
  f->ret = ir_op2(&arena, f, op, ir_const_i(&arena, f, a), ir_const_i(&arena, f, b));
  return folded(f).i;
}

static double fold_f2(IrOp op, float a, float b) {
  IrFunc *f = fn(IRF_SCORE);
  f->ret = ir_op2(&arena, f, op, ir_const_f(&arena, f, a), ir_const_f(&arena, f, b));
  return folded(f).f;
}

static int32_t wrap_ref(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }

/* A random int that often hits the edges. */
static int32_t rand_int(uint64_t *st) {
  static const int32_t edge[] = {0, 1, -1, 2, -2, INT32_MAX, INT32_MIN, 7, -7, 16777217};
  uint64_t r = tl_rand(st);
  if (r % 4 == 0) return edge[(r >> 8) % (sizeof edge / sizeof edge[0])];
  return (int32_t)(uint32_t)(r >> 16);
}

/* Parse, check, lower and compile `text`; print the module into *out and the
 * diagnostics into *diag. Returns 0, or 1 when there were errors. */
static int ir_text(const char *text, bool grad, const char *after, Buf *out, Buf *diag) {
  Source *src = arena_alloc(&arena, sizeof *src);
  src->path = "t.score";
  src->text = text;
  src->len = strlen(text);
  Diags d;
  memset(&d, 0, sizeof d);
  d.src = src;
  int rc = 1;
  Program *p = fe_parse(&arena, src, &d);
  if (!d.errors && !fe_check(&arena, p, &d) && !ir_check_values(&arena, p, &d)) {
    Decl *k = fe_pick_kernel(&arena, p, NULL, &d);
    IrModule *m = k ? ir_lower(&arena, p, k) : NULL;
    if (m) {
      ck_assert(ir_compile(m, grad, after));
      ir_print(out, m);
      rc = 0;
    }
  }
  buf_puts(diag, d.text.data ? d.text.data : "");
  diag_free(&d);
  if (!out->data) buf_puts(out, "");
  return rc;
}

/* Occurrences of `needle` in `hay`. */
static int count_str(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* ---- folding exactness ------------------------------------------------------------ */

START_TEST(fold_int_wraps) {
  uint64_t st = tl_seed() ^ 1;
  for (int k = 0; k < 2000; k++) {
    int32_t a = rand_int(&st), b = rand_int(&st);
    ck_assert_int_eq(fold_i2(IR_ADD_I, a, b), wrap_ref((int64_t)a + b));
    ck_assert_int_eq(fold_i2(IR_SUB_I, a, b), wrap_ref((int64_t)a - b));
    ck_assert_int_eq(fold_i2(IR_MUL_I, a, b), wrap_ref((int64_t)a * b));
    /* C semantics, computed in 64 bits so INT_MIN / -1 is defined here. */
    int32_t q = b == 0 ? 0 : wrap_ref((int64_t)a / b);
    int32_t r = b == 0 ? a : wrap_ref((int64_t)a % b);
    ck_assert_int_eq(fold_i2(IR_DIV_I, a, b), q);
    ck_assert_int_eq(fold_i2(IR_MOD_I, a, b), r);
    arena_free(&arena);
  }
  ck_assert_int_eq(fold_i2(IR_DIV_I, INT32_MIN, -1), INT32_MIN);
  ck_assert_int_eq(fold_i2(IR_MOD_I, INT32_MIN, -1), 0);
  ck_assert_int_eq(fold_i2(IR_DIV_I, 17, 0), 0);
  ck_assert_int_eq(fold_i2(IR_MOD_I, 17, 0), 17);
  ck_assert_int_eq(fold_i2(IR_DIV_I, -7, 2), -3);
  ck_assert_int_eq(fold_i2(IR_MOD_I, -7, 2), -1);
}
END_TEST

START_TEST(fold_float_is_binary32) {
  uint64_t st = tl_seed() ^ 2;
  for (int k = 0; k < 2000; k++) {
    volatile float a = (float)(tl_normal(&st) * 1e3), b = (float)(tl_normal(&st) * 1e-2);
    ck_assert(fold_f2(IR_ADD_F, a, b) == (double)(float)(a + b));
    ck_assert(fold_f2(IR_SUB_F, a, b) == (double)(float)(a - b));
    ck_assert(fold_f2(IR_MUL_F, a, b) == (double)(float)(a * b));
    ck_assert(fold_f2(IR_DIV_F, a, b) == (double)(float)(a / b));
    ck_assert(fold_f2(IR_MOD_F, a, b) == (double)fmodf(a, b));
    arena_free(&arena);
  }
  /* Overflow to inf and inf - inf = NaN are kept, as on the device. */
  ck_assert(isinf(fold_f2(IR_MUL_F, 3e38f, 10.0f)));
  ck_assert(isnan(fold_f2(IR_SUB_F, INFINITY, INFINITY)));
}
END_TEST

START_TEST(fold_conversions) {
  uint64_t st = tl_seed() ^ 3;
  for (int k = 0; k < 2000; k++) {
    int32_t v = rand_int(&st);
    IrFunc *f = fn(IRF_SCORE);
    f->ret = ir_op1(&arena, f, IR_I2F, ir_const_i(&arena, f, v));
    ck_assert(folded(f).f == (double)(float)v);
    arena_free(&arena);
  }
  IrFunc *f = fn(IRF_SCORE);
  f->ret = ir_op1(&arena, f, IR_I2F, ir_const_i(&arena, f, 16777217));
  ck_assert(folded(f).f == 16777216.0);
  static const struct { double in; int32_t out; } cases[] = {
      {1e10, INT32_MAX}, {-1e10, INT32_MIN}, {NAN, 0}, {-2.75, -2}, {2.75, 2},
      {INFINITY, INT32_MAX}, {-INFINITY, INT32_MIN}, {2147483520.0, 2147483520}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    f = fn(IRF_MASK);
    f->ret = ir_op2(&arena, f, IR_EQ_I, ir_op1(&arena, f, IR_F2I, ir_const_f(&arena, f, cases[k].in)),
                    ir_const_i(&arena, f, cases[k].out));
    ck_assert_msg(folded(f).b, "int(%g) != %d", cases[k].in, cases[k].out);
  }
}
END_TEST

/* Transcendentals are not correctly rounded on the device: never folded by
 * ir_fold, but folded by const evaluation. */
START_TEST(fold_keeps_inexact_ops) {
  IrFunc *f = fn(IRF_SCORE);
  f->ret = ir_op1(&arena, f, IR_EXP, ir_const_f(&arena, f, 1.0));
  ir_fold(&arena, f);
  ck_assert_int_eq(count_op(f, IR_EXP), 1);
  IrVal v;
  ck_assert(ir_fold_eval(&arena, f, &v));
  ck_assert(v.f == (double)(float)exp(1.0));
}
END_TEST

/* ---- simplification ---------------------------------------------------------------- */

/* s + 0.0 * float(q) is s; s * 0.0 and s - s are not 0 (s may be NaN/inf). */
START_TEST(simplify_float_identities) {
  IrFunc *f = fn(IRF_SCORE);
  int s = arg(f, ARG_S), q = arg(f, ARG_Q);
  int z = ir_op2(&arena, f, IR_MUL_F, ir_const_f(&arena, f, 0.0), ir_op1(&arena, f, IR_I2F, q));
  f->ret = ir_op2(&arena, f, IR_ADD_F, s, z);
  ir_fold(&arena, f);
  ck_assert_int_eq(f->n, 1);
  ck_assert_int_eq(f->inst[f->ret].op, IR_ARG);

  f = fn(IRF_SCORE);
  s = arg(f, ARG_S);
  int a = ir_op2(&arena, f, IR_MUL_F, s, ir_const_f(&arena, f, 0.0));
  int b = ir_op2(&arena, f, IR_SUB_F, s, s);
  f->ret = ir_op2(&arena, f, IR_ADD_F, a, b);
  ir_fold(&arena, f);
  ck_assert_int_eq(count_op(f, IR_MUL_F), 1);
  ck_assert_int_eq(count_op(f, IR_SUB_F), 1);

  f = fn(IRF_SCORE);
  s = arg(f, ARG_S);
  a = ir_op2(&arena, f, IR_MUL_F, ir_const_f(&arena, f, 1.0), s);
  a = ir_op2(&arena, f, IR_DIV_F, a, ir_const_f(&arena, f, 1.0));
  f->ret = ir_op2(&arena, f, IR_SUB_F, a, ir_const_f(&arena, f, 0.0));
  ir_fold(&arena, f);
  ck_assert_int_eq(f->n, 1);
}
END_TEST

START_TEST(simplify_bool_and_select) {
  IrFunc *f = fn(IRF_MASK);
  int q = arg(f, ARG_Q), kv = arg(f, ARG_KV);
  int lt = ir_op2(&arena, f, IR_LT_I, q, kv);
  int nn = ir_op1(&arena, f, IR_NOT, ir_op1(&arena, f, IR_NOT, lt));
  int t = ir_op2(&arena, f, IR_AND, nn, ir_const_b(&arena, f, true));
  int w = ir_op3(&arena, f, IR_SELECT, ir_const_b(&arena, f, true), t, ir_const_b(&arena, f, false));
  f->ret = ir_op3(&arena, f, IR_SELECT, w, ir_const_b(&arena, f, true), ir_const_b(&arena, f, false));
  ir_fold(&arena, f);
  ck_assert_int_eq(f->n, 3);
  ck_assert_int_eq(f->inst[f->ret].op, IR_LT_I);

  /* !(q < kv) is kv <= q for ints; select with equal arms is the arm. */
  f = fn(IRF_MASK);
  q = arg(f, ARG_Q);
  kv = arg(f, ARG_KV);
  lt = ir_op1(&arena, f, IR_NOT, ir_op2(&arena, f, IR_LT_I, q, kv));
  f->ret = ir_op3(&arena, f, IR_SELECT, lt, lt, lt);
  ir_fold(&arena, f);
  ck_assert_int_eq(f->inst[f->ret].op, IR_LE_I);
  ck_assert_int_eq(f->inst[f->ret].args[0], kv);
  ck_assert_int_eq(count_op(f, IR_NOT), 0);
}
END_TEST

START_TEST(simplify_int_identities) {
  IrFunc *f = fn(IRF_MASK);
  int q = arg(f, ARG_Q), kv = arg(f, ARG_KV);
  int x = ir_op2(&arena, f, IR_MUL_I, q, ir_const_i(&arena, f, 1));
  x = ir_op2(&arena, f, IR_ADD_I, x, ir_op2(&arena, f, IR_SUB_I, kv, kv));
  x = ir_op2(&arena, f, IR_ADD_I, x, ir_op2(&arena, f, IR_MUL_I, kv, ir_const_i(&arena, f, 0)));
  x = ir_op2(&arena, f, IR_DIV_I, x, ir_const_i(&arena, f, 1));
  /* (q + 3) + 4 -> q + 7 */
  x = ir_op2(&arena, f, IR_ADD_I, ir_op2(&arena, f, IR_ADD_I, x, ir_const_i(&arena, f, 3)),
             ir_const_i(&arena, f, 4));
  f->ret = ir_op2(&arena, f, IR_LT_I, x, kv);
  ir_fold(&arena, f);
  ir_verify(NULL, f);
  ck_assert_int_eq(count_op(f, IR_ADD_I), 1);
  ck_assert_int_eq(count_op(f, IR_MUL_I) + count_op(f, IR_SUB_I) + count_op(f, IR_DIV_I), 0);
  const IrInst *add = &f->inst[f->inst[f->ret].args[0]];
  ck_assert_int_eq(add->op, IR_ADD_I);
  ck_assert_int_eq(f->inst[add->args[1]].imm.i, 7);
}
END_TEST

/* Random integer/bool DAGs over the arguments: the interpreter gives the same
 * value before and after fold + cse + dce. */
static int random_inst(IrFunc *f, uint64_t *st, int nints, const int *ints, int nb, const int *bools,
                       IrType *t) {
  static const IrOp iops[] = {IR_ADD_I, IR_SUB_I, IR_MUL_I, IR_DIV_I, IR_MOD_I, IR_MIN_I, IR_MAX_I};
  static const IrOp bops[] = {IR_LT_I, IR_LE_I, IR_EQ_I, IR_NE_I};
  uint64_t r = tl_rand(st);
  int x = ints[r % (uint64_t)nints], y = ints[(r >> 8) % (uint64_t)nints];
  switch ((r >> 16) % 8) {
  case 0: *t = IT_I32; return ir_op1(&arena, f, (r >> 20) & 1 ? IR_NEG_I : IR_ABS_I, x);
  case 1: *t = IT_BOOL; return ir_op2(&arena, f, bops[(r >> 20) % 4], x, y);
  case 2:
    if (nb == 0) break;
    *t = IT_I32;
    return ir_op3(&arena, f, IR_SELECT, bools[(r >> 20) % (uint64_t)nb], x, y);
  case 3:
    if (nb < 2) break;
    *t = IT_BOOL;
    return ir_op2(&arena, f, (r >> 20) & 1 ? IR_AND : IR_OR, bools[(r >> 21) % (uint64_t)nb],
                  bools[(r >> 30) % (uint64_t)nb]);
  case 4:
    if (nb == 0) break;
    *t = IT_BOOL;
    return ir_op1(&arena, f, IR_NOT, bools[(r >> 20) % (uint64_t)nb]);
  default: break;
  }
  *t = IT_I32;
  return ir_op2(&arena, f, iops[(r >> 20) % 7], x, y);
}

START_TEST(fold_preserves_values) {
  uint64_t st = tl_seed() ^ 4;
  for (int trial = 0; trial < 300; trial++) {
    IrFunc *f = fn(IRF_MASK);
    int ints[64], bools[64], ni = 0, nb = 0;
    for (int a = ARG_B; a <= ARG_KV; a++) ints[ni++] = arg(f, (IrArg)a);
    for (int k = 0; k < 4; k++) ints[ni++] = ir_const_i(&arena, f, rand_int(&st));
    bools[nb++] = ir_const_b(&arena, f, tl_rand(&st) & 1);
    while (ni < 60 && nb < 60) {
      IrType t;
      int v = random_inst(f, &st, ni, ints, nb, bools, &t);
      if (t == IT_I32) ints[ni++] = v;
      else bools[nb++] = v;
    }
    f->ret = ir_op2(&arena, f, IR_LT_I, ints[ni - 1], ints[ni - 2]);
    f->ret = ir_op2(&arena, f, IR_AND, f->ret, bools[nb - 1]);
    IrFunc *g = fn(IRF_MASK);
    *g = *f;
    g->inst = arena_alloc(&arena, sizeof(IrInst) * (size_t)f->n);
    memcpy(g->inst, f->inst, sizeof(IrInst) * (size_t)f->n);
    ir_fold(&arena, g);
    ir_cse(&arena, g);
    ir_dce(&arena, g);
    ir_verify(NULL, g);
    IrVal *vals = arena_alloc(&arena, sizeof(IrVal) * (size_t)f->n);
    for (int k = 0; k < 20; k++) {
      IrEnv env;
      memset(&env, 0, sizeof env);
      for (int a = ARG_B; a <= ARG_KV; a++) env.args[a] = ir_vi(rand_int(&st));
      IrVal want = ir_eval(f, &env, vals), got = ir_eval(g, &env, vals);
      ck_assert_int_eq(want.b, got.b);
    }
    arena_free(&arena);
  }
}
END_TEST

/* ---- CSE and DCE ---------------------------------------------------------------- */

START_TEST(cse_commuted_and_loads) {
  IrFunc *f = fn(IRF_SCORE);
  int q = arg(f, ARG_Q), kv = arg(f, ARG_KV), s = arg(f, ARG_S);
  int a = ir_op2(&arena, f, IR_ADD_I, q, kv);
  int b = ir_op2(&arena, f, IR_ADD_I, kv, q);
  int c = ir_op2(&arena, f, IR_SUB_I, q, kv);
  int d = ir_op2(&arena, f, IR_SUB_I, kv, q); /* not commutative: stays */
  IrInst ld;
  memset(&ld, 0, sizeof ld);
  ld.op = IR_LOAD;
  ld.type = IT_I32;
  ld.nargs = 1;
  ld.args[0] = a;
  int l1 = ir_push(&arena, f, ld);
  ld.args[0] = b;
  c = ir_op2(&arena, f, IR_ADD_I, c, ir_op2(&arena, f, IR_ADD_I, l1, ir_push(&arena, f, ld)));
  int x = ir_op2(&arena, f, IR_MUL_I, ir_op2(&arena, f, IR_MUL_I, a, b), ir_op2(&arena, f, IR_MUL_I, c, d));
  f->ret = ir_op2(&arena, f, IR_ADD_F, s, ir_op1(&arena, f, IR_I2F, x));
  ir_cse(&arena, f);
  ir_verify(NULL, f);
  ck_assert_int_eq(count_op(f, IR_ADD_I), 3);
  ck_assert_int_eq(count_op(f, IR_LOAD), 1);
  ck_assert_int_eq(count_op(f, IR_SUB_I), 2);
  ck_assert_int_eq(count_op(f, IR_ARG), 3);
}
END_TEST

START_TEST(dce_keeps_ret_and_effects) {
  IrFunc *f = fn(IRF_JOINT);
  int s = arg(f, ARG_S), dt = arg(f, ARG_DT), h = arg(f, ARG_H);
  ir_op2(&arena, f, IR_MUL_F, s, s); /* dead */
  int g = ir_op2(&arena, f, IR_MUL_F, dt, ir_const_f(&arena, f, 2.0));
  IrInst acc;
  memset(&acc, 0, sizeof acc);
  acc.op = IR_ACCUM;
  acc.type = IT_VOID;
  acc.nargs = 2;
  acc.args[0] = g;
  acc.args[1] = h;
  ir_push(&arena, f, acc);
  f->ret = dt;
  ir_dce(&arena, f);
  ck_assert_int_eq(f->n, 5);
  ck_assert_int_eq(count_op(f, IR_ACCUM), 1);
  ck_assert_int_eq(count_op(f, IR_MUL_F), 1);
  ck_assert_int_eq(f->inst[f->ret].op, IR_ARG);
  (void)s;
}
END_TEST

/* ---- the verifier ---------------------------------------------------------------- */

START_TEST(verify_catches_type_error) {
  IrFunc *f = fn(IRF_SCORE);
  int s = arg(f, ARG_S), q = arg(f, ARG_Q);
  f->ret = ir_op2(&arena, f, IR_ADD_F, s, s);
  f->inst[f->ret].args[1] = q; /* an i32 operand of add.f */
  ir_verify(NULL, f);
}
END_TEST

START_TEST(verify_catches_forward_ref) {
  IrFunc *f = fn(IRF_SCORE);
  int s = arg(f, ARG_S);
  f->ret = ir_op1(&arena, f, IR_NEG_F, s);
  f->inst[0] = f->inst[1];
  f->inst[0].args[0] = 1;
  ir_verify(NULL, f);
}
END_TEST

/* ---- from source ------------------------------------------------------------------ */

/* Compile `text`; expect success; return the printed module (arena copy). */
static const char *ok_ir(const char *text, bool grad, const char *after) {
  Buf out = {0}, diag = {0};
  int rc = ir_text(text, grad, after, &out, &diag);
  ck_assert_msg(rc == 0, "unexpected errors:\n%s", diag.data);
  const char *r = arena_strndup(&arena, out.data, out.len);
  buf_free(&out);
  buf_free(&diag);
  return r;
}

/* Compile `text`; expect errors; return the diagnostics. */
static const char *bad_ir(const char *text) {
  Buf out = {0}, diag = {0};
  int rc = ir_text(text, false, NULL, &out, &diag);
  ck_assert_msg(rc == 1, "expected an error, got:\n%s", out.data);
  const char *r = arena_strndup(&arena, diag.data, diag.len);
  buf_free(&out);
  buf_free(&diag);
  return r;
}

START_TEST(src_zero_times_float_is_dropped) {
  const char *ir = ok_ir("score f(s, b, h, q, kv) { return s + 0.0 * float(q); }\n", false, NULL);
  ck_assert_msg(count_str(ir, "\n  %") == 1 && strstr(ir, "%0 = arg s ") && strstr(ir, "ret %0\n"),
                "got:\n%s", ir);
  ir = ok_ir("score f(s, b, h, q, kv) { return s + 0.0 * float(q); }\n", false, "lower");
  ck_assert_msg(strstr(ir, "mul.f") && strstr(ir, "i2f"), "got:\n%s", ir);
}
END_TEST

START_TEST(src_equal_lets_share) {
  const char *ir = ok_ir("score f(s, b, h, q, kv) {\n  let a = q - kv;\n  let c = q - kv;\n"
                         "  return s + float(a) * float(c);\n}\n", false, NULL);
  ck_assert_msg(count_str(ir, "sub.i") == 1, "got:\n%s", ir);
  ck_assert_msg(count_str(ir, "i2f") == 1, "got:\n%s", ir);
  ir = ok_ir("score f(s, b, h, q, kv) { return s + float(q + kv) * float(kv + q); }\n", false, NULL);
  ck_assert_msg(count_str(ir, "add.i") == 1, "got:\n%s", ir);
}
END_TEST

START_TEST(src_calls_inlined) {
  const char *ir = ok_ir("score inner(s, b, h, q, kv) { return s * 2.0 + float(h); }\n"
                         "score outer(x, b, h, q, kv) { return inner(x + 1.0, b, kv, q, kv); }\n"
                         "kernel k { score = outer; }\n", false, NULL);
  ck_assert_msg(strstr(ir, "score outer(s, b, h, q, kv) -> f32"), "got:\n%s", ir);
  ck_assert_msg(count_str(ir, "add.f") == 2 && count_str(ir, "mul.f") == 1, "got:\n%s", ir);
  ck_assert_msg(strstr(ir, "arg kv") && !strstr(ir, "arg h"), "got:\n%s", ir);
}
END_TEST

START_TEST(src_masks_combined) {
  const char *ir = ok_ir("mask causal(b, h, q, kv) { return q >= kv; }\n"
                         "mask near(b, h, q, kv) { return q - kv < 8; }\n"
                         "kernel k { mask = causal && !near; }\n", false, NULL);
  ck_assert_msg(strstr(ir, "score identity(s, b, h, q, kv) -> f32"), "got:\n%s", ir);
  ck_assert_msg(strstr(ir, "mask k(b, h, q, kv) -> bool"), "got:\n%s", ir);
  /* q >= kv is kv <= q; !(d < 8) is 8 <= d. */
  ck_assert_msg(count_str(ir, "le.i") == 2 && count_str(ir, "and ") == 1 && !strstr(ir, "not "),
                "got:\n%s", ir);
  ck_assert_msg(count_str(ir, "arg q") == 1 && count_str(ir, "arg kv") == 1, "got:\n%s", ir);
}
END_TEST

START_TEST(src_constant_zero_divisor) {
  const char *d = bad_ir("score f(s, b, h, q, kv) {\n  return s / (2.0 - 2.0);\n}\n");
  ck_assert_msg(strstr(d, "t.score:2:14: error: division by a constant zero"), "got:\n%s", d);
  d = bad_ir("const Z = 3 - 3;\nmask m(b, h, q, kv) { return q % Z < 1; }\n");
  ck_assert_msg(strstr(d, "t.score:2:34: error: division by a constant zero"), "got:\n%s", d);
  /* q - q is not a constant: x / 0 == 0 and x % 0 == x at run time. */
  const char *ir = ok_ir("score f(s, b, h, q, kv) {\n  let z = q - q;\n"
                         "  return s + float(7 / z) + float(kv % z);\n}\n", false, NULL);
  ck_assert_msg(!strstr(ir, "div") && !strstr(ir, "mod") && strstr(ir, "arg kv"), "got:\n%s", ir);
}
END_TEST

START_TEST(src_module_header_and_consts) {
  const char *ir = ok_ir("param float softcap = 50.0;\nparam int w;\n"
                         "buffer slopes: f32[H];\nbuffer extra: i32[N, 4];\n"
                         "const K = 2 * 3;\n"
                         "score f(s, b, h, q, kv) { return s * float(K) + pi + slopes[h] * softcap; }\n",
                         false, NULL);
  ck_assert_msg(strstr(ir, "kernel default\n"), "got:\n%s", ir);
  ck_assert_msg(strstr(ir, "  param softcap: f32 = 50\n  param w: i32\n"), "got:\n%s", ir);
  ck_assert_msg(strstr(ir, "  buffer slopes: f32[H]\n"), "got:\n%s", ir);
  ck_assert_msg(strstr(ir, "  size N = extra.shape[0]\n"), "got:\n%s", ir);
  ck_assert_msg(strstr(ir, "const 6 ") && strstr(ir, "const 3.14159274 "), "got:\n%s", ir);
  ck_assert_msg(strstr(ir, "load slopes[%"), "got:\n%s", ir);
}
END_TEST

START_TEST(src_grad_builds_joint) {
  const char *ir = ok_ir("buffer bias: f32[H] grad;\n"
                         "score f(s, b, h, q, kv) { return s + bias[h]; }\n", true, NULL);
  ck_assert_msg(strstr(ir, "joint f(s, b, h, q, kv, dt) -> f32"), "got:\n%s", ir);
  ck_assert_msg(strstr(ir, "accum d_bias[%"), "got:\n%s", ir);
}
END_TEST

static TCase *source_tests(void) {
  TCase *tc = tcase_create("source");
  tcase_add_checked_fixture(tc, NULL, teardown);
  tcase_add_test(tc, src_zero_times_float_is_dropped);
  tcase_add_test(tc, src_equal_lets_share);
  tcase_add_test(tc, src_calls_inlined);
  tcase_add_test(tc, src_masks_combined);
  tcase_add_test(tc, src_constant_zero_divisor);
  tcase_add_test(tc, src_module_header_and_consts);
  tcase_add_test(tc, src_grad_builds_joint);
  return tc;
}

int main(void) {
  Suite *s = suite_create("ir");
  TCase *tc = tcase_create("fold");
  tcase_add_checked_fixture(tc, NULL, teardown);
  tcase_add_test(tc, fold_int_wraps);
  tcase_add_test(tc, fold_float_is_binary32);
  tcase_add_test(tc, fold_conversions);
  tcase_add_test(tc, fold_keeps_inexact_ops);
  tcase_add_test(tc, simplify_float_identities);
  tcase_add_test(tc, simplify_bool_and_select);
  tcase_add_test(tc, simplify_int_identities);
  tcase_add_test(tc, fold_preserves_values);
  tcase_add_test(tc, cse_commuted_and_loads);
  tcase_add_test(tc, dce_keeps_ret_and_effects);
  tcase_add_test_raise_signal(tc, verify_catches_type_error, SIGABRT);
  tcase_add_test_raise_signal(tc, verify_catches_forward_ref, SIGABRT);
  suite_add_tcase(s, tc);
  suite_add_tcase(s, source_tests());
  return tl_run_suite(s);
}
