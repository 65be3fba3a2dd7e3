/* Extreme inputs on every kernel path of the emulator, against the float64
 * reference: the sm_80 forward (flex_fwd_tc for fp16 / bf16, flex_fwd_simt
 * for fp32), the sm_90a forward (TMA + wgmma), the split-KV forward and its
 * combine, and the backward bodies that follow them (docs/kernels.md,
 * "Huge scores").
 *
 *  - Large magnitudes (the exponent's single FMA x s - m s, with m s
 *    rounded, lost the row's exponent once scores passed 2^24 in log2
 *    units): every element of Q, K and V equal to one value from 1e3 to
 *    1.4e5 (the seeds' test_flash_attention_large_bf16_nan_values uses
 *    133120), Q, K, V drawn with magnitudes uniform in [1e3, 1.4e5] and
 *    random signs (rows whose max is hugely negative as well as positive),
 *    and rows whose max crosses 2^16 in the exp2 domain between key tiles;
 *    bf16, fp16 where the values are representable (up to 65504), fp32. O
 *    and LSE within the dtype's tolerance of the reference (O's plus what
 *    the logits' float32 rounding does to it: logit_rounding), never NaN. The
 *    backward of the constant case runs too: it recomputes P from the fp32
 *    LSE the forward wrote, whose rounding (about |LSE| 2^-24) is the
 *    error of every P of such a row, so its gradients are only checked
 *    to be finite where the reference's are. In fp16 dQ and dK may still
 *    overflow: the reference's are exactly 0 (P uniform, dP - D = 0), the
 *    kernels' the fp32 rounding of dP - D (|dP| about 2^-24 |dO| |V|) times
 *    K or Q, which at 30000 passes 65504; they are checked for NaN only.
 *  - Huge scores from a score function: s * 1e28 (rows of about +-1e28),
 *    -1e30 on every third key (a finite mask value beside ordinary
 *    scores), and -1e30 on every key of the even rows (a finite row of
 *    huge magnitude: uniform P); the same two as biases the tensor-core
 *    kernels fold into S's accumulators (s + 1e6 float(kv - q), whose P
 *    is one-hot, and -1e5 on every even head); their backward finite. Forward within tolerance; the backward
 *    within the gradient tolerance where the rows' LSE is ordinary (the
 *    second), finite for the others. Split-KV's O of the rows at -1e30 is
 *    not judged, only free of NaN: the combine weighs each chunk's partial
 *    by its fp32 LSE, -1e30 + ln(keys in the chunk), which rounds to -1e30
 *    whatever the chunk's key count (an ulp of 1e30 is 7.6e22), so chunks
 *    of unequal counts get equal weights (docs/kernels.md, "Huge scores"). For s * 1e28 dV only, dQ and dK
 *    never NaN in fp32 and bf16 and not judged in fp16: dS carries the
 *    score's derivative, 1e28, times the rounding of dP - D where the
 *    reference's is exactly 0, and fp16 dS (rounded for its mma, as
 *    FlashAttention does) overflows, so dQ and dK can be inf - inf.
 *
 * Each path runs in one dtype, rotated by the seed; --full (CTest
 * check_emu_extreme_full, label slow) runs every path in every dtype.
 * Fresh random inputs every run (tl_seed); outputs poisoned with NaN. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"
#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;
/* --full: every path in every dtype; else each path in one dtype, rotated
 * by the seed (CTest check_emu_extreme_full, label slow, runs them all). */
static bool full;
static int rot;

/* Whether combination _i = path * 3 + dtype runs. */
static bool picked(int i) { return full || i % 3 == (i / 3 + rot) % 3; }

/* The kernel paths: which arch the emulator generates for and how many key chunks. */
enum { P_SM80, P_SM90, P_SPLIT, NPATHS };
static const char *const path_names[NPATHS] = {"sm_80", "sm_90a", "split-KV"};

/* 130 query rows: a tile of 128 rows inside Q_LEN and one past it; 300
 * keys: interior key tiles (the steady loops) and a ragged last one. */
enum { B = 1, H = 2, HKV = 1, QL = 130, KL = 300, E = 64 };

typedef struct Tensors {
  TlPair q, k, v, dout, out, lse, dq, dk, dv;
} Tensors;

static void tensors_init(Tensors *t, DLDataType dt) {
  int64_t qs[4] = {B, H, QL, E}, ks[4] = {B, HKV, KL, E}, ls[3] = {B, H, QL};
  memset(t, 0, sizeof *t);
  tl_pair_init(&t->q, dt, 4, qs, true, &rng), tl_pair_init(&t->k, dt, 4, ks, true, &rng);
  tl_pair_init(&t->v, dt, 4, ks, true, &rng), tl_pair_init(&t->dout, dt, 4, qs, true, &rng);
  tl_pair_init(&t->out, dt, 4, qs, false, &rng);
  tl_pair_init(&t->lse, rt_dtype(kDLFloat, 32), 3, ls, false, &rng);
  tl_pair_init(&t->dq, dt, 4, qs, false, &rng), tl_pair_init(&t->dk, dt, 4, ks, false, &rng);
  tl_pair_init(&t->dv, dt, 4, ks, false, &rng);
}

static void tensors_free(Tensors *t) {
  TlPair *all[] = {&t->q, &t->k, &t->v, &t->dout, &t->out, &t->lse, &t->dq, &t->dk, &t->dv};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tl_pair_free(all[i]);
}

/* x[i] = v rounded to x's dtype, and the same value in the float64 twin. */
static void set_both(TlPair *p, int64_t i, double v) {
  rt_array_set(&p->x, i, v);
  rt_array_set(&p->ref, i, rt_array_get(&p->x, i));
}

static flex_args args_for(Tensors *t, int path, bool ref) {
  flex_args a;
  memset(&a, 0, sizeof a);
#define T(P) (ref ? &t->P.tref : &t->P.tx)
  a.backend = ref ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
  a.q = T(q), a.k = T(k), a.v = T(v), a.out = T(out), a.lse = T(lse), a.dout = T(dout);
  a.dq = T(dq), a.dk = T(dk), a.dv = T(dv);
#undef T
  a.arch = path == P_SM90 ? "sm_90a" : NULL;
  a.kv_splits = path == P_SPLIT ? 3 : 1;
  return a;
}

static flex_kernel *identity_kernel(void) {
  static const char src[] = "score ident(s, b, h, q, kv) { return s; }\n";
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "ident", src, sizeof src - 1, NULL) == FLEX_OK, "%s",
                flex_last_error());
  return k;
}

/* The forward on both backends, and which body the emulator ran. */
static void forward_both(flex_kernel *k, Tensors *t, int path, bool fp32, const char *label) {
  flex_args r = args_for(t, path, true), a = args_for(t, path, false);
  ck_assert_msg(flex_forward(k, &r) == FLEX_OK, "%s: reference forward: %s", label, flex_last_error());
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "%s: emu forward: %s", label, flex_last_error());
  RtRunStats st = rt_run_last_stats();
  if (path == P_SM90) ck_assert_msg(st.fwd_sm90 == !fp32, "%s: the sm_90a forward %s", label,
                                    fp32 ? "ran for fp32" : "did not run");
  if (path == P_SPLIT) ck_assert_msg(st.kv_splits == 3, "%s: %d key chunks, want 3", label, st.kv_splits);
}

static void backward_both(flex_kernel *k, Tensors *t, int path, bool fp32, const char *label) {
  flex_args r = args_for(t, path, true), a = args_for(t, path, false);
  ck_assert_msg(flex_backward(k, &r) == FLEX_OK, "%s: reference backward: %s", label, flex_last_error());
  ck_assert_msg(flex_backward(k, &a) == FLEX_OK, "%s: emu backward: %s", label, flex_last_error());
  if (path == P_SM90) ck_assert_msg(rt_run_last_stats().bwd_sm90 == !fp32, "%s: the sm_90a backward %s",
                                    label, fp32 ? "ran for fp32" : "did not run");
}

static int64_t count_nan(const RtArray *a) {
  int64_t n = 0;
  for (int64_t i = 0; i < rt_array_count(a); i++) n += isnan(rt_array_get(a, i));
  return n;
}

/* Elements of p.x where the reference is finite that are NaN (infinities
 * too unless inf_ok). */
static int64_t count_bad(const TlPair *p, bool inf_ok) {
  int64_t n = 0;
  for (int64_t i = 0; i < rt_array_count(&p->x); i++) {
    const double x = rt_array_get(&p->x, i);
    n += (inf_ok ? isnan(x) : !isfinite(x)) && isfinite(rt_array_get(&p->ref, i));
  }
  return n;
}

/* How check_backward judges the gradients. */
typedef enum Judge {
  FINITE,   /* dQ, dK, dV never NaN or infinite where the reference is finite */
  ACCURATE, /* FINITE, and within the gradient tolerance */
  DV_ONLY,  /* dV FINITE; dQ and dK never NaN, infinite allowed (see the header) */
  DV,       /* dV FINITE; dQ and dK not judged (see the header) */
} Judge;

static void check_backward(const char *label, Tensors *t, const TlDtype *d, Judge judge) {
  TlPair *g[] = {&t->dq, &t->dk, &t->dv};
  const char *names[] = {"dq", "dk", "dv"};
  for (int i = judge == DV ? 2 : 0; i < 3; i++) {
    const bool inf_ok = judge == DV_ONLY && i < 2;
    const int64_t bad = count_bad(g[i], inf_ok), nonfinite = count_bad(g[i], false);
    const double e = nonfinite ? INFINITY : tl_pair_err(g[i]);
    fprintf(stderr, "    %s: %s %.2g (%lld not finite)\n", label, names[i], e, (long long)nonfinite);
    ck_assert_msg(bad == 0, "%s: %lld elements of %s %s where the reference is finite", label,
                  (long long)bad, names[i], inf_ok ? "NaN" : "NaN or infinite");
    if (judge == ACCURATE)
      ck_assert_msg(e < d->gtol, "%s: %s error %g (tol %g)", label, names[i], e, d->gtol);
  }
}

/* ---- large magnitudes ----------------------------------------------------- */

/* The constant values (every element of Q, K and V); fp16 takes those up to 65504. */
static const double constants[] = {1e3, 3e4, 65504, 133120};
enum { NCONST = sizeof constants / sizeof *constants };

/* What the float32 rounding of the logits can do to O, relative to |O|.
 * Every kernel forms S = Q K^T in float32 (tensor cores accumulate in
 * float32; the SIMT body multiplies and adds in it), so logit j of row i
 * carries an error of about sqrt(E) 2^-24 scale sum_e |q_ie k_je|: at the
 * magnitudes here that is a few hundredths of a unit of the natural log,
 * and P_ij moves by that fraction. Where one key dominates a row this
 * moves nothing; where two keys of a row nearly tie (rows crossing 2^16,
 * a seed in a few) their weights shift against each other by that
 * fraction. First order: dO_i = sum_j P_ij d_ij |v_j - O_i|, here summed
 * over rows as a norm (the float64 twins give q, k, v, O and LSE). With a
 * score function `logit` (t of s = scale Q K^T; NULL: t = s), s's error
 * moves t by |dt/ds| times itself, P is t's softmax (row-normalised here:
 * a float64 LSE of -1e30 has lost the row's ln(keys)), and for a bias the
 * kernels round (`bias`: 1e5 to 1e8 plus s) d_ij also has |t| 2^-23 (two
 * roundings: the bias, then s added). */
typedef double (*Logit)(double s, int h, int q, int kv);
static double logit_rounding(Tensors *t, Logit logit, bool bias) {
  const double scale = 1.0 / sqrt((double)E), u = 0x1p-24 * sqrt((double)E);
  double dd = 0, oo = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < QL; i++) {
        const int64_t row = ((int64_t)b * H + h) * QL + i;
        if (!isfinite(rt_array_get(&t->lse.ref, row))) continue;
        double tv[KL], dv[KL], tmax = -INFINITY, sum = 0;
        for (int j = 0; j < KL; j++) {
          const int64_t kr = ((int64_t)b * HKV + h / (H / HKV)) * KL + j;
          double s = 0, a = 0;
          for (int e = 0; e < E; e++) {
            const double x = rt_array_get(&t->q.ref, row * E + e) * rt_array_get(&t->k.ref, kr * E + e);
            s += x, a += fabs(x);
          }
          tv[j] = logit ? logit(s * scale, h, i, j) : s * scale;
          const double slope = logit ? fabs(logit(s * scale + 1, h, i, j) - tv[j]) : 1;
          dv[j] = u * a * scale * slope + (bias ? 0x1p-23 * fabs(tv[j]) : 0);
          tmax = fmax(tmax, tv[j]);
        }
        for (int j = 0; j < KL; j++) sum += exp(tv[j] - tmax);
        double dO[E];
        memset(dO, 0, sizeof dO);
        for (int j = 0; j < KL; j++) {
          const int64_t kr = ((int64_t)b * HKV + h / (H / HKV)) * KL + j;
          const double pij = exp(tv[j] - tmax) / sum;
          for (int e = 0; e < E; e++)
            dO[e] += pij * dv[j] * fabs(rt_array_get(&t->v.ref, kr * E + e) - rt_array_get(&t->out.ref, row * E + e));
        }
        for (int e = 0; e < E; e++) {
          const double o = rt_array_get(&t->out.ref, row * E + e);
          dd += dO[e] * dO[e], oo += o * o;
        }
      }
  return oo > 0 ? sqrt(dd / oo) : 0;
}

/* O and LSE within the dtype's tolerance plus what the logits' float32
 * rounding does to O (logit_rounding; 0 for most inputs), never NaN. */
static void check_forward(const char *label, Tensors *t, const TlDtype *d, Logit logit, bool bias) {
  ck_assert_msg(count_nan(&t->out.x) == 0 && count_nan(&t->lse.x) == 0, "%s: NaN in O or LSE", label);
  double eo = tl_pair_err(&t->out), el = tl_pair_err(&t->lse), lr = logit_rounding(t, logit, bias);
  fprintf(stderr, "    %s: out %.2g (allowed %.2g) lse %.2g\n", label, eo, d->tol + lr, el);
  ck_assert_msg(eo < d->tol + lr && el < d->tol,
                "%s: out error %g (tol %g, plus %g for the logits' float32 rounding), lse error %g", label,
                eo, d->tol, lr, el);
}

/* _i = path * 3 + dtype: every constant the dtype holds, forward and
 * backward. */
START_TEST(large_constant) {
  if (!picked(_i)) return;
  const int path = _i / 3, di = _i % 3;
  const TlDtype *d = &tl_dtypes[di];
  flex_kernel *k = identity_kernel();
  for (int c = 0; c < NCONST; c++) {
    const double v = constants[c];
    if (d->bits == 16 && d->code == kDLFloat && v > 65504) continue;
    Tensors t;
    tensors_init(&t, rt_dtype(d->code, d->bits));
    TlPair *in[] = {&t.q, &t.k, &t.v};
    for (int n = 0; n < 3; n++)
      for (int64_t i = 0; i < rt_array_count(&in[n]->x); i++) set_both(in[n], i, v);
    char label[96];
    snprintf(label, sizeof label, "%s %s, every element %g", path_names[path], d->name, v);
    forward_both(k, &t, path, di == 0, label);
    check_forward(label, &t, d, NULL, false);
    backward_both(k, &t, path, di == 0, label);
    /* fp16's dQ and dK may overflow (the header): dV must not */
    check_backward(label, &t, d, d->bits == 16 && d->code == kDLFloat ? DV_ONLY : FINITE);
    tensors_free(&t);
  }
  flex_kernel_free(k);
}
END_TEST

/* _i = path * 3 + dtype: magnitudes uniform in [1e3, 1.4e5] (fp16: up to
 * 6e4) with random signs. */
START_TEST(large_random) {
  if (!picked(_i)) return;
  const int path = _i / 3, di = _i % 3;
  const TlDtype *d = &tl_dtypes[di];
  const double hi = d->bits == 16 && d->code == kDLFloat ? 6e4 : 1.4e5;
  flex_kernel *k = identity_kernel();
  Tensors t;
  tensors_init(&t, rt_dtype(d->code, d->bits));
  TlPair *in[] = {&t.q, &t.k, &t.v};
  for (int n = 0; n < 3; n++)
    for (int64_t i = 0; i < rt_array_count(&in[n]->x); i++) {
      const double m = 1e3 + (hi - 1e3) * tl_uniform(&rng);
      set_both(in[n], i, tl_uniform(&rng) < 0.5 ? -m : m);
    }
  char label[96];
  snprintf(label, sizeof label, "%s %s, magnitudes 1e3..%g", path_names[path], d->name, hi);
  forward_both(k, &t, path, di == 0, label);
  check_forward(label, &t, d, NULL, false);
  tensors_free(&t);
  flex_kernel_free(k);
}
END_TEST

/* _i = path * 3 + dtype: rows whose max crosses 2^16 in the exp2 domain
 * between key tiles, up (ordinary keys first, then keys 3e4 times larger
 * along q) and down (hugely negative scores first, then ordinary ones): a
 * row changes between the FMA and the exact form of its reference. */
START_TEST(large_crossing) {
  if (!picked(_i)) return;
  const int path = _i / 3, di = _i % 3;
  const TlDtype *d = &tl_dtypes[di];
  flex_kernel *k = identity_kernel();
  for (int down = 0; down < 2; down++) {
    Tensors t;
    tensors_init(&t, rt_dtype(d->code, d->bits));
    for (int64_t i = 0; i < rt_array_count(&t.q.x); i++) set_both(&t.q, i, fabs(tl_normal(&rng)) + 0.1);
    for (int64_t i = 0; i < rt_array_count(&t.k.x); i++) {
      const bool late = i / E % KL >= KL / 2, huge = late != (down == 1);
      const double n = tl_normal(&rng);
      const double m = fmin(3e4 * (fabs(n) + 0.1), 6e4); /* finite in fp16 */
      set_both(&t.k, i, huge ? (down ? -m : m) : n);
    }
    char label[96];
    snprintf(label, sizeof label, "%s %s, rows crossing 2^16 %s", path_names[path], d->name,
             down ? "down" : "up");
    forward_both(k, &t, path, di == 0, label);
    check_forward(label, &t, d, NULL, false);
    tensors_free(&t);
  }
  flex_kernel_free(k);
}
END_TEST

/* ---- huge scores from a score function ------------------------------------ */

static const char *const huge_sources[] = {
    "score huge(s, b, h, q, kv) { return s * 1e28; }\n",
    "score third(s, b, h, q, kv) { return kv % 3 == 0 ? -1e30 : s; }\n",
    "score rows(s, b, h, q, kv) { return q % 2 == 0 ? -1e30 : s; }\n",
    /* biases folded into S's accumulators (flex_bias): steps of 1e6 (P one-hot, rows far past
     * 2^16 in the exp2 domain), and -1e5 on every even head (rows past 2^16, P spread) */
    "score steps(s, b, h, q, kv) { return s + 1e6 * float(kv - q); }\n",
    "score heads(s, b, h, q, kv) { return s + ((h % 2 == 0 ? -1e5 : 0.0) + 0.25 * float(q - kv)); }\n",
};
enum { NHUGE = sizeof huge_sources / sizeof *huge_sources };
/* Their logits in float64, for logit_rounding. */
static double huge_t(double s, int h, int q, int kv) { return (void)h, (void)q, (void)kv, s * 1e28; }
static double third_t(double s, int h, int q, int kv) { return (void)h, (void)q, kv % 3 == 0 ? -1e30 : s; }
static double rows_t(double s, int h, int q, int kv) { return (void)h, (void)kv, q % 2 == 0 ? -1e30 : s; }
static double steps_t(double s, int h, int q, int kv) { return (void)h, s + 1e6 * (kv - q); }
static double heads_t(double s, int h, int q, int kv) { return s + ((h % 2 == 0 ? -1e5 : 0.0) + 0.25 * (q - kv)); }
static const Logit huge_logits[NHUGE] = {huge_t, third_t, rows_t, steps_t, heads_t};

/* _i = path * 3 + dtype: each score, forward and backward. */
START_TEST(huge_scores) {
  if (!picked(_i)) return;
  const int path = _i / 3, di = _i % 3;
  const TlDtype *d = &tl_dtypes[di];
  for (int c = 0; c < NHUGE; c++) {
    flex_kernel *k = NULL;
    ck_assert_msg(flex_kernel_from_source(&k, "huge", huge_sources[c], strlen(huge_sources[c]), NULL) ==
                      FLEX_OK, "%s", flex_last_error());
    Tensors t;
    tensors_init(&t, rt_dtype(d->code, d->bits));
    char label[128];
    snprintf(label, sizeof label, "%s %s, %.40s", path_names[path], d->name, huge_sources[c] + 6);
    forward_both(k, &t, path, di == 0, label);
    if (path == P_SPLIT && c == 2) { /* the combine's known limit (the header) */
      ck_assert_msg(count_nan(&t.out.x) == 0 && count_nan(&t.lse.x) == 0, "%s: NaN in O or LSE", label);
      fprintf(stderr, "    %s: out %.2g lse %.2g (not judged)\n", label, tl_pair_err(&t.out),
              tl_pair_err(&t.lse));
    } else {
      check_forward(label, &t, d, huge_logits[c], c >= 3);
    }
    backward_both(k, &t, path, di == 0, label);
    const bool fp16 = d->bits == 16 && d->code == kDLFloat;
    check_backward(label, &t, d, c == 1 ? ACCURATE : c == 0 ? (fp16 ? DV : DV_ONLY) : FINITE);
    tensors_free(&t);
    flex_kernel_free(k);
  }
}
END_TEST

/* Registration. */
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) full |= !strcmp(argv[i], "--full");
  rng = tl_seed();
  rot = (int)(tl_rand(&rng) % 3);
  Suite *s = suite_create("emu_extreme");
  TCase *tc = tcase_create("extreme");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, large_constant, 0, NPATHS * 3);
  tcase_add_loop_test(tc, large_random, 0, NPATHS * 3);
  tcase_add_loop_test(tc, large_crossing, 0, NPATHS * 3);
  tcase_add_loop_test(tc, huge_scores, 0, NPATHS * 3);
  suite_add_tcase(s, tc);
  return tl_run_suite(s);
}
