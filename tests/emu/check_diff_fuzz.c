/* Randomized differential test of the code generator: random .score
 * programs are compiled through the public API and run forward and backward
 * in fp32 on the emulator (the generated CUDA source on the CPU) and on the
 * float64 reference (the IR interpreter); out, lse, dq, dk, dv and the grad
 * buffer's gradient must agree by relative norm error (1e-4 forward, 1e-3
 * gradients).
 *
 * The programs aim at the scalar rules where a code generator goes wrong:
 * int wrap-around, C division and remainder with negative operands, run-time
 * division by zero, int(float) truncation and saturation, conversions,
 * min/max/abs/clamp, where and ?: of every type, bool operators, params,
 * consts, predefined sizes, buffer loads and float literal printing. They
 * stay well conditioned so fp32 and fp64 differ by rounding only:
 *
 *   score = s * (1 + 0.25 tanh(F1)) + 0.5 tanh(F2) + 0.05 float(I % 13)
 *
 * where F are smooth float expressions and I int expressions. Anything
 * discontinuous on floats (floor, ceil, int(), float comparisons) only sees
 * "exact" floats built from small ints with power-of-two scalings, which
 * fp32 and fp64 compute identically.
 *
 * FLEXC_DIFF_PROGRAMS=N runs N random programs (default 15); program i is
 * generated from the seed printed at the start (FLEXC_SEED) and i, and a
 * failure prints its source. Fixed regression programs run too. To reduce
 * a failure, FLEXC_DIFF_FILE=PATH runs one program from a file on every
 * shape (FLEXC_DIFF_DUMP=1 also prints the grad buffer's gradients).
 */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t seed0;

/* ---- the program generator ----------------------------------------------- */

#define SRC_CAP 65536
#define MAXLETS 8

/* Generator state: the text so far and the names in scope by kind. */
typedef struct Gen {
  char src[SRC_CAP]; /* program text */
  size_t n;          /* its length */
  uint64_t rng;      /* this program's generator */
  bool score;        /* inside the score function (s is in scope) */
  const char *ints[MAXLETS], *exacts[MAXLETS], *bools[MAXLETS], *floats[MAXLETS]; /* lets */
  int nint, nexact, nbool, nfloat; /* how many of each */
} Gen;

static void emit(Gen *g, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(g->src + g->n, SRC_CAP - g->n, fmt, ap);
  va_end(ap);
  ck_assert_msg(w >= 0 && (size_t)w < SRC_CAP - g->n, "generated program too long");
  g->n += (size_t)w;
}

static int rnd(Gen *g, int n) { return (int)(tl_rand(&g->rng) % (uint64_t)n); }
static const char *pick(Gen *g, const char *const *v, int n) { return v[rnd(g, n)]; }

static bool gen_int(Gen *g, int d);
static void gen_small(Gen *g, int d);
static void gen_exact(Gen *g, int d);
static void gen_bool(Gen *g, int d);
static void gen_float(Gen *g, int d);
static void gen_flat(Gen *g, int d);

/* An int divisor: anything, often one that is zero or -1 for some elements.
 * Never a compile-time constant (a constant zero divisor is an error). */
static void gen_divisor(Gen *g, int d) {
  static const char *const special[] = {"((q - kv) % 3)", "((q + h) % 2 - 1)", "(kv % 4 - 2)",
                                        "(pi0 - 5)", "(b - 1)", "(h - q % 2)", "(-1 + q * 0)"};
  if (rnd(g, 2)) {
    emit(g, "%s", pick(g, special, 7));
    return;
  }
  emit(g, "(");
  if (!gen_int(g, d)) emit(g, " + kv %% 2");
  emit(g, ")");
}

/* An int expression; returns whether it reads anything known only at run
 * time (a name other than a const). */
static bool gen_int(Gen *g, int d) {
  static const char *const vars[] = {"q", "kv", "b", "h", "B", "H", "HKV", "Q_LEN", "KV_LEN",
                                     "pi0", "pi1"};
  static const char *const lits[] = {"0", "1", "2", "7", "13", "2147483647", "2147483600",
                                     "1000000007", "65536", "0x7fffffff", "0x40000000",
                                     "(-2147483647 - 1)", "(-3)", "46341"};
  static const char *const consts[] = {"ci0", "ci1", "ci2"};
  int k = d <= 0 ? rnd(g, 5) : rnd(g, 22);
  bool v = true, w;
  switch (k) {
  case 0: case 1: emit(g, "%s", pick(g, vars, 11)); break;
  case 2: emit(g, "%s", pick(g, lits, 14)), v = false; break;
  case 3: emit(g, "%s", pick(g, consts, 3)), v = false; break;
  case 4:
    if (g->nint) emit(g, "%s", g->ints[rnd(g, g->nint)]);
    else emit(g, "%s", rnd(g, 2) ? "q" : "kv");
    break;
  case 5: case 6: case 7: {
    static const char *const ops[] = {"+", "-", "*"};
    emit(g, "("), v = gen_int(g, d - 1), emit(g, " %s ", pick(g, ops, 3));
    w = gen_int(g, d - 1), emit(g, ")"), v = v || w;
    break;
  }
  case 8: case 9:
    emit(g, "("), gen_int(g, d - 1), emit(g, " %s ", rnd(g, 2) ? "/" : "%");
    gen_divisor(g, d - 1), emit(g, ")");
    break;
  case 10: emit(g, "-("), v = gen_int(g, d - 1), emit(g, ")"); break;
  case 11: case 12:
    emit(g, "%s(", rnd(g, 2) ? "min" : "max"), v = gen_int(g, d - 1), emit(g, ", ");
    w = gen_int(g, d - 1), emit(g, ")"), v = v || w;
    break;
  case 13: emit(g, "abs("), v = gen_int(g, d - 1), emit(g, ")"); break;
  case 14:
    emit(g, "clamp("), v = gen_int(g, d - 1), emit(g, ", "), v = false; /* maybe */
    emit(g, "%s, %s)", pick(g, (const char *const[]){"-5", "0", "(-2147483647 - 1)", "q"}, 4),
         pick(g, (const char *const[]){"5", "100", "2147483647", "kv"}, 4));
    break;
  case 15: emit(g, "int("), gen_exact(g, d - 1), emit(g, ")"), v = false; break; /* maybe */
  case 16: { /* saturating conversions of exact floats */
    static const char *const big[] = {"1073741824.0", "3.4e38", "-1e30", "2147483648.0"};
    emit(g, "int("), gen_exact(g, d - 1), emit(g, " * %s)", pick(g, big, 4)), v = false;
    break;
  }
  case 17: emit(g, "int("), gen_bool(g, d - 1), emit(g, ")"), v = false; break;
  case 18:
    emit(g, "where("), gen_bool(g, d - 1), emit(g, ", "), v = gen_int(g, d - 1), emit(g, ", ");
    w = gen_int(g, d - 1), emit(g, ")"), v = v && w;
    break;
  case 19:
    emit(g, "("), gen_bool(g, d - 1), emit(g, " ? "), v = gen_int(g, d - 1), emit(g, " : ");
    w = gen_int(g, d - 1), emit(g, ")"), v = v && w;
    break;
  case 20: emit(g, "ib[clamp("), gen_int(g, d - 1), emit(g, ", 0, N - 1)]"); break;
  default: emit(g, "(2147483647 + "), v = gen_int(g, d - 1), emit(g, ")"); break;
  }
  return v;
}

/* An int in a small range (well inside 2^24), so float() of it is exact. */
static void gen_small(Gen *g, int d) {
  static const char *const mods[] = {"3", "7", "13", "97", "1000", "(-5)"};
  switch (d <= 0 ? rnd(g, 2) : rnd(g, 5)) {
  case 0: emit(g, "%s", pick(g, (const char *const[]){"q", "kv", "b", "h", "HKV", "3"}, 6)); break;
  case 1: emit(g, "%s", rnd(g, 2) ? "(q - kv)" : "(kv - 2 * q)"); break;
  case 2: emit(g, "("), gen_int(g, d - 1), emit(g, " %% %s)", pick(g, mods, 6)); break;
  case 3: emit(g, "clamp("), gen_int(g, d - 1), emit(g, ", -300, 300)"); break;
  default: emit(g, "int("), gen_exact(g, d - 1), emit(g, ")"); break;
  }
}

/* An exact float: small ints with power-of-two scalings, floor, ceil. */
static void gen_exact(Gen *g, int d) {
  int k = d <= 0 ? rnd(g, 3) : rnd(g, 14);
  switch (k) {
  case 0: emit(g, "float("), gen_small(g, d - 1), emit(g, ")"); break;
  case 1:
    if (g->nexact) emit(g, "%s", g->exacts[rnd(g, g->nexact)]);
    else emit(g, "%s", pick(g, (const char *const[]){"0.5", "2.0", "(-3.0)", "0.0"}, 4));
    break;
  case 2: emit(g, "float("), gen_small(g, d - 1), emit(g, ") * 0.5"); break;
  case 3: case 4: emit(g, "("), gen_exact(g, d - 1), emit(g, " %s ", rnd(g, 2) ? "+" : "-");
    gen_exact(g, d - 1), emit(g, ")");
    break;
  case 5: emit(g, "("), gen_exact(g, d - 1), emit(g, " / %s)", rnd(g, 2) ? "4.0" : "(-2.0)"); break;
  case 6: emit(g, "%s(", rnd(g, 2) ? "floor" : "ceil"), gen_exact(g, d - 1), emit(g, ")"); break;
  case 7: emit(g, "-("), gen_exact(g, d - 1), emit(g, ")"); break;
  case 8: emit(g, "%s(", rnd(g, 2) ? "min" : "max"), gen_exact(g, d - 1), emit(g, ", ");
    gen_exact(g, d - 1), emit(g, ")");
    break;
  case 9: emit(g, "abs("), gen_exact(g, d - 1), emit(g, ")"); break;
  case 10: emit(g, "clamp("), gen_exact(g, d - 1), emit(g, ", -8.0, 2.5)"); break;
  case 11: emit(g, "where("), gen_bool(g, d - 1), emit(g, ", "), gen_exact(g, d - 1);
    emit(g, ", "), gen_exact(g, d - 1), emit(g, ")");
    break;
  case 12: emit(g, "("), gen_bool(g, d - 1), emit(g, " ? "), gen_exact(g, d - 1);
    emit(g, " : "), gen_exact(g, d - 1), emit(g, ")");
    break;
  default: emit(g, "float("), gen_bool(g, d - 1), emit(g, ")"); break;
  }
}

static void gen_bool(Gen *g, int d) {
  static const char *const cmp[] = {"==", "!=", "<", "<=", ">", ">="};
  static const char *const blocky[] = {
      /* shapes that let interval analysis skip or fill whole tiles, several
       * of them wrapping past INT_MAX inside the tile range */
      "(kv * 33554432 > q * 16777216)", "((2147483600 + kv) > (2147483600 + q))",
      "(kv / 64 == q / 64)", "(kv / (-16) <= q / 7)", "(kv % 64 < 32)",
      "(abs(q - kv) < pi0 * 8)", "(min(q, kv) > 40)", "(kv < int(float(q) * 0.5))",
      "(kv - q > pi1)", "(q * 65536 * 512 >= kv)", "(kv < Q_LEN - q)",
      "(ib[clamp(kv, 0, N - 1)] <= ib[clamp(q, 0, N - 1)])"};
  int k = d <= 0 ? rnd(g, 3) : rnd(g, 13);
  switch (k) {
  case 12: emit(g, "%s", pick(g, blocky, 12)); break;
  case 0:
    if (g->nbool) emit(g, "%s", g->bools[rnd(g, g->nbool)]);
    else emit(g, "%s", rnd(g, 2) ? "true" : "false");
    break;
  case 1: emit(g, "(q %s kv)", pick(g, cmp, 6)); break;
  case 2:
    if (rnd(g, 2)) emit(g, "(%s %% 2 == 0)", rnd(g, 2) ? "kv" : "(q + h)");
    else emit(g, "(%s %s ", rnd(g, 2) ? "pf0" : "pf1", pick(g, cmp, 6)), gen_exact(g, d - 1),
         emit(g, ")");
    break;
  case 3: case 4: emit(g, "("), gen_int(g, d - 1), emit(g, " %s ", pick(g, cmp, 6));
    gen_int(g, d - 1), emit(g, ")");
    break;
  case 5: emit(g, "("), gen_exact(g, d - 1), emit(g, " %s ", pick(g, cmp, 6));
    if (rnd(g, 2)) gen_exact(g, d - 1); else gen_small(g, d - 1); /* float vs int too */
    emit(g, ")");
    break;
  case 6: case 7: emit(g, "("), gen_bool(g, d - 1), emit(g, " %s ", rnd(g, 2) ? "&&" : "||");
    gen_bool(g, d - 1), emit(g, ")");
    break;
  case 8: emit(g, "!("), gen_bool(g, d - 1), emit(g, ")"); break;
  case 9: emit(g, "("), gen_bool(g, d - 1), emit(g, " %s ", rnd(g, 2) ? "==" : "!=");
    gen_bool(g, d - 1), emit(g, ")");
    break;
  case 10: emit(g, "where("), gen_bool(g, d - 1), emit(g, ", "), gen_bool(g, d - 1);
    emit(g, ", "), gen_bool(g, d - 1), emit(g, ")");
    break;
  default: emit(g, "("), gen_bool(g, d - 1), emit(g, " ? "), gen_bool(g, d - 1);
    emit(g, " : "), gen_bool(g, d - 1), emit(g, ")");
    break;
  }
}

/* A float expression held in [-3, 3] where it feeds a saturating function:
 * beyond that, 1 - tanh^2 in fp32 is mostly rounding, and a gradient that
 * only flows through it could not be compared. */
static void gen_flat(Gen *g, int d) {
  emit(g, "clamp("), gen_float(g, d), emit(g, ", -3.0, 3.0)");
}

/* A smooth, moderately sized float expression (only in the score). */
static void gen_float(Gen *g, int d) {
  static const char *const lits[] = {
      "0.1", "1e-3", "2.5", "pi", "pf0", "pf1", "cf0", "cf1", "0.75", "1.5e+0",
      /* literals a printer could get wrong, scaled back to moderate values */
      "(3.4e38 * 1e-38)", "(1e-30 * 1e29)", "(1e-40 * 1e38)", "(123456.789 * 1e-5)",
      "(16777217.0 * 1e-7)", "(.5e-7 * 1e7)", "(0.30000001192092896 * 2.0)"};
  int k = d <= 0 ? rnd(g, 6) : rnd(g, 30);
  switch (k) {
  case 0: case 1: emit(g, "s"); break;
  case 2: emit(g, "%s", pick(g, lits, 17)); break;
  case 3:
    if (g->nfloat) emit(g, "%s", g->floats[rnd(g, g->nfloat)]);
    else emit(g, "s");
    break;
  case 4: emit(g, "fb[clamp("), gen_int(g, d - 1), emit(g, ", 0, 6)]"); break;
  case 5: /* the factor keeps the term from being constant along a row, where
           * softmax would make its true gradient 0 (all rounding) */
    emit(g, "(gb[h, clamp("), gen_int(g, d - 1), emit(g, ", 0, 4)] * float(kv %% 3 + 1))");
    break;
  case 6: emit(g, "tanh(float("), gen_int(g, d - 1), emit(g, ") * 1e-9)"); break;
  case 7: emit(g, "sin("), gen_exact(g, d - 1), emit(g, ")"); break;
  case 8: case 9: emit(g, "("), gen_float(g, d - 1), emit(g, " %s ", rnd(g, 2) ? "+" : "-");
    gen_float(g, d - 1), emit(g, ")");
    break;
  case 10: emit(g, "("), gen_float(g, d - 1), emit(g, " * tanh("), gen_flat(g, d - 1);
    emit(g, "))");
    break;
  case 11: emit(g, "("), gen_float(g, d - 1), emit(g, " / (abs("), gen_float(g, d - 1);
    emit(g, ") + 1.0))");
    break;
  case 12:
    emit(g, "%s(tanh(", rnd(g, 2) ? "exp" : "exp2"), gen_flat(g, d - 1), emit(g, "))");
    break;
  case 13: emit(g, "%s(abs(", rnd(g, 2) ? "log" : "log2"), gen_float(g, d - 1);
    emit(g, ") + 1.0)");
    break;
  case 14: emit(g, "sqrt(abs("), gen_float(g, d - 1), emit(g, ") + 0.25)"); break;
  case 15: emit(g, "rsqrt(abs("), gen_float(g, d - 1), emit(g, ") + 1.0)"); break;
  case 16: emit(g, "%s(", pick(g, (const char *const[]){"tanh", "sigmoid", "sin", "cos"}, 4));
    gen_flat(g, d - 1), emit(g, ")");
    break;
  case 17:
    emit(g, "pow(abs("), gen_float(g, d - 1), emit(g, ") + 0.5, %s)", rnd(g, 2) ? "0.5" : "1.5");
    break;
  case 18: emit(g, "%s(", rnd(g, 2) ? "min" : "max"), gen_float(g, d - 1), emit(g, ", ");
    gen_float(g, d - 1), emit(g, ")");
    break;
  case 19: emit(g, "abs("), gen_float(g, d - 1), emit(g, ")"); break;
  case 20: emit(g, "clamp("), gen_float(g, d - 1), emit(g, ", -1.5, 2.0)"); break;
  case 21: emit(g, "where("), gen_bool(g, d - 1), emit(g, ", "), gen_float(g, d - 1);
    emit(g, ", "), gen_float(g, d - 1), emit(g, ")");
    break;
  case 22: emit(g, "("), gen_bool(g, d - 1), emit(g, " ? "), gen_float(g, d - 1);
    emit(g, " : "), gen_float(g, d - 1), emit(g, ")");
    break;
  case 23: emit(g, "-("), gen_float(g, d - 1), emit(g, ")"); break;
  case 24: /* no-ops unless the literal is printed wrong (huge values
            * themselves would have derivatives that underflow in fp32) */
    if (rnd(g, 2)) emit(g, "min("), gen_float(g, d - 1), emit(g, ", 3.4e38)");
    else emit(g, "max("), gen_float(g, d - 1), emit(g, ", -3.4e38)");
    break;
  case 25: /* the int is promoted */
    emit(g, "("), gen_float(g, d - 1), emit(g, " + ("), gen_small(g, d - 1);
    emit(g, " %% 100) * 0.01)");
    break;
  case 26: emit(g, "where("), gen_bool(g, d - 1), emit(g, ", "), gen_float(g, d - 1);
    emit(g, ", "), gen_small(g, d - 1), emit(g, " %% 3)"); /* a common type: float */
    break;
  case 27: emit(g, "("), gen_float(g, d - 1), emit(g, " * %s)", rnd(g, 2) ? "0.1" : "1e-3"); break;
  case 28: emit(g, "float("), gen_bool(g, d - 1), emit(g, ")"); break;
  default: emit(g, "("), gen_float(g, d - 1), emit(g, " * "), gen_exact(g, 0), emit(g, " * 0.25)");
    break;
  }
}

static const char *const let_int[] = {"i0", "i1", "i2"}, *const let_exact[] = {"e0", "e1"};
static const char *const let_bool[] = {"c0", "c1"}, *const let_float[] = {"f0", "f1"};

/* A few lets of each kind, each usable by the later ones. */
static void gen_lets(Gen *g, bool score) {
  g->score = score;
  g->nint = g->nexact = g->nbool = g->nfloat = 0;
  int n = rnd(g, 5);
  for (int i = 0; i < n; i++) {
    int kind = rnd(g, score ? 4 : 3);
    const char *name;
    if (kind == 0 && g->nint < 3) name = let_int[g->nint];
    else if (kind == 1 && g->nexact < 2) name = let_exact[g->nexact];
    else if (kind == 2 && g->nbool < 2) name = let_bool[g->nbool];
    else if (kind == 3 && g->nfloat < 2) name = let_float[g->nfloat];
    else continue;
    emit(g, "  let %s = ", name);
    if (kind == 0) gen_int(g, 3), g->ints[g->nint++] = name;
    else if (kind == 1) gen_exact(g, 3), g->exacts[g->nexact++] = name;
    else if (kind == 2) gen_bool(g, 3), g->bools[g->nbool++] = name;
    else gen_float(g, 3), g->floats[g->nfloat++] = name;
    emit(g, ";\n");
  }
}

/* The kinds of mask a program gets. */
enum { MASK_SAFE, MASK_NONE, MASK_ANY };

/* A whole program into g->src; returns its mask kind. */
static int gen_program(Gen *g, uint64_t rng) {
  memset(g, 0, sizeof *g);
  g->rng = rng;
  static const char *const ci[] = {"2147483000", "-7", "0x7ffffff0", "123456789"};
  static const char *const cf[] = {"0.1", "1e-3", "-0.375", "3.0"};
  emit(g, "param float pf0 = 0.5;\nparam float pf1;\nparam int pi0 = 3;\nparam int pi1;\n");
  emit(g, "const ci0 = %s;\nconst ci1 = ci0 + 1000;\nconst ci2 = ci1 / -7 %% 5 + ci0 * 3;\n",
       pick(g, ci, 4));
  emit(g, "const cf0 = %s;\nconst cf1 = cf0 * 3.0 - 1.0;\n", pick(g, cf, 4));
  emit(g, "buffer fb: f32[7];\nbuffer ib: i32[N];\nbuffer gb: f32[H, 5] grad;\n\n");
  emit(g, "score sc(s, b, h, q, kv) {\n");
  gen_lets(g, true);
  emit(g, "  return s * (1.0 + 0.25 * tanh("), gen_flat(g, 3);
  emit(g, ")) + 0.5 * tanh("), gen_flat(g, 3);
  emit(g, ") + 0.05 * float("), gen_int(g, 3), emit(g, " %% 13);\n}\n");
  int kind = rnd(g, 10) < 7 ? MASK_SAFE : rnd(g, 2) ? MASK_NONE : MASK_ANY;
  if (kind != MASK_NONE) {
    emit(g, "\nmask mk(b, h, q, kv) {\n");
    gen_lets(g, false);
    emit(g, "  return "), gen_bool(g, 4);
    emit(g, "%s;\n}\n", kind == MASK_SAFE ? " || q == kv" : "");
  }
  return kind;
}

/* ---- running one program on both backends -------------------------------- */

/* One problem shape. */
typedef struct Shape {
  int B, H, HKV, QL, KL, E, EV; /* sizes (H % HKV == 0) */
} Shape;

static const Shape shapes[] = {
    {2, 2, 1, 19, 23, 8, 5},
    {1, 3, 3, 17, 9, 4, 6},
    {2, 4, 2, 11, 30, 7, 3},
    {1, 2, 1, 70, 150, 8, 5}, /* several tiles each way: block skipping from masks */
};
#define NSHAPES ((int)(sizeof shapes / sizeof *shapes))

/* The call of program `src` on shape s, inputs, params and buffers from
 * *rng: [0] the emulator, [1] the reference. */
static void run_init(TlCall *r, const char *name, const char *src, const Shape *s, uint64_t *rng) {
  const TlCase tc = {.name = name, .src = src, .s = {s->B, s->H, s->HKV, s->QL, s->KL, s->E, s->EV},
                     .backend = FLEX_BACKEND_EMU, .dlse = tl_rand(rng) % 2};
  tl_call_init(r, &tc, rng);
  DLDataType f32 = rt_dtype(kDLFloat, 32), i32 = rt_dtype(kDLInt, 32);
  int64_t nf = 7, ni = 4 + (int64_t)(tl_rand(rng) % 9), gs[2] = {s->H, 5};
  tl_arr_normal(tl_call_buffer(r, "fb", f32, 1, &nf, false), rng);
  TlArr *ib = tl_call_buffer(r, "ib", i32, 1, &ni, false);
  for (int64_t i = 0; i < ni; i++) {
    static const double big[] = {2147483647.0, -2147483648.0, 2147483000.0, -1.0, 0.0, 1e9};
    uint64_t x = tl_rand(rng);
    rt_array_set(&ib->a, i, x % 3 ? (double)(int)(x % 41) - 20 : big[(x >> 8) % 6]);
  }
  tl_arr_normal(tl_call_buffer(r, "gb", f32, 2, gs, true), rng);
  static const double pis[] = {3, 0, -4, 2147483600, -2147483647, 17};
  tl_call_param(r, "pf0", tl_uniform(rng) * 2 - 1);
  tl_call_param(r, "pf1", tl_uniform(rng) * 4 - 2);
  tl_call_param(r, "pi0", pis[tl_rand(rng) % 6]);
  tl_call_param(r, "pi1", pis[tl_rand(rng) % 6]);
}

static bool all_zero(const RtArray *a) {
  for (int64_t i = 0, n = rt_array_count(a); i < n; i++)
    if (rt_array_get(a, i) != 0) return false;
  return true;
}

/* Error of x against ref; an all-zero reference (every row masked, or a
 * gradient nothing reaches) is not compared by a ratio: x must then be
 * exactly zero too (0 on success, infinity otherwise). */
static double err_or_exact(const RtArray *x, const RtArray *ref) {
  if (all_zero(ref)) return all_zero(x) ? 0 : INFINITY;
  return tl_rel_err(x, ref);
}

/* Rows the reference left fully masked must be exactly O = 0, LSE = -inf,
 * dQ = 0 on the emulator too. Returns how many there were, or -1 on a
 * mismatch (described in msg). */
static int masked_rows(const TlCall *r, const Shape *s, char *msg, size_t cap) {
  int rows = s->B * s->H * s->QL, n = 0;
  for (int i = 0; i < rows; i++) {
    if (rt_array_get(&r->lse[1].a, i) != -INFINITY) continue;
    n++;
    bool ok = rt_array_get(&r->lse[0].a, i) == -INFINITY;
    for (int e = 0; e < s->EV; e++) ok = ok && rt_array_get(&r->out[0].a, i * s->EV + e) == 0;
    for (int e = 0; e < s->E; e++) ok = ok && rt_array_get(&r->dq[0].a, i * s->E + e) == 0;
    if (!ok) {
      snprintf(msg, cap, "fully masked row %d: emu lse %g out[0] %g dq[0] %g", i,
               rt_array_get(&r->lse[0].a, i), rt_array_get(&r->out[0].a, (int64_t)i * s->EV),
               rt_array_get(&r->dq[0].a, (int64_t)i * s->E));
      return -1;
    }
  }
  return n;
}

/* Compile `src`, run it on both backends with shape `s` and inputs from
 * `rng`, and compare. Returns NULL on success, else a message (static). */
static const char *diff_program(const char *name, const char *src, const Shape *s, uint64_t rng) {
  static char msg[1024];
  flex_kernel *k = NULL;
  if (flex_kernel_from_source(&k, name, src, strlen(src), NULL) != FLEX_OK) {
    snprintf(msg, sizeof msg, "does not compile: %s", flex_last_error());
    return msg;
  }
  flex_kernel_free(k);
  TlCall r;
  run_init(&r, name, src, s, &rng);
  const char *fail = NULL;
  for (int i = 1; i >= 0 && !fail; i--)
    if (tl_call_run(&r, i, false) != FLEX_OK || tl_call_run(&r, i, true) != FLEX_OK) {
      snprintf(msg, sizeof msg, "%s failed: %s", i ? "reference" : "emu", flex_last_error());
      fail = msg;
    }
  if (!fail) {
    const RtArray *dgb[2] = {&r.gbuf[0][2].a, &r.gbuf[1][2].a};
    double eo = err_or_exact(&r.out[0].a, &r.out[1].a), el = tl_rel_err(&r.lse[0].a, &r.lse[1].a);
    double eq = err_or_exact(&r.dq[0].a, &r.dq[1].a), ek = err_or_exact(&r.dk[0].a, &r.dk[1].a);
    double ev = err_or_exact(&r.dv[0].a, &r.dv[1].a), eg = err_or_exact(dgb[0], dgb[1]);
    if (all_zero(&r.out[1].a)) el = all_zero(&r.out[0].a) ? 0 : INFINITY; /* lse all -inf */
    int masked = masked_rows(&r, s, msg, sizeof msg);
    if (getenv("FLEXC_DIFF_DUMP"))
      for (int64_t i = 0; i < rt_array_count(dgb[1]); i++)
        fprintf(stderr, "dgb[%lld] emu %g ref %g\n", (long long)i, rt_array_get(dgb[0], i),
                rt_array_get(dgb[1], i));
    if (masked < 0) fail = msg;
    else if (!(eo < 1e-4 && el < 1e-4 && eq < 1e-3 && ek < 1e-3 && ev < 1e-3 && eg < 1e-3)) {
      snprintf(msg, sizeof msg, "mismatch: out %g lse %g dq %g dk %g dv %g dgb %g", eo, el, eq,
               ek, ev, eg);
      fail = msg;
      const RtArray *x[6] = {&r.out[0].a, &r.lse[0].a, &r.dq[0].a, &r.dk[0].a, &r.dv[0].a, dgb[0]};
      const RtArray *y[6] = {&r.out[1].a, &r.lse[1].a, &r.dq[1].a, &r.dk[1].a, &r.dv[1].a, dgb[1]};
      static const char *const nm[6] = {"out", "lse", "dq", "dk", "dv", "dgb"};
      for (int i = 0; i < 6; i++) tl_mismatches(nm[i], x[i], y[i], i < 2 ? 1e-4 : 1e-3, 4);
    } else {
      fprintf(stderr, "  %s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e dgb %.1e, %d masked rows\n",
              name, eo, el, eq, ek, ev, eg, masked);
    }
  }
  tl_call_free(&r);
  return fail;
}

/* ---- the tests ------------------------------------------------------------ */

static Gen gen;

START_TEST(random_program) {
  uint64_t rng = seed0 + (uint64_t)_i * 0x9e3779b97f4a7c15ull;
  gen_program(&gen, rng);
  char name[64];
  snprintf(name, sizeof name, "fuzz%d.score", _i);
  const char *fail = diff_program(name, gen.src, &shapes[_i % NSHAPES], rng ^ 0x5555);
  if (fail)
    fprintf(stderr, "program %d of FLEXC_SEED=%llu failed: %s\n---\n%s---\n", _i,
            (unsigned long long)seed0, fail, gen.src);
  ck_assert_msg(!fail, "program %d (FLEXC_SEED=%llu): %s", _i, (unsigned long long)seed0, fail);
}
END_TEST

/* Declarations every regression program starts with (so the runner's
 * params and buffers are known names). */
#define DECLS                                                                                      \
  "param float pf0 = 0.5;\nparam float pf1;\nparam int pi0 = 3;\nparam int pi1;\n"              \
  "buffer fb: f32[7];\nbuffer ib: i32[N];\nbuffer gb: f32[H, 5] grad;\n"

/* Minimal programs from failures the random programs found, and the int
 * edge cases spelled out. */
static const char *const regressions[] = {
    /* rsqrt: the emulator's CUDA shim had no rsqrtf (host compile failed) */
    DECLS "score sc(s, b, h, q, kv) { return s * (1.0 + 0.25 * tanh(rsqrt(abs(s) + 1.0))); }\n",
    /* wrap-around, INT_MIN / -1, run-time division by zero, saturation */
    DECLS "score sc(s, b, h, q, kv) {\n"
          "  let w = (2147483647 + q) % 13 + ((-2147483647 - 1) / ((q + h) % 2 - 1)) % 7;\n"
          "  let z = (q * 7 - kv) / ((q - kv) % 3) + (q - 2 * kv) % ((q + kv) % 4 - 1);\n"
          "  let t = int(float(q - kv) * 1073741824.0) % 11 + int(float(kv - q) * 3.4e38) % 5;\n"
          "  return s + 0.05 * float((w + z + t) % 13);\n}\n"
          "mask mk(b, h, q, kv) { return (kv * 33554432 > q * 16777216) || q == kv; }\n",
};
#define NREGRESSIONS ((int)(sizeof regressions / sizeof *regressions))

START_TEST(regression) {
  char name[64];
  snprintf(name, sizeof name, "regression%d.score", _i);
  const Shape *big = &shapes[NSHAPES - 1]; /* the tiled one: wraps happen past kv 64 */
  const char *fail = diff_program(name, regressions[_i], big, seed0 + (uint64_t)_i);
  if (fail) fprintf(stderr, "regression %d failed: %s\n---\n%s---\n", _i, fail, regressions[_i]);
  ck_assert_msg(!fail, "regression %d: %s", _i, fail);
}
END_TEST

/* FLEXC_DIFF_FILE=PATH: run that one program (declaring the names DECLS
 * declares) on every shape instead of the suite, to reduce a failure. */
static int run_file(const char *path) {
  char *text = NULL;
  size_t len = 0;
  if (base_read_file(path, &text, &len)) {
    fprintf(stderr, "cannot read %s\n", path);
    return EXIT_FAILURE;
  }
  int bad = 0;
  for (int i = 0; i < NSHAPES; i++) {
    const char *fail = diff_program(path, text, &shapes[i], seed0 + (uint64_t)i);
    if (fail) fprintf(stderr, "shape %d: %s\n", i, fail), bad = 1;
  }
  base_free(text);
  return bad ? EXIT_FAILURE : EXIT_SUCCESS;
}

int main(void) {
  seed0 = tl_seed();
  const char *file = getenv("FLEXC_DIFF_FILE");
  if (file && *file) return run_file(file);
  const char *env = getenv("FLEXC_DIFF_PROGRAMS");
  int n = env && *env ? atoi(env) : 15;
  return TL_MAIN("diff_fuzz", 120, TL_LOOP(regression, NREGRESSIONS), TL_LOOP(random_program, n));
}
