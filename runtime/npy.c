/* npy.c: NumPy .npy read and write.
 *
 * File layout: "\x93NUMPY", major, minor, a header length (u16 for v1, u32
 * for v2 and v3), a Python dict literal padded with spaces and a newline,
 * then the raw elements. We parse the dict ourselves (keys descr,
 * fortran_order, shape) and refuse anything we cannot read exactly.
 */
#include "runtime/npy.h"

#include "runtime/rt.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "ir/ir.h"


/* ---- arrays ------------------------------------------------------------ */

int64_t rt_array_count(const RtArray *a) {
  int64_t n = 1;
  for (int d = 0; d < a->ndim; d++) n *= a->shape[d];
  return n;
}

void rt_array_init(RtArray *a, DLDataType dt, int ndim, const int64_t *shape) {
  CHECK(ndim >= 0 && ndim <= RT_NPY_MAXDIMS && rt_dtype_size(dt) > 0);
  memset(a, 0, sizeof *a);
  a->dtype = dt;
  a->ndim = ndim;
  for (int d = 0; d < ndim; d++) a->shape[d] = shape[d];
  size_t bytes = (size_t)rt_array_count(a) * (size_t)rt_dtype_size(dt);
  a->data = base_alloc(bytes ? bytes : 1);
}

void rt_array_free(RtArray *a) {
  base_free(a->data);
  memset(a, 0, sizeof *a);
}

DLTensor rt_array_tensor(RtArray *a) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = a->data;
  t.device.device_type = kDLCPU;
  t.ndim = a->ndim;
  t.dtype = a->dtype;
  t.shape = a->shape;
  return t;
}

double rt_array_get(const RtArray *a, int64_t i) {
  return rt_elem_get((const char *)a->data + i * rt_dtype_size(a->dtype), a->dtype);
}

void rt_array_set(RtArray *a, int64_t i, double v) {
  rt_elem_set((char *)a->data + i * rt_dtype_size(a->dtype), a->dtype, v);
}

/* ---- the header dict ----------------------------------------------------- */

/* A cursor over the header text. */
typedef struct Hdr {
  const char *p, *end;
} Hdr;

static void skip_ws(Hdr *h) {
  while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
    h->p++;
}

static bool eat(Hdr *h, char c) {
  skip_ws(h);
  if (h->p < h->end && *h->p == c) {
    h->p++;
    return true;
  }
  return false;
}

/* A quoted Python string into out (at most cap-1 bytes). */
static bool str_lit(Hdr *h, char *out, size_t cap) {
  skip_ws(h);
  if (h->p >= h->end || (*h->p != '\'' && *h->p != '"')) return false;
  char q = *h->p++;
  size_t n = 0;
  while (h->p < h->end && *h->p != q) {
    if (n + 1 >= cap) return false;
    out[n++] = *h->p++;
  }
  if (h->p >= h->end) return false;
  h->p++;
  out[n] = 0;
  return true;
}

static bool word(Hdr *h, const char *w) {
  skip_ws(h);
  size_t n = strlen(w);
  if ((size_t)(h->end - h->p) >= n && !memcmp(h->p, w, n)) {
    h->p += n;
    return true;
  }
  return false;
}

/* A tuple of non-negative ints: (), (3,), (2, 3). */
static bool shape_lit(Hdr *h, RtArray *a) {
  if (!eat(h, '(')) return false;
  a->ndim = 0;
  while (!eat(h, ')')) {
    skip_ws(h);
    if (h->p >= h->end || *h->p < '0' || *h->p > '9' || a->ndim == RT_NPY_MAXDIMS) return false;
    int64_t v = 0;
    while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
      if (v > (INT64_MAX - 9) / 10) return false;
      v = v * 10 + (*h->p++ - '0');
    }
    if (h->p < h->end && *h->p == 'L') h->p++; /* Python 2 longs */
    a->shape[a->ndim++] = v;
    if (!eat(h, ',')) {
      if (!eat(h, ')')) return false;
      break;
    }
  }
  return true;
}

/* The element type of a descr string; false if we do not read it. */
static bool descr_type(const char *s, DLDataType *t, bool *bigendian) {
  static const struct { const char *name; uint8_t code, bits; } types[] = {
      {"f2", kDLFloat, 16}, {"f4", kDLFloat, 32}, {"f8", kDLFloat, 64}, {"i4", kDLInt, 32},
      {"i8", kDLInt, 64},   {"b1", kDLBool, 8},   {"u1", kDLUInt, 8},
  };
  *bigendian = s[0] == '>';
  if (s[0] != '<' && s[0] != '|' && s[0] != '=' && s[0] != '>') return false;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (!strcmp(s + 1, types[i].name)) {
      *t = rt_dtype(types[i].code, types[i].bits);
      return true;
    }
  return false;
}

static flex_status parse_header(const char *name, Hdr *h, RtArray *a) {
  bool have_descr = false, have_order = false, have_shape = false, fortran = false;
  char key[64], descr[64];
  if (!eat(h, '{')) return rt_err(FLEX_ERR_INVALID, "%s: bad .npy header: expected a dict", name);
  while (!eat(h, '}')) {
    if (!str_lit(h, key, sizeof key) || !eat(h, ':'))
      return rt_err(FLEX_ERR_INVALID, "%s: bad .npy header: expected 'key': value", name);
    if (!strcmp(key, "descr")) {
      bool big = false;
      if (!str_lit(h, descr, sizeof descr))
        return rt_err(FLEX_ERR_INVALID, "%s: bad .npy header: descr is not a string", name);
      if (!descr_type(descr, &a->dtype, &big))
        return rt_err(FLEX_ERR_INVALID, "%s: unsupported dtype '%s' (expected <f2 <f4 <f8 <i4 <i8 |b1 |u1)",
                    name, descr);
      if (big && a->dtype.bits > 8)
        return rt_err(FLEX_ERR_INVALID, "%s: big-endian data ('%s') is not supported", name, descr);
      have_descr = true;
    } else if (!strcmp(key, "fortran_order")) {
      if (word(h, "True")) fortran = true;
      else if (!word(h, "False"))
        return rt_err(FLEX_ERR_INVALID, "%s: bad .npy header: fortran_order is not True/False", name);
      have_order = true;
    } else if (!strcmp(key, "shape")) {
      if (!shape_lit(h, a))
        return rt_err(FLEX_ERR_INVALID, "%s: bad .npy header: shape is not a tuple of at most %d sizes",
                    name, RT_NPY_MAXDIMS);
      have_shape = true;
    } else {
      return rt_err(FLEX_ERR_INVALID, "%s: bad .npy header: unknown key '%s'", name, key);
    }
    if (!eat(h, ',')) {
      if (!eat(h, '}')) return rt_err(FLEX_ERR_INVALID, "%s: bad .npy header: expected ',' or '}'", name);
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape)
    return rt_err(FLEX_ERR_INVALID, "%s: bad .npy header: it needs descr, fortran_order and shape", name);
  if (fortran)
    return rt_err(FLEX_ERR_INVALID, "%s: Fortran-order arrays are not supported (save a C-order copy)",
                name);
  return 0;
}

flex_status rt_npy_parse(const char *name, const void *bytes, size_t len, RtArray *out) {
  const unsigned char *b = bytes;
  memset(out, 0, sizeof *out);
  if (len < 10 || memcmp(b, "\x93NUMPY", 6))
    return rt_err(FLEX_ERR_INVALID, "%s: not a .npy file (bad magic)", name);
  int major = b[6];
  size_t hlen, start;
  if (major == 1) {
    hlen = (size_t)b[8] | (size_t)b[9] << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (len < 12) return rt_err(FLEX_ERR_INVALID, "%s: truncated .npy header", name);
    hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    start = 12;
  } else {
    return rt_err(FLEX_ERR_INVALID, "%s: unsupported .npy format version %d", name, major);
  }
  if (hlen > len - start) return rt_err(FLEX_ERR_INVALID, "%s: truncated .npy header", name);
  Hdr h = {(const char *)b + start, (const char *)b + start + hlen};
  RtArray a;
  memset(&a, 0, sizeof a);
  flex_status hst = parse_header(name, &h, &a);
  if (hst) return hst;
  int esize = rt_dtype_size(a.dtype);
  uint64_t count = 1;
  for (int d = 0; d < a.ndim; d++) {
    if (a.shape[d] && count > (UINT64_MAX / 16) / (uint64_t)a.shape[d])
      return rt_err(FLEX_ERR_INVALID, "%s: shape is too large", name);
    count *= (uint64_t)a.shape[d];
  }
  if (count > (uint64_t)INT64_MAX / 16) return rt_err(FLEX_ERR_INVALID, "%s: shape is too large", name);
  uint64_t need = count * (uint64_t)esize, have = len - start - hlen;
  if (have < need)
    return rt_err(FLEX_ERR_INVALID, "%s: truncated data: the shape needs %llu bytes, the file has %llu",
                name, (unsigned long long)need, (unsigned long long)have);
  if (have > need)
    return rt_err(FLEX_ERR_INVALID, "%s: %llu unexpected bytes after the data", name,
                (unsigned long long)(have - need));
  rt_array_init(out, a.dtype, a.ndim, a.shape);
  memcpy(out->data, b + start + hlen, (size_t)need);
  return 0;
}

flex_status rt_npy_read(const char *path, RtArray *out) {
  char *text;
  size_t len;
  memset(out, 0, sizeof *out);
  int e = base_read_file(path, &text, &len);
  if (e) return rt_err(FLEX_ERR_INVALID, "%s: cannot read: %s", path, strerror(e));
  int r = rt_npy_parse(path, text, len, out);
  base_free(text);
  return r;
}

static const char *descr_of(DLDataType t) {
  if (t.code == kDLFloat) return t.bits == 16 ? "<f2" : t.bits == 32 ? "<f4" : "<f8";
  if (t.code == kDLInt) return t.bits == 32 ? "<i4" : "<i8";
  if (t.code == kDLUInt) return "|u1";
  return "|b1";
}

flex_status rt_npy_write(const char *path, const RtArray *a) {
  bool ok = rt_dtype_size(a->dtype) && a->dtype.code != kDLBfloat &&
            !(a->dtype.code == kDLInt && a->dtype.bits < 32);
  if (!ok) return rt_err(FLEX_ERR_INVALID, "%s: cannot write %s as .npy", path, rt_dtype_name(a->dtype));
  Buf h = {0};
  buf_printf(&h, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr_of(a->dtype));
  for (int d = 0; d < a->ndim; d++)
    buf_printf(&h, "%lld%s", (long long)a->shape[d], a->ndim == 1 ? "," : d + 1 < a->ndim ? ", " : "");
  buf_puts(&h, "), }");
  while ((10 + h.len + 1) % 64) buf_puts(&h, " "); /* align the data to 64 bytes */
  buf_puts(&h, "\n");
  FILE *f = fopen(path, "wb");
  if (!f) {
    buf_free(&h);
    return rt_err(FLEX_ERR_INVALID, "%s: cannot write: %s", path, strerror(errno));
  }
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                           (unsigned char)(h.len & 0xff), (unsigned char)(h.len >> 8)};
  size_t bytes = (size_t)rt_array_count(a) * (size_t)rt_dtype_size(a->dtype);
  bool wrote = fwrite(pre, 1, 10, f) == 10 && fwrite(h.data, 1, h.len, f) == h.len &&
               fwrite(a->data, 1, bytes, f) == bytes;
  wrote = (fclose(f) == 0) && wrote;
  buf_free(&h);
  if (!wrote) return rt_err(FLEX_ERR_INVALID, "%s: write failed", path);
  return 0;
}
