/* tensor.c: DLPack tensors (tensor.h): dtypes, fp16/bf16 rounding, layout,
 * copies with conversion through a backend's verbs, tensors in host memory.
 * The public helpers on a backend (flex_tensor_*, flex_npy_*) are the
 * door's: api/tensor.c. */
#include "runtime/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ir/ir.h"
#include "runtime/backend.h"
#include "runtime/npy.h"
#include "runtime/rt.h"

/* ---- dtypes ---------------------------------------------------------------- */

DLDataType rt_dtype(uint8_t code, uint8_t bits) {
  DLDataType t = {code, bits, 1};
  return t;
}

int rt_dtype_size(DLDataType t) {
  if (t.lanes != 1) return 0;
  switch (t.code) {
  case kDLFloat: return t.bits == 16 || t.bits == 32 || t.bits == 64 ? t.bits / 8 : 0;
  case kDLBfloat: return t.bits == 16 ? 2 : 0;
  case kDLInt: return t.bits == 32 || t.bits == 64 || t.bits == 8 || t.bits == 16 ? t.bits / 8 : 0;
  case kDLUInt: return t.bits == 8 ? 1 : 0;
  case kDLBool: return t.bits == 8 ? 1 : 0;
  default: return 0;
  }
}

const char *rt_dtype_name(DLDataType t) {
  static const struct { uint8_t code, bits; const char *name; } names[] = {
      {kDLFloat, 16, "float16"}, {kDLFloat, 32, "float32"}, {kDLFloat, 64, "float64"},
      {kDLBfloat, 16, "bfloat16"}, {kDLInt, 8, "int8"}, {kDLInt, 16, "int16"},
      {kDLInt, 32, "int32"}, {kDLInt, 64, "int64"}, {kDLUInt, 8, "uint8"},
      {kDLBool, 8, "bool"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].code == t.code && names[i].bits == t.bits && t.lanes == 1) return names[i].name;
  return "an unsupported dtype";
}

bool rt_dtype_is_float(DLDataType t) {
  return rt_dtype_size(t) && (t.code == kDLFloat || t.code == kDLBfloat);
}

bool rt_dtype_same(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

uint16_t rt_half_from_double(double v) {
  /* Directly from binary64 (going through binary32 could round twice). */
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  if (a != a) return 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00; /* rounds to infinity */
  if (a < ldexp(1.0, -14)) {              /* subnormal: units of 2^-24 */
    double m = nearbyint(a * ldexp(1.0, 24));
    return sign | (uint16_t)m; /* m == 1024 gives the smallest normal, as it should */
  }
  int e;
  double fr = frexp(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
  double m = nearbyint(fr * 2048.0); /* 11 significant bits */
  if (m == 2048.0) {
    m = 1024.0;
    e++;
  }
  int exp = e - 1 + 15;
  if (exp >= 31) return sign | 0x7c00;
  return sign | (uint16_t)(exp << 10) | (uint16_t)((int)m - 1024);
}

uint16_t rt_bf16_from_double(double v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if (f != f) return 0x7fc0;
  /* Round binary32 to nearest even at bit 16. (Double rounding via binary32
   * is harmless for the inputs we cast, which are sampled values.) */
  bits += 0x7fff + ((bits >> 16) & 1);
  return (uint16_t)(bits >> 16);
}

double rt_elem_get(const void *p, DLDataType t) {
  union { float f; double d; int8_t i8; int16_t i16; int32_t i32; int64_t i64; uint16_t u16; } u;
  memcpy(&u, p, (size_t)rt_dtype_size(t));
  switch (t.code) {
  case kDLFloat: return t.bits == 16 ? ir_half_to_double(u.u16) : t.bits == 32 ? u.f : u.d;
  case kDLBfloat: return ir_bf16_to_double(u.u16);
  case kDLInt:
    return t.bits == 8 ? u.i8 : t.bits == 16 ? u.i16 : t.bits == 32 ? u.i32 : (double)u.i64;
  case kDLUInt: return *(const uint8_t *)p;
  case kDLBool: return *(const uint8_t *)p != 0;
  }
  PANIC("rt_elem_get: bad dtype");
}

void rt_elem_set(void *p, DLDataType t, double v) {
  union { float f; double d; int8_t i8; int16_t i16; int32_t i32; int64_t i64; uint16_t u16; uint8_t u8; } u;
  switch (t.code) {
  case kDLFloat:
    if (t.bits == 16) u.u16 = rt_half_from_double(v);
    else if (t.bits == 32) u.f = (float)v;
    else u.d = v;
    break;
  case kDLBfloat: u.u16 = rt_bf16_from_double(v); break;
  case kDLInt:
    if (t.bits == 8) u.i8 = (int8_t)v;
    else if (t.bits == 16) u.i16 = (int16_t)v;
    else if (t.bits == 32) u.i32 = (int32_t)v;
    else u.i64 = (int64_t)v;
    break;
  case kDLUInt: u.u8 = (uint8_t)v; break;
  case kDLBool: u.u8 = v != 0; break;
  default: PANIC("rt_elem_set: bad dtype");
  }
  memcpy(p, &u, (size_t)rt_dtype_size(t));
}

/* ---- layout ----------------------------------------------------------------- */

int64_t rt_stride_of(const DLTensor *t, int d) {
  if (t->strides) return t->strides[d];
  int64_t s = 1;
  for (int i = t->ndim - 1; i > d; i--) s *= t->shape[i];
  return s;
}

char *rt_data_of(const DLTensor *t) { return t ? (char *)t->data + t->byte_offset : NULL; }

int64_t rt_numel(const DLTensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

int64_t rt_span_bytes(const DLTensor *t) {
  int64_t last = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] == 0) return 0;
    last += (t->shape[d] - 1) * rt_stride_of(t, d);
  }
  return (last + 1) * ((t->dtype.bits * t->dtype.lanes + 7) / 8);
}

bool rt_contiguous(const DLTensor *t) {
  int64_t want = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && rt_stride_of(t, d) != want) return false;
    want *= t->shape[d];
  }
  return true;
}

int64_t rt_offset_of(const DLTensor *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += i % t->shape[d] * rt_stride_of(t, d);
    i /= t->shape[d];
  }
  return off;
}

bool rt_on_host(const DLTensor *t) {
  return t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost;
}

bool rt_same_device(const DLTensor *a, const DLTensor *b) {
  return a->device.device_type == b->device.device_type && a->device.device_id == b->device.device_id;
}

char *rt_shape_text(char *out, size_t cap, const int64_t *shape, int n) {
  int w = snprintf(out, cap, "[");
  for (int d = 0; d < n && w > 0 && (size_t)w < cap; d++)
    w += snprintf(out + w, cap - (size_t)w, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (w > 0 && (size_t)w < cap) snprintf(out + w, cap - (size_t)w, "]");
  return out;
}

char *rt_device_text(char *out, size_t cap, const DLTensor *t) {
  const char *n = t->device.device_type == kDLCPU       ? "cpu"
                  : t->device.device_type == kDLCUDA     ? "cuda"
                  : t->device.device_type == kDLCUDAHost ? "cuda_host"
                                                         : "device";
  snprintf(out, cap, "%s:%d (type %d)", n, (int)t->device.device_id, (int)t->device.device_type);
  return out;
}

flex_status rt_check_layout(const char *name, const DLTensor *t, int ndim, const int64_t *want,
                            const char *layout, const char *call) {
  if (!t) return rt_err(FLEX_ERR_INVALID, "%s: the tensor is missing (%s expects %s)", name, call, layout);
  if (t->ndim != ndim || (ndim && !t->shape))
    return rt_err(FLEX_ERR_INVALID, "%s: %s expects a rank-%d tensor %s, got rank %d", name, call,
                  ndim, layout, (int)t->ndim);
  for (int d = 0; want && d < ndim; d++)
    if (want[d] >= 0 && t->shape[d] != want[d]) {
      char w[128], g[128];
      int64_t ws[8];
      for (int e = 0; e < ndim && e < 8; e++) ws[e] = want[e] >= 0 ? want[e] : t->shape[e];
      rt_shape_text(w, sizeof w, ws, ndim < 8 ? ndim : 8);
      rt_shape_text(g, sizeof g, t->shape, ndim);
      return rt_err(FLEX_ERR_INVALID, "%s: expected shape %s %s, got %s", name, w, layout, g);
    }
  return FLEX_OK;
}

flex_status rt_check_device(const char *name, const DLTensor *t, const DLTensor *q) {
  if (rt_same_device(t, q)) return FLEX_OK;
  char a[64], b[64];
  return rt_err(FLEX_ERR_INVALID, "%s: expected q's device %s, got %s", name,
                rt_device_text(a, sizeof a, q), rt_device_text(b, sizeof b, t));
}

/* ---- copies ------------------------------------------------------------------ */

/* The bytes a tensor spans, on the host: its own memory, or a copy of its
 * span downloaded by be in r's order (then *tmp owns it). */
static flex_status host_span(const RtBackend *be, RtRun *r, const DLTensor *t, char **span,
                             void **tmp) {
  *tmp = NULL;
  if (rt_on_host(t) || (be && be->host_memory)) {
    *span = rt_data_of(t);
    return FLEX_OK;
  }
  size_t bytes = (size_t)rt_span_bytes(t);
  *tmp = base_alloc(bytes + 1);
  *span = *tmp;
  flex_status st = bytes ? be->download(r, *tmp, rt_data_of(t), bytes) : FLEX_OK;
  if (!st) st = be->sync(r);
  return st;
}

/* Whether a value of src's dtype may be stored in dst's. */
static bool convertible(DLDataType dst, DLDataType src) {
  return rt_dtype_is_float(dst) == rt_dtype_is_float(src);
}

/* dst[i] = src[i] over host spans; ints must fit. */
static flex_status convert(const DLTensor *dst, char *dspan, const DLTensor *src, const char *sspan) {
  int64_t n = rt_numel(dst);
  size_t ds = (size_t)rt_dtype_size(dst->dtype), ss = (size_t)rt_dtype_size(src->dtype);
  bool same = rt_dtype_same(dst->dtype, src->dtype);
  bool ints = !rt_dtype_is_float(dst->dtype) && dst->dtype.code != kDLBool;
  double lo = 0, hi = 0;
  if (ints) {
    int bits = dst->dtype.bits;
    hi = dst->dtype.code == kDLUInt ? ldexp(1.0, bits) - 1 : ldexp(1.0, bits - 1) - 1;
    lo = dst->dtype.code == kDLUInt ? 0 : -ldexp(1.0, bits - 1);
  }
  if (same && rt_contiguous(dst) && rt_contiguous(src)) { /* one block: a BlockMask per call */
    memcpy(dspan, sspan, (size_t)n * ds);
    return FLEX_OK;
  }
  for (int64_t i = 0; i < n; i++) {
    char *d = dspan + rt_offset_of(dst, i) * (int64_t)ds;
    const char *s = sspan + rt_offset_of(src, i) * (int64_t)ss;
    if (same) {
      memcpy(d, s, ds); /* exact, int64 beyond 2^53 included */
      continue;
    }
    double v = rt_elem_get(s, src->dtype);
    if (ints && (v < lo || v > hi))
      return rt_err(FLEX_ERR_INVALID, "element %lld (%.17g) is out of range for %s", (long long)i, v,
                    rt_dtype_name(dst->dtype));
    rt_elem_set(d, dst->dtype, v);
  }
  return FLEX_OK;
}

flex_status rt_tensor_copy_on(const RtBackend *be, RtRun *r, const DLTensor *dst,
                              const DLTensor *src) {
  if (dst->ndim != src->ndim || memcmp(dst->shape, src->shape, sizeof *dst->shape * (size_t)dst->ndim))
    return rt_err(FLEX_ERR_INVALID, "flex_tensor_copy: the tensors' shapes differ");
  if (!rt_dtype_size(dst->dtype) || !rt_dtype_size(src->dtype) || !convertible(dst->dtype, src->dtype))
    return rt_err(FLEX_ERR_INVALID, "flex_tensor_copy: cannot convert %s into %s",
                  rt_dtype_name(src->dtype), rt_dtype_name(dst->dtype));
  if (!rt_numel(dst)) return FLEX_OK;
  char *sspan, *dspan;
  void *stmp, *dtmp = NULL;
  flex_status st = host_span(be, r, src, &sspan, &stmp);
  bool dhost = rt_on_host(dst) || (be && be->host_memory);
  size_t dbytes = (size_t)rt_span_bytes(dst);
  if (!st && dhost) dspan = rt_data_of(dst);
  else if (!st && rt_contiguous(dst)) dspan = dtmp = base_alloc(dbytes + 1); /* every byte written */
  else if (!st) st = host_span(be, r, dst, &dspan, &dtmp); /* gaps kept */
  if (!st) st = convert(dst, dspan, src, sspan);
  if (!st && !dhost) st = be->upload(r, rt_data_of(dst), dspan, dbytes);
  if (!st && !dhost) st = be->sync(r); /* the host bytes are freed next */
  base_free(stmp);
  base_free(dtmp);
  return st;
}

/* ---- host tensors ------------------------------------------------------------------ */

/* A tensor the runtime owns: the DLTensor, then its shape. */
typedef struct Owned {
  DLTensor t;
  int64_t shape[FLEX_MAX_DIMS];
} Owned;

flex_status rt_tensor_shell(DLTensor **out, DLDataType dtype, int ndim, const int64_t *shape,
                            size_t *bytes) {
  *out = NULL;
  if (ndim < 0 || ndim > FLEX_MAX_DIMS || (ndim && !shape))
    return rt_err(FLEX_ERR_INVALID, "flex_tensor_alloc: rank %d (expected 0..%d with a shape)", ndim,
                  FLEX_MAX_DIMS);
  if (!rt_dtype_size(dtype))
    return rt_err(FLEX_ERR_INVALID, "flex_tensor_alloc: unsupported dtype (code %d, %d bits, %d lanes)",
                  dtype.code, dtype.bits, dtype.lanes);
  double n = rt_dtype_size(dtype);
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return rt_err(FLEX_ERR_INVALID, "flex_tensor_alloc: dimension %d is %lld (expected >= 0)", d,
                    (long long)shape[d]);
    n *= (double)shape[d];
  }
  if (n > 9.0e18) return rt_err(FLEX_ERR_NOMEM, "flex_tensor_alloc: %.3g bytes", n);
  Owned *o = base_alloc(sizeof *o);
  memcpy(o->shape, shape, sizeof *shape * (size_t)ndim);
  o->t.ndim = ndim;
  o->t.shape = o->shape;
  o->t.dtype = dtype;
  o->t.device.device_type = kDLCPU;
  *bytes = (size_t)n;
  *out = &o->t;
  return FLEX_OK;
}

flex_status rt_tensor_new(DLTensor **out, DLDataType dtype, int ndim, const int64_t *shape) {
  size_t bytes;
  flex_status st = rt_tensor_shell(out, dtype, ndim, shape, &bytes);
  if (st) return st;
  (*out)->data = calloc(1, bytes ? bytes : 1);
  if (!(*out)->data) {
    rt_tensor_delete(*out);
    *out = NULL;
    return rt_err(FLEX_ERR_NOMEM, "flex_tensor_alloc: out of host memory for %zu bytes", bytes);
  }
  return FLEX_OK;
}

void rt_tensor_delete(DLTensor *t) {
  if (!t) return;
  free(t->data);
  base_free(t);
}

flex_status rt_tensor_host_copy(DLTensor **out, const DLTensor *t, const RtBackend *be, RtRun *r,
                                const char *name) {
  flex_status st = rt_tensor_new(out, t->dtype, t->ndim, t->shape);
  if (st) return rt_err(st, "%s: %s", name, flex_last_error());
  st = rt_tensor_copy_on(be, r, *out, t);
  if (st) {
    rt_tensor_delete(*out);
    *out = NULL;
    return rt_err(st, "%s: %s", name, flex_last_error());
  }
  return FLEX_OK;
}
