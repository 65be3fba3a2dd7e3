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
  const char *path;   /* samples/ file, or NULL for src */
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
    {"relpos_bias", "samples/relpos_bias.score", NULL, "rel_bias", 33, 0.5},
};
enum { NCASES = sizeof cases / sizeof *cases };

/* GQA; 160 keys: 5 fp32 key tiles of 32, 3 bf16 tiles of 64 (the last partial). */
enum { B = 1, H = 4, HKV = 2, QL = 96, KL = 160, E = 32 };

typedef struct Tensors {
  TlPair q, k, v, dout, out, lse, dq, dk, dv, grad;
  RtArray buf;
  DLTensor tbuf;
  flex_buffer fb[2]; /* backend under test, reference */
} Tensors;

static flex_kernel *load(const Case *c) { return tl_load(c->path, c->name, c->src); }

static void tensors_init(Tensors *t, const Case *c, DLDataType dt) {
  int64_t qs[4] = {B, H, QL, E}, ks[4] = {B, HKV, KL, E}, ls[3] = {B, H, QL}, bs[2] = {H, c->nb};
  DLDataType f32 = rt_dtype(kDLFloat, 32);
  memset(t, 0, sizeof *t);
  tl_pair_init(&t->q, dt, 4, qs, true, &rng), tl_pair_init(&t->k, dt, 4, ks, true, &rng);
  tl_pair_init(&t->v, dt, 4, ks, true, &rng), tl_pair_init(&t->dout, dt, 4, qs, true, &rng);
  tl_pair_init(&t->out, dt, 4, qs, false, &rng), tl_pair_init(&t->lse, f32, 3, ls, false, &rng);
  tl_pair_init(&t->dq, dt, 4, qs, false, &rng), tl_pair_init(&t->dk, dt, 4, ks, false, &rng);
  tl_pair_init(&t->dv, dt, 4, ks, false, &rng);
  if (!c->buffer) return;
  rt_array_init(&t->buf, f32, c->nb ? 2 : 1, bs);
  for (int64_t i = 0; i < rt_array_count(&t->buf); i++) rt_array_set(&t->buf, i, c->spread * tl_normal(&rng));
  t->tbuf = rt_array_tensor(&t->buf);
  tl_pair_init(&t->grad, f32, c->nb ? 2 : 1, bs, false, &rng);
  t->fb[0] = (flex_buffer){c->buffer, &t->tbuf, &t->grad.tx};
  t->fb[1] = (flex_buffer){c->buffer, &t->tbuf, &t->grad.tref};
}

static void tensors_free(Tensors *t, const Case *c) {
  TlPair *all[] = {&t->q, &t->k, &t->v, &t->dout, &t->out, &t->lse, &t->dq, &t->dk, &t->dv};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tl_pair_free(all[i]);
  if (c->buffer) rt_array_free(&t->buf), tl_pair_free(&t->grad);
}

static flex_args args_for(Tensors *t, const Case *c, flex_backend be) {
  bool ref = be == FLEX_BACKEND_REFERENCE;
  flex_args a;
  memset(&a, 0, sizeof a);
#define T(P) (ref ? &t->P.tref : &t->P.tx)
  a.backend = be;
  a.q = T(q), a.k = T(k), a.v = T(v), a.out = T(out), a.lse = T(lse), a.dout = T(dout);
  a.dq = T(dq), a.dk = T(dk), a.dv = T(dv);
#undef T
  if (c->buffer) a.buffers = &t->fb[ref ? 1 : 0], a.nbuffers = 1;
  return a;
}

/* The reference forward's O and LSE, rounded to what the kernels read, in both twins. */
static void forward(flex_kernel *k, Tensors *t, const Case *c) {
  flex_args r = args_for(t, c, FLEX_BACKEND_REFERENCE);
  ck_assert_msg(flex_forward(k, &r) == FLEX_OK, "reference forward: %s", flex_last_error());
  TlPair *ol[] = {&t->out, &t->lse};
  for (int j = 0; j < 2; j++)
    for (int64_t i = 0; i < rt_array_count(&ol[j]->x); i++) {
      rt_array_set(&ol[j]->x, i, rt_array_get(&ol[j]->ref, i));
      rt_array_set(&ol[j]->ref, i, rt_array_get(&ol[j]->x, i));
    }
}

/* The bytes of the four gradients of one run. */
typedef struct Bits {
  void *p[4];
  size_t n[4];
} Bits;

static RtArray *grad_of(Tensors *t, int i, bool ref) {
  TlPair *g[4] = {&t->dq, &t->dk, &t->dv, &t->grad};
  return ref ? &g[i]->ref : &g[i]->x;
}

static void poison(RtArray *a) {
  for (int64_t i = 0; i < rt_array_count(a); i++) rt_array_set(a, i, NAN);
}

/* One backward on `be`, outputs poisoned first; its bits into *out. */
static void run_bwd(flex_kernel *k, Tensors *t, const Case *c, flex_backend be, bool det,
                    const char *shuffle, Bits *out) {
  bool ref = be == FLEX_BACKEND_REFERENCE;
  int ng = c->buffer ? 4 : 3;
  for (int i = 0; i < ng; i++) poison(grad_of(t, i, ref));
  flex_args a = args_for(t, c, be);
  a.deterministic = det;
  setenv("FLEXC_EMU_SHUFFLE", shuffle, 1);
  flex_status st = tl_call(k, &a, true);
  unsetenv("FLEXC_EMU_SHUFFLE");
  ck_assert_msg(st == FLEX_OK, "%s %s backward: %s", c->name, flex_backend_name(be),
                flex_last_error());
  memset(out, 0, sizeof *out);
  for (int i = 0; i < ng; i++) {
    RtArray *g = grad_of(t, i, ref);
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

/* The errors of every gradient of the last run against the reference's. */
static void accuracy(Tensors *t, const Case *c, double err[4]) {
  TlPair *g[4] = {&t->dq, &t->dk, &t->dv, &t->grad};
  for (int i = 0; i < 4; i++) err[i] = i < (c->buffer ? 4 : 3) ? tl_pair_err(g[i]) : 0;
}

/* Each of them within the gradient tolerance. */
static void check_accuracy(const double err[4], const Case *c, const TlDtype *dt, const char *what) {
  for (int i = 0; i < 4; i++)
    ck_assert_msg(err[i] < dt->gtol, "%s %s %s: %s error %g (tol %g)", c->name, dt->name, what,
                  names[i], err[i], dt->gtol);
}

/* Deterministic twice (bitwise equal, accurate), then the atomic path twice (reported). */
static void run_case(const Case *c, const TlDtype *dt, flex_backend be, const char *splits) {
  if (!flex_backend_available(be)) {
    fprintf(stderr, "  %s: not available (%s), skipped\n", flex_backend_name(be), flex_last_error());
    return;
  }
  if (splits) setenv("FLEXC_BWD_SPLITS", splits, 1);
  flex_kernel *k = load(c);
  Tensors t;
  tensors_init(&t, c, rt_dtype(dt->code, dt->bits));
  forward(k, &t, c);
  Bits ref;
  run_bwd(k, &t, c, FLEX_BACKEND_REFERENCE, false, "0", &ref);
  char what[64];
  snprintf(what, sizeof what, "%s%s%s", flex_backend_name(be), splits ? " splits=" : "",
           splits ? splits : "");
  Bits d1, d2, a1, a2;
  double e1[4], e2[4], e3[4];
  run_bwd(k, &t, c, be, true, "11", &d1);
  accuracy(&t, c, e1);
  run_bwd(k, &t, c, be, true, "977", &d2);
  accuracy(&t, c, e2);
  run_bwd(k, &t, c, be, false, "11", &a1);
  accuracy(&t, c, e3);
  run_bwd(k, &t, c, be, false, "977", &a2);
  check_accuracy(e1, c, dt, what);
  check_accuracy(e2, c, dt, what);
  int d = differs(&d1, &d2);
  ck_assert_msg(d < 0, "%s %s %s deterministic: %s differs between two runs", c->name, dt->name,
                what, d >= 0 ? names[d] : "");
  check_accuracy(e3, c, dt, what);
  int a = differs(&a1, &a2);
  fprintf(stderr, "  %-16s %s %-12s deterministic: equal; atomic path: %s%s\n", c->name,
          dt->name, what, a >= 0 ? "bits differ in " : "equal", a >= 0 ? names[a] : "");
  bits_free(&ref), bits_free(&d1), bits_free(&d2), bits_free(&a1), bits_free(&a2);
  tensors_free(&t, c);
  flex_kernel_free(k);
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
  const Case *c = &cases[_i];
  flex_kernel *k = load(c);
  Tensors t;
  tensors_init(&t, c, rt_dtype(kDLFloat, 32));
  forward(k, &t, c);
  Bits r1, r2, r3;
  run_bwd(k, &t, c, FLEX_BACKEND_REFERENCE, true, "0", &r1);
  run_bwd(k, &t, c, FLEX_BACKEND_REFERENCE, true, "0", &r2);
  run_bwd(k, &t, c, FLEX_BACKEND_REFERENCE, false, "0", &r3);
  int d = differs(&r1, &r2), d3 = differs(&r1, &r3);
  ck_assert_msg(d < 0 && d3 < 0, "%s reference: %s differs", c->name, names[d >= 0 ? d : d3]);
  bits_free(&r1), bits_free(&r2), bits_free(&r3);
  tensors_free(&t, c);
  flex_kernel_free(k);
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
  const Case *c = &cases[2];
  const DLDataType f32 = rt_dtype(kDLFloat, 32), i32 = rt_dtype(kDLInt, 32);
  enum { TQ = 96, TK = 160 };
  int64_t qs[3] = {TQ, H, E}, ks[3] = {TK, HKV, E}, ls[2] = {H, TQ}, bs[2] = {H, c->nb}, cs[1] = {3};
  TlPair q, k, v, dout, out, lse, dq, dk, dv, grad;
  tl_pair_init(&q, f32, 3, qs, true, &rng), tl_pair_init(&k, f32, 3, ks, true, &rng);
  tl_pair_init(&v, f32, 3, ks, true, &rng), tl_pair_init(&dout, f32, 3, qs, true, &rng);
  tl_pair_init(&out, f32, 3, qs, false, &rng), tl_pair_init(&lse, f32, 2, ls, false, &rng);
  tl_pair_init(&dq, f32, 3, qs, false, &rng), tl_pair_init(&dk, f32, 3, ks, false, &rng);
  tl_pair_init(&dv, f32, 3, ks, false, &rng), tl_pair_init(&grad, f32, 2, bs, false, &rng);
  RtArray buf, cq, ck;
  rt_array_init(&buf, f32, 2, bs);
  for (int64_t i = 0; i < rt_array_count(&buf); i++) rt_array_set(&buf, i, c->spread * tl_normal(&rng));
  rt_array_init(&cq, i32, 1, cs), rt_array_init(&ck, i32, 1, cs);
  const int oq[3] = {0, 40, TQ}, ok[3] = {0, 70, TK}; /* two sequences of different lengths */
  for (int i = 0; i < 3; i++) rt_array_set(&cq, i, oq[i]), rt_array_set(&ck, i, ok[i]);
  DLTensor tb = rt_array_tensor(&buf), tcq = rt_array_tensor(&cq), tck = rt_array_tensor(&ck);
  flex_kernel *kern = load(c);
  flex_args a[2]; /* 0: emu (or cuda), 1: reference */
  flex_buffer fb[2];
  for (int r = 0; r < 2; r++) {
#define T(P) (r ? &P.tref : &P.tx)
    memset(&a[r], 0, sizeof a[r]);
    a[r].backend = r ? FLEX_BACKEND_REFERENCE : dev;
    a[r].q = T(q), a[r].k = T(k), a[r].v = T(v), a[r].out = T(out), a[r].lse = T(lse);
    a[r].dout = T(dout), a[r].dq = T(dq), a[r].dk = T(dk), a[r].dv = T(dv);
    fb[r] = (flex_buffer){c->buffer, &tb, T(grad)};
#undef T
    a[r].buffers = &fb[r], a[r].nbuffers = 1;
    a[r].cu_seqlens_q = &tcq, a[r].cu_seqlens_kv = &tck;
    a[r].deterministic = true;
  }
  ck_assert_msg(flex_forward(kern, &a[1]) == FLEX_OK, "reference forward: %s", flex_last_error());
  TlPair *ol[] = {&out, &lse};
  for (int j = 0; j < 2; j++)
    for (int64_t i = 0; i < rt_array_count(&ol[j]->x); i++) {
      rt_array_set(&ol[j]->x, i, rt_array_get(&ol[j]->ref, i));
      rt_array_set(&ol[j]->ref, i, rt_array_get(&ol[j]->x, i));
    }
  ck_assert_msg(flex_backward(kern, &a[1]) == FLEX_OK, "reference backward: %s", flex_last_error());
  TlPair *g[4] = {&dq, &dk, &dv, &grad};
  void *first[4];
  for (int run = 0; run < 2; run++) {
    for (int i = 0; i < 4; i++) poison(&g[i]->x);
    setenv("FLEXC_EMU_SHUFFLE", run ? "977" : "11", 1);
    flex_status st = tl_call(kern, &a[0], true);
    unsetenv("FLEXC_EMU_SHUFFLE");
    ck_assert_msg(st == FLEX_OK, "packed %s backward: %s", flex_backend_name(dev), flex_last_error());
    for (int i = 0; i < 4; i++) {
      size_t n = (size_t)rt_array_count(&g[i]->x) * 4;
      double e = tl_pair_err(g[i]);
      ck_assert_msg(e < 1e-3, "packed: %s error %g (tol 1e-3)", names[i], e);
      if (!run) first[i] = malloc(n), memcpy(first[i], g[i]->x.data, n);
      else ck_assert_msg(!memcmp(first[i], g[i]->x.data, n), "packed: %s differs", names[i]);
    }
  }
  for (int i = 0; i < 4; i++) free(first[i]), tl_pair_free(g[i]);
  TlPair *rest[] = {&q, &k, &v, &dout, &out, &lse};
  for (int i = 0; i < 6; i++) tl_pair_free(rest[i]);
  rt_array_free(&buf), rt_array_free(&cq), rt_array_free(&ck);
  flex_kernel_free(kern);
}
END_TEST

/* A forward ignores the flag: the same bits with and without it. */
START_TEST(forward_ignores) {
  const Case *c = &cases[1];
  flex_kernel *k = load(c);
  Tensors t;
  tensors_init(&t, c, rt_dtype(kDLFloat, 32));
  flex_args a = args_for(&t, c, dev);
  size_t n = (size_t)rt_array_count(&t.out.x) * 4;
  void *plain = malloc(n);
  ck_assert_msg(tl_call(k, &a, false) == FLEX_OK, "%s", flex_last_error());
  memcpy(plain, t.out.x.data, n);
  poison(&t.out.x);
  a.deterministic = true;
  ck_assert_msg(tl_call(k, &a, false) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(!memcmp(plain, t.out.x.data, n), "deterministic changed a forward's output");
  free(plain);
  tensors_free(&t, c);
  flex_kernel_free(k);
}
END_TEST

int main(int argc, char **argv) {
  rng = tl_seed();
  if (argc > 1 && !strcmp(argv[1], "--cuda")) {
    int rc = tl_cuda_setup();
    if (rc) return rc;
    dev = FLEX_BACKEND_CUDA;
    Suite *s = suite_create("cuda_determ");
    TCase *tc = tcase_create("cuda");
    tcase_add_loop_test(tc, emu, 0, NCASES * 2);
    tcase_add_loop_test(tc, emu_two_splits, 0, NCASES * 2);
    tcase_add_test(tc, packed);
    tcase_add_test(tc, forward_ignores);
    suite_add_tcase(s, tc);
    return tl_run_suite(s);
  }
  setenv("FLEXC_THREADS", "2", 1); /* atomics race between OS threads */
  Suite *s = suite_create("determ");
  TCase *tc = tcase_create("determ");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, emu, 0, NCASES * 2);
  tcase_add_loop_test(tc, emu_two_splits, 0, NCASES * 2);
  tcase_add_loop_test(tc, cpu, 0, NCASES * 2);
  tcase_add_loop_test(tc, reference, 0, NCASES);
  tcase_add_loop_test(tc, emu_racecheck, 0, 2);
  tcase_add_test(tc, packed);
  tcase_add_test(tc, forward_ignores);
  suite_add_tcase(s, tc);
  return tl_run_suite(s);
}
