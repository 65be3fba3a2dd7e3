/* paged.c: a paged key/value cache (DSL.md "Paged key/value cache";
 * docs/paged.md). Forward only.
 *
 * The call is checked as a whole (pools, page table, lengths, q and the
 * outputs, padded or packed), kv_lens is read back to the host, then one
 * ordinary call per sequence runs through rt_call_one, like a packed call
 * (varlen.c): B = 1 views of sequence b's q, out and lse, KV_LEN =
 * kv_lens[b], functions see b + b0. K and V reach the sub-call in one of
 * two ways:
 *   - emu, cuda: a [1, HKV, KV_LEN, E] view whose data is the pool and
 *     whose batch stride is the page stride, with RtSeq.pages = row b of
 *     the page table: the kernels are generated paged (CgOptions.paged) and
 *     load every key row through the table (kernels/tile.cuh);
 *   - reference, cpu: compact host copies of the sequence's keys and values,
 *     gathered here through the table (the page indices are always checked,
 *     since the gather reads host memory by them).
 */
#include <stdio.h>
#include <string.h>

#include "kernels/params.cuh"
#include "runtime/rt.h"
#include "runtime/tensor.h"

enum { PAGE_MIN = 16, PAGE_MAX = 256 };

/* A tensor of rank `ndim` and shape `want` (-1: any) on q's device (q
 * NULL: any); `layout` names the dims. */
static flex_status shaped(const char *name, const DLTensor *t, const DLTensor *q, int ndim,
                          const int64_t *want, const char *layout) {
  flex_status st = rt_check_layout(name, t, ndim, want, layout, "a paged call");
  return st || !q ? st : rt_check_device(name, t, q);
}

/* An int32 index tensor of shape `want`, unit last stride, on q's device. */
static flex_status index_tensor(const char *name, const DLTensor *t, const DLTensor *q, int ndim,
                                const int64_t *want, const char *layout) {
  flex_status st = shaped(name, t, NULL, ndim, want, layout);
  if (st) return st;
  if (t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1)
    return rt_err(FLEX_ERR_INVALID, "%s: expected int32, got %s", name, rt_dtype_name(t->dtype));
  if ((st = rt_check_device(name, t, q))) return st;
  if (t->shape[ndim - 1] > 1 && rt_stride_of(t, ndim - 1) != 1)
    return rt_err(FLEX_ERR_INVALID, "%s: the last dimension must have unit stride, got stride %lld",
                  name, (long long)rt_stride_of(t, ndim - 1));
  if (!t->data && rt_numel(t) > 0) return rt_err(FLEX_ERR_INVALID, "%s: data is NULL", name);
  return FLEX_OK;
}

/* What the whole-call checks find. */
typedef struct Paged {
  int64_t B, H, QL, E, NP, PS, HKV, EV, MP;
  bool packed;      /* q packed by cu_seqlens_q */
  int32_t *cq;      /* packed: the B + 1 query offsets (host) */
  int32_t *lens;    /* kv_lens (host) */
  int32_t *table;   /* the page table (host, compact [B, MAX_PAGES]); NULL when not read */
  bool gather;      /* reference, cpu: K and V gathered on the host */
} Paged;

/* A rank-1 int32 tensor read back to the host as B values. */
static flex_status read_ints(const DLTensor *t, void *stream, const char *name, int32_t **out) {
  DLTensor *h = NULL;
  flex_status st = rt_tensor_to_host(&h, t, stream, name);
  if (st) return st;
  int64_t n = rt_numel(t);
  int32_t *v = base_alloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) memcpy(&v[i], rt_data_of(h) + rt_offset_of(h, i) * 4, 4);
  flex_tensor_free(h);
  *out = v;
  return FLEX_OK;
}

static flex_status check_q(const flex_args *a, Paged *g) {
  const DLTensor *q = a->q;
  if (!q) return rt_err(FLEX_ERR_INVALID, "q: the tensor is missing");
  g->packed = a->cu_seqlens_q != NULL;
  flex_status st;
  if (g->packed) {
    if ((st = shaped("q", q, NULL, 3, NULL, "(TOTAL_Q, H, E)"))) return st;
    g->H = q->shape[1], g->E = q->shape[2];
    const DLTensor *c = a->cu_seqlens_q;
    int64_t any[1] = {-1};
    if ((st = index_tensor("cu_seqlens_q", c, q, 1, any, "[B + 1]"))) return st;
    if (c->shape[0] < 1)
      return rt_err(FLEX_ERR_INVALID, "cu_seqlens_q: expected B + 1 >= 1 offsets, got 0");
    g->B = c->shape[0] - 1;
    if ((st = read_ints(c, a->stream, "cu_seqlens_q", &g->cq))) return st;
    if (g->cq[0] != 0)
      return rt_err(FLEX_ERR_INVALID, "cu_seqlens_q: expected offset 0 first, got %d", g->cq[0]);
    for (int64_t i = 1; i <= g->B; i++)
      if (g->cq[i] < g->cq[i - 1])
        return rt_err(FLEX_ERR_INVALID, "cu_seqlens_q: expected non-decreasing offsets, got %d after "
                      "%d at index %lld", g->cq[i], g->cq[i - 1], (long long)i);
    if (g->cq[g->B] != q->shape[0])
      return rt_err(FLEX_ERR_INVALID, "cu_seqlens_q: expected the last offset to be TOTAL_Q = %lld "
                    "(the packed rows of q), got %d", (long long)q->shape[0], g->cq[g->B]);
  } else {
    if ((st = shaped("q", q, NULL, 4, NULL, "[B, H, Q_LEN, E]"))) return st;
    g->B = q->shape[0], g->H = q->shape[1], g->QL = q->shape[2], g->E = q->shape[3];
  }
  return FLEX_OK;
}

static flex_status check_pools(const flex_args *a, Paged *g) {
  const DLTensor *q = a->q;
  flex_status st;
  if ((st = shaped("k", a->k, q, 4, NULL, "(NUM_PAGES, PAGE_SIZE, HKV, E)"))) return st;
  g->NP = a->k->shape[0], g->PS = a->k->shape[1], g->HKV = a->k->shape[2];
  if (a->k->shape[3] != g->E)
    return rt_err(FLEX_ERR_INVALID, "k: head dim E=%lld does not match q's E=%lld",
                  (long long)a->k->shape[3], (long long)g->E);
  int64_t vw[4] = {g->NP, g->PS, g->HKV, -1};
  if ((st = shaped("v", a->v, q, 4, vw, "(NUM_PAGES, PAGE_SIZE, HKV, EV) like k's pool"))) return st;
  g->EV = a->v->shape[3];
  if (g->PS < PAGE_MIN || g->PS > PAGE_MAX)
    return rt_err(FLEX_ERR_INVALID, "k: PAGE_SIZE (dimension 1 of the pool) must be %d..%d, got %lld",
                  PAGE_MIN, PAGE_MAX, (long long)g->PS);
  if (g->H < 1 || g->HKV < 1 || g->H % g->HKV)
    return rt_err(FLEX_ERR_INVALID, "H=%lld query heads is not a positive multiple of HKV=%lld "
                  "key/value heads", (long long)g->H, (long long)g->HKV);
  if (!rt_dtype_same(a->k->dtype, q->dtype) || !rt_dtype_same(a->v->dtype, q->dtype))
    return rt_err(FLEX_ERR_INVALID, "q, k and v must share a dtype, got %s, %s and %s",
                  rt_dtype_name(q->dtype), rt_dtype_name(a->k->dtype), rt_dtype_name(a->v->dtype));
  for (int i = 0; i < 2; i++) {
    const DLTensor *t = i ? a->v : a->k;
    if (t->shape[3] > 1 && rt_stride_of(t, 3) != 1)
      return rt_err(FLEX_ERR_INVALID, "%s: the last dimension must have unit stride, got stride %lld",
                    i ? "v" : "k", (long long)rt_stride_of(t, 3));
    for (int d = 0; d < 3; d++)
      if (rt_stride_of(t, d) < 0)
        return rt_err(FLEX_ERR_INVALID, "%s: dimension %d has a negative stride", i ? "v" : "k", d);
  }
  if (g->gather && (!rt_on_host(a->k) || !rt_on_host(a->v)))
    return rt_err(FLEX_ERR_INVALID, "%s: the %s backend needs the pool in host memory (kDLCPU)",
                  rt_on_host(a->k) ? "v" : "k", flex_backend_name(a->backend));
  bool f64 = q->dtype.code == kDLFloat && q->dtype.bits == 64;
  if (f64 && !g->gather)
    return rt_err(FLEX_ERR_UNSUPPORTED, "the %s backend does not run a paged call in float64 (the "
                  "pools would be staged whole); use float32, or the reference backend",
                  flex_backend_name(a->backend));
  return FLEX_OK;
}

static flex_status check_table(const flex_args *a, Paged *g) {
  if (!a->page_table || !a->kv_lens)
    return rt_err(FLEX_ERR_INVALID, "%s: missing: a paged call needs both page_table and kv_lens",
                  a->page_table ? "kv_lens" : "page_table");
  int64_t tw[2] = {g->B, -1}, lw[1] = {g->B};
  flex_status st = index_tensor("page_table", a->page_table, a->q, 2, tw, "[B, MAX_PAGES]");
  if (!st) st = index_tensor("kv_lens", a->kv_lens, a->q, 1, lw, "[B]");
  if (st) return st;
  g->MP = a->page_table->shape[1];
  if ((st = read_ints(a->kv_lens, a->stream, "kv_lens", &g->lens))) return st;
  for (int64_t b = 0; b < g->B; b++)
    if (g->lens[b] < 0 || g->lens[b] > g->MP * g->PS)
      return rt_err(FLEX_ERR_INVALID, "kv_lens: sequence %lld has %d keys, expected 0..%lld "
                    "(MAX_PAGES=%lld pages of PAGE_SIZE=%lld)", (long long)b, g->lens[b],
                    (long long)(g->MP * g->PS), (long long)g->MP, (long long)g->PS);
  if (!a->check_bounds && !g->gather) return FLEX_OK;
  /* A checked run, or a host gather: every page a sequence reads must be in the pool. */
  if ((st = read_ints(a->page_table, a->stream, "page_table", &g->table))) return st;
  for (int64_t b = 0; b < g->B; b++)
    for (int64_t j = 0; j * g->PS < g->lens[b]; j++) {
      int32_t pg = g->table[b * g->MP + j];
      if (pg < 0 || pg >= g->NP)
        return rt_err(a->check_bounds ? FLEX_ERR_RUNTIME : FLEX_ERR_INVALID,
                      "page_table: sequence %lld, logical page %lld (keys %lld..%lld) holds page "
                      "index %d, outside the pool's NUM_PAGES=%lld pages", (long long)b, (long long)j,
                      (long long)(j * g->PS), (long long)((j + 1) * g->PS < g->lens[b] ? (j + 1) * g->PS : g->lens[b]) - 1, pg,
                      (long long)g->NP);
    }
  return FLEX_OK;
}

/* out and lse, padded or packed; buffers shaped by a per-sequence length. */
static flex_status check_rest(const flex_kernel *k, const flex_args *a, const Paged *g) {
  if (a->block_mask)
    return rt_err(FLEX_ERR_INVALID, "block_mask: a caller's BlockMask is not accepted in a paged "
                  "call; the kernel's mask is classified per sequence");
  if (a->cu_seqlens_kv)
    return rt_err(FLEX_ERR_INVALID, "cu_seqlens_kv: not accepted in a paged call (the keys' "
                  "lengths are kv_lens)");
  flex_status st;
  if (g->packed) {
    int64_t TQ = a->q->shape[0], o[3] = {TQ, g->H, g->EV}, l[2] = {g->H, TQ};
    if ((st = shaped("out", a->out, a->q, 3, o, "(TOTAL_Q, H, EV)")) ||
        (st = shaped("lse", a->lse, a->q, 2, l, "(H, TOTAL_Q)")))
      return st;
  } else {
    int64_t o[4] = {g->B, g->H, g->QL, g->EV}, l[3] = {g->B, g->H, g->QL};
    if ((st = shaped("out", a->out, a->q, 4, o, "[B, H, Q_LEN, EV]")) ||
        (st = shaped("lse", a->lse, a->q, 3, l, "[B, H, Q_LEN]")))
      return st;
  }
  const IrModule *m = k->mod;
  for (int i = 0; i < a->nbuffers && a->buffers; i++)
    for (int j = 0; a->buffers[i].name && j < m->nbuffers; j++) {
      const IrBuffer *ib = &m->buffers[j];
      if (strcmp(ib->id, a->buffers[i].name)) continue;
      for (int d = 0; d < ib->ndims; d++) {
        int s = ib->dims[d].fixed < 0 ? ib->dims[d].size : -1;
        if (s == SZ_KV_LEN || (g->packed && s == SZ_Q_LEN))
          return rt_err(FLEX_ERR_INVALID, "buffer '%s': dimension %d is declared %s, which differs "
                        "per sequence in a paged call: use %s (and index it with %s)", ib->id, d,
                        s == SZ_Q_LEN ? "Q_LEN" : "KV_LEN", s == SZ_Q_LEN ? "TOTAL_Q" : "TOTAL_KV",
                        s == SZ_Q_LEN ? "Q_START + q" : "KV_START + kv");
      }
    }
  return FLEX_OK;
}

/* Batch b of a padded tensor as a batch-1 view. */
static void view_batch(DLTensor *out, int64_t *shape, int64_t *strides, const DLTensor *t, int64_t b) {
  *out = *t;
  for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d], strides[d] = rt_stride_of(t, d);
  int64_t es = (t->dtype.bits * t->dtype.lanes + 7) / 8;
  if (shape[0] > 0) out->byte_offset = t->byte_offset + (uint64_t)(b * strides[0] * es);
  shape[0] = 1, strides[0] = 0;
  out->shape = shape;
  out->strides = strides;
}

/* The pool as the [1, HKV, len, dim] view the paged kernels read: data the
 * pool, batch stride the page stride, rows within a page. */
static void view_pool(DLTensor *out, int64_t shape[4], int64_t strides[4], const DLTensor *t,
                      int64_t len) {
  *out = *t;
  shape[0] = 1, shape[1] = t->shape[2], shape[2] = len, shape[3] = t->shape[3];
  strides[0] = rt_stride_of(t, 0), strides[1] = rt_stride_of(t, 2), strides[2] = rt_stride_of(t, 1);
  strides[3] = 1;
  out->shape = shape;
  out->strides = strides;
}

/* Sequence b's keys (or values) gathered from a host pool into a compact
 * host tensor [1, HKV, len, dim]. */
static flex_status gather(DLTensor **out, const DLTensor *pool, const Paged *g, int64_t b) {
  int64_t len = g->lens[b], HKV = pool->shape[2], dim = pool->shape[3];
  int64_t shape[4] = {1, HKV, len, dim};
  flex_status st = flex_tensor_alloc(out, FLEX_BACKEND_REFERENCE, pool->dtype, 4, shape, NULL);
  if (st) return st;
  size_t es = (size_t)rt_dtype_size(pool->dtype);
  const char *src = rt_data_of(pool);
  char *dst = (*out)->data;
  int64_t sp = rt_stride_of(pool, 0), sr = rt_stride_of(pool, 1), sh = rt_stride_of(pool, 2);
  for (int64_t h = 0; h < HKV; h++)
    for (int64_t kv = 0; kv < len; kv++) {
      int64_t page = g->table[b * g->MP + kv / g->PS];
      const char *row = src + (size_t)(page * sp + (kv % g->PS) * sr + h * sh) * es;
      memcpy(dst + (size_t)((h * len + kv) * dim) * es, row, (size_t)dim * es);
    }
  return FLEX_OK;
}

/* The views of one sequence. */
typedef struct SeqViews {
  DLTensor q, k, v, out, lse;
  int64_t shape[5][4], strides[5][4];
} SeqViews;

/* Validate one sequence's call without running it. */
static flex_status validate_only(const flex_kernel *k, const flex_args *s, const RtSeq *seq) {
  Arena arena = {0};
  RtCall c;
  flex_status st = rt_validate(&c, &arena, k, s, false, seq);
  arena_free(&arena);
  return st;
}

static flex_status run_seqs(const flex_kernel *k, const flex_args *a, const Paged *g) {
  int64_t total_kv = 0;
  for (int64_t b = 0; b < g->B; b++) total_kv += g->lens[b];
  if (total_kv > INT32_MAX) return rt_err(FLEX_ERR_INVALID, "kv_lens: more than 2^31 keys in all");
  int64_t kv_start = 0;
  const DLTensor *pt = a->page_table;
  flex_status st = FLEX_OK;
  bool ran = false;
  for (int64_t b = 0; b < g->B && !st; b++) {
    int64_t q0 = g->packed ? g->cq[b] : 0, nq = g->packed ? g->cq[b + 1] - g->cq[b] : g->QL;
    /* No queries: nothing to write; but the last sequence of a call that
     * ran none is still validated (arch, params, buffers, dtypes...). */
    if (nq == 0 && (ran || b + 1 < g->B)) {
      kv_start += g->lens[b];
      continue;
    }
    ran = true;
    SeqViews w;
    memset(&w, 0, sizeof w);
    flex_args s = *a;
    s.cu_seqlens_q = s.cu_seqlens_kv = s.page_table = s.kv_lens = NULL;
    if (g->packed) {
      rt_view_rows(&w.q, w.shape[0], w.strides[0], a->q, q0, nq);
      rt_view_rows(&w.out, w.shape[3], w.strides[3], a->out, q0, nq);
      rt_view_lse(&w.lse, w.shape[4], w.strides[4], a->lse, q0, nq);
    } else {
      view_batch(&w.q, w.shape[0], w.strides[0], a->q, b);
      view_batch(&w.out, w.shape[3], w.strides[3], a->out, b);
      view_batch(&w.lse, w.shape[4], w.strides[4], a->lse, b);
    }
    DLTensor *gk = NULL, *gv = NULL;
    RtSeq seq = {(int)b, (int)g->B, (int)(g->packed ? a->q->shape[0] : g->QL), (int)total_kv,
                 (int)q0, (int)kv_start, b > 0, NULL, 0, 0, NULL, NULL};
    if (g->gather) {
      st = gather(&gk, a->k, g, b);
      if (!st) st = gather(&gv, a->v, g, b);
      if (!st) s.k = gk, s.v = gv;
    } else {
      view_pool(&w.k, w.shape[1], w.strides[1], a->k, g->lens[b]);
      view_pool(&w.v, w.shape[2], w.strides[2], a->v, g->lens[b]);
      s.k = &w.k, s.v = &w.v;
      seq.pages = (const int32_t *)(rt_data_of(pt) + b * rt_stride_of(pt, 0) * 4);
      seq.page_size = (int)g->PS, seq.max_pages = (int)g->MP;
      seq.k_pool = a->k, seq.v_pool = a->v;
    }
    s.q = &w.q, s.out = &w.out, s.lse = &w.lse;
    if (!st) st = nq ? rt_call_one(k, &s, false, &seq) : validate_only(k, &s, &seq);
    if (st) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", flex_last_error());
      rt_err(st, "sequence %lld (%lld queries, %d keys): %s", (long long)b, (long long)nq, g->lens[b],
             msg);
    }
    flex_tensor_free(gk);
    flex_tensor_free(gv);
    kv_start += g->lens[b];
  }
  return st;
}

flex_status rt_paged_call(const flex_kernel *k, const flex_args *a, bool backward) {
  if (backward)
    return rt_err(FLEX_ERR_UNSUPPORTED, "page_table: a paged key/value cache is forward only; "
                  "run the backward on contiguous k and v (without page_table and kv_lens)");
  Paged g;
  memset(&g, 0, sizeof g);
  g.gather = a->backend == FLEX_BACKEND_REFERENCE || a->backend == FLEX_BACKEND_CPU;
  flex_status st = check_q(a, &g);
  if (!st) st = check_pools(a, &g);
  if (!st) st = check_table(a, &g);
  if (!st) st = check_rest(k, a, &g);
  if (!st && g.B > INT32_MAX) st = rt_err(FLEX_ERR_INVALID, "page_table: too many sequences");
  if (!st) st = run_seqs(k, a, &g);
  base_free(g.cq);
  base_free(g.lens);
  base_free(g.table);
  return st;
}
