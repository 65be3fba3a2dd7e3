/* Position offsets (docs/language.md "Position offsets"): a call cut by
 * hand into shard pairs (query shard x key/value shard, of uneven sizes),
 * each run with its q_offset, kv_offset and the whole lengths, merged by
 * LSE, gives the unsharded call's O and LSE; each pair's backward, given
 * the merged O and LSE, gives its share of dq, dk, dv and the buffer
 * gradients, which add up to the unsharded ones. On the reference, the
 * emulator (sm_80 fp32, sm_90a fp16) and the cpu backend (fp32, bf16),
 * for causal, a document mask whose ids are a buffer over the whole
 * sequence, a sliding window with softcap, ALiBi with GQA, and dropout
 * (whose bits see the whole sequence's positions), and a sink over a
 * window (carried by the pairs at kv_offset 0). Also: an empty pair
 * (causal, keys after every query) is classified empty without any tile,
 * a BlockMask built for a shard is the shard's, and bad offsets are
 * refused with the numbers. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"
#include "runtime/tensor.h"
#include "testlib.h"

static uint64_t rng;
static const DLDataType F32 = {kDLFloat, 32, 1}, F64 = {kDLFloat, 64, 1};

enum { B = 1, H = 4, HKV = 2, L = 100, E = 32 };
static const int qcut[] = {0, 37, 100}, kcut[] = {0, 50, 100}; /* two shards a side, uneven */

typedef struct Mod {
  const char *name, *src;
  bool dropout;
} Mod;

static const Mod mods[] = {
    {"causal", "mask m(b, h, q, kv) { return q >= kv; }\n", false},
    {"document",
     "buffer doc: i32[Q_LEN] sorted;\n"
     "mask m(b, h, q, kv) { return doc[q] == doc[kv] && q >= kv; }\n", false},
    {"window_softcap",
     "param int window = 24;\nparam float cap = 20.0;\n"
     "score s(x, b, h, q, kv) { return cap * tanh(x / cap); }\n"
     "mask m(b, h, q, kv) { return q >= kv && q - kv < window; }\n", false},
    {"alibi_gqa",
     "buffer slopes: f32[H] grad;\n"
     "score s(x, b, h, q, kv) { return x + slopes[h] * float(kv - q); }\n"
     "mask m(b, h, q, kv) { return q >= kv; }\n", false},
    {"dropout", "mask m(b, h, q, kv) { return q >= kv; }\n", true},
    /* a learned sink per head: the pairs at kv_offset 0 carry it, so the
     * merge counts it once; its gradient comes from those pairs alone */
    {"sink_window",
     "buffer sinks: f32[H] grad;\nparam int window = 30;\n"
     "sink sk(b, h, q) { return sinks[h]; }\n"
     "mask m(b, h, q, kv) { return q >= kv && q - kv < window; }\n", false},
};
#define NMODS ((int)(sizeof mods / sizeof mods[0]))

static const struct {
  flex_backend be;
  const char *arch;
  int dt; /* tl_dtypes index */
} paths[] = {{FLEX_BACKEND_REFERENCE, NULL, 0}, {FLEX_BACKEND_EMU, "sm_80", 0},
             {FLEX_BACKEND_EMU, "sm_90a", 1}, {FLEX_BACKEND_CPU, NULL, 0},
             {FLEX_BACKEND_CPU, NULL, 2}};
#define NPATHS ((int)(sizeof paths / sizeof paths[0]))

/* The whole call's inputs (float64 values rounded to the tested dtype). */
typedef struct Whole {
  TlArr q, k, v, dout, doc, slopes;
  flex_buffer fb[2];
  int nb;
  flex_param prm[2];
} Whole;

static void whole_init(Whole *w, const Mod *m, DLDataType dt) {
  memset(w, 0, sizeof *w);
  int64_t qs[4] = {B, H, L, E}, ks[4] = {B, HKV, L, E}, ds[1] = {L}, hs[1] = {H};
  tl_arr_init(&w->q, dt, 4, qs), tl_arr_normal(&w->q, &rng);
  tl_arr_init(&w->k, dt, 4, ks), tl_arr_normal(&w->k, &rng);
  tl_arr_init(&w->v, dt, 4, ks), tl_arr_normal(&w->v, &rng);
  tl_arr_init(&w->dout, dt, 4, qs), tl_arr_normal(&w->dout, &rng);
  if (!strcmp(m->name, "document")) {
    tl_arr_init(&w->doc, rt_dtype(kDLInt, 32), 1, ds);
    int id = 0;
    for (int i = 0; i < L; i++) { /* random documents, one across both shard cuts (37, 50) */
      if (i && (i < 30 || i > 60) && tl_uniform(&rng) < 0.08) id++;
      rt_array_set(&w->doc.a, i, id);
    }
    w->fb[w->nb++] = (flex_buffer){"doc", &w->doc.t, NULL};
  }
  if (!strcmp(m->name, "alibi_gqa")) {
    tl_arr_init(&w->slopes, F32, 1, hs), tl_arr_uniform(&w->slopes, 0.05, 0.5, &rng);
    w->fb[w->nb++] = (flex_buffer){"slopes", &w->slopes.t, NULL};
  }
  if (!strcmp(m->name, "sink_window")) { /* the grad buffer in `slopes`' place: the sinks */
    tl_arr_init(&w->slopes, F32, 1, hs), tl_arr_uniform(&w->slopes, -1.0, 3.0, &rng);
    w->fb[w->nb++] = (flex_buffer){"sinks", &w->slopes.t, NULL};
  }
}

static void whole_free(Whole *w) {
  TlArr *all[] = {&w->q, &w->k, &w->v, &w->dout, &w->doc, &w->slopes};
  for (int i = 0; i < 6; i++) tl_arr_free(all[i]);
}

/* A rows [r0, r1) view of a [B, heads, L, dim] tensor (strides of t). */
static DLTensor rows(const TlArr *t, int64_t shape[4], int64_t strides[4], int r0, int r1) {
  DLTensor v = t->t;
  int64_t st = 1;
  for (int d = 3; d >= 0; d--) strides[d] = st, st *= t->t.shape[d];
  for (int d = 0; d < 4; d++) shape[d] = t->t.shape[d];
  shape[2] = r1 - r0;
  v.shape = shape, v.strides = strides;
  v.byte_offset = (uint64_t)(r0 * strides[2]) * (t->t.dtype.bits / 8);
  return v;
}

/* Call arguments of `be` over views; outputs are given by the caller. */
static flex_args args(const Mod *m, flex_backend be, const char *arch, Whole *w) {
  flex_args a = {.backend = be, .arch = arch, .buffers = w->fb, .nbuffers = w->nb};
  if (m->dropout) a.dropout_p = 0.25f, a.dropout_seed = 1234567, a.dropout_offset = 89;
  return a;
}

static double err(const TlArr *x, const TlArr *ref) { return tl_rel_err(&x->a, &ref->a); }

/* The whole call and the merged shard pairs on one path, compared. */
static void one(const Mod *m, int pi) {
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, m->name, m->src, strlen(m->src), NULL) == FLEX_OK, "%s",
                flex_last_error());
  const TlDtype *td = &tl_dtypes[paths[pi].dt];
  flex_backend be = paths[pi].be;
  DLDataType dt = be == FLEX_BACKEND_REFERENCE ? F64 : rt_dtype(td->code, td->bits);
  DLDataType od = be == FLEX_BACKEND_REFERENCE ? F64 : F32;
  Whole w;
  whole_init(&w, m, dt);
  int64_t qs[4] = {B, H, L, E}, ks[4] = {B, HKV, L, E}, ls[3] = {B, H, L}, hs[1] = {H};
  /* the whole call: out, lse, dq, dk, dv, d_slopes */
  TlArr ref[6], got[6];
  const int64_t *shp[6] = {qs, ls, qs, ks, ks, hs};
  const int nd[6] = {4, 3, 4, 4, 4, 1};
  for (int i = 0; i < 6; i++) {
    tl_arr_init(&ref[i], i == 1 && be != FLEX_BACKEND_REFERENCE ? F32 : od, nd[i], shp[i]);
    tl_arr_init(&got[i], i == 1 && be != FLEX_BACKEND_REFERENCE ? F32 : od, nd[i], shp[i]);
    tl_arr_poison(&ref[i]);
  }
  bool slopes = w.slopes.a.data != NULL;
  if (slopes) w.fb[w.nb - 1].grad = &ref[5].t;
  flex_args a = args(m, be, paths[pi].arch, &w);
  a.q = &w.q.t, a.k = &w.k.t, a.v = &w.v.t, a.dout = &w.dout.t;
  a.out = &ref[0].t, a.lse = &ref[1].t, a.dq = &ref[2].t, a.dk = &ref[3].t, a.dv = &ref[4].t;
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK && flex_backward(k, &a) == FLEX_OK, "%s: %s", m->name,
                flex_last_error());
  /* the pairs: forward into per-pair O and LSE, merged by LSE into got[0], got[1] */
  for (int i = 2; i < 6; i++)
    for (int64_t e = 0; e < rt_array_count(&got[i].a); e++) rt_array_set(&got[i].a, e, 0);
  for (int a0 = 0; a0 < 2; a0++) {
    int q0 = qcut[a0], q1 = qcut[a0 + 1], nq = q1 - q0;
    int64_t po[4] = {B, H, nq, E}, pl[3] = {B, H, nq};
    TlArr pout[2], plse[2];
    for (int b0 = 0; b0 < 2; b0++) {
      int k0 = kcut[b0], k1 = kcut[b0 + 1];
      int64_t s[4][4], t[4][4];
      DLTensor vq = rows(&w.q, s[0], t[0], q0, q1), vk = rows(&w.k, s[1], t[1], k0, k1);
      DLTensor vv = rows(&w.v, s[2], t[2], k0, k1);
      tl_arr_init(&pout[b0], od, 4, po), tl_arr_init(&plse[b0], got[1].t.dtype, 3, pl);
      tl_arr_poison(&pout[b0]), tl_arr_poison(&plse[b0]);
      flex_args p = args(m, be, paths[pi].arch, &w);
      p.q = &vq, p.k = &vk, p.v = &vv, p.out = &pout[b0].t, p.lse = &plse[b0].t;
      p.q_offset = q0, p.kv_offset = k0, p.q_len_total = L, p.kv_len_total = L;
      ck_assert_msg(flex_forward(k, &p) == FLEX_OK, "%s pair %d,%d: %s", m->name, a0, b0,
                    flex_last_error());
    }
    for (int h = 0; h < H; h++)
      for (int i = 0; i < nq; i++) {
        double l0 = rt_array_get(&plse[0].a, h * nq + i), l1 = rt_array_get(&plse[1].a, h * nq + i);
        double mx = l0 > l1 ? l0 : l1, lse = mx == -INFINITY ? -INFINITY : mx + log(exp(l0 - mx) + exp(l1 - mx));
        rt_array_set(&got[1].a, h * L + q0 + i, lse);
        for (int e = 0; e < E; e++) {
          double o = 0;
          for (int j = 0; j < 2; j++) {
            double lj = j ? l1 : l0;
            if (lj > -INFINITY) o += exp(lj - lse) * rt_array_get(&pout[j].a, (h * nq + i) * E + e);
          }
          rt_array_set(&got[0].a, (h * L + q0 + i) * E + e, o);
        }
      }
    for (int j = 0; j < 2; j++) tl_arr_free(&pout[j]), tl_arr_free(&plse[j]);
  }
  /* the pairs' backward, from the merged O and LSE, added up */
  for (int a0 = 0; a0 < 2; a0++)
    for (int b0 = 0; b0 < 2; b0++) {
      int q0 = qcut[a0], q1 = qcut[a0 + 1], k0 = kcut[b0], k1 = kcut[b0 + 1];
      int64_t s[8][4], t[8][4];
      DLTensor vq = rows(&w.q, s[0], t[0], q0, q1), vk = rows(&w.k, s[1], t[1], k0, k1);
      DLTensor vv = rows(&w.v, s[2], t[2], k0, k1), vdo = rows(&w.dout, s[3], t[3], q0, q1);
      DLTensor vo = rows(&got[0], s[4], t[4], q0, q1);
      DLTensor vl = got[1].t;
      int64_t lsh[3] = {B, H, q1 - q0}, lst[3] = {(int64_t)H * L, L, 1};
      vl.shape = lsh, vl.strides = lst, vl.byte_offset = (uint64_t)q0 * (vl.dtype.bits / 8);
      int64_t gq[4] = {B, H, q1 - q0, E}, gk[4] = {B, HKV, k1 - k0, E};
      TlArr dq, dk, dv, ds;
      tl_arr_init(&dq, od, 4, gq), tl_arr_init(&dk, od, 4, gk), tl_arr_init(&dv, od, 4, gk);
      tl_arr_init(&ds, od, 1, hs), tl_arr_poison(&ds);
      flex_args p = args(m, be, paths[pi].arch, &w);
      if (slopes) w.fb[w.nb - 1].grad = &ds.t;
      p.q = &vq, p.k = &vk, p.v = &vv, p.dout = &vdo, p.out = &vo, p.lse = &vl;
      p.dq = &dq.t, p.dk = &dk.t, p.dv = &dv.t;
      p.q_offset = q0, p.kv_offset = k0, p.q_len_total = L, p.kv_len_total = L;
      ck_assert_msg(flex_backward(k, &p) == FLEX_OK, "%s pair backward: %s", m->name, flex_last_error());
      for (int h = 0; h < H; h++)
        for (int i = 0; i < q1 - q0; i++)
          for (int e = 0; e < E; e++) {
            int64_t at = (h * L + q0 + i) * E + e;
            rt_array_set(&got[2].a, at, rt_array_get(&got[2].a, at) + rt_array_get(&dq.a, (h * (q1 - q0) + i) * E + e));
          }
      for (int h = 0; h < HKV; h++)
        for (int j = 0; j < k1 - k0; j++)
          for (int e = 0; e < E; e++) {
            int64_t at = (h * L + k0 + j) * E + e, from = (h * (k1 - k0) + j) * E + e;
            rt_array_set(&got[3].a, at, rt_array_get(&got[3].a, at) + rt_array_get(&dk.a, from));
            rt_array_set(&got[4].a, at, rt_array_get(&got[4].a, at) + rt_array_get(&dv.a, from));
          }
      for (int h = 0; slopes && h < H; h++)
        rt_array_set(&got[5].a, h, rt_array_get(&got[5].a, h) + rt_array_get(&ds.a, h));
      tl_arr_free(&dq), tl_arr_free(&dk), tl_arr_free(&dv), tl_arr_free(&ds);
    }
  double e[6];
  for (int i = 0; i < 6; i++) e[i] = i == 5 && !slopes ? 0 : err(&got[i], &ref[i]);
  fprintf(stderr, "  %-15s %-9s %-6s %s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e dbuf %.1e\n",
          m->name, flex_backend_name(be), paths[pi].arch ? paths[pi].arch : "", td->name, e[0], e[1],
          e[2], e[3], e[4], e[5]);
  /* the merge and the sums are float64 here, so the shards' error is the backend's own */
  double tol = be == FLEX_BACKEND_REFERENCE ? 1e-7 : td->tol, gtol = be == FLEX_BACKEND_REFERENCE ? 1e-6 : td->gtol;
  for (int i = 0; i < 6; i++)
    ck_assert_msg(e[i] <= (i < 2 ? tol : gtol), "%s on %s %s: output %d, sharded against whole: %g",
                  m->name, flex_backend_name(be), td->name, i, e[i]);
  for (int i = 0; i < 6; i++) tl_arr_free(&ref[i]), tl_arr_free(&got[i]);
  whole_free(&w);
  flex_kernel_free(k);
}

START_TEST(sharded_equals_whole) {
  const int mi = _i / NPATHS, pi = _i % NPATHS;
  if (!flex_backend_available(paths[pi].be)) return;
  one(&mods[mi], pi);
}
END_TEST

/* Causal, keys all after the queries' positions: the pair is empty. The
 * kernels visit no tile (the analysis classifies the whole pair with the
 * offsets), O = 0 and LSE = -inf; and a BlockMask built for the shard is
 * the shard's: empty. */
START_TEST(empty_pair_visits_no_tile) {
  flex_kernel *k = NULL;
  const char *src = "mask m(b, h, q, kv) { return q >= kv; }\n";
  ck_assert(flex_kernel_from_source(&k, "causal", src, strlen(src), NULL) == FLEX_OK);
  int64_t qs[4] = {1, 2, 64, 16}, ls[3] = {1, 2, 64};
  TlArr q, kk, v, out, lse;
  tl_arr_init(&q, F32, 4, qs), tl_arr_normal(&q, &rng);
  tl_arr_init(&kk, F32, 4, qs), tl_arr_normal(&kk, &rng);
  tl_arr_init(&v, F32, 4, qs), tl_arr_normal(&v, &rng);
  tl_arr_init(&out, F32, 4, qs), tl_arr_init(&lse, F32, 3, ls);
  flex_args a = {.backend = FLEX_BACKEND_EMU, .q = &q.t, .k = &kk.t, .v = &v.t, .out = &out.t,
                 .lse = &lse.t, .q_offset = 0, .kv_offset = 64, .q_len_total = 128,
                 .kv_len_total = 128};
  tl_arr_poison(&out), tl_arr_poison(&lse);
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "%s", flex_last_error());
  ck_assert_int_eq(rt_run_last_stats().fwd_tiles, 0);
  for (int64_t i = 0; i < rt_array_count(&out.a); i++) ck_assert(rt_array_get(&out.a, i) == 0);
  for (int64_t i = 0; i < rt_array_count(&lse.a); i++) ck_assert(rt_array_get(&lse.a, i) == -INFINITY);
  /* the diagonal pair: half its tiles */
  a.kv_offset = 0;
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "%s", flex_last_error());
  ck_assert(rt_run_last_stats().fwd_tiles > 0);
  flex_mask_class cls;
  flex_args e = {.kv_offset = 64, .q_len_total = 128, .kv_len_total = 128};
  ck_assert(flex_mask_classify(k, &e, 1, 2, 64, 64, &cls) == FLEX_OK && cls == FLEX_MASK_EMPTY);
  e.kv_offset = 0, e.q_offset = 64;
  ck_assert(flex_mask_classify(k, &e, 1, 2, 64, 64, &cls) == FLEX_OK && cls == FLEX_MASK_FULL);
  e.q_offset = 0;
  ck_assert(flex_mask_classify(k, &e, 1, 2, 64, 64, &cls) == FLEX_OK && cls == FLEX_MASK_PARTIAL);
  flex_block_mask *bm = NULL;
  flex_mask_stats st;
  flex_args s = {.q_offset = 0, .kv_offset = 256, .q_len_total = 512, .kv_len_total = 512};
  ck_assert_msg(flex_block_mask_create(&bm, k, &s, 1, 1, 256, 256, 128, 128, &st) == FLEX_OK, "%s",
                flex_last_error());
  ck_assert_int_eq(st.empty, st.total);
  flex_block_mask_free(bm);
  s.kv_offset = 0, s.q_offset = 256;
  ck_assert(flex_block_mask_create(&bm, k, &s, 1, 1, 256, 256, 128, 128, &st) == FLEX_OK);
  ck_assert_int_eq(st.full, st.total); /* every key before every query */
  flex_block_mask_free(bm);
  TlArr *all[] = {&q, &kk, &v, &out, &lse};
  for (int i = 0; i < 5; i++) tl_arr_free(all[i]);
  flex_kernel_free(k);
}
END_TEST

START_TEST(bad_offsets_refused) {
  flex_kernel *k = NULL;
  const char *src = "mask m(b, h, q, kv) { return q >= kv; }\n";
  ck_assert(flex_kernel_from_source(&k, "causal", src, strlen(src), NULL) == FLEX_OK);
  int64_t qs[4] = {1, 2, 8, 16}, ls[3] = {1, 2, 8};
  TlArr q, out, lse;
  tl_arr_init(&q, F32, 4, qs), tl_arr_normal(&q, &rng);
  tl_arr_init(&out, F32, 4, qs), tl_arr_init(&lse, F32, 3, ls);
  static const struct {
    int64_t qo, ko, qt, kt;
    const char *want;
  } bad[] = {
      {-1, 0, 16, 16, "q_offset must be >= 0, got -1"},
      {4, 0, 0, 0, "q_offset 4 needs q_len_total"},
      {0, 10, 16, 16, "the shard's rows 10..17 of k and v (kv_offset 10 + 8 rows) lie past kv_len_total = 16"},
      {0, 0, 4, 0, "lie past q_len_total = 4"},
      {0, 0, 3000000000LL, 8, "positions must fit in int32"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tl_arr_poison(&out);
    flex_args a = {.backend = FLEX_BACKEND_REFERENCE, .q = &q.t, .k = &q.t, .v = &q.t, .out = &out.t,
                   .lse = &lse.t, .q_offset = bad[i].qo, .kv_offset = bad[i].ko,
                   .q_len_total = bad[i].qt, .kv_len_total = bad[i].kt};
    ck_assert_int_eq(flex_forward(k, &a), FLEX_ERR_INVALID);
    ck_assert_msg(strstr(flex_last_error(), bad[i].want), "'%s' lacks '%s'", flex_last_error(), bad[i].want);
    ck_assert(isnan(rt_array_get(&out.a, 0)));
  }
  tl_arr_free(&q), tl_arr_free(&out), tl_arr_free(&lse);
  flex_kernel_free(k);
}
END_TEST

int main(void) {
  rng = tl_seed();
  return TL_MAIN("offsets", 1200, TL_LOOP(sharded_equals_whole, NMODS * NPATHS),
                 TL_TEST(empty_pair_visits_no_tile), TL_TEST(bad_offsets_refused));
}
