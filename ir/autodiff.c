/* autodiff.c: reverse mode over the score function -> the joint function
 * (and over a sink function -> its gradient into grad buffers, the same
 * way with dt the logit's gradient and no s).
 *
 * The joint takes (s, b, h, q, kv, dt) and returns ds = dt * d score/d s,
 * plus one ACCUM per load from a `grad` buffer that adds dt * d score/d X[idx]
 * into X's gradient. It starts as a copy of the score (so every forward value
 * is available by the same index), then walks the copy backwards from the
 * result, giving each active value an adjoint.
 *
 * Simplification is built in, so no pass has to clean up after it:
 *   - only active values (float values that depend on s or on a grad-buffer
 *     load) get adjoints; integer and bool paths carry no gradient;
 *   - adjoints are seeded lazily: the first contribution becomes the adjoint
 *     itself, later ones are added, so `0 + dt` is never built;
 *   - multiplying by a constant 1 is skipped, so `s + bias[h]` gives exactly
 *     ds = dt (the ARG dt instruction) and nothing else.
 * Dead forward values are then dropped by the standard passes.
 *
 * Piecewise ops send the gradient down the branch taken; on a tie the first
 * operand gets it (min/max: a <= b / a >= b picks a; abs at 0 passes +dt).
 */
#include <string.h>

#include "ir.h"

#define LN2 0.69314718055994530942 /* ln 2 (rounded to binary32 in a CONST) */

/* State of one differentiation. */
typedef struct Ad {
  Arena *a;       /* the module's arena */
  IrFunc *f;      /* the joint being built */
  const IrModule *m;
  int *adj;       /* adjoint instruction per forward value; -1: none yet */
  bool *active;   /* forward value depends on s or a grad load, and is float */
  Loc loc;        /* location given to instructions built for the current value */
} Ad;

/* Give an instruction built for the current value its source location. */
static int at(Ad *d, int x) {
  d->f->inst[x].loc = d->loc;
  return x;
}

static bool is_const_f(const Ad *d, int x, double v) {
  const IrInst *in = &d->f->inst[x];
  return in->op == IR_CONST && in->type == IT_F32 && in->imm.f == v;
}

static int cf(Ad *d, double v) { return at(d, ir_const_f(d->a, d->f, v)); }
static int op1(Ad *d, IrOp op, int x) { return at(d, ir_op1(d->a, d->f, op, x)); }
static int op2(Ad *d, IrOp op, int x, int y) { return at(d, ir_op2(d->a, d->f, op, x, y)); }
static int op3(Ad *d, IrOp op, int x, int y, int z) {
  return at(d, ir_op3(d->a, d->f, op, x, y, z));
}

/* x * y, skipping a factor that is the constant 1. */
static int mul(Ad *d, int x, int y) {
  if (is_const_f(d, x, 1.0)) return y;
  if (is_const_f(d, y, 1.0)) return x;
  return op2(d, IR_MUL_F, x, y);
}

/* adj[x] += g, lazily: the first contribution is the adjoint itself. */
static void give(Ad *d, int x, int g) {
  if (!d->active[x]) return;
  d->adj[x] = d->adj[x] < 0 ? g : op2(d, IR_ADD_F, d->adj[x], g);
}

/* which ? g : 0 to the first operand, which ? 0 : g to the second (a select,
 * not a product, so an infinite g never turns into NaN on the other side). */
static void give_branch(Ad *d, int which, int x, int y, int g) {
  if (d->active[x]) give(d, x, op3(d, IR_SELECT, which, g, cf(d, 0.0)));
  if (d->active[y]) give(d, y, op3(d, IR_SELECT, which, cf(d, 0.0), g));
}

/* The one derivative rule of each op: push the adjoint g of value i (result
 * r = op(a, b, c)) to its operands. */
static void rule(Ad *d, int i, int g) {
  IrInst in = d->f->inst[i];
  int a = in.nargs > 0 ? in.args[0] : -1, b = in.nargs > 1 ? in.args[1] : -1;
  int c = in.nargs > 2 ? in.args[2] : -1;
  switch ((IrOp)in.op) {
  case IR_CONST: case IR_PARAM: case IR_SIZE: case IR_ARG:
    break; /* leaves: s is read off its adjoint at the end */
  case IR_LOAD: {
    /* d score/d X[idx] = g: add it into X's gradient at idx. */
    IrInst acc;
    memset(&acc, 0, sizeof acc);
    acc.op = IR_ACCUM;
    acc.type = IT_VOID;
    acc.aux = in.aux;
    acc.nargs = (uint8_t)(in.nargs + 1);
    acc.args[0] = g;
    for (int k = 0; k < in.nargs; k++) acc.args[k + 1] = in.args[k];
    at(d, ir_push(d->a, d->f, acc));
    break;
  }
  case IR_ACCUM: PANIC("autodiff: accum in a score function");
  /* Integer and bool values carry no gradient; conversions from them are
   * constants as far as the gradient goes. */
  case IR_NEG_I: case IR_NOT: case IR_I2F: case IR_B2F: case IR_B2I: case IR_F2I:
  case IR_ABS_I: case IR_ADD_I: case IR_SUB_I: case IR_MUL_I: case IR_DIV_I: case IR_MOD_I:
  case IR_MIN_I: case IR_MAX_I: case IR_LT_I: case IR_LE_I: case IR_EQ_I: case IR_NE_I:
  case IR_LT_F: case IR_LE_F: case IR_EQ_F: case IR_NE_F: case IR_EQ_B: case IR_NE_B:
  case IR_AND: case IR_OR: case IR_BNOT: case IR_FLOORDIV: case IR_FLOORMOD: case IR_BAND:
  case IR_BOR: case IR_BXOR: case IR_SHL: case IR_SHR:
    break;
  case IR_FLOOR: case IR_CEIL: break; /* piecewise constant: derivative 0 */
  case IR_NEG_F: give(d, a, op1(d, IR_NEG_F, g)); break; /* d(-a) = -da */
  case IR_ABS_F: /* d|a| = sign(a) da, sign(0) = +1 */
    give(d, a, op3(d, IR_SELECT, op2(d, IR_LT_F, a, cf(d, 0.0)), op1(d, IR_NEG_F, g), g));
    break;
  case IR_EXP: give(d, a, mul(d, g, i)); break;                          /* d e^a = e^a da */
  case IR_EXP2: give(d, a, mul(d, g, mul(d, i, cf(d, LN2)))); break;   /* d 2^a = 2^a ln2 da */
  case IR_LOG: give(d, a, op2(d, IR_DIV_F, g, a)); break;                /* d ln a = da / a */
  case IR_LOG2: give(d, a, op2(d, IR_DIV_F, g, mul(d, a, cf(d, LN2)))); break; /* da / (a ln2) */
  case IR_SQRT: give(d, a, op2(d, IR_DIV_F, g, mul(d, cf(d, 2.0), i))); break; /* da / (2 sqrt a) */
  case IR_RSQRT: /* d a^-1/2 = -1/2 a^-1/2 / a da */
    give(d, a, op2(d, IR_DIV_F, mul(d, g, mul(d, cf(d, -0.5), i)), a));
    break;
  case IR_TANH: /* d tanh a = (1 - tanh^2 a) da */
    give(d, a, mul(d, g, op2(d, IR_SUB_F, cf(d, 1.0), op2(d, IR_MUL_F, i, i))));
    break;
  case IR_SIGMOID: /* d sig a = sig a (1 - sig a) da */
    give(d, a, mul(d, g, mul(d, i, op2(d, IR_SUB_F, cf(d, 1.0), i))));
    break;
  case IR_ERF: /* d erf a = 2/sqrt(pi) e^(-a^2) da */
    give(d, a, mul(d, g, mul(d, cf(d, 1.12837916709551257390), op1(d, IR_EXP, op1(d, IR_NEG_F, op2(d, IR_MUL_F, a, a))))));
    break;
  case IR_SIN: give(d, a, mul(d, g, op1(d, IR_COS, a))); break;                 /* cos a da */
  case IR_COS: give(d, a, op1(d, IR_NEG_F, mul(d, g, op1(d, IR_SIN, a)))); break; /* -sin a da */
  case IR_ADD_F: give(d, a, g); give(d, b, g); break;                   /* d(a+b) = da + db */
  case IR_SUB_F: give(d, a, g); if (d->active[b]) give(d, b, op1(d, IR_NEG_F, g)); break;
  case IR_MUL_F: /* d(ab) = b da + a db */
    if (d->active[a]) give(d, a, mul(d, g, b));
    if (d->active[b]) give(d, b, mul(d, g, a));
    break;
  case IR_DIV_F: /* d(a/b) = da / b - (a/b) db / b */
    if (d->active[a]) give(d, a, op2(d, IR_DIV_F, g, b));
    if (d->active[b]) give(d, b, op1(d, IR_NEG_F, op2(d, IR_DIV_F, mul(d, g, i), b)));
    break;
  case IR_MOD_F: /* fmod(a, b) = a - trunc(a/b) b: da - trunc(a/b) db, trunc(a/b) = (a - r)/b */
    give(d, a, g);
    if (d->active[b])
      give(d, b, op1(d, IR_NEG_F, mul(d, g, op2(d, IR_DIV_F, op2(d, IR_SUB_F, a, i), b))));
    break;
  case IR_MIN_F: give_branch(d, op2(d, IR_LE_F, a, b), a, b, g); break; /* the smaller; tie: a */
  case IR_MAX_F: give_branch(d, op2(d, IR_LE_F, b, a), a, b, g); break; /* the larger; tie: a */
  case IR_POW: /* d a^b = b a^(b-1) da + a^b ln(a) db */
    if (d->active[a])
      give(d, a, mul(d, g, mul(d, b, op2(d, IR_POW, a, op2(d, IR_SUB_F, b, cf(d, 1.0))))));
    if (d->active[b]) give(d, b, mul(d, g, mul(d, i, op1(d, IR_LOG, a))));
    break;
  case IR_SELECT: give_branch(d, a, b, c, g); break; /* the branch taken */
  default:
    PANIC("autodiff: no derivative rule for op %s", in.op < IR_NOPS ? ir_ops[in.op].name : "?");
  }
}

/* Mark the float values that depend on s or on a grad-buffer load. */
static void find_active(Ad *d, int n) {
  for (int i = 0; i < n; i++) {
    const IrInst *in = &d->f->inst[i];
    bool act = false;
    if (in->type != IT_F32) act = false;
    else if (in->op == IR_ARG) act = in->aux == ARG_S;
    else if (in->op == IR_LOAD) act = d->m->buffers[in->aux].grad;
    else
      for (int k = 0; k < in->nargs; k++) act = act || d->active[in->args[k]];
    d->active[i] = act;
  }
}

/* The reverse mode of `score` (a score function, or a sink, kind says
 * which): ds is the sum of s's adjoints (0 for a sink, which has no s). */
static IrFunc *derive(IrModule *m, const IrFunc *score, IrFuncKind kind) {
  IrFunc *f = ir_func_new(m->arena, score->name, kind);
  for (int i = 0; i < score->n; i++) ir_push(m->arena, f, score->inst[i]);
  int n = score->n;
  Ad d = {m->arena, f, m, NULL, NULL, {0, 0}};
  d.adj = arena_alloc(m->arena, sizeof(int) * (size_t)(n ? n : 1));
  d.active = arena_alloc(m->arena, sizeof(bool) * (size_t)(n ? n : 1));
  for (int i = 0; i < n; i++) d.adj[i] = -1;
  find_active(&d, n);

  IrInst dt;
  memset(&dt, 0, sizeof dt);
  dt.op = IR_ARG;
  dt.type = IT_F32;
  dt.aux = ARG_DT;
  dt.loc = score->ret >= 0 ? score->inst[score->ret].loc : d.loc;
  int seed = ir_push(m->arena, f, dt);
  CHECK(score->ret >= 0 && score->ret < n);
  if (d.active[score->ret]) d.adj[score->ret] = seed;

  int ds = -1;
  for (int i = n - 1; i >= 0; i--) {
    if (d.adj[i] < 0) continue;
    d.loc = f->inst[i].loc;
    rule(&d, i, d.adj[i]);
    if (f->inst[i].op == IR_ARG && f->inst[i].aux == ARG_S)
      ds = ds < 0 ? d.adj[i] : op2(&d, IR_ADD_F, ds, d.adj[i]);
  }
  if (ds < 0) ds = cf(&d, 0.0);
  f->ret = ds;
  ir_fold(m->arena, f);
  ir_cse(m->arena, f);
  ir_dce(m->arena, f);
  return f;
}

void ir_autodiff(IrModule *m) {
  m->joint = derive(m, m->score, IRF_JOINT);
  if (m->sink) m->sink_grad = derive(m, m->sink, IRF_SINK_GRAD);
}
