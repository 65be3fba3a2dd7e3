/* testlib_call.c: one attention call on a backend against the float64
 * reference, the fixture the numerical suites share (testlib.h, TlCall).
 *
 * The inputs are drawn once, in the tested dtype, and both calls read the
 * very same tensors (the reference decodes fp16 and bf16 exactly), so the
 * error measured is the tested backend's own. Outputs start as NaN, so an
 * element nobody writes fails; every element is compared. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "testlib.h"

static const TlDtype *dtype_of(const TlCall *c) { return c->c.dt ? c->c.dt : &tl_dtypes[0]; }

static TlArr *outputs(TlCall *c, int side, int i) {
  TlArr *o[5] = {&c->out[side], &c->lse[side], &c->dq[side], &c->dk[side], &c->dv[side]};
  return o[i];
}

void tl_call_poison(TlCall *c, int side) {
  for (int i = 0; i < 5; i++) tl_arr_poison(outputs(c, side, i));
  for (int i = 0; i < c->nb; i++)
    if (c->grad[i]) tl_arr_poison(&c->gbuf[side][i]);
}

/* Offsets 0, l0, l0 + l1, ... of B lengths. */
static int offsets(TlArr *cu, const int *lens, int B) {
  int64_t n = B + 1;
  tl_arr_init(cu, rt_dtype(kDLInt, 32), 1, &n);
  int total = 0;
  for (int b = 0; b < B; b++) rt_array_set(&cu->a, b + 1, total += lens[b]);
  return total;
}

void tl_call_init(TlCall *c, const TlCase *tc, uint64_t *rng) {
  memset(c, 0, sizeof *c);
  c->c = *tc, c->rng = rng;
  char path[256];
  if (tc->sample) snprintf(path, sizeof path, "samples/%s.score", tc->sample);
  c->kern = tl_load(tc->sample ? path : NULL, tc->name, tc->src);
  const TlShape *s = &tc->s;
  const TlDtype *d = dtype_of(c);
  DLDataType dt = rt_dtype(d->code, d->bits), f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  bool packed = tc->lens_q != NULL;
  c->TQ = packed ? offsets(&c->cuq, tc->lens_q, s->B) : s->QL;
  c->TK = packed ? offsets(&c->cuk, tc->lens_kv, s->B) : s->KL;
  int64_t qs[4] = {s->B, s->H, s->QL, s->E}, ks[4] = {s->B, s->HKV, s->KL, s->E};
  int64_t vs[4] = {s->B, s->HKV, s->KL, s->EV}, os[4] = {s->B, s->H, s->QL, s->EV};
  int64_t ls[3] = {s->B, s->H, s->QL};
  if (packed) { /* q (TQ, H, E), k (TK, HKV, E), v (TK, HKV, EV), out (TQ, H, EV), lse (H, TQ) */
    int64_t pq[3] = {c->TQ, s->H, s->E}, pk[3] = {c->TK, s->HKV, s->E};
    int64_t pv[3] = {c->TK, s->HKV, s->EV}, po[3] = {c->TQ, s->H, s->EV}, pl[2] = {s->H, c->TQ};
    memcpy(qs, pq, sizeof pq), memcpy(ks, pk, sizeof pk), memcpy(vs, pv, sizeof pv);
    memcpy(os, po, sizeof po), memcpy(ls, pl, sizeof pl);
  }
  int r = packed ? 3 : 4;
  if (tc->page_size) { /* k (NP, PS, HKV, E), v (NP, PS, HKV, EV): B * max_pages pages, used backwards */
    int mp = tc->max_pages ? tc->max_pages : (s->KL + tc->page_size - 1) / tc->page_size, np = s->B * mp;
    int64_t pk[4] = {np, tc->page_size, s->HKV, s->E}, pv[4] = {np, tc->page_size, s->HKV, s->EV};
    int64_t pts[2] = {s->B, mp}, kls[1] = {s->B};
    memcpy(ks, pk, sizeof pk), memcpy(vs, pv, sizeof pv);
    tl_arr_init(&c->pt, rt_dtype(kDLInt, 32), 2, pts), tl_arr_init(&c->kvl, rt_dtype(kDLInt, 32), 1, kls);
    for (int b = 0; b < s->B; b++) {
      rt_array_set(&c->kvl.a, b, tc->kv_lens[b]);
      for (int i = 0; i < mp; i++) rt_array_set(&c->pt.a, b * mp + i, np - 1 - (b * mp + i));
    }
  }
  tl_arr_init(&c->q, dt, r, qs), tl_arr_normal(&c->q, rng);
  tl_arr_init(&c->k, dt, r, ks), tl_arr_normal(&c->k, rng);
  tl_arr_init(&c->v, dt, r, vs), tl_arr_normal(&c->v, rng);
  tl_arr_init(&c->dout, dt, r, os), tl_arr_normal(&c->dout, rng);
  tl_arr_init(&c->dlse, f32, r - 1, ls), tl_arr_normal(&c->dlse, rng);
  for (int i = 0; i < 2; i++) {
    DLDataType o = i ? f64 : tc->native_out ? dt : f32, g = i ? f64 : tc->native_grads ? dt : f32;
    tl_arr_init(&c->out[i], o, r, os), tl_arr_init(&c->lse[i], i ? f64 : f32, r - 1, ls);
    tl_arr_init(&c->dq[i], g, r, qs), tl_arr_init(&c->dk[i], g, r, ks), tl_arr_init(&c->dv[i], g, r, vs);
    tl_call_poison(c, i);
    flex_args *a = &c->a[i];
    a->backend = i ? FLEX_BACKEND_REFERENCE : tc->backend;
    a->arch = i ? NULL : tc->arch;
    a->deterministic = !i && tc->deterministic;
    a->scale = tc->scale;
    a->q = &c->q.t, a->k = &c->k.t, a->v = &c->v.t, a->dout = &c->dout.t;
    a->dlse = tc->dlse ? &c->dlse.t : NULL;
    a->out = &c->out[i].t, a->lse = &c->lse[i].t;
    a->dq = &c->dq[i].t, a->dk = &c->dk[i].t, a->dv = &c->dv[i].t;
    a->params = c->params, a->buffers = c->fb[i];
    if (packed) a->cu_seqlens_q = &c->cuq.t, a->cu_seqlens_kv = &c->cuk.t;
    if (tc->page_size) a->page_table = &c->pt.t, a->kv_lens = &c->kvl.t;
  }
}

void tl_call_param(TlCall *c, const char *name, double value) {
  ck_assert_int_lt(c->np, TL_MAXPARAM);
  c->params[c->np++] = (flex_param){name, value};
  c->a[0].nparams = c->a[1].nparams = c->np;
}

TlArr *tl_call_buffer(TlCall *c, const char *name, DLDataType dt, int nd, const int64_t *shape,
                      bool grad) {
  ck_assert_int_lt(c->nb, TL_MAXBUF);
  int i = c->nb++;
  tl_arr_init(&c->buf[i], dt, nd, shape);
  c->grad[i] = grad;
  for (int side = 0; side < 2; side++) {
    c->fb[side][i] = (flex_buffer){name, &c->buf[i].t, NULL};
    if (!grad) continue;
    tl_arr_init(&c->gbuf[side][i], rt_dtype(kDLFloat, side ? 64 : 32), nd, shape);
    tl_arr_poison(&c->gbuf[side][i]);
    c->fb[side][i].grad = &c->gbuf[side][i].t;
  }
  c->a[0].nbuffers = c->a[1].nbuffers = c->nb;
  return &c->buf[i];
}

/* Sorted document ids for n tokens: runs of random length. */
static void fill_docs(TlArr *d, int n, uint64_t *rng) {
  int32_t id = 0;
  for (int i = 0; i < n; i++) {
    if (i && tl_uniform(rng) < 0.12) id++;
    rt_array_set(&d->a, i, id);
  }
}

void tl_call_sample_extras(TlCall *c) {
  const char *name = c->c.sample;
  const TlShape *s = &c->c.s;
  uint64_t *rng = c->rng;
  DLDataType f32 = rt_dtype(kDLFloat, 32), i32 = rt_dtype(kDLInt, 32);
  int64_t H[1] = {s->H}, Bn[1] = {s->B};
  if (!strcmp(name, "alibi") || !strcmp(name, "gemma2"))
    tl_arr_uniform(tl_call_buffer(c, "slopes", f32, 1, H, false), 0.05, 0.5, rng);
  if (!strcmp(name, "gemma2")) tl_call_param(c, "softcap", 4.0), tl_call_param(c, "window", 13);
  if (!strcmp(name, "dilated")) tl_call_param(c, "dilation", 3); /* rows q < h % 3 see nothing */
  if (!strcmp(name, "document")) {
    int64_t T[1] = {s->QL > s->KL ? s->QL : s->KL};
    fill_docs(tl_call_buffer(c, "doc", i32, 1, T, false), (int)T[0], rng);
  }
  if (!strcmp(name, "head_temperature")) {
    tl_arr_normal(tl_call_buffer(c, "temp", f32, 1, H, true), rng);
    TlArr *len = tl_call_buffer(c, "lengths", i32, 1, Bn, false);
    /* Batch 0 is all padding when there are two (empty rows); other lengths
     * are at least 2: with one key every row's softmax is constant and the
     * true dq, dk and d_temp are exactly zero, which a relative error cannot
     * measure. */
    for (int b = 0; b < s->B; b++)
      rt_array_set(&len->a, b, s->B > 1 && b == 0 ? 0 : 2 + (int)(tl_uniform(rng) * (s->KL - 1)));
  }
  if (!strcmp(name, "natten")) tl_call_param(c, "width", 8), tl_call_param(c, "radius", 1);
  if (!strcmp(name, "natten_gym") || !strcmp(name, "natten_tiled")) {
    tl_call_param(c, "width", 8), tl_call_param(c, "height", 8);
    tl_call_param(c, "kernel_w", 3), tl_call_param(c, "kernel_h", 5);
  }
  if (!strcmp(name, "natten_tiled")) tl_call_param(c, "tile_w", 4), tl_call_param(c, "tile_h", 4);
  if (!strcmp(name, "paged")) {
    /* Pages of 8 keys; every third physical page belongs to another
     * sequence (-1), the others are placed at shuffled logical positions. */
    tl_call_param(c, "page_size", 8);
    int pages = (s->KL + 7) / 8;
    int64_t shape[2] = {s->B, pages};
    TlArr *l = tl_call_buffer(c, "logical", i32, 2, shape, false);
    for (int b = 0; b < s->B; b++)
      for (int pg = 0; pg < pages; pg++)
        rt_array_set(&l->a, (int64_t)b * pages + pg, (pg + b) % 3 == 0 ? -1 : (pg * 5 + b) % pages);
  }
  if (!strcmp(name, "prefix_lm")) tl_call_param(c, "prefix", 9);
  if (!strcmp(name, "relpos_bias")) {
    int64_t shape[2] = {s->H, 9};
    tl_arr_normal(tl_call_buffer(c, "rel_bias", f32, 2, shape, true), rng);
  }
  if (!strcmp(name, "sliding_window")) tl_call_param(c, "window", 10);
  /* Learned sinks around the rows' own logits (0 to a few), some above
   * every key's: the keys' weights then sum well below 1. */
  if (!strncmp(name, "sink_", 5) && strcmp(name, "sink_per_query"))
    tl_arr_uniform(tl_call_buffer(c, "sinks", f32, 1, H, true), -1.0, 3.0, rng);
  if (!strcmp(name, "sink_window")) tl_call_param(c, "window", 6);
  if (!strcmp(name, "sink_per_query")) {
    tl_arr_uniform(tl_call_buffer(c, "base", f32, 1, H, true), -1.0, 1.0, rng);
    tl_arr_uniform(tl_call_buffer(c, "growth", f32, 1, H, true), 0.0, 0.5, rng);
  }
  if (!strcmp(name, "softcap")) tl_call_param(c, "softcap", 2.5);
}

void tl_call_block_mask(TlCall *c, flex_kernel *mask_kernel, int bq, int bk) {
  const TlShape *s = &c->c.s;
  flex_block_mask_free(c->bm);
  c->bm = NULL;
  ck_assert_msg(flex_block_mask_create(&c->bm, mask_kernel ? mask_kernel : c->kern, &c->a[1], s->B, s->H,
                                       s->QL, s->KL, bq, bk, NULL) == FLEX_OK,
                "BlockMask %dx%d: %s", bq, bk, flex_last_error());
  c->a[0].block_mask = c->a[1].block_mask = c->bm;
}

flex_status tl_call_run(TlCall *c, int i, bool backward) {
  return tl_call(c->kern, &c->a[i], backward);
}

/* One verb on side i; a failure aborts with the backend's message. */
static void run(TlCall *c, int i, bool backward) {
  flex_status st = tl_call_run(c, i, backward);
  const flex_args *a = &c->a[i];
  ck_assert_msg(st == FLEX_OK, "%s %s %s: %s", c->c.sample ? c->c.sample : c->c.name,
                flex_backend_name(a->backend), backward ? "backward" : "forward", flex_last_error());
}

void tl_call_forward(TlCall *c) { run(c, 1, false), run(c, 0, false); }

void tl_call_backward(TlCall *c) { run(c, 1, true), run(c, 0, true); }

void tl_call_ref_outputs(TlCall *c) {
  run(c, 1, false);
  for (int j = 0; j < 2; j++) {
    TlArr *x = outputs(c, 0, j), *ref = outputs(c, 1, j);
    for (int64_t i = 0; i < rt_array_count(&x->a); i++) {
      rt_array_set(&x->a, i, rt_array_get(&ref->a, i));
      rt_array_set(&ref->a, i, rt_array_get(&x->a, i));
    }
  }
}

int64_t tl_mismatches(const char *what, const RtArray *x, const RtArray *ref, double tol, int max) {
  int64_t n = rt_array_count(ref), bad = 0;
  if (rt_array_count(x) != n) {
    fprintf(stderr, "    %s: %lld elements, the reference %lld\n", what, (long long)rt_array_count(x),
            (long long)n);
    return n ? n : 1;
  }
  double ss = 0;
  for (int64_t i = 0; i < n; i++) {
    double r = rt_array_get(ref, i);
    if (isfinite(r)) ss += r * r;
  }
  double lim = tol * (n ? sqrt(ss / (double)n) : 0);
  for (int64_t i = 0; i < n; i++) {
    double a = rt_array_get(x, i), r = rt_array_get(ref, i);
    bool same_inf = isinf(r) && a == r;
    if (same_inf || (!isnan(a) && !isnan(r) && fabs(a - r) <= lim)) continue;
    if (bad++ >= max) continue;
    char at[128];
    int len = 0;
    int64_t rest = i;
    for (int d = x->ndim - 1; d >= 0; d--) /* coordinates, last dim first */
      len += snprintf(at + len, sizeof at - (size_t)len, d == x->ndim - 1 ? "%lld" : ",%lld",
                      (long long)(rest % (x->shape[d] ? x->shape[d] : 1))),
          rest /= x->shape[d] ? x->shape[d] : 1;
    fprintf(stderr, "    %s[flat %lld, (last dim first) %s]: %.9g, reference %.9g\n", what,
            (long long)i, at, a, r);
  }
  if (bad) fprintf(stderr, "    %s: %lld of %lld elements off by more than %.3g\n", what, (long long)bad,
                   (long long)n, lim);
  return bad;
}

/* Element offset of (row r of lse, column e) in an output with `cols`
 * columns: lse is [B, H, QL] padded, [H, TQ] packed. */
static int64_t row_at(const TlCall *c, int64_t r, int cols, int e) {
  if (!c->c.lens_q) return r * cols + e;
  int64_t h = r / c->TQ, t = r % c->TQ;
  return (t * c->c.s.H + h) * cols + e;
}

/* The reference's fully masked rows (LSE -inf) exactly as DSL.md says on
 * the tested side: LSE -inf, O 0 (forward), dQ 0 (backward). Counts them
 * into c->masked; false (the first offence printed) when one is not. */
static bool masked_rows_exact(TlCall *c, unsigned what, const char *label) {
  int64_t rows = rt_array_count(&c->lse[1].a);
  c->masked = 0;
  bool ok = true;
  for (int64_t r = 0; r < rows; r++) {
    if (rt_array_get(&c->lse[1].a, r) != -INFINITY) continue;
    c->masked++;
    const char *name = NULL;
    int e = 0;
    double v = 0;
    if ((what & TL_FWD) && (v = rt_array_get(&c->lse[0].a, r)) != -INFINITY) name = "lse", e = -1;
    for (int j = 0; !name && (what & TL_FWD) && j < c->c.s.EV; j++)
      if ((v = rt_array_get(&c->out[0].a, row_at(c, r, c->c.s.EV, j))) != 0) name = "out", e = j;
    for (int j = 0; !name && (what & TL_BWD) && j < c->c.s.E; j++)
      if ((v = rt_array_get(&c->dq[0].a, row_at(c, r, c->c.s.E, j))) != 0) name = "dq", e = j;
    if (name && ok)
      fprintf(stderr, "  %s: fully masked row %lld: %s[%d] = %g, want %s\n", label, (long long)r, name, e, v,
              e < 0 ? "-inf" : "0");
    ok &= !name;
  }
  return ok;
}

/* The gradients' errors against the reference's gradients as they stand;
 * slack and gslack (per buffer; NULL: none) are the sensitivities allowed
 * on top of the tolerance. dbuf is the buffer with the least margin. */
static void grad_errors(TlCall *c, const double *slack, const double *gslack) {
  for (int i = TL_DQ; i < TL_DBUF; i++)
    c->err[i] = tl_rel_err(&outputs(c, 0, i)->a, &outputs(c, 1, i)->a), c->slack[i] = slack ? slack[i] : 0;
  c->err[TL_DBUF] = c->slack[TL_DBUF] = 0;
  bool first = true;
  for (int b = 0; b < c->nb; b++)
    if (c->grad[b]) {
      double e = tl_rel_err(&c->gbuf[0][b].a, &c->gbuf[1][b].a), sl = gslack ? gslack[b] : 0;
      /* a NaN error must win, not vanish as in fmax */
      if (first || !(e - sl <= c->err[TL_DBUF] - c->slack[TL_DBUF])) c->err[TL_DBUF] = e, c->slack[TL_DBUF] = sl;
      first = false;
    }
}

/* A backward reads O as given (D = rowsum(dO O)): where a gradient misses,
 * the reference is given the tested call's O and LSE and runs its backward
 * again, and each gradient may differ from that by its dtype's tolerance
 * plus TL_SENSITIVITY_ROUNDINGS times how far the reference's gradient moved
 * between its own O and the tested one: the gradient's measured
 * sensitivity to one rounding of the tested dtype (the tested call rounds
 * P and dS too). A well-conditioned gradient moves by about the unit
 * roundoff; one nearly 0 by cancellation (a per-head scalar summed over
 * every score) moves by more than its size (docs/testing.md). Returns
 * whether it ran. */
static bool judge_given_o(TlCall *c, const double *tol) {
  bool missed = false;
  for (int i = TL_DQ; i < TL_NERR; i++) missed |= !(c->err[i] < tol[i]);
  if (!missed) return false;
  RtArray exact[3], gexact[TL_MAXBUF];
  for (int i = TL_DQ; i < TL_DBUF; i++) tl_array_copy(&exact[i - TL_DQ], &outputs(c, 1, i)->a);
  for (int b = 0; b < c->nb; b++)
    if (c->grad[b]) tl_array_copy(&gexact[b], &c->gbuf[1][b].a);
  for (int j = TL_OUT; j <= TL_LSE; j++)
    for (int64_t k = 0; k < rt_array_count(&outputs(c, 1, j)->a); k++)
      rt_array_set(&outputs(c, 1, j)->a, k, rt_array_get(&outputs(c, 0, j)->a, k));
  run(c, 1, true);
  double slack[TL_DBUF] = {0}, gslack[TL_MAXBUF] = {0};
  for (int i = TL_DQ; i < TL_DBUF; i++) {
    slack[i] = TL_SENSITIVITY_ROUNDINGS * tl_rel_moved(&exact[i - TL_DQ], &outputs(c, 1, i)->a);
    rt_array_free(&exact[i - TL_DQ]);
  }
  for (int b = 0; b < c->nb; b++)
    if (c->grad[b]) {
      gslack[b] = TL_SENSITIVITY_ROUNDINGS * tl_rel_moved(&gexact[b], &c->gbuf[1][b].a);
      rt_array_free(&gexact[b]);
    }
  grad_errors(c, slack, gslack);
  return true;
}

bool tl_call_compare(TlCall *c, unsigned what, const char *label) {
  static const char *const names[TL_NERR] = {"out", "lse", "dq", "dk", "dv", "dbuf"};
  const TlDtype *d = dtype_of(c);
  const TlShape *s = &c->c.s;
  double tol[TL_NERR];
  for (int i = 0; i < TL_NERR; i++) tol[i] = i < TL_DQ ? d->tol : d->gtol, c->err[i] = c->slack[i] = 0;
  if (what & TL_FWD)
    for (int i = TL_OUT; i <= TL_LSE; i++) c->err[i] = tl_rel_err(&outputs(c, 0, i)->a, &outputs(c, 1, i)->a);
  bool given_o = false;
  if (what & TL_BWD) grad_errors(c, NULL, NULL), given_o = judge_given_o(c, tol);
  bool ok = masked_rows_exact(c, what, label);
  fprintf(stderr, "  %-18s %s %s%s%s B%d H%d/%d L%d/%d E%d/%d%s%s%s:", label, d->name,
          flex_backend_name(c->c.backend), c->c.arch ? " " : "", c->c.arch ? c->c.arch : "", s->B,
          s->H, s->HKV, c->TQ, c->TK, s->E, s->EV, c->c.lens_q ? " packed" : "",
          c->c.dlse ? " dlse" : "", c->c.deterministic ? " deterministic" : "");
  for (int i = 0; i < TL_NERR; i++)
    if (what & (i < TL_DQ ? TL_FWD : TL_BWD))
      fprintf(stderr, c->slack[i] > 0 ? " %s %.2g (allowed %.2g)" : " %s %.2g", names[i], c->err[i],
              tol[i] + c->slack[i]);
  fprintf(stderr, ", %d masked rows%s\n", c->masked,
          given_o ? "; gradients given the tested O, allowed their measured sensitivity" : "");
  for (int i = 0; i < TL_NERR; i++) {
    tol[i] += c->slack[i];
    if (c->err[i] < tol[i] || !(what & (i < TL_DQ ? TL_FWD : TL_BWD))) continue;
    ok = false;
    if (i < TL_DBUF) tl_mismatches(names[i], &outputs(c, 0, i)->a, &outputs(c, 1, i)->a, tol[i], 8);
    for (int b = 0; i == TL_DBUF && b < c->nb; b++)
      if (c->grad[b]) tl_mismatches(c->fb[0][b].name, &c->gbuf[0][b].a, &c->gbuf[1][b].a, tol[i], 8);
  }
  return ok;
}

void tl_call_check(TlCall *c, unsigned what, const char *label) {
  const TlDtype *d = dtype_of(c);
  ck_assert_msg(tl_call_compare(c, what, label),
                "%s %s: error out %g lse %g dq %g dk %g dv %g dbuf %g (tol %g, gradients %g plus the "
                "sensitivities above), or a fully "
                "masked row not exact (above)", label, d->name, c->err[0], c->err[1], c->err[2], c->err[3],
                c->err[4], c->err[5], d->tol, d->gtol);
}

void tl_call_free(TlCall *c) {
  TlArr *in[] = {&c->q, &c->k, &c->v, &c->dout, &c->dlse, &c->cuq, &c->cuk, &c->pt, &c->kvl};
  for (size_t i = 0; i < sizeof in / sizeof *in; i++) tl_arr_free(in[i]);
  for (int side = 0; side < 2; side++)
    for (int i = 0; i < 5; i++) tl_arr_free(outputs(c, side, i));
  for (int i = 0; i < c->nb; i++) {
    tl_arr_free(&c->buf[i]);
    if (c->grad[i]) tl_arr_free(&c->gbuf[0][i]), tl_arr_free(&c->gbuf[1][i]);
  }
  flex_block_mask_free(c->bm);
  flex_kernel_free(c->kern);
}
