/* npy.h: NumPy .npy arrays (format versions 1, 2 and 3), for `flexc run`,
 * `flexc mask` and the tests.
 *
 * Only what attention needs: C order, little-endian, dtypes <f2 <f4 <f8 <i4
 * <i8 |b1 |u1. Anything else is refused with a message naming the file.
 * Also here: rounding binary64 to the 16-bit float formats, for casting
 * inputs to --dtype.
 */
#ifndef FLEXC_NPY_H
#define FLEXC_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "dlpack.h"

#define RT_NPY_MAXDIMS 8

/* A dense, C-order, host array. */
typedef struct RtArray {
  DLDataType dtype;              /* element type (lanes 1) */
  int ndim;                      /* rank, 0..RT_NPY_MAXDIMS */
  int64_t shape[RT_NPY_MAXDIMS]; /* extents */
  void *data;                    /* elements (base_alloc; rt_npy_free releases) */
} RtArray;

/* Read a .npy file into *out. Returns 0, or -1 with a message in err. */
int rt_npy_read(const char *path, RtArray *out, char *err, size_t errlen);
/* Parse .npy bytes (name is used in messages). Same contract as rt_npy_read. */
int rt_npy_parse(const char *name, const void *bytes, size_t len, RtArray *out, char *err,
                 size_t errlen);
/* Write an array (any of the readable dtypes). Returns 0, or -1 with a message. */
int rt_npy_write(const char *path, const RtArray *a, char *err, size_t errlen);

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

/* Round to nearest even into IEEE binary16 / bfloat16 bits. */
uint16_t rt_half_from_double(double v);
uint16_t rt_bf16_from_double(double v);

/* DLDataType helpers: name ("float32", "int64", "bool", ...) and builders. */
const char *rt_dtype_name(DLDataType t);
DLDataType rt_dtype(uint8_t code, uint8_t bits);
int rt_dtype_size(DLDataType t); /* bytes per element; 0 if unsupported */

#endif
