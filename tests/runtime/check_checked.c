/* Checked runs (--check-bounds) on the emulator against the reference: the
 * same failures reported in the same words (buffer, index values, shape,
 * FILE:LINE:COL), including an index that is out of its dimension but
 * inside the allocation, i64 values that do not fit in 32 bits and broken
 * `sorted` promises; and a clean program gives the reference's numbers. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/flex.h"
#include "testlib.h"

enum { B = 1, H = 2, QL = 7, KL = 9, E = 8 };

/* One call's tensors: inputs, outputs and one buffer. */
typedef struct Call {
  TlArr q, k, v, out, lse, dout, dq, dk, dv, buf;
} Call;

static uint64_t rng;

/* The buffer has bnd dimensions of bshape; bvals fills it in order. */
static void call_init(Call *c, DLDataType bdt, int bnd, const int64_t *bshape, const double *bvals) {
  const int64_t sq[] = {B, H, QL, E}, sk[] = {B, H, KL, E}, sl[] = {B, H, QL};
  DLDataType f32 = {kDLFloat, 32, 1};
  tl_arr_init(&c->q, f32, 4, sq), tl_arr_init(&c->k, f32, 4, sk), tl_arr_init(&c->v, f32, 4, sk);
  tl_arr_init(&c->dout, f32, 4, sq);
  tl_arr_init(&c->out, f32, 4, sq), tl_arr_init(&c->lse, f32, 3, sl);
  tl_arr_init(&c->dq, f32, 4, sq), tl_arr_init(&c->dk, f32, 4, sk), tl_arr_init(&c->dv, f32, 4, sk);
  tl_arr_normal(&c->q, &rng), tl_arr_normal(&c->k, &rng), tl_arr_normal(&c->v, &rng);
  tl_arr_normal(&c->dout, &rng);
  tl_arr_init(&c->buf, bdt, bnd, bshape);
  for (int64_t i = 0; i < rt_array_count(&c->buf.a); i++) rt_array_set(&c->buf.a, i, bvals[i]);
}

static void call_free(Call *c) {
  TlArr *all[] = {&c->q, &c->k, &c->v, &c->out, &c->lse, &c->dout, &c->dq, &c->dk, &c->dv, &c->buf};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tl_arr_free(all[i]);
}

/* Forward then backward on one backend; the status, message in msg. */
static flex_status run(flex_kernel *k, Call *c, flex_backend be, bool checked, const char *bname,
                       char *msg, size_t cap) {
  TlArr *outs[] = {&c->out, &c->lse, &c->dq, &c->dk, &c->dv};
  for (int i = 0; i < 5; i++) tl_arr_poison(outs[i]);
  flex_buffer fb = {bname, &c->buf.t, NULL};
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = be;
  a.q = &c->q.t, a.k = &c->k.t, a.v = &c->v.t, a.out = &c->out.t, a.lse = &c->lse.t;
  a.dout = &c->dout.t, a.dq = &c->dq.t, a.dk = &c->dk.t, a.dv = &c->dv.t;
  a.buffers = &fb, a.nbuffers = 1;
  a.check_bounds = checked;
  flex_status st = flex_forward(k, &a);
  if (!st) st = flex_backward(k, &a);
  snprintf(msg, cap, "%s", st ? flex_last_error() : "");
  return st;
}

static flex_kernel *load(const char *src) {
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "chk.score", src, strlen(src), NULL) == FLEX_OK, "%s",
                flex_last_error());
  return k;
}

/* The message without its first bracketed index list: which failing access
 * a parallel backend reports first may differ; the rest may not. */
static void strip_indices(char *m) {
  char *a = strstr(m, "' ["), *b = a ? strchr(a + 3, ']') : NULL;
  if (a && b) memmove(a + 3, b, strlen(b) + 1);
}

/* The index values of a message ("... 't' [i, j] ..."), up to 8; their count. */
static int indices_of(const char *m, long *idx) {
  const char *p = strstr(m, "' [");
  int n = 0;
  if (!p) return 0;
  for (p += 3; n < 8; p += 2) { /* each number is followed by ", " or "]" */
    char *e;
    idx[n] = strtol(p, &e, 10);
    if (e == p) break;
    n++;
    if (*e != ',') break;
    p = e;
  }
  return n;
}

/* Both backends fail a checked run with the same message (index values
 * aside), containing want; the emulator's indices in emu_idx when not NULL. */
static void same_failure(const char *src, DLDataType bdt, int bnd, const int64_t *bshape,
                         const double *bvals, const char *want, long *emu_idx, int *emu_n) {
  rng = tl_seed();
  flex_kernel *k = load(src);
  Call c;
  call_init(&c, bdt, bnd, bshape, bvals);
  char m1[512], m2[512];
  flex_status s1 = run(k, &c, FLEX_BACKEND_REFERENCE, true, "t", m1, sizeof m1);
  flex_status s2 = run(k, &c, FLEX_BACKEND_EMU, true, "t", m2, sizeof m2);
  fprintf(stderr, "  reference: %s\n  emu:       %s\n", m1, m2);
  ck_assert_int_eq(s1, FLEX_ERR_RUNTIME);
  ck_assert_int_eq(s2, FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(m1, want), "reference message lacks '%s': %s", want, m1);
  if (emu_idx) *emu_n = indices_of(m2, emu_idx);
  strip_indices(m1);
  strip_indices(m2);
  ck_assert_str_eq(m1, m2);
  call_free(&c);
  flex_kernel_free(k);
}

static const double table[8] = {0.5, -1, 2, 0.25, 1.5, -0.5, 1, 3};
static const int64_t shape2x4[2] = {2, 4}, shape8[1] = {8}, shape9[1] = {9};

START_TEST(index_out_of_its_dimension) {
  /* t[h, kv] with kv up to 8 in a [2, 4] table: offsets stay inside the
   * allocation for h = 0, so only a per-dimension check sees it. */
  DLDataType f32 = {kDLFloat, 32, 1};
  long idx[8];
  int n;
  same_failure("buffer t: f32[2, 4];\nscore f(s, b, h, q, kv) { return s + t[h, kv]; }\n", f32,
               2, shape2x4, table, "out-of-range read of buffer 't' [0, 4] (shape [2, 4])", idx, &n);
  /* Whichever access the emulator met first, it is outside its dimension. */
  ck_assert_int_eq(n, 2);
  ck_assert_msg(idx[0] < 0 || idx[0] >= 2 || idx[1] < 0 || idx[1] >= 4, "[%ld, %ld] is in range",
                idx[0], idx[1]);
}
END_TEST

START_TEST(i64_too_wide) {
  DLDataType i64 = {kDLInt, 64, 1};
  const double vals[9] = {1, 2, 3, 4, 5, 6, 4294967296.0, 7, 8};
  same_failure("buffer t: i64[9];\nscore f(s, b, h, q, kv) { return s + float(t[kv]); }\n", i64, 1,
               shape9, vals, "i64 value that does not fit in 32 bits read from buffer 't' [6]", NULL, NULL);
}
END_TEST

START_TEST(grad_buffer_read_out_of_range) {
  /* A `grad` buffer read out of range: the forward's load reports it (before
   * any gradient write could). */
  DLDataType f32 = {kDLFloat, 32, 1};
  same_failure("buffer t: f32[8] grad;\nscore f(s, b, h, q, kv) { return s * t[q + 2]; }\n", f32, 1,
               shape8, table, "out-of-range read of buffer 't' [8] (shape [8]) at chk.score:2:", NULL, NULL);
}
END_TEST

START_TEST(broken_sorted_promise) {
  DLDataType i32 = {kDLInt, 32, 1};
  const double ids[9] = {0, 0, 1, 1, 0, 2, 2, 3, 3};
  same_failure("buffer t: i32[9] sorted;\nmask m(b, h, q, kv) { return t[q] >= t[kv]; }\n", i32, 1,
               shape9, ids, "buffer 't' is declared sorted but decreases at index 4", NULL, NULL);
}
END_TEST

START_TEST(clean_program_matches) {
  /* In range everywhere: the checked emulator agrees with the reference. */
  rng = tl_seed();
  flex_kernel *k = load("buffer t: f32[2, 4];\n"
                        "score f(s, b, h, q, kv) { return s + t[h, kv % 4]; }\n");
  Call ce, cr;
  DLDataType f32 = {kDLFloat, 32, 1};
  uint64_t keep = rng;
  call_init(&ce, f32, 2, shape2x4, table);
  rng = keep;
  call_init(&cr, f32, 2, shape2x4, table);
  char msg[512];
  ck_assert_msg(run(k, &ce, FLEX_BACKEND_EMU, true, "t", msg, sizeof msg) == FLEX_OK, "%s", msg);
  ck_assert_msg(run(k, &cr, FLEX_BACKEND_REFERENCE, true, "t", msg, sizeof msg) == FLEX_OK, "%s", msg);
  const TlArr *e[] = {&ce.out, &ce.lse, &ce.dq, &ce.dk, &ce.dv};
  const TlArr *r[] = {&cr.out, &cr.lse, &cr.dq, &cr.dk, &cr.dv};
  const double tol[] = {1e-4, 1e-4, 1e-3, 1e-3, 1e-3};
  for (int i = 0; i < 5; i++) {
    double err = tl_rel_err(&e[i]->a, &r[i]->a);
    ck_assert_msg(err <= tol[i], "output %d: relative error %g", i, err);
  }
  call_free(&ce);
  call_free(&cr);
  flex_kernel_free(k);
}
END_TEST

int main(void) {
  return TL_MAIN("checked", 120, TL_TEST(index_out_of_its_dimension), TL_TEST(i64_too_wide),
                 TL_TEST(grad_buffer_read_out_of_range), TL_TEST(broken_sorted_promise),
                 TL_TEST(clean_program_matches));
}
