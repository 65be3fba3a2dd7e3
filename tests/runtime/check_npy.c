/* .npy read/write: round trips of every dtype and version, every malformed
 * file refused with a message naming it, and no crash on any truncation. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/npy.h"
#include "testlib.h"

static const char *tmp_path(const char *name) {
  static char buf[4][512];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, sizeof buf[0], "/tmp/flexc_npy_%d_%s", (int)getpid(), name);
  return p;
}

START_TEST(round_trips) {
  uint64_t seed = tl_seed();
  DLDataType types[] = {rt_dtype(kDLFloat, 64), rt_dtype(kDLFloat, 32), rt_dtype(kDLFloat, 16),
                        rt_dtype(kDLInt, 32),   rt_dtype(kDLInt, 64),   rt_dtype(kDLUInt, 8),
                        rt_dtype(kDLBool, 8)};
  int64_t shapes[][3] = {{3, 5, 2}, {1, 1, 1}, {0, 4, 2}, {7, 1, 3}};
  int ndims[] = {3, 1, 3, 2};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
    for (int s = 0; s < 4; s++) {
      RtArray a, b;
      rt_array_init(&a, types[t], ndims[s], shapes[s]);
      for (int64_t i = 0; i < rt_array_count(&a); i++) {
        double x = types[t].code == kDLFloat ? tl_normal(&seed) * 10
                                              : (double)(tl_rand(&seed) % 200) - (types[t].code == kDLInt ? 100 : 0);
        rt_array_set(&a, i, types[t].code == kDLBool ? (double)(tl_rand(&seed) & 1) : x);
      }
      const char *path = tmp_path("rt.npy");
      ck_assert_msg(rt_npy_write(path, &a) == 0, "%s", flex_last_error());
      ck_assert_msg(rt_npy_read(path, &b) == 0, "%s", flex_last_error());
      ck_assert_int_eq(b.ndim, a.ndim);
      ck_assert(!memcmp(&a.dtype, &b.dtype, sizeof a.dtype));
      for (int d = 0; d < a.ndim; d++) ck_assert_int_eq(a.shape[d], b.shape[d]);
      size_t bytes = (size_t)rt_array_count(&a) * (size_t)rt_dtype_size(a.dtype);
      ck_assert(!memcmp(a.data, b.data, bytes));
      rt_array_free(&a);
      rt_array_free(&b);
      unlink(path);
    }
}
END_TEST

/* Build a file by hand: version, header dict, payload bytes. */
static size_t build(unsigned char *out, int major, const char *dict, size_t payload) {
  size_t hlen = strlen(dict), pre = major == 1 ? 10 : 12;
  memcpy(out, "\x93NUMPY", 6);
  out[6] = (unsigned char)major;
  out[7] = 0;
  if (major == 1) {
    out[8] = (unsigned char)hlen;
    out[9] = (unsigned char)(hlen >> 8);
  } else {
    for (int i = 0; i < 4; i++) out[8 + i] = (unsigned char)(hlen >> (8 * i));
  }
  memcpy(out + pre, dict, hlen);
  for (size_t i = 0; i < payload; i++) out[pre + hlen + i] = (unsigned char)(i * 7);
  return pre + hlen + payload;
}

START_TEST(versions_2_and_3) {
  unsigned char buf[512];
  for (int major = 1; major <= 3; major++) {
    size_t n = build(buf, major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24);
    RtArray a;
    ck_assert_msg(rt_npy_parse("v.npy", buf, n, &a) == 0, "%s", flex_last_error());
    ck_assert_int_eq(a.ndim, 2);
    ck_assert_int_eq(a.shape[1], 3);
    rt_array_free(&a);
  }
  /* A 0-d array and a 1-tuple. */
  size_t n = build(buf, 1, "{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": ()}", 8);
  RtArray a;
  ck_assert_msg(rt_npy_parse("s.npy", buf, n, &a) == 0, "%s", flex_last_error());
  ck_assert_int_eq(a.ndim, 0);
  rt_array_free(&a);
}
END_TEST

START_TEST(malformed_files) {
  struct { int major; const char *dict; size_t payload; const char *want; } bad[] = {
      {1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8, "Fortran"},
      {1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, "big-endian"},
      {1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16, "unsupported dtype"},
      {1, "{'descr': '<U3', 'fortran_order': False, 'shape': (2,), }", 24, "unsupported dtype"},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 8, "truncated"},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 8, "after the data"},
      {1, "{'descr': '<f4', 'fortran_order': False, }", 0, "needs descr"},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1), }", 8, "shape"},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }", 8, "too large"},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, "shape"},
      {1, "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,), }", 4, "fortran_order"},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", 4, "unknown key"},
      {1, "['descr']", 0, "expected a dict"},
      {4, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4, "version 4"},
  };
  unsigned char buf[1024];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t n = build(buf, bad[i].major, bad[i].dict, bad[i].payload);
    RtArray a;
    ck_assert_int_eq(rt_npy_parse("bad.npy", buf, n, &a), FLEX_ERR_INVALID);
    ck_assert_msg(strstr(flex_last_error(), "bad.npy") && strstr(flex_last_error(), bad[i].want), "case %zu: %s", i, flex_last_error());
  }
  /* Bad magic, a header longer than the file, a missing file. */
  RtArray a;
  ck_assert_int_eq(rt_npy_parse("m.npy", "\x93NUMPX\x01\x00\x00\x00", 10, &a), FLEX_ERR_INVALID);
  ck_assert(strstr(flex_last_error(), "m.npy") && strstr(flex_last_error(), "magic"));
  size_t n = build(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  buf[8] = 0xff;
  ck_assert_int_eq(rt_npy_parse("h.npy", buf, n, &a), FLEX_ERR_INVALID);
  ck_assert(strstr(flex_last_error(), "h.npy") && strstr(flex_last_error(), "truncated"));
  ck_assert_int_eq(rt_npy_read(tmp_path("missing.npy"), &a), FLEX_ERR_INVALID);
  ck_assert(strstr(flex_last_error(), "missing.npy") && strstr(flex_last_error(), "cannot read"));
}
END_TEST

START_TEST(every_truncation_and_corruption) {
  /* Every prefix of a valid file, and random byte flips: an error or a
   * valid array, never a crash. */
  unsigned char buf[512], tmp[512];
  size_t n = build(buf, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2), }\n", 48);
  RtArray a;
  for (size_t len = 0; len < n; len++)
    ck_assert_int_eq(rt_npy_parse("t.npy", buf, len, &a), FLEX_ERR_INVALID);
  uint64_t seed = tl_seed() + 11;
  for (int rep = 0; rep < 2000; rep++) {
    memcpy(tmp, buf, n);
    for (int k = 0; k < 3; k++) tmp[tl_rand(&seed) % n] = (unsigned char)tl_rand(&seed);
    if (rt_npy_parse("c.npy", tmp, n, &a) == 0) rt_array_free(&a);
  }
}
END_TEST

START_TEST(half_rounding) {
  ck_assert_uint_eq(rt_half_from_double(1.0), 0x3c00);
  ck_assert_uint_eq(rt_half_from_double(-2.0), 0xc000);
  ck_assert_uint_eq(rt_half_from_double(65504.0), 0x7bff);
  ck_assert_uint_eq(rt_half_from_double(65520.0), 0x7c00);
  ck_assert_uint_eq(rt_half_from_double(ldexp(1, -24)), 0x0001);
  ck_assert_uint_eq(rt_half_from_double(1.0 + ldexp(1, -11)), 0x3c00); /* tie to even */
  ck_assert_uint_eq(rt_half_from_double(1.0 + 3 * ldexp(1, -11)), 0x3c02);
  ck_assert_uint_eq(rt_bf16_from_double(1.0), 0x3f80);
  ck_assert_uint_eq(rt_bf16_from_double(-3.0), 0xc040);
  /* Every finite half round-trips through its decoded value. */
  RtArray a;
  int64_t shape[1] = {1};
  rt_array_init(&a, rt_dtype(kDLFloat, 16), 1, shape);
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00) continue;
    uint16_t bits = (uint16_t)h;
    memcpy(a.data, &bits, 2);
    double v = rt_array_get(&a, 0);
    ck_assert_msg(rt_half_from_double(v) == h || (v == 0 && (h & 0x7fff) == 0), "half %04x", h);
  }
  rt_array_free(&a);
}
END_TEST

int main(void) {
  return TL_MAIN("npy", 0, TL_TEST(round_trips), TL_TEST(versions_2_and_3), TL_TEST(malformed_files),
                 TL_TEST(every_truncation_and_corruption), TL_TEST(half_rounding));
}
