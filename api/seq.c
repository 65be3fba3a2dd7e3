/* seq.c: calls of several sequences, each attended on its own: packed
 * variable-length batches (docs/language.md "Packed variable-length batches";
 * docs/varlen.md) and paged key/value caches (docs/language.md "Paged key/value
 * cache"; docs/paged.md, forward only).
 *
 * The call is checked as a whole in the words of its layout (offsets, the
 * packed tensors, pools, page table, lengths, outputs), what the host must
 * know is read back once (cu_seqlens, kv_lens, the page table where it is
 * read), then every sequence runs as one ordinary call, rt_call_one, over
 * B = 1 views: sequence b's Q is [1, H, len_b, E] from row cu_seqlens_q[b]
 * of the packed tensor, or batch b of a padded one. RtSeq binds b0 (the
 * functions see b + b0), B (the number of sequences), TOTAL_Q, TOTAL_KV,
 * Q_START and KV_START. So masks are classified per sequence, no tile spans
 * two sequences, and the work is the sum over sequences of their tiles.
 *
 * K and V of a sequence are rows of packed tensors (cu_seqlens_kv), or
 * pages of a pool:
 *   - emu, cuda: a [1, HKV, KV_LEN, E] view whose data is the pool and whose
 *     batch stride is the page stride, with RtSeq.pages = row b of the page
 *     table: the kernels are generated paged (CgOptions.paged) and load
 *     every key row through the table (kernels/tile.cuh);
 *   - reference, cpu: compact host copies of the sequence's keys and values
 *     gathered here through the table (the page indices are then always
 *     checked, since the gather reads host memory by them).
 */
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "kernels/params.cuh"
#include "runtime/tensor.h"

enum { PAGE_MIN = 16, PAGE_MAX = 256 };

/* What the whole-call checks find. */
typedef struct Seqs {
  int64_t B;        /* sequences */
  int64_t H, E;     /* query heads, head dim */
  int64_t HKV, EV;  /* key/value heads, value head dim */
  int64_t QL;       /* padded q: rows per sequence */
  int32_t *cq;      /* packed q: the B + 1 query offsets (host); NULL: padded */
  int32_t *ck;      /* packed k and v: the B + 1 key offsets (host); NULL: paged */
  /* paged */
  int64_t NP, PS, MP; /* pages in the pool, keys per page, pages per sequence */
  int32_t *lens;    /* kv_lens (host) */
  int32_t *table;   /* the page table (host, compact [B, MAX_PAGES]); NULL when not read */
  bool gather;      /* reference, cpu: K and V gathered on the host */
} Seqs;

/* "a packed (cu_seqlens) call" or "a paged call", for messages. */
static const char *kind(const Seqs *s) { return s->ck ? "a packed (cu_seqlens) call" : "a paged call"; }

/* ---- whole-call checks ----------------------------------------------------------- */

/* A tensor of rank `ndim` and shape `want` (-1: any), its last dimension of
 * unit stride, without overlap if `written`, on q's device (q NULL: any).
 * `layout` names the dims ("(TOTAL_Q, H, E)"). */
static flex_status laid_out(const char *name, const DLTensor *t, const DLTensor *q, int ndim,
                            const int64_t *want, const char *layout, bool written, const char *call) {
  flex_status st = rt_check_layout(name, t, ndim, want, layout, call);
  if (st) return st;
  /* The sub-calls check strides on each sequence's view, where a sequence
   * of one row hides its row stride: a negative stride, or an output's
   * stride 0 across sequences, only shows on the whole tensor. */
  for (int d = 0; t->strides && d < ndim; d++)
    if (t->shape[d] > 1 && t->strides[d] < 0)
      return rt_err(FLEX_ERR_INVALID, "%s: dimension %d has stride %lld (expected a non-negative "
                    "stride)", name, d, (long long)t->strides[d]);
  for (int d = 0; d < ndim; d++) written = written && t->shape[d] > 0; /* empty: no overlap */
  for (int d = 0; written && t->strides && d < ndim; d++)
    if (t->shape[d] > 1 && t->strides[d] == 0)
      return rt_err(FLEX_ERR_INVALID, "%s: dimension %d has stride 0, so elements of this output "
                    "overlap (expected a positive stride)", name, d);
  /* The views keep every stride but the last, which they set to 1. */
  if (t->strides && t->shape[ndim - 1] > 1 && t->strides[ndim - 1] != 1)
    return rt_err(FLEX_ERR_INVALID, "%s: the last dimension must have unit stride, got stride %lld",
                  name, (long long)t->strides[ndim - 1]);
  if (q && (st = rt_check_device(name, t, q))) return st;
  return FLEX_OK;
}

/* An int32 tensor of rank `ndim` and shape `want` on q's device, read back
 * to the host as its elements in order (*out, base_free). */
static flex_status read_ints(const char *name, const DLTensor *t, const DLTensor *q, int ndim,
                             const int64_t *want, const char *layout, const char *call,
                             void *stream, int32_t **out) {
  flex_status st = rt_check_layout(name, t, ndim, want, layout, call);
  if (st) return st;
  if (t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1)
    return rt_err(FLEX_ERR_INVALID, "%s: expected int32, got %s", name, rt_dtype_name(t->dtype));
  if ((st = rt_check_device(name, t, q))) return st;
  if (!t->data && rt_numel(t) > 0) return rt_err(FLEX_ERR_INVALID, "%s: data is NULL", name);
  DLTensor *h = NULL;
  if ((st = rt_tensor_to_host(&h, t, stream, name))) return st;
  int64_t n = rt_numel(t);
  int32_t *v = base_alloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  memcpy(v, h->data, sizeof(int32_t) * (size_t)n);
  flex_tensor_free(h);
  *out = v;
  return FLEX_OK;
}

/* One offsets tensor: rank 1, int32, B + 1 long (want_len; -1: any), on
 * q's device, read back and checked: from 0, non-decreasing, ending at
 * `total`. */
static flex_status offsets(const char *name, const DLTensor *t, const DLTensor *q, int64_t want_len,
                           int64_t total, const char *total_name, const char *call, void *stream,
                           int32_t **out, int64_t *len) {
  if (t->ndim != 1 || !t->shape)
    return rt_err(FLEX_ERR_INVALID, "%s: expected a rank-1 tensor of B + 1 offsets, got rank %d", name,
                  (int)t->ndim);
  if (t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1)
    return rt_err(FLEX_ERR_INVALID, "%s: expected int32, got %s", name, rt_dtype_name(t->dtype));
  if (t->shape[0] < 1)
    return rt_err(FLEX_ERR_INVALID, "%s: expected B + 1 >= 1 offsets, got %lld", name,
                  (long long)t->shape[0]);
  if (want_len >= 0 && t->shape[0] != want_len)
    return rt_err(FLEX_ERR_INVALID, "%s: expected B + 1 = %lld offsets (as cu_seqlens_q has), got %lld",
                  name, (long long)want_len, (long long)t->shape[0]);
  if (!rt_same_device(t, q)) {
    char a[64], b[64];
    return rt_err(FLEX_ERR_INVALID, "%s: expected the call's device %s (q's), got %s", name,
                  rt_device_text(a, sizeof a, q), rt_device_text(b, sizeof b, t));
  }
  int64_t any[1] = {-1};
  int32_t *v = NULL;
  flex_status st = read_ints(name, t, q, 1, any, "[B + 1]", call, stream, &v);
  if (st) return st;
  int64_t n = t->shape[0];
  if (v[0] != 0) st = rt_err(FLEX_ERR_INVALID, "%s: expected offset 0 first, got %d", name, v[0]);
  for (int64_t i = 1; !st && i < n; i++)
    if (v[i] < v[i - 1])
      st = rt_err(FLEX_ERR_INVALID, "%s: expected non-decreasing offsets, got %d after %d at index %lld "
                  "(sequence %lld would have a negative length)", name, v[i], v[i - 1],
                  (long long)i, (long long)i - 1);
  if (!st && v[n - 1] != total)
    st = rt_err(FLEX_ERR_INVALID, "%s: expected the last offset to be %s = %lld (the packed rows of "
                "%s), got %d", name, total_name, (long long)total,
                total_name[6] == 'Q' ? "q" : "k and v", v[n - 1]);
  if (!st && n - 1 > INT32_MAX) st = rt_err(FLEX_ERR_INVALID, "%s: too many sequences", name);
  if (st) {
    base_free(v);
    return st;
  }
  *out = v;
  *len = n;
  return FLEX_OK;
}

/* Q_LEN and KV_LEN may differ per sequence: no buffer may be shaped by a
 * length that does (`q_varies`: Q_LEN too). */
static flex_status check_buffers(const flex_kernel *k, const flex_args *a, const Seqs *s,
                                 bool q_varies) {
  const IrModule *m = k->mod;
  for (int i = 0; i < a->nbuffers && a->buffers; i++)
    for (int j = 0; a->buffers[i].name && j < m->nbuffers; j++) {
      const IrBuffer *ib = &m->buffers[j];
      if (strcmp(ib->id, a->buffers[i].name)) continue;
      for (int d = 0; d < ib->ndims; d++) {
        int z = ib->dims[d].fixed < 0 ? ib->dims[d].size : -1;
        if (z == SZ_KV_LEN || (q_varies && z == SZ_Q_LEN))
          return rt_err(FLEX_ERR_INVALID, "buffer '%s': dimension %d is declared %s, which differs "
                        "per sequence in %s: use %s (and index it with %s + %s)", ib->id, d,
                        z == SZ_Q_LEN ? "Q_LEN" : "KV_LEN", kind(s),
                        z == SZ_Q_LEN ? "TOTAL_Q" : "TOTAL_KV", z == SZ_Q_LEN ? "Q_START" : "KV_START",
                        z == SZ_Q_LEN ? "q" : "kv");
      }
    }
  return FLEX_OK;
}

/* A packed call: q, k, v and the outputs packed, both offsets. */
static flex_status check_packed(const flex_kernel *k, const flex_args *a, bool backward, Seqs *s) {
  static const char call[] = "a packed (cu_seqlens) call";
  if (!a->cu_seqlens_q || !a->cu_seqlens_kv)
    return rt_err(FLEX_ERR_INVALID, "%s: missing: a packed call needs both cu_seqlens_q and "
                  "cu_seqlens_kv (one sequence of keys shared by every query sequence is not "
                  "supported: pack the keys once per sequence)",
                  a->cu_seqlens_q ? "cu_seqlens_kv" : "cu_seqlens_q");
  if (a->block_mask)
    return rt_err(FLEX_ERR_INVALID, "block_mask: a caller's BlockMask is not accepted in a packed "
                  "(cu_seqlens) call; the kernel's mask is classified per sequence");
  flex_status st;
  if ((st = laid_out("q", a->q, NULL, 3, NULL, "(TOTAL_Q, H, E)", false, call))) return st;
  const DLTensor *q = a->q;
  if ((st = laid_out("k", a->k, q, 3, NULL, "(TOTAL_KV, HKV, E)", false, call))) return st;
  if ((st = laid_out("v", a->v, q, 3, NULL, "(TOTAL_KV, HKV, EV)", false, call))) return st;
  /* TOTAL_Q, TOTAL_KV and the offsets are int32 sizes of the DSL. */
  if (q->shape[0] > INT32_MAX || a->k->shape[0] > INT32_MAX)
    return rt_err(FLEX_ERR_INVALID, "%s: %lld packed rows (expected at most %d)",
                  q->shape[0] > INT32_MAX ? "q" : "k",
                  (long long)(q->shape[0] > INT32_MAX ? q->shape[0] : a->k->shape[0]), INT32_MAX);
  if (a->k->shape[2] != q->shape[2])
    return rt_err(FLEX_ERR_INVALID, "k: head dim E=%lld does not match q's E=%lld",
                  (long long)a->k->shape[2], (long long)q->shape[2]);
  if (a->v->shape[0] != a->k->shape[0])
    return rt_err(FLEX_ERR_INVALID, "v: TOTAL_KV=%lld packed rows, but k has %lld",
                  (long long)a->v->shape[0], (long long)a->k->shape[0]);
  if (a->v->shape[1] != a->k->shape[1])
    return rt_err(FLEX_ERR_INVALID, "v: %lld key/value heads, but k has %lld",
                  (long long)a->v->shape[1], (long long)a->k->shape[1]);
  if (q->shape[1] < 1 || a->k->shape[1] < 1 || q->shape[1] % a->k->shape[1])
    return rt_err(FLEX_ERR_INVALID, "H=%lld query heads is not a positive multiple of HKV=%lld "
                  "key/value heads", (long long)q->shape[1], (long long)a->k->shape[1]);
  if (!rt_dtype_same(a->k->dtype, q->dtype) || !rt_dtype_same(a->v->dtype, q->dtype))
    return rt_err(FLEX_ERR_INVALID, "q, k and v must share a dtype, got %s, %s and %s",
                  rt_dtype_name(q->dtype), rt_dtype_name(a->k->dtype), rt_dtype_name(a->v->dtype));
  int64_t TQ = q->shape[0], H = q->shape[1], E = q->shape[2], TK = a->k->shape[0];
  int64_t HKV = a->k->shape[1], EV = a->v->shape[2];
  int64_t o[3] = {TQ, H, EV}, l[2] = {H, TQ}, qs[3] = {TQ, H, E}, ks[3] = {TK, HKV, E};
  int64_t vs[3] = {TK, HKV, EV};
  if ((st = laid_out("out", a->out, q, 3, o, "(TOTAL_Q, H, EV)", true, call)) ||
      (st = laid_out("lse", a->lse, q, 2, l, "(H, TOTAL_Q)", true, call)))
    return st;
  if (backward &&
      ((st = laid_out("dout", a->dout, q, 3, o, "(TOTAL_Q, H, EV)", false, call)) ||
       (a->dlse && (st = laid_out("dlse", a->dlse, q, 2, l, "(H, TOTAL_Q)", false, call))) ||
       (st = laid_out("dq", a->dq, q, 3, qs, "(TOTAL_Q, H, E)", true, call)) ||
       (st = laid_out("dk", a->dk, q, 3, ks, "(TOTAL_KV, HKV, E)", true, call)) ||
       (st = laid_out("dv", a->dv, q, 3, vs, "(TOTAL_KV, HKV, EV)", true, call))))
    return st;
  s->H = H, s->E = E, s->HKV = HKV, s->EV = EV;
  int64_t nq = 0, nk = 0;
  st = offsets("cu_seqlens_q", a->cu_seqlens_q, q, -1, TQ, "TOTAL_Q", call, a->stream, &s->cq, &nq);
  if (!st)
    st = offsets("cu_seqlens_kv", a->cu_seqlens_kv, q, nq, TK, "TOTAL_KV", call, a->stream, &s->ck, &nk);
  s->B = nq - 1;
  return st ? st : check_buffers(k, a, s, true);
}

/* A paged call: q padded or packed, the pools, the table and the lengths. */
static flex_status check_paged(const flex_kernel *k, const flex_args *a, bool backward, Seqs *s) {
  static const char call[] = "a paged call";
  if (backward)
    return rt_err(FLEX_ERR_UNSUPPORTED, "page_table: a paged key/value cache is forward only; "
                  "run the backward on contiguous k and v (without page_table and kv_lens)");
  const DLTensor *q = a->q;
  if (!q) return rt_err(FLEX_ERR_INVALID, "q: the tensor is missing");
  flex_status st;
  if (a->cu_seqlens_q) {
    if ((st = rt_check_layout("q", q, 3, NULL, "(TOTAL_Q, H, E)", call))) return st;
    int64_t n = 0;
    st = offsets("cu_seqlens_q", a->cu_seqlens_q, q, -1, q->shape[0], "TOTAL_Q", call, a->stream,
                 &s->cq, &n);
    if (st) return st;
    s->B = n - 1, s->H = q->shape[1], s->E = q->shape[2];
  } else {
    if ((st = rt_check_layout("q", q, 4, NULL, "[B, H, Q_LEN, E]", call))) return st;
    s->B = q->shape[0], s->H = q->shape[1], s->QL = q->shape[2], s->E = q->shape[3];
  }
  /* the pools */
  if ((st = laid_out("k", a->k, q, 4, NULL, "(NUM_PAGES, PAGE_SIZE, HKV, E)", false, call))) return st;
  s->NP = a->k->shape[0], s->PS = a->k->shape[1], s->HKV = a->k->shape[2];
  if (a->k->shape[3] != s->E)
    return rt_err(FLEX_ERR_INVALID, "k: head dim E=%lld does not match q's E=%lld",
                  (long long)a->k->shape[3], (long long)s->E);
  int64_t vw[4] = {s->NP, s->PS, s->HKV, -1};
  if ((st = laid_out("v", a->v, q, 4, vw, "(NUM_PAGES, PAGE_SIZE, HKV, EV) like k's pool", false, call)))
    return st;
  s->EV = a->v->shape[3];
  if (s->PS < PAGE_MIN || s->PS > PAGE_MAX)
    return rt_err(FLEX_ERR_INVALID, "k: PAGE_SIZE (dimension 1 of the pool) must be %d..%d, got %lld",
                  PAGE_MIN, PAGE_MAX, (long long)s->PS);
  if (s->H < 1 || s->HKV < 1 || s->H % s->HKV)
    return rt_err(FLEX_ERR_INVALID, "H=%lld query heads is not a positive multiple of HKV=%lld "
                  "key/value heads", (long long)s->H, (long long)s->HKV);
  if (!rt_dtype_same(a->k->dtype, q->dtype) || !rt_dtype_same(a->v->dtype, q->dtype))
    return rt_err(FLEX_ERR_INVALID, "q, k and v must share a dtype, got %s, %s and %s",
                  rt_dtype_name(q->dtype), rt_dtype_name(a->k->dtype), rt_dtype_name(a->v->dtype));
  if (s->gather && (!rt_on_host(a->k) || !rt_on_host(a->v)))
    return rt_err(FLEX_ERR_INVALID, "%s: the %s backend needs the pool in host memory (kDLCPU)",
                  rt_on_host(a->k) ? "v" : "k", flex_backend_name(a->backend));
  if ((st = rt_check_precision(a->backend, q->dtype))) return st;
  /* the table and the lengths */
  if (!a->page_table || !a->kv_lens)
    return rt_err(FLEX_ERR_INVALID, "%s: missing: a paged call needs both page_table and kv_lens",
                  a->page_table ? "kv_lens" : "page_table");
  int64_t tw[2] = {s->B, -1}, lw[1] = {s->B};
  if ((st = rt_check_layout("page_table", a->page_table, 2, tw, "[B, MAX_PAGES]", call))) return st;
  if (a->page_table->dtype.code != kDLInt || a->page_table->dtype.bits != 32)
    return rt_err(FLEX_ERR_INVALID, "page_table: expected int32, got %s",
                  rt_dtype_name(a->page_table->dtype));
  if ((st = rt_check_device("page_table", a->page_table, q))) return st;
  if (s->B > 0 && a->page_table->shape[1] > 1 && rt_stride_of(a->page_table, 1) != 1)
    return rt_err(FLEX_ERR_INVALID, "page_table: the last dimension must have unit stride, got "
                  "stride %lld", (long long)rt_stride_of(a->page_table, 1));
  s->MP = a->page_table->shape[1];
  if ((st = read_ints("kv_lens", a->kv_lens, q, 1, lw, "[B]", call, a->stream, &s->lens))) return st;
  for (int64_t b = 0; b < s->B; b++)
    if (s->lens[b] < 0 || s->lens[b] > s->MP * s->PS)
      return rt_err(FLEX_ERR_INVALID, "kv_lens: sequence %lld has %d keys, expected 0..%lld "
                    "(MAX_PAGES=%lld pages of PAGE_SIZE=%lld)", (long long)b, s->lens[b],
                    (long long)(s->MP * s->PS), (long long)s->MP, (long long)s->PS);
  if (a->check_bounds || s->gather) {
    /* A checked run, or a host gather: every page a sequence reads must be in the pool. */
    if ((st = read_ints("page_table", a->page_table, q, 2, tw, "[B, MAX_PAGES]", call, a->stream,
                        &s->table)))
      return st;
    for (int64_t b = 0; b < s->B; b++)
      for (int64_t j = 0; j * s->PS < s->lens[b]; j++) {
        int32_t pg = s->table[b * s->MP + j];
        int64_t last = (j + 1) * s->PS < s->lens[b] ? (j + 1) * s->PS : s->lens[b];
        if (pg < 0 || pg >= s->NP)
          return rt_err(a->check_bounds ? FLEX_ERR_RUNTIME : FLEX_ERR_INVALID,
                        "page_table: sequence %lld, logical page %lld (keys %lld..%lld) holds page "
                        "index %d, outside the pool's NUM_PAGES=%lld pages", (long long)b,
                        (long long)j, (long long)(j * s->PS), (long long)last - 1, pg,
                        (long long)s->NP);
      }
  }
  /* the rest */
  if (a->block_mask)
    return rt_err(FLEX_ERR_INVALID, "block_mask: a caller's BlockMask is not accepted in a paged "
                  "call; the kernel's mask is classified per sequence");
  if (a->cu_seqlens_kv)
    return rt_err(FLEX_ERR_INVALID, "cu_seqlens_kv: not accepted in a paged call (the keys' "
                  "lengths are kv_lens)");
  if (s->cq) {
    int64_t TQ = q->shape[0], o[3] = {TQ, s->H, s->EV}, l[2] = {s->H, TQ};
    if ((st = laid_out("out", a->out, q, 3, o, "(TOTAL_Q, H, EV)", true, call)) ||
        (st = laid_out("lse", a->lse, q, 2, l, "(H, TOTAL_Q)", true, call)))
      return st;
  } else {
    int64_t o[4] = {s->B, s->H, s->QL, s->EV}, l[3] = {s->B, s->H, s->QL};
    if ((st = rt_check_layout("out", a->out, 4, o, "[B, H, Q_LEN, EV]", call)) ||
        (st = rt_check_device("out", a->out, q)) ||
        (st = rt_check_layout("lse", a->lse, 3, l, "[B, H, Q_LEN]", call)) ||
        (st = rt_check_device("lse", a->lse, q)))
      return st;
  }
  if (s->B > INT32_MAX) return rt_err(FLEX_ERR_INVALID, "page_table: too many sequences");
  return check_buffers(k, a, s, s->cq != NULL);
}

/* ---- views ------------------------------------------------------------------------ */

void rt_view_rows(DLTensor *out, int64_t shape[4], int64_t strides[4], const DLTensor *t,
                  int64_t start, int64_t len) {
  *out = *t;
  int64_t es = (t->dtype.bits * t->dtype.lanes + 7) / 8;
  int64_t s_row = rt_stride_of(t, 0), s_head = rt_stride_of(t, 1);
  shape[0] = 1, shape[1] = t->shape[1], shape[2] = len, shape[3] = t->shape[2];
  strides[0] = 0, strides[1] = s_head, strides[2] = s_row, strides[3] = 1;
  out->ndim = 4;
  out->shape = shape;
  out->strides = strides;
  if (len > 0) out->byte_offset = t->byte_offset + (uint64_t)(start * s_row * es);
}

void rt_view_lse(DLTensor *out, int64_t shape[3], int64_t strides[3], const DLTensor *t,
                 int64_t start, int64_t len) {
  *out = *t;
  int64_t es = (t->dtype.bits * t->dtype.lanes + 7) / 8;
  int64_t s_h = rt_stride_of(t, 0), s_col = rt_stride_of(t, 1);
  shape[0] = 1, shape[1] = t->shape[0], shape[2] = len;
  strides[0] = 0, strides[1] = s_h, strides[2] = s_col;
  out->ndim = 3;
  out->shape = shape;
  out->strides = strides;
  if (len > 0) out->byte_offset = t->byte_offset + (uint64_t)(start * s_col * es);
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
static flex_status gather(DLTensor **out, const DLTensor *pool, const Seqs *s, int64_t b) {
  int64_t len = s->lens[b], HKV = pool->shape[2], dim = pool->shape[3];
  int64_t shape[4] = {1, HKV, len, dim};
  flex_status st = rt_tensor_new(out, pool->dtype, 4, shape);
  if (st) return st;
  size_t es = (size_t)rt_dtype_size(pool->dtype);
  const char *src = rt_data_of(pool);
  char *dst = (*out)->data;
  int64_t sp = rt_stride_of(pool, 0), sr = rt_stride_of(pool, 1), sh = rt_stride_of(pool, 2);
  for (int64_t h = 0; h < HKV; h++)
    for (int64_t kv = 0; kv < len; kv++) {
      int64_t page = s->table[b * s->MP + kv / s->PS];
      const char *row = src + (size_t)(page * sp + (kv % s->PS) * sr + h * sh) * es;
      memcpy(dst + (size_t)((h * len + kv) * dim) * es, row, (size_t)dim * es);
    }
  return FLEX_OK;
}

/* The views of one sequence. */
typedef struct SeqViews {
  DLTensor q, k, v, out, lse, dout, dlse, dq, dk, dv;
  int64_t shape[10][4], strides[10][4];
} SeqViews;

/* ---- the sequences ------------------------------------------------------------------ */

/* Sequence b as an ordinary call: s (views into w) and seq. *gk, *gv are
 * gathered keys and values the caller frees. */
static flex_status one(const Seqs *s, const flex_args *a, bool backward, int64_t b, int64_t kv_start,
                       int64_t total_kv, SeqViews *w, flex_args *c, RtSeq *seq, DLTensor **gk,
                       DLTensor **gv) {
  int64_t q0 = s->cq ? s->cq[b] : 0, nq = s->cq ? s->cq[b + 1] - s->cq[b] : s->QL;
  int64_t nk = s->ck ? s->ck[b + 1] - s->ck[b] : s->lens[b];
  memset(w, 0, sizeof *w);
  *c = *a;
  c->cu_seqlens_q = c->cu_seqlens_kv = c->page_table = c->kv_lens = NULL;
  if (s->cq) {
    rt_view_rows(&w->q, w->shape[0], w->strides[0], a->q, q0, nq);
    rt_view_rows(&w->out, w->shape[3], w->strides[3], a->out, q0, nq);
    rt_view_lse(&w->lse, w->shape[4], w->strides[4], a->lse, q0, nq);
  } else {
    view_batch(&w->q, w->shape[0], w->strides[0], a->q, b);
    view_batch(&w->out, w->shape[3], w->strides[3], a->out, b);
    view_batch(&w->lse, w->shape[4], w->strides[4], a->lse, b);
  }
  c->q = &w->q, c->out = &w->out, c->lse = &w->lse;
  *seq = (RtSeq){(int)b, (int)s->B, (int)(s->cq ? a->q->shape[0] : s->QL), (int)total_kv,
                 (int)q0, (int)kv_start, b > 0, NULL, 0, 0, NULL, NULL};
  flex_status st = FLEX_OK;
  if (s->ck) {
    rt_view_rows(&w->k, w->shape[1], w->strides[1], a->k, kv_start, nk);
    rt_view_rows(&w->v, w->shape[2], w->strides[2], a->v, kv_start, nk);
    c->k = &w->k, c->v = &w->v;
  } else if (s->gather) {
    st = gather(gk, a->k, s, b);
    if (!st) st = gather(gv, a->v, s, b);
    if (!st) c->k = *gk, c->v = *gv;
  } else {
    view_pool(&w->k, w->shape[1], w->strides[1], a->k, nk);
    view_pool(&w->v, w->shape[2], w->strides[2], a->v, nk);
    c->k = &w->k, c->v = &w->v;
    const DLTensor *pt = a->page_table;
    seq->pages = (const int32_t *)(rt_data_of(pt) + b * rt_stride_of(pt, 0) * 4);
    seq->page_size = (int)s->PS, seq->max_pages = (int)s->MP;
    seq->k_pool = a->k, seq->v_pool = a->v;
  }
  if (backward) { /* packed only */
    rt_view_rows(&w->dout, w->shape[5], w->strides[5], a->dout, q0, nq);
    rt_view_rows(&w->dq, w->shape[7], w->strides[7], a->dq, q0, nq);
    rt_view_rows(&w->dk, w->shape[8], w->strides[8], a->dk, kv_start, nk);
    rt_view_rows(&w->dv, w->shape[9], w->strides[9], a->dv, kv_start, nk);
    c->dout = &w->dout, c->dq = &w->dq, c->dk = &w->dk, c->dv = &w->dv;
    if (a->dlse) {
      rt_view_lse(&w->dlse, w->shape[6], w->strides[6], a->dlse, q0, nq);
      c->dlse = &w->dlse;
    }
  }
  return st;
}

/* Validate one sequence's call without running it. */
static flex_status validate(const flex_kernel *k, const flex_args *c, const RtSeq *seq) {
  Arena arena = {0};
  RtCall call;
  flex_status st = rt_validate(&call, &arena, k, c, false, seq);
  arena_free(&arena);
  return st;
}

/* The sub-calls. Buffer gradients add up over sequences in accumulators of
 * ours (zeroed), copied into the caller's tensors at the end. */
static flex_status run_seqs(const flex_kernel *k, const flex_args *a, bool backward, const Seqs *s) {
  int64_t total_kv = s->ck ? s->ck[s->B] : 0;
  for (int64_t b = 0; !s->ck && b < s->B; b++) total_kv += s->lens[b];
  if (total_kv > INT32_MAX) return rt_err(FLEX_ERR_INVALID, "kv_lens: more than 2^31 keys in all");
  flex_buffer *bufs = NULL;
  DLTensor *acc[FLEX_MAX_BUFFERS] = {0};
  flex_status st = FLEX_OK;
  if (a->nbuffers > 0 && a->buffers) {
    bufs = base_alloc(sizeof(flex_buffer) * (size_t)a->nbuffers);
    memcpy(bufs, a->buffers, sizeof(flex_buffer) * (size_t)a->nbuffers);
  }
  for (int i = 0; backward && bufs && i < a->nbuffers && i < FLEX_MAX_BUFFERS && !st; i++) {
    const DLTensor *g = bufs[i].grad, *t = bufs[i].tensor;
    if (!g || !t) continue;
    DLDataType dt = a->backend == FLEX_BACKEND_REFERENCE ? rt_dtype(kDLFloat, 64) : rt_dtype(kDLFloat, 32);
    st = flex_tensor_alloc(&acc[i], a->backend, dt, (int)t->ndim, t->shape, a->stream);
    bufs[i].grad = acc[i];
  }
  const RtBackend *be = rt_backend_of(a->backend);
  int64_t kv_start = 0;
  bool ran = false;
  for (int64_t b = 0; b < s->B && !st; b++) {
    int64_t nq = s->cq ? s->cq[b + 1] - s->cq[b] : s->QL;
    int64_t nk = s->ck ? s->ck[b + 1] - s->ck[b] : s->lens[b];
    /* A forward of no queries writes nothing; but the last sequence of a
     * call that ran none is still validated (arch, params, buffers,
     * dtypes...), so such a call is not waved through. */
    bool validate_only = nq == 0 && !backward && !ran && b + 1 == s->B;
    if (nq > 0 || backward || validate_only) {
      ran = true;
      SeqViews w;
      flex_args c;
      RtSeq seq;
      DLTensor *gk = NULL, *gv = NULL;
      st = one(s, a, backward, b, kv_start, total_kv, &w, &c, &seq, &gk, &gv);
      c.buffers = bufs;
      if (!st) st = validate_only ? validate(k, &c, &seq) : rt_call_one(be, k, &c, backward, &seq);
      if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", flex_last_error());
        if (s->ck)
          rt_err(st, "sequence %lld (rows %lld..%lld of q, %lld..%lld of k and v): %s", (long long)b,
                 (long long)seq.q_start, (long long)(seq.q_start + nq), (long long)kv_start,
                 (long long)(kv_start + nk), msg);
        else
          rt_err(st, "sequence %lld (%lld queries, %lld keys): %s", (long long)b, (long long)nq,
                 (long long)nk, msg);
      }
      rt_tensor_delete(gk);
      rt_tensor_delete(gv);
    }
    kv_start += nk;
  }
  for (int i = 0; i < FLEX_MAX_BUFFERS; i++) {
    if (!acc[i]) continue;
    if (!st) st = flex_tensor_copy(a->buffers[i].grad, acc[i], a->stream);
    flex_tensor_free(acc[i]);
  }
  base_free(bufs);
  return st;
}

flex_status rt_seq_call(const flex_kernel *k, const flex_args *a, bool backward) {
  Seqs s;
  memset(&s, 0, sizeof s);
  s.gather = a->backend == FLEX_BACKEND_REFERENCE || a->backend == FLEX_BACKEND_CPU;
  flex_status st = a->page_table || a->kv_lens ? check_paged(k, a, backward, &s)
                                               : check_packed(k, a, backward, &s);
  rt_run_stats_reset(); /* the sub-calls add up into these */
  if (!st) st = run_seqs(k, a, backward, &s);
  base_free(s.cq);
  base_free(s.ck);
  base_free(s.lens);
  base_free(s.table);
  return st;
}
