/* blockmask.c: building and validating block masks (docs/blockmask.md).
 *
 * Every builder first fills one byte per block (empty, full, partial), then
 * one routine lays the classes out in PyTorch's order, so the builders can
 * only differ in how they classify. */
#include "blockmask.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { C_EMPTY = 0, C_FULL = 1, C_PARTIAL = 2 }; /* a block's class */

static flex_status fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static flex_status fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return FLEX_ERR_INVALID;
}

/* In int64: a caller's block size may be close to INT_MAX, and a + b - 1
 * must not wrap (a wrapped count of 0 blocks would pass validation). */
static int ceil_div(int a, int b) { return (int)(((int64_t)a + b - 1) / b); }

/* A shape is the user's to choose, so a mask too large for this machine is
 * an error with the figures, not an allocation failure: the builder needs
 * one class byte and four int32 index entries per block, plus the counts. */
static flex_status check_fits(int B, int H, const RtMaskShape *s, char *err, size_t errlen) {
  int bq = s->block_q > 0 ? s->block_q : 128, bkv = s->block_kv > 0 ? s->block_kv : 128;
  double nq = ceil_div(s->q_len, bq), nkv = ceil_div(s->kv_len, bkv);
  double need = (double)B * H * (nq * nkv * 17.0 + (nq + nkv) * 16.0);
  double have = base_physical_memory();
  if (have > 0 && need > have / 2)
    return fail(err, errlen,
                "block mask: %d x %d (batch x head) masks of %.0f x %.0f blocks of %dx%d need "
                "%.1f GB, more than half of this machine's %.1f GB; use larger blocks or a "
                "smaller shape", B, H, nq, nkv, bq, bkv, need / 1e9, have / 1e9);
  return FLEX_OK;
}

/* Extents and zeroed arrays for a mask of the given geometry. */
static void alloc_mask(RtBlockMask *bm, int B, int H, const RtMaskShape *s, bool full) {
  memset(bm, 0, sizeof *bm);
  bm->B = B;
  bm->H = H;
  bm->q_len = s->q_len;
  bm->kv_len = s->kv_len;
  bm->block_q = s->block_q > 0 ? s->block_q : 128;
  bm->block_kv = s->block_kv > 0 ? s->block_kv : 128;
  bm->nq = ceil_div(s->q_len, bm->block_q);
  bm->nkv = ceil_div(s->kv_len, bm->block_kv);
  size_t bh = (size_t)B * (size_t)H, cells = bh * (size_t)bm->nq * (size_t)bm->nkv;
  bm->has_full = full;
  bm->kv_num_blocks = base_alloc(bh * (size_t)bm->nq * 4);
  bm->kv_indices = base_alloc(cells * 4);
  bm->q_num_blocks = base_alloc(bh * (size_t)bm->nkv * 4);
  bm->q_indices = base_alloc(cells * 4);
  if (full) {
    bm->full_kv_num_blocks = base_alloc(bh * (size_t)bm->nq * 4);
    bm->full_kv_indices = base_alloc(cells * 4);
    bm->full_q_num_blocks = base_alloc(bh * (size_t)bm->nkv * 4);
    bm->full_q_indices = base_alloc(cells * 4);
  }
}

void rt_block_mask_free(RtBlockMask *bm) {
  int32_t *arrs[8] = {bm->kv_num_blocks, bm->kv_indices, bm->full_kv_num_blocks,
                      bm->full_kv_indices, bm->q_num_blocks, bm->q_indices,
                      bm->full_q_num_blocks, bm->full_q_indices};
  for (int k = 0; k < 8; k++) base_free(arrs[k]);
  memset(bm, 0, sizeof *bm);
}

/* Lay out classes cls[B][H][nq][nkv]: ascending indices at the front of
 * each row, zeros behind. Without full_*, full blocks go with the partial
 * ones (the kernel then masks them too, which is harmless). */
static void layout(RtBlockMask *bm, const uint8_t *cls) {
  int nq = bm->nq, nkv = bm->nkv;
  for (int bh = 0; bh < bm->B * bm->H; bh++) {
    const uint8_t *c = cls + (size_t)bh * nq * nkv;
    for (int i = 0; i < nq; i++) { /* kv side: row i of this (b, h) */
      size_t row = (size_t)bh * nq + i;
      int np = 0, nf = 0;
      for (int j = 0; j < nkv; j++) {
        int k = c[(size_t)i * nkv + j];
        if (k == C_FULL && bm->has_full) bm->full_kv_indices[row * nkv + nf++] = j;
        else if (k != C_EMPTY) bm->kv_indices[row * nkv + np++] = j;
      }
      bm->kv_num_blocks[row] = np;
      if (bm->has_full) bm->full_kv_num_blocks[row] = nf;
    }
    for (int j = 0; j < nkv; j++) { /* q side: column j */
      size_t col = (size_t)bh * nkv + j;
      int np = 0, nf = 0;
      for (int i = 0; i < nq; i++) {
        int k = c[(size_t)i * nkv + j];
        if (k == C_FULL && bm->has_full) bm->full_q_indices[col * nq + nf++] = i;
        else if (k != C_EMPTY) bm->q_indices[col * nq + np++] = i;
      }
      bm->q_num_blocks[col] = np;
      if (bm->has_full) bm->full_q_num_blocks[col] = nf;
    }
  }
}

/* ---- classification by evaluation ------------------------------------------ */

/* One block's rectangle (inclusive). */
typedef struct Rect {
  int b0, b1, h0, h1, q0, q1, k0, k1;
} Rect;

/* State of the element-wise evaluator. */
typedef struct Evaluator {
  const IrModule *m;
  IrEnv env;        /* the interpreter's environment (params, sizes, buffers) */
  IrVal *vals;      /* scratch of m->mask->n values */
  int64_t count;    /* evaluations so far */
} Evaluator;

/* Evaluate the mask on every element of r, stopping as soon as both
 * values have been seen; -1 when a read failed (message in ev->env.error). */
static int eval_block(Evaluator *ev, const Rect *r) {
  bool seen_t = false, seen_f = false;
  for (int b = r->b0; b <= r->b1; b++)
    for (int h = r->h0; h <= r->h1; h++)
      for (int q = r->q0; q <= r->q1; q++)
        for (int kv = r->k0; kv <= r->k1; kv++) {
          ev->env.args[ARG_B] = ir_vi(b);
          ev->env.args[ARG_H] = ir_vi(h);
          ev->env.args[ARG_Q] = ir_vi(q);
          ev->env.args[ARG_KV] = ir_vi(kv);
          bool v = ir_eval(ev->m->mask, &ev->env, ev->vals).b;
          ev->count++;
          if (ev->env.failed) return -1;
          if (v) seen_t = true;
          else seen_f = true;
          if (seen_t && seen_f) return C_PARTIAL;
        }
  return seen_t ? C_FULL : C_EMPTY;
}

/* Block (i, j) of (b, h). A stored extent of 1 while the real one is
 * larger means the mask does not read that argument: any single value
 * stands for all of them. */
static Rect block_rect(const RtBlockMask *bm, int b, int h, int i, int j) {
  Rect r;
  r.b0 = r.b1 = b;
  r.h0 = r.h1 = h;
  r.q0 = i * bm->block_q;
  r.q1 = r.q0 + bm->block_q - 1 < bm->q_len - 1 ? r.q0 + bm->block_q - 1 : bm->q_len - 1;
  r.k0 = j * bm->block_kv;
  r.k1 = r.k0 + bm->block_kv - 1 < bm->kv_len - 1 ? r.k0 + bm->block_kv - 1 : bm->kv_len - 1;
  return r;
}

/* Classify every block by analysis and/or block-wise evaluation. */
static flex_status classify_blocks(const RtBlockMask *bm, const IrModule *m,
                                   const IrIntervalEnv *ienv, Evaluator *ev, RtMaskMode mode, uint8_t *cls,
                                   RtMaskStats *st, char *err, size_t errlen) {
  size_t n = 0;
  for (int b = 0; b < bm->B; b++)
    for (int h = 0; h < bm->H; h++)
      for (int i = 0; i < bm->nq; i++)
        for (int j = 0; j < bm->nkv; j++, n++) {
          Rect r = block_rect(bm, b, h, i, j);
          int c = C_PARTIAL;
          if (mode != RT_MASK_BLOCKWISE) {
            IrTri t = ir_interval_mask(m, ienv, r.b0, r.b1, r.h0, r.h1, r.q0, r.q1, r.k0, r.k1);
            c = t == IR_TRI_EMPTY ? C_EMPTY : t == IR_TRI_FULL ? C_FULL : C_PARTIAL;
            if (c == C_PARTIAL) st->undecided++;
          }
          if (c == C_PARTIAL && mode != RT_MASK_ANALYSIS) {
            c = eval_block(ev, &r);
            if (c < 0) return fail(err, errlen, "%s", ev->env.error);
            if (c != C_PARTIAL && mode == RT_MASK_EVAL) st->refined++;
          }
          cls[n] = (uint8_t)c;
        }
  return FLEX_OK;
}

/* The dense oracle: every element into a B*H*Q*KV byte tensor, then each
 * block reduced from it. For tests only. */
static flex_status classify_dense(const RtBlockMask *bm, Evaluator *ev, uint8_t *cls,
                                  char *err, size_t errlen) {
  size_t QL = (size_t)bm->q_len, KL = (size_t)bm->kv_len;
  uint8_t *dense = base_alloc((size_t)bm->B * bm->H * QL * KL);
  size_t e = 0;
  for (int b = 0; b < bm->B; b++)
    for (int h = 0; h < bm->H; h++)
      for (int q = 0; q < bm->q_len; q++)
        for (int kv = 0; kv < bm->kv_len; kv++, e++) {
          Rect r = {b, b, h, h, q, q, kv, kv};
          int c = eval_block(ev, &r);
          if (c < 0) {
            base_free(dense);
            return fail(err, errlen, "%s", ev->env.error);
          }
          dense[e] = c == C_FULL;
        }
  size_t n = 0;
  for (int bh = 0; bh < bm->B * bm->H; bh++)
    for (int i = 0; i < bm->nq; i++)
      for (int j = 0; j < bm->nkv; j++, n++) {
        Rect r = block_rect(bm, 0, 0, i, j);
        bool t = false, f = false;
        for (int q = r.q0; q <= r.q1; q++)
          for (int kv = r.k0; kv <= r.k1; kv++)
            if (dense[((size_t)bh * QL + q) * KL + kv]) t = true;
            else f = true;
        cls[n] = t && f ? C_PARTIAL : t ? C_FULL : C_EMPTY;
      }
  base_free(dense);
  return FLEX_OK;
}

flex_status rt_block_mask_build(RtBlockMask *out, const IrModule *m, const IrIntervalEnv *env,
                                const RtMaskShape *shape, RtMaskMode mode, RtMaskStats *stats,
                                char *err, size_t errlen) {
  CHECK(shape->B >= 1 && shape->H >= 1 && shape->q_len >= 1 && shape->kv_len >= 1);
  RtMaskStats local;
  RtMaskStats *st = stats ? stats : &local;
  memset(st, 0, sizeof *st);
  static const IrIntervalEnv none;
  if (!env) env = &none;
  int B = m->mask && ir_interval_uses_arg(m, ARG_B) ? shape->B : 1;
  int H = m->mask && ir_interval_uses_arg(m, ARG_H) ? shape->H : 1;
  flex_status fit = check_fits(B, H, shape, err, errlen);
  if (fit) return fit;
  alloc_mask(out, B, H, shape, true);
  size_t nblocks = (size_t)B * H * out->nq * out->nkv;
  uint8_t *cls = base_alloc(nblocks);
  flex_status rc = FLEX_OK;
  if (!m->mask) {
    memset(cls, C_FULL, nblocks);
  } else {
    Evaluator ev;
    memset(&ev, 0, sizeof ev);
    ev.m = m;
    ev.env.params = env->params;
    ev.env.sizes = env->sizes;
    ev.env.bufs = env->bufs;
    ev.env.mod = m;
    ev.vals = base_alloc((size_t)m->mask->n * sizeof *ev.vals);
    rc = mode == RT_MASK_DENSE ? classify_dense(out, &ev, cls, err, errlen)
                               : classify_blocks(out, m, env, &ev, mode, cls, st, err, errlen);
    st->evaluated = ev.count;
    base_free(ev.vals);
  }
  if (rc == FLEX_OK) {
    layout(out, cls);
    st->total = (int64_t)nblocks;
    for (size_t k = 0; k < nblocks; k++)
      cls[k] == C_FULL ? st->full++ : cls[k] == C_PARTIAL ? st->partial++ : st->empty++;
    st->decidable = ir_interval_decidable(m);
  } else {
    rt_block_mask_free(out);
  }
  base_free(cls);
  return rc;
}

bool rt_block_mask_equal(const RtBlockMask *a, const RtBlockMask *b) {
  if (a->B != b->B || a->H != b->H || a->nq != b->nq || a->nkv != b->nkv ||
      a->has_full != b->has_full)
    return false;
  size_t bh = (size_t)a->B * a->H, rows = bh * a->nq, cols = bh * a->nkv;
  size_t cells = rows * a->nkv;
  const int32_t *x[8] = {a->kv_num_blocks, a->kv_indices, a->full_kv_num_blocks,
                         a->full_kv_indices, a->q_num_blocks, a->q_indices,
                         a->full_q_num_blocks, a->full_q_indices};
  const int32_t *y[8] = {b->kv_num_blocks, b->kv_indices, b->full_kv_num_blocks,
                         b->full_kv_indices, b->q_num_blocks, b->q_indices,
                         b->full_q_num_blocks, b->full_q_indices};
  size_t len[8] = {rows, cells, rows, cells, cols, cells, cols, cells};
  for (int k = 0; k < 8; k++) {
    if (!x[k] != !y[k]) return false;
    if (x[k] && memcmp(x[k], y[k], len[k] * 4)) return false;
  }
  return true;
}

/* ---- a caller's BlockMask ---------------------------------------------------- */

/* Element idx of a host int32 tensor (any strides). */
static int32_t tensor_at(const DLTensor *t, const int64_t *idx) {
  int64_t off = 0, stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += idx[d] * (t->strides ? t->strides[d] : stride);
    stride *= t->shape[d];
  }
  int32_t v;
  memcpy(&v, (const char *)t->data + t->byte_offset + off * 4, 4);
  return v;
}

/* Type, place and rank of one tensor; its B and H extents must be Bt, Ht
 * (or set them, when *Bt is 0) and the rest as given. */
static flex_status check_tensor(const DLTensor *t, const char *name, int ndim, int *Bt, int *Ht,
                                const RtMaskShape *s, int64_t d2, int64_t d3, char *err,
                                size_t errlen) {
  if (t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1)
    return fail(err, errlen, "block mask: %s must be int32", name);
  if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost)
    return fail(err, errlen, "block mask: %s must be in host memory", name);
  if (t->ndim != ndim)
    return fail(err, errlen, "block mask: %s must have %d dimensions, got %d", name, ndim, t->ndim);
  if (!t->data && t->shape[0] * t->shape[1] * t->shape[2] > 0)
    return fail(err, errlen, "block mask: %s has no data", name);
  if (*Bt == 0) {
    if ((t->shape[0] != 1 && t->shape[0] != s->B) || (t->shape[1] != 1 && t->shape[1] != s->H))
      return fail(err, errlen, "block mask: %s must have batch and head extents 1 or %d, %d; got %lld, %lld",
                  name, s->B, s->H, (long long)t->shape[0], (long long)t->shape[1]);
    *Bt = (int)t->shape[0];
    *Ht = (int)t->shape[1];
  }
  if (t->shape[0] != *Bt || t->shape[1] != *Ht || t->shape[2] != d2 ||
      (ndim == 4 && (d3 < 0 ? t->shape[3] < 1 : t->shape[3] != d3)))
    return fail(err, errlen, "block mask: %s has shape [%lld, %lld, %lld%s], expected [%d, %d, %lld%s]",
                name, (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                ndim == 4 ? ", ..." : "", *Bt, *Ht, (long long)d2, ndim == 4 ? ", ..." : "");
  return FLEX_OK;
}

/* One side (kv or q, partial or full) of a caller's mask into classes
 * cls[Bt][Ht][nq][nkv]; rows are query blocks on the kv side, key blocks
 * on the q side (transposed). */
typedef struct Side {
  const DLTensor *num, *idx; /* the pair */
  const char *name;          /* "kv", "full_kv", "q", "full_q" */
  bool q_side;               /* rows are key blocks */
  uint8_t value;             /* C_PARTIAL or C_FULL */
} Side;

static flex_status read_side(const Side *sd, int Bt, int Ht, int nq, int nkv, uint8_t *cls,
                             char *err, size_t errlen) {
  int rows = sd->q_side ? nkv : nq, cols = sd->q_side ? nq : nkv;
  int64_t width = sd->idx->shape[3];
  for (int b = 0; b < Bt; b++)
    for (int h = 0; h < Ht; h++)
      for (int r = 0; r < rows; r++) {
        int64_t ix[4] = {b, h, r, 0};
        int32_t n = tensor_at(sd->num, ix);
        if (n < 0 || n > width || n > cols)
          return fail(err, errlen, "block mask: %s_num_blocks[%d, %d, %d] = %d is out of range [0, %lld]",
                      sd->name, b, h, r, n, (long long)(width < cols ? width : cols));
        for (int k = 0; k < n; k++) {
          ix[3] = k;
          int32_t c = tensor_at(sd->idx, ix);
          if (c < 0 || c >= cols)
            return fail(err, errlen, "block mask: %s_indices[%d, %d, %d, %d] = %d is not a block index in [0, %d)",
                        sd->name, b, h, r, k, c, cols);
          int i = sd->q_side ? c : r, j = sd->q_side ? r : c;
          uint8_t *cell = &cls[(((size_t)b * Ht + h) * nq + i) * nkv + j];
          if (*cell != C_EMPTY)
            return fail(err, errlen, "block mask: block (%d, %d) of [%d, %d] is listed twice (%s_indices)",
                        i, j, b, h, sd->name);
          *cell = sd->value;
        }
      }
  return FLEX_OK;
}

/* Both sides of a pair are given or neither; shapes as the geometry says. */
static flex_status check_pair(const Side *sd, int *Bt, int *Ht, const RtMaskShape *s, int nq,
                              int nkv, char *err, size_t errlen) {
  if (!sd->num != !sd->idx)
    return fail(err, errlen, "block mask: %s_num_blocks and %s_indices come together", sd->name,
                sd->name);
  if (!sd->num) return FLEX_OK;
  char nb[48], ib[48];
  snprintf(nb, sizeof nb, "%s_num_blocks", sd->name);
  snprintf(ib, sizeof ib, "%s_indices", sd->name);
  int rows = sd->q_side ? nkv : nq;
  flex_status rc = check_tensor(sd->num, nb, 3, Bt, Ht, s, rows, 0, err, errlen);
  return rc ? rc : check_tensor(sd->idx, ib, 4, Bt, Ht, s, rows, -1, err, errlen);
}

flex_status rt_block_mask_from_user(RtBlockMask *out, const flex_block_mask *u,
                                    const RtMaskShape *shape, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (u->block_q < 0 || u->block_kv < 0)
    return fail(err, errlen, "block mask: block sizes must be positive, got %d x %d", u->block_q,
                u->block_kv);
  if (!u->kv_num_blocks || !u->kv_indices)
    return fail(err, errlen, "block mask: kv_num_blocks and kv_indices are required");
  RtMaskShape g = *shape;
  g.block_q = u->block_q ? u->block_q : 128;
  g.block_kv = u->block_kv ? u->block_kv : 128;
  int nq = ceil_div(g.q_len, g.block_q), nkv = ceil_div(g.kv_len, g.block_kv);
  Side sides[4] = {{u->kv_num_blocks, u->kv_indices, "kv", false, C_PARTIAL},
                   {u->full_kv_num_blocks, u->full_kv_indices, "full_kv", false, C_FULL},
                   {u->q_num_blocks, u->q_indices, "q", true, C_PARTIAL},
                   {u->full_q_num_blocks, u->full_q_indices, "full_q", true, C_FULL}};
  int Bt = 0, Ht = 0;
  for (int k = 0; k < 4; k++) {
    flex_status rc = check_pair(&sides[k], &Bt, &Ht, &g, nq, nkv, err, errlen);
    if (rc) return rc;
  }
  bool full = sides[1].num != NULL;
  if ((sides[2].num && !sides[3].num != !full) || (sides[3].num && !sides[2].num))
    return fail(err, errlen, "block mask: full_q_* goes with q_*, and exactly when full_kv_* is given");
  flex_status fits = check_fits(Bt, Ht, &g, err, errlen); /* small lists may mean a huge grid */
  if (fits) return fits;
  size_t n = (size_t)Bt * Ht * nq * nkv;
  uint8_t *cls = base_alloc(n), *qcls = base_alloc(n);
  flex_status rc = FLEX_OK;
  for (int k = 0; k < 4 && rc == FLEX_OK; k++)
    if (sides[k].num) rc = read_side(&sides[k], Bt, Ht, nq, nkv, k < 2 ? cls : qcls, err, errlen);
  if (rc == FLEX_OK && sides[2].num && memcmp(cls, qcls, n))
    rc = fail(err, errlen, "block mask: the q_* side does not list the same blocks as the kv_* side");
  if (rc == FLEX_OK) {
    alloc_mask(out, Bt, Ht, &g, full);
    layout(out, cls);
  }
  base_free(cls);
  base_free(qcls);
  return rc;
}
