/* Packed variable-length batches (cu_seqlens; docs/language.md, docs/varlen.md).
 *
 * Numerics: a packed call on the reference and on the emulator against the
 * same sequences run one by one as ordinary (padded, B = 1) calls on the
 * float64 reference, forward and backward, fp32/fp16/bf16, GQA, with fresh
 * random lengths every run (the seed is printed; FLEXC_SEED repeats a run):
 * lengths 0, 1, odd, queries without keys, keys without queries, and one
 * sequence about 30x longer than the others. The kernels read `b` through a
 * per-sequence buffer (score bias, sliding-window width: a classifier that
 * ignored the sequence offset would skip the wrong blocks), per-token data
 * through Q_START/KV_START into [TOTAL_Q]/[TOTAL_KV] buffers (document
 * mask), lower-right causal masks through Q_LEN/KV_LEN, and `grad` buffers
 * shared by every sequence (gradients summed) and per token. Every output
 * is poisoned with NaN first; NaN never passes.
 * With equal lengths, the packed call also equals one ordinary B-batch call
 * over a 4-D view of the same memory (the padded call, exactly).
 * Validation: every row of docs/varlen.md's table, message checked.
 * --cuda runs the per-sequence comparison on the GPU (fp16 and bf16, every
 * case, outputs in q's dtype); it exits 77 where there is no CUDA device. */
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
/* Values forced into the int buffers (0 entries: random). */
static int nforce, force[16];

typedef enum BufKind { PER_B, PER_TQ, PER_TK, SHARED_H } BufKind;
typedef struct BufSpec {
  const char *name;
  BufKind kind;
  int type; /* 0: f32 normal, 1: i32 in [lo, hi], 2: i32 sorted document ids */
  int lo, hi;
  bool grad;
} BufSpec;

typedef struct Case {
  const char *name;
  const char *src;
  int nbufs;
  BufSpec bufs[3];
} Case;

static const Case cases[] = {
    {"causal_bias_b",
     "buffer sb: f32[B];\n"
     "score sc(s, b, h, q, kv) { return s + sb[b]; }\n"
     "mask causal(b, h, q, kv) { return q >= kv; }\n",
     1, {{"sb", PER_B, 0, 0, 0, false}}},
    {"lower_right_causal",
     "mask lr(b, h, q, kv) { return q + KV_LEN - Q_LEN >= kv; }\n", 0, {{0}}},
    {"sliding_window_b",
     "buffer win: i32[B];\n"
     "mask sw(b, h, q, kv) { let d = q + KV_LEN - Q_LEN - kv; return d >= 0 && d < win[b]; }\n",
     1, {{"win", PER_B, 1, 1, 40, false}}},
    {"document",
     "buffer dq: i32[TOTAL_Q] sorted;\nbuffer dkv: i32[TOTAL_KV] sorted;\n"
     "mask doc(b, h, q, kv) { return dq[Q_START + q] == dkv[KV_START + kv]; }\n",
     2, {{"dq", PER_TQ, 2, 0, 0, false}, {"dkv", PER_TK, 2, 0, 0, false}}},
    {"grad_buffers",
     "buffer hb: f32[H] grad;\nbuffer tb: f32[TOTAL_KV] grad;\n"
     "score sc(s, b, h, q, kv) { return s * (1.0 + 0.25 * hb[h]) + tb[KV_START + kv]; }\n",
     2, {{"hb", SHARED_H, 0, 0, 0, true}, {"tb", PER_TK, 0, 0, 0, true}}},
    /* not decidable (`keep` is not sorted): every sequence's BlockMask is
     * built on the device, a sequence without queries included */
    {"built_mask",
     "buffer keep: i32[TOTAL_KV];\n"
     "mask m(b, h, q, kv) { return keep[KV_START + kv] != 0 || q >= kv; }\n",
     1, {{"keep", PER_TK, 1, 0, 1, false}}},
};
enum { NCASES = sizeof cases / sizeof *cases };

/* Rows [start, start + len) of a packed (TOTAL, heads, dim) tensor as [1, heads, len, dim]. */
static DLTensor view4(const DLTensor *t, int64_t shape[4], int64_t st[4], int64_t start, int64_t len) {
  DLTensor v = *t;
  int64_t es = t->dtype.bits / 8, srow = t->shape[1] * t->shape[2], sh = t->shape[2];
  shape[0] = 1, shape[1] = t->shape[1], shape[2] = len, shape[3] = t->shape[2];
  st[0] = 0, st[1] = sh, st[2] = srow, st[3] = 1;
  v.ndim = 4, v.shape = shape, v.strides = st;
  v.byte_offset = (uint64_t)(start * srow * es);
  return v;
}

/* Columns [start, start + len) of a packed (H, TOTAL_Q) lse as [1, H, len]. */
static DLTensor view_lse(const DLTensor *t, int64_t shape[3], int64_t st[3], int64_t start, int64_t len) {
  DLTensor v = *t;
  int64_t es = t->dtype.bits / 8;
  shape[0] = 1, shape[1] = t->shape[0], shape[2] = len;
  st[0] = 0, st[1] = t->shape[1], st[2] = 1;
  v.ndim = 3, v.shape = shape, v.strides = st;
  v.byte_offset = (uint64_t)(start * es);
  return v;
}

/* Elements [start, start + len) of a 1-D tensor. */
static DLTensor view1(const DLTensor *t, int64_t shape[1], int64_t start, int64_t len) {
  DLTensor v = *t;
  shape[0] = len;
  v.shape = shape;
  v.strides = NULL;
  v.byte_offset = (uint64_t)(start * (t->dtype.bits / 8));
  return v;
}

typedef struct Lens {
  int n;
  int q[16], k[16];
} Lens;

/* Random lengths: 0, 1, odd ones, a query sequence without keys, keys
 * without queries, one sequence about 30x longer than the others. */
static Lens random_lens(int n, int small, bool self) {
  Lens L;
  L.n = n;
  for (int i = 0; i < n; i++) {
    L.q[i] = 1 + 2 * (int)(tl_rand(&rng) % (uint64_t)(small / 2 + 1)); /* odd */
    L.k[i] = self ? L.q[i] : 1 + (int)(tl_rand(&rng) % (uint64_t)(small + 1));
  }
  int z = (int)(tl_rand(&rng) % (uint64_t)n), one = (z + 1) % n, big = (z + 2) % n;
  L.q[z] = 0;           /* no queries (its keys get zero gradients) */
  if (!self) L.k[one] = 0; /* queries without keys: O = 0, LSE = -inf */
  L.q[one] = 1;
  L.q[big] = 30 * small + 1;
  L.k[big] = self ? L.q[big] : 30 * small + (int)(tl_rand(&rng) % 7);
  return L;
}

typedef struct Run {
  const Case *cs;
  flex_kernel *k;
  Lens L;
  int H, HKV, E, TQ, TK;
  int cq[17], ck[17];
  TlArr cuq, cuk;
  TlPair q, kk, v, dout;
  TlArr bufs[3];    /* declared dtype (int buffers are exact in both) */
  TlArr bufs64[3];  /* float64 twins of float buffers, for the reference */
  flex_buffer fb[3], fbref[3];
} Run;

static void run_init(Run *r, const Case *cs, const Lens *L, DLDataType dt, int H, int HKV, int E) {
  memset(r, 0, sizeof *r);
  r->cs = cs;
  r->L = *L;
  r->H = H, r->HKV = HKV, r->E = E;
  ck_assert_msg(flex_kernel_from_source(&r->k, cs->name, cs->src, strlen(cs->src), NULL) == FLEX_OK,
                "%s", flex_last_error());
  r->cq[0] = r->ck[0] = 0;
  for (int i = 0; i < L->n; i++) r->cq[i + 1] = r->cq[i] + L->q[i], r->ck[i + 1] = r->ck[i] + L->k[i];
  r->TQ = r->cq[L->n], r->TK = r->ck[L->n];
  int64_t nb = L->n + 1;
  tl_arr_init(&r->cuq, rt_dtype(kDLInt, 32), 1, &nb);
  tl_arr_init(&r->cuk, rt_dtype(kDLInt, 32), 1, &nb);
  memcpy(r->cuq.a.data, r->cq, sizeof(int32_t) * (size_t)nb);
  memcpy(r->cuk.a.data, r->ck, sizeof(int32_t) * (size_t)nb);
  int64_t qs[3] = {r->TQ, H, E}, ks[3] = {r->TK, HKV, E};
  tl_pair_init(&r->q, dt, 3, qs, true, &rng);
  tl_pair_init(&r->kk, dt, 3, ks, true, &rng);
  tl_pair_init(&r->v, dt, 3, ks, true, &rng);
  tl_pair_init(&r->dout, dt, 3, qs, true, &rng);
  for (int j = 0; j < cs->nbufs; j++) {
    const BufSpec *b = &cs->bufs[j];
    int64_t n = b->kind == PER_B ? L->n : b->kind == PER_TQ ? r->TQ : b->kind == PER_TK ? r->TK : H;
    DLDataType bt = b->type ? rt_dtype(kDLInt, 32) : rt_dtype(kDLFloat, 32);
    tl_arr_init(&r->bufs[j], bt, 1, &n);
    tl_arr_init(&r->bufs64[j], b->type ? bt : rt_dtype(kDLFloat, 64), 1, &n);
    int32_t id = 0;
    for (int64_t i = 0; i < n; i++) {
      double x;
      if (b->type == 0) x = 0.5 * tl_normal(&rng);
      else if (b->type == 1 && i < nforce) x = force[i];
      else if (b->type == 1) x = b->lo + (int)(tl_rand(&rng) % (uint64_t)(b->hi - b->lo + 1));
      else x = (id += (tl_rand(&rng) % 5 == 0));
      rt_array_set(&r->bufs[j].a, i, x);
      rt_array_set(&r->bufs64[j].a, i, rt_array_get(&r->bufs[j].a, i));
    }
    r->fb[j] = (flex_buffer){b->name, &r->bufs[j].t, NULL};
  }
}

static void run_free(Run *r) {
  tl_arr_free(&r->cuq), tl_arr_free(&r->cuk);
  tl_pair_free(&r->q), tl_pair_free(&r->kk), tl_pair_free(&r->v), tl_pair_free(&r->dout);
  for (int j = 0; j < 3; j++) tl_arr_free(&r->bufs[j]), tl_arr_free(&r->bufs64[j]);
  flex_kernel_free(r->k);
}

/* Buffer j of the reference call for sequence b: a slice, or the whole. */
static DLTensor seq_buffer(const Run *r, int j, const DLTensor *t, int64_t shape[1], int b) {
  switch (r->cs->bufs[j].kind) {
  case PER_B: return view1(t, shape, b, 1);
  case PER_TQ: return view1(t, shape, r->cq[b], r->L.q[b]);
  case PER_TK: return view1(t, shape, r->ck[b], r->L.k[b]);
  case SHARED_H: break;
  }
  return *t;
}

static void check_err(const char *what, const RtArray *x, const RtArray *ref, double tol,
                      const Run *r, const char *backend, const char *dt) {
  double e = tl_rel_err(x, ref);
  ck_assert_msg(e <= tol, "%s %s %s H=%d HKV=%d: %s relative error %g > %g (seed printed above)",
                r->cs->name, backend, dt, r->H, r->HKV, what, e, tol);
}

/* The packed call on `be` against the per-sequence reference. */
static void compare(const Case *cs, const Lens *L, flex_backend be, int di, int H, int HKV, int E,
                    bool backward) {
  const TlDtype *td = &tl_dtypes[di];
  static const double tol[3] = {1e-4, 5e-3, 3e-2}, gtol[3] = {1e-3, 2e-2, 6e-2};
  DLDataType dt = {td->code, td->bits, 1};
  Run r;
  run_init(&r, cs, L, dt, H, HKV, E);
  DLDataType f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  DLDataType od = be == FLEX_BACKEND_CUDA ? dt : f32; /* the cuda backend writes q's dtype */
  int64_t os[3] = {r.TQ, H, E}, ls[2] = {H, r.TQ}, ks[3] = {r.TK, HKV, E};
  TlArr out, lse, rout, rlse;
  tl_arr_init(&out, od, 3, os), tl_arr_init(&lse, f32, 2, ls);
  tl_arr_init(&rout, f64, 3, os), tl_arr_init(&rlse, f64, 2, ls);
  tl_arr_poison(&out), tl_arr_poison(&lse), tl_arr_poison(&rout), tl_arr_poison(&rlse);
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = be;
  a.q = &r.q.tx, a.k = &r.kk.tx, a.v = &r.v.tx, a.out = &out.t, a.lse = &lse.t;
  a.cu_seqlens_q = &r.cuq.t, a.cu_seqlens_kv = &r.cuk.t;
  a.buffers = r.fb, a.nbuffers = cs->nbufs;
  ck_assert_msg(tl_call(r.k, &a, false) == FLEX_OK, "%s: %s", cs->name, flex_last_error());
  /* the reference, sequence by sequence, as ordinary calls */
  for (int b = 0; b < L->n; b++) {
    int64_t sh[8][4], st[8][4], bs[3][1];
    DLTensor q = view4(&r.q.tref, sh[0], st[0], r.cq[b], L->q[b]);
    DLTensor k = view4(&r.kk.tref, sh[1], st[1], r.ck[b], L->k[b]);
    DLTensor v = view4(&r.v.tref, sh[2], st[2], r.ck[b], L->k[b]);
    DLTensor o = view4(&rout.t, sh[3], st[3], r.cq[b], L->q[b]);
    DLTensor l = view_lse(&rlse.t, sh[4], st[4], r.cq[b], L->q[b]);
    DLTensor bt[3];
    flex_buffer fb[3];
    for (int j = 0; j < cs->nbufs; j++) {
      bt[j] = seq_buffer(&r, j, &r.bufs[j].t, bs[j], b);
      fb[j] = (flex_buffer){cs->bufs[j].name, &bt[j], NULL};
    }
    flex_args ra;
    memset(&ra, 0, sizeof ra);
    ra.backend = FLEX_BACKEND_REFERENCE;
    ra.q = &q, ra.k = &k, ra.v = &v, ra.out = &o, ra.lse = &l;
    ra.buffers = fb, ra.nbuffers = cs->nbufs;
    ck_assert_msg(flex_forward(r.k, &ra) == FLEX_OK, "%s ref seq %d: %s", cs->name, b, flex_last_error());
  }
  const char *bn = flex_backend_name(be);
  /* The forward's errors are asserted after the backward ran: a case
   * compiles the same kernels whatever its results (the GPU run's cache
   * is filled by running it over a stand-in driver). */
  if (backward) {
    TlArr dq, dk, dv, rdq, rdk, rdv, g[3], rg[3], tmp;
    tl_arr_init(&dq, od, 3, os), tl_arr_init(&dk, od, 3, ks), tl_arr_init(&dv, od, 3, ks);
    tl_arr_init(&rdq, f64, 3, os), tl_arr_init(&rdk, f64, 3, ks), tl_arr_init(&rdv, f64, 3, ks);
    tl_arr_poison(&dq), tl_arr_poison(&dk), tl_arr_poison(&dv);
    memset(g, 0, sizeof g), memset(rg, 0, sizeof rg);
    for (int j = 0; j < cs->nbufs; j++)
      if (cs->bufs[j].grad) {
        tl_arr_init(&g[j], f32, 1, r.bufs[j].a.shape);
        tl_arr_init(&rg[j], f64, 1, r.bufs[j].a.shape);
        tl_arr_poison(&g[j]);
        r.fb[j].grad = &g[j].t;
      }
    a.dout = &r.dout.tx, a.dq = &dq.t, a.dk = &dk.t, a.dv = &dv.t;
    ck_assert_msg(tl_call(r.k, &a, true) == FLEX_OK, "%s bwd: %s", cs->name, flex_last_error());
    int64_t hs = H;
    tl_arr_init(&tmp, f64, 1, &hs);
    for (int b = 0; b < L->n; b++) {
      int64_t sh[10][4], st[10][4], bs[3][1], gs[3][1];
      DLTensor q = view4(&r.q.tref, sh[0], st[0], r.cq[b], L->q[b]);
      DLTensor k = view4(&r.kk.tref, sh[1], st[1], r.ck[b], L->k[b]);
      DLTensor v = view4(&r.v.tref, sh[2], st[2], r.ck[b], L->k[b]);
      DLTensor o = view4(&rout.t, sh[3], st[3], r.cq[b], L->q[b]);
      DLTensor l = view_lse(&rlse.t, sh[4], st[4], r.cq[b], L->q[b]);
      DLTensor d = view4(&r.dout.tref, sh[5], st[5], r.cq[b], L->q[b]);
      DLTensor gq = view4(&rdq.t, sh[6], st[6], r.cq[b], L->q[b]);
      DLTensor gk = view4(&rdk.t, sh[7], st[7], r.ck[b], L->k[b]);
      DLTensor gv = view4(&rdv.t, sh[8], st[8], r.ck[b], L->k[b]);
      DLTensor bt[3], gt[3];
      flex_buffer fb[3];
      for (int j = 0; j < cs->nbufs; j++) {
        bt[j] = seq_buffer(&r, j, &r.bufs[j].t, bs[j], b);
        fb[j] = (flex_buffer){cs->bufs[j].name, &bt[j], NULL};
        if (!cs->bufs[j].grad) continue;
        gt[j] = cs->bufs[j].kind == SHARED_H ? tmp.t : seq_buffer(&r, j, &rg[j].t, gs[j], b);
        fb[j].grad = &gt[j];
      }
      flex_args ra;
      memset(&ra, 0, sizeof ra);
      ra.backend = FLEX_BACKEND_REFERENCE;
      ra.q = &q, ra.k = &k, ra.v = &v, ra.out = &o, ra.lse = &l, ra.dout = &d;
      ra.dq = &gq, ra.dk = &gk, ra.dv = &gv;
      ra.buffers = fb, ra.nbuffers = cs->nbufs;
      ck_assert_msg(flex_backward(r.k, &ra) == FLEX_OK, "%s ref bwd seq %d: %s", cs->name, b,
                    flex_last_error());
      for (int j = 0; j < cs->nbufs; j++) /* shared buffers: gradients add up over sequences */
        if (cs->bufs[j].grad && cs->bufs[j].kind == SHARED_H)
          for (int64_t i = 0; i < H; i++)
            rt_array_set(&rg[j].a, i, rt_array_get(&rg[j].a, i) + rt_array_get(&tmp.a, i));
    }
    check_err("out", &out.a, &rout.a, tol[di], &r, bn, td->name);
    check_err("lse", &lse.a, &rlse.a, tol[di], &r, bn, td->name);
    check_err("dq", &dq.a, &rdq.a, gtol[di], &r, bn, td->name);
    check_err("dk", &dk.a, &rdk.a, gtol[di], &r, bn, td->name);
    check_err("dv", &dv.a, &rdv.a, gtol[di], &r, bn, td->name);
    for (int j = 0; j < cs->nbufs; j++)
      if (cs->bufs[j].grad) {
        char what[64];
        snprintf(what, sizeof what, "grad of %s", cs->bufs[j].name);
        check_err(what, &g[j].a, &rg[j].a, gtol[di], &r, bn, td->name);
        tl_arr_free(&g[j]), tl_arr_free(&rg[j]);
      }
    tl_arr_free(&dq), tl_arr_free(&dk), tl_arr_free(&dv), tl_arr_free(&tmp);
    tl_arr_free(&rdq), tl_arr_free(&rdk), tl_arr_free(&rdv);
  } else {
    check_err("out", &out.a, &rout.a, tol[di], &r, bn, td->name);
    check_err("lse", &lse.a, &rlse.a, tol[di], &r, bn, td->name);
  }
  tl_arr_free(&out), tl_arr_free(&lse), tl_arr_free(&rout), tl_arr_free(&rlse);
  run_free(&r);
}

/* ---- numerics ---------------------------------------------------------------------- */

START_TEST(reference_matches_per_sequence) {
  const Case *cs = &cases[_i];
  for (int di = 0; di < 3; di++)
    for (int self = 0; self < 2; self++) {
      Lens L = random_lens(6, 6, self);
      compare(cs, &L, FLEX_BACKEND_REFERENCE, di, di == 1 ? 4 : 2, di == 1 ? 2 : 2, 9, true);
    }
}
END_TEST

START_TEST(emu_matches_per_sequence) {
  if (!flex_backend_available(FLEX_BACKEND_EMU)) return;
  const Case *cs = &cases[_i];
  /* Every case on one dtype a run and every dtype on some case; which
   * dtype a case gets turns with the seed (all three each time took the
   * suite's emulator time from about 20 s to 60 s on 2 cores). */
  int di = (int)((_i + tl_seed() % 3) % 3);
  Lens L = random_lens(5, 2, _i % 2 == 0);
  compare(cs, &L, FLEX_BACKEND_EMU, di, 4, 2, 16, true);
}
END_TEST

/* --cuda: every case in fp16 and bf16 (_i = case * 2 + dtype), GQA. */
START_TEST(cuda_matches_per_sequence) {
  Lens L = random_lens(5, 2, _i / 2 % 2 == 0);
  compare(&cases[_i / 2], &L, FLEX_BACKEND_CUDA, 1 + _i % 2, 4, 2, 64, true);
}
END_TEST

START_TEST(cpu_matches_per_sequence) {
  if (!flex_backend_available(FLEX_BACKEND_CPU)) return;
  const Case *cs = &cases[_i];
  for (int di = 0; di < 3; di++) {
    Lens L = random_lens(5, 4, (_i + di) % 2 == 0);
    compare(cs, &L, FLEX_BACKEND_CPU, di, 4, 2, 16, true);
  }
}
END_TEST

/* ---- against the padded call ------------------------------------------------------- */

/* The same attention written for a padded batch: the lengths come from
 * buffers, and padded queries and keys are masked out. Lower-right causal
 * and a per-head score with a `grad` buffer (gradient summed over the batch
 * in both calls). */
static const char *const PACKED_SRC =
    "buffer hb: f32[H] grad;\n"
    "score sc(s, b, h, q, kv) { return s * (1.0 + 0.25 * hb[h]); }\n"
    "mask lr(b, h, q, kv) { return q + KV_LEN - Q_LEN >= kv; }\n";
static const char *const PADDED_SRC =
    "buffer hb: f32[H] grad;\nbuffer ql: i32[B];\nbuffer kl: i32[B];\n"
    "score sc(s, b, h, q, kv) { return s * (1.0 + 0.25 * hb[h]); }\n"
    "mask lr(b, h, q, kv) { return q < ql[b] && kv < kl[b] && q + kl[b] - ql[b] >= kv; }\n";

/* Packed (TOTAL, heads, dim) rows into a zero-padded [n, heads, L, dim] array, or back. */
static void repack(RtArray *packed, RtArray *padded, const int *start, const int *len, int n,
                   bool to_padded) {
  int64_t heads = packed->shape[1], dim = packed->shape[2], L = padded->shape[2];
  for (int b = 0; b < n; b++)
    for (int64_t h = 0; h < heads; h++)
      for (int64_t r = 0; r < len[b]; r++)
        for (int64_t e = 0; e < dim; e++) {
          int64_t i = ((start[b] + r) * heads + h) * dim + e, j = ((b * heads + h) * L + r) * dim + e;
          if (to_padded) rt_array_set(padded, j, rt_array_get(packed, i));
          else rt_array_set(packed, i, rt_array_get(padded, j));
        }
}

/* Packed (H, TOTAL_Q) lse columns from a padded [n, H, L] one. */
static void unpack_lse(RtArray *packed, const RtArray *padded, const int *start, const int *len, int n) {
  int64_t H = packed->shape[0], T = packed->shape[1], L = padded->shape[2];
  for (int b = 0; b < n; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t r = 0; r < len[b]; r++)
        rt_array_set(packed, h * T + start[b] + r, rt_array_get(padded, (b * H + h) * L + r));
}

/* The packed call on `be` (dtype di) against one padded B-batch call over
 * the same sequences on the float64 reference, forward and backward. */
static void compare_padded(const Lens *L, flex_backend be, int di, int H, int HKV, int E) {
  const TlDtype *td = &tl_dtypes[di];
  static const double tol[3] = {1e-4, 5e-3, 3e-2}, gtol[3] = {1e-3, 2e-2, 6e-2};
  const Case pk = {"packed_lr", PACKED_SRC, 1, {{"hb", SHARED_H, 0, 0, 0, true}}};
  Run r;
  run_init(&r, &pk, L, (DLDataType){td->code, td->bits, 1}, H, HKV, E);
  flex_kernel *kp;
  ck_assert_msg(flex_kernel_from_source(&kp, "padded_lr", PADDED_SRC, strlen(PADDED_SRC), NULL) ==
                    FLEX_OK, "%s", flex_last_error());
  DLDataType f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64), i32 = rt_dtype(kDLInt, 32);
  int n = L->n, LQ = 1, LK = 1;
  for (int b = 0; b < n; b++) LQ = L->q[b] > LQ ? L->q[b] : LQ, LK = L->k[b] > LK ? L->k[b] : LK;
  /* the packed call */
  int64_t os[3] = {r.TQ, H, E}, ls[2] = {H, r.TQ}, ks[3] = {r.TK, HKV, E}, hs = H, nb = n;
  TlArr out, lse, dq, dk, dv, g;
  tl_arr_init(&out, f32, 3, os), tl_arr_init(&lse, f32, 2, ls), tl_arr_init(&dq, f32, 3, os);
  tl_arr_init(&dk, f32, 3, ks), tl_arr_init(&dv, f32, 3, ks), tl_arr_init(&g, f32, 1, &hs);
  TlArr *outs[6] = {&out, &lse, &dq, &dk, &dv, &g};
  for (int i = 0; i < 6; i++) tl_arr_poison(outs[i]);
  r.fb[0].grad = &g.t;
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = be;
  a.q = &r.q.tx, a.k = &r.kk.tx, a.v = &r.v.tx, a.out = &out.t, a.lse = &lse.t;
  a.dout = &r.dout.tx, a.dq = &dq.t, a.dk = &dk.t, a.dv = &dv.t;
  a.cu_seqlens_q = &r.cuq.t, a.cu_seqlens_kv = &r.cuk.t;
  a.buffers = r.fb, a.nbuffers = 1;
  ck_assert_msg(flex_forward(r.k, &a) == FLEX_OK && flex_backward(r.k, &a) == FLEX_OK, "packed: %s",
                flex_last_error());
  /* the padded call, float64 twins of the same values, zero padding */
  int64_t pq[4] = {n, H, LQ, E}, pk4[4] = {n, HKV, LK, E}, pl[3] = {n, H, LQ};
  TlArr q, k, v, dout, po, plse, pdq, pdk, pdv, pg, hb, ql, kl;
  tl_arr_init(&q, f64, 4, pq), tl_arr_init(&k, f64, 4, pk4), tl_arr_init(&v, f64, 4, pk4);
  tl_arr_init(&dout, f64, 4, pq), tl_arr_init(&po, f64, 4, pq), tl_arr_init(&plse, f64, 3, pl);
  tl_arr_init(&pdq, f64, 4, pq), tl_arr_init(&pdk, f64, 4, pk4), tl_arr_init(&pdv, f64, 4, pk4);
  tl_arr_init(&pg, f64, 1, &hs), tl_arr_init(&hb, f32, 1, &hs);
  tl_arr_init(&ql, i32, 1, &nb), tl_arr_init(&kl, i32, 1, &nb);
  repack(&r.q.ref, &q.a, r.cq, L->q, n, true), repack(&r.kk.ref, &k.a, r.ck, L->k, n, true);
  repack(&r.v.ref, &v.a, r.ck, L->k, n, true), repack(&r.dout.ref, &dout.a, r.cq, L->q, n, true);
  for (int64_t i = 0; i < H; i++) rt_array_set(&hb.a, i, rt_array_get(&r.bufs[0].a, i));
  for (int b = 0; b < n; b++) rt_array_set(&ql.a, b, L->q[b]), rt_array_set(&kl.a, b, L->k[b]);
  flex_buffer fb[3] = {{"hb", &hb.t, &pg.t}, {"ql", &ql.t, NULL}, {"kl", &kl.t, NULL}};
  flex_args p;
  memset(&p, 0, sizeof p);
  p.backend = FLEX_BACKEND_REFERENCE;
  p.q = &q.t, p.k = &k.t, p.v = &v.t, p.out = &po.t, p.lse = &plse.t;
  p.dout = &dout.t, p.dq = &pdq.t, p.dk = &pdk.t, p.dv = &pdv.t;
  p.buffers = fb, p.nbuffers = 3;
  ck_assert_msg(flex_forward(kp, &p) == FLEX_OK && flex_backward(kp, &p) == FLEX_OK, "padded: %s",
                flex_last_error());
  /* the padded results at the packed positions */
  TlArr ro, rl, rdq, rdk, rdv;
  tl_arr_init(&ro, f64, 3, os), tl_arr_init(&rl, f64, 2, ls), tl_arr_init(&rdq, f64, 3, os);
  tl_arr_init(&rdk, f64, 3, ks), tl_arr_init(&rdv, f64, 3, ks);
  repack(&ro.a, &po.a, r.cq, L->q, n, false), unpack_lse(&rl.a, &plse.a, r.cq, L->q, n);
  repack(&rdq.a, &pdq.a, r.cq, L->q, n, false), repack(&rdk.a, &pdk.a, r.ck, L->k, n, false);
  repack(&rdv.a, &pdv.a, r.ck, L->k, n, false);
  const char *bn = flex_backend_name(be);
  const Case named = {"against the padded call", NULL, 0, {{0}}};
  r.cs = &named;
  check_err("out", &out.a, &ro.a, tol[di], &r, bn, td->name);
  check_err("lse", &lse.a, &rl.a, tol[di], &r, bn, td->name);
  check_err("dq", &dq.a, &rdq.a, gtol[di], &r, bn, td->name);
  check_err("dk", &dk.a, &rdk.a, gtol[di], &r, bn, td->name);
  check_err("dv", &dv.a, &rdv.a, gtol[di], &r, bn, td->name);
  check_err("grad of hb", &g.a, &pg.a, gtol[di], &r, bn, td->name);
  TlArr *all[] = {&out, &lse, &dq, &dk, &dv, &g, &q, &k, &v, &dout, &po, &plse, &pdq, &pdk,
                  &pdv, &pg, &hb, &ql, &kl, &ro, &rl, &rdq, &rdk, &rdv};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tl_arr_free(all[i]);
  flex_kernel_free(kp);
  run_free(&r);
}

/* _i: the backend (reference: every dtype, GQA and not; emu, cpu: small shapes). */
START_TEST(packed_matches_padded_call) {
  static const flex_backend bes[3] = {FLEX_BACKEND_REFERENCE, FLEX_BACKEND_EMU, FLEX_BACKEND_CPU};
  flex_backend be = bes[_i];
  if (!flex_backend_available(be)) return;
  int pick = (int)(tl_rand(&rng) % 3); /* the emulator's dtype this run */
  for (int di = 0; di < 3; di++) {
    bool ref = be == FLEX_BACKEND_REFERENCE;
    if (be == FLEX_BACKEND_EMU && di != pick) continue;
    Lens L = random_lens(ref ? 6 : 5, ref ? 6 : 2, di % 2 == 1);
    compare_padded(&L, be, di, 4, ref && di == 0 ? 4 : 2, ref ? 9 : 16);
  }
}
END_TEST

/* The block classifier sees the sequence: sequence 0 has a window of 1,
 * sequence 1 (200 queries and keys, several tiles) a window of 500. A
 * classifier that read win[0] for sequence 1 would call its blocks below
 * the diagonal empty and skip them. */
START_TEST(emu_classifier_sees_sequence) {
  if (!flex_backend_available(FLEX_BACKEND_EMU)) return;
  Lens L = {2, {3, 200}, {3, 200}};
  nforce = 2, force[0] = 1, force[1] = 500;
  compare(&cases[2], &L, FLEX_BACKEND_EMU, 0, 2, 1, 8, _i == 1);
  nforce = 0;
}
END_TEST

/* A sequence with keys and no queries under a mask built on the device:
 * it has no query blocks, so nothing of its mask is built (one block of
 * the builder once wrote a row past its arrays; with over four key blocks
 * the write left the allocation, which the emulator's bounds check sees). */
START_TEST(emu_built_mask_no_queries) {
  if (!flex_backend_available(FLEX_BACKEND_EMU)) return;
  Lens L = {3, {0, 7, 0}, {700, 9, 300}};
  compare(&cases[NCASES - 1], &L, FLEX_BACKEND_EMU, 0, 2, 1, 8, true);
}
END_TEST

/* Equal lengths: the packed call is one ordinary call over a [B, H, L, E]
 * view of the same memory (the padded call), bit for bit on the reference. */
START_TEST(equal_lengths_equal_padded_call) {
  const Case *cs = &cases[_i == 0 ? 0 : 2];
  int n = 3, len = 5 + 2 * (int)(tl_rand(&rng) % 4);
  Lens L;
  L.n = n;
  for (int i = 0; i < n; i++) L.q[i] = L.k[i] = len;
  Run r;
  run_init(&r, cs, &L, rt_dtype(kDLFloat, 32), 2, 1, 8);
  DLDataType f64 = rt_dtype(kDLFloat, 64);
  int64_t os[3] = {r.TQ, 2, 8}, ls[2] = {2, r.TQ};
  TlArr out, lse, pout, plse;
  tl_arr_init(&out, f64, 3, os), tl_arr_init(&lse, f64, 2, ls);
  tl_arr_init(&pout, f64, 3, os), tl_arr_init(&plse, f64, 2, ls);
  tl_arr_poison(&out), tl_arr_poison(&lse), tl_arr_poison(&pout), tl_arr_poison(&plse);
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = FLEX_BACKEND_REFERENCE;
  a.q = &r.q.tx, a.k = &r.kk.tx, a.v = &r.v.tx, a.out = &out.t, a.lse = &lse.t;
  a.cu_seqlens_q = &r.cuq.t, a.cu_seqlens_kv = &r.cuk.t;
  a.buffers = r.fb, a.nbuffers = cs->nbufs;
  ck_assert_msg(flex_forward(r.k, &a) == FLEX_OK, "%s", flex_last_error());
  /* the padded call: [n, heads, len, dim] views of the packed memory */
  int64_t sh[5][4], st[5][4];
  const DLTensor *src[4] = {&r.q.tx, &r.kk.tx, &r.v.tx, &pout.t};
  DLTensor w[5];
  for (int i = 0; i < 4; i++) {
    w[i] = *src[i];
    int64_t heads = src[i]->shape[1], dim = src[i]->shape[2];
    sh[i][0] = n, sh[i][1] = heads, sh[i][2] = len, sh[i][3] = dim;
    st[i][0] = len * heads * dim, st[i][1] = dim, st[i][2] = heads * dim, st[i][3] = 1;
    w[i].ndim = 4, w[i].shape = sh[i], w[i].strides = st[i];
  }
  w[4] = plse.t;
  sh[4][0] = n, sh[4][1] = 2, sh[4][2] = len, st[4][0] = len, st[4][1] = r.TQ, st[4][2] = 1;
  w[4].ndim = 3, w[4].shape = sh[4], w[4].strides = st[4];
  flex_args p = a;
  p.cu_seqlens_q = p.cu_seqlens_kv = NULL;
  p.q = &w[0], p.k = &w[1], p.v = &w[2], p.out = &w[3], p.lse = &w[4];
  ck_assert_msg(flex_forward(r.k, &p) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(memcmp(out.a.data, pout.a.data, (size_t)rt_array_count(&out.a) * 8) == 0,
                "%s: packed and padded outputs differ", cs->name);
  ck_assert_msg(tl_rel_err(&lse.a, &plse.a) == 0, "%s: packed and padded lse differ", cs->name);
  tl_arr_free(&out), tl_arr_free(&lse), tl_arr_free(&pout), tl_arr_free(&plse);
  run_free(&r);
}
END_TEST

/* ---- validation: docs/varlen.md's table, one row each --------------------------------- */

typedef struct Bad {
  const char *row;  /* the table row */
  const char *want; /* a part of the message */
} Bad;

/* A valid packed forward (3 sequences, fp32, H=4, HKV=2, E=8) on the reference to break. */
typedef struct Valid {
  Run r;
  TlArr out, lse, other;
  flex_args a;
} Valid;

static void valid_init(Valid *v) {
  Lens L = {3, {2, 0, 3}, {2, 1, 4}};
  run_init(&v->r, &cases[1], &L, rt_dtype(kDLFloat, 32), 4, 2, 8);
  int64_t os[3] = {v->r.TQ, 4, 8}, ls[2] = {4, v->r.TQ};
  tl_arr_init(&v->out, rt_dtype(kDLFloat, 32), 3, os);
  tl_arr_init(&v->lse, rt_dtype(kDLFloat, 32), 2, ls);
  memset(&v->other, 0, sizeof v->other);
  memset(&v->a, 0, sizeof v->a);
  flex_args *a = &v->a;
  a->backend = FLEX_BACKEND_REFERENCE;
  a->q = &v->r.q.tx, a->k = &v->r.kk.tx, a->v = &v->r.v.tx, a->out = &v->out.t, a->lse = &v->lse.t;
  a->cu_seqlens_q = &v->r.cuq.t, a->cu_seqlens_kv = &v->r.cuk.t;
}

static void valid_free(Valid *v) {
  tl_arr_free(&v->out), tl_arr_free(&v->lse), tl_arr_free(&v->other);
  run_free(&v->r);
}

static void expect(Valid *v, const char *row, const char *want) {
  flex_status st = flex_forward(v->r.k, &v->a);
  ck_assert_msg(st == FLEX_ERR_INVALID, "%s: expected FLEX_ERR_INVALID, got %d (%s)", row, (int)st,
                flex_last_error());
  ck_assert_msg(strstr(flex_last_error(), want), "%s: message '%s' lacks '%s'", row,
                flex_last_error(), want);
}

/* expect() with *slot pointing at a copy of base of another shape. */
static void expect_shape(Valid *v, const DLTensor **slot, const DLTensor *base, int ndim,
                         int64_t *shape, const char *row, const char *want) {
  DLTensor t = *base;
  t.ndim = ndim, t.shape = shape;
  *slot = &t;
  expect(v, row, want);
}

START_TEST(valid_call_runs) {
  Valid v;
  valid_init(&v);
  ck_assert_msg(flex_forward(v.r.k, &v.a) == FLEX_OK, "%s", flex_last_error());
  valid_free(&v);
}
END_TEST

START_TEST(validation_rows) {
  Valid v;
  int64_t n;
  DLTensor t;
  /* offsets */
  valid_init(&v);
  v.a.cu_seqlens_kv = NULL;
  expect(&v, "kv offsets missing", "cu_seqlens_kv: missing");
  valid_free(&v), valid_init(&v);
  n = 4;
  tl_arr_init(&v.other, rt_dtype(kDLInt, 64), 1, &n);
  v.a.cu_seqlens_q = &v.other.t;
  expect(&v, "offsets dtype", "cu_seqlens_q: expected int32, got int64");
  valid_free(&v), valid_init(&v);
  t = v.r.cuq.t;
  int64_t sh2[2] = {2, 2};
  t.ndim = 2, t.shape = sh2;
  v.a.cu_seqlens_q = &t;
  expect(&v, "offsets rank", "cu_seqlens_q: expected a rank-1 tensor");
  valid_free(&v), valid_init(&v);
  n = 3;
  tl_arr_init(&v.other, rt_dtype(kDLInt, 32), 1, &n);
  memcpy(v.other.a.data, v.r.ck, 12);
  v.a.cu_seqlens_kv = &v.other.t;
  expect(&v, "offsets lengths differ", "cu_seqlens_kv: expected B + 1 = 4 offsets");
  valid_free(&v), valid_init(&v);
  ((int32_t *)v.r.cuq.a.data)[0] = 1;
  expect(&v, "offsets start at 0", "cu_seqlens_q: expected offset 0 first, got 1");
  valid_free(&v), valid_init(&v);
  ((int32_t *)v.r.cuk.a.data)[2] = 1;
  expect(&v, "offsets non-decreasing", "cu_seqlens_kv: expected non-decreasing offsets, got 1 after 2");
  valid_free(&v), valid_init(&v);
  ((int32_t *)v.r.cuq.a.data)[3] = 4;
  expect(&v, "last offset = TOTAL_Q", "cu_seqlens_q: expected the last offset to be TOTAL_Q = 5");
  valid_free(&v), valid_init(&v);
  t = v.r.cuq.t;
  t.device = (DLDevice){kDLCUDA, 0};
  v.a.cu_seqlens_q = &t;
  expect(&v, "offsets device", "cu_seqlens_q: expected the call's device cpu:0");
  /* packed tensors */
  valid_free(&v), valid_init(&v);
  expect_shape(&v, &v.a.q, &v.r.q.tx, 4, (int64_t[]){1, 5, 4, 8}, "q rank",
               "q: a packed (cu_seqlens) call expects a rank-3 tensor (TOTAL_Q, H, E), got rank 4");
  valid_free(&v), valid_init(&v);
  t = v.r.v.tx;
  t.dtype = rt_dtype(kDLFloat, 16);
  v.a.v = &t;
  expect(&v, "dtypes agree", "q, k and v must share a dtype, got float32, float32 and float16");
  valid_free(&v), valid_init(&v);
  t = v.r.kk.tx;
  t.device = (DLDevice){kDLCUDA, 0};
  v.a.k = &t;
  expect(&v, "devices agree", "k: expected q's device cpu:0");
  valid_free(&v), valid_init(&v);
  int64_t wide[3] = {5, 4, 16}, wst[3] = {64, 16, 2};
  tl_arr_init(&v.other, rt_dtype(kDLFloat, 32), 3, wide);
  t = v.other.t;
  t.shape = v.r.q.tx.shape, t.strides = wst; /* every other element */
  v.a.q = &t;
  expect(&v, "last dimension unit stride", "q: the last dimension must have unit stride, got stride 2");
  valid_free(&v), valid_init(&v);
  n = 0;
  tl_arr_init(&v.other, rt_dtype(kDLInt, 32), 1, &n);
  v.a.cu_seqlens_q = &v.other.t;
  expect(&v, "offsets empty", "cu_seqlens_q: expected B + 1 >= 1 offsets, got 0");
  valid_free(&v), valid_init(&v);
  t = v.r.kk.tx;
  int64_t kbig[3] = {(int64_t)INT32_MAX + 1, 2, 8}, kst[3] = {0, 8, 1}; /* never read */
  t.shape = kbig, t.strides = kst;
  v.a.k = &t;
  expect(&v, "packed rows fit int32", "k: 2147483648 packed rows (expected at most 2147483647)");
  valid_free(&v), valid_init(&v);
  expect_shape(&v, &v.a.k, &v.r.kk.tx, 3, (int64_t[]){7, 2, 6}, "head dims agree",
               "k: head dim E=6 does not match q's E=8");
  valid_free(&v), valid_init(&v);
  expect_shape(&v, &v.a.v, &v.r.v.tx, 3, (int64_t[]){7, 1, 8}, "k/v heads agree",
               "v: 1 key/value heads, but k has 2");
  valid_free(&v), valid_init(&v);
  expect_shape(&v, &v.a.q, &v.r.q.tx, 3, (int64_t[]){5, 3, 8}, "H multiple of HKV",
               "H=3 query heads is not a positive multiple of HKV=2");
  valid_free(&v), valid_init(&v);
  expect_shape(&v, &v.a.v, &v.r.v.tx, 3, (int64_t[]){6, 2, 8}, "k/v rows agree",
               "v: TOTAL_KV=6 packed rows, but k has 7");
  valid_free(&v), valid_init(&v);
  expect_shape(&v, &v.a.lse, &v.lse.t, 2, (int64_t[]){5, 4}, "lse layout",
               "lse: expected shape [4, 5] (H, TOTAL_Q), got [5, 4]");
  valid_free(&v), valid_init(&v);
  v.a.block_mask = (const flex_block_mask *)&v; /* never read */
  expect(&v, "caller's BlockMask", "block_mask: a caller's BlockMask is not accepted");
  valid_free(&v), valid_init(&v);
  t = v.out.t;
  t.dtype = rt_dtype(kDLInt, 32);
  v.a.out = &t;
  expect(&v, "per-sequence checks still apply", "sequence 0 (rows 0..2 of q, 0..2 of k and v): out:");
  valid_free(&v);
}
END_TEST

/* Outputs whose elements overlap across sequences: with one query per
 * sequence, each sequence's view of a row stride 0 holds one row, so only
 * the packed tensor shows that every sequence would write the same row.
 * Likewise a negative row stride (refused in an ordinary call). */
START_TEST(packed_outputs_must_not_overlap) {
  for (int which = 0; which < 3; which++) {
    Valid v;
    Lens L = {3, {1, 1, 1}, {2, 1, 4}};
    run_init(&v.r, &cases[1], &L, rt_dtype(kDLFloat, 32), 4, 2, 8);
    int64_t os[3] = {3, 4, 8}, ls[2] = {4, 3}, ost[3] = {0, 8, 1}, lst[2] = {1, 0};
    tl_arr_init(&v.out, rt_dtype(kDLFloat, 32), 3, os);
    tl_arr_init(&v.lse, rt_dtype(kDLFloat, 32), 2, ls);
    memset(&v.other, 0, sizeof v.other);
    memset(&v.a, 0, sizeof v.a);
    DLTensor o = v.out.t, l = v.lse.t;
    int64_t qst[3] = {-32, 8, 1};
    DLTensor q = v.r.q.tx;
    q.strides = qst, q.byte_offset = 2 * 32 * 4; /* rows backwards */
    if (which == 0) o.strides = ost;
    else if (which == 1) l.strides = lst;
    flex_args *a = &v.a;
    a->backend = FLEX_BACKEND_REFERENCE;
    a->q = &v.r.q.tx, a->k = &v.r.kk.tx, a->v = &v.r.v.tx, a->out = &o, a->lse = &l;
    a->cu_seqlens_q = &v.r.cuq.t, a->cu_seqlens_kv = &v.r.cuk.t;
    if (which == 2) a->q = &q;
    static const char *const rows[3] = {"out overlaps", "lse overlaps", "negative row stride"};
    static const char *const want[3] = {
        "out: dimension 0 has stride 0, so elements of this output overlap",
        "lse: dimension 1 has stride 0, so elements of this output overlap",
        "q: dimension 0 has stride -32 (expected a non-negative stride)"};
    expect(&v, rows[which], want[which]);
    valid_free(&v);
  }
}
END_TEST

START_TEST(buffer_dims_q_len_refused) {
  const char *src = "buffer w: f32[Q_LEN];\nscore sc(s, b, h, q, kv) { return s + w[q]; }\n";
  Valid v;
  valid_init(&v);
  flex_kernel *k;
  ck_assert(flex_kernel_from_source(&k, "qlen", src, strlen(src), NULL) == FLEX_OK);
  int64_t n = 5;
  tl_arr_init(&v.other, rt_dtype(kDLFloat, 32), 1, &n);
  flex_buffer fb = {"w", &v.other.t, NULL};
  v.a.buffers = &fb, v.a.nbuffers = 1;
  flex_status st = flex_forward(k, &v.a);
  ck_assert_int_eq(st, FLEX_ERR_INVALID);
  ck_assert_msg(strstr(flex_last_error(), "buffer 'w': dimension 0 is declared Q_LEN, which differs "
                                          "per sequence in a packed (cu_seqlens) call: use TOTAL_Q"),
                "%s", flex_last_error());
  flex_kernel_free(k);
  valid_free(&v);
}
END_TEST

/* Empty batches and empty sequences: B = 0, all-empty, and LSE = -inf where no keys. */
START_TEST(empty_sequences) {
  Valid v;
  Lens L = {2, {0, 3}, {0, 0}};
  run_init(&v.r, &cases[1], &L, rt_dtype(kDLFloat, 32), 2, 1, 4);
  int64_t os[3] = {3, 2, 4}, ls[2] = {2, 3};
  tl_arr_init(&v.out, rt_dtype(kDLFloat, 32), 3, os);
  tl_arr_init(&v.lse, rt_dtype(kDLFloat, 32), 2, ls);
  tl_arr_poison(&v.out), tl_arr_poison(&v.lse);
  memset(&v.other, 0, sizeof v.other);
  memset(&v.a, 0, sizeof v.a);
  for (int be = 0; be < 2; be++) {
    if (be == 1 && !flex_backend_available(FLEX_BACKEND_EMU)) break;
    flex_args *a = &v.a;
    a->backend = be ? FLEX_BACKEND_EMU : FLEX_BACKEND_REFERENCE;
    a->q = &v.r.q.tx, a->k = &v.r.kk.tx, a->v = &v.r.v.tx, a->out = &v.out.t, a->lse = &v.lse.t;
    a->cu_seqlens_q = &v.r.cuq.t, a->cu_seqlens_kv = &v.r.cuk.t;
    ck_assert_msg(flex_forward(v.r.k, a) == FLEX_OK, "%s", flex_last_error());
    for (int i = 0; i < 12; i++) ck_assert(((float *)v.out.a.data)[i] == 0.0f);
    for (int i = 0; i < 6; i++) ck_assert(((float *)v.lse.a.data)[i] == -INFINITY);
  }
  valid_free(&v);
}
END_TEST

/* No sequences (offsets [0]) and only empty sequences (offsets [0, 0, 0]):
 * TOTAL_Q = TOTAL_KV = 0, every packed tensor empty; forward and backward
 * succeed on every available backend, and a shared `grad` buffer gets a
 * zero gradient (nothing attended). */
START_TEST(empty_batches) {
  static const flex_backend bes[3] = {FLEX_BACKEND_REFERENCE, FLEX_BACKEND_EMU, FLEX_BACKEND_CPU};
  for (int nseq = 0; nseq <= 2; nseq += 2)
    for (int bi = 0; bi < 3; bi++) {
      if (!flex_backend_available(bes[bi])) continue;
      Lens L = {nseq, {0, 0}, {0, 0}};
      Run r;
      run_init(&r, &cases[4], &L, rt_dtype(kDLFloat, 32), 2, 1, 8);
      DLDataType f32 = rt_dtype(kDLFloat, 32);
      int64_t os[3] = {0, 2, 8}, ls[2] = {2, 0}, ks[3] = {0, 1, 8}, hs = 2, ts = 0;
      TlArr out, lse, dq, dk, dv, ghb, gtb;
      tl_arr_init(&out, f32, 3, os), tl_arr_init(&lse, f32, 2, ls), tl_arr_init(&dq, f32, 3, os);
      tl_arr_init(&dk, f32, 3, ks), tl_arr_init(&dv, f32, 3, ks), tl_arr_init(&ghb, f32, 1, &hs);
      tl_arr_init(&gtb, f32, 1, &ts);
      tl_arr_poison(&ghb);
      r.fb[0].grad = &ghb.t, r.fb[1].grad = &gtb.t;
      flex_args a;
      memset(&a, 0, sizeof a);
      a.backend = bes[bi];
      a.q = &r.q.tx, a.k = &r.kk.tx, a.v = &r.v.tx, a.out = &out.t, a.lse = &lse.t;
      a.dout = &r.dout.tx, a.dq = &dq.t, a.dk = &dk.t, a.dv = &dv.t;
      a.cu_seqlens_q = &r.cuq.t, a.cu_seqlens_kv = &r.cuk.t;
      a.buffers = r.fb, a.nbuffers = 2;
      const char *bn = flex_backend_name(bes[bi]);
      ck_assert_msg(flex_forward(r.k, &a) == FLEX_OK, "%s B=%d forward: %s", bn, nseq, flex_last_error());
      ck_assert_msg(flex_backward(r.k, &a) == FLEX_OK, "%s B=%d backward: %s", bn, nseq, flex_last_error());
      for (int i = 0; i < 2; i++)
        ck_assert_msg(((float *)ghb.a.data)[i] == 0.0f, "%s B=%d: grad of hb[%d] = %g, expected 0", bn,
                      nseq, i, (double)((float *)ghb.a.data)[i]);
      TlArr *all[] = {&out, &lse, &dq, &dk, &dv, &ghb, &gtb};
      for (size_t i = 0; i < sizeof all / sizeof *all; i++) tl_arr_free(all[i]);
      run_free(&r);
    }
}
END_TEST

/* The statistics of a packed call are its own: a call of no sequences
 * reports no tiles, not those of the call before it. */
START_TEST(stats_are_the_packed_calls) {
  flex_backend be = flex_backend_available(FLEX_BACKEND_CPU)   ? FLEX_BACKEND_CPU
                    : flex_backend_available(FLEX_BACKEND_EMU) ? FLEX_BACKEND_EMU
                                                                : FLEX_BACKEND_REFERENCE;
  if (be == FLEX_BACKEND_REFERENCE) return; /* the reference counts no tiles */
  for (int nseq = 2; nseq >= 0; nseq -= 2) {
    Lens L = {nseq, {3, 5}, {4, 2}};
    Run r;
    run_init(&r, &cases[1], &L, rt_dtype(kDLFloat, 32), 2, 1, 8);
    int64_t os[3] = {r.TQ, 2, 8}, ls[2] = {2, r.TQ};
    TlArr out, lse;
    tl_arr_init(&out, rt_dtype(kDLFloat, 32), 3, os), tl_arr_init(&lse, rt_dtype(kDLFloat, 32), 2, ls);
    flex_args a;
    memset(&a, 0, sizeof a);
    a.backend = be;
    a.q = &r.q.tx, a.k = &r.kk.tx, a.v = &r.v.tx, a.out = &out.t, a.lse = &lse.t;
    a.cu_seqlens_q = &r.cuq.t, a.cu_seqlens_kv = &r.cuk.t;
    ck_assert_msg(flex_forward(r.k, &a) == FLEX_OK, "%s", flex_last_error());
    uint64_t tiles = rt_run_last_stats().fwd_tiles;
    if (nseq) ck_assert_msg(tiles == 4, "%s: 2 sequences x 2 heads visited %llu tiles, expected 4",
                            flex_backend_name(be), (unsigned long long)tiles);
    else ck_assert_msg(tiles == 0, "%s: no sequences, but %llu tiles reported", flex_backend_name(be),
                       (unsigned long long)tiles);
    tl_arr_free(&out), tl_arr_free(&lse);
    run_free(&r);
  }
}
END_TEST

/* flexc run --cu-seqlens-q/--cu-seqlens-kv: packed .npy files in, packed
 * results out, equal to the API's packed call. */
START_TEST(cli_run_packed) {
  char dir[] = "/tmp/flexc-varlen-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  Lens L = {3, {4, 0, 7}, {6, 2, 5}};
  Run r;
  run_init(&r, &cases[1], &L, rt_dtype(kDLFloat, 32), 2, 1, 8);
  const RtArray *in[6] = {&r.q.x, &r.kk.x, &r.v.x, &r.dout.x, &r.cuq.a, &r.cuk.a};
  const char *names[6] = {"q", "k", "v", "dout", "cq", "ck"};
  char path[6][600], cmd[8192];
  for (int i = 0; i < 6; i++) {
    snprintf(path[i], sizeof path[i], "%s/%s.npy", dir, names[i]);
    ck_assert_int_eq(rt_npy_write(path[i], in[i]), 0);
  }
  snprintf(cmd, sizeof cmd,
           "%s run %s --q %s --k %s --v %s --dout %s --cu-seqlens-q %s --cu-seqlens-kv %s "
           "--backend reference --out %s/res",
           tl_flexc(), tl_src_path("samples/causal_lower_right.score"), path[0], path[1], path[2],
           path[3], path[4], path[5], dir);
  Buf log = {0};
  int rc = tl_run(cmd, &log);
  ck_assert_msg(rc == 0, "exit %d: %s", rc, log.data);
  buf_free(&log);
  /* the same call through the API */
  flex_kernel *k = tl_load("samples/causal_lower_right.score", NULL, NULL);
  DLDataType f64 = rt_dtype(kDLFloat, 64);
  int64_t os[3] = {r.TQ, 2, 8}, ls[2] = {2, r.TQ}, ks[3] = {r.TK, 1, 8};
  TlArr out, lse, dq, dk, dv;
  tl_arr_init(&out, f64, 3, os), tl_arr_init(&lse, f64, 2, ls), tl_arr_init(&dq, f64, 3, os);
  tl_arr_init(&dk, f64, 3, ks), tl_arr_init(&dv, f64, 3, ks);
  flex_args a;
  memset(&a, 0, sizeof a);
  a.q = &r.q.tx, a.k = &r.kk.tx, a.v = &r.v.tx, a.out = &out.t, a.lse = &lse.t, a.dout = &r.dout.tx;
  a.dq = &dq.t, a.dk = &dk.t, a.dv = &dv.t;
  a.cu_seqlens_q = &r.cuq.t, a.cu_seqlens_kv = &r.cuk.t;
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK && flex_backward(k, &a) == FLEX_OK, "%s",
                flex_last_error());
  const TlArr *want[5] = {&out, &lse, &dq, &dk, &dv};
  const char *files[5] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; i++) {
    char f[700];
    snprintf(f, sizeof f, "%s/res/%s.npy", dir, files[i]);
    RtArray got;
    ck_assert_msg(rt_npy_read(f, &got) == FLEX_OK, "%s: %s", f, flex_last_error());
    double e = tl_rel_err(&got, &want[i]->a);
    ck_assert_msg(e <= 1e-12, "%s: relative error %g against the API call", files[i], e);
    rt_array_free(&got);
    tl_arr_free((TlArr *)want[i]);
  }
  flex_kernel_free(k);
  run_free(&r);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  tl_run(cmd, &log);
  buf_free(&log);
}
END_TEST

int main(int argc, char **argv) {
  rng = tl_seed();
  int rc = tl_cuda_mode(argc, argv);
  if (rc >= 0)
    return rc ? rc : TL_MAIN("cuda_varlen", 0, TL_CASE("cuda", 0), TL_LOOP(cuda_matches_per_sequence, NCASES * 2));
  tl_one_process(); /* the emulator's modules serve several tests */
  return TL_MAIN("varlen", 600, TL_LOOP(reference_matches_per_sequence, NCASES),
                 TL_LOOP(equal_lengths_equal_padded_call, 2), TL_TEST(valid_call_runs),
                 TL_TEST(validation_rows), TL_TEST(buffer_dims_q_len_refused),
                 TL_TEST(packed_outputs_must_not_overlap), TL_TEST(empty_sequences), TL_TEST(empty_batches),
                 TL_TEST(stats_are_the_packed_calls), TL_TEST(cli_run_packed),
                 TL_LOOP(emu_matches_per_sequence, NCASES), TL_LOOP(emu_classifier_sees_sequence, 2),
                 TL_TEST(emu_built_mask_no_queries), TL_LOOP(cpu_matches_per_sequence, NCASES),
                 TL_LOOP(packed_matches_padded_call, 3));
}
