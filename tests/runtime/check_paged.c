/* Paged key/value caches (page_table, kv_lens; docs/language.md, docs/paged.md).
 *
 * Every case builds one random packed batch (ragged key lengths, one
 * sequence without keys, one longer than a few pages), then scatters its
 * keys and values into a pool of pages in shuffled order, with spare pages
 * of random values and page-table entries past each sequence's last page
 * far out of range (a kernel that read them would fail or differ). The
 * paged call must equal the same call on contiguous keys: the packed
 * (cu_seqlens_kv) call, which binds the same B, b, KV_LEN, TOTAL_KV and
 * KV_START. fp32 on the emulator: bitwise, for page sizes 16..256 and 48 (below,
 * at and above the kernels' key tile), padded and packed queries, GQA, a
 * lower-right causal mask with a score reading a per-sequence buffer, and
 * a sliding window whose width is per sequence with a score reading a
 * per-key buffer. fp16/bf16 (and fp32) against the float64 reference
 * within 5e-3 / 3e-2 (1e-4); the reference's paged call against its
 * contiguous one, bitwise; the cpu backend when built. Then the checks:
 * validation messages, a checked run's out-of-range page report, the
 * backward's refusal. Outputs are poisoned with NaN first.
 * --cuda runs the GPU's comparison alone (fp32, fp16 and bf16, page sizes
 * 16 and 64, padded and packed queries); it exits 77 where there is no
 * CUDA device. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;
/* Packed query sequences may be empty (the reference tests only: the
 * contiguous packed call on the emulator trips its memory checker in the
 * BlockMask builder for an empty query sequence with many keys). */
static bool empty_q;
/* Head dims of the next batch: 16 and 8, or 20 and 12 (16-bit rows then
 * take the element-wise tile loads instead of cp.async chunks). */
static int head_e = 16, head_ev = 8;

typedef struct Case {
  const char *name, *src;
  const char *buf[2]; /* a per-sequence buffer [B], a per-key buffer [TOTAL_KV] (NULL: none) */
  int itype;          /* the [B] buffer is i32 in 1..40 (else f32) */
} Case;

static const Case cases[] = {
    {"lower_right_causal_bias",
     "buffer sb: f32[B];\n"
     "score sc(s, b, h, q, kv) { return s + sb[b]; }\n"
     "mask lr(b, h, q, kv) { return q + KV_LEN - Q_LEN >= kv; }\n",
     {"sb", NULL}, 0},
    {"sliding_window",
     "buffer win: i32[B];\nbuffer tb: f32[TOTAL_KV];\n"
     "score sc(s, b, h, q, kv) { return s + tb[KV_START + kv]; }\n"
     "mask sw(b, h, q, kv) { let d = q + KV_LEN - Q_LEN - kv; return d >= 0 && d < win[b]; }\n",
     {"win", "tb"}, 1},
};

enum { MAXB = 8 };

/* One batch, contiguous (packed) and paged. */
typedef struct P {
  const Case *cs;
  flex_kernel *kern;
  int B, H, HKV, E, EV, PS, QL, TQ, TK, NP, MP;
  bool packed; /* queries packed by cu_seqlens_q (ragged); else padded, Q_LEN each */
  int cq[MAXB + 1], ck[MAXB + 1], lens[MAXB];
  TlArr q, k, v, pk, pv;         /* in the tested dtype */
  TlArr q64, k64, v64, pk64, pv64; /* float64 twins */
  TlArr pt, kvl, cuq, cuk;
  TlArr bufs[2];
  flex_buffer fb[2];
  int nbuf;
} P;

static void arr_copy64(TlArr *dst, const TlArr *src) {
  tl_arr_init(dst, rt_dtype(kDLFloat, 64), src->a.ndim, src->a.shape);
  for (int64_t i = 0; i < rt_array_count(&src->a); i++)
    rt_array_set(&dst->a, i, rt_array_get(&src->a, i));
}

static void p_init(P *p, const Case *cs, DLDataType dt, int PS, bool packed) {
  memset(p, 0, sizeof *p);
  p->cs = cs;
  ck_assert_msg(flex_kernel_from_source(&p->kern, cs->name, cs->src, strlen(cs->src), NULL) == FLEX_OK,
                "%s", flex_last_error());
  p->B = 4, p->H = 4, p->HKV = 2, p->E = head_e, p->EV = head_ev, p->PS = PS, p->packed = packed;
  p->QL = packed ? 0 : 5;
  int z = (int)(tl_rand(&rng) % 4), big = (z + 1) % 4;
  p->cq[0] = p->ck[0] = 0;
  int npages = 0, maxp = 0;
  for (int b = 0; b < p->B; b++) {
    int ql = packed ? (empty_q ? 0 : 1) + (int)(tl_rand(&rng) % 6) : p->QL;
    int kl = 1 + (int)(tl_rand(&rng) % (uint64_t)(PS + 20));
    if (b == z) kl = 0;
    if (b == big) kl = 2 * PS + 1 + (int)(tl_rand(&rng) % 40);
    p->lens[b] = kl;
    p->cq[b + 1] = p->cq[b] + ql, p->ck[b + 1] = p->ck[b] + kl;
    int np = (kl + PS - 1) / PS;
    npages += np;
    if (np > maxp) maxp = np;
  }
  p->TQ = p->cq[p->B], p->TK = p->ck[p->B];
  p->NP = npages + 2, p->MP = maxp + 1;
  int64_t qs[3] = {p->TQ, p->H, p->E}, ks[3] = {p->TK, p->HKV, p->E}, vs[3] = {p->TK, p->HKV, p->EV};
  int64_t pks[4] = {p->NP, PS, p->HKV, p->E}, pvs[4] = {p->NP, PS, p->HKV, p->EV};
  tl_arr_init(&p->q, dt, 3, qs), tl_arr_init(&p->k, dt, 3, ks), tl_arr_init(&p->v, dt, 3, vs);
  tl_arr_init(&p->pk, dt, 4, pks), tl_arr_init(&p->pv, dt, 4, pvs);
  tl_arr_normal(&p->q, &rng), tl_arr_normal(&p->k, &rng), tl_arr_normal(&p->v, &rng);
  tl_arr_normal(&p->pk, &rng), tl_arr_normal(&p->pv, &rng); /* spare rows: random, never zero */
  /* pages in shuffled order */
  int perm[512];
  ck_assert_int_le(p->NP, 512);
  for (int i = 0; i < p->NP; i++) perm[i] = i;
  for (int i = p->NP - 1; i > 0; i--) {
    int j = (int)(tl_rand(&rng) % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  int64_t pts[2] = {p->B, p->MP}, bs[1] = {p->B}, cs1[1] = {p->B + 1};
  tl_arr_init(&p->pt, rt_dtype(kDLInt, 32), 2, pts);
  tl_arr_init(&p->kvl, rt_dtype(kDLInt, 32), 1, bs);
  tl_arr_init(&p->cuq, rt_dtype(kDLInt, 32), 1, cs1);
  tl_arr_init(&p->cuk, rt_dtype(kDLInt, 32), 1, cs1);
  int32_t *pt = p->pt.a.data;
  int next = 0;
  for (int b = 0; b < p->B; b++) {
    ((int32_t *)p->kvl.a.data)[b] = p->lens[b];
    for (int j = 0; j < p->MP; j++)
      pt[b * p->MP + j] = j * PS < p->lens[b] ? perm[next++] : 1000000 + j; /* never read */
    for (int kv = 0; kv < p->lens[b]; kv++)
      for (int h = 0; h < p->HKV; h++) {
        int64_t page = pt[b * p->MP + kv / PS], row = kv % PS, src = (int64_t)(p->ck[b] + kv) * p->HKV + h;
        int64_t dst = (page * PS + row) * p->HKV + h;
        for (int e = 0; e < p->E; e++)
          rt_array_set(&p->pk.a, dst * p->E + e, rt_array_get(&p->k.a, src * p->E + e));
        for (int e = 0; e < p->EV; e++)
          rt_array_set(&p->pv.a, dst * p->EV + e, rt_array_get(&p->v.a, src * p->EV + e));
      }
  }
  memcpy(p->cuq.a.data, p->cq, sizeof(int32_t) * (size_t)(p->B + 1));
  memcpy(p->cuk.a.data, p->ck, sizeof(int32_t) * (size_t)(p->B + 1));
  arr_copy64(&p->q64, &p->q), arr_copy64(&p->k64, &p->k), arr_copy64(&p->v64, &p->v);
  arr_copy64(&p->pk64, &p->pk), arr_copy64(&p->pv64, &p->pv);
  for (int j = 0; j < 2 && cs->buf[j]; j++) {
    int64_t n = j == 0 ? p->B : p->TK;
    bool it = j == 0 && cs->itype;
    tl_arr_init(&p->bufs[j], it ? rt_dtype(kDLInt, 32) : rt_dtype(kDLFloat, 32), 1, &n);
    for (int64_t i = 0; i < n; i++)
      rt_array_set(&p->bufs[j].a, i, it ? 1 + (double)(tl_rand(&rng) % 40) : 0.5 * tl_normal(&rng));
    p->fb[j] = (flex_buffer){cs->buf[j], &p->bufs[j].t, NULL};
    p->nbuf = j + 1;
  }
}

static void p_free(P *p) {
  TlArr *all[] = {&p->q, &p->k, &p->v, &p->pk, &p->pv, &p->q64, &p->k64, &p->v64, &p->pk64,
                  &p->pv64, &p->pt, &p->kvl, &p->cuq, &p->cuk, &p->bufs[0], &p->bufs[1]};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tl_arr_free(all[i]);
  flex_kernel_free(p->kern);
}

/* Outputs in the packed layout: out (TOTAL_Q, H, EV), lse (H, TOTAL_Q). */
typedef struct Out {
  TlArr out, lse;
  DLTensor o4, l3; /* padded views of the same memory */
  int64_t os[4], ost[4], ls[3], lst[3];
} Out;

static void out_init(Out *o, const P *p, DLDataType dt) {
  int64_t os[3] = {p->TQ, p->H, p->EV}, ls[2] = {p->H, p->TQ};
  tl_arr_init(&o->out, dt, 3, os), tl_arr_init(&o->lse, rt_dtype(kDLFloat, dt.bits == 64 ? 64 : 32), 2, ls);
  tl_arr_poison(&o->out), tl_arr_poison(&o->lse);
}

/* The padded [B, H, Q_LEN, d] view of a packed (B * Q_LEN, H, d) tensor. */
static DLTensor padded4(const DLTensor *t, int64_t sh[4], int64_t st[4], int QL) {
  DLTensor v = *t;
  int64_t H = t->shape[1], d = t->shape[2];
  sh[0] = t->shape[0] / QL, sh[1] = H, sh[2] = QL, sh[3] = d;
  st[0] = QL * H * d, st[1] = d, st[2] = H * d, st[3] = 1;
  v.ndim = 4, v.shape = sh, v.strides = st;
  return v;
}

/* The padded [B, H, Q_LEN] view of a packed (H, B * Q_LEN) lse. */
static DLTensor padded3(const DLTensor *t, int64_t sh[3], int64_t st[3], int QL) {
  DLTensor v = *t;
  sh[0] = t->shape[1] / QL, sh[1] = t->shape[0], sh[2] = QL;
  st[0] = QL, st[1] = t->shape[1], st[2] = 1;
  v.ndim = 3, v.shape = sh, v.strides = st;
  return v;
}

/* The contiguous (packed cu_seqlens_kv) call, or the paged one. wide: the
 * float64 twins. */
static flex_status call(P *p, flex_backend be, bool paged, bool wide, Out *o, bool check) {
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = be;
  a.check_bounds = check;
  a.buffers = p->fb, a.nbuffers = p->nbuf;
  DLTensor q = (wide ? p->q64 : p->q).t, out = o->out.t, lse = o->lse.t;
  int64_t s[3][4], t[3][4];
  if (paged && !p->packed) {
    q = padded4(&q, s[0], t[0], p->QL);
    out = padded4(&out, s[1], t[1], p->QL);
    lse = padded3(&lse, s[2], t[2], p->QL);
  } else {
    a.cu_seqlens_q = &p->cuq.t;
  }
  a.q = &q, a.out = &out, a.lse = &lse;
  if (paged) {
    a.k = wide ? &p->pk64.t : &p->pk.t, a.v = wide ? &p->pv64.t : &p->pv.t;
    a.page_table = &p->pt.t, a.kv_lens = &p->kvl.t;
  } else {
    a.k = wide ? &p->k64.t : &p->k.t, a.v = wide ? &p->v64.t : &p->v.t;
    a.cu_seqlens_kv = &p->cuk.t;
  }
  return flex_forward(p->kern, &a);
}

static void out_free(Out *o) { tl_arr_free(&o->out), tl_arr_free(&o->lse); }

static bool bitwise(const TlArr *x, const TlArr *y) {
  size_t n = (size_t)rt_array_count(&x->a) * (size_t)(x->a.dtype.bits / 8);
  return n == (size_t)rt_array_count(&y->a) * (size_t)(y->a.dtype.bits / 8) &&
         memcmp(x->a.data, y->a.data, n) == 0;
}

static const int page_sizes[6] = {16, 32, 64, 128, 256, 48}; /* 48: not a power of two */

/* fp32 on the emulator: the paged call is bitwise the contiguous one. */
START_TEST(emu_fp32_bitwise) {
  if (!flex_backend_available(FLEX_BACKEND_EMU)) return;
  int ps = page_sizes[_i % 6], ci = _i / 6;
  bool packed = (_i + ci) % 2;
  empty_q = false;
  P p;
  p_init(&p, &cases[ci], rt_dtype(kDLFloat, 32), ps, packed);
  Out c, g;
  out_init(&c, &p, rt_dtype(kDLFloat, 32)), out_init(&g, &p, rt_dtype(kDLFloat, 32));
  ck_assert_msg(call(&p, FLEX_BACKEND_EMU, false, false, &c, false) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(call(&p, FLEX_BACKEND_EMU, true, false, &g, false) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(bitwise(&g.out, &c.out) && bitwise(&g.lse, &c.lse),
                "%s PAGE_SIZE=%d %s: paged != contiguous (out err %g, lse err %g; seed above)",
                cases[ci].name, ps, packed ? "packed" : "padded", tl_rel_err(&g.out.a, &c.out.a),
                tl_rel_err(&g.lse.a, &c.lse.a));
  ck_assert(tl_rel_err(&c.out.a, &c.out.a) == 0); /* no NaN left: every row was written */
  out_free(&c), out_free(&g);
  p_free(&p);
}
END_TEST

/* The reference's paged call is bitwise its contiguous call (float64). */
START_TEST(reference_paged_bitwise) {
  int ps = page_sizes[_i % 6], ci = _i % 2;
  empty_q = true;
  P p;
  p_init(&p, &cases[ci], rt_dtype(kDLFloat, 32), ps, _i / 6);
  Out c, g;
  out_init(&c, &p, rt_dtype(kDLFloat, 64)), out_init(&g, &p, rt_dtype(kDLFloat, 64));
  ck_assert_msg(call(&p, FLEX_BACKEND_REFERENCE, false, true, &c, false) == FLEX_OK, "%s",
                flex_last_error());
  ck_assert_msg(call(&p, FLEX_BACKEND_REFERENCE, true, true, &g, false) == FLEX_OK, "%s",
                flex_last_error());
  ck_assert_msg(bitwise(&g.out, &c.out) && bitwise(&g.lse, &c.lse), "%s PAGE_SIZE=%d: differ",
                cases[ci].name, ps);
  out_free(&c), out_free(&g);
  p_free(&p);
}
END_TEST

/* fp32, fp16, bf16 paged on the emulator (and cpu when built) against the
 * float64 reference's paged call. */
static void against_reference(flex_backend be, int di, int ci, int ps, bool packed) {
  const TlDtype *td = &tl_dtypes[di];
  DLDataType dt = {td->code, td->bits, 1};
  empty_q = false;
  P p;
  p_init(&p, &cases[ci], dt, ps, packed);
  Out r, g;
  out_init(&r, &p, rt_dtype(kDLFloat, 64)), out_init(&g, &p, rt_dtype(kDLFloat, 32));
  ck_assert_msg(call(&p, FLEX_BACKEND_REFERENCE, true, true, &r, false) == FLEX_OK, "%s",
                flex_last_error());
  ck_assert_msg(call(&p, be, true, false, &g, false) == FLEX_OK, "%s", flex_last_error());
  double eo = tl_rel_err(&g.out.a, &r.out.a), el = tl_rel_err(&g.lse.a, &r.lse.a);
  printf("paged %s %s %s PAGE_SIZE=%d %s E=%d EV=%d: out err %.3g, lse err %.3g\n",
         flex_backend_name(be), td->name, cases[ci].name, ps, packed ? "packed" : "padded", p.E, p.EV,
         eo, el);
  ck_assert_msg(eo <= td->tol && el <= td->tol, "%s %s %s: out err %g, lse err %g > %g",
                flex_backend_name(be), td->name, cases[ci].name, eo, el, td->tol);
  out_free(&r), out_free(&g);
  p_free(&p);
}

START_TEST(emu_against_reference) {
  if (!flex_backend_available(FLEX_BACKEND_EMU)) return;
  head_e = _i < 3 ? 16 : 20, head_ev = _i < 3 ? 8 : 12;
  against_reference(FLEX_BACKEND_EMU, _i % 3, _i % 2, _i < 3 ? 16 : 64, _i % 2 == 0);
  head_e = 16, head_ev = 8; /* the other tests' (one process: tl_one_process) */
}
END_TEST

START_TEST(cpu_against_reference) {
  if (!flex_backend_available(FLEX_BACKEND_CPU)) return;
  against_reference(FLEX_BACKEND_CPU, _i, _i % 2, 32, _i % 2);
}
END_TEST

/* cuda (on a machine with a GPU; every tensor mirrored on the device):
 * fp32, fp16 and bf16 against the float64 reference, PAGE_SIZE 16 and 64,
 * O in q's dtype (what the cuda backend writes). */
START_TEST(cuda_against_reference) {
  if (!flex_backend_available(FLEX_BACKEND_CUDA)) return;
  const TlDtype *td = &tl_dtypes[_i % 3];
  DLDataType dt = {td->code, td->bits, 1};
  empty_q = false;
  P p;
  p_init(&p, &cases[_i % 2], dt, _i < 3 ? 16 : 64, _i % 2);
  Out r, g;
  out_init(&r, &p, rt_dtype(kDLFloat, 64)), out_init(&g, &p, dt);
  ck_assert_msg(call(&p, FLEX_BACKEND_REFERENCE, true, true, &r, false) == FLEX_OK, "%s",
                flex_last_error());
  flex_args a;
  memset(&a, 0, sizeof a);
  a.buffers = p.fb, a.nbuffers = p.nbuf;
  int64_t s[3][4], t[3][4];
  DLTensor q = p.q.t, out = g.out.t, lse = g.lse.t;
  if (!p.packed) {
    q = padded4(&p.q.t, s[0], t[0], p.QL);
    out = padded4(&g.out.t, s[1], t[1], p.QL);
    lse = padded3(&g.lse.t, s[2], t[2], p.QL);
  } else {
    a.cu_seqlens_q = &p.cuq.t;
  }
  a.q = &q, a.k = &p.pk.t, a.v = &p.pv.t, a.out = &out, a.lse = &lse;
  a.page_table = &p.pt.t, a.kv_lens = &p.kvl.t;
  ck_assert_msg(tl_cuda_call(p.kern, &a, false) == FLEX_OK, "%s", flex_last_error());
  double eo = tl_rel_err(&g.out.a, &r.out.a), el = tl_rel_err(&g.lse.a, &r.lse.a);
  printf("paged cuda %s PAGE_SIZE=%d: out err %.3g, lse err %.3g\n", td->name, p.PS, eo, el);
  ck_assert_msg(eo <= td->tol && el <= td->tol, "cuda %s: out err %g, lse err %g", td->name, eo, el);
  out_free(&r), out_free(&g);
  p_free(&p);
}
END_TEST

/* A valid reference call on the batch of p, with one thing changed by `edit`. */
typedef struct Bad {
  const char *row, *want;
  int status;
} Bad;

static void expect(P *p, flex_args *a, const Bad *b, bool backward) {
  flex_status st = backward ? flex_backward(p->kern, a) : flex_forward(p->kern, a);
  ck_assert_msg((int)st == b->status, "%s: status %d, want %d (%s)", b->row, st, b->status,
                flex_last_error());
  ck_assert_msg(strstr(flex_last_error(), b->want), "%s: message '%s' lacks '%s'", b->row,
                flex_last_error(), b->want);
}

START_TEST(validation) {
  P p;
  p_init(&p, &cases[0], rt_dtype(kDLFloat, 32), 16, false);
  Out o;
  out_init(&o, &p, rt_dtype(kDLFloat, 32));
  int64_t s[3][4], t[3][4];
  DLTensor q = padded4(&p.q.t, s[0], t[0], p.QL), out = padded4(&o.out.t, s[1], t[1], p.QL);
  DLTensor lse = padded3(&o.lse.t, s[2], t[2], p.QL);
  flex_args base;
  memset(&base, 0, sizeof base);
  base.backend = FLEX_BACKEND_REFERENCE;
  base.q = &q, base.k = &p.pk.t, base.v = &p.pv.t, base.out = &out, base.lse = &lse;
  base.page_table = &p.pt.t, base.kv_lens = &p.kvl.t;
  base.buffers = p.fb, base.nbuffers = p.nbuf;
  ck_assert_msg(flex_forward(p.kern, &base) == FLEX_OK, "%s", flex_last_error());
  flex_args a;
  /* page_table dtype */
  TlArr pt64;
  tl_arr_init(&pt64, rt_dtype(kDLInt, 64), 2, p.pt.a.shape);
  a = base, a.page_table = &pt64.t;
  expect(&p, &a, &(Bad){"table dtype", "page_table: expected int32, got int64", FLEX_ERR_INVALID}, false);
  /* page_table shape */
  DLTensor pts = p.pt.t;
  int64_t sh2[2] = {p.B - 1, p.MP};
  pts.shape = sh2;
  a = base, a.page_table = &pts;
  expect(&p, &a, &(Bad){"table shape", "page_table: expected shape [4, ", FLEX_ERR_INVALID}, false);
  /* kv_lens missing, shape, device */
  a = base, a.kv_lens = NULL;
  expect(&p, &a, &(Bad){"lens missing", "kv_lens: missing: a paged call needs both", FLEX_ERR_INVALID}, false);
  DLTensor kvs = p.kvl.t;
  int64_t sh1[1] = {p.B + 1};
  kvs.shape = sh1;
  a = base, a.kv_lens = &kvs;
  expect(&p, &a, &(Bad){"lens shape", "kv_lens: expected shape [4] [B], got [5]", FLEX_ERR_INVALID}, false);
  DLTensor kvd = p.kvl.t;
  kvd.device.device_type = kDLCUDA;
  a = base, a.kv_lens = &kvd;
  expect(&p, &a, &(Bad){"lens device", "kv_lens: expected q's device cpu", FLEX_ERR_INVALID}, false);
  /* a length past the table */
  int32_t *lens = p.kvl.a.data, keep = lens[1];
  lens[1] = p.MP * p.PS + 1;
  a = base;
  expect(&p, &a, &(Bad){"lens too long", "kv_lens: sequence 1 has", FLEX_ERR_INVALID}, false);
  lens[1] = -1;
  expect(&p, &a, &(Bad){"lens negative", "kv_lens: sequence 1 has -1 keys", FLEX_ERR_INVALID}, false);
  lens[1] = keep;
  /* page sizes out of 16..256 */
  DLTensor k8 = p.pk.t, v8 = p.pv.t;
  int64_t ks8[4] = {p.NP * 2, 8, p.HKV, p.E}, vs8[4] = {p.NP * 2, 8, p.HKV, p.EV};
  k8.shape = ks8, v8.shape = vs8;
  a = base, a.k = &k8, a.v = &v8;
  expect(&p, &a, &(Bad){"page size", "k: PAGE_SIZE (dimension 1 of the pool) must be 16..256, got 8",
                        FLEX_ERR_INVALID}, false);
  /* v's pool unlike k's */
  DLTensor vb = p.pv.t;
  int64_t vsb[4] = {p.NP - 1, p.PS, p.HKV, p.EV};
  vb.shape = vsb;
  a = base, a.v = &vb;
  expect(&p, &a, &(Bad){"v pool", "v: expected shape", FLEX_ERR_INVALID}, false);
  /* k as a contiguous [B, HKV, KV_LEN, E] is not a pool of the right rank */
  DLTensor k3 = p.k.t;
  a = base, a.k = &k3;
  expect(&p, &a, &(Bad){"k rank", "k: a paged call expects a rank-4 tensor (NUM_PAGES, PAGE_SIZE, HKV, E)",
                        FLEX_ERR_INVALID}, false);
  /* cu_seqlens_kv beside a page table */
  a = base, a.cu_seqlens_kv = &p.cuk.t;
  expect(&p, &a, &(Bad){"cu_seqlens_kv", "cu_seqlens_kv: not accepted in a paged call", FLEX_ERR_INVALID}, false);
  /* out of the padded layout */
  a = base, a.out = &o.out.t;
  expect(&p, &a, &(Bad){"out rank", "out: a paged call expects a rank-4 tensor", FLEX_ERR_INVALID}, false);
  /* an out-of-range page index: refused on the reference (it gathers on the host) */
  int32_t *pt = p.pt.a.data, keep_pg = pt[1 * p.MP + 1];
  int bad_b = -1;
  for (int b = 0; b < p.B && bad_b < 0; b++)
    if (p.lens[b] > p.PS) bad_b = b;
  keep_pg = pt[bad_b * p.MP + 1];
  int last = (p.lens[bad_b] < 2 * p.PS ? p.lens[bad_b] : 2 * p.PS) - 1; /* logical page 1's last key */
  pt[bad_b * p.MP + 1] = p.NP;
  char want[128];
  snprintf(want, sizeof want, "page_table: sequence %d, logical page 1 (keys %d..%d) holds page index %d, "
           "outside the pool's NUM_PAGES=%d", bad_b, p.PS, last, p.NP, p.NP);
  a = base;
  expect(&p, &a, &(Bad){"page index (reference)", want, FLEX_ERR_INVALID}, false);
  a.check_bounds = true;
  expect(&p, &a, &(Bad){"page index (reference, checked)", want, FLEX_ERR_RUNTIME}, false);
  if (flex_backend_available(FLEX_BACKEND_EMU)) {
    a.backend = FLEX_BACKEND_EMU; /* a checked run reports it before any launch */
    expect(&p, &a, &(Bad){"page index (emu, checked)", want, FLEX_ERR_RUNTIME}, false);
  }
  pt[bad_b * p.MP + 1] = -1;
  snprintf(want, sizeof want, "sequence %d, logical page 1 (keys %d..%d) holds page index -1", bad_b,
           p.PS, last);
  a = base, a.check_bounds = true;
  expect(&p, &a, &(Bad){"negative page index", want, FLEX_ERR_RUNTIME}, false);
  pt[bad_b * p.MP + 1] = keep_pg;
  /* the backward */
  a = base;
  a.dout = &out, a.dq = &q;
  expect(&p, &a, &(Bad){"backward", "page_table: a paged key/value cache is forward only",
                        FLEX_ERR_UNSUPPORTED}, true);
  tl_arr_free(&pt64);
  out_free(&o);
  p_free(&p);
}
END_TEST

/* Buffers shaped by KV_LEN differ per sequence: refused. */
START_TEST(kv_len_buffer_refused) {
  const char *src = "buffer w: f32[KV_LEN];\nscore sc(s, b, h, q, kv) { return s + w[kv]; }\n";
  P p;
  p_init(&p, &cases[0], rt_dtype(kDLFloat, 32), 16, true);
  flex_kernel *k;
  ck_assert(flex_kernel_from_source(&k, "w", src, strlen(src), NULL) == FLEX_OK);
  Out o;
  out_init(&o, &p, rt_dtype(kDLFloat, 32));
  TlArr w;
  int64_t n = 4;
  tl_arr_init(&w, rt_dtype(kDLFloat, 32), 1, &n);
  flex_buffer fb = {"w", &w.t, NULL};
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = FLEX_BACKEND_REFERENCE;
  a.q = &p.q.t, a.k = &p.pk.t, a.v = &p.pv.t, a.out = &o.out.t, a.lse = &o.lse.t;
  a.cu_seqlens_q = &p.cuq.t, a.page_table = &p.pt.t, a.kv_lens = &p.kvl.t;
  a.buffers = &fb, a.nbuffers = 1;
  ck_assert_int_eq(flex_forward(k, &a), FLEX_ERR_INVALID);
  ck_assert_msg(strstr(flex_last_error(), "buffer 'w': dimension 0 is declared KV_LEN, which differs "
                                          "per sequence in a paged call"), "%s", flex_last_error());
  tl_arr_free(&w);
  flex_kernel_free(k);
  out_free(&o);
  p_free(&p);
}
END_TEST

/* flexc run --page-table/--kv-lens: pools in .npy files; the results equal
 * the contiguous (--cu-seqlens-q/-kv) run's, bitwise, on the reference and
 * the emulator. */
START_TEST(cli_run_paged) {
  char dir[] = "/tmp/flexc-paged-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  P p;
  p_init(&p, &cases[0], rt_dtype(kDLFloat, 32), 16, true);
  const RtArray *in[8] = {&p.q.a, &p.k.a, &p.v.a, &p.pk.a, &p.pv.a, &p.pt.a, &p.kvl.a, &p.cuq.a};
  const char *names[8] = {"q", "k", "v", "pk", "pv", "pt", "kl", "cq"};
  char path[9][600], cmd[8192];
  for (int i = 0; i < 8; i++) {
    snprintf(path[i], sizeof path[i], "%s/%s.npy", dir, names[i]);
    ck_assert_int_eq(rt_npy_write(path[i], in[i]), 0);
  }
  snprintf(path[8], sizeof path[8], "%s/ck.npy", dir);
  ck_assert_int_eq(rt_npy_write(path[8], &p.cuk.a), 0);
  const char *score = tl_src_path("samples/causal_lower_right.score");
  for (int be = 0; be < 2; be++) {
    if (be && !flex_backend_available(FLEX_BACKEND_EMU)) break;
    const char *bn = be ? "emu" : "reference";
    Buf log = {0};
    snprintf(cmd, sizeof cmd, "%s run %s --q %s --k %s --v %s --cu-seqlens-q %s --cu-seqlens-kv %s "
             "--backend %s --out %s/c", tl_flexc(), score, path[0], path[1], path[2], path[7], path[8], bn, dir);
    int rc = tl_run(cmd, &log);
    ck_assert_msg(rc == 0, "contiguous: exit %d: %s", rc, log.data);
    snprintf(cmd, sizeof cmd, "%s run %s --q %s --k %s --v %s --cu-seqlens-q %s --page-table %s "
             "--kv-lens %s --backend %s --out %s/p", tl_flexc(), score, path[0], path[3], path[4], path[7],
             path[5], path[6], bn, dir);
    rc = tl_run(cmd, &log);
    ck_assert_msg(rc == 0, "paged: exit %d: %s", rc, log.data);
    for (int f = 0; f < 2; f++) {
      char a[700], b[700];
      snprintf(a, sizeof a, "%s/c/%s.npy", dir, f ? "lse" : "out");
      snprintf(b, sizeof b, "%s/p/%s.npy", dir, f ? "lse" : "out");
      RtArray x, y;
      ck_assert_int_eq(rt_npy_read(a, &x), 0);
      ck_assert_int_eq(rt_npy_read(b, &y), 0);
      ck_assert_int_eq(rt_array_count(&x), rt_array_count(&y));
      ck_assert_msg(!memcmp(x.data, y.data, (size_t)rt_array_count(&x) * (x.dtype.bits / 8)),
                    "%s %s: paged run differs", bn, f ? "lse" : "out");
      rt_array_free(&x), rt_array_free(&y);
    }
    /* forward only: --dout refused */
    snprintf(cmd, sizeof cmd, "%s run %s --q %s --k %s --v %s --dout %s --cu-seqlens-q %s "
             "--page-table %s --kv-lens %s --backend %s --out %s/p", tl_flexc(), score, path[0],
             path[3], path[4], path[0], path[7], path[5], path[6], bn, dir);
    rc = tl_run(cmd, &log);
    ck_assert_msg(rc != 0 && strstr(log.data, "forward only"), "exit %d: %s", rc, log.data);
    buf_free(&log);
  }
  p_free(&p);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  Buf log = {0};
  tl_run(cmd, &log);
  buf_free(&log);
}
END_TEST

int main(int argc, char **argv) {
  rng = tl_seed();
  int rc = tl_cuda_mode(argc, argv);
  if (rc >= 0) return rc ? rc : TL_MAIN("cuda_paged", 0, TL_CASE("cuda", 0), TL_LOOP(cuda_against_reference, 6));
  tl_one_process(); /* the emulator's modules serve several tests */
  return TL_MAIN("paged", 600, TL_TEST(validation), TL_TEST(kv_len_buffer_refused), TL_TEST(cli_run_paged),
                 TL_LOOP(reference_paged_bitwise, 12), TL_LOOP(emu_fp32_bitwise, 12),
                 TL_LOOP(emu_against_reference, 6), TL_LOOP(cpu_against_reference, 3),
                 TL_LOOP(cuda_against_reference, 6));
}
