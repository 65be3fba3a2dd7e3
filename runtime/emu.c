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
#include "runtime/launch.h"
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

/* Register the bytes a tensor spans (non-negative strides). */
static void add_tensor(Ranges *rs, const char *name, const DLTensor *t) {
  int64_t bytes = t && t->data ? rt_span_bytes(t) : 0;
  if (bytes && rs->n < 64) rs->r[rs->n++] = (EmuRange){(uintptr_t)rt_data_of(t), (uint64_t)bytes, name};
}

static void add_raw(Ranges *rs, const char *name, const void *p, size_t bytes) {
  if (p && rs->n < 64) rs->r[rs->n++] = (EmuRange){(uintptr_t)p, bytes, name};
}

static bool same_dtype(const DLTensor *t, DLDataType d) {
  return !t || (t->dtype.code == d.code && t->dtype.bits == d.bits);
}

/* Where the kernel writes output i: the caller's tensor, or a staging array. */
static void *stage_out(Stage *sg, int i, const DLTensor *t, DLDataType dt, FlexStrides *s,
                       Ranges *rs) {
  if (!t) return NULL;
  *s = rt_strides4(t);
  if (same_dtype(t, dt)) return rt_data_of(t);
  rt_array_init(&sg->a[i], dt, t->ndim, t->shape);
  sg->dst[i] = t;
  *s = (FlexStrides){t->shape[1] * t->shape[2] * t->shape[3], t->shape[2] * t->shape[3], t->shape[3]};
  add_raw(rs, "staged output", sg->a[i].data, (size_t)rt_array_count(&sg->a[i]) * (dt.bits / 8));
  return sg->a[i].data;
}

/* The forward output as the backward's input, in the input dtype. */
static const void *stage_in(Stage *sg, const DLTensor *t, DLDataType dt, FlexStrides *s, Ranges *rs) {
  if (!t) return NULL;
  *s = rt_strides4(t);
  if (same_dtype(t, dt)) return rt_data_of(t);
  rt_array_init(&sg->a[0], dt, t->ndim, t->shape);
  int64_t n = rt_array_count(&sg->a[0]);
  for (int64_t j = 0; j < n; j++) {
    int64_t off = 0, rem = j;
    for (int d = t->ndim - 1; d >= 0; d--) {
      off += rem % t->shape[d] * rt_stride_of(t, d);
      rem /= t->shape[d];
    }
    double v = t->dtype.bits == 64 ? ((const double *)rt_data_of(t))[off] : ((const float *)rt_data_of(t))[off];
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
        off += rem % t->shape[d] * rt_stride_of(t, d);
        rem /= t->shape[d];
      }
      double v = rt_array_get(&sg->a[i], j);
      if (t->dtype.bits == 64) ((double *)rt_data_of(t))[off] = v;
      else ((float *)rt_data_of(t))[off] = (float)v;
    }
    rt_array_free(&sg->a[i]);
  }
}

/* FlexParams from the call (runtime/launch.c); every tensor registered in
 * rs; outputs in another dtype staged. */
static flex_status fill(const RtCall *c, FlexParams *p, Ranges *rs, Stage *sg) {
  const flex_args *a = c->args;
  flex_status st = rt_launch_fill(c, p, "emu");
  if (st) return st;
  const char *names[] = {"q", "k", "v", "out", "lse", "dout", "dlse", "dq", "dk", "dv"};
  const DLTensor *ts[] = {a->q, a->k, a->v, a->out, a->lse, a->dout, a->dlse, a->dq, a->dk, a->dv};
  for (int i = 0; i < 10; i++) add_tensor(rs, names[i], ts[i]);
  for (int i = 0; i < c->mod->nbuffers; i++)
    add_tensor(rs, c->mod->buffers[i].id, c->buf_tensors[i]);
  p->out = c->backward ? (void *)stage_in(sg, a->out, c->dtype, &p->so, rs)
                       : stage_out(sg, 0, a->out, c->dtype, &p->so, rs);
  if (c->backward) {
    p->dq = stage_out(sg, 1, a->dq, c->dtype, &p->sdq, rs);
    p->dk = stage_out(sg, 2, a->dk, c->dtype, &p->sdk, rs);
    p->dv = stage_out(sg, 3, a->dv, c->dtype, &p->sdv, rs);
  }
  return FLEX_OK;
}

/* What the last call on this thread did (rt_emu_last_stats). */
static _Thread_local RtEmuStats last_stats;

RtEmuStats rt_emu_last_stats(void) { return last_stats; }

/* Run one entry; a failure becomes the call's error. Adds the tiles its
 * walks visited to *tiles (may be NULL). */
static flex_status launch(EmuModule *mod, const char *entry, CgLaunch g, const FlexParams *p,
                          const Ranges *rs, uint64_t *tiles) {
  if (!g.grid[0] || !g.grid[1] || !g.grid[2]) return FLEX_OK; /* nothing to do, as on CUDA */
  flex_status st = rt_launch_check_geometry("emu", entry, g.grid, g.block);
  if (st) return st;
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = entry;
  L.params = p;
  L.grid = (EmuDim){g.grid[0], g.grid[1], g.grid[2]};
  L.block = (EmuDim){g.block[0], g.block[1], g.block[2]};
  L.smem_bytes = g.smem;
  L.ranges = rs->r;
  L.nranges = rs->n;
  st = emu_module_launch(mod, &L, NULL);
  if (st) return rt_err(st, "emulator: %s", L.error);
  if (tiles) *tiles += L.tiles;
  return FLEX_OK;
}

/* Generate the source (mask mode from the plan) and get its module. */
static flex_status module_for(const RtCall *c, CgOptions *o, RtMaskPlan *plan, EmuModule **mod) {
  char err[512];
  CgDtype dt = c->dtype.code == kDLBfloat ? CG_BF16 : c->dtype.bits == 16 ? CG_FP16 : CG_FP32;
  if (!cg_options_init(o, c->mod, dt, c->E, c->EV, CG_SM80, c->backward, err, sizeof err))
    return rt_err(FLEX_ERR_UNSUPPORTED, "the emu backend cannot run this call: %s", err);
  flex_status st = rt_launch_mask_plan(c, o, plan);
  if (st) return st;
  o->source = c->kernel->src.path;
  o->check_bounds = c->args->check_bounds;
  o->fast_math = c->args->fast_math;
  Buf src = {0}, log = {0};
  cg_emit_cuda(&src, c->mod, o);
  const char *rc = getenv("FLEXC_EMU_RACECHECK");
  EmuBuildOpts bo = {.racecheck = rc && *rc && strcmp(rc, "0") != 0};
  st = emu_module_get(mod, src.data, &bo, &log);
  if (st) st = rt_err(st, "emulator: %s", log.data ? log.data : "build failed");
  buf_free(&src);
  buf_free(&log);
  return st;
}

/* Memory of a built BlockMask (host memory plays device memory). */
typedef struct Built {
  unsigned char *cls; /* class byte per block */
  int32_t *arr[8];    /* the lists, as FlexParams.mask_out */
} Built;

static void built_free(Built *b) {
  base_free(b->cls);
  for (int i = 0; i < 8; i++) base_free(b->arr[i]);
}

/* The walk lists of the call: a caller's BlockMask (normalised), or one
 * built by flex_mask_build + flex_mask_lists; nothing for NONE / IMPLICIT. */
static flex_status mask_lists(EmuModule *mod, const CgOptions *o, const RtMaskPlan *plan,
                              FlexParams *p, Ranges *rs, Built *bl) {
  if (plan->user) {
    rt_launch_user_lists(p, plan);
    const RtBlockMask *b = &plan->bm;
    size_t bh = (size_t)b->B * (size_t)b->H, nq = (size_t)b->nq, nkv = (size_t)b->nkv;
    const FlexBlockList *l[4] = {&p->kv_list, &p->full_kv_list, &p->q_list, &p->full_q_list};
    size_t rows[4] = {nq, nq, nkv, nkv}, cols[4] = {nkv, nkv, nq, nq};
    for (int i = 0; i < 4; i++) {
      add_raw(rs, "block_mask", l[i]->num, bh * rows[i] * 4);
      add_raw(rs, "block_mask", l[i]->idx, bh * rows[i] * cols[i] * 4);
    }
    return FLEX_OK;
  }
  if (!plan->build) return FLEX_OK;
  size_t bytes[9];
  rt_launch_mask_bytes(plan, bytes);
  bl->cls = base_alloc(bytes[8] + 1);
  add_raw(rs, "mask classes", bl->cls, bytes[8]);
  for (int i = 0; i < 8; i++) {
    bl->arr[i] = base_alloc(bytes[i] + 4);
    add_raw(rs, "built block mask", bl->arr[i], bytes[i]);
  }
  rt_launch_builder(p, plan, bl->cls, bl->arr);
  flex_status st = launch(mod, "flex_mask_build", cg_launch_mask_build(o, plan->Bm, plan->Hm, plan->nq),
                          p, rs, NULL);
  if (!st)
    st = launch(mod, "flex_mask_lists",
                cg_launch_mask_lists(o, plan->Bm, plan->Hm, plan->nq, plan->nkv), p, rs, NULL);
  last_stats.built = !st;
  for (size_t i = 0; !st && i < bytes[8]; i++)
    if (bl->cls[i] <= 2) last_stats.blocks[bl->cls[i]]++;
  return st;
}

/* Everything a call sets up before its kernels run. */
typedef struct Setup {
  FlexParams p;       /* the params struct */
  Ranges rs;          /* registered allocations */
  CgOptions o;        /* what was generated */
  RtMaskPlan plan;    /* how the mask is handled */
  EmuModule *mod;     /* the compiled module */
  Stage sg;           /* staged outputs */
  Built bl;           /* a built BlockMask */
  int32_t *bounds;    /* checked runs: the failure record (FLEX_BOUNDS_WORDS) */
} Setup;

static flex_status setup(const RtCall *c, Setup *s) {
  memset(s, 0, sizeof *s);
  memset(&last_stats, 0, sizeof last_stats);
  flex_status st = c->args->check_bounds ? rt_check_sorted(c, c->bufs) : FLEX_OK;
  if (!st) st = fill(c, &s->p, &s->rs, &s->sg);
  if (!st && c->args->check_bounds) {
    s->p.bounds = s->bounds = base_alloc(FLEX_BOUNDS_WORDS * sizeof(int32_t));
    add_raw(&s->rs, "checked-run record", s->bounds, FLEX_BOUNDS_WORDS * sizeof(int32_t));
  }
  if (!st) st = module_for(c, &s->o, &s->plan, &s->mod);
  if (!st) st = mask_lists(s->mod, &s->o, &s->plan, &s->p, &s->rs, &s->bl);
  last_stats.mode = s->o.mask_mode;
  last_stats.vec16 = s->p.vec16 != 0;
  return st;
}

/* A checked run's verdict once the launches are done (st: theirs). */
static flex_status bounds_verdict(const RtCall *c, const Setup *s, flex_status st) {
  return !st && s->bounds ? rt_launch_bounds_report(c, s->bounds) : st;
}

static void teardown(Setup *s, bool ok) {
  base_free(s->bounds);
  stage_finish(&s->sg, ok);
  built_free(&s->bl);
  rt_launch_mask_free(&s->plan);
}

flex_status rt_emu_forward(const RtCall *c) {
  Setup s;
  flex_status st = setup(c, &s);
  if (!st)
    st = launch(s.mod, "flex_fwd", cg_launch_fwd(&s.o, c->B, c->H, c->QL), &s.p, &s.rs,
                &last_stats.fwd_tiles);
  st = bounds_verdict(c, &s, st);
  teardown(&s, st == FLEX_OK);
  return st;
}

/* Widen the fp32 accumulators into the caller's gradient tensors. */
static void grads_finish(const RtCall *c, float *const grads[FLEX_MAX_BUFFERS]) {
  for (int i = 0; i < c->mod->nbuffers; i++) {
    const DLTensor *g = c->buf_grads[i];
    if (!g) continue;
    size_t n = (size_t)rt_numel(g);
    for (size_t j = 0; j < n; j++) {
      size_t off = 0, rem = j;
      for (int d = g->ndim - 1; d >= 0; d--) {
        off += (rem % (size_t)g->shape[d]) * (size_t)rt_stride_of(g, d);
        rem /= (size_t)g->shape[d];
      }
      if (g->dtype.bits == 64) ((double *)rt_data_of(g))[off] = grads[i][j];
      else ((float *)rt_data_of(g))[off] = grads[i][j];
    }
  }
}

flex_status rt_emu_backward(const RtCall *c) {
  Setup s;
  flex_status st = setup(c, &s);
  if (st) {
    teardown(&s, false);
    return st;
  }
  FlexParams *p = &s.p;
  size_t rows = (size_t)c->B * (size_t)c->H * (size_t)c->QL;
  float *grads[FLEX_MAX_BUFFERS] = {0};
  p->dq_acc = base_alloc(rows * (size_t)c->E * 4 + 4);
  p->delta = base_alloc(rows * 4 + 4);
  add_raw(&s.rs, "dq_acc", p->dq_acc, rows * (size_t)c->E * 4);
  add_raw(&s.rs, "delta", p->delta, rows * 4);
  for (int i = 0; i < c->mod->nbuffers; i++) {
    const DLTensor *g = c->buf_grads[i];
    if (!g) continue;
    size_t n = (size_t)rt_numel(g);
    grads[i] = p->buf_grad[i] = base_alloc(n * 4 + 4); /* zeroed */
    add_raw(&s.rs, "buffer gradient", grads[i], n * 4);
  }
  st = launch(s.mod, "flex_bwd_pre", cg_launch_bwd_pre(&s.o, c->B, c->H, c->QL), p, &s.rs, NULL);
  if (!st)
    st = launch(s.mod, "flex_bwd", cg_launch_bwd(&s.o, c->B, c->HKV, c->KL), p, &s.rs,
                &last_stats.bwd_tiles);
  if (!st)
    st = launch(s.mod, "flex_bwd_dq", cg_launch_bwd_dq(&s.o, c->B, c->H, c->QL), p, &s.rs, NULL);
  st = bounds_verdict(c, &s, st);
  if (!st) grads_finish(c, grads);
  teardown(&s, st == FLEX_OK);
  for (int i = 0; i < FLEX_MAX_BUFFERS; i++) base_free(grads[i]);
  base_free(p->dq_acc);
  base_free(p->delta);
  return st;
}
