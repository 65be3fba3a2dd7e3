/* api.c: the flex.h entry points for calls: backends, flex_forward /
 * flex_backward (a packed or paged call per sequence, api/seq.c; else one
 * call through the runtime: rt_call_one), and BlockMasks built for a
 * caller. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ir/interval.h"
#include "runtime/backend.h"
#include "runtime/blockmask.h"
#include "runtime/rt.h"
#include "runtime/tensor.h"
#include "api/api.h"

const RtBackend *rt_backend_of(flex_backend b) {
  switch (b) {
  case FLEX_BACKEND_EMU: return &rt_emu_backend;
  case FLEX_BACKEND_CUDA: return &rt_cuda_backend;
  case FLEX_BACKEND_CPU: return &rt_cpu_backend;
  case FLEX_BACKEND_REFERENCE: return NULL;
  }
  return NULL;
}

bool flex_backend_available(flex_backend b) {
  switch (b) {
  case FLEX_BACKEND_REFERENCE: return true;
  case FLEX_BACKEND_EMU: return rt_emu_available();
  case FLEX_BACKEND_CUDA: {
    RtRun r;
    memset(&r, 0, sizeof r);
    return rt_cuda_backend.open(&r) == FLEX_OK;
  }
  case FLEX_BACKEND_CPU: return rt_cpu_available();
  }
  rt_err(FLEX_ERR_INVALID, "unknown backend %d", (int)b);
  return false;
}

flex_status flex_sync(flex_backend b, void *stream) {
  if (b != FLEX_BACKEND_CUDA) return flex_backend_name(b) ? FLEX_OK : rt_err(FLEX_ERR_INVALID, "unknown backend %d", (int)b);
  RtRun r;
  memset(&r, 0, sizeof r);
  r.stream = stream;
  flex_status st = rt_cuda_backend.open(&r);
  return st ? st : rt_cuda_backend.sync(&r);
}

flex_status flex_device_name(flex_backend b, char *out, size_t cap) {
  if (!out || !cap) return rt_err(FLEX_ERR_INVALID, "flex_device_name: no room for the name");
  if (b != FLEX_BACKEND_CUDA) {
    snprintf(out, cap, "host CPU");
    return FLEX_OK;
  }
  RtRun r;
  memset(&r, 0, sizeof r);
  flex_status st = rt_cuda_backend.open(&r);
  return st ? st : rt_cuda_device_name(r.device, out, cap);
}

/* ---- calls ------------------------------------------------------------------------ */

/* Validate, then run on the chosen backend. */
static flex_status call(flex_kernel *k, const flex_args *a, bool backward) {
  if (!k) return rt_err(FLEX_ERR_INVALID, "kernel is NULL");
  if (!a) return rt_err(FLEX_ERR_INVALID, "args is NULL");
  if (!flex_backend_name(a->backend))
    return rt_err(FLEX_ERR_INVALID, "unknown backend %d (expected reference, emu, cuda or cpu)",
                  (int)a->backend);
  /* rt_validate says it too; here a packed or paged call says it once, not per sequence */
  if (a->kv_splits < 0)
    return rt_err(FLEX_ERR_INVALID, "kv_splits must be 0 (automatic), 1 (never split) or a "
                  "number of key chunks, got %d", a->kv_splits);
  if (a->page_table || a->kv_lens || a->cu_seqlens_q || a->cu_seqlens_kv)
    return rt_seq_call(k, a, backward);
  return rt_call_one(rt_backend_of(a->backend), k, a, backward, NULL);
}

flex_status flex_forward(flex_kernel *k, const flex_args *a) { RT_TRY(call(k, a, false)); }
flex_status flex_backward(flex_kernel *k, const flex_args *a) { RT_TRY(call(k, a, true)); }

/* ---- block masks ---------------------------------------------------------------------- */

/* A BlockMask the runtime built: the public struct, then its tensors. */
typedef struct OwnedMask {
  flex_block_mask m;
  DLTensor *t[8];
} OwnedMask;

/* An int32 host tensor holding n values of src. */
static flex_status int_tensor(DLTensor **out, const int32_t *src, int ndim, const int64_t *shape) {
  flex_status st = flex_tensor_alloc(out, FLEX_BACKEND_REFERENCE, rt_dtype(kDLInt, 32), ndim, shape, NULL);
  if (!st) memcpy((*out)->data, src, (size_t)rt_numel(*out) * 4);
  return st;
}

/* The public form of a built mask. */
static flex_status publish(const RtBlockMask *bm, flex_block_mask **out) {
  OwnedMask *o = base_alloc(sizeof *o);
  o->m.block_q = bm->block_q;
  o->m.block_kv = bm->block_kv;
  int32_t *const arr[8] = {bm->kv_num_blocks, bm->kv_indices, bm->full_kv_num_blocks,
                           bm->full_kv_indices, bm->q_num_blocks, bm->q_indices,
                           bm->full_q_num_blocks, bm->full_q_indices};
  const DLTensor **side[8] = {&o->m.kv_num_blocks, &o->m.kv_indices, &o->m.full_kv_num_blocks,
                              &o->m.full_kv_indices, &o->m.q_num_blocks, &o->m.q_indices,
                              &o->m.full_q_num_blocks, &o->m.full_q_indices};
  flex_status st = FLEX_OK;
  for (int i = 0; i < 8 && !st; i++) {
    if (!arr[i]) continue;
    bool qside = i >= 4, idx = i % 2 == 1;
    int64_t rows = qside ? bm->nkv : bm->nq, cols = qside ? bm->nq : bm->nkv;
    int64_t shape[4] = {bm->B, bm->H, rows, cols};
    st = int_tensor(&o->t[i], arr[i], idx ? 4 : 3, shape);
    *side[i] = o->t[i];
  }
  if (st) {
    flex_block_mask_free(&o->m);
    return st;
  }
  *out = &o->m;
  return FLEX_OK;
}

static flex_status do_block_mask_create(flex_block_mask **out, flex_kernel *k, const flex_args *a, int B,
                                   int H, int q_len, int kv_len, int block_q, int block_kv,
                                   flex_mask_stats *stats) {
  if (!out || !k) return rt_err(FLEX_ERR_INVALID, "flex_block_mask_create: NULL argument");
  *out = NULL;
  if (B < 1 || H < 1 || q_len < 1 || kv_len < 1 || block_q < 0 || block_kv < 0)
    return rt_err(FLEX_ERR_INVALID, "flex_block_mask_create: B=%d H=%d Q_LEN=%d KV_LEN=%d with "
                  "blocks %dx%d (expected sizes >= 1, blocks >= 0)", B, H, q_len, kv_len, block_q,
                  block_kv);
  flex_args none;
  memset(&none, 0, sizeof none);
  Arena arena = {0};
  RtCall c;
  flex_status st = rt_validate_bindings(&c, &arena, k, a ? a : &none, B, H, q_len, kv_len);
  RtBlockMask bm;
  RtMaskStats ms;
  memset(&ms, 0, sizeof ms);
  if (!st && !(a && a->trust_sorted)) st = rt_check_sorted(&c, c.bufs); /* host views */
  if (!st) {
    IrIntervalEnv env = {c.params, c.sizes, c.bufs};
    RtMaskShape shape = {B, H, q_len, kv_len, block_q, block_kv, c.q_off, c.kv_off};
    st = rt_block_mask_build(&bm, k->mod, &env, &shape, RT_MASK_EVAL, &ms);
  }
  if (!st) {
    st = publish(&bm, out);
    rt_block_mask_free(&bm);
  }
  if (!st && stats) {
    stats->total = ms.total, stats->full = ms.full, stats->partial = ms.partial;
    stats->empty = ms.empty, stats->undecided = ms.undecided, stats->refined = ms.refined;
    stats->evaluated = ms.evaluated, stats->decidable = ms.decidable;
    stats->implicit = k->mod->mask && ir_interval_device_decidable(k->mod);
  }
  arena_free(&arena);
  return st;
}

flex_status flex_block_mask_create(flex_block_mask **out, flex_kernel *k, const flex_args *a, int B,
                                   int H, int q_len, int kv_len, int block_q, int block_kv,
                                   flex_mask_stats *stats) {
  RT_TRY(do_block_mask_create(out, k, a, B, H, q_len, kv_len, block_q, block_kv, stats));
}

_Static_assert(FLEX_MASK_EMPTY == (int)FLEX_BLOCK_EMPTY && FLEX_MASK_FULL == (int)FLEX_BLOCK_FULL &&
                   FLEX_MASK_PARTIAL == (int)FLEX_BLOCK_PARTIAL,
               "flex_mask_class is the public face of FlexBlockClass");

static flex_status do_mask_classify(const flex_kernel *k, const flex_args *a, int B, int H,
                                    int q_len, int kv_len, flex_mask_class *out) {
  if (!k || !out) return rt_err(FLEX_ERR_INVALID, "flex_mask_classify: NULL argument");
  if (B < 1 || H < 1 || q_len < 1 || kv_len < 1)
    return rt_err(FLEX_ERR_INVALID, "flex_mask_classify: B=%d H=%d Q_LEN=%d KV_LEN=%d (expected "
                  "sizes >= 1)", B, H, q_len, kv_len);
  flex_args none;
  memset(&none, 0, sizeof none);
  Arena arena = {0};
  RtCall c;
  flex_status st = rt_validate_bindings(&c, &arena, k, a ? a : &none, B, H, q_len, kv_len);
  if (!st) {
    IrIntervalEnv env = {c.params, c.sizes, c.bufs};
    *out = (flex_mask_class)ir_interval_mask(k->mod, &env, 0, B - 1, 0, H - 1, c.q_off,
                                             c.q_off + q_len - 1, c.kv_off, c.kv_off + kv_len - 1);
  }
  arena_free(&arena);
  return st;
}

flex_status flex_mask_classify(const flex_kernel *k, const flex_args *a, int B, int H, int q_len,
                               int kv_len, flex_mask_class *out) {
  RT_TRY(do_mask_classify(k, a, B, H, q_len, kv_len, out));
}

void flex_block_mask_free(flex_block_mask *m) {
  if (!m) return;
  OwnedMask *o = (OwnedMask *)m;
  for (int i = 0; i < 8; i++) flex_tensor_free(o->t[i]);
  base_free(o);
}
