/* A deterministic backward (flex_args.deterministic; docs/language.md "Determinism")
 * on the emulator, the CPU backend and the reference.
 *
 * Each backward runs twice with deterministic on, the emulator's CTAs in
 * two different seeded orders ($FLEXC_EMU_SHUFFLE) on two OS threads
 * ($FLEXC_THREADS=2, so the integer atomics of the exact accumulators
 * really race), the CPU backend on its thread pool: dq, dk, dv and the
 * buffer gradient must be bitwise equal, and every one of them within the
 * gradient tolerance of the float64 reference. Cases: an identity score
 * with GQA, a causal mask (tiles skipped) with a per-head slope whose
 * gradient every element of a head adds to, and a relative-position bias
 * table; fp32 and bf16. On the emulator also with two CTAs per (kv head,
 * batch) ($FLEXC_BWD_SPLITS=2: each CTA walks several key tiles), and in
 * its race-checking build; and a packed (cu_seqlens) call.
 *
 * The same pair of runs without deterministic is printed too ("atomic
 * path: bits differ" or "equal"): whether float atomics show a difference
 * depends on the interleaving, so it is reported, not asserted.
 *
 * Inputs are fresh each run (seed printed); outputs are poisoned with NaN
 * before every run; O and LSE come from the reference forward, rounded to
 * the dtype the kernels read.
 *
 * --cuda runs the emulator's cases (one and two CTAs per kv head, the
 * packed call, the forward) on the GPU instead, where the exact
 * accumulators race for real; it exits 77 where there is no CUDA device.
 * Every backward of a case runs before any assertion, so that a case
 * compiles the same kernels whatever its results (bench/run_gpu.sh's
 * kernel cache is filled by running these over a stand-in driver). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;
static flex_backend dev = FLEX_BACKEND_EMU; /* the kernels' backend (--cuda: the GPU) */

typedef struct Case {
  const char *name;
  const char *sample; /* samples/ file, or NULL for src */
  const char *src;
  const char *buffer; /* the `grad` buffer: f32[H], or f32[H, nb] */
  int nb;
  double spread;      /* its values: spread * standard normal */
} Case;

static const Case cases[] = {
    {"identity_gqa", NULL, "score ident(s, b, h, q, kv) { return s; }\n", NULL, 0, 0},
    /* A per-head slope (learnable ALiBi): a bias constant along a row
     * would have an analytically zero gradient (dS sums to 0 per row). */
    {"causal_head_slope", NULL,
     "buffer hb: f32[H] grad;\n"
     "score sloped(s, b, h, q, kv) { return s + hb[h] * float(kv - q); }\n"
     "mask causal(b, h, q, kv) { return q >= kv; }\n",
     "hb", 0, 0.05},
    {"relpos_bias", "relpos_bias", NULL, "rel_bias", 33, 0.5},
};
enum { NCASES = sizeof cases / sizeof *cases };

/* GQA; 160 keys: 5 fp32 key tiles of 32, 3 bf16 tiles of 64 (the last partial). */
enum { B = 1, H = 4, HKV = 2, QL = 96, KL = 160, E = 32 };

/* A call of case c in dtype dt on `be`, its O and LSE the reference forward's. */
static void call_init(TlCall *t, const Case *c, const TlDtype *dt, flex_backend be) {
  const TlCase tc = {.sample = c->sample, .name = c->name, .src = c->src, .s = {B, H, HKV, QL, KL, E, E},
                     .dt = dt, .backend = be, .native_out = true, .native_grads = true};
  tl_call_init(t, &tc, &rng);
  if (c->buffer) {
    int64_t bs[2] = {H, c->nb};
    TlArr *b = tl_call_buffer(t, c->buffer, rt_dtype(kDLFloat, 32), c->nb ? 2 : 1, bs, true);
    for (int64_t i = 0; i < rt_array_count(&b->a); i++) rt_array_set(&b->a, i, c->spread * tl_normal(&rng));
  }
}

/* The bytes of the four gradients of one run. */
typedef struct Bits {
  void *p[4];
  size_t n[4];
} Bits;

static TlArr *grad_of(TlCall *t, int i, int side) {
  TlArr *g[4] = {&t->dq[side], &t->dk[side], &t->dv[side], &t->gbuf[side][0]};
  return g[i];
}

/* One backward of side `side` (0: the tested backend, 1: the reference),
 * outputs poisoned first; its bits into *out. */
static void run_bwd(TlCall *t, int side, bool det, const char *shuffle, Bits *out) {
  int ng = t->nb ? 4 : 3;
  for (int i = 0; i < ng; i++) tl_arr_poison(grad_of(t, i, side));
  flex_args a = t->a[side];
  a.deterministic = det;
  setenv("FLEXC_EMU_SHUFFLE", shuffle, 1);
  flex_status st = tl_call(t->kern, &a, true);
  unsetenv("FLEXC_EMU_SHUFFLE");
  ck_assert_msg(st == FLEX_OK, "%s %s backward: %s", t->c.name, flex_backend_name(a.backend),
                flex_last_error());
  memset(out, 0, sizeof *out);
  for (int i = 0; i < ng; i++) {
    RtArray *g = &grad_of(t, i, side)->a;
    out->n[i] = (size_t)rt_array_count(g) * (g->dtype.bits / 8);
    out->p[i] = malloc(out->n[i]);
    memcpy(out->p[i], g->data, out->n[i]);
  }
}

static const char *const names[4] = {"dq", "dk", "dv", "dbuf"};

/* The first gradient whose bits differ between two runs, or -1. */
static int differs(const Bits *x, const Bits *y) {
  for (int i = 0; i < 4; i++)
    if (x->n[i] != y->n[i] || (x->n[i] && memcmp(x->p[i], y->p[i], x->n[i]))) return i;
  return -1;
}

static void bits_free(Bits *b) {
  for (int i = 0; i < 4; i++) free(b->p[i]);
}

/* Every gradient of the last run against the reference's, printed;
 * whether all are within the tolerance. */
static bool accurate(TlCall *t, const char *what) { return tl_call_compare(t, TL_BWD, what); }

/* Deterministic twice (bitwise equal, accurate), then the atomic path twice (reported). */
static void run_case(const Case *c, const TlDtype *dt, flex_backend be, const char *splits) {
  if (!flex_backend_available(be)) {
    fprintf(stderr, "  %s: not available (%s), skipped\n", flex_backend_name(be), flex_last_error());
    return;
  }
  if (splits) setenv("FLEXC_BWD_SPLITS", splits, 1);
  TlCall t;
  call_init(&t, c, dt, be);
  tl_call_ref_outputs(&t);
  Bits ref;
  run_bwd(&t, 1, false, "0", &ref);
  char what[64];
  snprintf(what, sizeof what, "%s %s%s%s", c->name, flex_backend_name(be), splits ? " splits=" : "",
           splits ? splits : "");
  Bits d1, d2, a1, a2;
  run_bwd(&t, 0, true, "11", &d1);
  bool ok1 = accurate(&t, what);
  run_bwd(&t, 0, true, "977", &d2);
  bool ok2 = accurate(&t, what);
  run_bwd(&t, 0, false, "11", &a1);
  bool ok3 = accurate(&t, what);
  run_bwd(&t, 0, false, "977", &a2);
  ck_assert_msg(ok1 && ok2, "%s %s deterministic: a gradient off the reference (above)", what, dt->name);
  int d = differs(&d1, &d2);
  ck_assert_msg(d < 0, "%s %s deterministic: %s differs between two runs", what, dt->name,
                d >= 0 ? names[d] : "");
  ck_assert_msg(ok3, "%s %s atomic path: a gradient off the reference (above)", what, dt->name);
  int a = differs(&a1, &a2);
  fprintf(stderr, "  %-28s %s deterministic: equal; atomic path: %s%s\n", what, dt->name,
          a >= 0 ? "bits differ in " : "equal", a >= 0 ? names[a] : "");
  bits_free(&ref), bits_free(&d1), bits_free(&d2), bits_free(&a1), bits_free(&a2);
  tl_call_free(&t);
  if (splits) unsetenv("FLEXC_BWD_SPLITS");
}

/* _i = case * 2 + (0: fp32, 1: bf16). */
static const TlDtype *dtype_of(int i) { return &tl_dtypes[i % 2 ? 2 : 0]; }

START_TEST(emu) { run_case(&cases[_i / 2], dtype_of(_i), dev, NULL); }
END_TEST

START_TEST(emu_two_splits) { run_case(&cases[_i / 2], dtype_of(_i), dev, "2"); }
END_TEST

START_TEST(cpu) { run_case(&cases[_i / 2], dtype_of(_i), FLEX_BACKEND_CPU, NULL); }
END_TEST

/* The reference is one float64 loop: the same bits every run, deterministic or not. */
START_TEST(reference) {
  TlCall t;
  call_init(&t, &cases[_i], &tl_dtypes[0], FLEX_BACKEND_REFERENCE);
  tl_call_ref_outputs(&t);
  Bits r1, r2, r3;
  run_bwd(&t, 1, true, "0", &r1);
  run_bwd(&t, 1, true, "0", &r2);
  run_bwd(&t, 1, false, "0", &r3);
  int d = differs(&r1, &r2), d3 = differs(&r1, &r3);
  ck_assert_msg(d < 0 && d3 < 0, "%s reference: %s differs", cases[_i].name, names[d >= 0 ? d : d3]);
  bits_free(&r1), bits_free(&r2), bits_free(&r3);
  tl_call_free(&t);
}
END_TEST

/* The emulator's race-checking build (shared memory) runs the
 * deterministic kernels, two key tiles per CTA: _i = 0 fp32, 1 bf16. */
START_TEST(emu_racecheck) {
  setenv("FLEXC_EMU_RACECHECK", "1", 1);
  run_case(&cases[2], dtype_of(_i), FLEX_BACKEND_EMU, "2");
  unsetenv("FLEXC_EMU_RACECHECK");
}
END_TEST

/* A packed call (cu_seqlens): each sequence's exact buffer gradient is
 * rounded together with what the earlier sequences left in the fp32
 * gradient. Two CTA orders, bitwise equal; against the reference's packed
 * call. fp32, the relative-position table. */
START_TEST(packed) {
  static const int lq[2] = {40, 56}, lk[2] = {70, 90}; /* two sequences of different lengths */
  const Case *c = &cases[2];
  const TlCase tc = {.sample = c->sample, .s = {2, H, HKV, 0, 0, E, E}, .backend = dev,
                     .lens_q = lq, .lens_kv = lk, .native_out = true, .native_grads = true,
                     .deterministic = true};
  TlCall t;
  tl_call_init(&t, &tc, &rng);
  int64_t bs[2] = {H, c->nb};
  TlArr *b = tl_call_buffer(&t, c->buffer, rt_dtype(kDLFloat, 32), 2, bs, true);
  for (int64_t i = 0; i < rt_array_count(&b->a); i++) rt_array_set(&b->a, i, c->spread * tl_normal(&rng));
  tl_call_ref_outputs(&t);
  Bits ref, first, again; /* two CTA orders */
  run_bwd(&t, 1, false, "0", &ref);
  run_bwd(&t, 0, true, "11", &first);
  tl_call_check(&t, TL_BWD, "packed");
  run_bwd(&t, 0, true, "977", &again);
  tl_call_check(&t, TL_BWD, "packed");
  int d = differs(&first, &again);
  ck_assert_msg(d < 0, "packed: %s differs", d >= 0 ? names[d] : "");
  bits_free(&ref), bits_free(&first), bits_free(&again);
  tl_call_free(&t);
}
END_TEST

/* A forward ignores the flag: the same bits with and without it. */
START_TEST(forward_ignores) {
  TlCall t;
  call_init(&t, &cases[1], &tl_dtypes[0], dev);
  flex_args a = t.a[0];
  size_t n = (size_t)rt_array_count(&t.out[0].a) * 4;
  void *plain = malloc(n);
  ck_assert_msg(tl_call(t.kern, &a, false) == FLEX_OK, "%s", flex_last_error());
  memcpy(plain, t.out[0].a.data, n);
  tl_arr_poison(&t.out[0]);
  a.deterministic = true;
  ck_assert_msg(tl_call(t.kern, &a, false) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(!memcmp(plain, t.out[0].a.data, n), "deterministic changed a forward's output");
  free(plain);
  tl_call_free(&t);
}
END_TEST

int main(int argc, char **argv) {
  rng = tl_seed();
  int rc = tl_cuda_mode(argc, argv);
  if (rc >= 0) {
    dev = FLEX_BACKEND_CUDA;
    return rc ? rc : TL_MAIN("cuda_determ", 0, TL_CASE("cuda", 0), TL_LOOP(emu, NCASES * 2),
                             TL_LOOP(emu_two_splits, NCASES * 2), TL_TEST(packed), TL_TEST(forward_ignores));
  }
  setenv("FLEXC_THREADS", "2", 1); /* atomics race between OS threads */
  tl_one_process(); /* the emulator's modules serve several tests */
  return TL_MAIN("determ", 300, TL_LOOP(emu, NCASES * 2), TL_LOOP(emu_two_splits, NCASES * 2),
                 TL_LOOP(cpu, NCASES * 2), TL_LOOP(reference, NCASES), TL_LOOP(emu_racecheck, 2),
                 TL_TEST(packed), TL_TEST(forward_ignores));
}
