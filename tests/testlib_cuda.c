/* testlib_cuda.c: run a host-tensor attention call on the CUDA backend.
 *
 * The numerical suites build their tensors in host memory for the emulator.
 * tl_cuda_call mirrors every tensor of a flex_args on the device (same
 * shapes and strides), runs the call with the CUDA backend, and copies the
 * outputs back into the host tensors, so the same suites can check the GPU
 * against the float64 reference when there is one. */
#include <string.h>

#include "runtime/driver.h"
#include "runtime/launch.h"
#include "runtime/rt.h"
#include "testlib.h"

/* One mirrored tensor. */
typedef struct Mirror {
  const DLTensor *host; /* the caller's tensor (NULL: none) */
  DLTensor dev;         /* its device twin */
  RtCuDevicePtr ptr;    /* the allocation (0: none) */
  size_t bytes;         /* its size */
} Mirror;

static flex_status mirror(Mirror *m, const DLTensor *t, RtCuStream s) {
  memset(m, 0, sizeof *m);
  m->host = t;
  if (!t) return FLEX_OK;
  m->dev = *t;
  m->dev.device = (DLDevice){kDLCUDA, 0};
  m->dev.byte_offset = 0;
  m->bytes = (size_t)rt_span_bytes(t);
  if (!m->bytes) return FLEX_OK;
  flex_status st = rt_drv_alloc(&m->ptr, m->bytes);
  if (!st) st = rt_drv_memcpy_htod(m->ptr, (const char *)t->data + t->byte_offset, m->bytes, s);
  m->dev.data = (void *)(uintptr_t)m->ptr;
  return st;
}

static flex_status copy_back(const Mirror *m, RtCuStream s) {
  if (!m->host || !m->ptr) return FLEX_OK;
  return rt_drv_memcpy_dtoh((char *)m->host->data + m->host->byte_offset, m->ptr, m->bytes, s);
}

enum { MAXM = 10 + 2 * 16 + 8 };

flex_status tl_cuda_call(flex_kernel *k, const flex_args *host, bool backward) {
  Mirror m[MAXM];
  if (host->nbuffers > 16) return rt_err(FLEX_ERR_INVALID, "tl_cuda_call: at most 16 buffers");
  int n = 0;
  flex_status st = rt_drv_use_device(0); /* current on this thread, before any allocation */
  flex_args a = *host;
  a.backend = FLEX_BACKEND_CUDA;
  RtCuStream s = (RtCuStream)host->stream; /* every copy on the call's stream */
  const DLTensor **slots[10] = {&a.q, &a.k, &a.v, &a.out, &a.lse, &a.dout, &a.dlse, &a.dq, &a.dk, &a.dv};
  for (int i = 0; i < 10 && !st; i++, n++) {
    st = mirror(&m[n], *slots[i], s);
    if (*slots[i]) *slots[i] = &m[n].dev;
  }
  flex_buffer bufs[16];
  for (int i = 0; i < a.nbuffers && !st; i++) {
    bufs[i] = a.buffers[i];
    st = mirror(&m[n], bufs[i].tensor, s);
    if (bufs[i].tensor) bufs[i].tensor = &m[n].dev;
    n++;
    if (!st) st = mirror(&m[n], bufs[i].grad, s);
    if (bufs[i].grad) bufs[i].grad = &m[n].dev;
    n++;
  }
  a.buffers = bufs;
  flex_block_mask bm;
  if (a.block_mask && !st) {
    bm = *a.block_mask;
    const DLTensor **ms[8] = {&bm.kv_num_blocks, &bm.kv_indices, &bm.full_kv_num_blocks,
                              &bm.full_kv_indices, &bm.q_num_blocks, &bm.q_indices,
                              &bm.full_q_num_blocks, &bm.full_q_indices};
    for (int i = 0; i < 8 && !st; i++, n++) {
      st = mirror(&m[n], *ms[i], s);
      if (*ms[i]) *ms[i] = &m[n].dev;
    }
    a.block_mask = &bm;
  }
  if (!st) st = backward ? flex_backward(k, &a) : flex_forward(k, &a);
  if (!st) st = rt_drv_sync(s);
  /* Outputs back: out and lse from a forward; dq, dk, dv and buffer
   * gradients from a backward. */
  if (!st && !backward) {
    st = copy_back(&m[3], s);
    if (!st) st = copy_back(&m[4], s);
  }
  for (int i = 7; !st && backward && i < 10; i++) st = copy_back(&m[i], s);
  for (int i = 0; !st && backward && i < a.nbuffers; i++) st = copy_back(&m[10 + 2 * i + 1], s);
  flex_status done = rt_drv_sync(s); /* the copies back have landed; nothing reads what is freed */
  flex_status keep = st ? st : done;
  for (int i = 0; i < n; i++)
    if (m[i].ptr) rt_drv_free(m[i].ptr);
  return keep;
}
