/* The float64 interpreter: integer rules, conversions, loads of every dtype,
 * bounds failures and their messages. Functions are built by hand so the
 * interpreter is tested on its own. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "testlib.h"

/* A tiny module with one buffer, for loads. */
typedef struct T {
  Arena a;
  IrModule m;
  IrBuffer buf;
  IrFunc *f;
  Source src;
  IrBufView view;
  IrEnv env;
  IrVal vals[64];
} T;

static void t_init(T *t, DType dt, int ndims, const int64_t *shape, const void *data) {
  memset(t, 0, sizeof *t);
  t->m.arena = &t->a;
  t->buf.id = "table";
  t->buf.dtype = dt;
  t->buf.ndims = ndims;
  t->m.buffers = &t->buf;
  t->m.nbuffers = 1;
  t->f = ir_func_new(&t->a, "t", IRF_SCORE);
  t->src.path = "t.score";
  t->src.text = "score f(s, b, h, q, kv) {\n  return table[q, kv];\n}\n";
  t->src.len = strlen(t->src.text);
  t->view.data = data;
  t->view.dtype = dt;
  t->view.ndims = ndims;
  int64_t stride = 1;
  for (int d = ndims - 1; d >= 0; d--) {
    t->view.shape[d] = shape[d];
    t->view.strides[d] = stride;
    stride *= shape[d];
  }
  t->env.bufs = &t->view;
  t->env.mod = &t->m;
  t->env.src = &t->src;
}

static int arg(T *t, IrArg a, IrType ty) {
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = IR_ARG;
  in.type = (uint8_t)ty;
  in.aux = a;
  return ir_push(&t->a, t->f, in);
}

/* table[x, y] (or table[x] when y < 0), at source offset 35 (line 2, col 10). */
static int load(T *t, IrType ty, int x, int y) {
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = IR_LOAD;
  in.type = (uint8_t)ty;
  in.nargs = y < 0 ? 1 : 2;
  in.args[0] = x;
  in.args[1] = y;
  in.loc.start = 35;
  in.loc.end = 48;
  return ir_push(&t->a, t->f, in);
}

static IrVal run(T *t, int ret) {
  t->f->ret = ret;
  return ir_eval(t->f, &t->env, t->vals);
}

/* Evaluate op(x, y) on two int constants. */
static int32_t int_op(IrOp op, int32_t x, int32_t y) {
  T t;
  t_init(&t, DT_I32, 0, NULL, NULL);
  int r = ir_op2(&t.a, t.f, op, ir_const_i(&t.a, t.f, x), ir_const_i(&t.a, t.f, y));
  int32_t v = run(&t, r).i;
  arena_free(&t.a);
  return v;
}

START_TEST(int_rules) {
  ck_assert_int_eq(int_op(IR_ADD_I, INT32_MAX, 1), INT32_MIN);
  ck_assert_int_eq(int_op(IR_SUB_I, INT32_MIN, 1), INT32_MAX);
  ck_assert_int_eq(int_op(IR_MUL_I, 65536, 65536), 0);
  ck_assert_int_eq(int_op(IR_DIV_I, 7, -2), -3);
  ck_assert_int_eq(int_op(IR_DIV_I, -7, 2), -3);
  ck_assert_int_eq(int_op(IR_MOD_I, -7, 2), -1);
  ck_assert_int_eq(int_op(IR_MOD_I, 7, -2), 1);
  ck_assert_int_eq(int_op(IR_DIV_I, 5, 0), 0);
  ck_assert_int_eq(int_op(IR_MOD_I, 5, 0), 5);
  ck_assert_int_eq(int_op(IR_DIV_I, INT32_MIN, -1), INT32_MIN);
  ck_assert_int_eq(int_op(IR_MOD_I, INT32_MIN, -1), 0);
  ck_assert_int_eq(int_op(IR_MIN_I, -3, 2), -3);
  ck_assert_int_eq(int_op(IR_MAX_I, -3, 2), 2);
  /* version 2: bitwise ops, shifts with counts outside 0..31, Python's // and % */
  ck_assert_int_eq(int_op(IR_BAND, -4, 7), 4);
  ck_assert_int_eq(int_op(IR_BOR, INT32_MIN, 5), INT32_MIN + 5);
  ck_assert_int_eq(int_op(IR_BXOR, -1, 0x0F0F), ~0x0F0F);
  ck_assert_int_eq(int_op(IR_SHL, 1, 31), INT32_MIN);
  ck_assert_int_eq(int_op(IR_SHL, 3, 32), 0);
  ck_assert_int_eq(int_op(IR_SHL, 3, -1), 0);
  ck_assert_int_eq(int_op(IR_SHR, -9, 1), -5);
  ck_assert_int_eq(int_op(IR_SHR, INT32_MIN, 31), -1);
  ck_assert_int_eq(int_op(IR_SHR, -9, 32), -1);
  ck_assert_int_eq(int_op(IR_SHR, 9, INT32_MIN), 0);
  ck_assert_int_eq(int_op(IR_FLOORDIV, -7, 2), -4);
  ck_assert_int_eq(int_op(IR_FLOORDIV, 7, -2), -4);
  ck_assert_int_eq(int_op(IR_FLOORDIV, -8, 2), -4);
  ck_assert_int_eq(int_op(IR_FLOORDIV, 7, 0), 0);
  ck_assert_int_eq(int_op(IR_FLOORDIV, INT32_MIN, -1), INT32_MIN);
  ck_assert_int_eq(int_op(IR_FLOORMOD, -7, 2), 1);
  ck_assert_int_eq(int_op(IR_FLOORMOD, 7, -2), -1);
  ck_assert_int_eq(int_op(IR_FLOORMOD, -6, 3), 0);
  ck_assert_int_eq(int_op(IR_FLOORMOD, 7, 0), 7);
  ck_assert_int_eq(int_op(IR_FLOORMOD, INT32_MIN, -1), 0);
}
END_TEST

static int32_t f2i(double x) {
  T t;
  t_init(&t, DT_I32, 0, NULL, NULL);
  t.env.args[ARG_S] = ir_vf(x);
  int r = ir_op1(&t.a, t.f, IR_F2I, arg(&t, ARG_S, IT_F32));
  int32_t v = run(&t, r).i;
  arena_free(&t.a);
  return v;
}

START_TEST(conversions) {
  ck_assert_int_eq(f2i(-2.7), -2);
  ck_assert_int_eq(f2i(2.7), 2);
  ck_assert_int_eq(f2i(1e10), INT32_MAX);
  ck_assert_int_eq(f2i(-1e10), INT32_MIN);
  ck_assert_int_eq(f2i(INFINITY), INT32_MAX);
  ck_assert_int_eq(f2i(NAN), 0);
  /* Float ops run in binary64 in the interpreter. */
  T t;
  t_init(&t, DT_I32, 0, NULL, NULL);
  uint64_t seed = tl_seed();
  double x = 0.5 + tl_uniform(&seed);
  t.env.args[ARG_S] = ir_vf(x);
  int s = arg(&t, ARG_S, IT_F32);
  int r = ir_op2(&t.a, t.f, IR_MUL_F, ir_op1(&t.a, t.f, IR_TANH, s), ir_op1(&t.a, t.f, IR_SIGMOID, s));
  /* Bit-exact: the same binary64 operations as ops.def's EVAL column
   * (sigmoid is 1 / (1 + exp(-x)), then a multiply). */
  double want = tanh(x) * (1.0 / (1.0 + exp(-x)));
  ck_assert_double_eq(run(&t, r).f, want);
  arena_free(&t.a);
  /* float(int) is exact in binary64: 2^24 + 1 does not round to 2^24. */
  t_init(&t, DT_I32, 0, NULL, NULL);
  t.env.args[ARG_KV] = ir_vi(16777217);
  r = ir_op1(&t.a, t.f, IR_I2F, arg(&t, ARG_KV, IT_I32));
  ck_assert_double_eq(run(&t, r).f, 16777217.0);
  arena_free(&t.a);
}
END_TEST

START_TEST(loads_every_dtype) {
  int64_t shape[2] = {2, 3};
  float f32[6] = {1.5f, -2.25f, 3, 4, 5, 6.125f};
  uint16_t f16[6] = {0x3c01, 0x0001, 0xc000, 0x7bff, 0x8400, 0x3555}; /* 1+2^-10, 2^-24, -2, 65504 */
  uint16_t bf16[6] = {0x3f81, 0xc040, 0, 0, 0, 0x4049};
  int32_t i32[6] = {1, -2, 3, INT32_MIN, 5, 6};
  int64_t i64[6] = {7, -8, INT32_MAX, 0, 0, (int64_t)1 << 40};
  uint8_t u8[6] = {0, 255, 7, 0, 0, 0};
  uint8_t bl[6] = {0, 1, 2, 0, 0, 0};
  struct { DType dt; const void *data; IrType ty; int x, y; double want; } cases[] = {
      {DT_F32, f32, IT_F32, 0, 1, -2.25}, {DT_F32, f32, IT_F32, 1, 2, 6.125},
      {DT_F16, f16, IT_F32, 0, 0, 1.0 + ldexp(1, -10)}, {DT_F16, f16, IT_F32, 0, 1, ldexp(1, -24)},
      {DT_F16, f16, IT_F32, 0, 2, -2.0}, {DT_F16, f16, IT_F32, 1, 0, 65504.0},
      {DT_F16, f16, IT_F32, 1, 1, -ldexp(1, -14)},
      {DT_BF16, bf16, IT_F32, 0, 0, 1.0078125}, {DT_BF16, bf16, IT_F32, 0, 1, -3.0},
      {DT_I32, i32, IT_I32, 1, 0, INT32_MIN}, {DT_I32, i32, IT_I32, 0, 1, -2},
      {DT_I64, i64, IT_I32, 0, 2, INT32_MAX}, {DT_I64, i64, IT_I32, 0, 1, -8},
      {DT_U8, u8, IT_I32, 0, 1, 255}, {DT_BOOL, bl, IT_BOOL, 0, 2, 1}, {DT_BOOL, bl, IT_BOOL, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    T t;
    t_init(&t, cases[i].dt, 2, shape, cases[i].data);
    int r = load(&t, cases[i].ty, ir_const_i(&t.a, t.f, cases[i].x), ir_const_i(&t.a, t.f, cases[i].y));
    IrVal v = run(&t, r);
    double got = cases[i].ty == IT_F32 ? v.f : cases[i].ty == IT_I32 ? v.i : v.b;
    ck_assert_msg(got == cases[i].want && !t.env.failed, "case %zu: got %g, want %g", i, got,
                  cases[i].want);
    arena_free(&t.a);
  }
}
END_TEST

START_TEST(strided_load) {
  /* A [3, 2] view with a row stride of 4 into a larger array. */
  float data[12];
  for (int i = 0; i < 12; i++) data[i] = (float)i;
  int64_t shape[2] = {3, 2};
  T t;
  t_init(&t, DT_F32, 2, shape, data);
  t.view.strides[0] = 4;
  int r = load(&t, IT_F32, ir_const_i(&t.a, t.f, 2), ir_const_i(&t.a, t.f, 1));
  ck_assert_double_eq(run(&t, r).f, 9.0);
  arena_free(&t.a);
}
END_TEST

START_TEST(bounds_failures) {
  int64_t shape[2] = {2, 3};
  float f32[6] = {1, 2, 3, 4, 5, 6};
  struct { int x, y; } bad[] = {{2, 0}, {0, 3}, {-1, 0}, {0, -5}, {INT32_MAX, 0}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    T t;
    t_init(&t, DT_F32, 2, shape, f32);
    t.env.args[ARG_Q] = ir_vi(bad[i].x);
    t.env.args[ARG_KV] = ir_vi(bad[i].y);
    int r = load(&t, IT_F32, arg(&t, ARG_Q, IT_I32), arg(&t, ARG_KV, IT_I32));
    double v = run(&t, r).f;
    ck_assert_double_eq(v, 0.0); /* carries on with zero */
    ck_assert(t.env.failed);
    char want[64];
    snprintf(want, sizeof want, "[%d, %d]", bad[i].x, bad[i].y);
    ck_assert_msg(strstr(t.env.error, "'table'") && strstr(t.env.error, want) &&
                      strstr(t.env.error, "t.score:2:10") && strstr(t.env.error, "[2, 3]"),
                  "message: %s", t.env.error);
    arena_free(&t.a);
  }
  /* An i64 value that does not fit in 32 bits. */
  int64_t i64[2] = {1, (int64_t)1 << 33};
  int64_t shape1[1] = {2};
  T t;
  t_init(&t, DT_I64, 1, shape1, i64);
  int r = load(&t, IT_I32, ir_const_i(&t.a, t.f, 1), -1);
  ck_assert_int_eq(run(&t, r).i, 0);
  ck_assert_msg(t.env.failed && strstr(t.env.error, "32 bits") && strstr(t.env.error, "[1]"),
                "message: %s", t.env.error);
  arena_free(&t.a);
}
END_TEST

START_TEST(accum_adds_and_checks) {
  int64_t shape[2] = {2, 3};
  float f32[6] = {0};
  double grad[6] = {0};
  T t;
  t_init(&t, DT_F32, 2, shape, f32);
  t.view.grad = grad;
  uint64_t seed = tl_seed() + 1;
  double x = 0.5 + tl_uniform(&seed);
  t.env.args[ARG_DT] = ir_vf(x);
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = IR_ACCUM;
  in.type = IT_VOID;
  in.nargs = 3;
  in.args[0] = arg(&t, ARG_DT, IT_F32);
  in.args[1] = ir_const_i(&t.a, t.f, 1);
  in.args[2] = ir_const_i(&t.a, t.f, 2);
  int r = ir_push(&t.a, t.f, in);
  run(&t, r);
  run(&t, r);
  ck_assert_double_eq(grad[5], 2 * x);
  ck_assert(!t.env.failed);
  t.f->inst[in.args[2]].imm = ir_vi(3);
  run(&t, r);
  ck_assert(t.env.failed && strstr(t.env.error, "[1, 3]"));
  ck_assert_double_eq(grad[5], 2 * x);
  arena_free(&t.a);
}
END_TEST

int main(void) {
  return TL_MAIN("interp", 0, TL_TEST(int_rules), TL_TEST(conversions), TL_TEST(loads_every_dtype),
                 TL_TEST(strided_load), TL_TEST(bounds_failures), TL_TEST(accum_adds_and_checks));
}
