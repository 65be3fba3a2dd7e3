/* The public C API under hostile input: what an embedding program can pass
 * wrongly (layouts, lengths, names, NULLs) must fail with FLEX_ERR_INVALID
 * and a message naming the fault, leave the outputs untouched and never
 * crash; what is legal but unusual (broadcast inputs, text without a NUL,
 * many threads) must give the single-threaded, float64-checked answer.
 * Fresh random inputs every run; outputs are poisoned before each call. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt.h"
#include "testlib.h"

static const DLDataType F32 = {kDLFloat, 32, 1}, F64 = {kDLFloat, 64, 1};

static const char *SRC =
    "param float softcap = 20.0;\n"
    "param int window = 1000;\n"
    "buffer slopes: f32[H] grad;\n"
    "score s1(s, b, h, q, kv) { return softcap * tanh((s + slopes[h] * float(kv - q)) / softcap); }\n"
    "mask m(b, h, q, kv) { return q >= kv && q - kv < window; }\n"
    "kernel g { score = s1; mask = m; }\n";

/* One call's tensors: q/k/v/dout random, outputs poisoned. */
typedef struct Call {
  TlArr q, k, v, out, lse, dout, dq, dk, dv, slopes, dslopes;
  flex_buffer buf;
  flex_args a;
} Call;

static void call_init(Call *c, DLDataType dt, flex_backend be, uint64_t *rng) {
  const int64_t sq[] = {2, 4, 9, 8}, skv[] = {2, 2, 11, 8}, sl[] = {2, 4, 9}, sh[] = {4};
  memset(c, 0, sizeof *c);
  TlArr *in[] = {&c->q, &c->k, &c->v, &c->dout};
  const int64_t *ins[] = {sq, skv, skv, sq};
  for (int i = 0; i < 4; i++) tl_arr_init(in[i], dt, 4, ins[i]), tl_arr_normal(in[i], rng);
  TlArr *outs[] = {&c->out, &c->dq, &c->dk, &c->dv};
  const int64_t *outsh[] = {sq, sq, skv, skv};
  for (int i = 0; i < 4; i++) tl_arr_init(outs[i], dt, 4, outsh[i]), tl_arr_poison(outs[i]);
  tl_arr_init(&c->lse, F32, 3, sl), tl_arr_poison(&c->lse);
  tl_arr_init(&c->slopes, F32, 1, sh), tl_arr_uniform(&c->slopes, -0.5, 0.5, rng);
  tl_arr_init(&c->dslopes, F32, 1, sh), tl_arr_poison(&c->dslopes);
  c->buf = (flex_buffer){"slopes", &c->slopes.t, &c->dslopes.t};
  c->a = (flex_args){.backend = be, .q = &c->q.t, .k = &c->k.t, .v = &c->v.t, .out = &c->out.t,
                     .lse = &c->lse.t, .dout = &c->dout.t, .dq = &c->dq.t, .dk = &c->dk.t,
                     .dv = &c->dv.t, .buffers = &c->buf, .nbuffers = 1};
}

static void call_free(Call *c) {
  TlArr *all[] = {&c->q, &c->k, &c->v, &c->out, &c->lse, &c->dout,
                  &c->dq, &c->dk, &c->dv, &c->slopes, &c->dslopes};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tl_arr_free(all[i]);
}

/* True when every element of x is still NaN (nothing was written). */
static bool untouched(const TlArr *x) {
  for (int64_t i = 0; i < rt_array_count(&x->a); i++)
    if (!isnan(rt_array_get(&x->a, i))) return false;
  return true;
}

static flex_kernel *load(void) {
  flex_kernel *k = NULL;
  flex_status st = flex_kernel_from_source(&k, "audit.score", SRC, strlen(SRC), NULL);
  ck_assert_msg(st == FLEX_OK, "%s", flex_last_error());
  return k;
}

/* The call must fail as invalid with `want` in the message, writing nothing. */
static void expect_invalid(flex_kernel *k, Call *c, bool backward, const char *want) {
  flex_status st = backward ? flex_backward(k, &c->a) : flex_forward(k, &c->a);
  ck_assert_msg(st == FLEX_ERR_INVALID, "expected INVALID with '%s', got %d: %s", want, (int)st,
                flex_last_error());
  ck_assert_msg(strstr(flex_last_error(), want), "message '%s' lacks '%s'", flex_last_error(), want);
  ck_assert(untouched(&c->out) && untouched(&c->lse) && untouched(&c->dq) && untouched(&c->dslopes));
}

/* Bad layouts, on every host backend (validation runs before any compile). */
START_TEST(bad_layouts) {
  uint64_t rng = tl_seed();
  flex_kernel *k = load();
  flex_backend bes[] = {FLEX_BACKEND_REFERENCE, FLEX_BACKEND_EMU};
  for (int b = 0; b < 2; b++) {
    Call c;
    int64_t st[4];
    call_init(&c, F32, bes[b], &rng);
    /* A negative stride: rejected (the kernels walk forward from the base). */
    int64_t nq[4] = {4 * 9 * 8, 9 * 8, -8, 1};
    c.q.t.strides = nq;
    c.q.t.data = (float *)c.q.a.data + 8 * 8;
    expect_invalid(k, &c, false, "q: dimension 2 has stride -8");
    c.q.t = rt_array_tensor(&c.q.a);
    /* Outputs whose elements overlap. */
    int64_t z[4] = {0, 0, 8, 1};
    c.out.t.strides = z;
    expect_invalid(k, &c, false, "out: dimension 0 has stride 0");
    c.out.t.strides = NULL;
    int64_t zl[3] = {4 * 9, 0, 1};
    c.lse.t.strides = zl;
    expect_invalid(k, &c, false, "lse: dimension 1 has stride 0");
    c.lse.t.strides = NULL;
    c.dk.t.strides = z;
    expect_invalid(k, &c, true, "dk: dimension 0 has stride 0");
    c.dk.t.strides = NULL;
    int64_t zb[1] = {0};
    c.dslopes.t.strides = zb;
    expect_invalid(k, &c, true, "gradient of buffer 'slopes': the last dimension must have unit stride");
    c.dslopes.t.strides = NULL;
    /* Strides whose span overflows 64 bits (each extent is fine). */
    st[0] = INT64_MAX / 2, st[1] = 9 * 8, st[2] = 8, st[3] = 1;
    c.k.t.strides = st;
    expect_invalid(k, &c, false, "k: shape and strides span more than 2^63");
    c.k.t.strides = NULL;
    /* Misaligned data and byte_offset. */
    c.v.t.byte_offset = 2;
    expect_invalid(k, &c, false, "v: data + byte_offset");
    ck_assert(strstr(flex_last_error(), "4-byte element size"));
    c.v.t.byte_offset = 0;
    c.v.t.data = (char *)c.v.a.data + 1;
    expect_invalid(k, &c, false, "not aligned");
    c.v.t.data = c.v.a.data;
    call_free(&c);
  }
  flex_kernel_free(k);
}
END_TEST

/* Huge extents whose element count overflows int64, and a zero-size
 * tensor's NULL data (legal). */
START_TEST(huge_and_empty) {
  uint64_t rng = tl_seed();
  flex_kernel *k = load();
  Call c;
  call_init(&c, F32, FLEX_BACKEND_REFERENCE, &rng);
  int64_t big[4] = {2000000000, 2000000000, 2000000000, 8};
  c.dout.t.shape = big;
  expect_invalid(k, &c, true, "dout: expected shape [2, 4, 9, 8], got [2000000000");
  c.dout.t = rt_array_tensor(&c.dout.a);
  int64_t qb[4] = {2000000000, 4, 2000000000, 8}, kb[4] = {2000000000, 2, 2000000000, 8},
          lb[3] = {2000000000, 4, 2000000000};
  c.q.t.shape = c.out.t.shape = qb, c.k.t.shape = c.v.t.shape = kb, c.lse.t.shape = lb;
  expect_invalid(k, &c, false, "span more than 2^63");
  call_free(&c);
  /* B = 0: NULL data is fine and nothing is written. */
  call_init(&c, F32, FLEX_BACKEND_REFERENCE, &rng);
  int64_t e4[4] = {0, 4, 9, 8}, e4k[4] = {0, 2, 11, 8}, e3[3] = {0, 4, 9};
  c.q.t.shape = c.out.t.shape = e4, c.k.t.shape = c.v.t.shape = e4k, c.lse.t.shape = e3;
  c.q.t.data = c.out.t.data = NULL;
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  call_free(&c);
  /* Lengths whose score matrix cannot fit: refused with the figures, forward
   * and backward (the backward once dereferenced its unbuilt state). */
  enum { LONG = 1 << 20 };
  int64_t ls[4] = {1, 1, LONG, 1}, ll[3] = {1, 1, LONG};
  TlArr lt[9];
  for (int i = 0; i < 9; i++) tl_arr_init(&lt[i], F32, i == 4 ? 3 : 4, i == 4 ? ll : ls), tl_arr_normal(&lt[i], &rng);
  flex_args la = {.backend = FLEX_BACKEND_REFERENCE, .q = &lt[0].t, .k = &lt[1].t, .v = &lt[2].t,
                  .out = &lt[3].t, .lse = &lt[4].t, .dout = &lt[5].t, .dq = &lt[6].t, .dk = &lt[7].t,
                  .dv = &lt[8].t};
  flex_kernel *plain;
  const char *ps = "score f(s, b, h, q, kv) { return s; }";
  ck_assert_int_eq(flex_kernel_from_source(&plain, "p.score", ps, strlen(ps), NULL), FLEX_OK);
  ck_assert_int_eq(flex_forward(plain, &la), FLEX_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(flex_last_error(), "materialises"), "%s", flex_last_error());
  ck_assert_int_eq(flex_backward(plain, &la), FLEX_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(flex_last_error(), "materialises"), "%s", flex_last_error());
  for (int i = 0; i < 9; i++) tl_arr_free(&lt[i]);
  flex_kernel_free(plain);
  flex_kernel_free(k);
}
END_TEST

/* Names, params, buffers, NULLs, loading. */
START_TEST(bad_names_and_loading) {
  uint64_t rng = tl_seed();
  flex_kernel *k = load();
  Call c;
  call_init(&c, F32, FLEX_BACKEND_REFERENCE, &rng);
  flex_param p[] = {{"window", 3.5}};
  c.a.params = p, c.a.nparams = 1;
  expect_invalid(k, &c, false, "window");
  p[0].name = "nope";
  expect_invalid(k, &c, false, "nope");
  c.a.nparams = 0;
  flex_buffer two[] = {c.buf, {"extra", &c.slopes.t, NULL}};
  c.a.buffers = two, c.a.nbuffers = 2;
  expect_invalid(k, &c, false, "extra");
  c.a.buffers = &c.buf, c.a.nbuffers = 1;
  c.a.backend = (flex_backend)7;
  expect_invalid(k, &c, false, "unknown backend 7");
  c.a.backend = FLEX_BACKEND_REFERENCE;
  c.a.scale = NAN;
  expect_invalid(k, &c, false, "scale");
  c.a.scale = 0;
  c.a.dq = NULL;
  expect_invalid(k, &c, true, "dq: the tensor is missing");
  ck_assert_int_eq(flex_forward(NULL, &c.a), FLEX_ERR_INVALID);
  ck_assert_int_eq(flex_backward(k, NULL), FLEX_ERR_INVALID);
  call_free(&c);
  flex_kernel_free(k);
  flex_kernel_free(NULL);

  flex_kernel *k2 = (flex_kernel *)&rng;
  ck_assert_int_eq(flex_kernel_from_source(&k2, "x", "kernel k {}", (size_t)-1, NULL),
                   FLEX_ERR_INVALID);
  ck_assert(k2 == NULL && strstr(flex_last_error(), "too large"));
  ck_assert_int_eq(flex_kernel_load(&k2, "/nonexistent/dir/x.score", NULL), FLEX_ERR_INVALID);
  ck_assert(strstr(flex_last_error(), "/nonexistent/dir/x.score: error: cannot read file"));
  ck_assert_int_eq(flex_kernel_load(&k2, "/", NULL), FLEX_ERR_INVALID);
  const char *bad = "kernel k {\n  score = ;\n}\n";
  ck_assert_int_eq(flex_kernel_from_source(&k2, "bad.score", bad, strlen(bad), NULL),
                   FLEX_ERR_INVALID);
  ck_assert_msg(strstr(flex_last_error(), "bad.score:2:11: error:"), "%s", flex_last_error());
  /* Text without a terminating NUL, error at its very end. */
  const char *cut = "kernel k { score = s";
  size_t n = strlen(cut);
  char *heap = malloc(n);
  memcpy(heap, cut, n);
  ck_assert_int_eq(flex_kernel_from_source(&k2, "cut.score", heap, n, NULL), FLEX_ERR_INVALID);
  ck_assert_msg(strstr(flex_last_error(), "cut.score:1:"), "%s", flex_last_error());
  memcpy(heap, "kernel k {}", n < 11 ? n : 11);
  ck_assert_int_eq(flex_kernel_from_source(&k2, "ok.score", heap, 11, NULL), FLEX_OK);
  flex_kernel_free(k2);
  free(heap);
  /* A value error in a declaration no kernel uses still rejects the file,
   * as `flexc check` does. */
  const char *unused = "const Z = 1 / 0;\nscore f(s, b, h, q, kv) { return s; }\n";
  ck_assert_int_eq(flex_kernel_from_source(&k2, "unused.score", unused, strlen(unused), NULL),
                   FLEX_ERR_INVALID);
  ck_assert_msg(strstr(flex_last_error(), "unused.score:1:15: error: division by a constant zero"), "%s",
                flex_last_error());
}
END_TEST

/* Broadcast inputs (stride 0, like PyTorch's expand) are legal: the result
 * equals the float64 reference on the materialised copy. */
START_TEST(broadcast_input) {
  uint64_t rng = tl_seed();
  flex_kernel *k = load();
  Call c, r;
  call_init(&c, F32, FLEX_BACKEND_REFERENCE, &rng);
  call_init(&r, F64, FLEX_BACKEND_REFERENCE, &rng);
  /* k: head 1 and batch 1 read head 0 of batch 0. */
  int64_t zk[4] = {0, 0, 8, 1};
  c.k.t.strides = zk;
  for (int64_t i = 0; i < rt_array_count(&r.k.a); i++)
    rt_array_set(&r.k.a, i, rt_array_get(&c.k.a, i % (11 * 8)));
  TlArr *cp[][2] = {{&c.q, &r.q}, {&c.v, &r.v}, {&c.slopes, &r.slopes}};
  for (int j = 0; j < 3; j++)
    for (int64_t i = 0; i < rt_array_count(&cp[j][0]->a); i++)
      rt_array_set(&cp[j][1]->a, i, rt_array_get(&cp[j][0]->a, i));
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(flex_forward(k, &r.a) == FLEX_OK, "%s", flex_last_error());
  double e = tl_rel_err(&c.out.a, &r.out.a);
  ck_assert_msg(e <= 1e-4, "out relative error %g", e);
  call_free(&c);
  call_free(&r);
  flex_kernel_free(k);
}
END_TEST

/* Eight threads, shared and private kernels, forward and backward: every
 * result equals its single-threaded run bit for bit. */
enum { NT = 8 };
typedef struct Worker {
  Call c;
  flex_kernel *shared;
  bool own; /* load a private kernel instead of using `shared` */
  RtArray want_out, want_dq; /* the single-threaded results */
  int mismatches;
  flex_status st;
} Worker;

static flex_status run_once(Worker *w, flex_kernel *k) {
  tl_arr_poison(&w->c.out), tl_arr_poison(&w->c.dq);
  flex_status st = flex_forward(k, &w->c.a);
  return st ? st : flex_backward(k, &w->c.a);
}

static void *worker(void *arg) {
  Worker *w = arg;
  flex_kernel *k = w->shared;
  if (w->own && flex_kernel_from_source(&k, "own.score", SRC, strlen(SRC), NULL)) {
    w->st = FLEX_ERR_INVALID;
    return NULL;
  }
  for (int rep = 0; rep < 3 && !w->st; rep++) {
    w->st = run_once(w, k);
    size_t ob = (size_t)rt_array_count(&w->want_out) * 4, qb = (size_t)rt_array_count(&w->want_dq) * 4;
    if (!w->st && (memcmp(w->c.out.a.data, w->want_out.data, ob) ||
                   memcmp(w->c.dq.a.data, w->want_dq.data, qb)))
      w->mismatches++;
  }
  if (w->own) flex_kernel_free(k);
  return NULL;
}

static void threads_on(flex_backend be) {
  uint64_t rng = tl_seed();
  flex_kernel *k = load();
  static Worker w[NT];
  for (int i = 0; i < NT; i++) {
    memset(&w[i], 0, sizeof w[i]);
    call_init(&w[i].c, F32, be, &rng);
    w[i].shared = k;
    w[i].own = i & 1;
    ck_assert_msg(run_once(&w[i], k) == FLEX_OK, "%s", flex_last_error());
    rt_array_init(&w[i].want_out, F32, 4, w[i].c.out.t.shape);
    rt_array_init(&w[i].want_dq, F32, 4, w[i].c.dq.t.shape);
    memcpy(w[i].want_out.data, w[i].c.out.a.data, (size_t)rt_array_count(&w[i].want_out) * 4);
    memcpy(w[i].want_dq.data, w[i].c.dq.a.data, (size_t)rt_array_count(&w[i].want_dq) * 4);
    /* The expected results are themselves right: against a float64
     * reference run on the same inputs (NaN or zeros never pass). */
    TlArr ro, rl, rq, rk, rv, rs;
    DLDataType f64 = rt_dtype(kDLFloat, 64);
    Call *c = &w[i].c;
    TlArr *ref[] = {&ro, &rl, &rq, &rk, &rv, &rs}, *got[] = {&c->out, &c->lse, &c->dq, &c->dk, &c->dv, &c->dslopes};
    for (int j = 0; j < 6; j++) tl_arr_init(ref[j], f64, got[j]->a.ndim, got[j]->a.shape), tl_arr_poison(ref[j]);
    flex_buffer rb = {"slopes", &c->slopes.t, &rs.t};
    flex_args ra = c->a;
    ra.backend = FLEX_BACKEND_REFERENCE;
    ra.out = &ro.t, ra.lse = &rl.t, ra.dq = &rq.t, ra.dk = &rk.t, ra.dv = &rv.t, ra.buffers = &rb;
    ck_assert_msg(flex_forward(k, &ra) == FLEX_OK && flex_backward(k, &ra) == FLEX_OK, "%s", flex_last_error());
    for (int j = 0; j < 6; j++) {
      double e = tl_rel_err(&got[j]->a, &ref[j]->a);
      ck_assert_msg(e <= (j < 2 ? 1e-4 : 1e-3), "worker %d output %d: error %g against the reference", i, j, e);
      tl_arr_free(ref[j]);
    }
  }
  pthread_t t[NT];
  for (int i = 0; i < NT; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, worker, &w[i]), 0);
  for (int i = 0; i < NT; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < NT; i++) {
    ck_assert_msg(w[i].st == FLEX_OK && w[i].mismatches == 0, "thread %d: status %d, %d mismatches",
                  i, (int)w[i].st, w[i].mismatches);
    rt_array_free(&w[i].want_out), rt_array_free(&w[i].want_dq);
    call_free(&w[i].c);
  }
  flex_kernel_free(k);
}

START_TEST(threads_reference) { threads_on(FLEX_BACKEND_REFERENCE); }
END_TEST
START_TEST(threads_emu) { threads_on(FLEX_BACKEND_EMU); }
END_TEST


/* A `grad` buffer passed without a gradient tensor (flex_buffer.grad NULL,
 * a frozen bias table) costs nothing and writes nothing: the call runs a
 * joint with no adds into it, and q, k, v gradients match the reference
 * that does compute the buffer's. On every host backend and kernel path. */
static void no_grad_destination(flex_backend be, const char *arch, DLDataType dt, double tol,
                                double gtol) {
  uint64_t rng = tl_seed();
  flex_kernel *k = load();
  bool keep[2] = {false, false};
  const IrModule *m = rt_kernel_module(k, keep);
  ck_assert_ptr_ne(m, k->mod);
  ck_assert_ptr_eq(rt_kernel_module(k, keep), m); /* made once */
  for (int i = 0; i < m->joint->n; i++) ck_assert_int_ne(m->joint->inst[i].op, IR_ACCUM);
  Call c;
  call_init(&c, dt, be, &rng);
  c.buf.grad = NULL;
  c.a.arch = arch;
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(flex_backward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  ck_assert(untouched(&c.dslopes));
  DLDataType f64 = rt_dtype(kDLFloat, 64);
  TlArr ref[6];
  TlArr *got[] = {&c.out, &c.lse, &c.dq, &c.dk, &c.dv};
  for (int j = 0; j < 5; j++) tl_arr_init(&ref[j], f64, got[j]->a.ndim, got[j]->a.shape), tl_arr_poison(&ref[j]);
  tl_arr_init(&ref[5], f64, 1, c.slopes.t.shape), tl_arr_poison(&ref[5]);
  flex_buffer rb = {"slopes", &c.slopes.t, &ref[5].t};
  flex_args ra = c.a;
  ra.backend = FLEX_BACKEND_REFERENCE;
  ra.out = &ref[0].t, ra.lse = &ref[1].t, ra.dq = &ref[2].t, ra.dk = &ref[3].t, ra.dv = &ref[4].t;
  ra.buffers = &rb;
  ck_assert_msg(flex_forward(k, &ra) == FLEX_OK && flex_backward(k, &ra) == FLEX_OK, "%s", flex_last_error());
  for (int j = 0; j < 5; j++) {
    double e = tl_rel_err(&got[j]->a, &ref[j].a), lim = j < 2 ? tol : gtol;
    ck_assert_msg(e <= lim, "%s %s: output %d error %g against the reference (limit %g)",
                  flex_backend_name(be), arch ? arch : "", j, e, lim);
  }
  for (int j = 0; j < 6; j++) tl_arr_free(&ref[j]);
  call_free(&c);
  flex_kernel_free(k);
}

START_TEST(no_grad_destination_reference) {
  /* lse is float32 (call_init); the rest float64 */
  no_grad_destination(FLEX_BACKEND_REFERENCE, NULL, F64, 1e-7, 1e-12);
}
END_TEST
START_TEST(no_grad_destination_cpu) {
  if (!flex_backend_available(FLEX_BACKEND_CPU)) return;
  no_grad_destination(FLEX_BACKEND_CPU, NULL, F32, 1e-4, 1e-3);
}
END_TEST
START_TEST(no_grad_destination_emu) {
  no_grad_destination(FLEX_BACKEND_EMU, "sm_80", F32, 1e-4, 1e-3);
  no_grad_destination(FLEX_BACKEND_EMU, "sm_90a", rt_dtype(kDLFloat, 16), 5e-3, 2e-2);
}
END_TEST

int main(void) {
  return TL_MAIN("api_audit", 120, TL_TEST(bad_layouts), TL_TEST(huge_and_empty),
                 TL_TEST(bad_names_and_loading), TL_TEST(broadcast_input), TL_TEST(threads_reference),
                 TL_TEST(threads_emu), TL_TEST(no_grad_destination_reference),
                 TL_TEST(no_grad_destination_cpu), TL_TEST(no_grad_destination_emu));
}
