/* A score's bias folded into S's accumulators (kernels/bias.cuh;
 * docs/kernels.md, "A bias folded into S's accumulators") in the calls the
 * samples do not make: a `grad` slope (the backward's joint adds its
 * gradient while S holds the bias), a per-head constant beside the slope,
 * grouped heads, and an empty key or query sequence; on the sm_80 and
 * sm_90a bodies of the emulator, fp16 and bf16, against the float64
 * reference (fresh inputs each run, outputs poisoned, every element). */
#include <check.h>
#include <math.h>
#include <stdio.h>

#include "runtime/flex.h"
#include "testlib.h"

static uint64_t rng;

static const char *const src =
    "buffer slopes: f32[H] grad;\nbuffer base: f32[H];\n"
    "score al(s, b, h, q, kv) { return s + slopes[h] * float(kv - q) + base[h]; }\n"
    "mask causal(b, h, q, kv) { return q >= kv; }\n";

static const TlShape shapes[] = {
    {2, 4, 2, 77, 150, 64, 64}, /* grouped heads, partial tiles */
    {1, 2, 1, 70, 0, 64, 64},   /* no keys: every row fully masked */
    {1, 2, 2, 0, 33, 64, 64},   /* no queries */
};
enum { NSHAPES = sizeof shapes / sizeof *shapes };
static const char *const archs[2] = {"sm_80", "sm_90a"};

/* _i = (arch * 2 + dtype) * NSHAPES + shape. */
START_TEST(folded_bias) {
  const int shape = _i % NSHAPES, di = 1 + _i / NSHAPES % 2, arch = _i / NSHAPES / 2;
  const TlCase tc = {.name = "alibi_grad", .src = src, .s = shapes[shape], .dt = &tl_dtypes[di],
                     .backend = FLEX_BACKEND_EMU, .arch = archs[arch]};
  TlCall c;
  tl_call_init(&c, &tc, &rng);
  const int64_t n = shapes[shape].H;
  TlArr *sl = tl_call_buffer(&c, "slopes", rt_dtype(kDLFloat, 32), 1, &n, true);
  TlArr *bs = tl_call_buffer(&c, "base", rt_dtype(kDLFloat, 32), 1, &n, false);
  for (int64_t h = 0; h < n; h++) {
    rt_array_set(&sl->a, h, 0.05 + 0.3 * (double)(tl_rand(&rng) % 1000) / 1000.0);
    rt_array_set(&bs->a, h, tl_normal(&rng));
  }
  tl_call_poison(&c, 0); /* the slope's gradient too */
  char label[96];
  snprintf(label, sizeof label, "%s %s B%d H%d/%d L%d/%d", archs[arch], tl_dtypes[di].name,
           shapes[shape].B, shapes[shape].H, shapes[shape].HKV, shapes[shape].QL, shapes[shape].KL);
  tl_call_forward(&c);
  tl_call_backward(&c);
  if (shape == 0) {
    tl_call_check(&c, TL_FWD | TL_BWD, label);
  } else { /* empty: every written element exact (the poison must be gone) */
    TlArr *xs[6] = {&c.out[0], &c.lse[0], &c.dq[0], &c.dk[0], &c.dv[0], &c.gbuf[0][0]};
    static const char *const names[6] = {"out", "lse", "dq", "dk", "dv", "dslopes"};
    for (int o = 0; o < 6; o++)
      for (int64_t i = 0; i < rt_array_count(&xs[o]->a); i++) {
        const double x = rt_array_get(&xs[o]->a, i), want = o == 1 ? -INFINITY : 0.0;
        ck_assert_msg(x == want, "%s: %s[%lld] is %g, not %g", label, names[o], (long long)i, x, want);
      }
    fprintf(stderr, "  %s: every output exact\n", label);
  }
  tl_call_free(&c);
}
END_TEST

int main(void) {
  rng = tl_seed();
  tl_one_process(); /* the emulator's modules serve several tests */
  return TL_MAIN("emu_bias", 600, TL_LOOP(folded_bias, 2 * 2 * NSHAPES));
}
