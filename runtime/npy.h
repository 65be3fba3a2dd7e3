/* npy.h: NumPy .npy arrays (format versions 1, 2 and 3), for `flexc run`,
 * `flexc mask` and the tests.
 *
 * Only what attention needs: C order, little-endian, dtypes <f2 <f4 <f8 <i4
 * <i8 |b1 |u1. Anything else is refused with a message naming the file.
 */
#ifndef FLEXC_NPY_H
#define FLEXC_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/flex.h"
#include "runtime/tensor.h"

#define RT_NPY_MAXDIMS 8

/* A dense, C-order, host array. */
typedef struct RtArray {
  DLDataType dtype;              /* element type (lanes 1) */
  int ndim;                      /* rank, 0..RT_NPY_MAXDIMS */
  int64_t shape[RT_NPY_MAXDIMS]; /* extents */
  void *data;                    /* elements (base_alloc; rt_npy_free releases) */
} RtArray;

/* Read a .npy file into *out. FLEX_OK, or FLEX_ERR_INVALID with the message set (rt_err). */
flex_status rt_npy_read(const char *path, RtArray *out);
/* Parse .npy bytes (name is used in messages). Same contract as rt_npy_read. */
flex_status rt_npy_parse(const char *name, const void *bytes, size_t len, RtArray *out);
/* Write an array (any of the readable dtypes). FLEX_OK, or FLEX_ERR_INVALID with the message set. */
flex_status rt_npy_write(const char *path, const RtArray *a);

/* Allocate a zeroed array of the given type and shape (data may be empty). */
void rt_array_init(RtArray *a, DLDataType dt, int ndim, const int64_t *shape);
void rt_array_free(RtArray *a);
int64_t rt_array_count(const RtArray *a);     /* number of elements */
/* A DLTensor view of the array on the host (compact strides). */
DLTensor rt_array_tensor(RtArray *a);
/* Element i as binary64 (any dtype) / store v into element i (rounding to
 * the element type; ints truncate toward zero). */
double rt_array_get(const RtArray *a, int64_t i);
void rt_array_set(RtArray *a, int64_t i, double v);

#endif
