/* reference.c: the float64 backend, the oracle every other backend is
 * checked against.
 *
 * It follows docs/language.md "Semantics" line by line, fully materialised but one
 * (batch, query head) block at a time: the scores S and probabilities P of
 * one block are Q_LEN x KV_LEN doubles; nothing is ever B*H*Q_LEN*KV_LEN.
 * The mask, the score and the joint (backward) function run through the IR
 * interpreter. The backward recomputes O and LSE itself in float64 instead of
 * trusting the `out` and `lse` it is given, so its gradients are exact for
 * the inputs whatever produced those outputs, except in a shard of a longer
 * sequence (position offsets): its LSE and O are the whole sequence's
 * (merged over the shards), which no shard can recompute, so there the
 * backward takes the ones it is given (docs/language.md "Position offsets").
 *
 * A caller's BlockMask is part of the semantics, as in PyTorch: elements of
 * blocks it does not list are masked, elements of its full blocks are kept
 * without evaluating the mask, and only its partial blocks run the mask.
 *
 * A sink (docs/language.md "Attention sinks") is one more term of each row's LSE,
 * exp(sk), with no value: the keys' P are normalised by it, and the
 * backward gives it dsk = -Ps * D, which its gradient function adds into
 * `grad` buffers.
 */
#include <math.h>
#include <string.h>

#include "blockmask.h"
#include "kernels/philox.cuh"
#include "npy.h"
#include "rt.h"

/* ---- tensor access ------------------------------------------------------- */

/* Element offset of a 4-D (or lower) index. */
static int64_t off_of(const DLTensor *t, const int64_t *idx) {
  int64_t off = 0, stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += idx[d] * (t->strides ? t->strides[d] : stride);
    stride *= t->shape[d];
  }
  return off;
}

static double get(const DLTensor *t, const int64_t *idx) {
  const char *p = (const char *)t->data + t->byte_offset;
  int64_t o = off_of(t, idx);
  uint16_t h;
  float f;
  double d;
  switch (t->dtype.bits) {
  case 16:
    memcpy(&h, p + o * 2, 2);
    return t->dtype.code == kDLBfloat ? ir_bf16_to_double(h) : ir_half_to_double(h);
  case 32: memcpy(&f, p + o * 4, 4); return f;
  default: memcpy(&d, p + o * 8, 8); return d;
  }
}

/* Store into a float32 or float64 output. */
static void put(const DLTensor *t, const int64_t *idx, double v) {
  char *p = (char *)t->data + t->byte_offset;
  int64_t o = off_of(t, idx);
  if (t->dtype.bits == 16) { /* outputs in q's dtype: fp16 or bf16, rounded once */
    uint16_t h = t->dtype.code == kDLBfloat ? rt_bf16_from_double(v) : rt_half_from_double(v);
    memcpy(p + o * 2, &h, 2);
  } else if (t->dtype.bits == 32) {
    float f = (float)v;
    memcpy(p + o * 4, &f, 4);
  } else {
    memcpy(p + o * 8, &v, 8);
  }
}

/* Rows x cols of t[b, h, :, :] into dst (row-major). */
static void load_slice(const DLTensor *t, int b, int h, int rows, int cols, double *dst) {
  for (int i = 0; i < rows; i++)
    for (int e = 0; e < cols; e++) {
      int64_t idx[4] = {b, h, i, e};
      dst[(size_t)i * cols + e] = get(t, idx);
    }
}

static void store_slice(const DLTensor *t, int b, int h, int rows, int cols, const double *src) {
  for (int i = 0; i < rows; i++)
    for (int e = 0; e < cols; e++) {
      int64_t idx[4] = {b, h, i, e};
      put(t, idx, src[(size_t)i * cols + e]);
    }
}

/* ---- one (b, h) block ------------------------------------------------------ */

/* Working memory of one call. */
typedef struct Ref {
  const RtCall *c;
  IrEnv env;
  IrVal *vals;           /* interpreter scratch */
  IrBufView *bufs;       /* the call's views, with grad accumulators attached */
  double *q, *k, *v;     /* one head's Q [QL,E], K [KL,E], V [KL,EV] */
  double *S, *P;         /* [QL,KL]: scaled q.k and probabilities */
  double *O, *lse;       /* [QL,EV], [QL] */
  double *sk;            /* [QL]: the rows' sink logits (-inf: none) */
  RtBlockMask bm;        /* the caller's BlockMask, normalised (when given) */
  bool has_bm;           /* bm holds one */
  uint8_t *cls;          /* [nq, nkv] class of each block of the current (b, h) */
} Ref;


/* The block classes of (b, h) from the BlockMask's kv-side lists. */
static void block_classes(Ref *r, int b, int h) {
  const RtBlockMask *bm = &r->bm;
  int bb = bm->B == 1 ? 0 : b, hh = bm->H == 1 ? 0 : h;
  memset(r->cls, FLEX_BLOCK_EMPTY, (size_t)bm->nq * (size_t)bm->nkv);
  for (int i = 0; i < bm->nq; i++) {
    size_t row = ((size_t)bb * bm->H + hh) * bm->nq + i;
    for (int n = 0; n < bm->kv_num_blocks[row]; n++)
      r->cls[(size_t)i * bm->nkv + bm->kv_indices[row * bm->nkv + n]] = FLEX_BLOCK_PARTIAL;
    for (int n = 0; bm->has_full && n < bm->full_kv_num_blocks[row]; n++)
      r->cls[(size_t)i * bm->nkv + bm->full_kv_indices[row * bm->nkv + n]] = FLEX_BLOCK_FULL;
  }
}

/* Dropout's M of element (b, h, i, j) (docs/language.md "Dropout"): keep / (1 - p);
 * 1 without dropout. b is the batch index functions see (b + b0). */
static double drop_mult(const RtCall *c, int b, int h, int i, int j) {
  const flex_args *a = c->args;
  if (a->dropout_p <= 0.0f) return 1.0;
  uint32_t w[4];
  flex_dropout_words(w, (uint32_t)a->dropout_seed, (uint32_t)(a->dropout_seed >> 32),
                     flex_dropout_ctr3(a->dropout_offset), (uint32_t)((b + c->b0) * c->H + h),
                     (uint32_t)(i + c->q_off), (uint32_t)(j + c->kv_off) >> 2);
  bool keep = flex_dropout_keep(flex_dropout_word(w, (uint32_t)(j + c->kv_off) & 3), a->dropout_p);
  return keep ? 1.0 / (1.0 - (double)a->dropout_p) : 0.0;
}

static double *dalloc(Arena *a, size_t n) { return arena_alloc(a, sizeof(double) * (n ? n : 1)); }

static void init(Ref *r, Arena *a, const RtCall *c) {
  memset(r, 0, sizeof *r);
  r->c = c;
  const IrModule *m = c->mod;
  int n = m->score->n;
  if (m->mask && m->mask->n > n) n = m->mask->n;
  if (m->joint && m->joint->n > n) n = m->joint->n;
  if (m->sink && m->sink->n > n) n = m->sink->n;
  if (m->sink_grad && m->sink_grad->n > n) n = m->sink_grad->n;
  r->vals = arena_alloc(a, sizeof(IrVal) * (size_t)n);
  r->bufs = arena_alloc(a, sizeof(IrBufView) * (size_t)(m->nbuffers + 1));
  memcpy(r->bufs, c->bufs, sizeof(IrBufView) * (size_t)m->nbuffers);
  r->env.params = c->params;
  r->env.sizes = c->sizes;
  r->env.bufs = r->bufs;
  r->env.src = &c->kernel->src;
  r->env.mod = m;
  size_t QL = (size_t)c->QL, KL = (size_t)c->KL;
  r->q = dalloc(a, QL * (size_t)c->E);
  r->k = dalloc(a, KL * (size_t)c->E);
  r->v = dalloc(a, KL * (size_t)c->EV);
  r->S = dalloc(a, QL * KL);
  r->P = dalloc(a, QL * KL);
  r->O = dalloc(a, QL * (size_t)c->EV);
  r->lse = dalloc(a, QL);
  r->sk = dalloc(a, QL);
}

/* A checked run stops at the interpreter's first failure. */
static bool failed(const Ref *r) { return r->c->args->check_bounds && r->env.failed; }

/* S, P, O and LSE of block (b, h); `given`: the LSE and O of the call's
 * lse and out tensors instead (a shard's backward). Returns false on a
 * checked-run failure. */
static bool block(Ref *r, int b, int h, bool given) {
  const RtCall *c = r->c;
  const IrModule *m = c->mod;
  int QL = c->QL, KL = c->KL, E = c->E, EV = c->EV, kvh = h / c->G;
  load_slice(c->args->q, b, h, QL, E, r->q);
  load_slice(c->args->k, b, kvh, KL, E, r->k);
  load_slice(c->args->v, b, kvh, KL, EV, r->v);
  r->env.args[ARG_B] = ir_vi(b + c->b0);
  r->env.args[ARG_H] = ir_vi(h);
  if (r->has_bm) block_classes(r, b, h);
  for (int i = 0; i < QL; i++) {
    double *S = r->S + (size_t)i * KL, *P = r->P + (size_t)i * KL, mx = -INFINITY;
    r->env.args[ARG_Q] = ir_vi(i + c->q_off);
    /* a shard carries the sink when its keys begin the sequence (kv_off 0) */
    const double sk = r->sk[i] =
        m->sink && c->kv_off == 0 ? ir_eval(m->sink, &r->env, r->vals).f : -INFINITY;
    if (failed(r)) return false;
    /* a NaN among the row's unmasked t or its sink: LSE and O are NaN */
    bool nan = isnan(sk);
    for (int j = 0; j < KL; j++) {
      double dot = 0;
      for (int e = 0; e < E; e++) dot += r->q[(size_t)i * E + e] * r->k[(size_t)j * E + e];
      S[j] = c->scale * dot;
      r->env.args[ARG_KV] = ir_vi(j + c->kv_off);
      r->env.args[ARG_S] = ir_vf(S[j]);
      int cls = r->has_bm ? r->cls[(size_t)(i / r->bm.block_q) * r->bm.nkv + j / r->bm.block_kv]
                          : FLEX_BLOCK_PARTIAL;
      bool keep = cls == FLEX_BLOCK_FULL || (cls == FLEX_BLOCK_PARTIAL && (!m->mask || ir_eval(m->mask, &r->env, r->vals).b));
      P[j] = keep ? ir_eval(m->score, &r->env, r->vals).f : -INFINITY; /* t, for now */
      if (failed(r)) return false;
      if (isnan(P[j])) nan = true;
      else if (P[j] > mx) mx = P[j];
    }
    double *O = r->O + (size_t)i * EV;
    memset(O, 0, sizeof(double) * (size_t)EV);
    if (!nan && mx == -INFINITY && sk == -INFINITY && !given) { /* fully masked row: O = 0, LSE = -inf, P = 0 */
      r->lse[i] = -INFINITY;
      for (int j = 0; j < KL; j++) P[j] = 0;
      continue;
    }
    /* IEEE throughout (docs/language.md, non-finite values): a NaN t makes LSE NaN, a
     * +inf one (and no NaN) makes it +inf; P = exp(t - LSE) is then NaN for
     * every unmasked element (NaN LSE) or for the +inf ones, so O is NaN.
     * The sink is one more term of the sum (exp(sk)). A finite row's P is
     * exp(t - top) / sum, not exp(t - LSE): where the max is huge, LSE =
     * top + log(sum) rounds back to the top (every score -1e30: an ulp of
     * 1e14) and exp(t - LSE) would lose the sum. A given LSE is used as it
     * is. */
    double top = 0, sum = 1.0;
    if (given) {
      int64_t li[3] = {b, h, i};
      r->lse[i] = get(c->args->lse, li);
    } else if (nan) r->lse[i] = NAN;
    else if (mx == INFINITY || sk == INFINITY) r->lse[i] = INFINITY;
    else {
      top = mx > sk ? mx : sk, sum = sk == -INFINITY ? 0 : exp(sk - top);
      for (int j = 0; j < KL; j++) sum += exp(P[j] - top);
      r->lse[i] = top + log(sum);
    }
    const bool norm = !given && isfinite(r->lse[i]);
    const double ref = norm ? top : r->lse[i];
    if (!norm) sum = 1.0;
    for (int j = 0; j < KL; j++) {
      if (P[j] == -INFINITY || r->lse[i] == -INFINITY) { /* masked (or scored -inf): contributes nothing, even 0 * NaN */
        P[j] = 0;
        continue;
      }
      P[j] = exp(P[j] - ref) / sum;
      const double pm = P[j] * drop_mult(c, b, h, i, j); /* dropout after the LSE */
      for (int e = 0; e < EV; e++) O[e] += pm * r->v[(size_t)j * EV + e];
    }
    /* A NaN or +inf sink is a non-finite term of the row: its O is NaN (its
     * weight exp(sk - LSE) is NaN, times its zero value), masked or not. */
    if (isnan(sk) || sk == INFINITY)
      for (int e = 0; e < EV; e++) O[e] = NAN;
    for (int e = 0; given && e < EV; e++) {
      int64_t oi[4] = {b, h, i, e};
      O[e] = get(c->args->out, oi);
    }
  }
  return true;
}

static flex_status start(Ref *r, Arena *a, const RtCall *c) {
  /* Materialising S and P for one (batch, head) is the reference's point;
   * a length that cannot fit is refused with the figures. */
  double need = 8.0 * ((double)c->QL * c->KL * 2 + (double)c->QL * (c->E + 2.0 * c->EV + 1) +
                       (double)c->KL * (2.0 * c->E + 2.0 * c->EV));
  double have = base_physical_memory();
  if (have > 0 && need > have / 2)
    return rt_err(FLEX_ERR_UNSUPPORTED,
                  "the reference backend materialises Q_LEN x KV_LEN = %d x %d scores per (batch, "
                  "head): %.1f GB, more than half of this machine's %.1f GB; use the emu or cuda "
                  "backend for sequences this long", c->QL, c->KL, need / 1e9, have / 1e9);
  init(r, a, c);
  if (c->args->block_mask) {
    const flex_block_mask *u = c->args->block_mask;
    RtMaskShape shape = {c->B, c->H, c->QL, c->KL, u->block_q, u->block_kv, 0, 0};
    flex_status st = rt_block_mask_from_user(&r->bm, u, &shape);
    if (st) return st;
    r->has_bm = true;
    r->cls = arena_alloc(a, (size_t)r->bm.nq * (size_t)r->bm.nkv);
  }
  if (!c->args->trust_sorted) return rt_check_sorted(c, c->bufs); /* every run, not only checked ones */
  return FLEX_OK;
}

static void finish(Ref *r, Arena *a) {
  if (r->has_bm) rt_block_mask_free(&r->bm);
  arena_free(a);
}

static flex_status checked_failure(const Ref *r) {
  return rt_err(FLEX_ERR_RUNTIME, "checked run: %s", r->env.error);
}

flex_status rt_reference_forward(const RtCall *c) {
  Arena a = {0};
  Ref r;
  memset(&r, 0, sizeof r);
  flex_status st = start(&r, &a, c);
  for (int b = 0; st == FLEX_OK && b < c->B; b++)
    for (int h = 0; st == FLEX_OK && h < c->H; h++) {
      if (!block(&r, b, h, false)) {
        st = checked_failure(&r);
        break;
      }
      store_slice(c->args->out, b, h, c->QL, c->EV, r.O);
      for (int i = 0; i < c->QL; i++) {
        int64_t idx[3] = {b, h, i};
        put(c->args->lse, idx, r.lse[i]);
      }
    }
  finish(&r, &a);
  return st;
}

/* ---- backward --------------------------------------------------------------- */

/* Gradient accumulators of one backward call. */
typedef struct Grads {
  double *dk, *dv;    /* [B,HKV,KL,E], [B,HKV,KL,EV] */
  double *dq, *dout;  /* one head: [QL,E], [QL,EV] */
} Grads;

/* ds for every kept element of block (b, h), folded into dq, dk and dv. */
static bool block_backward(Ref *r, Grads *g, int b, int h) {
  const RtCall *c = r->c;
  int QL = c->QL, KL = c->KL, E = c->E, EV = c->EV, kvh = h / c->G;
  const flex_args *a = c->args;
  load_slice(a->dout, b, h, QL, EV, g->dout);
  size_t kbase = ((size_t)b * c->HKV + kvh) * KL;
  double *dk = g->dk + kbase * E, *dv = g->dv + kbase * EV;
  memset(g->dq, 0, sizeof(double) * (size_t)QL * E);
  for (int i = 0; i < QL; i++) {
    const double *dO = g->dout + (size_t)i * EV;
    int64_t li[3] = {b, h, i};
    /* D from the O the call gives (docs/language.md), as every backend */
    double D = a->dlse ? -get(a->dlse, li) : 0.0;
    for (int e = 0; e < EV; e++) {
      int64_t oi[4] = {b, h, i, e};
      D += dO[e] * get(a->out, oi);
    }
    r->env.args[ARG_Q] = ir_vi(i + c->q_off);
    /* The sink's logit gets dsk = -Ps * D (nothing when Ps = 0: no sink,
     * or one that a +inf key outweighs), through its gradient function. */
    const double Ps = r->sk[i] != -INFINITY ? exp(r->sk[i] - r->lse[i]) : 0.0; /* -inf: no sink */
    if (Ps != 0) {
      r->env.args[ARG_DT] = ir_vf(-Ps * D);
      (void)ir_eval(c->mod->sink_grad, &r->env, r->vals);
      if (failed(r)) return false;
    }
    for (int j = 0; j < KL; j++) {
      double P = r->P[(size_t)i * KL + j];
      /* P = 0 contributes nothing; never evaluate the joint here. A NaN P
       * (a row whose LSE is NaN, or a +inf t) goes on and makes the
       * gradients it touches NaN, as IEEE arithmetic says. */
      if (P == 0) continue;
      const double M = drop_mult(c, b, h, i, j);
      double dP = 0;
      for (int e = 0; e < EV; e++) {
        dP += dO[e] * r->v[(size_t)j * EV + e];
        dv[(size_t)j * EV + e] += P * M * dO[e];
      }
      dP *= M;
      r->env.args[ARG_KV] = ir_vi(j + c->kv_off);
      r->env.args[ARG_S] = ir_vf(r->S[(size_t)i * KL + j]);
      r->env.args[ARG_DT] = ir_vf(P * (dP - D));
      double ds = ir_eval(c->mod->joint, &r->env, r->vals).f;
      if (failed(r)) return false;
      for (int e = 0; e < E; e++) {
        g->dq[(size_t)i * E + e] += c->scale * ds * r->k[(size_t)j * E + e];
        dk[(size_t)j * E + e] += c->scale * ds * r->q[(size_t)i * E + e];
      }
    }
  }
  store_slice(a->dq, b, h, QL, E, g->dq);
  return true;
}

/* Attach a zeroed float64 accumulator to every grad buffer the caller gave. */
static void attach_grads(Ref *r, Arena *a) {
  const RtCall *c = r->c;
  for (int j = 0; j < c->mod->nbuffers; j++) {
    if (!c->buf_grads[j]) continue;
    int64_t n = 1;
    for (int d = 0; d < r->bufs[j].ndims; d++) n *= r->bufs[j].shape[d];
    r->bufs[j].grad = dalloc(a, (size_t)n);
  }
}

/* Write the accumulated gradients to the caller's tensors. */
static void write_grads(const Ref *r, const Grads *g) {
  const RtCall *c = r->c;
  for (int b = 0; b < c->B; b++)
    for (int k = 0; k < c->HKV; k++) {
      size_t base = ((size_t)b * c->HKV + k) * c->KL;
      store_slice(c->args->dk, b, k, c->KL, c->E, g->dk + base * c->E);
      store_slice(c->args->dv, b, k, c->KL, c->EV, g->dv + base * c->EV);
    }
  for (int j = 0; j < c->mod->nbuffers; j++) {
    const DLTensor *t = c->buf_grads[j];
    if (!t) continue;
    const IrBufView *bv = &r->bufs[j];
    int64_t n = 1, idx[IR_MAXDIMS];
    for (int d = 0; d < bv->ndims; d++) n *= bv->shape[d];
    for (int64_t o = 0; o < n; o++) {
      int64_t rest = o;
      for (int d = bv->ndims - 1; d >= 0; d--) {
        idx[d] = rest % bv->shape[d];
        rest /= bv->shape[d];
      }
      put(t, idx, c->accumulate ? get(t, idx) + bv->grad[o] : bv->grad[o]);
    }
  }
}

flex_status rt_reference_backward(const RtCall *c) {
  Arena a = {0};
  Ref r;
  memset(&r, 0, sizeof r);
  flex_status st = start(&r, &a, c);
  if (st) {
    finish(&r, &a);
    return st;
  }
  Grads g;
  size_t kv = (size_t)c->B * c->HKV * c->KL;
  g.dk = dalloc(&a, kv * c->E);
  g.dv = dalloc(&a, kv * c->EV);
  g.dq = dalloc(&a, (size_t)c->QL * c->E);
  g.dout = dalloc(&a, (size_t)c->QL * c->EV);
  attach_grads(&r, &a);
  const bool sharded = c->q_off || c->kv_off || c->sizes[SZ_Q_LEN] != c->QL || c->sizes[SZ_KV_LEN] != c->KL;
  for (int b = 0; st == FLEX_OK && b < c->B; b++)
    for (int h = 0; st == FLEX_OK && h < c->H; h++)
      if (!block(&r, b, h, sharded) || !block_backward(&r, &g, b, h)) st = checked_failure(&r);
  if (st == FLEX_OK) write_grads(&r, &g);
  finish(&r, &a);
  return st;
}
