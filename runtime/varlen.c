/* varlen.c: packed variable-length batches (docs/language.md "Packed variable-length
 * batches"; docs/varlen.md).
 *
 * A packed call is checked as a whole (the offsets, then every packed
 * tensor's rank, shape, dtype and device, in the words of the packed
 * layout), then run as one ordinary call per sequence over strided views of
 * the packed tensors: sequence b's Q is the DLTensor [1, H, len_b, E] with
 * strides [0, head stride, row stride, 1] from row cu_seqlens_q[b]. Each
 * sub-call goes through rt_validate and the run sequence (or the
 * reference), with RtSeq binding b0 (functions see b + b0), B (the number
 * of sequences), TOTAL_Q, TOTAL_KV, Q_START and KV_START. So masks are
 * classified per sequence, no tile spans two sequences, and the work is the
 * sum over sequences of their tiles.
 */
#include <stdio.h>
#include <string.h>

#include "kernels/params.cuh"
#include "runtime/backend.h"
#include "runtime/rt.h"
#include "runtime/tensor.h"

/* A packed tensor: present, of rank `ndim`, of shape `want` (-1: any), its
 * last dimension of unit stride, without overlap if `written`, on q's
 * device. `layout` names the dims ("(TOTAL_Q, H, E)"). */
static flex_status packed(const char *name, const DLTensor *t, const DLTensor *q, int ndim,
                          const int64_t *want, const char *layout, bool written) {
  flex_status st = rt_check_layout(name, t, ndim, want, layout, "a packed (cu_seqlens) call");
  if (st) return st;
  /* The sub-calls check strides on each sequence's view, where a sequence
   * of one row hides its row stride: a negative stride, or an output's
   * stride 0 across sequences, only shows on the packed tensor. */
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

/* One offsets tensor: rank 1, int32, B + 1 long, on q's device; read back
 * to the host and checked: from 0, non-decreasing, ending at `total`. */
static flex_status offsets(const char *name, const DLTensor *t, const DLTensor *q, int64_t want_len,
                           int64_t total, const char *total_name, void *stream, int32_t **out,
                           int64_t *len) {
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
  if (!t->data) return rt_err(FLEX_ERR_INVALID, "%s: data is NULL", name);
  DLTensor *h = NULL;
  flex_status st = rt_tensor_to_host(&h, t, stream, name);
  if (st) return st;
  int64_t n = t->shape[0];
  int32_t *v = base_alloc(sizeof(int32_t) * (size_t)n);
  memcpy(v, h->data, sizeof(int32_t) * (size_t)n);
  flex_tensor_free(h);
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
  if (st) {
    base_free(v);
    return st;
  }
  *out = v;
  *len = n;
  return FLEX_OK;
}

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

/* The views of one sequence. */
typedef struct SeqViews {
  DLTensor q, k, v, out, lse, dout, dlse, dq, dk, dv;
  int64_t shape[10][4], strides[10][4];
} SeqViews;

static flex_status check_packed(const flex_kernel *k, const flex_args *a, bool backward) {
  if (!a->cu_seqlens_q || !a->cu_seqlens_kv)
    return rt_err(FLEX_ERR_INVALID, "%s: missing: a packed call needs both cu_seqlens_q and "
                  "cu_seqlens_kv (one sequence of keys shared by every query sequence is not "
                  "supported: pack the keys once per sequence)",
                  a->cu_seqlens_q ? "cu_seqlens_kv" : "cu_seqlens_q");
  if (a->block_mask)
    return rt_err(FLEX_ERR_INVALID, "block_mask: a caller's BlockMask is not accepted in a packed "
                  "(cu_seqlens) call; the kernel's mask is classified per sequence");
  flex_status st;
  if ((st = packed("q", a->q, NULL, 3, NULL, "(TOTAL_Q, H, E)", false))) return st;
  const DLTensor *q = a->q;
  if ((st = packed("k", a->k, q, 3, NULL, "(TOTAL_KV, HKV, E)", false))) return st;
  if ((st = packed("v", a->v, q, 3, NULL, "(TOTAL_KV, HKV, EV)", false))) return st;
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
  if ((st = packed("out", a->out, q, 3, o, "(TOTAL_Q, H, EV)", true)) ||
      (st = packed("lse", a->lse, q, 2, l, "(H, TOTAL_Q)", true)))
    return st;
  if (backward) {
    if ((st = packed("dout", a->dout, q, 3, o, "(TOTAL_Q, H, EV)", false)) ||
        (a->dlse && (st = packed("dlse", a->dlse, q, 2, l, "(H, TOTAL_Q)", false))) ||
        (st = packed("dq", a->dq, q, 3, qs, "(TOTAL_Q, H, E)", true)) ||
        (st = packed("dk", a->dk, q, 3, ks, "(TOTAL_KV, HKV, E)", true)) ||
        (st = packed("dv", a->dv, q, 3, vs, "(TOTAL_KV, HKV, EV)", true)))
      return st;
  }
  /* Q_LEN and KV_LEN differ per sequence: no buffer may be shaped by them. */
  const IrModule *m = k->mod;
  for (int i = 0; i < a->nbuffers && a->buffers; i++) {
    const char *name = a->buffers[i].name;
    for (int j = 0; name && j < m->nbuffers; j++) {
      const IrBuffer *ib = &m->buffers[j];
      if (strcmp(ib->id, name)) continue;
      for (int d = 0; d < ib->ndims; d++) {
        int s = ib->dims[d].fixed < 0 ? ib->dims[d].size : -1;
        if (s == SZ_Q_LEN || s == SZ_KV_LEN)
          return rt_err(FLEX_ERR_INVALID, "buffer '%s': dimension %d is declared %s, which differs "
                        "per sequence in a packed (cu_seqlens) call: use %s (and index it with %s + %s)",
                        ib->id, d, s == SZ_Q_LEN ? "Q_LEN" : "KV_LEN",
                        s == SZ_Q_LEN ? "TOTAL_Q" : "TOTAL_KV", s == SZ_Q_LEN ? "Q_START" : "KV_START",
                        s == SZ_Q_LEN ? "q" : "kv");
      }
    }
  }
  return FLEX_OK;
}

/* The sub-calls. Buffer gradients add up over sequences in accumulators of
 * ours (zeroed), copied into the caller's tensors at the end. */
static flex_status run_seqs(const flex_kernel *k, const flex_args *a, bool backward,
                            const int32_t *cq, const int32_t *ck, int nseq) {
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
  for (int b = 0; b < nseq && !st; b++) {
    int64_t q0 = cq[b], nq = (int64_t)cq[b + 1] - cq[b], k0 = ck[b], nk = (int64_t)ck[b + 1] - ck[b];
    SeqViews w;
    memset(&w, 0, sizeof w);
    flex_args s = *a;
    s.cu_seqlens_q = s.cu_seqlens_kv = NULL;
    s.buffers = bufs;
    rt_view_rows(&w.q, w.shape[0], w.strides[0], a->q, q0, nq);
    rt_view_rows(&w.k, w.shape[1], w.strides[1], a->k, k0, nk);
    rt_view_rows(&w.v, w.shape[2], w.strides[2], a->v, k0, nk);
    rt_view_rows(&w.out, w.shape[3], w.strides[3], a->out, q0, nq);
    rt_view_lse(&w.lse, w.shape[4], w.strides[4], a->lse, q0, nq);
    s.q = &w.q, s.k = &w.k, s.v = &w.v, s.out = &w.out, s.lse = &w.lse;
    if (backward) {
      rt_view_rows(&w.dout, w.shape[5], w.strides[5], a->dout, q0, nq);
      rt_view_rows(&w.dq, w.shape[7], w.strides[7], a->dq, q0, nq);
      rt_view_rows(&w.dk, w.shape[8], w.strides[8], a->dk, k0, nk);
      rt_view_rows(&w.dv, w.shape[9], w.strides[9], a->dv, k0, nk);
      s.dout = &w.dout, s.dq = &w.dq, s.dk = &w.dk, s.dv = &w.dv;
      if (a->dlse) {
        rt_view_lse(&w.dlse, w.shape[6], w.strides[6], a->dlse, q0, nq);
        s.dlse = &w.dlse;
      }
    }
    RtSeq seq = {b,       nseq,  (int)a->q->shape[0], (int)a->k->shape[0], (int)q0, (int)k0,
                 b > 0, NULL, 0, 0, NULL, NULL};
    st = rt_call_one(k, &s, backward, &seq);
    if (st) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", flex_last_error());
      rt_err(st, "sequence %d (rows %lld..%lld of q, %lld..%lld of k and v): %s", b, (long long)q0,
             (long long)(q0 + nq), (long long)k0, (long long)(k0 + nk), msg);
    }
  }
  for (int i = 0; i < FLEX_MAX_BUFFERS; i++) {
    if (!acc[i]) continue;
    if (!st) st = flex_tensor_copy(a->buffers[i].grad, acc[i], a->stream);
    flex_tensor_free(acc[i]);
  }
  base_free(bufs);
  return st;
}

flex_status rt_varlen_call(const flex_kernel *k, const flex_args *a, bool backward) {
  flex_status st = check_packed(k, a, backward);
  if (st) return st;
  int32_t *cq = NULL, *ck = NULL;
  int64_t nq = 0, nk = 0;
  st = offsets("cu_seqlens_q", a->cu_seqlens_q, a->q, -1, a->q->shape[0], "TOTAL_Q", a->stream, &cq, &nq);
  if (!st)
    st = offsets("cu_seqlens_kv", a->cu_seqlens_kv, a->q, nq, a->k->shape[0], "TOTAL_KV", a->stream,
                 &ck, &nk);
  if (!st && nq - 1 > INT32_MAX) st = rt_err(FLEX_ERR_INVALID, "cu_seqlens_q: too many sequences");
  rt_run_stats_reset(); /* the sub-calls add up into these */
  if (!st) st = run_seqs(k, a, backward, cq, ck, (int)(nq - 1));
  base_free(cq);
  base_free(ck);
  return st;
}
