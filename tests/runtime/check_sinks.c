/* Attention sinks (docs/language.md "Attention sinks") on every backend.
 *
 * The float64 reference against a dense softmax written here (the row's
 * keys plus one sink column, the sink column then dropped): O and LSE to
 * 1e-12, fully masked rows exactly O = 0 and LSE = sk. (Its gradients are
 * checked against central finite differences with every sample, the sink
 * samples included: check_reference.) Then every device path against the
 * reference, forward (O, LSE) and backward (dq, dk, dv and the sink
 * buffer's gradient): the emulator's sm_80 and sm_90a kernels in fp16 and
 * bf16, the cpu backend in fp32 and bf16; with GQA, rows whose keys are all
 * masked, query tiles that take the kernels' steady loops, split-KV
 * decoding, packed (varlen) batches, dropout and the deterministic backward
 * (bitwise the same twice); non-finite sinks (NaN and +inf make the row's
 * LSE that and its O NaN, -inf is no sink).
 * Fresh random inputs every run (seed printed), outputs poisoned first. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"
#include "runtime/tensor.h"
#include "testlib.h"

static uint64_t rng;

/* A learned per-head sink plus a per-query term, and a mask that leaves
 * rows q < 3 with no key (their O must be 0 and their LSE the sink). */
static const char *SRC =
    "buffer sinks: f32[H] grad;\n"
    "sink s(b, h, q) { return sinks[h] + 0.25 * log(float(q + 1)); }\n"
    "mask m(b, h, q, kv) { return kv <= q + 2 && q >= 3; }\n";

static flex_kernel *load(void) {
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "sinks.score", SRC, strlen(SRC), NULL) == FLEX_OK, "%s",
                flex_last_error());
  return k;
}

static const DLDataType F32 = {kDLFloat, 32, 1}, F64 = {kDLFloat, 64, 1};

/* One call: inputs in `dt`, outputs of the backend under test [0] (O in
 * the input dtype where the backend wants it) and of the reference [1]. */
typedef struct Call {
  int B, H, HKV, QL, KL, E;
  TlArr q, k, v, dout, sinks;
  TlArr out[2], lse[2], dq[2], dk[2], dv[2], ds[2];
  flex_buffer fb[2];
  flex_args a[2];
} Call;

static void call_init(Call *c, DLDataType dt, int B, int H, int HKV, int QL, int KL, int E,
                      flex_backend be, const char *arch) {
  memset(c, 0, sizeof *c);
  c->B = B, c->H = H, c->HKV = HKV, c->QL = QL, c->KL = KL, c->E = E;
  int64_t qs[4] = {B, H, QL, E}, ks[4] = {B, HKV, KL, E}, ls[3] = {B, H, QL}, hs[1] = {H};
  tl_arr_init(&c->q, dt, 4, qs), tl_arr_normal(&c->q, &rng);
  tl_arr_init(&c->k, dt, 4, ks), tl_arr_normal(&c->k, &rng);
  tl_arr_init(&c->v, dt, 4, ks), tl_arr_normal(&c->v, &rng);
  tl_arr_init(&c->dout, dt, 4, qs), tl_arr_normal(&c->dout, &rng);
  /* around the rows' own logits, some above every key's */
  tl_arr_init(&c->sinks, F32, 1, hs), tl_arr_uniform(&c->sinks, -1.0, 3.0, &rng);
  for (int i = 0; i < 2; i++) {
    DLDataType o = i ? F64 : (be == FLEX_BACKEND_CUDA ? dt : F32);
    tl_arr_init(&c->out[i], o, 4, qs), tl_arr_init(&c->lse[i], i ? F64 : F32, 3, ls);
    tl_arr_init(&c->dq[i], o, 4, qs), tl_arr_init(&c->dk[i], o, 4, ks), tl_arr_init(&c->dv[i], o, 4, ks);
    tl_arr_init(&c->ds[i], i ? F64 : F32, 1, hs);
    TlArr *outs[] = {&c->out[i], &c->lse[i], &c->dq[i], &c->dk[i], &c->dv[i], &c->ds[i]};
    for (int j = 0; j < 6; j++) tl_arr_poison(outs[j]);
    c->fb[i] = (flex_buffer){"sinks", &c->sinks.t, &c->ds[i].t};
    flex_args *a = &c->a[i];
    a->backend = i ? FLEX_BACKEND_REFERENCE : be;
    a->arch = i ? NULL : arch;
    a->q = &c->q.t, a->k = &c->k.t, a->v = &c->v.t, a->dout = &c->dout.t;
    a->out = &c->out[i].t, a->lse = &c->lse[i].t;
    a->dq = &c->dq[i].t, a->dk = &c->dk[i].t, a->dv = &c->dv[i].t;
    a->buffers = &c->fb[i], a->nbuffers = 1;
  }
}

static void call_free(Call *c) {
  TlArr *all[] = {&c->q, &c->k, &c->v, &c->dout, &c->sinks};
  for (int i = 0; i < 5; i++) tl_arr_free(all[i]);
  for (int i = 0; i < 2; i++) {
    TlArr *outs[] = {&c->out[i], &c->lse[i], &c->dq[i], &c->dk[i], &c->dv[i], &c->ds[i]};
    for (int j = 0; j < 6; j++) tl_arr_free(outs[j]);
  }
}

/* Forward and backward on both sides; the backend's errors against the
 * reference, under `what`'s tolerances. */
static void run_both(flex_kernel *k, Call *c, const TlDtype *td, const char *what) {
  for (int i = 1; i >= 0; i--) {
    ck_assert_msg(flex_forward(k, &c->a[i]) == FLEX_OK, "%s forward: %s", what, flex_last_error());
    ck_assert_msg(flex_backward(k, &c->a[i]) == FLEX_OK, "%s backward: %s", what, flex_last_error());
  }
  double e[6];
  TlArr *x[6] = {&c->out[0], &c->lse[0], &c->dq[0], &c->dk[0], &c->dv[0], &c->ds[0]};
  TlArr *r[6] = {&c->out[1], &c->lse[1], &c->dq[1], &c->dk[1], &c->dv[1], &c->ds[1]};
  for (int j = 0; j < 6; j++) e[j] = tl_rel_err(&x[j]->a, &r[j]->a);
  fprintf(stderr, "  %-34s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e dsinks %.1e\n", what, e[0], e[1],
          e[2], e[3], e[4], e[5]);
  for (int j = 0; j < 6; j++)
    ck_assert_msg(e[j] <= (j < 2 ? td->tol : td->gtol), "%s: output %d error %g", what, j, e[j]);
}

/* Rows q < 3 (no key): O exactly 0, LSE the sink, on sides first..1
 * (0: the backend under test and the reference; 1: the reference). */
static void masked_rows(Call *c, const char *what, int first) {
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->H; h++)
      for (int q = 0; q < 3 && q < c->QL; q++) {
        int64_t row = ((int64_t)b * c->H + h) * c->QL + q;
        double sk = (double)(float)((float)rt_array_get(&c->sinks.a, h) +
                                    (float)(0.25 * log((double)(q + 1))));
        for (int i = first; i < 2; i++) {
          double l = rt_array_get(&c->lse[i].a, row);
          ck_assert_msg(fabs(l - sk) <= 1e-5 * (1 + fabs(sk)), "%s [%d]: masked row %lld LSE %g, sink %g",
                        what, i, (long long)row, l, sk);
          for (int e = 0; e < c->E; e++) {
            double o = rt_array_get(&c->out[i].a, row * c->E + e);
            ck_assert_msg(o == 0, "%s [%d]: masked row %lld O[%d] = %g", what, i, (long long)row, e, o);
          }
        }
      }
}

/* The reference against a dense float64 softmax over the keys plus the
 * sink column (which has no value), computed here. */
START_TEST(reference_is_dense_softmax_with_sink_column) {
  flex_kernel *k = load();
  Call c;
  call_init(&c, F64, 2, 4, 2, 9, 13, 8, FLEX_BACKEND_REFERENCE, NULL);
  ck_assert_msg(flex_forward(k, &c.a[1]) == FLEX_OK, "%s", flex_last_error());
  double num = 0, den = 0, lnum = 0, lden = 0;
  const double scale = 1 / sqrt((double)c.E);
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.H; h++)
      for (int q = 0; q < c.QL; q++) {
        /* the reference evaluates the language's float ops in binary64 */
        double s[64], sk = rt_array_get(&c.sinks.a, h) + 0.25 * log((double)(q + 1));
        double mx = sk, sum = 0;
        for (int j = 0; j < c.KL; j++) {
          double d = 0;
          for (int e = 0; e < c.E; e++)
            d += rt_array_get(&c.q.a, ((b * c.H + h) * c.QL + q) * c.E + e) *
                 rt_array_get(&c.k.a, ((b * c.HKV + h / 2) * c.KL + j) * c.E + e);
          s[j] = j <= q + 2 && q >= 3 ? scale * d : -INFINITY;
          mx = s[j] > mx ? s[j] : mx;
        }
        sum = exp(sk - mx);
        for (int j = 0; j < c.KL; j++) sum += exp(s[j] - mx);
        double lse = mx + log(sum), got = rt_array_get(&c.lse[1].a, (b * c.H + h) * c.QL + q);
        lnum += (got - lse) * (got - lse), lden += lse * lse;
        for (int e = 0; e < c.E; e++) {
          double o = 0;
          for (int j = 0; j < c.KL; j++)
            o += exp(s[j] - lse) * rt_array_get(&c.v.a, ((b * c.HKV + h / 2) * c.KL + j) * c.E + e);
          double go = rt_array_get(&c.out[1].a, ((b * c.H + h) * c.QL + q) * c.E + e);
          num += (go - o) * (go - o), den += o * o;
        }
      }
  fprintf(stderr, "  reference vs dense: out %.1e lse %.1e\n", sqrt(num / den), sqrt(lnum / lden));
  ck_assert_double_lt(sqrt(num / den), 1e-12);
  ck_assert_double_lt(sqrt(lnum / lden), 1e-12);
  masked_rows(&c, "reference", 1);
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

/* Every device path: GQA, masked rows, forward and backward. */
static const struct {
  flex_backend be;
  const char *arch;
  int dt; /* tl_dtypes index */
} paths[] = {
    {FLEX_BACKEND_EMU, "sm_80", 1}, {FLEX_BACKEND_EMU, "sm_80", 2},   {FLEX_BACKEND_EMU, "sm_90a", 1},
    {FLEX_BACKEND_EMU, "sm_90a", 2}, {FLEX_BACKEND_CPU, NULL, 0},     {FLEX_BACKEND_CPU, NULL, 2},
};
#define NPATHS ((int)(sizeof paths / sizeof paths[0]))

static bool available(flex_backend be) { return flex_backend_available(be); }

START_TEST(every_path) {
  if (!available(paths[_i].be)) return;
  flex_kernel *k = load();
  const TlDtype *td = &tl_dtypes[paths[_i].dt];
  Call c;
  call_init(&c, rt_dtype(td->code, td->bits), 2, 4, 2, 70, 90, 64, paths[_i].be, paths[_i].arch);
  char what[96];
  snprintf(what, sizeof what, "%s %s %s", flex_backend_name(paths[_i].be),
           paths[_i].arch ? paths[_i].arch : "", td->name);
  run_both(k, &c, td, what);
  masked_rows(&c, what, 0);
  if (paths[_i].arch && !strcmp(paths[_i].arch, "sm_90a")) {
    RtRunStats st = rt_run_last_stats();
    ck_assert_msg(st.bwd_sm90, "%s: the sm_90a backward did not run", what);
  }
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

/* The steady loops (docs/kernels.md "Steady and general loops"): rows 128
 * to 255 form a query tile inside Q_LEN whose first 128 keys are full
 * under the mask, so the sm_80 and sm_90a forwards take their steady loop
 * for it and the sm_80 backward its steady tile; the sink joins those rows
 * where they are finished, from the steady loop's running max and sum. */
static const struct {
  const char *arch;
  int dt;
} steady_paths[] = {{"sm_80", 2}, {"sm_90a", 1}};

START_TEST(steady_loops) {
  flex_kernel *k = load();
  const TlDtype *td = &tl_dtypes[steady_paths[_i].dt];
  Call c;
  call_init(&c, rt_dtype(td->code, td->bits), 1, 2, 1, 260, 300, 64, FLEX_BACKEND_EMU,
            steady_paths[_i].arch);
  char what[96];
  snprintf(what, sizeof what, "emu %s %s steady loops", steady_paths[_i].arch, td->name);
  run_both(k, &c, td, what);
  masked_rows(&c, what, 0);
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

/* Split-KV decoding: a short Q over many keys in chunks the combine merges;
 * the sink must join once (not once per chunk). */
START_TEST(split_kv_decode) {
  flex_kernel *k = load();
  const TlDtype *td = &tl_dtypes[1];
  Call c;
  call_init(&c, rt_dtype(td->code, td->bits), 1, 4, 1, 5, 600, 64, FLEX_BACKEND_EMU, "sm_80");
  c.a[0].kv_splits = 4;
  ck_assert_msg(flex_forward(k, &c.a[1]) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(flex_forward(k, &c.a[0]) == FLEX_OK, "%s", flex_last_error());
  ck_assert_int_eq(rt_run_last_stats().kv_splits, 4);
  double eo = tl_rel_err(&c.out[0].a, &c.out[1].a), el = tl_rel_err(&c.lse[0].a, &c.lse[1].a);
  fprintf(stderr, "  split-KV 4 chunks fp16: out %.1e lse %.1e\n", eo, el);
  ck_assert_msg(eo < td->tol && el < td->tol, "out %g lse %g", eo, el);
  masked_rows(&c, "split-KV", 0);
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

/* Dropout never drops the sink; the same bits on every backend. */
START_TEST(dropout) {
  flex_kernel *k = load();
  for (int be = 0; be < 2; be++) {
    flex_backend b = be ? FLEX_BACKEND_CPU : FLEX_BACKEND_EMU;
    if (!available(b)) continue;
    Call c;
    call_init(&c, F32, 1, 2, 2, 40, 50, 32, b, NULL);
    for (int i = 0; i < 2; i++)
      c.a[i].dropout_p = 0.3f, c.a[i].dropout_seed = 77, c.a[i].dropout_offset = 5;
    run_both(k, &c, &tl_dtypes[0], be ? "cpu fp32 dropout 0.3" : "emu fp32 dropout 0.3");
    call_free(&c);
  }
  flex_kernel_free(k);
}
END_TEST

/* A deterministic backward: bitwise the same twice, the sink's gradient
 * included, and right. */
START_TEST(deterministic) {
  flex_kernel *k = load();
  for (int be = 0; be < 2; be++) {
    flex_backend b = be ? FLEX_BACKEND_CPU : FLEX_BACKEND_EMU;
    if (!available(b)) continue;
    Call c;
    call_init(&c, rt_dtype(kDLFloat, 16), 2, 4, 2, 50, 70, 32, b, NULL);
    c.a[0].deterministic = true;
    run_both(k, &c, &tl_dtypes[1], be ? "cpu fp16 deterministic" : "emu fp16 deterministic");
    TlArr keep[4];
    TlArr *g[4] = {&c.dq[0], &c.dk[0], &c.dv[0], &c.ds[0]};
    for (int j = 0; j < 4; j++) {
      tl_arr_init(&keep[j], g[j]->a.dtype, g[j]->a.ndim, g[j]->a.shape);
      memcpy(keep[j].a.data, g[j]->a.data, (size_t)rt_array_count(&g[j]->a) * (g[j]->a.dtype.bits / 8));
      tl_arr_poison(g[j]);
    }
    ck_assert_msg(flex_backward(k, &c.a[0]) == FLEX_OK, "%s", flex_last_error());
    for (int j = 0; j < 4; j++) {
      ck_assert_msg(!memcmp(keep[j].a.data, g[j]->a.data,
                            (size_t)rt_array_count(&g[j]->a) * (g[j]->a.dtype.bits / 8)),
                    "%s: gradient %d differs between two deterministic runs", flex_backend_name(b), j);
      tl_arr_free(&keep[j]);
    }
    call_free(&c);
  }
  flex_kernel_free(k);
}
END_TEST

/* A packed batch (cu_seqlens): each sequence its own rows, its own sink
 * (q is the position inside the sequence). */
START_TEST(varlen) {
  flex_kernel *k = load();
  const int32_t cuq[4] = {0, 2, 40, 71}, cuk[4] = {0, 5, 5, 50};
  for (int be = 0; be < 3; be++) {
    flex_backend b = be == 0 ? FLEX_BACKEND_REFERENCE : be == 1 ? FLEX_BACKEND_EMU : FLEX_BACKEND_CPU;
    if (!available(b)) continue;
    int64_t qs[3] = {71, 2, 16}, ks[3] = {50, 1, 16}, ls[2] = {2, 71}, hs[1] = {2}, n4[1] = {4};
    TlArr q, kk, v, out, lse, sk, cq, ck;
    tl_arr_init(&q, F32, 3, qs), tl_arr_normal(&q, &rng);
    tl_arr_init(&kk, F32, 3, ks), tl_arr_normal(&kk, &rng);
    tl_arr_init(&v, F32, 3, ks), tl_arr_normal(&v, &rng);
    tl_arr_init(&sk, F32, 1, hs), tl_arr_uniform(&sk, -1, 3, &rng);
    tl_arr_init(&out, F32, 3, (int64_t[3]){71, 2, 16}), tl_arr_poison(&out);
    tl_arr_init(&lse, F32, 2, ls), tl_arr_poison(&lse);
    tl_arr_init(&cq, rt_dtype(kDLInt, 32), 1, n4), tl_arr_init(&ck, rt_dtype(kDLInt, 32), 1, n4);
    memcpy(cq.a.data, cuq, sizeof cuq), memcpy(ck.a.data, cuk, sizeof cuk);
    flex_buffer fb = {"sinks", &sk.t, NULL};
    flex_args a = {.backend = b, .q = &q.t, .k = &kk.t, .v = &v.t, .out = &out.t, .lse = &lse.t,
                   .buffers = &fb, .nbuffers = 1, .cu_seqlens_q = &cq.t, .cu_seqlens_kv = &ck.t};
    ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "%s: %s", flex_backend_name(b), flex_last_error());
    /* each sequence's row i against a padded reference call of that sequence alone */
    double num = 0, den = 0;
    for (int s = 0; s < 3; s++) {
      int nq = cuq[s + 1] - cuq[s], nk = cuk[s + 1] - cuk[s];
      if (!nq) continue;
      TlArr sq, skk, sv, so, sl;
      tl_arr_init(&sq, F32, 4, (int64_t[4]){1, 2, nq, 16});
      tl_arr_init(&skk, F32, 4, (int64_t[4]){1, 1, nk, 16});
      tl_arr_init(&sv, F32, 4, (int64_t[4]){1, 1, nk, 16});
      tl_arr_init(&so, F64, 4, (int64_t[4]){1, 2, nq, 16});
      tl_arr_init(&sl, F64, 3, (int64_t[3]){1, 2, nq});
      for (int h = 0; h < 2; h++)
        for (int i = 0; i < nq; i++)
          for (int e = 0; e < 16; e++)
            rt_array_set(&sq.a, (h * nq + i) * 16 + e, rt_array_get(&q.a, ((cuq[s] + i) * 2 + h) * 16 + e));
      for (int j = 0; j < nk; j++)
        for (int e = 0; e < 16; e++) {
          rt_array_set(&skk.a, j * 16 + e, rt_array_get(&kk.a, (cuk[s] + j) * 16 + e));
          rt_array_set(&sv.a, j * 16 + e, rt_array_get(&v.a, (cuk[s] + j) * 16 + e));
        }
      flex_args r = {.backend = FLEX_BACKEND_REFERENCE, .q = &sq.t, .k = &skk.t, .v = &sv.t,
                     .out = &so.t, .lse = &sl.t, .buffers = &fb, .nbuffers = 1};
      ck_assert_msg(flex_forward(k, &r) == FLEX_OK, "%s", flex_last_error());
      for (int h = 0; h < 2; h++)
        for (int i = 0; i < nq; i++) {
          double rl = rt_array_get(&sl.a, h * nq + i), gl = rt_array_get(&lse.a, h * 71 + cuq[s] + i);
          num += (gl - rl) * (gl - rl), den += rl * rl;
          for (int e = 0; e < 16; e++) {
            double ro = rt_array_get(&so.a, (h * nq + i) * 16 + e);
            double go = rt_array_get(&out.a, ((cuq[s] + i) * 2 + h) * 16 + e);
            ck_assert_msg(!isnan(go), "%s: NaN in sequence %d", flex_backend_name(b), s);
            num += (go - ro) * (go - ro), den += ro * ro;
          }
        }
      TlArr *t5[] = {&sq, &skk, &sv, &so, &sl};
      for (int t = 0; t < 5; t++) tl_arr_free(t5[t]);
    }
    fprintf(stderr, "  varlen %s: out and lse %.1e\n", flex_backend_name(b), sqrt(num / den));
    ck_assert_double_lt(sqrt(num / den), 1e-4);
    TlArr *all[] = {&q, &kk, &v, &out, &lse, &sk, &cq, &ck};
    for (int t = 0; t < 8; t++) tl_arr_free(all[t]);
  }
  flex_kernel_free(k);
}
END_TEST

/* Non-finite sinks: NaN and +inf make the row's LSE that and its O NaN;
 * -inf is no sink (the same O and LSE as a kernel without one). */
START_TEST(non_finite_sinks) {
  flex_kernel *k = load();
  static const char *plain = "mask m(b, h, q, kv) { return kv <= q + 2 && q >= 3; }\n";
  flex_kernel *k0 = NULL;
  ck_assert(flex_kernel_from_source(&k0, "plain.score", plain, strlen(plain), NULL) == FLEX_OK);
  for (int be = 0; be < 3; be++) {
    flex_backend b = be == 0 ? FLEX_BACKEND_REFERENCE : be == 1 ? FLEX_BACKEND_EMU : FLEX_BACKEND_CPU;
    if (!available(b)) continue;
    Call c;
    call_init(&c, F32, 1, 3, 3, 9, 12, 8, b, NULL);
    rt_array_set(&c.sinks.a, 0, NAN), rt_array_set(&c.sinks.a, 1, INFINITY);
    rt_array_set(&c.sinks.a, 2, -INFINITY);
    /* the kernel without a sink first, its results kept in [1] */
    flex_args p = c.a[0];
    p.buffers = NULL, p.nbuffers = 0;
    ck_assert_msg(flex_forward(k0, &p) == FLEX_OK, "%s", flex_last_error());
    for (int64_t i = 0; i < rt_array_count(&c.out[0].a); i++)
      rt_array_set(&c.out[1].a, i, rt_array_get(&c.out[0].a, i));
    for (int64_t i = 0; i < rt_array_count(&c.lse[0].a); i++)
      rt_array_set(&c.lse[1].a, i, rt_array_get(&c.lse[0].a, i));
    tl_arr_poison(&c.out[0]), tl_arr_poison(&c.lse[0]);
    ck_assert_msg(flex_forward(k, &c.a[0]) == FLEX_OK, "%s", flex_last_error());
    for (int q = 0; q < c.QL; q++) {
      double l0 = rt_array_get(&c.lse[0].a, q), l1 = rt_array_get(&c.lse[0].a, c.QL + q);
      ck_assert_msg(isnan(l0), "%s: NaN sink: row %d LSE %g", flex_backend_name(b), q, l0);
      ck_assert_msg(l1 == INFINITY, "%s: +inf sink: row %d LSE %g", flex_backend_name(b), q, l1);
      double l2 = rt_array_get(&c.lse[0].a, 2 * c.QL + q), want = rt_array_get(&c.lse[1].a, 2 * c.QL + q);
      ck_assert_msg(l2 == want || fabs(l2 - want) <= 1e-5 * fabs(want), "%s: -inf sink: row %d LSE %g, no sink %g",
                    flex_backend_name(b), q, l2, want);
      for (int e = 0; e < c.E; e++) {
        ck_assert(isnan(rt_array_get(&c.out[0].a, q * c.E + e)));
        ck_assert(isnan(rt_array_get(&c.out[0].a, (c.QL + q) * c.E + e)));
        double o = rt_array_get(&c.out[0].a, (2 * c.QL + q) * c.E + e);
        double w = rt_array_get(&c.out[1].a, (2 * c.QL + q) * c.E + e);
        ck_assert_msg(fabs(o - w) <= 1e-5, "%s: -inf sink: O %g, no sink %g", flex_backend_name(b), o, w);
      }
    }
    call_free(&c);
  }
  flex_kernel_free(k0);
  flex_kernel_free(k);
}
END_TEST

int main(void) {
  rng = tl_seed();
  return TL_MAIN("sinks", 1200, TL_TEST(reference_is_dense_softmax_with_sink_column),
                 TL_LOOP(every_path, NPATHS),
                 TL_LOOP(steady_loops, (int)(sizeof steady_paths / sizeof steady_paths[0])),
                 TL_TEST(split_kv_decode), TL_TEST(dropout),
                 TL_TEST(deterministic), TL_TEST(varlen), TL_TEST(non_finite_sinks));
}
