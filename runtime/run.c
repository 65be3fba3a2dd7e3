/* run.c: the run sequence, written once for every device backend
 * (backend.h). For one validated call:
 *
 *   open (the device states what it can do) -> sorted check (host) ->
 *   plan (cg_plan: every kernel choice) -> mask arrays -> params ->
 *   prepare -> sorted check (device) -> block lists (built or the
 *   caller's) -> forward (whole, or split-KV partials and their combine) |
 *   backward (pre, main, dq) -> checked-run verdict
 *   -> outputs converted -> free
 *
 * The backend supplies memory, copies and launches; where every array
 * lives and the order of the launches are decided here, what the kernels
 * are generated with in codegen/plan.c. Every launch goes through launch()
 * below: its geometry checked against the hardware's limits, the sm_90a
 * bodies' tensor maps built with the backend's encoder.
 */
#include <stdlib.h>
#include <string.h>

#include "ir/interval.h"
#include "kernels/exact.cuh"
#include "runtime/backend.h"
#include "runtime/launch.h"
#include "runtime/tensor.h"

const char *rt_entry_name(RtEntry e) {
  static const char *const names[RT_NENTRIES] = {
      "flex_mask_build", "flex_mask_lists", "flex_fwd",          "flex_fwd_combine",
      "flex_bwd_pre",    "flex_bwd",        "flex_bwd_dq",       "flex_sorted_check",
      "flex_grad_exact"};
  return names[e];
}

void rt_call_tensors(const RtCall *c, void (*fn)(void *ctx, const char *name, const DLTensor *t),
                     void *ctx) {
  const flex_args *a = c->args;
  const char *const names[] = {"q", "k", "v", "out", "lse", "dout", "dlse", "dq", "dk", "dv"};
  const DLTensor *const ts[] = {a->q, a->k, a->v, a->out, a->lse, a->dout, a->dlse, a->dq, a->dk, a->dv};
  for (int i = 0; i < (c->backward ? 10 : 5); i++)
    if (ts[i] && !(c->pages && (i == 1 || i == 2))) fn(ctx, names[i], ts[i]);
  for (int i = 0; i < c->mod->nbuffers; i++) {
    if (c->buf_tensors[i]) fn(ctx, c->mod->buffers[i].id, c->buf_tensors[i]);
    if (c->backward && c->buf_grads[i]) fn(ctx, c->mod->buffers[i].id, c->buf_grads[i]);
  }
  if (a->block_mask) {
    const flex_block_mask *m = a->block_mask;
    const DLTensor *const bm[] = {m->kv_num_blocks, m->kv_indices, m->full_kv_num_blocks,
                                  m->full_kv_indices, m->q_num_blocks, m->q_indices,
                                  m->full_q_num_blocks, m->full_q_indices};
    for (int i = 0; i < 8; i++)
      if (bm[i]) fn(ctx, "block_mask", bm[i]);
  }
  if (c->pages) fn(ctx, "k pool", c->k_pool), fn(ctx, "v pool", c->v_pool);
}

/* What the last call on this thread did. */
static _Thread_local RtRunStats last_stats;

RtRunStats rt_run_last_stats(void) { return last_stats; }

/* A tensor the kernels see in their own dtype (kernel_dtype) while the
 * caller's has another: an output (fp16/bf16 inputs, fp32/fp64 outputs;
 * float64 outputs of float64 inputs), the forward's output read back by
 * the backward, or a float64 input (q, k, v, dout) the kernels read in
 * float32. */
typedef struct Staged {
  DLTensor t;                 /* the staging tensor (backend memory, compact) */
  const DLTensor *caller;     /* the caller's tensor */
  bool out;                   /* written by the kernels: converted into caller at the end */
} Staged;

/* Everything one call allocates, freed together. */
typedef struct Work {
  void *mem[48];      /* backend memory */
  int nmem;
  Staged stage[8];    /* q, k, v, dout, out (or out as an input), dq, dk, dv */
  int nstage;
  RtMaskPlan plan;    /* the mask plan (owns a caller's mask in normal form) */
  unsigned char *cls; /* built BlockMask: class bytes (backend memory) */
  int32_t *bounds;    /* checked runs: the failure record (backend memory) */
  float *grads[FLEX_MAX_BUFFERS]; /* our fp32 buffer-gradient accumulators (NULL: the caller's own) */
} Work;

/* Backend memory, zero-filled, freed with the call. */
static flex_status alloc(RtRun *r, Work *w, void **out, size_t bytes) {
  *out = NULL;
  if (w->nmem == (int)(sizeof w->mem / sizeof w->mem[0]))
    return rt_err(FLEX_ERR_RUNTIME, "internal: too many allocations in one call");
  flex_status st = r->be->alloc(r, out, bytes ? bytes : 4);
  if (!st) w->mem[w->nmem++] = *out;
  return st;
}

static void work_free(RtRun *r, Work *w) {
  for (int i = 0; i < w->nmem; i++) r->be->release(r, w->mem[i]);
  rt_launch_mask_free(&w->plan);
}

/* One entry; an empty grid has nothing to do (an empty sequence). The
 * generated kernels' geometry must be within the hardware's limits, and
 * the sm_90a bodies take p with the tensor maps of q, k, v (and dout). */
static flex_status launch(RtRun *r, RtEntry e, CgLaunch g, const FlexParams *p, uint64_t *tiles) {
  if (!g.grid[0] || !g.grid[1] || !g.grid[2]) return FLEX_OK;
  flex_status st = FLEX_OK;
  if (!r->dev.host) st = rt_launch_check_geometry(r->be->name, rt_entry_name(e), g.grid, g.block);
  const void *params = p;
  FlexFwdTma ftma;
  FlexBwdTma btma;
  if (!st && e == RT_ENTRY_FWD && r->opts.fwd_sm90) {
    st = rt_launch_fwd_tma(&r->opts, p, r->be->tmap, NULL, &ftma);
    params = &ftma;
  }
  if (!st && e == RT_ENTRY_BWD && r->opts.bwd_sm90) {
    st = rt_launch_bwd_tma(&r->opts, p, r->be->tmap, NULL, &btma);
    params = &btma;
  }
  r->tiles = 0;
  if (!st) st = r->be->launch(r, e, &g, params);
  if (!st && tiles) *tiles += r->tiles;
  return st;
}

/* ---- the caller's BlockMask ------------------------------------------------ */

/* Host copies of the eight tensors of a caller's BlockMask on a device
 * backend; the plan validates and normalises them exactly as on the host. */
typedef struct HostMask {
  flex_block_mask m; /* the caller's mask with host tensors */
  DLTensor *t[8];    /* host copies */
} HostMask;

static flex_status host_mask(RtRun *r, const flex_block_mask *u, HostMask *h) {
  memset(h, 0, sizeof *h);
  h->m = *u;
  const DLTensor **side[8] = {&h->m.kv_num_blocks, &h->m.kv_indices, &h->m.full_kv_num_blocks,
                              &h->m.full_kv_indices, &h->m.q_num_blocks, &h->m.q_indices,
                              &h->m.full_q_num_blocks, &h->m.full_q_indices};
  for (int i = 0; i < 8; i++) {
    if (!*side[i]) continue;
    flex_status st = rt_tensor_host_copy(&h->t[i], *side[i], r->be, r, "block_mask");
    if (st) return st;
    *side[i] = h->t[i];
  }
  return FLEX_OK;
}

static void host_mask_free(HostMask *h) {
  for (int i = 0; i < 8; i++) rt_tensor_delete(h->t[i]);
}

/* The mask plan (launch.c) over host views of the caller's mask. */
static flex_status plan_mask(RtRun *r, Work *w) {
  const RtCall *c = r->c;
  if (!c->args->block_mask || r->be->host_memory) return rt_launch_mask_plan(c, &r->opts, &w->plan);
  HostMask hm;
  flex_args ha = *c->args;
  RtCall hc = *c;
  flex_status st = host_mask(r, c->args->block_mask, &hm);
  ha.block_mask = &hm.m;
  hc.args = &ha;
  if (!st) st = rt_launch_mask_plan(&hc, &r->opts, &w->plan);
  host_mask_free(&hm);
  return st;
}

/* The walk lists: built by the builder entries, or the caller's uploaded. */
static flex_status mask_lists(RtRun *r, Work *w, FlexParams *p) {
  const RtMaskPlan *plan = &w->plan;
  if (plan->user) {
    const RtBlockMask *b = &plan->bm;
    int32_t *const host[8] = {b->kv_num_blocks, b->kv_indices, b->full_kv_num_blocks,
                              b->full_kv_indices, b->q_num_blocks, b->q_indices,
                              b->full_q_num_blocks, b->full_q_indices};
    size_t bh = (size_t)b->B * (size_t)b->H, nq = (size_t)b->nq, nkv = (size_t)b->nkv;
    const size_t n[8] = {bh * nq, bh * nq * nkv, bh * nq, bh * nq * nkv,
                         bh * nkv, bh * nkv * nq, bh * nkv, bh * nkv * nq};
    int32_t *dev[8] = {0};
    for (int i = 0; i < 8; i++) {
      if (!host[i]) continue; /* no full_* side */
      void *m;
      flex_status st = alloc(r, w, &m, n[i] * 4);
      if (!st && n[i]) st = r->be->upload(r, m, host[i], n[i] * 4);
      if (st) return st;
      dev[i] = m;
    }
    rt_launch_set_lists(p, dev, b->B, b->H, b->nq, b->nkv, b->block_q, b->block_kv);
    return FLEX_OK;
  }
  if (!plan->build) return FLEX_OK;
  size_t bytes[9];
  rt_launch_mask_bytes(plan, bytes);
  int32_t *arr[8];
  for (int i = 0; i < 8; i++) {
    void *m;
    flex_status st = alloc(r, w, &m, bytes[i]);
    if (st) return st;
    arr[i] = m;
  }
  void *cls;
  flex_status st = alloc(r, w, &cls, bytes[8]);
  if (st) return st;
  w->cls = cls;
  rt_launch_builder(p, plan, w->cls, arr);
  st = launch(r, RT_ENTRY_MASK_BUILD, cg_launch_mask_build(&r->opts, plan->Bm, plan->Hm, plan->nq),
              p, NULL);
  if (!st)
    st = launch(r, RT_ENTRY_MASK_LISTS,
                cg_launch_mask_lists(&r->opts, plan->Bm, plan->Hm, plan->nq, plan->nkv), p, NULL);
  last_stats.built = !st;
  for (size_t i = 0; !st && r->be->host_memory && i < bytes[8]; i++)
    if (w->cls[i] <= 2) last_stats.blocks[w->cls[i]]++;
  return st;
}

/* ---- `sorted` promises ------------------------------------------------------- */

/* `sorted` promises, on every run unless waived (flex_args.trust_sorted):
 * the mask plan and the kernels skip blocks by them (docs/language.md).
 *
 * A backend without the entry (cpu, host memory) checks host views of the
 * caller's buffers, before anything else. */
static flex_status sorted_on_host(RtRun *r) {
  const RtCall *c = r->c;
  if (c->args->trust_sorted || r->be->sorted_entry) return FLEX_OK;
  if (!r->be->host_memory)
    return rt_err(FLEX_ERR_RUNTIME, "internal: the %s backend has device memory and no "
                                    "flex_sorted_check", r->be->name);
  return rt_check_sorted(c, c->bufs);
}

/* The emulator and CUDA run flex_sorted_check where the buffers live (the
 * emulator too, though its memory is the host's: so the device path is
 * run by every test of the emulator, GPU or not). One launch per sorted
 * buffer of two or more elements, each into its own word of one record of
 * ours; the record comes back in one download of 8 bytes a buffer, and
 * only for a buffer that decreases the two elements it names, so the
 * message is the host check's. The entry is part of the module, so this
 * runs after prepare, and before any other launch. */
static flex_status sorted_on_device(RtRun *r, Work *w, const FlexParams *p) {
  const RtCall *c = r->c;
  const IrModule *m = c->mod;
  if (c->args->trust_sorted || !r->be->sorted_entry) return FLEX_OK;
  uint64_t rec[FLEX_MAX_BUFFERS] = {0};
  void *dev = NULL;
  flex_status st = FLEX_OK;
  for (int j = 0; j < m->nbuffers && !st; j++) {
    const DLTensor *t = c->buf_tensors[j];
    if (!m->buffers[j].sorted || !t || t->ndim != 1 || t->shape[0] < 2) continue;
    if (!dev) st = alloc(r, w, &dev, (size_t)m->nbuffers * sizeof *rec);
    FlexParams s = *p;
    s.sorted_rec = (uint64_t *)dev + j;
    s.sorted_len = t->shape[0];
    s.sorted_slot = j;
    s.sorted_bytes = t->dtype.bits / 8;
    if (!st) st = launch(r, RT_ENTRY_SORTED, cg_launch_sorted_check(&r->opts, t->shape[0]), &s, NULL);
    if (!st) last_stats.sorted_checks++;
  }
  if (st || !dev) return st;
  st = r->be->download(r, rec, dev, (size_t)m->nbuffers * sizeof *rec);
  if (!st) st = r->be->sync(r);
  for (int j = 0; j < m->nbuffers && !st; j++) {
    if (!rec[j]) continue;
    const DLTensor *t = c->buf_tensors[j];
    int64_t i = t->shape[0] - (int64_t)rec[j], es = t->dtype.bits / 8;
    unsigned char two[16]; /* buf[i - 1], buf[i] */
    st = r->be->download(r, two, (const char *)p->buf[j] + (i - 1) * es, (size_t)(2 * es));
    if (!st) st = r->be->sync(r);
    DType dt = m->buffers[j].dtype;
    if (!st) st = rt_sorted_error(c, j, i, rt_sorted_elem(dt, two + es), rt_sorted_elem(dt, two));
  }
  return st;
}

/* ---- checked runs ------------------------------------------------------------ */

/* A checked run's verdict once the launches are done. */
static flex_status bounds_verdict(RtRun *r, Work *w) {
  int32_t rec[FLEX_BOUNDS_WORDS];
  flex_status st = r->be->download(r, rec, w->bounds, sizeof rec);
  if (!st) st = r->be->sync(r);
  return st ? st : rt_launch_bounds_report(r->c, rec);
}

/* ---- staged tensors --------------------------------------------------------------- */

/* The dtype the kernels read and write: the input dtype, except float32
 * for float64 inputs (no backend's kernels compute in float64). */
static DLDataType kernel_dtype(const RtCall *c) {
  if (c->dtype.code == kDLFloat && c->dtype.bits == 64) return (DLDataType){kDLFloat, 32, 1};
  return c->dtype;
}

/* A compact tensor of t's shape in dtype dt, in backend memory; an input
 * (!out) is converted into it now. */
static flex_status stage(RtRun *r, Work *w, const DLTensor *t, DLDataType dt, bool out,
                         void **data, FlexStrides *s) {
  if (w->nstage == (int)(sizeof w->stage / sizeof w->stage[0]))
    return rt_err(FLEX_ERR_RUNTIME, "internal: too many staged tensors in one call");
  Staged *sg = &w->stage[w->nstage++];
  memset(sg, 0, sizeof *sg);
  sg->caller = t;
  sg->out = out;
  sg->t = *t;
  sg->t.dtype = dt;
  sg->t.strides = NULL;
  sg->t.byte_offset = 0;
  flex_status st = alloc(r, w, &sg->t.data, (size_t)rt_numel(t) * (dt.bits / 8));
  if (st) return st;
  *data = sg->t.data;
  *s = rt_strides4(&sg->t);
  if (!out) return rt_tensor_copy_on(r->be, r, &sg->t, t);
  return FLEX_OK;
}

/* Tensors in a dtype other than the kernels' go through staging tensors:
 * float64 inputs (q, k, v and the backward's dout) and gradients, in the
 * kernels' dtype. `out` in another dtype is kept in fp32 (the kernels are
 * generated with CgOptions.out_f32): the caller's own tensor when it is
 * float32, else a staging tensor. */
static flex_status stage_all(RtRun *r, Work *w, FlexParams *p) {
  const RtCall *c = r->c;
  const flex_args *a = c->args;
  const DLDataType kd = kernel_dtype(c), f32 = {kDLFloat, 32, 1};
  flex_status st = FLEX_OK;
  const DLTensor *in[4] = {a->q, a->k, a->v, c->backward ? a->dout : NULL};
  const void **din[4] = {&p->q, &p->k, &p->v, &p->dout};
  FlexStrides *sin[4] = {&p->sq, &p->sk, &p->sv, &p->sdo};
  for (int i = 0; i < 4 && !st; i++)
    if (in[i] && !rt_dtype_same(in[i]->dtype, kd)) {
      void *data = NULL;
      st = stage(r, w, in[i], kd, false, &data, sin[i]);
      *din[i] = data;
    }
  if (!st && a->out && !rt_dtype_same(a->out->dtype, kd) && !rt_dtype_same(a->out->dtype, f32))
    st = stage(r, w, a->out, f32, !c->backward, &p->out, &p->so);
  if (st || !c->backward) return st;
  const DLTensor *g[3] = {a->dq, a->dk, a->dv};
  void **d[3] = {&p->dq, &p->dk, &p->dv};
  FlexStrides *s[3] = {&p->sdq, &p->sdk, &p->sdv};
  for (int i = 0; i < 3 && !st; i++)
    if (g[i] && !rt_dtype_same(g[i]->dtype, kd)) st = stage(r, w, g[i], kd, true, d[i], s[i]);
  return st;
}

/* Convert the staged outputs into the caller's tensors. */
static flex_status unstage(RtRun *r, Work *w) {
  for (int i = 0; i < w->nstage; i++) {
    const Staged *sg = &w->stage[i];
    if (!sg->out) continue;
    flex_status st = rt_tensor_copy_on(r->be, r, sg->caller, &sg->t);
    if (st) return st;
  }
  return FLEX_OK;
}

/* ---- the backward's arrays ---------------------------------------------------------- */

/* dLSE is read with lse's strides. */
static flex_status bind_dlse(const RtRun *r, FlexParams *p) {
  const flex_args *a = r->c->args;
  if (!a->dlse) return FLEX_OK;
  bool same = a->lse && rt_stride_of(a->dlse, 0) == p->lse_b &&
              rt_stride_of(a->dlse, 1) == p->lse_h && rt_stride_of(a->dlse, 2) == 1;
  if (!same)
    return rt_err(FLEX_ERR_UNSUPPORTED, "the %s backend needs 'dlse' with the same strides as "
                                        "'lse'", r->be->name);
  p->dlse = (const float *)rt_data_of(a->dlse);
  return FLEX_OK;
}

/* fp32 accumulators of the `grad` buffers: the caller's tensor when it is
 * float32 and contiguous (zeroed first), else ours (widened at the end). */
static flex_status grad_targets(RtRun *r, Work *w, FlexParams *p) {
  const RtCall *c = r->c;
  for (int i = 0; i < c->mod->nbuffers; i++) {
    const DLTensor *g = c->buf_grads[i];
    if (!g) continue;
    size_t n = (size_t)rt_numel(g);
    flex_status st;
    if (g->dtype.code == kDLFloat && g->dtype.bits == 32 && rt_contiguous(g)) {
      p->buf_grad[i] = (float *)rt_data_of(g);
      st = c->accumulate ? FLEX_OK : r->be->zero(r, p->buf_grad[i], n * 4);
    } else {
      void *m;
      st = alloc(r, w, &m, n * 4);
      w->grads[i] = p->buf_grad[i] = m;
    }
    if (st) return st;
  }
  return FLEX_OK;
}

/* Widen our fp32 buffer gradients into the caller's tensors. */
static flex_status grads_finish(RtRun *r, Work *w) {
  const RtCall *c = r->c;
  for (int i = 0; i < c->mod->nbuffers; i++) {
    if (!w->grads[i]) continue;
    const DLTensor *g = c->buf_grads[i];
    DLTensor acc = *g;
    acc.data = w->grads[i];
    acc.byte_offset = 0;
    acc.strides = NULL;
    acc.dtype = (DLDataType){kDLFloat, 32, 1};
    flex_status st = rt_tensor_copy_on(r->be, r, g, &acc);
    if (st) return st;
  }
  return FLEX_OK;
}

/* D = rowsum(dO * O) carries O's rounding into every dS of its row. A
 * buffer gradient sums dS * d score/d buffer along rows whose dS sum to
 * zero, so with O stored in 16 bits that rounding can outweigh the sum
 * (a bf16 per-head temperature's gradient measured 0.17 relative error).
 * A call with buffer gradients and a 16-bit O therefore recomputes O in
 * fp32 for D: one more forward launch, into memory of ours (the caller's
 * O and LSE are left as they are). */
static bool needs_exact_out(const RtCall *c) {
  bool grads = false;
  for (int i = 0; i < c->mod->nbuffers; i++) grads = grads || c->buf_grads[i];
  return c->backward && grads && c->dtype.bits == 16 && c->args->out &&
         rt_dtype_same(c->args->out->dtype, c->dtype);
}

/* The forward entry (generated with an fp32 O) into our O and LSE. */
static flex_status exact_out(RtRun *r, Work *w, FlexParams *p) {
  const RtCall *c = r->c;
  if (!needs_exact_out(c)) return FLEX_OK;
  int64_t QL = c->QL, H = c->H, EV = c->EV;
  size_t rows = (size_t)c->B * (size_t)H * (size_t)QL;
  void *o, *lse;
  flex_status st = alloc(r, w, &o, rows * (size_t)EV * 4);
  if (!st) st = alloc(r, w, &lse, rows * 4);
  if (st) return st;
  FlexParams f = *p;
  f.out = o, f.so = (FlexStrides){H * QL * EV, QL * EV, EV};
  f.lse = lse, f.lse_b = H * QL, f.lse_h = QL;
  st = launch(r, RT_ENTRY_FWD, cg_launch_fwd(&r->opts, c->B, c->H, c->QL), &f, NULL);
  p->out = o, p->so = f.so;
  return st;
}

/* A deterministic backward's exact accumulators of the `grad` buffers
 * (FLEX_EXACT_WORDS int64 words per element, zero-filled): the joint adds
 * into them, flex_grad_exact rounds them into the fp32 gradients. */
static flex_status exact_targets(RtRun *r, Work *w, FlexParams *p) {
  const RtCall *c = r->c;
  for (int i = 0; i < c->mod->nbuffers && r->opts.deterministic; i++) {
    if (!c->buf_grads[i]) continue;
    void *m;
    size_t n = (size_t)rt_numel(c->buf_grads[i]);
    flex_status st = alloc(r, w, &m, n * FLEX_EXACT_WORDS * sizeof(int64_t));
    if (st) return st;
    p->grad_exact[i] = m;
  }
  return FLEX_OK;
}

/* Round the exact accumulators into the fp32 gradients, one launch each. */
static flex_status exact_finish(RtRun *r, FlexParams *p) {
  const RtCall *c = r->c;
  flex_status st = FLEX_OK;
  for (int i = 0; i < c->mod->nbuffers && !st; i++) {
    if (!p->grad_exact[i]) continue;
    p->exact_slot = i;
    p->exact_len = rt_numel(c->buf_grads[i]);
    st = launch(r, RT_ENTRY_GRAD_EXACT, cg_launch_grad_exact(&r->opts, p->exact_len), p, NULL);
  }
  return st;
}

static flex_status backward(RtRun *r, Work *w, FlexParams *p) {
  const RtCall *c = r->c;
  const CgOptions *o = &r->opts;
  size_t rows = (size_t)c->B * (size_t)c->H * (size_t)c->QL;
  /* Deterministic on the generated kernels: a dQ slice per CTA of a
   * (kv head, batch) (kernels/flex_bwd.cuh). */
  int splits = o->deterministic && r->be->dq_slices ? cg_bwd_splits(o, c->B, c->HKV, c->KL) : 1;
  if (splits < 1) splits = 1;
  void *dq_acc, *delta;
  flex_status st = bind_dlse(r, p);
  if (!st) st = alloc(r, w, &dq_acc, (size_t)splits * rows * (size_t)c->E * 4);
  /* the sm_90a backward also reads each row's sum |dO| (dnorm) after D */
  if (!st) st = alloc(r, w, &delta, rows * (o->bwd_sm90 ? 8 : 4));
  if (st) return st;
  p->dq_acc = dq_acc;
  p->dq_splits = splits;
  p->dq_split_stride = (int64_t)(rows * (size_t)c->E);
  p->delta = delta;
  p->dnorm = o->bwd_sm90 ? (float *)delta + rows : NULL;
  st = grad_targets(r, w, p);
  if (!st) st = exact_targets(r, w, p);
  if (!st) st = exact_out(r, w, p);
  if (!st) st = launch(r, RT_ENTRY_BWD_PRE, cg_launch_bwd_pre(o, c->B, c->H, c->QL), p, NULL);
  if (!st) st = launch(r, RT_ENTRY_BWD, cg_launch_bwd(o, c->B, c->HKV, c->KL), p, &last_stats.bwd_tiles);
  if (!st) st = launch(r, RT_ENTRY_BWD_DQ, cg_launch_bwd_dq(o, c->B, c->H, c->QL), p, NULL);
  if (!st) st = exact_finish(r, p);
  return st;
}

/* ---- the forward, split or not ------------------------------------------------------ */

/* flex_fwd over the whole key range, or into S partials in memory of ours
 * merged by flex_fwd_combine into O and LSE. The grid is p's (heads and
 * rows are a packed call's kv heads and packed rows). */
static flex_status forward(RtRun *r, Work *w, const FlexParams *p, int S) {
  if (S > last_stats.kv_splits) last_stats.kv_splits = S;
  if (S <= 1)
    return launch(r, RT_ENTRY_FWD, cg_launch_fwd(&r->opts, p->B, p->H, p->q_len), p,
                  &last_stats.fwd_tiles);
  const size_t rows = (size_t)S * (size_t)p->B * (size_t)p->H * (size_t)p->q_len;
  void *po, *plse;
  flex_status st = alloc(r, w, &po, rows * (size_t)p->EV * 4);
  if (!st) st = alloc(r, w, &plse, rows * 4);
  if (st) return st;
  FlexParams f = *p;
  f.kv_splits = S, f.part_o = po, f.part_lse = plse;
  st = launch(r, RT_ENTRY_FWD, cg_launch_fwd_split(&r->opts, p->B, p->H, p->q_len, S), &f,
              &last_stats.fwd_tiles);
  if (!st)
    st = launch(r, RT_ENTRY_FWD_COMBINE, cg_launch_fwd_combine(&r->opts, p->B, p->H, p->q_len),
                &f, NULL);
  return st;
}

/* The packed call's params: HKV heads of G Q_LEN rows, one group per head. */
static void pack_params(FlexParams *p) {
  const int G = p->G;
  p->pack_g = G, p->pack_q_len = p->q_len;
  p->sq.h *= G, p->so.h *= G, p->lse_h *= G;
  p->q_len *= G, p->H = p->HKV, p->G = 1;
}

/* ---- one call ------------------------------------------------------------------------ */

/* Grouped-query packing needs a group's rows evenly spaced in q, out and
 * lse (head stride = Q_LEN x row stride: contiguous tensors). */
static bool rows_packable(const RtCall *c) {
  const flex_args *a = c->args;
  FlexStrides q = rt_strides4(a->q), o = rt_strides4(a->out);
  return q.h == c->QL * q.row && (!a->out || o.h == c->QL * o.row) &&
         (!a->lse || rt_stride_of(a->lse, 1) == c->QL);
}

/* Every kernel choice of the call (cg_plan), then the mask's arrays. */
static flex_status plan(RtRun *r, Work *w, int *splits) {
  const RtCall *c = r->c;
  const flex_args *a = c->args;
  DLDataType kd = kernel_dtype(c);
  const flex_block_mask *bm = a->block_mask;
  CgShape s = {.dtype = kd.code == kDLBfloat ? CG_BF16 : kd.bits == 16 ? CG_FP16 : CG_FP32,
               .B = c->B, .H = c->H, .HKV = c->HKV, .QL = c->QL, .KL = c->KL, .E = c->E,
               .EV = c->EV, .backward = c->backward, .dropout = a->dropout_p > 0.0f,
               .paged = c->pages != NULL, .deterministic = a->deterministic,
               .tma_ok = rt_launch_tma_ok(c),
               .out_f32 = (a->out && !rt_dtype_same(a->out->dtype, kd)) || needs_exact_out(c),
               .mask_block_q = bm ? (bm->block_q ? bm->block_q : 128) : 0,
               .mask_block_kv = bm ? (bm->block_kv ? bm->block_kv : 128) : 0,
               .kv_splits = a->kv_splits, .scale = (float)c->scale, .pack_ok = rows_packable(c),
               .offsets = c->q_off != 0 || c->kv_off != 0, .check_bounds = a->check_bounds};
  char err[512];
  if (!cg_plan(&r->opts, splits, c->mod, &s, &r->dev, err, sizeof err))
    return rt_err(FLEX_ERR_UNSUPPORTED, "the %s backend cannot run this call: %s", r->be->name, err);
  r->opts.source = c->kernel->src.path;
  r->opts.fast_math = a->fast_math;
  r->opts.watchdog = r->dev.watchdog;
  last_stats.mode = r->opts.mask_mode;
  last_stats.fwd_sm90 = r->opts.fwd_sm90;
  last_stats.bwd_sm90 = r->opts.bwd_sm90 && c->backward;
  last_stats.pack_gqa = last_stats.pack_gqa || r->opts.pack_gqa;
  return plan_mask(r, w);
}

static flex_status run(RtRun *r, Work *w) {
  const RtCall *c = r->c;
  FlexParams p;
  int splits = 1;
  flex_status st = r->be->open(r);
  if (!st) st = sorted_on_host(r);
  if (!st) st = plan(r, w, &splits);
  if (!st) st = rt_launch_fill(c, &p, r->be->name);
  if (st) return st;
  last_stats.vec16 = p.vec16 != 0;
  st = stage_all(r, w, &p);
  if (r->opts.pack_gqa) pack_params(&p);
  if (!st) st = r->be->prepare(r);
  if (!st) st = sorted_on_device(r, w, &p);
  if (!st && c->args->check_bounds) {
    void *b;
    st = alloc(r, w, &b, FLEX_BOUNDS_WORDS * sizeof(int32_t));
    p.bounds = w->bounds = b;
  }
  if (!st) st = mask_lists(r, w, &p);
  if (st) return st;
  if (!c->backward)
    st = forward(r, w, &p, splits);
  else
    st = backward(r, w, &p);
  if (!st && w->bounds) st = bounds_verdict(r, w);
  if (!st) st = unstage(r, w);
  if (!st && c->backward) st = grads_finish(r, w);
  return st;
}

/* One call, forward or backward (c->backward), on backend `be`. Launches
 * are asynchronous on a device whose memory of ours goes back in the
 * stream's order (or with none to free). */
flex_status rt_run(const RtBackend *be, const RtCall *c) {
  if (!c->accumulate) memset(&last_stats, 0, sizeof last_stats);
  RtRun r;
  memset(&r, 0, sizeof r);
  r.be = be;
  r.c = c;
  r.stream = c->args->stream;
  Work w;
  memset(&w, 0, sizeof w);
  flex_status st = run(&r, &w);
  if (w.nmem && !r.ordered_release) { /* the launches read our memory: wait before freeing it */
    flex_status st2 = be->sync(&r);
    if (!st) st = st2;
  }
  work_free(&r, &w);
  if (be->close) be->close(&r);
  return st;
}

void rt_run_stats_reset(void) { memset(&last_stats, 0, sizeof last_stats); }

flex_status rt_call_one(const RtBackend *be, const flex_kernel *k, const flex_args *a,
                        bool backward, const RtSeq *seq) {
  Arena arena = {0};
  RtCall c;
  flex_status st = rt_validate(&c, &arena, k, a, backward, seq);
  if (st == FLEX_OK) {
    if (be) st = rt_run(be, &c);
    else st = backward ? rt_reference_backward(&c) : rt_reference_forward(&c);
  }
  arena_free(&arena);
  return st;
}
