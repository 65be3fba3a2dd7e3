/* tensor.h: DLPack tensors, one place for what every part of the runtime
 * asks of them: dtypes and their names, element access with conversion,
 * strides, spans, and copies between the host and a backend's memory.
 *
 * The public side (flex_tensor_*, flex_npy_*) is in flex.h; this is the
 * runtime's own.
 */
#ifndef FLEXC_TENSOR_H
#define FLEXC_TENSOR_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/flex.h"

struct RtBackend;
struct RtRun;

/* ---- dtypes ---------------------------------------------------------------- */

DLDataType rt_dtype(uint8_t code, uint8_t bits);
/* Bytes per element; 0 if unsupported (lanes other than 1, odd widths). */
int rt_dtype_size(DLDataType t);
/* "float32", "int64", "bool", ...; "an unsupported dtype" otherwise. */
const char *rt_dtype_name(DLDataType t);
bool rt_dtype_is_float(DLDataType t); /* float16/32/64, bfloat16 */
bool rt_dtype_same(DLDataType a, DLDataType b);

/* Round to nearest even into IEEE binary16 / bfloat16 bits. */
uint16_t rt_half_from_double(double v);
uint16_t rt_bf16_from_double(double v);

/* The element at p as binary64 / store v at p, rounding to the element type
 * (ints truncate toward zero, bool is v != 0). */
double rt_elem_get(const void *p, DLDataType t);
void rt_elem_set(void *p, DLDataType t, double v);

/* ---- layout ----------------------------------------------------------------- */

/* Element stride of dimension d (compact when strides is NULL). */
int64_t rt_stride_of(const DLTensor *t, int d);
/* First element's address (NULL for a NULL tensor). */
char *rt_data_of(const DLTensor *t);
/* Elements of a tensor. */
int64_t rt_numel(const DLTensor *t);
/* Bytes from a validated tensor's first element to the end of its last
 * (non-negative strides; 0 when empty). */
int64_t rt_span_bytes(const DLTensor *t);
/* Row-major with no gaps (extent-1 dims ignored). */
bool rt_contiguous(const DLTensor *t);
/* Element offset of the i-th element in row-major order. */
int64_t rt_offset_of(const DLTensor *t, int64_t i);
/* The tensor lives in host memory (kDLCPU, kDLCUDAHost). */
bool rt_on_host(const DLTensor *t);
/* Both tensors on the same device (type and ordinal). */
bool rt_same_device(const DLTensor *a, const DLTensor *b);

/* Messages: a shape as "[2, 4, 9]" and a device as "cuda:0 (type 2)";
 * both return out. */
char *rt_shape_text(char *out, size_t cap, const int64_t *shape, int n);
char *rt_device_text(char *out, size_t cap, const DLTensor *t);

/* Whole-call checks of the packed and paged layouts (FLEX_ERR_INVALID):
 * `name` present, of rank `ndim` and shape `want` (-1: any dimension);
 * `layout` names the dims ("(TOTAL_Q, H, E)") and `call` the kind of call
 * ("a paged call"). */
flex_status rt_check_layout(const char *name, const DLTensor *t, int ndim, const int64_t *want,
                            const char *layout, const char *call);
/* "NAME: expected q's device D, got D'" unless t is on q's device. */
flex_status rt_check_device(const char *name, const DLTensor *t, const DLTensor *q);

/* ---- copies ------------------------------------------------------------------ */

/* A zero-filled, compact host tensor the runtime owns (flex_tensor_free
 * or rt_tensor_delete frees it); FLEX_ERR_INVALID for a bad rank, dtype or
 * shape, FLEX_ERR_NOMEM when the bytes are not there. */
flex_status rt_tensor_new(DLTensor **out, DLDataType dtype, int ndim, const int64_t *shape);
/* Free what rt_tensor_new (or rt_tensor_shell) made: data with free(). */
void rt_tensor_delete(DLTensor *t);
/* The checks and the struct of rt_tensor_new with no data (NULL) yet, and
 * the bytes it needs: for memory of a backend's own. */
flex_status rt_tensor_shell(DLTensor **out, DLDataType dtype, int ndim, const int64_t *shape,
                            size_t *bytes);
/* A compact host copy of t (rt_tensor_delete), its bytes moved by be's verbs
 * in r's order when t is in device memory; `name` is for messages. */
flex_status rt_tensor_host_copy(DLTensor **out, const DLTensor *t, const struct RtBackend *be,
                                struct RtRun *r, const char *name);
/* Copy src into dst, converting dtypes (floats among floats, ints and bools
 * among themselves); device memory is moved with be's verbs in r's stream
 * (be may be NULL when both are on the host). Returns when dst holds the data. */
flex_status rt_tensor_copy_on(const struct RtBackend *be, struct RtRun *r, const DLTensor *dst,
                              const DLTensor *src);

#endif
