/* blockmask.c: building and validating block masks (docs/blockmask.md).
 *
 * Every builder first fills one byte per block (empty, full, partial), then
 * one routine lays the classes out in PyTorch's order, so the builders can
 * only differ in how they classify. */
#include "runtime/blockmask.h"

#include "kernels/blocklist.cuh"
#include "runtime/rt.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


/* In int64: a caller's block size may be close to INT_MAX, and a + b - 1
 * must not wrap (a wrapped count of 0 blocks would pass validation). */
static int ceil_div(int a, int b) { return (int)(((int64_t)a + b - 1) / b); }

/* A shape is the user's to choose, so a mask too large for this machine is
 * an error with the figures, not an allocation failure: the builder needs
 * one class byte and four int32 index entries per block, plus the counts. */
static flex_status check_fits(int B, int H, const RtMaskShape *s) {
  int bq = s->block_q > 0 ? s->block_q : 128, bkv = s->block_kv > 0 ? s->block_kv : 128;
  double nq = ceil_div(s->q_len, bq), nkv = ceil_div(s->kv_len, bkv);
  double need = (double)B * H * (nq * nkv * 17.0 + (nq + nkv) * 16.0);
  double have = base_physical_memory();
  if (have > 0 && need > have / 2)
    return rt_err(FLEX_ERR_INVALID,
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

/* Lay out classes cls[B][H][nq][nkv] (kernels/blocklist.cuh). */
static void layout(RtBlockMask *bm, const uint8_t *cls) {
  int32_t *const out[8] = {bm->kv_num_blocks, bm->kv_indices, bm->full_kv_num_blocks,
                           bm->full_kv_indices, bm->q_num_blocks, bm->q_indices,
                           bm->full_q_num_blocks, bm->full_q_indices};
  for (int64_t bh = 0; bh < (int64_t)bm->B * bm->H; bh++)
    for (int t = 0; t < bm->nq + bm->nkv; t++) flex_block_lists_at(cls, bh, bm->nq, bm->nkv, t, out);
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
          if (seen_t && seen_f) return FLEX_BLOCK_PARTIAL;
        }
  return seen_t ? FLEX_BLOCK_FULL : FLEX_BLOCK_EMPTY;
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

/* ---- the row-vectorised evaluator ------------------------------------------ */

/* The mask over up to LANES consecutive keys of one (b, h, q) row at a
 * time: one pass over the instructions, each over all lanes, so the
 * interpreter's dispatch is paid once per instruction and row chunk, not per
 * element. An instruction that does not depend on kv (transitively) is
 * computed once per chunk (lane 0) and read with stride 0; one that
 * depends on kv alone (a load `g[kv]`, say) is computed once per block
 * column chunk and reused by every row of the block. */
enum { LANES = 128 };

typedef struct VecEval {
  const IrFunc *f;
  IrEnv env;
  IrVal *lanes;   /* [f->n][LANES] */
  IrVal *scalar;  /* [f->n]: operands of one lane, for ir_load */
  const bool *varies; /* [f->n]: depends on kv */
  const bool *kv_only; /* [f->n]: depends on kv and on none of b, h, q */
  int64_t count;
} VecEval;

/* Which instructions of f depend on the kv argument; false when f has an
 * op the vector path does not take (then the plain interpreter runs). */
static bool vec_plan(const IrFunc *f, bool *varies, bool *kv_only) {
  bool *row = base_alloc((size_t)f->n); /* depends on b, h or q */
  bool ok = true;
  for (int i = 0; i < f->n && ok; i++) {
    const IrInst *in = &f->inst[i];
    if (in->op == IR_ACCUM) ok = false;
    bool v = in->op == IR_ARG && in->aux == ARG_KV;
    bool r = in->op == IR_ARG && in->aux != ARG_KV;
    for (int a = 0; a < in->nargs; a++) v = v || varies[in->args[a]], r = r || row[in->args[a]];
    varies[i] = v;
    row[i] = r;
    kv_only[i] = v && !r;
  }
  base_free(row);
  return ok;
}

/* Evaluate lanes kv0 .. kv0 + nl - 1 of the current row; the result lanes.
 * kv_fresh false: the kv-only lanes still hold this chunk's values. */
static const IrVal *vec_eval(VecEval *ve, int kv0, int nl, bool kv_fresh) {
  const IrFunc *f = ve->f;
  IrEnv *env = &ve->env;
  static const IrVal none = {0};
  for (int i = 0; i < f->n; i++) {
    const IrInst *in = &f->inst[i];
    if (!kv_fresh && ve->kv_only[i]) continue;
    IrVal *out = ve->lanes + (size_t)i * LANES;
    int n = ve->varies[i] ? nl : 1;
    const IrVal *A = in->nargs > 0 ? ve->lanes + (size_t)in->args[0] * LANES : &none;
    const IrVal *Bv = in->nargs > 1 ? ve->lanes + (size_t)in->args[1] * LANES : &none;
    const IrVal *C = in->nargs > 2 ? ve->lanes + (size_t)in->args[2] * LANES : &none;
    int sa = in->nargs > 0 && ve->varies[in->args[0]], sb = in->nargs > 1 && ve->varies[in->args[1]];
    int sc = in->nargs > 2 && ve->varies[in->args[2]];
    if (in->op == IR_ARG && in->aux == ARG_KV) {
      for (int l = 0; l < n; l++) out[l] = ir_vi(kv0 + l);
      continue;
    }
    if (in->op == IR_LOAD) {
      for (int l = 0; l < n; l++) {
        for (int d = 0; d < in->nargs; d++) {
          int a = in->args[d];
          ve->scalar[a] = ve->lanes[(size_t)a * LANES + (ve->varies[a] ? l : 0)];
        }
        out[l] = ir_load(env, in, ve->scalar);
      }
      continue;
    }
    switch ((IrOp)in->op) {
#define X(op, name, nargs, r, t, fl, ev, cu, ...)                                          \
  case IR_##op:                                                                       \
    for (int l = 0; l < n; l++) {                                                     \
      IrVal a = A[l * sa], b = Bv[l * sb], c = C[l * sc];                             \
      const IrVal *vals = ve->scalar;                                                 \
      (void)a, (void)b, (void)c, (void)vals;                                          \
      out[l] = (ev);                                                                  \
    }                                                                                 \
    break;
#include "ir/ops.def"
#undef X
    default: PANIC("vec_eval: bad op %d", (int)in->op);
    }
  }
  ve->count += nl;
  return ve->lanes + (size_t)f->ret * LANES;
}

/* eval_block on the vector path; same result, same failure semantics (a
 * failing chunk is re-run element by element so that the message names
 * the same first failing element as the plain interpreter would). */
static int eval_block_vec(VecEval *ve, Evaluator *ev, const Rect *r) {
  bool seen_t = false, seen_f = false;
  bool uniform_ret = !ve->varies[ve->f->ret];
  for (int kv = r->k0; kv <= r->k1; kv += LANES) { /* chunks outermost: kv-only values reused */
    int nl = r->k1 - kv + 1 < LANES ? r->k1 - kv + 1 : LANES;
    bool fresh = true;
    for (int b = r->b0; b <= r->b1; b++)
      for (int h = r->h0; h <= r->h1; h++)
        for (int q = r->q0; q <= r->q1; q++) {
          ve->env.args[ARG_B] = ir_vi(b);
          ve->env.args[ARG_H] = ir_vi(h);
          ve->env.args[ARG_Q] = ir_vi(q);
          const IrVal *res = vec_eval(ve, kv, nl, fresh);
          fresh = false;
          if (ve->env.failed) {
            /* The plain interpreter over the block names the same first
             * failing element as before. */
            return eval_block(ev, r) < 0 ? -1 : FLEX_BLOCK_PARTIAL;
          }
          for (int l = 0; l < (uniform_ret ? 1 : nl); l++) {
            if (res[l].b) seen_t = true;
            else seen_f = true;
          }
          if (seen_t && seen_f) return FLEX_BLOCK_PARTIAL;
        }
  }
  return seen_t ? FLEX_BLOCK_FULL : FLEX_BLOCK_EMPTY;
}

/* ---- the one host classifier ------------------------------------------------ */

static int cfg_threads = 0;   /* 0: the pool; 1: the calling thread */
static bool cfg_vector = true;

void rt_block_mask_eval_config(int threads, bool vector) {
  cfg_threads = threads;
  cfg_vector = vector;
}

/* What the rows of one classification share. */
typedef struct Classify {
  const RtBlockGrid *g;
  const IrModule *m;
  const IrIntervalEnv *ienv;
  bool analysis;            /* the interval analysis first */
  const RtBlockEval *ev;    /* element-wise, for blocks left open (NULL: they stay partial) */
  uint8_t *cls;
  atomic_long fail_row;     /* the lowest row whose evaluation failed (LONG_MAX: none) */
  int64_t *undecided;       /* per worker: blocks the analysis left open */
  int64_t *refined;         /* per worker: of those, blocks evaluation found full or empty */
  char (*error)[256];       /* per worker: the failure of its lowest failed row */
  long *failed_row;         /* per worker: that row (-1: none) */
} Classify;

/* Rows and keys of blocks j0..j1-1 of row i, stored batch b, head h. */
static RtRect span_rect(const RtBlockGrid *g, int b, int h, int i, int j0, int j1) {
  RtRect r = {b, h, i * g->block_q, 0, j0 * g->block_kv, 0};
  r.q1 = (r.q0 + g->block_q < g->q_len ? r.q0 + g->block_q : g->q_len) - 1;
  r.k1 = (j1 * g->block_kv < g->kv_len ? j1 * g->block_kv : g->kv_len) - 1;
  return r;
}

/* Block j of row `row`, left open by the analysis (or not analysed): by
 * its elements when there is an evaluator, else partial. False when an
 * evaluation failed. */
static bool classify_open(Classify *c, int64_t row, int b, int h, int i, int j, int worker) {
  const RtBlockGrid *g = c->g;
  int k = FLEX_BLOCK_PARTIAL;
  if (c->analysis) c->undecided[worker]++;
  RtRect r = span_rect(g, b, h, i, j, j + 1);
  if (r.q1 < r.q0 || r.k1 < r.k0) {
    k = FLEX_BLOCK_EMPTY;
  } else if (c->ev) {
    k = c->ev->block(c->ev->ctx, worker, &r, c->error[worker], sizeof c->error[worker]);
    if (k < 0) {
      c->failed_row[worker] = row;
      long cur = atomic_load(&c->fail_row);
      while (row < cur && !atomic_compare_exchange_weak(&c->fail_row, &cur, (long)row)) {}
      return false;
    }
    if (k != FLEX_BLOCK_PARTIAL && c->analysis) c->refined[worker]++;
  }
  c->cls[(size_t)row * g->nkv + j] = (uint8_t)k;
  return true;
}

/* Blocks j0..j1-1 of one row: the interval analysis of their union first.
 * The analysis is sound on any rectangle, so a union it decides is decided
 * for every block in it; an undecided union of several blocks is split in
 * two. A row of a causal or banded mask takes about 2 log2(nkv) analyses
 * instead of nkv (a 131072-token causal mask: 20 000 instead of 10^6). */
static bool classify_span(Classify *c, int64_t row, int b, int h, int i, int j0, int j1, int worker) {
  const RtBlockGrid *g = c->g;
  if (j0 >= j1) return true;
  RtRect r = span_rect(g, b, h, i, j0, j1);
  if (r.q1 < r.q0 || r.k1 < r.k0) { /* blocks past the rows or keys hold no element */
    memset(c->cls + (size_t)row * g->nkv + j0, FLEX_BLOCK_EMPTY, (size_t)(j1 - j0));
    return true;
  }
  const int bb = b + g->b_base, qb = g->q_base, kb = g->kv_base;
  FlexBlockClass t = ir_interval_mask(c->m, c->ienv, bb, bb, h, h, r.q0 + qb, r.q1 + qb, r.k0 + kb,
                                      r.k1 + kb);
  if (t != FLEX_BLOCK_PARTIAL) {
    memset(c->cls + (size_t)row * g->nkv + j0, (int)t, (size_t)(j1 - j0));
    return true;
  }
  if (j1 - j0 == 1) return classify_open(c, row, b, h, i, j0, worker);
  int mid = j0 + (j1 - j0) / 2;
  return classify_span(c, row, b, h, i, j0, mid, worker) &&
         classify_span(c, row, b, h, i, mid, j1, worker);
}

/* One row of blocks (b, h, i); stops at the first failed evaluation. */
static void classify_row(void *ctx, int64_t row, int worker) {
  Classify *c = ctx;
  const RtBlockGrid *g = c->g;
  if (row > atomic_load(&c->fail_row)) return; /* a lower row failed: its message wins */
  int i = (int)(row % g->nq), h = (int)(row / g->nq % g->H), b = (int)(row / g->nq / g->H);
  if (c->analysis) {
    classify_span(c, row, b, h, i, 0, g->nkv, worker);
    return;
  }
  for (int j = 0; j < g->nkv; j++)
    if (!classify_open(c, row, b, h, i, j, worker)) return;
}

flex_status rt_classify_blocks(const RtBlockGrid *g, const IrModule *m, const IrIntervalEnv *ienv,
                               bool analysis, const RtBlockEval *ev, uint8_t *cls, RtMaskStats *st) {
  static const IrIntervalEnv none;
  Classify c = {.g = g, .m = m, .ienv = ienv ? ienv : &none, .analysis = analysis, .ev = ev,
                .cls = cls};
  long rows = (long)g->B * g->H * g->nq;
  atomic_init(&c.fail_row, __LONG_MAX__);
  /* ir_interval_mask allocates for masks over 128 instructions, and an
   * allocation must not fail on a pool worker: those run on this thread. */
  bool pooled = (!ev || ev->pooled) && cfg_threads != 1 && (!analysis || m->mask->n <= 128) &&
                rows >= 2 && (int64_t)rows * g->nkv >= 64;
  int nw = pooled ? base_pool_size() : 1;
  c.undecided = base_alloc(sizeof *c.undecided * (size_t)nw);
  c.refined = base_alloc(sizeof *c.refined * (size_t)nw);
  c.error = base_alloc(sizeof *c.error * (size_t)nw);
  c.failed_row = base_alloc(sizeof *c.failed_row * (size_t)nw);
  for (int w = 0; w < nw; w++) c.failed_row[w] = -1;
  if (pooled) base_pool_run(rows, classify_row, &c);
  else
    for (long row = 0; row < rows; row++) classify_row(&c, row, 0);
  flex_status rc = FLEX_OK;
  long fail_row = atomic_load(&c.fail_row);
  for (int w = 0; w < nw; w++) {
    if (st) st->undecided += c.undecided[w], st->refined += c.refined[w];
    if (c.failed_row[w] >= 0 && c.failed_row[w] == fail_row && rc == FLEX_OK)
      rc = rt_err(FLEX_ERR_INVALID, "%s", c.error[w]);
  }
  base_free(c.undecided), base_free(c.refined), base_free(c.error), base_free(c.failed_row);
  return rc;
}

/* ---- the interpreter's element-wise evaluator --------------------------------- */

/* Per pool worker: the plain and the row-vectorised interpreter. */
typedef struct InterpWorker {
  Evaluator ev;
  VecEval ve;
} InterpWorker;

typedef struct Interp {
  InterpWorker *w;  /* one per worker */
  int nw;
  bool vector;
  int q_base, kv_base; /* a shard's positions */
} Interp;

static int interp_block(void *ctx, int worker, const RtRect *rr, char *err, size_t cap) {
  const Interp *in = ctx;
  InterpWorker *w = &in->w[worker];
  Rect r = {rr->b, rr->b, rr->h, rr->h, rr->q0 + in->q_base, rr->q1 + in->q_base,
            rr->k0 + in->kv_base, rr->k1 + in->kv_base};
  int k = in->vector ? eval_block_vec(&w->ve, &w->ev, &r) : eval_block(&w->ev, &r);
  if (k < 0) snprintf(err, cap, "%s", w->ev.env.error);
  return k;
}

/* Blocks by the interpreter: per-worker states are made here, before any
 * worker runs (an allocation must not fail on one). */
static flex_status classify_interp(const RtBlockMask *bm, const IrModule *m,
                                   const IrIntervalEnv *ienv, Evaluator *ev, RtMaskMode mode,
                                   int q_off, int kv_off, uint8_t *cls, RtMaskStats *st) {
  const RtBlockGrid g = {bm->B, bm->H, bm->q_len, bm->kv_len, bm->block_q, bm->block_kv,
                         bm->nq, bm->nkv, 0, q_off, kv_off};
  Interp in = {.nw = base_pool_size(), .q_base = q_off, .kv_base = kv_off};
  bool *varies = base_alloc((size_t)m->mask->n), *kv_only = base_alloc((size_t)m->mask->n);
  in.vector = cfg_vector && mode != RT_MASK_ANALYSIS && vec_plan(m->mask, varies, kv_only);
  in.w = base_alloc(sizeof *in.w * (size_t)in.nw);
  for (int t = 0; t < in.nw; t++) {
    InterpWorker *w = &in.w[t];
    w->ev = *ev;
    w->ev.count = 0;
    w->ev.vals = base_alloc((size_t)m->mask->n * sizeof *w->ev.vals);
    if (in.vector) {
      w->ve.f = m->mask;
      w->ve.env = ev->env;
      w->ve.lanes = base_alloc((size_t)m->mask->n * LANES * sizeof(IrVal));
      w->ve.scalar = base_alloc((size_t)m->mask->n * sizeof(IrVal));
      w->ve.varies = varies;
      w->ve.kv_only = kv_only;
    }
  }
  const RtBlockEval eval = {interp_block, &in, true};
  flex_status rc = rt_classify_blocks(&g, m, ienv, mode != RT_MASK_BLOCKWISE,
                                      mode == RT_MASK_ANALYSIS ? NULL : &eval, cls, st);
  for (int t = 0; t < in.nw; t++) {
    ev->count += in.w[t].ev.count + in.w[t].ve.count;
    base_free(in.w[t].ev.vals);
    base_free(in.w[t].ve.lanes);
    base_free(in.w[t].ve.scalar);
  }
  base_free(in.w);
  base_free(varies);
  base_free(kv_only);
  return rc;
}

/* The dense oracle: every element into a B*H*Q*KV byte tensor, then each
 * block reduced from it. For tests only. */
static flex_status classify_dense(const RtBlockMask *bm, Evaluator *ev, const RtMaskShape *sh,
                                  uint8_t *cls) {
  size_t QL = (size_t)bm->q_len, KL = (size_t)bm->kv_len;
  uint8_t *dense = base_alloc((size_t)bm->B * bm->H * QL * KL);
  size_t e = 0;
  for (int b = 0; b < bm->B; b++)
    for (int h = 0; h < bm->H; h++)
      for (int q = 0; q < bm->q_len; q++)
        for (int kv = 0; kv < bm->kv_len; kv++, e++) {
          const int qq = q + sh->q_off, kk = kv + sh->kv_off;
          Rect r = {b, b, h, h, qq, qq, kk, kk};
          int c = eval_block(ev, &r);
          if (c < 0) {
            base_free(dense);
            return rt_err(FLEX_ERR_INVALID, "%s", ev->env.error);
          }
          dense[e] = c == FLEX_BLOCK_FULL;
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
        cls[n] = t && f ? FLEX_BLOCK_PARTIAL : t ? FLEX_BLOCK_FULL : FLEX_BLOCK_EMPTY;
      }
  base_free(dense);
  return FLEX_OK;
}

flex_status rt_block_mask_build(RtBlockMask *out, const IrModule *m, const IrIntervalEnv *env,
                                const RtMaskShape *shape, RtMaskMode mode, RtMaskStats *stats) {
  CHECK(shape->B >= 1 && shape->H >= 1 && shape->q_len >= 1 && shape->kv_len >= 1);
  RtMaskStats local;
  RtMaskStats *st = stats ? stats : &local;
  memset(st, 0, sizeof *st);
  static const IrIntervalEnv none;
  if (!env) env = &none;
  int B = m->mask && ir_interval_uses_arg(m, ARG_B) ? shape->B : 1;
  int H = m->mask && ir_interval_uses_arg(m, ARG_H) ? shape->H : 1;
  flex_status fit = check_fits(B, H, shape);
  if (fit) return fit;
  alloc_mask(out, B, H, shape, true);
  size_t nblocks = (size_t)B * H * out->nq * out->nkv;
  uint8_t *cls = base_alloc(nblocks);
  flex_status rc = FLEX_OK;
  if (!m->mask) {
    memset(cls, FLEX_BLOCK_FULL, nblocks);
  } else {
    Evaluator ev;
    memset(&ev, 0, sizeof ev);
    ev.m = m;
    ev.env.params = env->params;
    ev.env.sizes = env->sizes;
    ev.env.bufs = env->bufs;
    ev.env.mod = m;
    ev.vals = base_alloc((size_t)m->mask->n * sizeof *ev.vals);
    rc = mode == RT_MASK_DENSE ? classify_dense(out, &ev, shape, cls)
                               : classify_interp(out, m, env, &ev, mode, shape->q_off, shape->kv_off, cls, st);
    st->evaluated = ev.count;
    base_free(ev.vals);
  }
  if (rc == FLEX_OK) {
    layout(out, cls);
    st->total = (int64_t)nblocks;
    for (size_t k = 0; k < nblocks; k++)
      cls[k] == FLEX_BLOCK_FULL ? st->full++ : cls[k] == FLEX_BLOCK_PARTIAL ? st->partial++ : st->empty++;
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
                                const RtMaskShape *s, int64_t d2, int64_t d3) {
  if (t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1)
    return rt_err(FLEX_ERR_INVALID, "block mask: %s must be int32", name);
  if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost)
    return rt_err(FLEX_ERR_INVALID, "block mask: %s must be in host memory", name);
  if (t->ndim != ndim)
    return rt_err(FLEX_ERR_INVALID, "block mask: %s must have %d dimensions, got %d", name, ndim, t->ndim);
  if (!t->data && t->shape[0] * t->shape[1] * t->shape[2] > 0)
    return rt_err(FLEX_ERR_INVALID, "block mask: %s has no data", name);
  if (*Bt == 0) {
    if ((t->shape[0] != 1 && t->shape[0] != s->B) || (t->shape[1] != 1 && t->shape[1] != s->H))
      return rt_err(FLEX_ERR_INVALID, "block mask: %s must have batch and head extents 1 or %d, %d; got %lld, %lld",
                  name, s->B, s->H, (long long)t->shape[0], (long long)t->shape[1]);
    *Bt = (int)t->shape[0];
    *Ht = (int)t->shape[1];
  }
  if (t->shape[0] != *Bt || t->shape[1] != *Ht || t->shape[2] != d2 ||
      (ndim == 4 && (d3 < 0 ? t->shape[3] < 1 : t->shape[3] != d3)))
    return rt_err(FLEX_ERR_INVALID, "block mask: %s has shape [%lld, %lld, %lld%s], expected [%d, %d, %lld%s]",
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
  uint8_t value;             /* FLEX_BLOCK_PARTIAL or FLEX_BLOCK_FULL */
} Side;

static flex_status read_side(const Side *sd, int Bt, int Ht, int nq, int nkv, uint8_t *cls) {
  int rows = sd->q_side ? nkv : nq, cols = sd->q_side ? nq : nkv;
  int64_t width = sd->idx->shape[3];
  for (int b = 0; b < Bt; b++)
    for (int h = 0; h < Ht; h++)
      for (int r = 0; r < rows; r++) {
        int64_t ix[4] = {b, h, r, 0};
        int32_t n = tensor_at(sd->num, ix);
        if (n < 0 || n > width || n > cols)
          return rt_err(FLEX_ERR_INVALID, "block mask: %s_num_blocks[%d, %d, %d] = %d is out of range [0, %lld]",
                      sd->name, b, h, r, n, (long long)(width < cols ? width : cols));
        for (int k = 0; k < n; k++) {
          ix[3] = k;
          int32_t c = tensor_at(sd->idx, ix);
          if (c < 0 || c >= cols)
            return rt_err(FLEX_ERR_INVALID, "block mask: %s_indices[%d, %d, %d, %d] = %d is not a block index in [0, %d)",
                        sd->name, b, h, r, k, c, cols);
          int i = sd->q_side ? c : r, j = sd->q_side ? r : c;
          uint8_t *cell = &cls[(((size_t)b * Ht + h) * nq + i) * nkv + j];
          if (*cell != FLEX_BLOCK_EMPTY)
            return rt_err(FLEX_ERR_INVALID, "block mask: block (%d, %d) of [%d, %d] is listed twice (%s_indices)",
                        i, j, b, h, sd->name);
          *cell = sd->value;
        }
      }
  return FLEX_OK;
}

/* Both sides of a pair are given or neither; shapes as the geometry says. */
static flex_status check_pair(const Side *sd, int *Bt, int *Ht, const RtMaskShape *s, int nq,
                              int nkv) {
  if (!sd->num != !sd->idx)
    return rt_err(FLEX_ERR_INVALID, "block mask: %s_num_blocks and %s_indices come together", sd->name,
                sd->name);
  if (!sd->num) return FLEX_OK;
  char nb[48], ib[48];
  snprintf(nb, sizeof nb, "%s_num_blocks", sd->name);
  snprintf(ib, sizeof ib, "%s_indices", sd->name);
  int rows = sd->q_side ? nkv : nq;
  flex_status rc = check_tensor(sd->num, nb, 3, Bt, Ht, s, rows, 0);
  return rc ? rc : check_tensor(sd->idx, ib, 4, Bt, Ht, s, rows, -1);
}

flex_status rt_block_mask_from_user(RtBlockMask *out, const flex_block_mask *u,
                                    const RtMaskShape *shape) {
  memset(out, 0, sizeof *out);
  if (u->block_q < 0 || u->block_kv < 0)
    return rt_err(FLEX_ERR_INVALID, "block mask: block sizes must be positive, got %d x %d", u->block_q,
                u->block_kv);
  if (!u->kv_num_blocks || !u->kv_indices)
    return rt_err(FLEX_ERR_INVALID, "block mask: kv_num_blocks and kv_indices are required");
  RtMaskShape g = *shape;
  g.block_q = u->block_q ? u->block_q : 128;
  g.block_kv = u->block_kv ? u->block_kv : 128;
  int nq = ceil_div(g.q_len, g.block_q), nkv = ceil_div(g.kv_len, g.block_kv);
  Side sides[4] = {{u->kv_num_blocks, u->kv_indices, "kv", false, FLEX_BLOCK_PARTIAL},
                   {u->full_kv_num_blocks, u->full_kv_indices, "full_kv", false, FLEX_BLOCK_FULL},
                   {u->q_num_blocks, u->q_indices, "q", true, FLEX_BLOCK_PARTIAL},
                   {u->full_q_num_blocks, u->full_q_indices, "full_q", true, FLEX_BLOCK_FULL}};
  int Bt = 0, Ht = 0;
  for (int k = 0; k < 4; k++) {
    flex_status rc = check_pair(&sides[k], &Bt, &Ht, &g, nq, nkv);
    if (rc) return rc;
  }
  bool full = sides[1].num != NULL;
  if ((sides[2].num && !sides[3].num != !full) || (sides[3].num && !sides[2].num))
    return rt_err(FLEX_ERR_INVALID, "block mask: full_q_* goes with q_*, and exactly when full_kv_* is given");
  flex_status fits = check_fits(Bt, Ht, &g); /* small lists may mean a huge grid */
  if (fits) return fits;
  size_t n = (size_t)Bt * Ht * nq * nkv;
  uint8_t *cls = base_alloc(n), *qcls = base_alloc(n);
  flex_status rc = FLEX_OK;
  for (int k = 0; k < 4 && rc == FLEX_OK; k++)
    if (sides[k].num) rc = read_side(&sides[k], Bt, Ht, nq, nkv, k < 2 ? cls : qcls);
  if (rc == FLEX_OK && sides[2].num && memcmp(cls, qcls, n))
    rc = rt_err(FLEX_ERR_INVALID, "block mask: the q_* side does not list the same blocks as the kv_* side");
  if (rc == FLEX_OK) {
    alloc_mask(out, Bt, Ht, &g, full);
    layout(out, cls);
  }
  base_free(cls);
  base_free(qcls);
  return rc;
}
