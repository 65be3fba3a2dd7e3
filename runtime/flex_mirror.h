/* flex_mirror.h: a tensor in two places, written once for every program
 * that fills inputs on the host and runs them on a backend (the flexc
 * command, samples/embed.c, the tests): the host values, and the tensor a
 * call on the backend gets — the same memory on host backends when the
 * dtypes agree, else a copy (device memory on cuda) converted to the
 * backend's dtype. Built on flex.h alone.
 */
#ifndef FLEXC_FLEX_MIRROR_H
#define FLEXC_FLEX_MIRROR_H

#include "flex.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flex_mirror {
  DLTensor *host;       /* host values (owned) */
  DLTensor *dev;        /* what a call gets (owned; == host when shared) */
  flex_backend backend; /* where dev lives */
  bool borrowed;        /* host is the caller's (flex_mirror_wrap): not freed */
} flex_mirror;

/* Mirror a host tensor (ownership passes to m) on backend b in dtype
 * `dtype`, and copy its values there. On failure m is empty and host freed. */
flex_status flex_mirror_new(flex_mirror *m, flex_backend b, DLTensor *host, DLDataType dtype);
/* A zero-filled host tensor of `shape` in host_dtype, mirrored as above. */
flex_status flex_mirror_zeros(flex_mirror *m, flex_backend b, DLDataType host_dtype, int ndim,
                              const int64_t *shape, DLDataType dtype);
/* Mirror a tensor the caller keeps (any strides) on backend b in its own
 * dtype: dev is a compact copy (host itself on host backends). NULL host
 * gives an empty mirror (dev NULL). The copy is ordered on `stream`. */
flex_status flex_mirror_wrap(flex_mirror *m, flex_backend b, const DLTensor *host, void *stream);
/* Copy host -> dev (push) or dev -> host (pull), converting dtypes. */
flex_status flex_mirror_push(flex_mirror *m, void *stream);
flex_status flex_mirror_pull(flex_mirror *m, void *stream);
void flex_mirror_free(flex_mirror *m);

#ifdef __cplusplus
}
#endif
#endif
