/* npy.c: NumPy .npy read and write, and 16-bit float rounding.
 *
 * File layout: "\x93NUMPY", major, minor, a header length (u16 for v1, u32
 * for v2 and v3), a Python dict literal padded with spaces and a newline,
 * then the raw elements. We parse the dict ourselves (keys descr,
 * fortran_order, shape) and refuse anything we cannot read exactly.
 */
#include "npy.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "ir/ir.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

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

/* ---- 16-bit floats ----------------------------------------------------- */

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
  const char *p = (const char *)a->data + i * rt_dtype_size(a->dtype);
  union { float f; double d; int8_t i8; int16_t i16; int32_t i32; int64_t i64; uint16_t u16; } u;
  memcpy(&u, p, (size_t)rt_dtype_size(a->dtype));
  switch (a->dtype.code) {
  case kDLFloat:
    return a->dtype.bits == 16 ? ir_half_to_double(u.u16) : a->dtype.bits == 32 ? u.f : u.d;
  case kDLBfloat: return ir_bf16_to_double(u.u16);
  case kDLInt:
    return a->dtype.bits == 8 ? u.i8 : a->dtype.bits == 16 ? u.i16
         : a->dtype.bits == 32 ? u.i32 : (double)u.i64;
  case kDLUInt: return (uint8_t)*p;
  case kDLBool: return *p != 0;
  }
  PANIC("rt_array_get: bad dtype");
}

void rt_array_set(RtArray *a, int64_t i, double v) {
  char *p = (char *)a->data + i * rt_dtype_size(a->dtype);
  union { float f; double d; int8_t i8; int16_t i16; int32_t i32; int64_t i64; uint16_t u16; uint8_t u8; } u;
  switch (a->dtype.code) {
  case kDLFloat:
    if (a->dtype.bits == 16) u.u16 = rt_half_from_double(v);
    else if (a->dtype.bits == 32) u.f = (float)v;
    else u.d = v;
    break;
  case kDLBfloat: u.u16 = rt_bf16_from_double(v); break;
  case kDLInt:
    if (a->dtype.bits == 8) u.i8 = (int8_t)v;
    else if (a->dtype.bits == 16) u.i16 = (int16_t)v;
    else if (a->dtype.bits == 32) u.i32 = (int32_t)v;
    else u.i64 = (int64_t)v;
    break;
  case kDLUInt: u.u8 = (uint8_t)v; break;
  case kDLBool: u.u8 = v != 0; break;
  default: PANIC("rt_array_set: bad dtype");
  }
  memcpy(p, &u, (size_t)rt_dtype_size(a->dtype));
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

static int parse_header(const char *name, Hdr *h, RtArray *a, char *err, size_t errlen) {
  bool have_descr = false, have_order = false, have_shape = false, fortran = false;
  char key[64], descr[64];
  if (!eat(h, '{')) return fail(err, errlen, "%s: bad .npy header: expected a dict", name);
  while (!eat(h, '}')) {
    if (!str_lit(h, key, sizeof key) || !eat(h, ':'))
      return fail(err, errlen, "%s: bad .npy header: expected 'key': value", name);
    if (!strcmp(key, "descr")) {
      bool big = false;
      if (!str_lit(h, descr, sizeof descr))
        return fail(err, errlen, "%s: bad .npy header: descr is not a string", name);
      if (!descr_type(descr, &a->dtype, &big))
        return fail(err, errlen, "%s: unsupported dtype '%s' (expected <f2 <f4 <f8 <i4 <i8 |b1 |u1)",
                    name, descr);
      if (big && a->dtype.bits > 8)
        return fail(err, errlen, "%s: big-endian data ('%s') is not supported", name, descr);
      have_descr = true;
    } else if (!strcmp(key, "fortran_order")) {
      if (word(h, "True")) fortran = true;
      else if (!word(h, "False"))
        return fail(err, errlen, "%s: bad .npy header: fortran_order is not True/False", name);
      have_order = true;
    } else if (!strcmp(key, "shape")) {
      if (!shape_lit(h, a))
        return fail(err, errlen, "%s: bad .npy header: shape is not a tuple of at most %d sizes",
                    name, RT_NPY_MAXDIMS);
      have_shape = true;
    } else {
      return fail(err, errlen, "%s: bad .npy header: unknown key '%s'", name, key);
    }
    if (!eat(h, ',')) {
      if (!eat(h, '}')) return fail(err, errlen, "%s: bad .npy header: expected ',' or '}'", name);
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape)
    return fail(err, errlen, "%s: bad .npy header: it needs descr, fortran_order and shape", name);
  if (fortran)
    return fail(err, errlen, "%s: Fortran-order arrays are not supported (save a C-order copy)",
                name);
  return 0;
}

int rt_npy_parse(const char *name, const void *bytes, size_t len, RtArray *out, char *err,
                 size_t errlen) {
  const unsigned char *b = bytes;
  memset(out, 0, sizeof *out);
  if (len < 10 || memcmp(b, "\x93NUMPY", 6))
    return fail(err, errlen, "%s: not a .npy file (bad magic)", name);
  int major = b[6];
  size_t hlen, start;
  if (major == 1) {
    hlen = (size_t)b[8] | (size_t)b[9] << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (len < 12) return fail(err, errlen, "%s: truncated .npy header", name);
    hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    start = 12;
  } else {
    return fail(err, errlen, "%s: unsupported .npy format version %d", name, major);
  }
  if (hlen > len - start) return fail(err, errlen, "%s: truncated .npy header", name);
  Hdr h = {(const char *)b + start, (const char *)b + start + hlen};
  RtArray a;
  memset(&a, 0, sizeof a);
  if (parse_header(name, &h, &a, err, errlen)) return -1;
  int esize = rt_dtype_size(a.dtype);
  uint64_t count = 1;
  for (int d = 0; d < a.ndim; d++) {
    if (a.shape[d] && count > (UINT64_MAX / 16) / (uint64_t)a.shape[d])
      return fail(err, errlen, "%s: shape is too large", name);
    count *= (uint64_t)a.shape[d];
  }
  if (count > (uint64_t)INT64_MAX / 16) return fail(err, errlen, "%s: shape is too large", name);
  uint64_t need = count * (uint64_t)esize, have = len - start - hlen;
  if (have < need)
    return fail(err, errlen, "%s: truncated data: the shape needs %llu bytes, the file has %llu",
                name, (unsigned long long)need, (unsigned long long)have);
  if (have > need)
    return fail(err, errlen, "%s: %llu unexpected bytes after the data", name,
                (unsigned long long)(have - need));
  rt_array_init(out, a.dtype, a.ndim, a.shape);
  memcpy(out->data, b + start + hlen, (size_t)need);
  return 0;
}

int rt_npy_read(const char *path, RtArray *out, char *err, size_t errlen) {
  char *text;
  size_t len;
  memset(out, 0, sizeof *out);
  int e = base_read_file(path, &text, &len);
  if (e) return fail(err, errlen, "%s: cannot read: %s", path, strerror(e));
  int r = rt_npy_parse(path, text, len, out, err, errlen);
  base_free(text);
  return r;
}

static const char *descr_of(DLDataType t) {
  if (t.code == kDLFloat) return t.bits == 16 ? "<f2" : t.bits == 32 ? "<f4" : "<f8";
  if (t.code == kDLInt) return t.bits == 32 ? "<i4" : "<i8";
  if (t.code == kDLUInt) return "|u1";
  return "|b1";
}

int rt_npy_write(const char *path, const RtArray *a, char *err, size_t errlen) {
  bool ok = rt_dtype_size(a->dtype) && a->dtype.code != kDLBfloat &&
            !(a->dtype.code == kDLInt && a->dtype.bits < 32);
  if (!ok) return fail(err, errlen, "%s: cannot write %s as .npy", path, rt_dtype_name(a->dtype));
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
    return fail(err, errlen, "%s: cannot write: %s", path, strerror(errno));
  }
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                           (unsigned char)(h.len & 0xff), (unsigned char)(h.len >> 8)};
  size_t bytes = (size_t)rt_array_count(a) * (size_t)rt_dtype_size(a->dtype);
  bool wrote = fwrite(pre, 1, 10, f) == 10 && fwrite(h.data, 1, h.len, f) == h.len &&
               fwrite(a->data, 1, bytes, f) == bytes;
  wrote = (fclose(f) == 0) && wrote;
  buf_free(&h);
  if (!wrote) return fail(err, errlen, "%s: write failed", path);
  return 0;
}
