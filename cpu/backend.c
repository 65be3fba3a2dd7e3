/* backend.c: rt_cpu_backend, the verbs of runtime/backend.h for the CPU.
 *
 * Memory is host memory (alloc is zeroed base_alloc, copies are memcpy).
 * prepare JIT-compiles the score, mask and joint tile functions (jit.c);
 * launch runs this folder's C code for each entry over the FlexParams the
 * run sequence filled, ignoring the CUDA geometry:
 *
 *   MASK_BUILD  a class byte per block by the one host classifier
 *               (rt_classify_blocks: the interval analysis with the
 *               buffers' real values, then the JIT mask over the elements
 *               of the blocks it leaves open)
 *   MASK_LISTS  the eight PyTorch-layout lists from the classes
 *               (kernels/blocklist.cuh)
 *   FWD, BWD_PRE, BWD, BWD_DQ   attn.c
 *
 * The forward and backward walks take the call's block lists when it has
 * them; otherwise a kernel with a mask classifies its own tiles on the
 * host with rt_classify_blocks, the analysis alone (the IMPLICIT mode, for
 * any mask: what it cannot decide stays partial and is masked per element).
 */
#include <stdlib.h>
#include <string.h>

#include "cpu/attn.h"
#include "kernels/blocklist.cuh"
#include "kernels/exact.cuh"
#include "ir/interval.h"
#include "runtime/backend.h"
#include "runtime/blockmask.h"
#include "runtime/launch.h"

/* Tiles when the call has no block lists: 128 keys amortise the online
 * softmax's rescaling and the products' loads, with or without a mask. A
 * causal mask costs more partial keys at the diagonal with 128 than with
 * 64 (about 1/32 of its keys at L = 4096), but each of its tiles costs less:
 * causal / dense forward time measured 0.51-0.56 at L = 4096 with 128 keys,
 * 0.57-0.59 with 64 (bench/RESULTS.md). */
enum { FWD_BM = 64, FWD_BN = 128, BWD_BM = 64, BWD_BN = 64 };

/* The cpu backend runs its own loops (attn.c), which take blocks of any
 * size (tiles are cut to divide them); the granularity it states decides
 * what the plan accepts and builds: BlockMasks built for it have 64 x 64
 * blocks, a caller's needs multiples of 16 for a forward and of 64 for a
 * backward. The tensors' place is checked by validation (host memory). */
static flex_status cpu_open(RtRun *r) {
  r->dev = (CgDevice){.host = true, .host_fwd = {16, 16, 1}, .host_bwd = {64, 64, 1}};
  return FLEX_OK;
}

static flex_status cpu_prepare(RtRun *r) {
  CpuJitOpts o = {.joint = r->opts.backward && !r->opts.ds_is_dt,
                  .identity = r->opts.score_identity,
                  .check_bounds = r->opts.check_bounds,
                  .exact = r->opts.backward && r->opts.deterministic && r->opts.grad_buffers,
                  .sink_grad = r->opts.backward};
  const CpuModule *m = NULL;
  flex_status st = cpu_jit_get(r->c->mod, &o, &m);
  if (!st) r->module = (void *)m;
  return st;
}

static flex_status cpu_alloc(RtRun *r, void **out, size_t bytes) {
  (void)r;
  *out = base_alloc(bytes);
  return FLEX_OK;
}

static void cpu_release(RtRun *r, void *p) {
  (void)r;
  base_free(p);
}

static flex_status cpu_zero(RtRun *r, void *p, size_t bytes) {
  (void)r;
  if (bytes) memset(p, 0, bytes);
  return FLEX_OK;
}

static flex_status cpu_copy(RtRun *r, void *dst, const void *src, size_t bytes) {
  (void)r;
  if (bytes) memmove(dst, src, bytes);
  return FLEX_OK;
}

/* ---- the walk -------------------------------------------------------------------- */

/* Largest divisor of `block` that is at most `want`. */
static int tile_in(int block, int want) {
  int d = (block + want - 1) / want;
  while (block % d) d++;
  return block / d;
}

/* Classes from the call's kv-side lists. */
static void walk_from_lists(CpuWalk *w, const FlexParams *p) {
  const FlexBlockList *l = &p->kv_list, *f = &p->full_kv_list;
  w->block_q = p->block_q, w->block_kv = p->block_kv;
  w->nq = (p->q_len + p->block_q - 1) / p->block_q;
  w->nkv = (p->kv_len + p->block_kv - 1) / p->block_kv;
  w->Bm = l->num_b ? p->B : 1, w->Hm = l->num_h ? p->H : 1;
  if (f->num && ((f->num_b != 0) != (l->num_b != 0) || (f->num_h != 0) != (l->num_h != 0)))
    w->Bm = p->B, w->Hm = p->H; /* lists broadcast differently: store every (b, h) */
  w->cls = base_alloc((size_t)w->Bm * w->Hm * w->nq * w->nkv + 1);
  for (int b = 0; b < w->Bm; b++)
    for (int h = 0; h < w->Hm; h++)
      for (int i = 0; i < w->nq; i++) {
        uint8_t *row = w->cls + (((size_t)b * w->Hm + h) * w->nq + i) * w->nkv;
        const FlexBlockList *two[2] = {l, f};
        for (int s = 0; s < 2; s++) {
          const FlexBlockList *x = two[s];
          if (!x->num) continue;
          int n = x->num[b * x->num_b + h * x->num_h + i * x->num_r];
          const int32_t *idx = x->idx + b * x->idx_b + h * x->idx_h + i * x->idx_r;
          for (int k = 0; k < n && k < w->nkv; k++)
            if (idx[k] >= 0 && idx[k] < w->nkv) row[idx[k]] = s ? FLEX_BLOCK_FULL : FLEX_BLOCK_PARTIAL;
        }
      }
}

/* The walk of an entry: lists when the call has them, else implicit
 * classification of bm x bn tiles by the analysis when there is a mask
 * (what it cannot decide stays partial), else none. */
static void walk_init(const RtRun *r, const FlexParams *p, CpuWalk *w, int bm, int bn) {
  memset(w, 0, sizeof *w);
  if (p->kv_list.num) {
    walk_from_lists(w, p);
    return;
  }
  if (!r->c->mod->mask || p->q_len == 0 || p->kv_len == 0) return;
  const IrModule *m = r->c->mod;
  w->block_q = bm, w->block_kv = bn;
  w->nq = (p->q_len + bm - 1) / bm, w->nkv = (p->kv_len + bn - 1) / bn;
  w->Bm = ir_interval_uses_arg(m, ARG_B) ? p->B : 1;
  w->Hm = ir_interval_uses_arg(m, ARG_H) ? p->H : 1;
  w->cls = base_alloc((size_t)w->Bm * w->Hm * w->nq * w->nkv + 1);
  const RtBlockGrid g = {w->Bm, w->Hm, p->q_len, p->kv_len, bm, bn, w->nq, w->nkv, r->c->b0,
                         p->q_off, p->kv_off};
  IrIntervalEnv env = {r->c->params, r->c->sizes, r->c->bufs};
  flex_status st = rt_classify_blocks(&g, m, &env, true, NULL, w->cls, NULL);
  CHECK(st == FLEX_OK); /* the analysis alone never fails */
}

/* ---- the BlockMask builder ---------------------------------------------------------- */

/* The JIT-compiled mask over one block's elements, into this worker's
 * keep bytes. */
typedef struct JitEval {
  const CpuModule *mod;
  const FlexParams *p;
  uint8_t *keep; /* block_q x block_kv bytes per worker */
} JitEval;

static int jit_block(void *ctx, int worker, const RtRect *r, char *err, size_t cap) {
  (void)err, (void)cap;
  const JitEval *j = ctx;
  const int m = r->q1 - r->q0 + 1, n = r->k1 - r->k0 + 1;
  uint8_t *keep = j->keep + (size_t)worker * j->p->block_q * j->p->block_kv;
  j->mod->mask(keep, n, m, n, r->b, r->h, r->q0, r->k0, j->p);
  int64_t ones = 0, all = (int64_t)m * n;
  for (int64_t x = 0; x < all; x++) ones += keep[x];
  return ones == 0 ? FLEX_BLOCK_EMPTY : ones == all ? FLEX_BLOCK_FULL : FLEX_BLOCK_PARTIAL;
}

/* Class bytes of every block of the mask (the builder entry's work). */
static flex_status build_mask(const RtRun *r, const FlexParams *p) {
  const CpuModule *mod = r->module;
  JitEval j = {mod, p, base_alloc((size_t)p->block_q * p->block_kv * base_pool_size() + 1)};
  const RtBlockEval ev = {jit_block, &j, true};
  const RtBlockGrid g = {p->mask_B, p->mask_H, p->q_len, p->kv_len, p->block_q, p->block_kv,
                         p->mask_nq, p->mask_nkv, r->c->b0, p->q_off, p->kv_off};
  IrIntervalEnv env = {r->c->params, r->c->sizes, r->c->bufs};
  flex_status st = rt_classify_blocks(&g, r->c->mod, &env, true, mod->mask ? &ev : NULL,
                                      p->mask_cls, NULL);
  base_free(j.keep);
  return st;
}

/* The eight lists from the classes (kernels/blocklist.cuh). */
static void mask_lists(const FlexParams *p) {
  for (int64_t bh = 0; bh < (int64_t)p->mask_B * p->mask_H; bh++)
    for (int t = 0; t < p->mask_nq + p->mask_nkv; t++)
      flex_block_lists_at(p->mask_cls, bh, p->mask_nq, p->mask_nkv, t, p->mask_out);
}

/* ---- launch -------------------------------------------------------------------------- */

bool rt_cpu_available(void) { return cpu_jit_ready() == FLEX_OK; }

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

/* Shared state of an attention entry: tiles, padding, walk and scratch. */
static void attn_init(const RtRun *r, const FlexParams *p, CpuAttn *a, bool bwd) {
  memset(a, 0, sizeof *a);
  a->p = p;
  a->mod = r->module;
  a->K = cpu_kern();
  a->dtype = r->opts.dtype;
  a->out_dtype = r->opts.out_f32 ? CG_FP32 : a->dtype;
  a->E = p->E, a->EV = p->EV;
  a->Ep = round_up(p->E, a->K->nr), a->EVp = round_up(p->EV, a->K->nr);
  int bm = bwd ? BWD_BM : FWD_BM;
  int bn = bwd ? BWD_BN : FWD_BN;
  if (p->kv_list.num) bm = tile_in(p->block_q, bm), bn = tile_in(p->block_kv, bn);
  a->bm = bm, a->bn = bn, a->bnp = round_up(bn, a->K->nr);
  a->nqt = (p->q_len + bm - 1) / bm, a->nkt = (p->kv_len + bn - 1) / bn;
  a->ldk = (int64_t)a->nkt * bn + a->bnp + 16;
  /* bf16 products where the CPU has them; key tiles start at even keys */
  a->bf16 = !bwd && a->dtype == CG_BF16 && a->K->gemm_bf16 && bn % 2 == 0;
  walk_init(r, p, &a->walk, bm, bn);
}

static void attn_free(CpuAttn *a) {
  base_free(a->walk.cls);
  base_free(a->scratch);
}

/* The forward's grouping (attn.c fwd_item): key chunks of about 256 KB of
 * packed K and V, which stay in a core's L2 while a group of query tiles
 * reuses them; groups of 4 tiles past 2048 keys (16 key tiles), fewer
 * where that would leave fewer than 4 items a worker, none up to 2048 keys,
 * where groups measured 5 to 20% slower (docs/cpu.md). FLEXC_CPU_QGROUP (1
 * to 8) and FLEXC_CPU_KVCHUNK (key tiles) override them, for tests and
 * measurements: the result is the same bits whatever they are. */
static void fwd_groups(CpuAttn *a) {
  const FlexParams *p = a->p;
  int64_t tile_bytes = a->bf16 ? (int64_t)a->bn * (((a->E + 1) / 2) * 4 + a->EVp * 2)
                               : (int64_t)a->bn * (a->E + a->EVp) * 4;
  int64_t chunk = (256 << 10) / (tile_bytes ? tile_bytes : 1);
  a->kvchunk = chunk < 1 ? 1 : chunk > a->nkt ? a->nkt : (int)chunk;
  int64_t heads = (int64_t)p->B * p->H, want = 4 * (int64_t)base_pool_size();
  int g = a->nkt * a->bn > 2048 ? 4 : 1;
  while (g > 1 && heads * ((a->nqt + g - 1) / g) < want) g--;
  const BaseConfig *cfg = base_config();
  if (cfg->cpu_qgroup) {
    long v = cfg->cpu_qgroup;
    g = v < 1 ? 1 : v > CPU_FWD_QGROUP_MAX ? CPU_FWD_QGROUP_MAX : (int)v;
  }
  a->qgroup = g;
  if (cfg->cpu_kvchunk) {
    long v = cfg->cpu_kvchunk;
    a->kvchunk = v < 1 ? 1 : v > a->nkt ? a->nkt : (int)v;
  }
  if (a->kvchunk < 1) a->kvchunk = 1;
}

static flex_status run_fwd(RtRun *r, const FlexParams *p) {
  CpuAttn a;
  attn_init(r, p, &a, false);
  fwd_groups(&a);
  a.scratch_per = cpu_attn_fwd_scratch(&a);
  a.scratch = base_alloc(sizeof(float) * a.scratch_per * (size_t)base_pool_size());
  cpu_attn_fwd(&a);
  r->tiles = a.tiles;
  attn_free(&a);
  return FLEX_OK;
}

/* Buffer-gradient accumulators: one set per worker, summed into
 * p->buf_grad. A deterministic backward's are exact ones
 * (kernels/exact.cuh), one set per worker too (plain adds, no atomics),
 * whose integer words are then summed into the call's p->grad_exact: an
 * integer sum is the same whichever worker added what, so the result does
 * not depend on the schedule, and GRAD_EXACT rounds it once. */
static flex_status run_bwd(RtRun *r, const FlexParams *p) {
  CpuAttn a;
  attn_init(r, p, &a, true);
  int nw = base_pool_size();
  a.deterministic = r->opts.deterministic;
  a.scratch_per = cpu_attn_bwd_scratch(&a);
  a.scratch = base_alloc(sizeof(float) * a.scratch_per * (size_t)nw);
  a.acc = base_alloc(sizeof(float *) * (size_t)nw * FLEX_MAX_BUFFERS);
  int64_t numel[FLEX_MAX_BUFFERS] = {0};
  for (int s = 0; s < r->c->mod->nbuffers && s < FLEX_MAX_BUFFERS; s++) {
    if (!p->buf_grad[s]) continue;
    numel[s] = 1;
    for (int d = 0; d < r->c->bufs[s].ndims; d++) numel[s] *= r->c->bufs[s].shape[d];
    size_t bytes = p->grad_exact[s] ? sizeof(int64_t) * FLEX_EXACT_WORDS : sizeof(float);
    for (int w = 0; w < nw; w++)
      a.acc[(size_t)w * FLEX_MAX_BUFFERS + s] = base_alloc(bytes * (size_t)numel[s] + 4);
  }
  cpu_attn_bwd(&a);
  for (int s = 0; s < FLEX_MAX_BUFFERS; s++)
    for (int w = 0; w < nw && numel[s]; w++) {
      void *src = a.acc[(size_t)w * FLEX_MAX_BUFFERS + s];
      if (p->grad_exact[s]) {
        const int64_t *e = src;
        for (int64_t x = 0; x < numel[s] * FLEX_EXACT_WORDS; x++)
          p->grad_exact[s][x] = x % FLEX_EXACT_WORDS == FLEX_EXACT_LIMBS
                                    ? p->grad_exact[s][x] | e[x]
                                    : p->grad_exact[s][x] + e[x];
      } else {
        const float *f = src;
        for (int64_t x = 0; x < numel[s]; x++) p->buf_grad[s][x] += f[x];
      }
      base_free(src);
    }
  base_free(a.acc);
  r->tiles = a.tiles;
  attn_free(&a);
  return FLEX_OK;
}

static flex_status cpu_launch(RtRun *r, RtEntry e, const CgLaunch *g, const void *params) {
  (void)g;
  const FlexParams *p = params;
  if (!r->module) return rt_err(FLEX_ERR_INVALID, "cpu backend: launch before prepare");
  CpuAttn a;
  switch (e) {
  case RT_ENTRY_MASK_BUILD: return build_mask(r, p);
  case RT_ENTRY_MASK_LISTS: mask_lists(p); return FLEX_OK;
  case RT_ENTRY_FWD: return run_fwd(r, p);
  case RT_ENTRY_GRAD_EXACT: { /* as flex_grad_exact: the exact sum plus what the gradient holds */
    float *gr = p->buf_grad[p->exact_slot];
    const int64_t *acc = p->grad_exact[p->exact_slot];
    for (int64_t i = 0; i < p->exact_len; i++)
      gr[i] = flex_exact_value(acc + i * FLEX_EXACT_WORDS, gr[i]);
    return FLEX_OK;
  }
  case RT_ENTRY_BWD: return run_bwd(r, p);
  case RT_ENTRY_BWD_PRE:
  case RT_ENTRY_BWD_DQ:
    memset(&a, 0, sizeof a);
    a.p = p, a.mod = r->module, a.dtype = r->opts.dtype, a.E = p->E, a.EV = p->EV;
    a.deterministic = r->opts.deterministic;
    a.out_dtype = r->opts.out_f32 ? CG_FP32 : a.dtype;
    a.EVp = round_up(p->EV, 16);
    a.scratch_per = 2 * (size_t)a.EVp + 16;
    a.scratch = base_alloc(sizeof(float) * a.scratch_per * (size_t)base_pool_size());
    if (e == RT_ENTRY_BWD_PRE) cpu_attn_bwd_pre(&a);
    else cpu_attn_bwd_dq(&a);
    base_free(a.scratch);
    return FLEX_OK;
  default: break;
  }
  return rt_err(FLEX_ERR_UNSUPPORTED, "cpu backend: unknown entry %d", (int)e);
}

static flex_status cpu_sync(RtRun *r) {
  (void)r;
  return FLEX_OK;
}

static void cpu_close(RtRun *r) { r->state = NULL; }

const RtBackend rt_cpu_backend = {
    .name = "cpu",
    .host_memory = true,
    .open = cpu_open,
    .prepare = cpu_prepare,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .upload = cpu_copy,
    .download = cpu_copy,
    .launch = cpu_launch,
    .sync = cpu_sync,
    .close = cpu_close,
};
