/* Division by a value the same for a whole tile (a param, a constant, b or
 * h): flex_fdiv_uniform (kernels/common.cuh), x k times the reciprocal of
 * y k, k keeping that reciprocal a normal number. The divisors here are the
 * ones a plain reciprocal gets wrong: subnormal (1 / y overflows or is
 * flushed), above 2^126 (1 / y is subnormal and flushed), and negative and
 * ordinary for good measure; a per-element numerator (s * e / d) and a
 * quotient of two params (s * (e / d)), forward and backward (the joint
 * divides by d too), on the sm_80 and sm_90a bodies of the emulator, fp32,
 * fp16 and bf16, against the float64 reference (fresh inputs each run,
 * outputs poisoned, every element). */
#include <check.h>
#include <math.h>
#include <stdio.h>

#include "runtime/flex.h"
#include "testlib.h"

static uint64_t rng;

static const char *const srcs[2] = {
    "param float e = 1.0;\nparam float d = 1.0;\n"
    "score sed(s, b, h, q, kv) { return s * e / d; }\n",
    "param float e = 1.0;\nparam float d = 1.0;\n"
    "score sq(s, b, h, q, kv) { return s * (e / d); }\n",
};

/* e, d and the call's scale: every quotient e / d between 0.4 and 4, every
 * value exact in float32; the small scale keeps s e below 2^128 where e is
 * 2^127. A subnormal e only in the quotient of params: s e would round to
 * a few bits before any division. A subnormal divisor of s e: forward
 * only, as the backward's dt / d (the derivative of a / d is dt / d, times
 * e after) overflows float32 where |dt| >= 1, with IEEE division as well. */
typedef struct Div { double e, d, scale; const char *what; bool quotient_only; } Div;
static const Div divs[] = {
    {1.0, -2.5, 0, "ordinary, negative", false},
    {0x1p-126, 0x1p-128, 0, "subnormal divisor", false},
    {0x1p127, 0x1.8p126, 0.02, "divisor above 2^126", false},
    {0x1p-20, 0x1.4p-21, 0, "ordinary", false},
    {0x1.8p-141, 0x1p-140, 0, "subnormal numerator and divisor", true},
};
enum { NDIVS = sizeof divs / sizeof *divs };
static const char *const archs[2] = {"sm_80", "sm_90a"};

START_TEST(uniform_divisor) {
  const int arch = _i % 2, dv = _i / 2 % NDIVS, src = _i / 2 / NDIVS;
  const int di = arch == 0 ? 0 : 1 + dv % 2;
  if (divs[dv].quotient_only && src == 0) return;
  const TlCase tc = {.name = src ? "quotient" : "divide", .src = srcs[src],
                     .s = {1, 2, 2, 77, 90, 64, 64}, .dt = &tl_dtypes[di],
                     .backend = FLEX_BACKEND_EMU, .arch = archs[arch], .scale = divs[dv].scale};
  TlCall c;
  tl_call_init(&c, &tc, &rng);
  tl_call_param(&c, "e", divs[dv].e);
  tl_call_param(&c, "d", divs[dv].d);
  char label[128];
  snprintf(label, sizeof label, "%s %s %s, e %a d %a (%s)", tc.name, archs[arch], tl_dtypes[di].name,
           divs[dv].e, divs[dv].d, divs[dv].what);
  tl_call_forward(&c);
  tl_call_backward(&c);
  const bool grad = !(src == 0 && fabs(divs[dv].d) < 0x1p-126);
  tl_call_check(&c, grad ? TL_FWD | TL_BWD : TL_FWD, label);
  tl_call_free(&c);
}
END_TEST

int main(void) {
  rng = tl_seed();
  tl_one_process(); /* the emulator's modules serve several tests */
  return TL_MAIN("emu_divide", 600, TL_LOOP(uniform_divisor, 2 * NDIVS * 2));
}
