/* api.h: the public door's insides (not public). The entry points of
 * flex.h that pick a backend live here, above every backend; the runtime's
 * core below them never names one.
 *
 *   api.c     backends, flex_forward / flex_backward, sync, device names,
 *             BlockMasks built for a caller
 *   seq.c     calls of several sequences (packed cu_seqlens, paged K/V):
 *             whole-call checks, then one rt_call_one per sequence
 *   tensor.c  tensors on a backend (flex_tensor_*), .npy files, host copies
 *   emit.c    flex_emit: generated CUDA, PTX and cubins (NVRTC)
 *   mirror.c  flex_mirror.h
 */
#ifndef FLEXC_API_H
#define FLEXC_API_H

#include "runtime/backend.h"
#include "runtime/rt.h"

/* The device backend's verbs for b; NULL for the reference (and unknown values). */
const RtBackend *rt_backend_of(flex_backend b);

/* A packed (cu_seqlens) or paged (page_table, kv_lens) call: the whole call
 * checked, then rt_call_one per sequence over views (seq.c). */
flex_status rt_seq_call(const flex_kernel *k, const flex_args *a, bool backward);
/* Rows [start, start + len) of a packed (TOTAL, heads, dim) tensor as the
 * 4-D [1, heads, len, dim] view a call reads (seq.c); columns [start,
 * start + len) of a packed (H, TOTAL_Q) lse as [1, H, len]. */
void rt_view_rows(DLTensor *out, int64_t shape[4], int64_t strides[4], const DLTensor *t,
                  int64_t start, int64_t len);
void rt_view_lse(DLTensor *out, int64_t shape[3], int64_t strides[3], const DLTensor *t,
                 int64_t start, int64_t len);

/* The device backend whose memory holds t (cuda for CUDA devices), or NULL
 * for host memory. */
const RtBackend *rt_memory_of(const DLTensor *t);
/* A compact host copy of t in t's dtype (flex_tensor_free), copied from its
 * device in `stream` order; `name` is for messages. */
flex_status rt_tensor_to_host(DLTensor **out, const DLTensor *t, void *stream, const char *name);

#endif
