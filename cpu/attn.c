/* attn.c: the CPU attention entries, tiled FlashAttention over FlexParams.
 *
 * Forward (cpu_attn_fwd): one work item per (batch, head, group of
 * a->qgroup query tiles). K is packed once per call as fp32 K^T per
 * key/value head (so S = Q K^T needs no per-tile packing) and V as padded
 * fp32 rows, a chunk of heads at a time (bf16: pairs, pack_kv_bf16); each
 * tile walks its key tiles a->kvchunk at a time, skips empty ones, runs
 * the JIT's score (full tiles) or score+mask (partial tiles) over S, and
 * keeps the online softmax (running max m and sum l per row) with O
 * accumulated in fp32.
 *
 * Backward (cpu_attn_bwd): one work item per (batch, key/value head, key
 * tile), looping over the heads of its group and the query tiles its walk
 * keeps; P is recomputed from LSE, dV += P^T dO, dP = dO V^T,
 * dt = P (dP - D), ds = joint(dt) (or dt), dK += ds^T Q, and ds K is added
 * into the fp32 dq_acc rows of the query tile under that tile's spin lock
 * (items start at different query tiles, so they seldom meet). Buffer
 * gradients go into per-worker accumulators, summed at the end.
 *
 * A deterministic backward (a->deterministic) adds dQ in key-tile order
 * instead: each (b, h, query tile) counts the key tiles that have passed
 * it, and key tile kt adds its ds K when the count is kt (wait_turn); its
 * buffer gradients go into exact accumulators (kernels/exact.cuh).
 *
 * Dropout (docs/language.md; p->drop_p > 0): the keep bits of kernels/philox.cuh,
 * as on every backend. The forward zeroes dropped P after the row sums and
 * before P V, and scales O by 1 / (1 - p); the backward multiplies P by
 * M = keep / (1 - p) for dV and dP by M.
 *
 * Non-finite values follow docs/language.md: a NaN in a row makes LSE and O NaN, a
 * +inf makes LSE +inf and O NaN, a fully masked row gives O = 0 and
 * LSE = -inf, and elements with P = 0 contribute nothing to gradients.
 */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu/attn.h"
#include "kernels/philox.cuh"

/* ---- element conversion ------------------------------------------------------ */

/* n elements at element offset off of base (dtype dt) into dst as fp32. */
static void load_row(float *dst, const void *base, int64_t off, int n, CgDtype dt) {
  if (dt == CG_FP32) memcpy(dst, (const float *)base + off, sizeof(float) * (size_t)n);
  else cpu_kern()->from16(dst, (const uint16_t *)base + off, n, dt == CG_BF16);
}

/* n fp32 values times mul into base at element offset off, rounded once to dt. */
static void store_row(void *base, int64_t off, const float *src, int n, float mul, CgDtype dt) {
  if (dt == CG_FP32) {
    float *d = (float *)base + off;
    for (int i = 0; i < n; i++) d[i] = src[i] * mul;
  } else {
    cpu_kern()->to16((uint16_t *)base + off, src, n, mul, dt == CG_BF16);
  }
}

/* ---- the walk ---------------------------------------------------------------- */

static inline int imin(int a, int b) { return a < b ? a : b; }

/* Class of the tile at (q0, kv0) of (b, h). */
static inline int tile_cls(const CpuAttn *a, int b, int h, int q0, int kv0) {
  const CpuWalk *w = &a->walk;
  if (!w->cls) return FLEX_BLOCK_FULL;
  int bb = w->Bm == 1 ? 0 : b, hh = w->Hm == 1 ? 0 : h;
  size_t row = ((size_t)bb * (size_t)w->Hm + (size_t)hh) * (size_t)w->nq + (size_t)(q0 / w->block_q);
  return w->cls[row * (size_t)w->nkv + (size_t)(kv0 / w->block_kv)];
}

/* t over an m x n tile of S: score on full tiles, score + mask on partial ones. */
static void scores(const CpuAttn *a, float *S, int64_t ld, int m, int n, int b, int h, int q0,
                   int kv0, int cls) {
  if (cls == FLEX_BLOCK_PARTIAL && a->mod->score_mask)
    a->mod->score_mask(S, ld, m, n, b, h, q0, kv0, a->p);
  else if (a->mod->score)
    a->mod->score(S, ld, m, n, b, h, q0, kv0, a->p);
}

/* ---- forward -------------------------------------------------------------------- */

/* Pack K^T and V of key/value head item (b * HKV + kvh) as fp32. */
static void pack_kv(void *ctx, int64_t item, int worker) {
  CpuAttn *a = ctx;
  const FlexParams *p = a->p;
  (void)worker;
  int64_t head = a->chunk0 + item;
  int b = (int)(head / p->HKV), kvh = (int)(head % p->HKV);
  float *kt = a->kt + item * (int64_t)a->E * a->ldk, *vp = a->vp + item * (int64_t)p->kv_len * a->EVp;
  /* K^T 16 keys at a time, so that each row of K^T gets 64 contiguous
   * bytes instead of one element per cache line */
  float rows[16][512];
  for (int j0 = 0; j0 < p->kv_len; j0 += 16) {
    int jn = imin(16, p->kv_len - j0);
    for (int jj = 0; jj < jn; jj++)
      load_row(rows[jj], p->k, b * p->sk.b + kvh * p->sk.h + (int64_t)(j0 + jj) * p->sk.row, a->E,
               a->dtype);
    for (int e = 0; e < a->E; e++)
      for (int jj = 0; jj < jn; jj++) kt[(int64_t)e * a->ldk + j0 + jj] = rows[jj][e];
  }
  for (int e = 0; e < a->E; e++) /* the last tile's columns past the keys */
    memset(kt + (int64_t)e * a->ldk + p->kv_len, 0, sizeof(float) * (size_t)(a->ldk - p->kv_len));
  for (int j = 0; j < p->kv_len; j++) {
    float *d = vp + (int64_t)j * a->EVp;
    load_row(d, p->v, b * p->sv.b + kvh * p->sv.h + j * p->sv.row, a->EV, a->dtype);
    memset(d + a->EV, 0, sizeof(float) * (size_t)(a->EVp - a->EV));
  }
}

/* The same for the bf16 products (a->bf16): K^T as E2 rows of 32-bit words,
 * word (e2, j) the pair (K[j][2 e2], K[j][2 e2 + 1]), so a row of Q (bf16
 * pairs along E) times a row of words is vdpbf16ps's operand shape; V as
 * words (j2, e) = (V[2 j2][e], V[2 j2 + 1][e]), pairs of keys, for P V.
 * Padding (an odd E, an odd last key, columns past EV) stays zero. */
static void pack_kv_bf16(void *ctx, int64_t item, int worker) {
  CpuAttn *a = ctx;
  const FlexParams *p = a->p;
  (void)worker;
  int64_t head = a->chunk0 + item;
  int b = (int)(head / p->HKV), kvh = (int)(head % p->HKV), E = a->E, E2 = (E + 1) / 2;
  uint32_t *kt = (uint32_t *)a->kt + item * (int64_t)E2 * a->ldk;
  uint32_t *vp = (uint32_t *)a->vp + item * (int64_t)((p->kv_len + 1) / 2) * a->EVp;
  /* K^T: a row of K read as E2 words is already (K[j][2 e2], K[j][2 e2 + 1])
   * (little-endian), so this is a transpose of words, 16 keys at a time as
   * pack_kv; an odd E's last word gets a zero high half */
  uint32_t rows[16][256];
  for (int j0 = 0; j0 < p->kv_len; j0 += 16) {
    int jn = imin(16, p->kv_len - j0);
    for (int jj = 0; jj < jn; jj++) {
      const uint16_t *kr = (const uint16_t *)p->k + b * p->sk.b + kvh * p->sk.h + (int64_t)(j0 + jj) * p->sk.row;
      rows[jj][E2 - 1] = 0;
      memcpy(rows[jj], kr, sizeof(uint16_t) * (size_t)E);
    }
    for (int e2 = 0; e2 < E2; e2++)
      for (int jj = 0; jj < jn; jj++) kt[(int64_t)e2 * a->ldk + j0 + jj] = rows[jj][e2];
  }
  /* V: word (j2, e) = (V[2 j2][e], V[2 j2 + 1][e]), two rows zipped */
  const uint16_t *v0 = (const uint16_t *)p->v + b * p->sv.b + kvh * p->sv.h;
  for (int j = 0; j < p->kv_len; j += 2) {
    const uint16_t *r0 = v0 + j * p->sv.row, *r1 = r0 + p->sv.row;
    uint32_t *d = vp + (int64_t)(j / 2) * a->EVp;
    if (j + 1 < p->kv_len)
      for (int e = 0; e < a->EV; e++) d[e] = r0[e] | (uint32_t)r1[e] << 16;
    else
      for (int e = 0; e < a->EV; e++) d[e] = r0[e];
    memset(d + a->EV, 0, sizeof(uint32_t) * (size_t)(a->EVp - a->EV));
  }
  for (int e2 = 0; e2 < E2; e2++) /* the last tile's columns past the keys */
    memset(kt + (int64_t)e2 * a->ldk + p->kv_len, 0, sizeof(uint32_t) * (size_t)(a->ldk - p->kv_len));
}

/* Dropout on keys kv0 .. kv0 + n - 1 of row qi of (b, h) (b as the call
 * indexes it; the bits see b + b0 and a shard's positions, qi + q_off and
 * kv + kv_off): x[j] zeroed where dropped, or with
 * `mult`, set to M = keep / (1 - p); xb instead of x (not NULL): a bf16
 * row, zeroed where dropped. One Philox call per four keys. */
static void drop_row(const FlexParams *p, int b, int h, int qi, int kv0, int n, float *x,
                     uint16_t *xb, bool mult) {
  uint32_t bh = (uint32_t)((b + p->b0) * p->H + h), w[4] = {0, 0, 0, 0};
  for (int j = 0; j < n; j++) {
    uint32_t kj = (uint32_t)(kv0 + p->kv_off + j);
    if (j == 0 || (kj & 3) == 0)
      flex_dropout_words(w, p->drop_seed[0], p->drop_seed[1], p->drop_ctr3, bh,
                         (uint32_t)(qi + p->q_off), kj >> 2);
    bool keep = flex_dropout_keep(w[kj & 3], p->drop_p);
    if (xb) {
      if (!keep) xb[j] = 0;
    } else if (mult) x[j] = keep ? p->drop_scale : 0.0f;
    else if (!keep) x[j] = 0.0f;
  }
}

/* One query tile's running state in a forward item. */
typedef struct FwdTile {
  int q0, m;          /* first row and rows */
  float *Q;           /* Q * scale (fp32), or Q's rows as bf16 pairs (E2 words a row) */
  float *O;           /* unnormalised O, EVp a row */
  float *mrow, *lrow; /* running max and sum */
} FwdTile;

/* Loads the tile's Q and clears its state. */
static void fwd_begin(const CpuAttn *a, FwdTile *t, int b, int h) {
  const FlexParams *p = a->p;
  int E = a->E, E2 = (E + 1) / 2;
  for (int i = 0; i < t->m; i++) {
    int64_t off = b * p->sq.b + h * p->sq.h + (int64_t)(t->q0 + i) * p->sq.row;
    if (a->bf16) { /* the scale is applied to S by the product */
      uint16_t *d = (uint16_t *)((uint32_t *)t->Q + (size_t)i * E2);
      memcpy(d, (const uint16_t *)p->q + off, sizeof(uint16_t) * (size_t)E);
      if (E & 1) d[E] = 0;
    } else { /* Q * scale, so that S = Q K^T needs no pass of its own */
      load_row(t->Q + (size_t)i * E, p->q, off, E, a->dtype);
      a->K->scale(t->Q + (size_t)i * E, E, p->scale);
    }
    t->mrow[i] = -INFINITY, t->lrow[i] = 0;
  }
  memset(t->O, 0, sizeof(float) * (size_t)t->m * (size_t)a->EVp);
}

/* Key tile kv0 of key/value head `local` (in kt, vp) into t's state: S =
 * Q K^T, the score (and mask), the online softmax, O += P V. S and Pb
 * (P as bf16) are the worker's. */
static void fwd_tile(const CpuAttn *a, FwdTile *t, int64_t local, int b, int h, int kv0, int cls,
                     float *S, uint16_t *Pb) {
  const FlexParams *p = a->p;
  const CpuKern *K = a->K;
  int E = a->E, E2 = (E + 1) / 2, EVp = a->EVp, bnp = a->bnp, m = t->m;
  int n = imin(a->bn, p->kv_len - kv0);
  float *O = t->O, *mrow = t->mrow, *lrow = t->lrow;
  if (a->bf16) {
    const uint32_t *ktb = (const uint32_t *)a->kt + local * E2 * a->ldk;
    K->gemm_bf16(m, bnp, E2, (const uint32_t *)t->Q, E2, ktb + kv0, a->ldk, S, bnp, p->scale, false);
  } else {
    K->gemm(m, bnp, E, t->Q, E, 1, a->kt + local * E * a->ldk + kv0, a->ldk, S, bnp, false);
  }
  scores(a, S, bnp, m, n, b, h, t->q0, kv0, cls);
  /* bf16: P straight to bf16 (exp_sum_bf16), no fp32 P */
  int n2 = n + (n & 1); /* bf16: an odd last tile's pad key has P = 0 */
  for (int i = 0; i < m; i++) {
    float *r = S + (size_t)i * bnp, mt = K->row_max(r, n), mo = mrow[i];
    float mn = isnan(mt) || isnan(mo) ? NAN : mt > mo ? mt : mo;
    if (mn == -INFINITY) { /* nothing kept so far: P = 0 */
      if (a->bf16) memset(Pb + (size_t)i * bnp, 0, sizeof(uint16_t) * (size_t)n2);
      else memset(r, 0, sizeof(float) * (size_t)n);
      continue;
    }
    float alpha = mo == -INFINITY ? 0.0f : mo == mn ? 1.0f : expf(mo - mn);
    float sum = a->bf16 ? K->exp_sum_bf16(Pb + (size_t)i * bnp, r, n, mn) : K->exp_sum(r, n, mn);
    lrow[i] = lrow[i] * alpha + sum;
    if (alpha != 1.0f) K->scale(O + (size_t)i * EVp, EVp, alpha);
    mrow[i] = mn;
  }
  if (p->drop_p > 0.0f) /* after the row sums, before P V; 1 / (1 - p) scales O at the end */
    for (int i = 0; i < m; i++)
      drop_row(p, b, h, t->q0 + i, kv0, n, S + (size_t)i * bnp, a->bf16 ? Pb + (size_t)i * bnp : NULL,
               false);
  if (a->bf16) { /* P in bf16, as FlashAttention rounds it before P V (l sums the rounded P) */
    const uint32_t *vpb = (const uint32_t *)a->vp + local * ((p->kv_len + 1) / 2) * EVp;
    K->gemm_bf16(m, EVp, n2 / 2, (const uint32_t *)Pb, bnp / 2, vpb + (int64_t)(kv0 / 2) * EVp, EVp,
                 O, EVp, 1.0f, true);
  } else {
    const float *vp = a->vp + local * p->kv_len * EVp;
    K->gemm(m, EVp, n, S, bnp, 1, vp + (int64_t)kv0 * EVp, EVp, O, EVp, true);
  }
}

/* O = O / l and the LSE, stored. A sink (docs/language.md "Attention sinks") is one
 * more term of each row's sum, folded in here once: the keys' O scaled down
 * by it, a fully masked row O = 0 and LSE = sk, a NaN or +inf sink makes LSE
 * that and O NaN. */
static void fwd_end(const CpuAttn *a, const FwdTile *t, int b, int h, float *sk) {
  const FlexParams *p = a->p;
  if (sk) a->mod->sink(sk, 1, t->m, 1, b, h, t->q0, 0, p);
  for (int i = 0; i < t->m; i++) {
    float *o = t->O + (size_t)i * a->EVp, lse, mi = t->mrow[i], corr = 1.0f, l = t->lrow[i];
    const float s = sk ? sk[i] : -INFINITY;
    if (mi == -INFINITY) memset(o, 0, sizeof(float) * (size_t)a->EV); /* fully masked row */
    if (!(s < INFINITY)) { /* a NaN or +inf sink */
      for (int e = 0; e < a->EV; e++) o[e] = NAN;
      mi = s, l = 1.0f;
    } else if (s > -INFINITY && mi == mi && mi < INFINITY) {
      const float top = mi > s ? mi : s;
      corr = mi == -INFINITY ? 0.0f : expf(mi - top);
      l = l * corr + expf(s - top);
      mi = top;
    }
    if (mi == -INFINITY) lse = -INFINITY;
    else lse = mi == INFINITY || mi != mi ? mi : mi + logf(l);
    float inv = mi == -INFINITY ? 1.0f : corr / l;
    if (p->drop_p > 0.0f) inv *= p->drop_scale;
    store_row(p->out, b * p->so.b + h * p->so.h + (int64_t)(t->q0 + i) * p->so.row, o, a->EV, inv,
              a->out_dtype);
    p->lse[b * p->lse_b + h * p->lse_h + t->q0 + i] = lse;
  }
}

/* Floats of scratch one forward worker needs: S and P (bf16) for a tile,
 * then Q, O, m and l for each of the qgroup query tiles. */
size_t cpu_attn_fwd_scratch(const CpuAttn *a) {
  size_t bm = (size_t)a->bm, bnp = (size_t)a->bnp;
  return bm * bnp + bm * bnp / 2 + (size_t)a->qgroup * bm * (size_t)(a->E + a->EVp + 2) + 64;
}

/* Item: qgroup consecutive query tiles of one query head, which walk the
 * keys a chunk of kvchunk tiles at a time, every tile of the group through
 * the chunk before the next: the chunk's K and V stay in this core's cache
 * while the group reuses them, where one query tile at a time would stream
 * the whole head's K and V from memory for each tile (at 4096 keys and
 * E = 64 that is 1 MB in bf16, more than the core's L2). Each tile still
 * sees the keys in ascending order, so the result is the same bits. */
static void fwd_item(void *ctx, int64_t item, int worker) {
  CpuAttn *a = ctx;
  const FlexParams *p = a->p;
  int ngr = (a->nqt + a->qgroup - 1) / a->qgroup;
  int64_t local = item / ((int64_t)p->G * ngr), head = a->chunk0 + local;
  /* the last query tiles first: under a causal mask they have the most
   * keys, and the pool hands items out in order, so the long items start
   * early and the short ones fill in at the end */
  int grp = ngr - 1 - (int)(item % ngr), g = (int)(item / ngr % p->G);
  int b = (int)(head / p->HKV), kvh = (int)(head % p->HKV), h = kvh * p->G + g;
  float *S = a->scratch + (size_t)worker * a->scratch_per;
  uint16_t *Pb = (uint16_t *)(S + (size_t)a->bm * a->bnp);
  float *f = S + (size_t)a->bm * a->bnp * 3 / 2;
  FwdTile t[CPU_FWD_QGROUP_MAX];
  int nt = 0;
  for (int qt = grp * a->qgroup; qt < a->nqt && nt < a->qgroup; qt++, nt++) {
    FwdTile *u = &t[nt];
    u->q0 = qt * a->bm, u->m = imin(a->bm, p->q_len - u->q0);
    u->Q = f, u->O = u->Q + (size_t)a->bm * a->E;
    u->mrow = u->O + (size_t)a->bm * a->EVp, u->lrow = u->mrow + a->bm;
    f = u->lrow + a->bm;
    fwd_begin(a, u, b, h);
  }
  uint64_t tiles = 0;
  for (int c0 = 0; c0 < a->nkt; c0 += a->kvchunk)
    for (int i = 0; i < nt; i++)
      for (int kt = c0; kt < a->nkt && kt < c0 + a->kvchunk; kt++) {
        int kv0 = kt * a->bn, cls = tile_cls(a, b, h, t[i].q0, kv0);
        if (cls == FLEX_BLOCK_EMPTY) continue;
        tiles++;
        fwd_tile(a, &t[i], local, b, h, kv0, cls, S, Pb);
      }
  /* a shard carries the sink when its keys begin the sequence (kv_off 0) */
  float *sk = a->mod->sink && p->kv_off == 0 ? S : NULL; /* S is free now */
  for (int i = 0; i < nt; i++) fwd_end(a, &t[i], b, h, sk);
  atomic_fetch_add(&a->tiles, tiles);
}

/* Key/value heads are packed and run in chunks of about 64 MB of packed
 * K^T and V (FLEXC_CPU_PACK_MB; 0: one head at a time, for tests), so the
 * copies stay bounded whatever B and HKV are. */
void cpu_attn_fwd(CpuAttn *a) {
  const FlexParams *p = a->p;
  int64_t kvheads = (int64_t)p->B * p->HKV;
  /* words a head: bf16 packs pairs (E2 rows of K^T, key pairs of V) */
  int64_t ktw = (a->bf16 ? (a->E + 1) / 2 : a->E) * a->ldk;
  int64_t vpw = (a->bf16 ? (p->kv_len + 1) / 2 : p->kv_len) * (int64_t)a->EVp;
  int64_t per = (ktw + vpw) * (int64_t)sizeof(float);
  int64_t budget = (int64_t)(base_config()->cpu_pack_mb ? base_config()->cpu_pack_mb : 64) << 20;
  int64_t chunk = budget / (per ? per : 1);
  if (chunk < 1) chunk = 1;
  if (chunk > kvheads) chunk = kvheads;
  /* not zeroed here: the packers write every word the products read, pads
   * included (zeroing 2 x 64 MB on the calling thread cost more than the
   * packing) */
  a->kt = base_realloc(NULL, sizeof(float) * (size_t)(chunk * ktw) + 64);
  a->vp = base_realloc(NULL, sizeof(float) * (size_t)(chunk * vpw) + 64);
  for (a->chunk0 = 0; a->chunk0 < kvheads; a->chunk0 += chunk) {
    int64_t n = kvheads - a->chunk0 < chunk ? kvheads - a->chunk0 : chunk;
    base_pool_run(n, a->bf16 ? pack_kv_bf16 : pack_kv, a);
    base_pool_run(n * p->G * ((a->nqt + a->qgroup - 1) / a->qgroup), fwd_item, a);
  }
  base_free(a->kt);
  base_free(a->vp);
  a->kt = a->vp = NULL;
}

/* ---- backward ----------------------------------------------------------------------- */

/* The sink's gradient, dsk = -Ps D with Ps = exp(sk - LSE), once per row
 * where Ps is not 0, added into the buffer gradients in row order on the
 * calling thread (p->grad_exact's accumulators for a deterministic
 * backward, else p->buf_grad): a cheap pass, and the same order always. */
static void sink_grads(const CpuAttn *a) {
  const FlexParams *p = a->p;
  float *const *acc = a->deterministic ? (float *const *)p->grad_exact : p->buf_grad;
  for (int b = 0; b < p->B; b++)
    for (int h = 0; h < p->H; h++)
      for (int i = 0; i < p->q_len; i++) {
        float sk, lse = p->lse[b * p->lse_b + h * p->lse_h + i];
        a->mod->sink(&sk, 1, 1, 1, b, h, i, 0, p);
        const float ps = sk != -INFINITY ? expf(sk - lse) : 0.0f; /* -inf: no sink */
        float dt = -ps * p->delta[((int64_t)b * p->H + h) * p->q_len + i];
        if (ps != 0.0f) a->mod->sink_grad(&dt, 1, 1, 1, b, h, i, 0, p, acc);
      }
}

/* D = rowsum(dO * O) - dLSE and a zeroed dq_acc, for rows of (b, h) item. */
static void pre_item(void *ctx, int64_t item, int worker) {
  CpuAttn *a = ctx;
  const FlexParams *p = a->p;
  float *o = a->scratch + (size_t)worker * a->scratch_per, *d = o + a->EVp;
  int b = (int)(item / p->H), h = (int)(item % p->H);
  for (int i = 0; i < p->q_len; i++) {
    load_row(o, p->out, b * p->so.b + h * p->so.h + (int64_t)i * p->so.row, a->EV,
             a->out_dtype);
    load_row(d, p->dout, b * p->sdo.b + h * p->sdo.h + (int64_t)i * p->sdo.row, a->EV, a->dtype);
    float s = 0;
    for (int e = 0; e < a->EV; e++) s += o[e] * d[e];
    int64_t li = b * p->lse_b + h * p->lse_h + i;
    int64_t row = ((int64_t)b * p->H + h) * p->q_len + i;
    p->delta[row] = s - (p->dlse ? p->dlse[li] : 0.0f);
    memset(p->dq_acc + row * a->E, 0, sizeof(float) * (size_t)a->E);
  }
}

void cpu_attn_bwd_pre(CpuAttn *a) {
  base_pool_run((int64_t)a->p->B * a->p->H, pre_item, a);
  if (a->mod->sink_grad && a->p->kv_off == 0) sink_grads(a); /* the shard that carries the sink */
}

/* dq = scale * dq_acc in the input dtype, rows of (b, h) item. */
static void dq_item(void *ctx, int64_t item, int worker) {
  CpuAttn *a = ctx;
  const FlexParams *p = a->p;
  (void)worker;
  int b = (int)(item / p->H), h = (int)(item % p->H);
  for (int i = 0; i < p->q_len; i++) {
    int64_t row = ((int64_t)b * p->H + h) * p->q_len + i;
    store_row(p->dq, b * p->sdq.b + h * p->sdq.h + (int64_t)i * p->sdq.row, p->dq_acc + row * a->E,
              a->E, p->scale, a->dtype);
  }
}

void cpu_attn_bwd_dq(CpuAttn *a) { base_pool_run((int64_t)a->p->B * a->p->H, dq_item, a); }

/* Scratch of one backward worker, carved out of its slice. */
typedef struct BwdScratch {
  float *kt, *kf, *vt;   /* K^T [E x bnp], K [bn x Ep], V^T [EV x bnp] */
  float *dk, *dv;        /* accumulators [bn x Ep], [bn x EVp] */
  float *qf, *dof;       /* Q * scale [bm x Ep], dO [bm x EVp] */
  float *s, *t, *dp;     /* S, P, dP then ds [bm x bnp] */
  float *dq;             /* ds K [bm x Ep] */
  float *mk;             /* dropout's M [bm x bnp] (p->drop_p > 0) */
} BwdScratch;

size_t cpu_attn_bwd_scratch(const CpuAttn *a) {
  size_t bm = (size_t)a->bm, bn = (size_t)a->bnp, Ep = (size_t)a->Ep, EVp = (size_t)a->EVp;
  return (size_t)a->E * bn + bn * Ep + (size_t)a->EV * bn + bn * Ep + bn * EVp + bm * Ep +
         bm * EVp + 4 * bm * bn + bm * Ep + 64;
}

static BwdScratch carve(const CpuAttn *a, float *f) {
  size_t bm = (size_t)a->bm, bn = (size_t)a->bnp, Ep = (size_t)a->Ep, EVp = (size_t)a->EVp;
  BwdScratch s;
  s.kt = f, f += (size_t)a->E * bn;
  s.kf = f, f += bn * Ep;
  s.vt = f, f += (size_t)a->EV * bn;
  s.dk = f, f += bn * Ep;
  s.dv = f, f += bn * EVp;
  s.qf = f, f += bm * Ep;
  s.dof = f, f += bm * EVp;
  s.s = f, f += bm * bn;
  s.t = f, f += bm * bn;
  s.dp = f, f += bm * bn;
  s.dq = f, f += bm * Ep;
  s.mk = f;
  return s;
}

/* Spin, yielding now and then: a holder that lost its core (more threads
 * than free cores) gets it back. */
static void lock(_Atomic int *l) {
  int z = 0;
  for (int spins = 0; !atomic_compare_exchange_weak_explicit(l, &z, 1, memory_order_acquire,
                                                             memory_order_relaxed);
       spins++) {
    z = 0;
    if (spins % 64 == 63) sched_yield();
  }
}
static void unlock(_Atomic int *l) { atomic_store_explicit(l, 0, memory_order_release); }

/* A deterministic backward: key tile kt's turn at a query tile comes when
 * the kt tiles before it have passed (t counts them), so dQ sums in
 * key-tile order. Items are handed out in increasing order and item kt
 * only waits for items kt' < kt of its own (b, kv head), which have
 * started: the wait ends. */
static void wait_turn(_Atomic int *t, int kt) {
  for (int spins = 0; atomic_load_explicit(t, memory_order_acquire) != kt; spins++)
    if (spins % 64 == 63) sched_yield();
}
static void pass_turn(_Atomic int *t, int kt) { atomic_store_explicit(t, kt + 1, memory_order_release); }

/* One query tile against the item's key tile for head h. */
static void bwd_tile(CpuAttn *a, BwdScratch *s, int b, int h, int q0, int kv0, int n, int cls,
                     int worker) {
  const FlexParams *p = a->p;
  const CpuKern *K = a->K;
  int m = imin(a->bm, p->q_len - q0), E = a->E, EV = a->EV, Ep = a->Ep, EVp = a->EVp, bnp = a->bnp;
  memset(s->qf, 0, sizeof(float) * (size_t)m * (size_t)Ep);
  memset(s->dof, 0, sizeof(float) * (size_t)m * (size_t)EVp);
  for (int i = 0; i < m; i++) {
    load_row(s->qf + (size_t)i * Ep, p->q, b * p->sq.b + h * p->sq.h + (int64_t)(q0 + i) * p->sq.row, E, a->dtype);
    K->scale(s->qf + (size_t)i * Ep, E, p->scale);
    load_row(s->dof + (size_t)i * EVp, p->dout,
             b * p->sdo.b + h * p->sdo.h + (int64_t)(q0 + i) * p->sdo.row, EV, a->dtype);
  }
  K->gemm(m, bnp, E, s->qf, Ep, 1, s->kt, bnp, s->s, bnp, false); /* S = scale Q K^T, as forward */
  for (int i = 0; i < m; i++) memcpy(s->t + (size_t)i * bnp, s->s + (size_t)i * bnp, sizeof(float) * (size_t)n);
  scores(a, s->t, bnp, m, n, b, h, q0, kv0, cls);
  int64_t rowbase = ((int64_t)b * p->H + h) * p->q_len + q0;
  for (int i = 0; i < m; i++)
    K->exp_sub(s->t + (size_t)i * bnp, n, p->lse[b * p->lse_b + h * p->lse_h + q0 + i]);
  if (p->drop_p > 0.0f) { /* dV += (P M)^T dO, dP = M (dO V^T) */
    for (int i = 0; i < m; i++) {
      float *mk = s->mk + (size_t)i * bnp, *pm = s->dp + (size_t)i * bnp;
      const float *t = s->t + (size_t)i * bnp;
      drop_row(p, b, h, q0 + i, kv0, n, mk, NULL, true);
      for (int j = 0; j < n; j++) pm[j] = t[j] * mk[j];
      for (int j = n; j < bnp; j++) pm[j] = 0.0f;
    }
    K->gemm(n, EVp, m, s->dp, 1, bnp, s->dof, EVp, s->dv, EVp, true);
    K->gemm(m, bnp, EV, s->dof, EVp, 1, s->vt, bnp, s->dp, bnp, false);
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) s->dp[(size_t)i * bnp + j] *= s->mk[(size_t)i * bnp + j];
  } else {
    K->gemm(n, EVp, m, s->t, 1, bnp, s->dof, EVp, s->dv, EVp, true);   /* dV += P^T dO */
    K->gemm(m, bnp, EV, s->dof, EVp, 1, s->vt, bnp, s->dp, bnp, false); /* dP = dO V^T */
  }
  for (int i = 0; i < m; i++)
    K->dt_row(s->dp + (size_t)i * bnp, s->t + (size_t)i * bnp, n, p->delta[rowbase + i]);
  if (a->mod->joint)
    a->mod->joint(s->dp, s->s, s->t, bnp, m, n, b, h, q0, kv0, p,
                  a->acc + (size_t)worker * FLEX_MAX_BUFFERS);
  K->gemm(n, Ep, m, s->dp, 1, bnp, s->qf, Ep, s->dk, Ep, true);  /* dK += ds^T (scale Q) */
  K->gemm(m, Ep, n, s->dp, bnp, 1, s->kf, Ep, s->dq, Ep, false); /* ds K, scaled in BWD_DQ */
  _Atomic int *l = &a->locks[((int64_t)b * p->H + h) * a->nqt + q0 / a->bm];
  if (a->deterministic) wait_turn(l, kv0 / a->bn);
  else lock(l);
  for (int i = 0; i < m; i++) {
    float *acc = p->dq_acc + (rowbase + i) * E;
    const float *d = s->dq + (size_t)i * Ep;
    for (int e = 0; e < E; e++) acc[e] += d[e];
  }
  if (a->deterministic) pass_turn(l, kv0 / a->bn);
  else unlock(l);
}

static void bwd_item(void *ctx, int64_t item, int worker) {
  CpuAttn *a = ctx;
  const FlexParams *p = a->p;
  int kt = (int)(item % a->nkt), kvh = (int)(item / a->nkt % p->HKV), b = (int)(item / a->nkt / p->HKV);
  int kv0 = kt * a->bn, n = imin(a->bn, p->kv_len - kv0);
  int E = a->E, EV = a->EV, Ep = a->Ep, EVp = a->EVp, bnp = a->bnp;
  BwdScratch s = carve(a, a->scratch + (size_t)worker * a->scratch_per);
  memset(s.kt, 0, sizeof(float) * (size_t)E * (size_t)bnp);
  memset(s.kf, 0, sizeof(float) * (size_t)bnp * (size_t)Ep);
  memset(s.vt, 0, sizeof(float) * (size_t)EV * (size_t)bnp);
  memset(s.dk, 0, sizeof(float) * (size_t)bnp * (size_t)Ep);
  memset(s.dv, 0, sizeof(float) * (size_t)bnp * (size_t)EVp);
  float row[512];
  for (int j = 0; j < n; j++) {
    load_row(s.kf + (size_t)j * Ep, p->k, b * p->sk.b + kvh * p->sk.h + (int64_t)(kv0 + j) * p->sk.row, E, a->dtype);
    for (int e = 0; e < E; e++) s.kt[(size_t)e * bnp + j] = s.kf[(size_t)j * Ep + e];
    load_row(row, p->v, b * p->sv.b + kvh * p->sv.h + (int64_t)(kv0 + j) * p->sv.row, EV, a->dtype);
    for (int e = 0; e < EV; e++) s.vt[(size_t)e * bnp + j] = row[e];
  }
  uint64_t tiles = 0;
  for (int g = 0; g < p->G; g++) {
    int h = kvh * p->G + g;
    for (int k = 0; k < a->nqt; k++) {
      /* Items start at different query tiles so they seldom meet at one
       * lock; deterministic ones all go in order, each one tile behind
       * the key tile before it, and pass the tiles they skip. */
      int qt = a->deterministic ? k : (k + kt) % a->nqt;
      int q0 = qt * a->bm, cls = tile_cls(a, b, h, q0, kv0);
      if (cls == FLEX_BLOCK_EMPTY) {
        if (a->deterministic) {
          _Atomic int *t = &a->locks[((int64_t)b * p->H + h) * a->nqt + qt];
          wait_turn(t, kt);
          pass_turn(t, kt);
        }
        continue;
      }
      tiles++;
      bwd_tile(a, &s, b, h, q0, kv0, n, cls, worker);
    }
  }
  for (int j = 0; j < n; j++) {
    store_row(p->dk, b * p->sdk.b + kvh * p->sdk.h + (int64_t)(kv0 + j) * p->sdk.row, s.dk + (size_t)j * Ep,
              E, 1.0f, a->dtype);
    store_row(p->dv, b * p->sdv.b + kvh * p->sdv.h + (int64_t)(kv0 + j) * p->sdv.row, s.dv + (size_t)j * EVp,
              EV, 1.0f, a->dtype);
  }
  atomic_fetch_add(&a->tiles, tiles);
}

void cpu_attn_bwd(CpuAttn *a) {
  const FlexParams *p = a->p;
  size_t nlocks = (size_t)p->B * (size_t)p->H * (size_t)a->nqt;
  a->locks = base_alloc(sizeof(_Atomic int) * nlocks + sizeof(_Atomic int));
  base_pool_run((int64_t)p->B * p->HKV * a->nkt, bwd_item, a);
  base_free((void *)a->locks);
  a->locks = NULL;
}
