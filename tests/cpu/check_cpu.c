/* The CPU backend's own checks (the sample suite is check_cpu_kernels):
 *
 *   math       the JIT's float builtins (inline polynomials and libm calls)
 *              against binary64 libm over sweeps and special values
 *   vmath_dense tanh (every 251st float below 10, sparse above; 2 ulp, as
 *              CUDA's), sin and cos (every 509th below 2^21) and erf (every
 *              127th below 4.5) within 1 ulp, both signs (parity bit for
 *              bit), special values as libm, the scalar function = lanes
 *   ints       integer and conversion rules (wrapping, x/0, x%0, INT_MIN/-1,
 *              saturating int(), NaN compares, fminf/fmaxf) exactly as the
 *              float64 interpreter (ir_eval) gives them
 *   fwd_groups the forward's grouping of query tiles and key chunks
 *              (FLEXC_CPU_QGROUP, FLEXC_CPU_KVCHUNK) changes no bit of out, lse
 *   nonfinite  a NaN in Q makes that row's LSE and O NaN; a +inf score
 *              makes LSE +inf and O NaN; other rows stay finite
 *   blockmask  a caller's BlockMask (lists) and a built one (a mask over an
 *              unsorted buffer) against the reference, forward and backward
 *   scale      a caller's softmax scale and runtime params
 *   float64    float64 q, k, v refused; a buffer gradient in f32 and f64
 *              (samples/relpos_bias.score) against the reference
 *   checked    an out-of-range buffer read is reported with the buffer's name
 *   cache      a second call compiles nothing; a second process loads the
 *              object code from the disk cache
 *   row_helpers  the table's exp_sum, exp_sub and row_max (the forward's
 *              softmax) against binary64, with -inf, NaN and tails
 *   dispatch   cpu_kern() picks the AVX512-BF16 table exactly where CPUID
 *              has it, and FLEXC_CPU_ISA forces each lower table (children)
 *   bf16       the bf16 products (vdpbf16ps) against binary64 over random
 *              shapes, the bf16 P of exp_sum_bf16 against binary64 (the
 *              nearest bf16 outside its own error's reach of a midpoint);
 *              bf16 attention (the forward on those products) against the
 *              reference, fp32 and bf16 O
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu/cpu.h"
#include "base/store.h"
#include "runtime/backend.h"
#include "runtime/rt.h"
#include "testlib.h"

#ifndef FLEXC_HAVE_LLVM
int main(void) {
  printf("skipped: this build has no cpu backend (no LLVM)\n");
  return 77;
}
#else

static uint64_t rng;

static flex_kernel *load(const char *src) {
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "test.score", src, strlen(src), NULL) == FLEX_OK, "%s",
                flex_last_error());
  return k;
}

/* The JIT's score over n inputs s[] (b = h = 0, q = i / 64, kv = i % 64). */
static void jit_score(flex_kernel *k, const float *s, float *t, int n, FlexParams *p) {
  CpuJitOpts o = {.joint = false, .identity = false, .check_bounds = false};
  const CpuModule *m = NULL;
  ck_assert_msg(cpu_jit_get(k->mod, &o, &m) == FLEX_OK, "%s", flex_last_error());
  memcpy(t, s, sizeof(float) * (size_t)n);
  ck_assert_int_eq(n % 64, 0);
  m->score(t, 64, n / 64, 64, 0, 0, 0, 0, p);
}

/* ---- math ------------------------------------------------------------------- */

typedef struct MathCase {
  const char *expr;           /* the score's body over s */
  double (*ref)(double);      /* binary64 truth */
  double lo, hi;              /* sweep range */
  double ulps;                /* allowed error in float ulps of the result */
} MathCase;

static double d_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double d_rsqrt(double x) { return 1.0 / sqrt(x); }
static double d_pow(double x) { return pow(x, (double)1.7f); } /* literals are binary32 */

static const MathCase math_cases[] = {
    {"exp(s)", exp, -110, 90, 2},      {"exp2(s)", exp2, -155, 130, 2},
    {"log(s)", log, 0, 1e30, 2},       {"log2(s)", log2, 0, 1e30, 3},
    {"tanh(s)", tanh, -12, 12, 3},     {"sigmoid(s)", d_sigmoid, -90, 90, 3},
    {"sin(s)", sin, -100, 100, 2},     {"cos(s)", cos, -100, 100, 2},
    {"sqrt(s)", sqrt, 0, 1e30, 1},     {"rsqrt(s)", d_rsqrt, 0, 1e30, 2},
    {"pow(s, 1.7)", d_pow, 0, 1e10, 2},      {"erf(s)", erf, -6, 6, 2},
};
#define NMATH ((int)(sizeof math_cases / sizeof *math_cases))

START_TEST(math) {
  const MathCase *c = &math_cases[_i];
  char src[256];
  snprintf(src, sizeof src, "score f(s, b, h, q, kv) { return %s; }\n", c->expr);
  flex_kernel *k = load(src);
  enum { N = 64 * 1024 };
  float *s = malloc(sizeof(float) * N), *t = malloc(sizeof(float) * N);
  static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, 1e-40f, -1e-40f,
                                  1.17549435e-38f, 1.0f, -1.0f, 0.5f, 0.625f, -0.625f, 88.7f, -87.5f,
                                  -103.9f, 3.4e38f, -3.4e38f, 1e-7f};
  int ns = (int)(sizeof special / sizeof *special);
  for (int i = 0; i < N; i++) {
    double u = (double)i / N;
    if (i < ns) s[i] = special[i];
    else if (c->lo >= 0 && c->hi > 1e6) s[i] = (float)exp(log(1e-38) + u * (log(c->hi) - log(1e-38)));
    else if (i % 3 == 0) s[i] = (float)(c->lo + (c->hi - c->lo) * tl_uniform(&rng));
    else s[i] = (float)((tl_uniform(&rng) - 0.5) * 4.0); /* dense near 0, where cancellation bites */
  }
  FlexParams p;
  memset(&p, 0, sizeof p);
  jit_score(k, s, t, N, &p);
  double worst = 0;
  int at = -1;
  for (int i = 0; i < N; i++) {
    double r = c->ref((double)s[i]);
    float rf = (float)r;
    if (isnan(r)) {
      ck_assert_msg(isnan(t[i]), "%s(%a) = %a, want NaN", c->expr, (double)s[i], (double)t[i]);
      continue;
    }
    ck_assert_msg(!isnan(t[i]), "%s(%a) = NaN, want %a", c->expr, (double)s[i], r);
    if (isinf(rf)) {
      ck_assert_msg(t[i] == rf || fabs((double)t[i]) >= 3.4e38, "%s(%a) = %a, want %a", c->expr,
                    (double)s[i], (double)t[i], r);
      continue;
    }
    /* ulp of the result, with the subnormal spacing as the floor */
    double ulp = fmax(ldexp(1.0, ilogb(fmax(fabs(r), 1.17549435e-38)) - 23), ldexp(1.0, -149));
    double e = fabs((double)t[i] - r) / ulp;
    if (e > worst) worst = e, at = i;
  }
  fprintf(stderr, "  %-12s worst %.2f ulp at %a\n", c->expr, worst, at >= 0 ? (double)s[at] : 0.0);
  ck_assert_msg(worst <= c->ulps, "%s: %.2f ulp at s = %a (got %a, want %a)", c->expr, worst,
                (double)s[at], (double)t[at], c->ref((double)s[at]));
  free(s), free(t);
  flex_kernel_free(k);
}
END_TEST

/* tanh, sin, cos and erf (ours, cpu/kern.h) over dense sweeps of floats,
 * both signs of each (parity bit for bit: t(-x) = -t(x), cos even), against
 * binary64; the special values as libm gives them; and the scalar function
 * of the JIT's width (its remainder loops) against its vector lanes.
 * - tanh: every 251st float in [0, 10) (it rounds to 1 from 9.02 up), every
 *   8192nd above to the largest float; within 2 ulp, CUDA's bound for
 *   tanhf: the score must not be less accurate here than on a GPU.
 * - sin, cos: every 509th float below 2^21, past the 2^20 where lanes go
 *   to libm; erf: every 127th below 4.5, past the 3.9 where it is 1.
 *   Within 1 ulp: they are built for 0.5 and a hair. */
static const struct {
  const char *name, *src;
  double (*ref)(double);
  float (*libm)(float);
  int fn;               /* CPU_VM_* */
  uint32_t step, coarse; /* float bit patterns: step, 8192 from `coarse` on */
  uint32_t end;
  bool odd, sign_of_x;  /* t(-x) = -t(x) (else t(-x) = t(x)); t has x's sign */
  float one_from;       /* t = 1 from here up */
  double ulps;          /* the limit */
} vmath_cases[] = {
    {"tanh", "score f(s, b, h, q, kv) { return tanh(s); }\n", tanh, tanhf, CPU_VM_TANH, 251,
     0x41200000u, 0x7f800000u, true, true, 9.1f, 2.0},
    {"sin", "score f(s, b, h, q, kv) { return sin(s); }\n", sin, sinf, CPU_VM_SIN, 509, 0x4a000000u,
     0x4a000000u, true, false, INFINITY, 1.0},
    {"cos", "score f(s, b, h, q, kv) { return cos(s); }\n", cos, cosf, CPU_VM_COS, 509, 0x4a000000u,
     0x4a000000u, false, false, INFINITY, 1.0},
    {"erf", "score f(s, b, h, q, kv) { return erf(s); }\n", erf, erff, CPU_VM_ERF, 127, 0x40900000u,
     0x40900000u, true, true, 3.9f, 1.0},
};

START_TEST(vmath_dense) {
  const __typeof__(vmath_cases[0]) *c = &vmath_cases[_i];
  flex_kernel *k = load(c->src);
  const CpuVmath *vm = &cpu_vmath_4;
#if defined(__x86_64__)
  if (cpu_jit_lanes() == 16) vm = &cpu_vmath_16;
  if (cpu_jit_lanes() == 8) vm = &cpu_vmath_8;
#endif
  float (*scalar)(float) = vm->scalar[c->fn];
  enum { N = 1 << 20 };
  float *x = malloc(sizeof(float) * N), *t = malloc(sizeof(float) * N);
  FlexParams p;
  memset(&p, 0, sizeof p);
  double worst = 0;
  float at = 0;
  long count = 0;
  uint32_t bits = 0;
  bool done = false;
  while (!done) {
    int n = 0;
    for (; n < N / 2 && !done; n++) {
      float v;
      memcpy(&v, &bits, sizeof v);
      x[2 * n] = v, x[2 * n + 1] = -v;
      bits += bits < c->coarse ? c->step : 8192u;
      done = bits >= c->end;
    }
    for (int i = 2 * n; i < N; i++) x[i] = 0.5f; /* the rest of the last chunk */
    jit_score(k, x, t, N, &p);
    for (int i = 0; i < 2 * n; i += 2) {
      /* ck_abort_msg on failure only: every passing ck_assert in a forked
       * test writes its location to the parent, millions of writes here */
      float mirror = c->odd ? -t[i] : t[i];
      if (isnan(t[i]) || memcmp(&mirror, &t[i + 1], sizeof mirror) != 0 ||
          (c->sign_of_x && signbit(t[i]) != signbit(x[i])))
        ck_abort_msg("%s(%a) = %a, %s(-x) = %a", c->name, (double)x[i], (double)t[i], c->name,
                     (double)t[i + 1]);
      if (x[i] >= c->one_from && t[i] != 1.0f)
        ck_abort_msg("%s(%a) = %a, want 1", c->name, (double)x[i], (double)t[i]);
      double r = c->ref((double)x[i]);
      double ulp = fmax(ldexp(1.0, ilogb(fmax(fabs(r), 1.17549435e-38)) - 23), ldexp(1.0, -149));
      double e = fabs((double)t[i] - r) / ulp;
      if (e > worst) worst = e, at = x[i];
      float sc = i % 61 == 0 ? scalar(x[i]) : t[i];
      if (memcmp(&sc, &t[i], sizeof sc) != 0)
        ck_abort_msg("%s: scalar(%a) = %a, lanes %a", c->name, (double)x[i], (double)sc, (double)t[i]);
    }
    count += 2 * n;
  }
  static const float special[] = {0.0f,   -0.0f,  INFINITY, -INFINITY, NAN,    1e30f,
                                  -3e38f, 1e-45f, -1e-45f,  1e-40f,    3.4e38f};
  int ns = (int)(sizeof special / sizeof *special);
  for (int i = 0; i < N; i++) x[i] = special[i % ns];
  jit_score(k, x, t, N, &p);
  for (int i = 0; i < ns; i++) {
    float want = c->libm(special[i]);
    ck_assert_msg(isnan(want) ? isnan(t[i]) : memcmp(&t[i], &want, sizeof want) == 0,
                  "%s(%a) = %a, want %a", c->name, (double)special[i], (double)t[i], (double)want);
  }
  fprintf(stderr, "  %-4s dense   %ld inputs: worst %.2f ulp at %a\n", c->name, count, worst, (double)at);
  ck_assert_msg(worst <= c->ulps, "%s: %.2f ulp at %a", c->name, worst, (double)at);
  free(x), free(t);
  flex_kernel_free(k);
}
END_TEST

/* ---- integer rules ------------------------------------------------------------ */

static const char *const int_cases[] = {
    "float(q / (kv - 8))",
    "float(q % (kv - 8))",
    "float((q - 20) / (kv - 8)) + 100.0 * float((q - 20) % (kv - 8))",
    "float((-2147483647 - q) / (kv - 3))", /* INT_MIN / -1 at q = 1, kv = 2 */
    "float((-2147483647 - q) % (kv - 3))",
    "float((q + 2147483600) * 3 % 1000)",  /* wrapping add and multiply */
    "float(abs(-2147483647 - q) % 977)",   /* abs(INT_MIN) wraps */
    "float(int(s * 8388608.0))",           /* saturating, NaN -> 0; 2^23: the product is exact in float32 and binary64 alike */
    "float(int(s))",
    "where(s < 1.0, 1.0, 2.0) + where(s != s, 10.0, 0.0)",
    "min(s, 1.0) + max(s, -1.0)",          /* fminf / fmaxf: NaN loses */
    "float(min(q, kv) * 100 + max(q - kv, 3))",
    "floor(s) + ceil(s * 0.5)",
    "float(q) / float(kv - 8)",            /* IEEE float division, x/0 = inf */
    "float(floordiv(q - 20, kv - 8)) + 100.0 * float(floormod(q - 20, kv - 8))",
    "float(floordiv(-2147483647 - q, kv - 3) % 1000)", /* INT_MIN floordiv -1 wraps */
    "float((q << (kv - 8)) % 1000 + ((q - 30) >> (kv - 20)))", /* counts outside 0..31 */
    "float((q & kv) + 3 * (q | kv) - (q ^ (kv * 7)) + ~q)",
};
#define NINT ((int)(sizeof int_cases / sizeof *int_cases))

START_TEST(ints) {
  char src[256];
  snprintf(src, sizeof src, "score f(s, b, h, q, kv) { return %s; }\n", int_cases[_i]);
  flex_kernel *k = load(src);
  enum { N = 64 * 64 };
  float s[N], t[N];
  static const float special[] = {NAN, INFINITY, -INFINITY, 3e9f, -3e9f, 2147483647.0f,
                                  -2147483648.0f, 0.5f, -0.5f, -0.0f};
  for (int i = 0; i < N; i++)
    s[i] = i % 7 == 0 ? special[(i / 7) % 10] : (float)((tl_uniform(&rng) - 0.5) * 1e3);
  FlexParams p;
  memset(&p, 0, sizeof p);
  jit_score(k, s, t, N, &p);
  IrEnv env;
  memset(&env, 0, sizeof env);
  IrVal *vals = calloc((size_t)k->mod->score->n + 1, sizeof(IrVal));
  for (int i = 0; i < N; i++) {
    env.args[ARG_S] = ir_vf(s[i]), env.args[ARG_B] = ir_vi(0), env.args[ARG_H] = ir_vi(0);
    env.args[ARG_Q] = ir_vi(i / 64), env.args[ARG_KV] = ir_vi(i % 64);
    double r = ir_eval(k->mod->score, &env, vals).f;
    if (isnan(r)) {
      ck_assert_msg(isnan(t[i]), "%s at s=%a q=%d kv=%d: %a, want NaN", int_cases[_i], (double)s[i],
                    i / 64, i % 64, (double)t[i]);
      continue;
    }
    ck_assert_msg((double)t[i] == (double)(float)r, "%s at s=%a q=%d kv=%d: %a, want %a",
                  int_cases[_i], (double)s[i], i / 64, i % 64, (double)t[i], r);
  }
  free(vals);
  flex_kernel_free(k);
}
END_TEST

/* ---- calls through the public API ------------------------------------------------ */

/* float64 q, k, v: the cpu backend refuses them (float64 runs on the
 * reference); the tolerances are fp32's. */
static const TlDtype fp64 = {"fp64", kDLFloat, 64, 1e-4, 1e-3};

/* A cpu-backend call of kernel `src`: q, k, v and the outputs in d's dtype
 * (O float32 when f32_out), LSE float32. */
static void call_init_as(TlCall *c, const char *src, const TlDtype *d, TlShape s, bool f32_out) {
  const TlCase tc = {.name = "test.score", .src = src, .s = s, .dt = d, .backend = FLEX_BACKEND_CPU,
                     .native_out = !f32_out, .native_grads = true};
  tl_call_init(c, &tc, &rng);
}

/* fp32, H key/value heads, EV = E. */
static void call_init(TlCall *c, const char *src, int B, int H, int QL, int KL, int E) {
  call_init_as(c, src, &tl_dtypes[0], (TlShape){B, H, H, QL, KL, E, E}, false);
}

/* Both backends, forward (and backward); every output within tolerance. */
static void call_compare(TlCall *c, bool backward, const char *what) {
  tl_call_forward(c);
  if (backward) tl_call_backward(c);
  tl_call_check(c, backward ? TL_FWD | TL_BWD : TL_FWD, what);
}

START_TEST(nonfinite) {
  TlCall c;
  call_init(&c, "score f(s, b, h, q, kv) { return where(q == 3 && kv == 5, inf, s); }\n"
                "mask m(b, h, q, kv) { return kv <= q + 40; }\n", 1, 2, 70, 90, 16);
  rt_array_set(&c.q.a, (int64_t)(1 * 70 + 10) * 16 + 4, NAN); /* head 1, row 10 */
  ck_assert_msg(flex_forward(c.kern, &c.a[0]) == FLEX_OK, "%s", flex_last_error());
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 70; i++) {
      double l = rt_array_get(&c.lse[0].a, h * 70 + i), o = rt_array_get(&c.out[0].a, (h * 70 + i) * 16);
      if (i == 3) {
        ck_assert_msg(l == INFINITY && isnan(o), "h%d row 3 (+inf score): lse %g out %g", h, l, o);
      } else if (h == 1 && i == 10) {
        ck_assert_msg(isnan(l) && isnan(o), "NaN row: lse %g out %g", l, o);
      } else {
        ck_assert_msg(isfinite(l) && isfinite(o), "h%d row %d: lse %g out %g", h, i, l, o);
      }
    }
  tl_call_free(&c);
}
END_TEST

/* The forward's grouping (FLEXC_CPU_QGROUP query tiles walking
 * FLEXC_CPU_KVCHUNK key tiles at a time) changes the order in which a
 * worker visits tiles, never a tile's own order of keys: out and lse are
 * the same bits under every grouping, for fp32 and bf16, causal with odd
 * lengths (a part last group and a part last chunk) and GQA-free heads. */
START_TEST(fwd_groups) {
  static const char *const groups[][2] = {{"1", "1"}, {"3", "2"}, {"8", "1"}, {"2", "1000"}};
  for (int bf = 0; bf < 2; bf++) {
    TlCall c;
    call_init_as(&c, "score f(s, b, h, q, kv) { return s * 0.5 + float(kv % 3); }\n"
                     "mask m(b, h, q, kv) { return kv <= q + 37; }\n",
                 &tl_dtypes[bf ? 2 : 0], (TlShape){2, 3, 3, 461, 589, 40, 40}, false);
    flex_kernel *k = c.kern;
    unsetenv("FLEXC_CPU_QGROUP"), unsetenv("FLEXC_CPU_KVCHUNK");
    ck_assert_msg(flex_forward(k, &c.a[0]) == FLEX_OK, "%s", flex_last_error());
    size_t no = (size_t)rt_array_count(&c.out[0].a) * rt_dtype_size(c.out[0].t.dtype);
    size_t nl = (size_t)rt_array_count(&c.lse[0].a) * sizeof(float);
    void *out0 = malloc(no), *lse0 = malloc(nl);
    memcpy(out0, c.out[0].t.data, no), memcpy(lse0, c.lse[0].t.data, nl);
    for (int g = 0; g < 4; g++) {
      setenv("FLEXC_CPU_QGROUP", groups[g][0], 1), setenv("FLEXC_CPU_KVCHUNK", groups[g][1], 1);
      tl_arr_poison(&c.out[0]), tl_arr_poison(&c.lse[0]);
      ck_assert_msg(flex_forward(k, &c.a[0]) == FLEX_OK, "%s", flex_last_error());
      ck_assert_msg(memcmp(out0, c.out[0].t.data, no) == 0 && memcmp(lse0, c.lse[0].t.data, nl) == 0,
                    "%s: group %s chunk %s differs from the default grouping", bf ? "bf16" : "fp32",
                    groups[g][0], groups[g][1]);
    }
    unsetenv("FLEXC_CPU_QGROUP"), unsetenv("FLEXC_CPU_KVCHUNK");
    free(out0), free(lse0);
    tl_call_free(&c);
  }
  fprintf(stderr, "  forward groupings: fp32 and bf16 the same bits under 4 groupings\n");
}
END_TEST

START_TEST(user_blockmask) {
  /* The lists come from a window mask; the kernel's own mask is causal, so
   * partial blocks run causal and full blocks keep everything. */
  flex_kernel *win = load("mask w(b, h, q, kv) { return q - kv < 70 && kv - q < 70; }\n");
  TlCall c;
  call_init(&c, "score f(s, b, h, q, kv) { return s * 1.5; }\n"
                "mask causal(b, h, q, kv) { return q >= kv; }\n", 2, 2, 200, 260, 32);
  tl_call_block_mask(&c, win, 64, 64);
  call_compare(&c, true, "caller's BlockMask (64x64)");
  /* Forward only: blocks of 48 x 80, which the tiles are cut to divide. */
  tl_call_block_mask(&c, win, 48, 80);
  tl_call_poison(&c, 0), tl_call_poison(&c, 1);
  call_compare(&c, false, "caller's BlockMask (48x80)");
  tl_call_free(&c);
  flex_kernel_free(win);
}
END_TEST

START_TEST(built_blockmask) {
  TlCall c;
  call_init(&c, "buffer keep: u8[Q_LEN, KV_LEN];\n"
                "mask m(b, h, q, kv) { return keep[q, kv] != 0; }\n", 1, 3, 150, 200, 24);
  int64_t shape[2] = {150, 200};
  TlArr *keep = tl_call_buffer(&c, "keep", rt_dtype(kDLUInt, 8), 2, shape, false);
  for (int i = 0; i < 150; i++)
    for (int j = 0; j < 200; j++) /* empty, full and mixed 64x64 blocks */
      rt_array_set(&keep->a, i * 200 + j, j >= 128 ? 0 : j < 64 ? 1 : tl_uniform(&rng) < 0.5);
  call_compare(&c, true, "built BlockMask (u8 buffer)");
  RtRunStats st = rt_run_last_stats();
  ck_assert_msg(st.built && st.blocks[0] > 0 && st.blocks[1] > 0 && st.blocks[2] > 0,
                "built %d, blocks %lld empty %lld full %lld partial", st.built,
                (long long)st.blocks[0], (long long)st.blocks[1], (long long)st.blocks[2]);
  tl_call_free(&c);
}
END_TEST

/* A caller's scale and a score with params, through both backends. */
START_TEST(custom_scale) {
  TlCall c;
  call_init(&c, "param float bias = 0.5;\nparam int shift = 3;\n"
                "score f(s, b, h, q, kv) { return s + bias * float((q + shift) % 5); }\n", 2, 3, 45, 77, 40);
  tl_call_param(&c, "bias", -1.25), tl_call_param(&c, "shift", 7);
  c.a[0].scale = c.a[1].scale = 0.3;
  call_compare(&c, true, "scale 0.3, params");
  tl_call_free(&c);
}
END_TEST

/* float64 q, k, v are refused by name (the cpu backend computes in
 * float32; float64 runs on the reference); float32 inputs with a `grad`
 * buffer: samples/relpos_bias.score's table gradient into a float32 and a
 * float64 tensor. */
START_TEST(float64_buffer_grad) {
  const TlCase tc = {.sample = "relpos_bias", .s = {2, 3, 3, 70, 90, 16, 16}, .dt = &fp64,
                     .backend = FLEX_BACKEND_CPU, .native_out = true, .native_grads = true};
  TlCall c;
  tl_call_init(&c, &tc, &rng);
  ck_assert_int_eq(tl_call_run(&c, 0, false), FLEX_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(flex_last_error(), "float64 inputs run in float64 on the reference backend"),
                "%s", flex_last_error());
  tl_call_free(&c);
  TlCase t32 = tc;
  t32.dt = &tl_dtypes[0], t32.native_out = false;
  tl_call_init(&c, &t32, &rng); /* the buffer gradient: float32 on the cpu, float64 on the reference */
  int64_t shape[2] = {3, 33};
  tl_arr_uniform(tl_call_buffer(&c, "rel_bias", rt_dtype(kDLFloat, 32), 2, shape, true), -1.0, 1.0, &rng);
  call_compare(&c, true, "buffer grad f32/f64");
  ck_assert_msg(c.err[TL_DBUF] < 1e-4, "d rel_bias %g", c.err[TL_DBUF]);
  tl_call_free(&c);
}
END_TEST

START_TEST(checked) {
  TlCall c;
  call_init(&c, "buffer bias: f32[Q_LEN];\n"
                "score f(s, b, h, q, kv) { return s + bias[q + 5]; }\n", 1, 1, 40, 40, 16);
  int64_t shape[1] = {40};
  tl_call_buffer(&c, "bias", rt_dtype(kDLFloat, 32), 1, shape, false);
  c.a[0].check_bounds = true;
  flex_status st = flex_forward(c.kern, &c.a[0]);
  ck_assert_int_eq(st, FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(flex_last_error(), "bias") && strstr(flex_last_error(), "[40]"), "%s",
                flex_last_error());
  tl_call_free(&c);
}
END_TEST

START_TEST(cache) {
  TlCall c;
  call_init(&c, "score f(s, b, h, q, kv) { return s - 0.25; }\n", 1, 1, 20, 20, 8);
  ck_assert_int_eq(flex_forward(c.kern, &c.a[0]), FLEX_OK);
  int n = cpu_jit_cache_size();
  ck_assert_int_eq(flex_forward(c.kern, &c.a[0]), FLEX_OK);
  ck_assert_int_eq(cpu_jit_cache_size(), n);
  tl_call_free(&c);
}
END_TEST

/* The disk cache across processes: a child compiles a fresh module (a name
 * no earlier run used), a second child gets the object from disk. */
static const char *self;

START_TEST(disk_cache) {
  char dir[512];
  if (!base_store_dir(dir, sizeof dir)) return; /* the store's disk is off here */
  char cmd[1024];
  /* Not from the seeded generator: a run repeated with the same FLEXC_SEED
   * must not find the first run's module on disk. */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned long tag = (unsigned long)ts.tv_sec * 1000000007ul ^ (unsigned long)ts.tv_nsec ^
                      (unsigned long)getpid() << 32;
  Buf out[2] = {{0}, {0}};
  for (int i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd, "'%s' --jit-child %lu", self, tag);
    ck_assert_int_eq(tl_run(cmd, &out[i]), 0);
  }
  ck_assert_msg(strstr(out[0].data, "disk=0") && strstr(out[1].data, "disk=1"),
                "first child: %s; second child: %s", out[0].data, out[1].data);
  buf_free(&out[0]), buf_free(&out[1]);
}
END_TEST

/* ---- the kernel tables ------------------------------------------------------------ */

/* The table a child process picks with FLEXC_CPU_ISA=isa ("" for none). */
static void child_isa(const char *isa, Buf *out) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "FLEXC_CPU_ISA='%s' '%s' --isa-child", isa, self);
  ck_assert_int_eq(tl_run(cmd, out), 0);
}

/* The table cpu_kern() should pick on this CPU with FLEXC_CPU_ISA=isa. */
static const char *expected_table(const char *isa) {
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  bool bf16 = avx512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  int level = bf16 ? 3 : avx512 ? 2 : avx2 ? 1 : 0, cap = 3;
  if (isa && !strcmp(isa, "avx512")) cap = 2;
  if (isa && !strcmp(isa, "avx2")) cap = 1;
  if (isa && !strcmp(isa, "generic")) cap = 0;
  static const char *const names[4] = {"generic", "avx2", "avx512", "avx512bf16"};
  return names[level < cap ? level : cap];
}

START_TEST(dispatch) {
  const char *here = expected_table(getenv("FLEXC_CPU_ISA"));
  fprintf(stderr, "  dispatch: this CPU's table %s, this process's %s\n", expected_table(NULL), here);
  ck_assert_str_eq(cpu_kern()->name, here);
  ck_assert_int_eq(cpu_kern()->gemm_bf16 != NULL, !strcmp(here, "avx512bf16"));
  /* Every table in a child: the forward of a bf16 call runs on each (the
   * child checks it against the reference). */
  const char *isa[4] = {"", "avx512", "avx2", "generic"};
  for (int i = 0; i < 4; i++) {
    const char *want = expected_table(isa[i]);
    Buf out = {0};
    child_isa(isa[i], &out);
    char line[64];
    snprintf(line, sizeof line, "table=%s ok", want);
    ck_assert_msg(strstr(out.data, line), "FLEXC_CPU_ISA=%s: want %s, child said: %s", isa[i], line,
                  out.data);
    buf_free(&out);
  }
}
END_TEST

/* The table's row helpers (the forward's softmax): exp_sum and exp_sub
 * element by element against binary64 exp of the same fp32 argument (the
 * kernels' exp is Cephes' 1-2 ulp; 2 allowed), -inf -> 0, NaN kept, sums
 * and row_max with tails of every length below a vector. */
static double ulps(float got, double want) {
  if (want == 0) return got == 0 ? 0 : INFINITY;
  double ulp = fabs(want) < 1.17549435e-38 ? ldexp(1, -149) : ldexp(1, ilogb(want) - 23);
  return fabs((double)got - want) / ulp;
}

START_TEST(row_helpers) {
  const CpuKern *K = cpu_kern();
  float x[67], y[67];
  double worst = 0;
  for (int rep = 0; rep < 400; rep++) {
    int n = 1 + (int)(tl_rand(&rng) % 67);
    float mx = (float)(tl_uniform(&rng) * 20 - 10);
    for (int j = 0; j < n; j++) x[j] = mx - (float)(tl_uniform(&rng) * 110); /* e^0 .. e^-110 */
    if (n > 2) x[tl_rand(&rng) % (uint64_t)n] = -INFINITY;
    memcpy(y, x, sizeof x);
    float sum = K->exp_sum(y, n, mx);
    double want_sum = 0;
    for (int j = 0; j < n; j++) {
      double want = exp((double)(x[j] - mx));
      want_sum += want;
      double e = ulps(y[j], want);
      ck_assert_msg(e <= 2.0 && !isnan(y[j]), "%s exp_sum: e^%.9g = %.9g, want %.9g (%.2f ulp)",
                    K->name, (double)(x[j] - mx), (double)y[j], want, e);
      if (e > worst) worst = e;
    }
    double got_sum = 0; /* the reduction, against the elements it returned */
    for (int j = 0; j < n; j++) got_sum += y[j];
    ck_assert_msg(fabs(sum - got_sum) <= 1e-6 * got_sum + 1e-44 && fabs(sum - want_sum) <= 1e-5 * want_sum + 1e-44,
                  "%s exp_sum n %d: sum %.9g, elements sum to %.9g, want %.9g", K->name, n,
                  (double)sum, got_sum, want_sum);
    memcpy(y, x, sizeof x);
    K->exp_sub(y, n, mx);
    for (int j = 0; j < n; j++) {
      double want = isinf(x[j]) ? 0 : exp((double)(x[j] - mx));
      ck_assert_msg(ulps(y[j], want) <= 2.0, "%s exp_sub: e^(%.9g - %.9g) = %.9g, want %.9g", K->name,
                    (double)x[j], (double)mx, (double)y[j], want);
    }
    float m = -INFINITY;
    for (int j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    ck_assert_msg(K->row_max(x, n) == m, "%s row_max n %d", K->name, n);
    x[tl_rand(&rng) % (uint64_t)n] = NAN; /* anywhere, tails included */
    ck_assert_msg(isnan(K->row_max(x, n)), "%s row_max n %d: a NaN is lost", K->name, n);
    memcpy(y, x, sizeof x);
    ck_assert_msg(isnan(K->exp_sum(y, n, mx)), "%s exp_sum n %d: a NaN is lost", K->name, n);
  }
  fprintf(stderr, "  row helpers (%s): exp worst %.2f ulp\n", K->name, worst);
}
END_TEST

/* A random bf16 value (a normal sample rounded). */
static uint16_t rand_bf16(void) { return rt_bf16_from_double(tl_normal(&rng)); }
static double bf16_val(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

/* C (+)= alpha A B through gemm_bf16 against binary64, over shapes with row
 * tails (m not a multiple of the 8-row block), odd k (a zero pad element),
 * several 32-column blocks, and row strides wider than the data. */
START_TEST(bf16_products) {
  const CpuKern *K = cpu_kern();
  if (!K->gemm_bf16) {
    fprintf(stderr, "  bf16 products: table %s has none (no AVX512-BF16 here)\n", K->name);
    return;
  }
  const int ms[] = {1, 7, 8, 13, 64}, ks[] = {1, 2, 15, 64, 129}, ns[] = {32, 96};
  for (int mi = 0; mi < 5; mi++)
    for (int ki = 0; ki < 5; ki++)
      for (int ni = 0; ni < 2; ni++)
        for (int acc = 0; acc < 2; acc++) {
          int m = ms[mi], k = ks[ki], n = ns[ni], k2 = (k + 1) / 2;
          int64_t lda = k2 + 3, ldb = n + 32, ldc = n + 16;
          uint32_t *A = calloc((size_t)(m * lda), 4), *B = calloc((size_t)(k2 * ldb), 4);
          float *C = malloc(sizeof(float) * (size_t)(m * ldc));
          double *ref = malloc(sizeof(double) * (size_t)(m * n)), alpha = acc ? 1.0 : 0.125 + tl_uniform(&rng);
          uint16_t *a16 = (uint16_t *)A;
          for (int r = 0; r < m; r++)
            for (int p = 0; p < k; p++) a16[r * lda * 2 + p] = rand_bf16();
          for (int p = 0; p < k; p++)
            for (int j = 0; j < n; j++) {
              uint16_t v = rand_bf16();
              B[(p / 2) * ldb + j] |= (uint32_t)v << (16 * (p & 1));
            }
          for (int r = 0; r < m; r++)
            for (int j = 0; j < n; j++) {
              double c0 = acc ? tl_normal(&rng) : NAN; /* overwritten when !acc */
              C[r * ldc + j] = (float)c0;
              double s = 0;
              for (int p = 0; p < k; p++)
                s += bf16_val(a16[r * lda * 2 + p]) * bf16_val((uint16_t)(B[(p / 2) * ldb + j] >> (16 * (p & 1))));
              ref[r * n + j] = (acc ? (double)(float)c0 : 0.0) + (double)(float)alpha * s;
            }
          K->gemm_bf16(m, n, k2, A, lda, B, ldb, C, ldc, (float)alpha, acc);
          double num = 0, den = 0;
          bool nan = false;
          for (int r = 0; r < m; r++)
            for (int j = 0; j < n; j++) {
              double d = C[r * ldc + j] - ref[r * n + j];
              nan |= isnan(C[r * ldc + j]);
              num += d * d, den += ref[r * n + j] * ref[r * n + j];
            }
          double err = sqrt(num / den);
          ck_assert_msg(!nan && err < 1e-5, "gemm_bf16 m %d n %d k %d acc %d: rel err %g%s", m, n, k,
                        acc, err, nan ? " (NaN)" : "");
          free(A), free(B), free(C), free(ref);
        }
  /* exp_sum_bf16 (the forward's P): over every row length to 130 (odd ones
   * get a zero pad), with -inf (masked) keys, rows around 0, 1e4 and past
   * 2^16 (the accurate exp's rows), each P against binary64: one of the two
   * bf16 values around e^(x - mx), the nearest (ties to even) wherever
   * e^(x - mx) is further from the midpoint than the pass's own error; the
   * sum within that error; nothing written past the pad, x unchanged. */
  float row[136], keep[136];
  static const double base[] = {0.0, 1e4, -7e4, 3e5};
  int near_mid = 0;
  for (int n = 1; n <= 130; n++) {
    double b0 = base[n % 4];
    for (int j = 0; j < n; j++)
      row[j] = j % 7 == 3 ? -INFINITY : (float)(b0 + 3.0 * tl_normal(&rng));
    float mx = K->row_max(row, n);
    memcpy(keep, row, sizeof row);
    uint16_t got[136];
    memset(got, 0xa5, sizeof got);
    float sum = K->exp_sum_bf16(got, row, n, mx);
    /* the polynomial's 1.6e-7 and the shift of t by mx log2(e)'s rounding
     * (fast rows only, |mx| < 2^16) */
    double eps = 4e-7 + (fabs((double)mx) < 65536.0 ? fabs((double)mx) * 0x1p-24 * 1.4427 * 0.6932 : 0);
    double want_sum = 0; /* l is the sum of P as stored (bf16), in fp32 */
    for (int j = 0; j < n; j++) {
      double e = exp((double)row[j] - (double)mx);
      want_sum += bf16_val(got[j]);
      uint16_t lo = rt_bf16_from_double(e), hi = lo;
      if (bf16_val(lo) > e) lo = (uint16_t)(lo - 1);
      else if (bf16_val(lo) < e) hi = (uint16_t)(lo + 1);
      double mid = (bf16_val(lo) + bf16_val(hi)) / 2;
      ck_assert_msg(got[j] == lo || got[j] == hi, "exp_sum_bf16 n %d [%d]: %a, want %a (mx %a)", n, j,
                    bf16_val(got[j]), e, (double)mx);
      if (fabs(e - mid) > eps * e)
        ck_assert_msg(got[j] == rt_bf16_from_double(e), "exp_sum_bf16 n %d [%d]: %a, want %a (nearest)",
                      n, j, bf16_val(got[j]), e);
      else
        near_mid++;
    }
    ck_assert_msg(fabs(sum - want_sum) <= 4e-6 * want_sum, "exp_sum_bf16 n %d: sum %a, want %a",
                  n, (double)sum, want_sum);
    ck_assert_msg(!(n & 1) || got[n] == 0, "exp_sum_bf16 n %d: pad 0x%04x", n, got[n]);
    ck_assert_msg(got[n + (n & 1)] == 0xa5a5, "exp_sum_bf16 n %d wrote past the pad", n);
    ck_assert_msg(memcmp(keep, row, sizeof(float) * (size_t)n) == 0, "exp_sum_bf16 n %d changed x", n);
  }
  /* special rows: a NaN key makes its P NaN; a +inf max makes finite keys
   * 0 and +inf keys NaN (inf - inf), as the fp32 exp_sum */
  float sp[4] = {1.0f, NAN, -INFINITY, 2.0f};
  uint16_t g4[4];
  K->exp_sum_bf16(g4, sp, 4, 2.0f);
  ck_assert(isnan(bf16_val(g4[1])) && g4[2] == 0 && g4[3] == 0x3f80);
  float si[4] = {1.0f, INFINITY, -INFINITY, -3.0f};
  K->exp_sum_bf16(g4, si, 4, INFINITY);
  ck_assert(g4[0] == 0 && isnan(bf16_val(g4[1])) && g4[2] == 0 && g4[3] == 0);
  fprintf(stderr, "  bf16 products (%s): 100 shapes; bf16 P: 130 rows (%d values within reach of a midpoint)\n",
          K->name, near_mid);
}
END_TEST

/* bf16 q, k, v (forward on the bf16 products where the table has them)
 * against the reference: odd E (a pad element), odd and tile-crossing
 * lengths, GQA, softcap + causal, with an fp32 O (the kernel's own error)
 * and a bf16 O, forward and backward at the bf16 tolerances. */
static void bf16_case(const char *src, int B, int H, int HKV, int QL, int KL, int E, bool f32_out,
                      int block_q, int block_kv) {
  TlCall c;
  call_init_as(&c, src, &tl_dtypes[2], (TlShape){B, H, HKV, QL, KL, E, E}, f32_out);
  /* a caller's BlockMask (a window): tiles cut to its blocks */
  flex_kernel *win = block_q ? load("mask w(b, h, q, kv) { return q - kv < 90 && kv - q < 150; }\n") : NULL;
  if (win) tl_call_block_mask(&c, win, block_q, block_kv);
  char what[64];
  snprintf(what, sizeof what, "bf16 %s %s O %dx%d", cpu_kern()->name, f32_out ? "fp32" : "bf16", block_q,
           block_kv);
  call_compare(&c, true, what);
  if (win) flex_kernel_free(win);
  tl_call_free(&c);
}

static const char softcap_causal[] = "param float softcap = 20.0;\n"
                                     "score f(s, b, h, q, kv) { return softcap * tanh(s / softcap); }\n"
                                     "mask causal(b, h, q, kv) { return q >= kv; }\n";

START_TEST(bf16_attention) {
  bf16_case("score f(s, b, h, q, kv) { return s; }\n", 2, 4, 2, 70, 131, 15, true, 0, 0);
  bf16_case(softcap_causal, 1, 3, 1, 200, 200, 72, true, 0, 0);
  bf16_case(softcap_causal, 2, 2, 2, 129, 257, 64, false, 0, 0);
  bf16_case(softcap_causal, 1, 2, 2, 150, 333, 32, true, 64, 64); /* forward and backward blocks */
  bf16_case("score f(s, b, h, q, kv) { return s * 0.5; }\n", 1, 2, 1, 150, 333, 24, true, 64, 192);
}
END_TEST

/* The child of dispatch: its table, and a bf16 forward on it checked
 * (a suite of its own, as the fixture asserts). */
START_TEST(isa_forward) {
  TlCall c;
  call_init_as(&c, softcap_causal, &tl_dtypes[2], (TlShape){1, 2, 2, 70, 131, 33, 33}, false);
  tl_call_forward(&c);
  double eo = tl_rel_err(&c.out[0].a, &c.out[1].a), el = tl_rel_err(&c.lse[0].a, &c.lse[1].a);
  printf("table=%s %s out %.2g lse %.2g\n", cpu_kern()->name, eo < 3e-2 && el < 3e-2 ? "ok" : "FAILED", eo, el);
  tl_call_free(&c);
}
END_TEST

static int isa_child(void) {
  rng = tl_seed();
  return TL_MAIN("isa", 0, TL_TEST(isa_forward));
}

/* The child of disk_cache: compile score f_TAG and run it on one element. */
static int jit_child(unsigned long tag) {
  char src[256];
  snprintf(src, sizeof src, "score f_%lu(s, b, h, q, kv) { return tanh(s) + 2.0; }\n", tag);
  flex_kernel *k = NULL;
  if (flex_kernel_from_source(&k, "child.score", src, strlen(src), NULL)) return 1;
  CpuJitOpts o = {.joint = true, .identity = false, .check_bounds = false};
  const CpuModule *m = NULL;
  if (cpu_jit_get(k->mod, &o, &m)) {
    printf("%s\n", flex_last_error());
    return 1;
  }
  float t[64] = {0};
  FlexParams p;
  memset(&p, 0, sizeof p);
  m->score(t, 64, 1, 64, 0, 0, 0, 0, &p);
  printf("disk=%d value=%g\n", m->from_disk, (double)t[0]);
  flex_kernel_free(k);
  return t[0] == 2.0f ? 0 : 1;
}

int main(int argc, char **argv) {
  self = argv[0];
  if (argc == 3 && !strcmp(argv[1], "--jit-child")) return jit_child(strtoul(argv[2], NULL, 10));
  if (argc == 2 && !strcmp(argv[1], "--isa-child")) return isa_child();
  rng = tl_seed();
  if (!flex_backend_available(FLEX_BACKEND_CPU)) {
    printf("skipped: %s\n", flex_last_error());
    return 77;
  }
  return TL_MAIN("cpu", 120, TL_LOOP(math, NMATH), TL_LOOP(vmath_dense, 4), TL_LOOP(ints, NINT),
                 TL_TEST(nonfinite), TL_TEST(fwd_groups), TL_TEST(user_blockmask), TL_TEST(built_blockmask),
                 TL_TEST(custom_scale), TL_TEST(float64_buffer_grad), TL_TEST(checked), TL_TEST(cache),
                 TL_TEST(disk_cache), TL_TEST(dispatch), TL_TEST(row_helpers), TL_TEST(bf16_products),
                 TL_TEST(bf16_attention));
}
#endif
