/* mirror.c: flex_mirror.h, on flex.h alone. */
#include "runtime/flex_mirror.h"

#include <string.h>

static bool same(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

flex_status flex_mirror_new(flex_mirror *m, flex_backend b, DLTensor *host, DLDataType dtype) {
  memset(m, 0, sizeof *m);
  m->backend = b;
  m->host = host;
  if (b != FLEX_BACKEND_CUDA && same(host->dtype, dtype)) {
    m->dev = host;
    return FLEX_OK;
  }
  flex_status st = flex_tensor_alloc(&m->dev, b, dtype, host->ndim, host->shape, NULL);
  if (!st) st = flex_mirror_push(m, NULL);
  if (st) flex_mirror_free(m);
  return st;
}

flex_status flex_mirror_zeros(flex_mirror *m, flex_backend b, DLDataType host_dtype, int ndim,
                              const int64_t *shape, DLDataType dtype) {
  DLTensor *h;
  memset(m, 0, sizeof *m);
  flex_status st = flex_tensor_alloc(&h, FLEX_BACKEND_REFERENCE, host_dtype, ndim, shape, NULL);
  return st ? st : flex_mirror_new(m, b, h, dtype);
}

flex_status flex_mirror_wrap(flex_mirror *m, flex_backend b, const DLTensor *host, void *stream) {
  memset(m, 0, sizeof *m);
  m->backend = b;
  m->borrowed = true;
  m->host = (DLTensor *)host;
  if (!host || b != FLEX_BACKEND_CUDA) {
    m->dev = m->host;
    return FLEX_OK;
  }
  flex_status st = flex_tensor_alloc(&m->dev, b, host->dtype, host->ndim, host->shape, stream);
  if (!st) st = flex_mirror_push(m, stream);
  if (st) flex_mirror_free(m);
  return st;
}

flex_status flex_mirror_push(flex_mirror *m, void *stream) {
  return m->dev == m->host ? FLEX_OK : flex_tensor_copy(m->dev, m->host, stream);
}

flex_status flex_mirror_pull(flex_mirror *m, void *stream) {
  return m->dev == m->host ? FLEX_OK : flex_tensor_copy(m->host, m->dev, stream);
}

void flex_mirror_free(flex_mirror *m) {
  if (m->dev != m->host) flex_tensor_free(m->dev);
  if (!m->borrowed) flex_tensor_free(m->host);
  memset(m, 0, sizeof *m);
}
