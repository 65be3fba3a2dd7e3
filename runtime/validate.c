/* validate.c: rt_validate(), SDPA-style checks of one call.
 *
 * Every message names the tensor, says what was expected and what came.
 * The rules (docs/runtime.md has the full list):
 *   q [B,H,Q_LEN,E], k [B,HKV,KV_LEN,E], v [B,HKV,KV_LEN,EV], H % HKV == 0;
 *   B, Q_LEN, KV_LEN may be 0; H, HKV, E, EV must be at least 1;
 *   q, k, v share one float dtype; out, dq, dk, dv have q's dtype on every
 *   backend, or float32/float64 on the reference and emu backends (the
 *   reference writes only those two); lse and dlse are float32 (float64 on
 *   the reference); dout has q's dtype except on the reference;
 *   the last dimension has unit stride, no stride is negative, the span fits
 *   in int64 bytes, data is element-aligned and outputs have no stride-0
 *   dimension of extent > 1; reference and emu need host memory
 *   (the cuda backend checks its own devices, after looking for a driver);
 *   params and buffers are matched by name against the kernel's declarations.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "npy.h"
#include "rt.h"
#include "codegen/codegen.h"

/* Validation state: the call being filled and where its memory lives. */
typedef struct V {
  RtCall *c;
  Arena *arena;
  const flex_args *a;
  bool host; /* the backend reads tensors on the host */
  bool mask_only; /* only what the mask reads is required (rt_validate_bindings) */
} V;

/* Whether what the call needs reads leaf `op` of this slot: the mask
 * alone for mask_only, else the kernel's score or mask. */
static bool needed(const V *v, IrOp op, int slot) {
  const IrModule *m = v->c->mod;
  if (!v->mask_only) return op == IR_LOAD ? m->buffers[slot].used : true;
  for (int i = 0; m->mask && i < m->mask->n; i++)
    if (m->mask->inst[i].op == op && m->mask->inst[i].aux == slot) return true;
  return false;
}

static bool is_float(DLDataType t) {
  return t.lanes == 1 && ((t.code == kDLFloat && (t.bits == 16 || t.bits == 32 || t.bits == 64)) ||
                          (t.code == kDLBfloat && t.bits == 16));
}
static bool is_out_float(DLDataType t) {
  return t.lanes == 1 && t.code == kDLFloat && (t.bits == 32 || t.bits == 64);
}

/* The memory layout of a non-empty tensor: strides non-negative (every
 * backend's kernels and the emulator's address checks walk forward from the
 * base), the bytes it spans representable in int64 (element offsets are
 * computed in 64 bits and must not wrap), and its first element aligned to
 * the element size (a misaligned load faults on a GPU). */
static flex_status check_layout(const char *name, const DLTensor *t) {
  int64_t last = 0, compact = 1; /* largest element offset; the compact stride */
  for (int d = (int)t->ndim - 1; d >= 0; d--) {
    int64_t s = t->strides ? t->strides[d] : compact, span;
    if (t->shape[d] > 1 && s < 0)
      return rt_err(FLEX_ERR_INVALID, "%s: dimension %d has stride %lld (expected a non-negative stride)",
                    name, d, (long long)s);
    if (t->shape[d] > 1 && (__builtin_mul_overflow(t->shape[d] - 1, s, &span) ||
                            __builtin_add_overflow(last, span, &last)))
      return rt_err(FLEX_ERR_INVALID, "%s: shape and strides span more than 2^63 elements", name);
    if (__builtin_mul_overflow(compact, t->shape[d], &compact)) compact = INT64_MAX;
  }
  int64_t esize = (t->dtype.bits * t->dtype.lanes + 7) / 8, bytes;
  if (t->byte_offset > (uint64_t)INT64_MAX ||
      (esize > 0 && (__builtin_mul_overflow(last + 1, esize, &bytes) ||
                     __builtin_add_overflow(bytes, (int64_t)t->byte_offset, &bytes))))
    return rt_err(FLEX_ERR_INVALID, "%s: shape and strides span more than 2^63 bytes", name);
  uintptr_t addr = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  if (esize > 1 && addr % (uintptr_t)esize)
    return rt_err(FLEX_ERR_INVALID,
                  "%s: data + byte_offset (%#llx) is not aligned to the %lld-byte element size",
                  name, (unsigned long long)addr, (long long)esize);
  return FLEX_OK;
}

/* An output must not write one element through two indices (PyTorch refuses
 * such in-place targets too): no stride 0 on a dimension of extent > 1. */
static flex_status check_no_overlap(const char *name, const DLTensor *t) {
  for (int d = 0; d < t->ndim; d++)
    if (t->shape[d] == 0) return FLEX_OK; /* no elements, nothing to overlap */
  for (int d = 0; t->strides && d < t->ndim; d++)
    if (t->shape[d] > 1 && t->strides[d] == 0)
      return rt_err(FLEX_ERR_INVALID,
                    "%s: dimension %d has stride 0, so elements of this output overlap "
                    "(expected a positive stride)",
                    name, d);
  return FLEX_OK;
}

/* Device, strides and shape of one tensor against an expected shape. */
static flex_status check_tensor(V *v, const char *name, const DLTensor *t, int ndim,
                                const int64_t *want) {
  if (!t) return rt_err(FLEX_ERR_INVALID, "%s: the tensor is missing", name);
  if (t->ndim != ndim)
    return rt_err(FLEX_ERR_INVALID, "%s: expected a rank-%d tensor, got rank %d", name, ndim,
                  (int)t->ndim);
  if (ndim > 0 && !t->shape) return rt_err(FLEX_ERR_INVALID, "%s: shape is NULL", name);
  for (int d = 0; d < ndim; d++)
    if (t->shape[d] < 0 || t->shape[d] > INT32_MAX)
      return rt_err(FLEX_ERR_INVALID, "%s: dimension %d has extent %lld (expected 0..%d)", name, d,
                    (long long)t->shape[d], INT32_MAX);
  bool empty = false;
  for (int d = 0; d < ndim; d++) empty = empty || t->shape[d] == 0;
  if (!t->data && !empty) return rt_err(FLEX_ERR_INVALID, "%s: data is NULL", name);
  if (want)
    for (int d = 0; d < ndim; d++)
      if (want[d] >= 0 && t->shape[d] != want[d]) {
        char w[128], g[128];
        int64_t ws[IR_MAXDIMS];
        for (int e = 0; e < ndim; e++) ws[e] = want[e] >= 0 ? want[e] : t->shape[e];
        rt_shape_text(w, sizeof w, ws, ndim);
        rt_shape_text(g, sizeof g, t->shape, ndim);
        return rt_err(FLEX_ERR_INVALID, "%s: expected shape %s, got %s", name, w, g);
      }
  if (ndim > 0 && t->strides && t->shape[ndim - 1] > 1 && t->strides[ndim - 1] != 1)
    return rt_err(FLEX_ERR_INVALID, "%s: the last dimension must have unit stride, got stride %lld",
                  name, (long long)t->strides[ndim - 1]);
  flex_status st = empty ? FLEX_OK : check_layout(name, t);
  if (st) return st;
  bool on_host = t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost ||
                 t->device.device_type == kDLCUDAManaged;
  if (v->host && !on_host)
    return rt_err(FLEX_ERR_INVALID, "%s: the %s backend needs host memory (kDLCPU), got device type %d",
                  name, flex_backend_name(v->a->backend), (int)t->device.device_type);
  return FLEX_OK;
}

static flex_status check_dtype(const char *name, const DLTensor *t, bool out) {
  if (out ? is_out_float(t->dtype) : is_float(t->dtype)) return FLEX_OK;
  return rt_err(FLEX_ERR_INVALID, "%s: expected %s, got %s", name,
                out ? "float32 or float64" : "float16, bfloat16, float32 or float64",
                rt_dtype_name(t->dtype));
}

static bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/* out, dq, dk, dv: q's dtype everywhere (the cuda backend, like PyTorch's
 * SDPA, writes nothing else); float32 or float64 on the reference and emu
 * backends, which widen; q's dtype there too. */
static flex_status check_out_dtype(V *v, const char *name, const DLTensor *t) {
  DLDataType q = v->c->dtype;
  const char *qn = rt_dtype_name(q), *got = rt_dtype_name(t->dtype);
  flex_backend be = v->a->backend;
  bool same = same_dtype(t->dtype, q);
  if (be == FLEX_BACKEND_CUDA) {
    if (same) return FLEX_OK;
    return rt_err(FLEX_ERR_INVALID, "%s: the cuda backend writes q's dtype: expected %s, got %s",
                  name, qn, got);
  }
  if (is_out_float(t->dtype) || same) return FLEX_OK;
  if (is_out_float(q))
    return rt_err(FLEX_ERR_INVALID, "%s: expected float32 or float64 on the %s backend, got %s",
                  name, flex_backend_name(be), got);
  return rt_err(FLEX_ERR_INVALID, "%s: expected %s (q's dtype), float32 or float64, got %s", name,
                qn, got);
}

/* lse and dlse: float32; the reference also takes float64. */
static flex_status check_lse_dtype(V *v, const char *name, const DLTensor *t) {
  DLDataType t32 = rt_dtype(kDLFloat, 32);
  if (same_dtype(t->dtype, t32)) return FLEX_OK;
  if (v->a->backend == FLEX_BACKEND_REFERENCE) return check_dtype(name, t, true);
  return rt_err(FLEX_ERR_INVALID, "%s: expected float32 on the %s backend, got %s", name,
                flex_backend_name(v->a->backend), rt_dtype_name(t->dtype));
}

/* dout: any float dtype on the reference; q's dtype on the devices' kernels. */
static flex_status check_dout_dtype(V *v, const DLTensor *t) {
  if (v->a->backend == FLEX_BACKEND_REFERENCE) return check_dtype("dout", t, false);
  if (same_dtype(t->dtype, v->c->dtype)) return FLEX_OK;
  return rt_err(FLEX_ERR_INVALID, "dout: expected %s (q's dtype) on the %s backend, got %s",
                rt_dtype_name(v->c->dtype), flex_backend_name(v->a->backend),
                rt_dtype_name(t->dtype));
}

/* q, k, v: ranks, agreement, dtypes; sets the sizes. */
/* Precision is what the caller asked for: the kernels compute in float32 at
 * best, so float64 inputs run where float64 arithmetic is. */
flex_status rt_check_precision(flex_backend be, DLDataType dt) {
  if (dt.code == kDLFloat && dt.bits == 64 && be != FLEX_BACKEND_REFERENCE)
    return rt_err(FLEX_ERR_UNSUPPORTED, "q, k, v: float64 inputs run in float64 on the reference "
                  "backend only; the %s backend computes in float32 (convert q, k and v to float32 "
                  "to run there, or use the reference backend)", flex_backend_name(be));
  return FLEX_OK;
}

static flex_status check_qkv(V *v) {
  const flex_args *a = v->a;
  RtCall *c = v->c;
  flex_status st;
  if ((st = check_tensor(v, "q", a->q, 4, NULL)) || (st = check_tensor(v, "k", a->k, 4, NULL)) ||
      (st = check_tensor(v, "v", a->v, 4, NULL)))
    return st;
  const int64_t *q = a->q->shape, *k = a->k->shape, *vv = a->v->shape;
  if (k[0] != q[0] || vv[0] != q[0])
    return rt_err(FLEX_ERR_INVALID, "batch sizes disagree: q has B=%lld, k has %lld, v has %lld",
                  (long long)q[0], (long long)k[0], (long long)vv[0]);
  if (k[3] != q[3])
    return rt_err(FLEX_ERR_INVALID, "k: head dim E=%lld does not match q's E=%lld", (long long)k[3],
                  (long long)q[3]);
  if (vv[1] != k[1])
    return rt_err(FLEX_ERR_INVALID, "v: %lld key/value heads, but k has %lld", (long long)vv[1],
                  (long long)k[1]);
  if (vv[2] != k[2])
    return rt_err(FLEX_ERR_INVALID, "v: KV_LEN=%lld does not match k's KV_LEN=%lld",
                  (long long)vv[2], (long long)k[2]);
  if (q[1] < 1 || k[1] < 1)
    return rt_err(FLEX_ERR_INVALID, "q and k need at least one head, got H=%lld, HKV=%lld",
                  (long long)q[1], (long long)k[1]);
  if (q[1] % k[1])
    return rt_err(FLEX_ERR_INVALID, "H=%lld query heads is not a multiple of HKV=%lld key/value heads",
                  (long long)q[1], (long long)k[1]);
  if (q[3] < 1 || vv[3] < 1)
    return rt_err(FLEX_ERR_INVALID, "head dims must be at least 1, got E=%lld, EV=%lld",
                  (long long)q[3], (long long)vv[3]);
  if ((st = check_dtype("q", a->q, false))) return st;
  if (memcmp(&a->k->dtype, &a->q->dtype, sizeof a->q->dtype) ||
      memcmp(&a->v->dtype, &a->q->dtype, sizeof a->q->dtype))
    return rt_err(FLEX_ERR_INVALID, "q, k and v must share a dtype, got %s, %s and %s",
                  rt_dtype_name(a->q->dtype), rt_dtype_name(a->k->dtype),
                  rt_dtype_name(a->v->dtype));
  if ((st = rt_check_precision(a->backend, a->q->dtype))) return st;
  c->B = (int)q[0], c->H = (int)q[1], c->HKV = (int)k[1], c->G = c->H / c->HKV;
  c->QL = (int)q[2], c->KL = (int)k[2], c->E = (int)q[3], c->EV = (int)vv[3];
  c->dtype = a->q->dtype;
  return FLEX_OK;
}

/* What a float tensor's dtype must be. */
typedef enum Role { ROLE_OUT, ROLE_LSE, ROLE_DOUT } Role;

/* A float tensor of a known shape (out, lse, dout, dq, ...). */
static flex_status check_shaped(V *v, const char *name, const DLTensor *t, int ndim,
                                const int64_t *want, Role role) {
  flex_status st = check_tensor(v, name, t, ndim, want);
  if (st) return st;
  bool written = role == ROLE_OUT || (role == ROLE_LSE && !strcmp(name, "lse"));
  if (written && (st = check_no_overlap(name, t))) return st;
  switch (role) {
  case ROLE_OUT: return check_out_dtype(v, name, t);
  case ROLE_LSE: return check_lse_dtype(v, name, t);
  case ROLE_DOUT: return check_dout_dtype(v, t);
  }
  PANIC("bad role");
}

static flex_status check_io(V *v, bool backward) {
  const flex_args *a = v->a;
  const RtCall *c = v->c;
  int64_t o[4] = {c->B, c->H, c->QL, c->EV}, l[3] = {c->B, c->H, c->QL};
  int64_t q[4] = {c->B, c->H, c->QL, c->E}, k[4] = {c->B, c->HKV, c->KL, c->E};
  int64_t vv[4] = {c->B, c->HKV, c->KL, c->EV};
  flex_status st;
  if ((st = check_shaped(v, "out", a->out, 4, o, ROLE_OUT)) ||
      (st = check_shaped(v, "lse", a->lse, 3, l, ROLE_LSE)))
    return st;
  if (!backward) return FLEX_OK;
  if ((st = check_shaped(v, "dout", a->dout, 4, o, ROLE_DOUT))) return st;
  if (a->dlse && (st = check_shaped(v, "dlse", a->dlse, 3, l, ROLE_LSE))) return st;
  if ((st = check_shaped(v, "dq", a->dq, 4, q, ROLE_OUT)) ||
      (st = check_shaped(v, "dk", a->dk, 4, k, ROLE_OUT)) ||
      (st = check_shaped(v, "dv", a->dv, 4, vv, ROLE_OUT)))
    return st;
  return FLEX_OK;
}

static flex_status check_params(V *v) {
  const IrModule *m = v->c->mod;
  const flex_args *a = v->a;
  IrVal *p = arena_alloc(v->arena, sizeof(IrVal) * (size_t)(m->nparams + 1));
  bool *set = arena_alloc(v->arena, (size_t)m->nparams + 1);
  for (int i = 0; i < a->nparams; i++) {
    const char *name = a->params[i].name ? a->params[i].name : "(null)";
    int slot = -1;
    for (int j = 0; j < m->nparams; j++)
      if (!strcmp(m->params[j].id, name)) slot = j;
    if (slot < 0) {
      Buf names = {0};
      for (int j = 0; j < m->nparams; j++) buf_printf(&names, "%s%s", j ? ", " : "", m->params[j].id);
      flex_status st = rt_err(FLEX_ERR_INVALID, "unknown param '%s' (the kernel declares %s)", name,
                              m->nparams ? names.data : "no params");
      buf_free(&names);
      return st;
    }
    if (set[slot]) return rt_err(FLEX_ERR_INVALID, "param '%s' is given twice", name);
    double x = a->params[i].value;
    if (m->params[slot].type == IT_I32) {
      if (!(x == floor(x)) && !isinf(x))
        return rt_err(FLEX_ERR_INVALID, "param '%s' is an int, got %g", name, x);
      if (!(x >= INT32_MIN && x <= INT32_MAX))
        return rt_err(FLEX_ERR_INVALID, "param '%s' is an int: %.17g is out of range (%d to %d)",
                      name, x, INT32_MIN, INT32_MAX);
      p[slot] = ir_vi((int32_t)x);
    } else {
      if (x != x) return rt_err(FLEX_ERR_INVALID, "param '%s' is NaN", name);
      p[slot] = ir_vf((double)(float)x); /* a float param is binary32 on every backend */
    }
    set[slot] = true;
  }
  for (int j = 0; j < m->nparams; j++)
    if (!set[j]) {
      if (!m->params[j].has_default && needed(v, IR_PARAM, j))
        return rt_err(FLEX_ERR_INVALID, "param '%s' has no default and was not given",
                      m->params[j].id);
      p[j] = m->params[j].def;
    }
  v->c->params = p;
  return FLEX_OK;
}

/* The DLPack type a declared buffer dtype needs. */
DLDataType rt_buffer_dtype(DType t) {
  switch (t) {
  case DT_F32: return rt_dtype(kDLFloat, 32);
  case DT_F16: return rt_dtype(kDLFloat, 16);
  case DT_BF16: return rt_dtype(kDLBfloat, 16);
  case DT_I32: return rt_dtype(kDLInt, 32);
  case DT_I64: return rt_dtype(kDLInt, 64);
  case DT_U8: return rt_dtype(kDLUInt, 8);
  case DT_BOOL: return rt_dtype(kDLBool, 8);
  }
  PANIC("bad dtype");
}

/* Which buffer slot a name means; an error listing the declared ones if none. */
static int buffer_slot(const IrModule *m, const char *name) {
  for (int j = 0; j < m->nbuffers; j++)
    if (!strcmp(m->buffers[j].id, name)) return j;
  Buf names = {0};
  for (int j = 0; j < m->nbuffers; j++) buf_printf(&names, "%s%s", j ? ", " : "", m->buffers[j].id);
  rt_err(FLEX_ERR_INVALID, "unknown buffer '%s' (the kernel declares %s)", name,
         m->nbuffers ? names.data : "no buffers");
  buf_free(&names);
  return -1;
}

/* Dims of buffer `j` against its declaration; binds free size symbols. */
static flex_status check_buffer_dims(V *v, int j, const char *what, const DLTensor *t, bool *bound) {
  const IrBuffer *ib = &v->c->mod->buffers[j];
  int32_t *sz = v->c->sizes;
  for (int d = 0; d < ib->ndims; d++) {
    int64_t want = ib->dims[d].fixed;
    const char *why = "fixed by the declaration";
    if (want < 0) {
      int s = ib->dims[d].size;
      why = v->c->mod->sizes[s].id;
      if (s >= SZ_COUNT && !bound[s]) {
        sz[s] = (int32_t)t->shape[d];
        bound[s] = true;
      }
      want = sz[s];
    }
    if (t->shape[d] != want) {
      char g[128];
      rt_shape_text(g, sizeof g, t->shape, (int)t->ndim);
      return rt_err(FLEX_ERR_INVALID, "%s '%s': dimension %d must be %lld (%s), got shape %s", what,
                    ib->id, d, (long long)want, why, g);
    }
  }
  return FLEX_OK;
}

/* A host view of a tensor for the interpreter. */
static void view_of(IrBufView *bv, const DLTensor *t, DType dt, bool host) {
  bv->data = host ? (const char *)t->data + t->byte_offset : NULL;
  bv->dtype = dt;
  bv->ndims = (int)t->ndim;
  int64_t stride = 1;
  for (int d = (int)t->ndim - 1; d >= 0; d--) {
    bv->shape[d] = t->shape[d];
    bv->strides[d] = t->strides ? t->strides[d] : stride;
    stride *= t->shape[d];
  }
}

static flex_status check_buffers(V *v, bool backward) {
  RtCall *c = v->c;
  const IrModule *m = c->mod;
  const flex_args *a = v->a;
  int nb = m->nbuffers;
  c->bufs = arena_alloc(v->arena, sizeof(IrBufView) * (size_t)(nb + 1));
  c->buf_tensors = arena_alloc(v->arena, sizeof(DLTensor *) * (size_t)(nb + 1));
  c->buf_grads = arena_alloc(v->arena, sizeof(DLTensor *) * (size_t)(nb + 1));
  bool *bound = arena_alloc(v->arena, (size_t)m->nsizes + 1);
  flex_status st;
  for (int i = 0; i < a->nbuffers; i++) {
    const flex_buffer *fb = &a->buffers[i];
    int j = buffer_slot(m, fb->name ? fb->name : "(null)");
    if (j < 0) return FLEX_ERR_INVALID;
    const IrBuffer *ib = &m->buffers[j];
    if (c->buf_tensors[j]) return rt_err(FLEX_ERR_INVALID, "buffer '%s' is given twice", ib->id);
    char what[160];
    snprintf(what, sizeof what, "buffer '%s'", ib->id);
    if ((st = check_tensor(v, what, fb->tensor, ib->ndims, NULL))) return st;
    DLDataType want = rt_buffer_dtype(ib->dtype);
    if (memcmp(&fb->tensor->dtype, &want, sizeof want))
      return rt_err(FLEX_ERR_INVALID, "buffer '%s' is declared %s: expected %s data, got %s", ib->id,
                    dtype_name(ib->dtype), rt_dtype_name(want), rt_dtype_name(fb->tensor->dtype));
    if ((st = check_buffer_dims(v, j, "buffer", fb->tensor, bound))) return st;
    c->buf_tensors[j] = fb->tensor;
    view_of(&c->bufs[j], fb->tensor, ib->dtype, v->host);
    if (fb->grad && !ib->grad)
      return rt_err(FLEX_ERR_INVALID, "buffer '%s' has a gradient tensor but is not declared `grad`",
                    ib->id);
    if (fb->grad && backward) {
      snprintf(what, sizeof what, "gradient of buffer '%s'", ib->id);
      if ((st = check_tensor(v, what, fb->grad, ib->ndims, fb->tensor->shape)) ||
          (st = check_no_overlap(what, fb->grad)) || (st = check_dtype(what, fb->grad, true)))
        return st;
      c->buf_grads[j] = fb->grad;
    }
  }
  for (int j = 0; j < nb; j++)
    if (needed(v, IR_LOAD, j) && !c->buf_tensors[j])
      return rt_err(FLEX_ERR_INVALID, "buffer '%s' is read by the %s but was not given",
                    m->buffers[j].id, v->mask_only ? "mask" : "kernel");
  return FLEX_OK;
}

/* Position offsets: one side's offset and whole length for a call of
 * `len` rows; the whole length defaults to the call's own. */
static flex_status check_offset(const char *side, int64_t off, int64_t total, int64_t len,
                                int *off_out, int *total_out) {
  const char *what = side[0] == 'q' ? "Q_LEN" : "KV_LEN";
  if (off < 0)
    return rt_err(FLEX_ERR_INVALID, "%s_offset must be >= 0, got %lld", side, (long long)off);
  if (total < 0)
    return rt_err(FLEX_ERR_INVALID, "%s_len_total must be >= 0, got %lld", side, (long long)total);
  if (total == 0 && off != 0)
    return rt_err(FLEX_ERR_INVALID, "%s_offset %lld needs %s_len_total, the whole sequence's %s",
                  side, (long long)off, side, what);
  if (total == 0) total = len;
  if (off + len > total)
    return rt_err(FLEX_ERR_INVALID, "the shard's rows %lld..%lld of %s (%s_offset %lld + %lld rows) "
                  "lie past %s_len_total = %lld", (long long)off, (long long)(off + len - 1),
                  side[0] == 'q' ? "q" : "k and v", side, (long long)off, (long long)len, side,
                  (long long)total);
  if (total > INT32_MAX)
    return rt_err(FLEX_ERR_INVALID, "%s_len_total = %lld: positions must fit in int32 (at most %d)",
                  side, (long long)total, INT32_MAX);
  *off_out = (int)off, *total_out = (int)total;
  return FLEX_OK;
}

/* Both sides' offsets of `a` for a call of ql x kl; no offsets with packed
 * or paged calls (docs/language.md "Position offsets"). */
static flex_status check_offsets(RtCall *c, const flex_args *a, bool packed, int *qtot, int *kvtot) {
  bool any = a->q_offset || a->kv_offset || a->q_len_total || a->kv_len_total;
  if (any && packed)
    return rt_err(FLEX_ERR_INVALID, "q_offset, kv_offset, q_len_total, kv_len_total: position "
                  "offsets are not combined with a packed (cu_seqlens) or paged call");
  flex_status st = check_offset("q", a->q_offset, a->q_len_total, c->QL, &c->q_off, qtot);
  return st ? st : check_offset("kv", a->kv_offset, a->kv_len_total, c->KL, &c->kv_off, kvtot);
}

flex_status rt_validate(RtCall *c, Arena *arena, const flex_kernel *k, const flex_args *a,
                        bool backward, const RtSeq *seq) {
  memset(c, 0, sizeof *c);
  c->kernel = k;
  c->mod = k->mod;
  c->args = a;
  c->backward = backward;
  V v = {c, arena, a, a->backend != FLEX_BACKEND_CUDA, false};
  flex_status st;
  if ((st = check_qkv(&v)) || (st = check_io(&v, backward))) return st;
  if (a->nparams < 0 || (a->nparams && !a->params))
    return rt_err(FLEX_ERR_INVALID, "params: %d given but the array is NULL", a->nparams);
  if (a->nbuffers < 0 || (a->nbuffers && !a->buffers))
    return rt_err(FLEX_ERR_INVALID, "buffers: %d given but the array is NULL", a->nbuffers);
  if (!isfinite(a->scale))
    return rt_err(FLEX_ERR_INVALID, "scale must be finite, got %g", a->scale);
  c->scale = a->scale != 0 ? a->scale : 1.0 / sqrt((double)c->E);
  if (!(a->dropout_p >= 0.0f && a->dropout_p < 1.0f))
    return rt_err(FLEX_ERR_INVALID, "dropout_p must be in [0, 1), got %g", (double)a->dropout_p);
  if (a->kv_splits < 0)
    return rt_err(FLEX_ERR_INVALID, "kv_splits must be 0 (automatic), 1 (never split) or a "
                  "number of key chunks, got %d", a->kv_splits);
  CgArch arch;
  if (a->arch && !cg_arch_parse(a->arch, &arch))
    return rt_err(FLEX_ERR_INVALID, "arch '%s': expected sm_80, sm_86, sm_89, sm_90 or sm_90a",
                  a->arch);
  const IrModule *m = k->mod;
  int qtot, kvtot;
  if ((st = check_offsets(c, a, seq != NULL, &qtot, &kvtot))) return st;
  c->sizes = arena_alloc(arena, sizeof(int32_t) * (size_t)(m->nsizes + SZ_COUNT));
  int32_t pre[SZ_COUNT] = {c->B, c->H, c->HKV, qtot, kvtot, qtot, kvtot, 0, 0};
  if (seq) {
    pre[SZ_B] = seq->nseq, pre[SZ_TOTAL_Q] = seq->total_q, pre[SZ_TOTAL_KV] = seq->total_kv;
    pre[SZ_Q_START] = seq->q_start, pre[SZ_KV_START] = seq->kv_start;
    c->b0 = seq->b0, c->accumulate = seq->accumulate;
    c->pages = seq->pages, c->page_size = seq->page_size, c->max_pages = seq->max_pages;
    c->k_pool = seq->k_pool, c->v_pool = seq->v_pool;
  }
  for (int s = 0; s < SZ_COUNT; s++) c->sizes[s] = pre[s];
  if ((st = check_params(&v)) || (st = check_buffers(&v, backward))) return st;
  if (backward) {
    /* A `grad` buffer passed without a gradient tensor: the kernels are
     * made from a joint that neither computes nor adds its gradient. */
    bool *keep = arena_alloc(arena, (size_t)m->nbuffers + 1);
    for (int j = 0; j < m->nbuffers; j++) keep[j] = c->buf_grads[j] != NULL;
    c->mod = rt_kernel_module(k, keep);
  }
  return FLEX_OK;
}

flex_status rt_validate_bindings(RtCall *c, Arena *arena, const flex_kernel *k, const flex_args *a,
                                 int B, int H, int q_len, int kv_len) {
  memset(c, 0, sizeof *c);
  c->kernel = k;
  c->mod = k->mod;
  c->args = a;
  c->B = B, c->H = H, c->HKV = H, c->G = 1, c->QL = q_len, c->KL = kv_len;
  V v = {c, arena, a, true, true};
  if (a->nparams < 0 || (a->nparams && !a->params))
    return rt_err(FLEX_ERR_INVALID, "params: %d given but the array is NULL", a->nparams);
  if (a->nbuffers < 0 || (a->nbuffers && !a->buffers))
    return rt_err(FLEX_ERR_INVALID, "buffers: %d given but the array is NULL", a->nbuffers);
  const IrModule *m = k->mod;
  int qtot, kvtot;
  flex_status st = check_offsets(c, a, false, &qtot, &kvtot);
  if (st) return st;
  c->sizes = arena_alloc(arena, sizeof(int32_t) * (size_t)(m->nsizes + SZ_COUNT));
  int32_t pre[SZ_COUNT] = {B, H, H, qtot, kvtot, qtot, kvtot, 0, 0};
  for (int s = 0; s < SZ_COUNT; s++) c->sizes[s] = pre[s];
  st = check_params(&v);
  return st ? st : check_buffers(&v, false);
}

int64_t rt_sorted_elem(DType t, const void *p) {
  if (t == DT_I64) {
    int64_t x;
    memcpy(&x, p, 8);
    return x;
  }
  if (t == DT_I32) {
    int32_t y;
    memcpy(&y, p, 4);
    return y;
  }
  return *(const uint8_t *)p;
}

flex_status rt_sorted_error(const RtCall *c, int slot, int64_t i, int64_t x, int64_t prev) {
  return rt_err(FLEX_ERR_RUNTIME,
                "buffer '%s' is declared sorted but decreases at index %lld (%lld after %lld)",
                c->mod->buffers[slot].id, (long long)i, (long long)x, (long long)prev);
}

/* Every run (unless flex_args.trust_sorted) verifies `sorted` promises
 * before anything runs: one pass per buffer. `views` are host views of the
 * buffers (by slot; data NULL: skipped). */
flex_status rt_check_sorted(const RtCall *c, const IrBufView *views) {
  const IrModule *m = c->mod;
  for (int j = 0; j < m->nbuffers; j++) {
    const IrBufView *bv = &views[j];
    if (!m->buffers[j].sorted || !bv->data || bv->ndims != 1) continue;
    int64_t prev = INT64_MIN, es = bv->dtype == DT_I64 ? 8 : bv->dtype == DT_I32 ? 4 : 1;
    for (int64_t i = 0; i < bv->shape[0]; i++) {
      int64_t x = rt_sorted_elem(bv->dtype, (const char *)bv->data + i * bv->strides[0] * es);
      if (x < prev) return rt_sorted_error(c, j, i, x, prev);
      prev = x;
    }
  }
  return FLEX_OK;
}
