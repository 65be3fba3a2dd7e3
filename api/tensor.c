/* tensor.c: the public tensor helpers of flex.h: memory on a backend
 * (host memory is the runtime's rt_tensor_new), copies with conversion
 * between the host and a device, .npy files. */
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "runtime/npy.h"
#include "runtime/tensor.h"

const RtBackend *rt_memory_of(const DLTensor *t) {
  if (t->device.device_type == kDLCUDA || t->device.device_type == kDLCUDAManaged)
    return &rt_cuda_backend;
  return NULL;
}

flex_status rt_tensor_to_host(DLTensor **out, const DLTensor *t, void *stream, const char *name) {
  *out = NULL;
  RtRun r;
  memset(&r, 0, sizeof r);
  r.stream = stream;
  r.be = rt_memory_of(t);
  return rt_tensor_host_copy(out, t, r.be, &r, name);
}

/* ---- the public helpers ------------------------------------------------------------ */

static flex_status do_tensor_alloc(DLTensor **out, flex_backend b, DLDataType dtype, int ndim,
                              const int64_t *shape, void *stream) {
  if (!out) return rt_err(FLEX_ERR_INVALID, "flex_tensor_alloc: out is NULL");
  *out = NULL;
  if (!flex_backend_name(b)) return rt_err(FLEX_ERR_INVALID, "flex_tensor_alloc: unknown backend %d", (int)b);
  if (b != FLEX_BACKEND_CUDA) return rt_tensor_new(out, dtype, ndim, shape);
  size_t bytes;
  flex_status st = rt_tensor_shell(out, dtype, ndim, shape, &bytes);
  if (st) return st;
  RtRun r;
  memset(&r, 0, sizeof r);
  r.be = &rt_cuda_backend;
  r.stream = stream;
  st = r.be->open(&r);
  if (!st) st = r.be->alloc(&r, &(*out)->data, bytes ? bytes : 4);
  if (st) {
    (*out)->data = NULL;
    rt_tensor_delete(*out);
    *out = NULL;
    return st;
  }
  (*out)->device.device_type = kDLCUDA;
  (*out)->device.device_id = r.device;
  return FLEX_OK;
}

flex_status flex_tensor_alloc(DLTensor **out, flex_backend b, DLDataType dtype, int ndim,
                              const int64_t *shape, void *stream) {
  RT_TRY(do_tensor_alloc(out, b, dtype, ndim, shape, stream));
}

void flex_tensor_free(DLTensor *t) {
  if (!t) return;
  if (t->device.device_type == kDLCUDA) {
    RtRun r;
    memset(&r, 0, sizeof r);
    r.be = &rt_cuda_backend;
    r.be->release(&r, t->data);
    t->data = NULL;
  }
  rt_tensor_delete(t);
}

static flex_status do_tensor_copy(const DLTensor *dst, const DLTensor *src, void *stream) {
  if (!dst || !src) return rt_err(FLEX_ERR_INVALID, "flex_tensor_copy: a tensor is NULL");
  const RtBackend *db = rt_memory_of(dst), *sb = rt_memory_of(src);
  if (db && sb && db != sb) return rt_err(FLEX_ERR_UNSUPPORTED, "flex_tensor_copy: two kinds of device");
  RtRun r;
  memset(&r, 0, sizeof r);
  r.be = db ? db : sb;
  r.stream = stream;
  if (r.be) {
    flex_status st = r.be->open(&r);
    if (st) return st;
  }
  return rt_tensor_copy_on(r.be, &r, dst, src);
}

flex_status flex_tensor_copy(const DLTensor *dst, const DLTensor *src, void *stream) {
  RT_TRY(do_tensor_copy(dst, src, stream));
}

static flex_status do_npy_load(DLTensor **out, const char *path) {
  if (!out || !path) return rt_err(FLEX_ERR_INVALID, "flex_npy_load: NULL argument");
  *out = NULL;
  RtArray a;
  if (rt_npy_read(path, &a)) return FLEX_ERR_INVALID;
  flex_status st = flex_tensor_alloc(out, FLEX_BACKEND_REFERENCE, a.dtype, a.ndim, a.shape, NULL);
  if (!st) memcpy((*out)->data, a.data, (size_t)rt_array_count(&a) * (size_t)rt_dtype_size(a.dtype));
  rt_array_free(&a);
  return st;
}

flex_status flex_npy_load(DLTensor **out, const char *path) {
  RT_TRY(do_npy_load(out, path));
}

static flex_status do_npy_save(const char *path, const DLTensor *t) {
  if (!path || !t) return rt_err(FLEX_ERR_INVALID, "flex_npy_save: NULL argument");
  if (t->ndim < 0 || t->ndim > RT_NPY_MAXDIMS)
    return rt_err(FLEX_ERR_INVALID, "%s: rank %d is not supported (at most %d)", path, t->ndim,
                  RT_NPY_MAXDIMS);
  DLTensor *h;
  flex_status st = rt_tensor_to_host(&h, t, NULL, path);
  if (st) return st;
  RtArray a = {h->dtype, h->ndim, {0}, h->data};
  memcpy(a.shape, h->shape, sizeof *h->shape * (size_t)h->ndim);
  st = rt_npy_write(path, &a);
  flex_tensor_free(h);
  return st;
}

flex_status flex_npy_save(const char *path, const DLTensor *t) {
  RT_TRY(do_npy_save(path, t));
}
