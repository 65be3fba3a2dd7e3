/* testlib_view.c: tensors with odd layouts inside guarded allocations
 * (testlib.h, TlView), for the tests that call the library the way a
 * caller may: any strides (unit last dim), any dim order in memory, gaps
 * between rows and heads, a data pointer or byte_offset off alignment.
 * Every byte of the allocation that is not an element holds 0xff (NaN in
 * every float dtype, so a read of a gap poisons a result) and must still
 * hold it after a call; an input's elements must be unchanged too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/tensor.h"
#include "testlib.h"

enum { GUARD = 64 }; /* bytes before and after the span */

/* The first element's address. */
static unsigned char *elem_base(const TlView *v) { return (unsigned char *)v->t.data + v->t.byte_offset; }

/* Element offset (in elements) of row-major element i. */
static int64_t elem_offset(const TlView *v, int64_t i) {
  int64_t off = 0;
  for (int d = v->t.ndim - 1; d >= 0; d--) {
    int64_t n = v->shape[d];
    off += (n ? i % n : 0) * v->strides[d];
    i = n ? i / n : 0;
  }
  return off;
}

void tl_view_init(TlView *v, DLDataType dt, int nd, const int64_t *shape, bool odd, uint64_t *rng) {
  memset(v, 0, sizeof *v);
  int es = rt_dtype_size(dt);
  int64_t n = 1;
  for (int d = 0; d < nd; d++) v->shape[d] = shape[d], n *= shape[d];
  /* Memory order: the last dim innermost with unit stride; the others in
   * a random order when odd, each padded by 0..3 extents. */
  int order[TL_VIEW_MAXDIMS];
  for (int d = 0; d < nd; d++) order[d] = d;
  if (odd)
    for (int d = nd - 2; d > 0; d--) { /* Fisher-Yates over dims 0 .. nd-2 */
      int j = (int)(tl_rand(rng) % (uint64_t)(d + 1)), t = order[d];
      order[d] = order[j], order[j] = t;
    }
  int64_t pitch = 1;
  for (int k = nd - 1; k >= 0; k--) {
    int d = k == nd - 1 ? nd - 1 : order[k];
    v->strides[d] = pitch;
    int64_t pad = odd && tl_rand(rng) % 2 ? (int64_t)(tl_rand(rng) % 4) : 0;
    pitch *= shape[d] + pad;
    if (d == nd - 1 && nd > 1 && odd && tl_rand(rng) % 3 == 0) pitch += 1; /* rows one element apart */
  }
  int64_t span = 0; /* elements from the first to one past the last */
  for (int d = 0; d < nd && n; d++) span += (shape[d] - 1) * v->strides[d];
  span = n ? span + 1 : 0;
  int shift = odd ? (int)(tl_rand(rng) % 3) : 0;   /* elements the data pointer is off */
  int boff = odd ? (int)(tl_rand(rng) % 3) : 0;    /* elements in byte_offset */
  v->bytes = (size_t)GUARD * 2 + (size_t)(span + shift + boff) * (size_t)es;
  v->mem = aligned_alloc(64, (v->bytes + 63) / 64 * 64);
  ck_assert_ptr_nonnull(v->mem);
  memset(v->mem, 0xff, v->bytes);
  v->t.data = v->mem + GUARD + (size_t)shift * (size_t)es;
  v->t.device = (DLDevice){kDLCPU, 0};
  v->t.ndim = nd;
  v->t.dtype = dt;
  v->t.shape = v->shape;
  v->t.strides = v->strides;
  v->t.byte_offset = (uint64_t)boff * (uint64_t)es;
  /* which bytes are elements */
  v->elem = calloc(v->bytes, 1);
  ck_assert_ptr_nonnull(v->elem);
  for (int64_t i = 0; i < n; i++) {
    size_t at = (size_t)(elem_base(v) - v->mem) + (size_t)elem_offset(v, i) * (size_t)es;
    memset(v->elem + at, 1, (size_t)es);
  }
}

void tl_view_free(TlView *v) {
  free(v->mem);
  free(v->elem);
  memset(v, 0, sizeof *v);
}

int64_t tl_view_count(const TlView *v) {
  int64_t n = 1;
  for (int d = 0; d < v->t.ndim; d++) n *= v->shape[d];
  return n;
}

void tl_view_put(TlView *v, const RtArray *src) {
  int es = rt_dtype_size(v->t.dtype);
  for (int64_t i = 0; i < rt_array_count(src); i++)
    rt_elem_set(elem_base(v) + elem_offset(v, i) * es, v->t.dtype, rt_array_get(src, i));
}

void tl_view_get(const TlView *v, RtArray *dst) {
  int64_t shape[TL_VIEW_MAXDIMS];
  memcpy(shape, v->shape, sizeof shape);
  rt_array_init(dst, rt_dtype(kDLFloat, 64), v->t.ndim, shape);
  int es = rt_dtype_size(v->t.dtype);
  for (int64_t i = 0; i < rt_array_count(dst); i++)
    rt_array_set(dst, i, rt_elem_get(elem_base(v) + elem_offset(v, i) * es, v->t.dtype));
}

void tl_view_poison(TlView *v) {
  int es = rt_dtype_size(v->t.dtype);
  for (int64_t i = 0; i < tl_view_count(v); i++)
    memset(elem_base(v) + elem_offset(v, i) * es, 0xff, (size_t)es);
}

int64_t tl_view_guards(const TlView *v, const char *name) {
  int64_t bad = 0;
  for (size_t i = 0; i < v->bytes; i++)
    if (!v->elem[i] && v->mem[i] != 0xff && bad++ == 0)
      fprintf(stderr, "    %s: byte %lld of its allocation (not an element; the first element at %lld) was "
              "written: 0x%02x\n", name, (long long)i - GUARD, (long long)(elem_base(v) - v->mem) - GUARD,
              v->mem[i]);
  return bad;
}

uint64_t tl_view_hash(const TlView *v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < v->bytes; i++) h = (h ^ v->mem[i]) * 0x100000001b3ull;
  return h;
}
