/* emu.c: the emulator backend: the generated CUDA source, compiled with the
 * host C++ compiler against the shim (runtime/emu/), run on the CPU.
 *
 * The caller's tensors live in host memory, so the kernels read and write
 * them in place, exactly as they would device memory; every tensor (and our
 * scratch) is registered as an allocation, so an access outside all of
 * them fails the call with the kernel, block, thread and address.
 * $FLEXC_EMU_RACECHECK=1 builds race-checking modules (much slower). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "kernels/params.cuh"
#include "runtime/emu/emu_host.h"
#include "runtime/npy.h"
#include "runtime/rt.h"

/* Allocations of one call (tensors and scratch). */
typedef struct Ranges {
  EmuRange r[64]; /* the allocations */
  int n;          /* entries used */
} Ranges;

/* Outputs the kernels write in the input dtype while the caller's tensor has
 * another (fp16/bf16 inputs, fp32/fp64 outputs): staged, then converted. */
typedef struct Stage {
  RtArray a[4];            /* out, dq, dk, dv in the input dtype (data NULL: not staged) */
  const DLTensor *dst[4];  /* the caller's tensors */
} Stage;

static int64_t stride_of(const DLTensor *t, int d) {
  if (t->strides) return t->strides[d];
  int64_t s = 1;
  for (int i = t->ndim - 1; i > d; i--) s *= t->shape[i];
  return s;
}

static char *data_of(const DLTensor *t) { return t ? (char *)t->data + t->byte_offset : NULL; }

static FlexStrides strides4(const DLTensor *t) {
  FlexStrides s = {0, 0, 0};
  if (t) s = (FlexStrides){stride_of(t, 0), stride_of(t, 1), stride_of(t, 2)};
  return s;
}

/* Register the bytes a tensor spans (non-negative strides). */
static void add_tensor(Ranges *rs, const char *name, const DLTensor *t) {
  if (!t || !t->data || rs->n == 64) return;
  int64_t last = 0, es = (t->dtype.bits * t->dtype.lanes + 7) / 8;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] == 0) return;
    last += (t->shape[d] - 1) * stride_of(t, d);
  }
  rs->r[rs->n++] = (EmuRange){(uintptr_t)data_of(t), (uint64_t)((last + 1) * es), name};
}

static void add_raw(Ranges *rs, const char *name, const void *p, size_t bytes) {
  if (p && rs->n < 64) rs->r[rs->n++] = (EmuRange){(uintptr_t)p, bytes, name};
}

static FlexBlockList block_list(const DLTensor *num, const DLTensor *idx) {
  FlexBlockList l;
  memset(&l, 0, sizeof l);
  if (!num || !idx) return l;
  l.num = (const int32_t *)data_of(num), l.idx = (const int32_t *)data_of(idx);
  l.num_b = num->shape[0] == 1 ? 0 : stride_of(num, 0);
  l.num_h = num->shape[1] == 1 ? 0 : stride_of(num, 1);
  l.num_r = stride_of(num, 2);
  l.idx_b = idx->shape[0] == 1 ? 0 : stride_of(idx, 0);
  l.idx_h = idx->shape[1] == 1 ? 0 : stride_of(idx, 1);
  l.idx_r = stride_of(idx, 2);
  return l;
}

static bool same_dtype(const DLTensor *t, DLDataType d) {
  return !t || (t->dtype.code == d.code && t->dtype.bits == d.bits);
}

/* Where the kernel writes output i: the caller's tensor, or a staging array. */
static void *stage_out(Stage *sg, int i, const DLTensor *t, DLDataType dt, FlexStrides *s,
                       Ranges *rs) {
  if (!t) return NULL;
  *s = strides4(t);
  if (same_dtype(t, dt)) return data_of(t);
  rt_array_init(&sg->a[i], dt, t->ndim, t->shape);
  sg->dst[i] = t;
  *s = (FlexStrides){t->shape[1] * t->shape[2] * t->shape[3], t->shape[2] * t->shape[3], t->shape[3]};
  add_raw(rs, "staged output", sg->a[i].data, (size_t)rt_array_count(&sg->a[i]) * (dt.bits / 8));
  return sg->a[i].data;
}

/* The forward output as the backward's input, in the input dtype. */
static const void *stage_in(Stage *sg, const DLTensor *t, DLDataType dt, FlexStrides *s, Ranges *rs) {
  if (!t) return NULL;
  *s = strides4(t);
  if (same_dtype(t, dt)) return data_of(t);
  rt_array_init(&sg->a[0], dt, t->ndim, t->shape);
  int64_t n = rt_array_count(&sg->a[0]);
  for (int64_t j = 0; j < n; j++) {
    int64_t off = 0, rem = j;
    for (int d = t->ndim - 1; d >= 0; d--) {
      off += rem % t->shape[d] * stride_of(t, d);
      rem /= t->shape[d];
    }
    double v = t->dtype.bits == 64 ? ((const double *)data_of(t))[off] : ((const float *)data_of(t))[off];
    rt_array_set(&sg->a[0], j, v);
  }
  *s = (FlexStrides){t->shape[1] * t->shape[2] * t->shape[3], t->shape[2] * t->shape[3], t->shape[3]};
  add_raw(rs, "staged out", sg->a[0].data, (size_t)n * (dt.bits / 8));
  return sg->a[0].data;
}

/* Convert staged outputs into the caller's float32/float64 tensors; free them. */
static void stage_finish(Stage *sg, bool ok) {
  for (int i = 0; i < 4; i++) {
    if (!sg->a[i].data) continue;
    const DLTensor *t = sg->dst[i];
    int64_t n = rt_array_count(&sg->a[i]);
    for (int64_t j = 0; ok && t && j < n; j++) {
      int64_t off = 0, rem = j;
      for (int d = t->ndim - 1; d >= 0; d--) {
        off += rem % t->shape[d] * stride_of(t, d);
        rem /= t->shape[d];
      }
      double v = rt_array_get(&sg->a[i], j);
      if (t->dtype.bits == 64) ((double *)data_of(t))[off] = v;
      else ((float *)data_of(t))[off] = (float)v;
    }
    rt_array_free(&sg->a[i]);
  }
}

/* FlexParams from the call; every tensor registered in rs. */
static flex_status fill(const RtCall *c, FlexParams *p, Ranges *rs, Stage *sg) {
  const flex_args *a = c->args;
  const IrModule *m = c->mod;
  memset(p, 0, sizeof *p);
  if (m->nparams > FLEX_MAX_PARAMS || m->nbuffers > FLEX_MAX_BUFFERS || m->nsizes > FLEX_MAX_SIZES)
    return rt_err(FLEX_ERR_UNSUPPORTED, "the emu backend supports at most %d params and %d buffers",
                  FLEX_MAX_PARAMS, FLEX_MAX_BUFFERS);
  if (a->lse && (a->lse->dtype.code != kDLFloat || a->lse->dtype.bits != 32 || stride_of(a->lse, 2) != 1))
    return rt_err(FLEX_ERR_UNSUPPORTED, "the emu backend needs 'lse' as float32 with unit stride");
  const char *names[] = {"q", "k", "v", "out", "lse", "dout", "dlse", "dq", "dk", "dv"};
  const DLTensor *ts[] = {a->q, a->k, a->v, a->out, a->lse, a->dout, a->dlse, a->dq, a->dk, a->dv};
  for (int i = 0; i < 10; i++) add_tensor(rs, names[i], ts[i]);
  p->out = c->backward ? (void *)stage_in(sg, a->out, c->dtype, &p->so, rs)
                       : stage_out(sg, 0, a->out, c->dtype, &p->so, rs);
  p->lse = (float *)data_of(a->lse);
  p->q = data_of(a->q), p->k = data_of(a->k), p->v = data_of(a->v);
  p->sq = strides4(a->q), p->sk = strides4(a->k), p->sv = strides4(a->v);
  if (a->lse) p->lse_b = stride_of(a->lse, 0), p->lse_h = stride_of(a->lse, 1);
  for (int i = 0; i < m->nparams; i++) {
    if (m->params[i].type == IT_F32) p->pf[i] = (float)c->params[i].f;
    else p->pi[i] = c->params[i].i;
  }
  for (int i = 0; i < m->nsizes; i++) p->sizes[i] = c->sizes[i];
  for (int i = 0; i < m->nbuffers; i++) {
    p->buf[i] = data_of(c->buf_tensors[i]);
    add_tensor(rs, m->buffers[i].id, c->buf_tensors[i]);
  }
  p->B = c->B, p->H = c->H, p->HKV = c->HKV, p->G = c->G;
  p->q_len = c->QL, p->kv_len = c->KL, p->E = c->E, p->EV = c->EV;
  p->scale = (float)c->scale;
  if (a->block_mask) {
    const flex_block_mask *bm = a->block_mask;
    p->block_q = bm->block_q ? bm->block_q : 128;
    p->block_kv = bm->block_kv ? bm->block_kv : 128;
    p->kv_list = block_list(bm->kv_num_blocks, bm->kv_indices);
    p->full_kv_list = block_list(bm->full_kv_num_blocks, bm->full_kv_indices);
    p->q_list = block_list(bm->q_num_blocks, bm->q_indices);
    p->full_q_list = block_list(bm->full_q_num_blocks, bm->full_q_indices);
    const DLTensor *bt[] = {bm->kv_num_blocks, bm->kv_indices, bm->full_kv_num_blocks,
                            bm->full_kv_indices, bm->q_num_blocks, bm->q_indices,
                            bm->full_q_num_blocks, bm->full_q_indices};
    for (int i = 0; i < 8; i++) add_tensor(rs, "block_mask", bt[i]);
  }
  p->vec16 = 0; /* keep the scalar path: host tensors need not be 16-byte aligned */
  if (c->backward) {
    p->dq = stage_out(sg, 1, a->dq, c->dtype, &p->sdq, rs);
    p->dk = stage_out(sg, 2, a->dk, c->dtype, &p->sdk, rs);
    p->dv = stage_out(sg, 3, a->dv, c->dtype, &p->sdv, rs);
    p->dout = data_of(a->dout);
    p->dlse = (const float *)data_of(a->dlse);
    p->sdo = strides4(a->dout);
  }
  return FLEX_OK;
}

/* Run one entry; a failure becomes the call's error. */
static flex_status launch(EmuModule *mod, const char *entry, CgLaunch g, const FlexParams *p,
                          const Ranges *rs) {
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = entry;
  L.params = p;
  L.grid = (EmuDim){g.grid[0], g.grid[1], g.grid[2]};
  L.block = (EmuDim){g.block[0], g.block[1], g.block[2]};
  L.smem_bytes = g.smem;
  L.ranges = rs->r;
  L.nranges = rs->n;
  flex_status st = emu_module_launch(mod, &L, NULL);
  if (st) return rt_err(st, "emulator: %s", L.error);
  return FLEX_OK;
}

/* Generate the source and get its module. */
static flex_status module_for(const RtCall *c, CgOptions *o, EmuModule **mod) {
  char err[512];
  CgDtype dt = c->dtype.code == kDLBfloat ? CG_BF16 : c->dtype.bits == 16 ? CG_FP16 : CG_FP32;
  if (!cg_options_init(o, c->mod, dt, c->E, c->EV, CG_SM80, c->backward, err, sizeof err))
    return rt_err(FLEX_ERR_UNSUPPORTED, "the emu backend cannot run this call: %s", err);
  if (o->has_mask) o->mask_mode = c->args->block_mask ? CG_MASK_LISTS : CG_MASK_DENSE;
  else o->mask_mode = c->args->block_mask ? CG_MASK_LISTS : CG_MASK_NONE;
  o->source = c->kernel->src.path;
  Buf src = {0}, log = {0};
  cg_emit_cuda(&src, c->mod, o);
  const char *rc = getenv("FLEXC_EMU_RACECHECK");
  EmuBuildOpts bo = {.racecheck = rc && *rc && strcmp(rc, "0") != 0};
  flex_status st = emu_module_get(mod, src.data, &bo, &log);
  if (st) st = rt_err(st, "emulator: %s", log.data ? log.data : "build failed");
  buf_free(&src);
  buf_free(&log);
  return st;
}

flex_status rt_emu_forward(const RtCall *c) {
  FlexParams p;
  Ranges rs = {.n = 0};
  CgOptions o;
  EmuModule *mod;
  Stage sg;
  memset(&sg, 0, sizeof sg);
  flex_status st = fill(c, &p, &rs, &sg);
  if (!st) st = module_for(c, &o, &mod);
  if (!st) st = launch(mod, "flex_fwd", cg_launch_fwd(&o, c->B, c->H, c->QL), &p, &rs);
  stage_finish(&sg, st == FLEX_OK);
  return st;
}

flex_status rt_emu_backward(const RtCall *c) {
  FlexParams p;
  Ranges rs = {.n = 0};
  CgOptions o;
  EmuModule *mod;
  Stage sg;
  memset(&sg, 0, sizeof sg);
  flex_status st = fill(c, &p, &rs, &sg);
  if (!st) st = module_for(c, &o, &mod);
  if (st) {
    stage_finish(&sg, false);
    return st;
  }
  size_t rows = (size_t)c->B * (size_t)c->H * (size_t)c->QL;
  float *grads[FLEX_MAX_BUFFERS] = {0};
  p.dq_acc = base_alloc(rows * (size_t)c->E * 4 + 4);
  p.delta = base_alloc(rows * 4 + 4);
  add_raw(&rs, "dq_acc", p.dq_acc, rows * (size_t)c->E * 4);
  add_raw(&rs, "delta", p.delta, rows * 4);
  for (int i = 0; i < c->mod->nbuffers; i++) {
    const DLTensor *g = c->buf_grads[i];
    if (!g) continue;
    size_t n = 1;
    for (int d = 0; d < g->ndim; d++) n *= (size_t)g->shape[d];
    grads[i] = p.buf_grad[i] = base_alloc(n * 4 + 4); /* zeroed */
    add_raw(&rs, "buffer gradient", grads[i], n * 4);
  }
  st = launch(mod, "flex_bwd_pre", cg_launch_bwd_pre(&o, c->B, c->H, c->QL), &p, &rs);
  if (!st) st = launch(mod, "flex_bwd", cg_launch_bwd(&o, c->B, c->HKV, c->KL), &p, &rs);
  if (!st) st = launch(mod, "flex_bwd_dq", cg_launch_bwd_dq(&o, c->B, c->H, c->QL), &p, &rs);
  /* Widen the fp32 accumulators into the caller's gradient tensors. */
  for (int i = 0; !st && i < c->mod->nbuffers; i++) {
    const DLTensor *g = c->buf_grads[i];
    if (!g) continue;
    size_t n = 1;
    for (int d = 0; d < g->ndim; d++) n *= (size_t)g->shape[d];
    for (size_t j = 0; j < n; j++) {
      size_t off = 0, rem = j;
      for (int d = g->ndim - 1; d >= 0; d--) {
        off += (rem % (size_t)g->shape[d]) * (size_t)stride_of(g, d);
        rem /= (size_t)g->shape[d];
      }
      if (g->dtype.bits == 64) ((double *)data_of(g))[off] = grads[i][j];
      else ((float *)data_of(g))[off] = grads[i][j];
    }
  }
  stage_finish(&sg, st == FLEX_OK);
  for (int i = 0; i < FLEX_MAX_BUFFERS; i++) base_free(grads[i]);
  base_free(p.dq_acc);
  base_free(p.delta);
  return st;
}
