/* Reverse mode: every float op's derivative against central finite
 * differences in float64 at random points, the shape of simple joints
 * (`s + bias[h]` must give ds = dt and nothing else), branch rules of
 * piecewise ops, and gradient accumulation into grad buffers. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "runtime/rt.h"
#include "testlib.h"

/* A hand-built module: score over s and w = table[0] (a grad buffer). */
typedef struct M {
  Arena a;
  IrModule m;
  IrBuffer buf;
  IrFunc *f;
  int s, w; /* the ARG s and the LOAD of w */
} M;

static void m_init(M *t, bool grad) {
  memset(t, 0, sizeof *t);
  t->m.arena = &t->a;
  t->buf.id = "w";
  t->buf.dtype = DT_F32;
  t->buf.ndims = 1;
  t->buf.dims[0].fixed = 1;
  t->buf.grad = grad;
  t->buf.used = true;
  t->m.buffers = &t->buf;
  t->m.nbuffers = 1;
  t->f = ir_func_new(&t->a, "f", IRF_SCORE);
  t->m.score = t->f;
  IrInst in;
  memset(&in, 0, sizeof in);
  in.op = IR_ARG;
  in.type = IT_F32;
  in.aux = ARG_S;
  t->s = ir_push(&t->a, t->f, in);
  int zero = ir_const_i(&t->a, t->f, 0);
  memset(&in, 0, sizeof in);
  in.op = IR_LOAD;
  in.type = IT_F32;
  in.nargs = 1;
  in.args[0] = zero;
  t->w = ir_push(&t->a, t->f, in);
}

/* The score at (s, w); w is stored as binary32, so callers keep it exact. */
static double eval_score(M *t, double s, double w) {
  float wf = (float)w;
  IrBufView bv = {.data = &wf, .dtype = DT_F32, .ndims = 1, .shape = {1}, .strides = {1}};
  IrEnv env = {.bufs = &bv, .mod = &t->m};
  env.args[ARG_S] = ir_vf(s);
  IrVal vals[256];
  CHECK(t->f->n <= 256);
  return ir_eval(t->f, &env, vals).f;
}

/* The joint at (s, w) with seed dt: ds, and dw from its ACCUMs. */
static void eval_joint(M *t, double s, double w, double dt, double *ds, double *dw) {
  float wf = (float)w;
  double g = 0;
  IrBufView bv = {.data = &wf, .dtype = DT_F32, .ndims = 1, .shape = {1}, .strides = {1}, .grad = &g};
  IrEnv env = {.bufs = &bv, .mod = &t->m};
  env.args[ARG_S] = ir_vf(s);
  env.args[ARG_DT] = ir_vf(dt);
  IrVal vals[512];
  CHECK(t->m.joint->n <= 512);
  *ds = ir_eval(t->m.joint, &env, vals).f;
  ck_assert(!env.failed);
  *dw = g;
}

static bool positive_only(IrOp op) {
  return op == IR_LOG || op == IR_LOG2 || op == IR_SQRT || op == IR_RSQRT || op == IR_POW;
}

/* A random point away from 0, positive where the op needs it, and a
 * multiple of 2^-12 so w is exact in binary32. */
static double point(uint64_t *seed, bool positive) {
  double x = 0.3 + 1.7 * tl_uniform(seed);
  if (!positive && tl_uniform(seed) < 0.5) x = -x;
  return ldexp(round(ldexp(x, 12)), -12);
}

/* Keep finite differences away from kinks and jumps (ties of min/max,
 * integer crossings of fmod's quotient). */
static bool smooth_at(IrOp op, double s, double w) {
  double r = s / w;
  if (op == IR_MOD_F) return fabs(r - round(r)) > 0.1 && fabs(r) > 1; /* quotient not 0 */
  if (op == IR_MIN_F || op == IR_MAX_F) return fabs(s - w) > 0.05;
  return true;
}

/* Richardson-extrapolated central difference of f(x) along one variable. */
static double fd(M *t, double s, double w, bool in_w) {
  double h = ldexp(1, -8), d[2];
  for (int k = 0; k < 2; k++, h /= 2) {
    double hi = in_w ? eval_score(t, s, w + h) : eval_score(t, s + h, w);
    double lo = in_w ? eval_score(t, s, w - h) : eval_score(t, s - h, w);
    d[k] = (hi - lo) / (2 * h);
  }
  return (4 * d[1] - d[0]) / 3;
}

/* Relative error below 1e-6; where the function does not depend on the
 * variable at all (the other branch of min/max) the gradient must be 0. */
static void check_close(const char *what, IrOp op, double got, double want) {
  double err = want == 0 ? (got == 0 ? 0 : INFINITY) : fabs(got - want) / fabs(want);
  ck_assert_msg(err < 1e-6, "%s of %s: got %.17g, finite differences %.17g",
                what, ir_ops[op].name, got, want);
}

START_TEST(every_float_op) {
  uint64_t seed = tl_seed();
  int tested = 0;
  for (int op = 0; op < IR_NOPS; op++) {
    const IrOpInfo *oi = &ir_ops[op];
    if (oi->rtype != 'F' || oi->atype != 'F' || (oi->nargs != 1 && oi->nargs != 2)) continue;
    for (int rep = 0; rep < 4; rep++) {
      M t;
      m_init(&t, true);
      /* Unary: op(s * w); binary: op(s, w). Both exercise the chain rule
       * and the buffer gradient. */
      int r = oi->nargs == 1 ? ir_op1(&t.a, t.f, (IrOp)op, ir_op2(&t.a, t.f, IR_MUL_F, t.s, t.w))
                             : ir_op2(&t.a, t.f, (IrOp)op, t.s, t.w);
      t.f->ret = r;
      ir_autodiff(&t.m);
      double s, w;
      do {
        s = point(&seed, positive_only((IrOp)op));
        w = point(&seed, true);
      } while (!smooth_at((IrOp)op, s, w));
      double dt = point(&seed, false), ds, dw;
      eval_joint(&t, s, w, dt, &ds, &dw);
      if (op == IR_FLOOR || op == IR_CEIL) {
        ck_assert_msg(ds == 0 && dw == 0, "%s: derivative must be 0", oi->name);
      } else {
        check_close("ds", (IrOp)op, ds, dt * fd(&t, s, w, false));
        check_close("dw", (IrOp)op, dw, dt * fd(&t, s, w, true));
      }
      arena_free(&t.a);
      tested++;
    }
  }
  ck_assert_int_ge(tested, 4 * 20);
}
END_TEST

/* Ops of the joint other than ARG, CONST and ACCUM. */
static int arithmetic(const IrFunc *f) {
  int n = 0;
  for (int i = 0; i < f->n; i++)
    if (f->inst[i].op != IR_ARG && f->inst[i].op != IR_ACCUM && f->inst[i].op != IR_CONST) n++;
  return n;
}

START_TEST(bias_gives_dt) {
  for (int grad = 0; grad < 2; grad++) {
    M t;
    m_init(&t, grad);
    t.f->ret = ir_op2(&t.a, t.f, IR_ADD_F, t.s, t.w);
    ir_autodiff(&t.m);
    const IrFunc *j = t.m.joint;
    const IrInst *ret = &j->inst[j->ret];
    ck_assert(ret->op == IR_ARG && ret->aux == ARG_DT);
    ck_assert_int_eq(arithmetic(j), 0);
    int accums = 0;
    for (int i = 0; i < j->n; i++) accums += j->inst[i].op == IR_ACCUM;
    ck_assert_int_eq(accums, grad);
    if (!grad) ck_assert_int_eq(j->n, 1);
    arena_free(&t.a);
  }
}
END_TEST

START_TEST(bias_through_frontend) {
  const char *src = "buffer bias: f32[H] grad;\n"
                    "score f(s, b, h, q, kv) { return s + bias[h]; }\n";
  flex_kernel *k;
  ck_assert_msg(flex_kernel_from_source(&k, "bias.score", src, strlen(src), NULL) == FLEX_OK, "%s",
                flex_last_error());
  const IrFunc *j = k->mod->joint;
  ck_assert(j->inst[j->ret].op == IR_ARG && j->inst[j->ret].aux == ARG_DT);
  ck_assert_int_eq(arithmetic(j), 0); /* ARG h, ARG dt and the ACCUM: nothing else */
  flex_kernel_free(k);
  const char *id = "score f(s, b, h, q, kv) { return s + float(q - kv) * 0.5; }\n";
  ck_assert(flex_kernel_from_source(&k, "id.score", id, strlen(id), NULL) == FLEX_OK);
  j = k->mod->joint;
  ck_assert(j->n == 1 && j->inst[0].op == IR_ARG && j->inst[0].aux == ARG_DT);
  flex_kernel_free(k);
}
END_TEST

/* A score from source at s with buffer w (4 floats, grad), its value. */
static double src_score(const flex_kernel *k, double s, const float *w) {
  IrBufView bv = {.data = (void *)w, .dtype = DT_F32, .ndims = 1, .shape = {4}, .strides = {1}};
  IrEnv env = {.bufs = &bv, .mod = k->mod};
  env.args[ARG_S] = ir_vf(s);
  env.args[ARG_Q] = ir_vi(5);
  env.args[ARG_KV] = ir_vi(2);
  IrVal vals[1024];
  ck_assert_int_le(k->mod->score->n, 1024);
  return ir_eval(k->mod->score, &env, vals).f;
}

/* Autodiff through sum(...) (unrolled), helper functions (inlined, an int
 * argument promoted) and erf: ds and every dw[i] against finite differences. */
START_TEST(sum_and_helpers_against_fd) {
  const char *src = "buffer w: f32[4] grad;\n"
                    "float act(float x) { return x * (1.0 + erf(x)) * 0.5; }\n"
                    "float scale(float x, int i) { return x * float(i + 1); }\n"
                    "score f(s, b, h, q, kv) {\n"
                    "  return sum(i, 0, 4, act(scale(s, i) * w[i]) + w[i] * float((q ^ i) & 3));\n"
                    "}\n";
  flex_kernel *k;
  ck_assert_msg(flex_kernel_from_source(&k, "sum.score", src, strlen(src), NULL) == FLEX_OK, "%s",
                flex_last_error());
  uint64_t seed = tl_seed();
  for (int rep = 0; rep < 8; rep++) {
    float w[4];
    for (int i = 0; i < 4; i++) w[i] = (float)point(&seed, false);
    double s = point(&seed, false), dt = point(&seed, false), g[4] = {0};
    IrBufView bv = {.data = w, .dtype = DT_F32, .ndims = 1, .shape = {4}, .strides = {1}, .grad = g};
    IrEnv env = {.bufs = &bv, .mod = k->mod};
    env.args[ARG_S] = ir_vf(s);
    env.args[ARG_DT] = ir_vf(dt);
    env.args[ARG_Q] = ir_vi(5);
    env.args[ARG_KV] = ir_vi(2);
    IrVal vals[1024];
    ck_assert_int_le(k->mod->joint->n, 1024);
    double ds = ir_eval(k->mod->joint, &env, vals).f;
    double h = ldexp(1, -14);
    double want = (src_score(k, s + h, w) - src_score(k, s - h, w)) / (2 * h);
    ck_assert_msg(fabs(ds - dt * want) <= 1e-6 * (1 + fabs(dt * want)), "ds %.17g, fd %.17g", ds, dt * want);
    for (int i = 0; i < 4; i++) {
      float wp[4], wm[4];
      memcpy(wp, w, sizeof w), memcpy(wm, w, sizeof w);
      double hw = ldexp(1, -10); /* exact in binary32 around these w */
      wp[i] = (float)(w[i] + hw), wm[i] = (float)(w[i] - hw);
      double fdw = (src_score(k, s, wp) - src_score(k, s, wm)) / ((double)wp[i] - (double)wm[i]);
      ck_assert_msg(fabs(g[i] - dt * fdw) <= 1e-4 * (1 + fabs(dt * fdw)), "dw[%d] %.17g, fd %.17g", i,
                    g[i], dt * fdw);
    }
  }
  flex_kernel_free(k);
}
END_TEST

START_TEST(piecewise_branches) {
  uint64_t seed = tl_seed() + 7;
  double dt = point(&seed, true), ds, dw;
  /* select(s < w, 3 s, 5 w): the branch taken gets the gradient. */
  M t;
  m_init(&t, true);
  int three = ir_const_f(&t.a, t.f, 3), five = ir_const_f(&t.a, t.f, 5);
  t.f->ret = ir_op3(&t.a, t.f, IR_SELECT, ir_op2(&t.a, t.f, IR_LT_F, t.s, t.w),
                    ir_op2(&t.a, t.f, IR_MUL_F, three, t.s), ir_op2(&t.a, t.f, IR_MUL_F, five, t.w));
  ir_autodiff(&t.m);
  eval_joint(&t, 0.25, 0.5, dt, &ds, &dw);
  ck_assert_double_eq(ds, 3 * dt);
  ck_assert_double_eq(dw, 0);
  eval_joint(&t, 0.75, 0.5, dt, &ds, &dw);
  ck_assert_double_eq(ds, 0);
  ck_assert_double_eq(dw, 5 * dt);
  arena_free(&t.a);
  /* Ties: min and max give the first operand the gradient; abs(0) passes +dt. */
  IrOp ops[3] = {IR_MIN_F, IR_MAX_F, IR_ABS_F};
  for (int i = 0; i < 3; i++) {
    m_init(&t, true);
    t.f->ret = i < 2 ? ir_op2(&t.a, t.f, ops[i], t.s, t.w)
                     : ir_op1(&t.a, t.f, IR_ABS_F, ir_op2(&t.a, t.f, IR_SUB_F, t.s, t.w));
    ir_autodiff(&t.m);
    eval_joint(&t, 0.5, 0.5, dt, &ds, &dw);
    ck_assert_double_eq(ds, dt);
    ck_assert_double_eq(dw, i < 2 ? 0 : -dt);
    eval_joint(&t, -0.5, 0.5, dt, &ds, &dw); /* s < w */
    ck_assert_double_eq(ds, i == 0 ? dt : i == 1 ? 0 : -dt);
    arena_free(&t.a);
  }
}
END_TEST

START_TEST(integer_paths_carry_nothing) {
  /* float(int(s)) + floor(s) * w: no gradient to s at all, dw = floor(s). */
  M t;
  m_init(&t, true);
  int a = ir_op1(&t.a, t.f, IR_I2F, ir_op1(&t.a, t.f, IR_F2I, t.s));
  int b = ir_op2(&t.a, t.f, IR_MUL_F, ir_op1(&t.a, t.f, IR_FLOOR, t.s), t.w);
  t.f->ret = ir_op2(&t.a, t.f, IR_ADD_F, a, b);
  ir_autodiff(&t.m);
  uint64_t seed = tl_seed() + 3;
  double s = 1.5 + 3 * tl_uniform(&seed), dt = point(&seed, true), ds, dw;
  eval_joint(&t, s, 0.5, dt, &ds, &dw);
  ck_assert_double_eq(ds, 0);
  ck_assert_double_eq(dw, dt * floor(s));
  arena_free(&t.a);
}
END_TEST

START_TEST(grad_buffer_sites) {
  /* w used twice: s * w + w * w -> dw = dt (s + 2 w), summed over sites. */
  M t;
  m_init(&t, true);
  t.f->ret = ir_op2(&t.a, t.f, IR_ADD_F, ir_op2(&t.a, t.f, IR_MUL_F, t.s, t.w),
                    ir_op2(&t.a, t.f, IR_MUL_F, t.w, t.w));
  ir_autodiff(&t.m);
  uint64_t seed = tl_seed() + 5;
  double s = point(&seed, false), w = point(&seed, true), dt = point(&seed, false), ds, dw;
  eval_joint(&t, s, w, dt, &ds, &dw);
  check_close("ds", IR_MUL_F, ds, dt * w);
  check_close("dw", IR_MUL_F, dw, dt * (s + 2 * w));
  arena_free(&t.a);
  /* Not a grad buffer: no ACCUM at all. */
  m_init(&t, false);
  t.f->ret = ir_op2(&t.a, t.f, IR_MUL_F, t.s, t.w);
  ir_autodiff(&t.m);
  for (int i = 0; i < t.m.joint->n; i++) ck_assert(t.m.joint->inst[i].op != IR_ACCUM);
  arena_free(&t.a);
}
END_TEST

int main(void) {
  return TL_MAIN("autodiff", 0, TL_TEST(every_float_op), TL_TEST(bias_gives_dt),
                 TL_TEST(bias_through_frontend), TL_TEST(sum_and_helpers_against_fd),
                 TL_TEST(piecewise_branches), TL_TEST(integer_paths_carry_nothing),
                 TL_TEST(grad_buffer_sites));
}
