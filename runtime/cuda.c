/* cuda.c: the CUDA backend. For one validated call: check that every tensor
 * lives on the same CUDA device, pick the target arch from the device,
 * generate and compile the kernels through the cache, fill the params
 * struct from the call, and launch on the caller's stream.
 *
 *   forward:  flex_fwd
 *   backward: flex_bwd_pre (D, zero dQ accumulator) -> flex_bwd -> flex_bwd_dq
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cache.h"
#include "codegen/codegen.h"
#include "driver.h"
#include "kernels/params.cuh"
#include "launch.h"
#include "rt.h"

/* ---- tensors ------------------------------------------------------------- */

/* A tensor's device, or an error naming it. Optional tensors may be NULL. */
static flex_status on_device(const char *name, const DLTensor *t, int *device) {
  if (!t) return FLEX_OK;
  if (t->device.device_type != kDLCUDA && t->device.device_type != kDLCUDAManaged)
    return rt_err(FLEX_ERR_INVALID,
                  "the cuda backend needs every tensor on a CUDA device, but '%s' is on "
                  "device type %d (%s), id %d",
                  name, (int)t->device.device_type,
                  t->device.device_type == kDLCPU ? "CPU" : "not CUDA", (int)t->device.device_id);
  if (*device < 0) *device = t->device.device_id;
  else if (*device != t->device.device_id)
    return rt_err(FLEX_ERR_INVALID, "'%s' is on CUDA device %d, but the other tensors are on %d",
                  name, (int)t->device.device_id, *device);
  return FLEX_OK;
}

/* The device every tensor of the call lives on. */
static flex_status call_device(const RtCall *c, int *device) {
  const flex_args *a = c->args;
  *device = -1;
  const struct { const char *n; const DLTensor *t; } ts[] = {
      {"q", a->q}, {"k", a->k}, {"v", a->v}, {"out", a->out}, {"lse", a->lse},
      {"dout", a->dout}, {"dlse", a->dlse}, {"dq", a->dq}, {"dk", a->dk}, {"dv", a->dv}};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    if (!c->backward && i >= 5) break;
    flex_status st = on_device(ts[i].n, ts[i].t, device);
    if (st) return st;
  }
  for (int i = 0; i < c->mod->nbuffers; i++) {
    flex_status st = on_device(c->mod->buffers[i].id, c->buf_tensors[i], device);
    if (!st && c->backward) st = on_device(c->mod->buffers[i].id, c->buf_grads[i], device);
    if (st) return st;
  }
  if (a->block_mask) {
    const flex_block_mask *m = a->block_mask;
    const DLTensor *bm[] = {m->kv_num_blocks, m->kv_indices, m->full_kv_num_blocks,
                            m->full_kv_indices, m->q_num_blocks, m->q_indices,
                            m->full_q_num_blocks, m->full_q_indices};
    for (int i = 0; i < 8; i++) {
      flex_status st = on_device("block_mask", bm[i], device);
      if (st) return st;
    }
  }
  if (*device < 0) *device = 0;
  return FLEX_OK;
}

/* ---- the params struct ----------------------------------------------------- */

/* FlexParams from the call (runtime/launch.c); the kernels write outputs
 * in the input dtype, in place. */
static flex_status fill_params(const RtCall *c, FlexParams *p) {
  const flex_args *a = c->args;
  const DLTensor *outs[] = {a->out, c->backward ? a->dq : NULL, c->backward ? a->dk : NULL,
                            c->backward ? a->dv : NULL};
  const char *onames[] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; i++)
    if (outs[i] && (outs[i]->dtype.code != c->dtype.code || outs[i]->dtype.bits != c->dtype.bits))
      return rt_err(FLEX_ERR_UNSUPPORTED, "the cuda backend writes '%s' in the dtype of q "
                    "(%d-bit code %d), got %d-bit code %d", onames[i], c->dtype.bits,
                    c->dtype.code, outs[i]->dtype.bits, outs[i]->dtype.code);
  return rt_launch_fill(c, p, "cuda");
}

/* ---- arch --------------------------------------------------------------------- */

/* NVRTC's target for a device: sm_90a on 9.0 (wgmma paths), sm_XY elsewhere. */
static flex_status pick_arch(int device, char *arch, size_t cap) {
  int major = 0, minor = 0;
  flex_status st = rt_drv_compute_capability(device, &major, &minor);
  if (st) return st;
  if (major < 8)
    return rt_err(FLEX_ERR_UNSUPPORTED,
                  "CUDA device %d has compute capability %d.%d; flexc needs 8.0 or newer "
                  "(mma.sync m16n8k16 with bf16)", device, major, minor);
  snprintf(arch, cap, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
  return FLEX_OK;
}

/* ---- launching --------------------------------------------------------------- */

/* One kernel launch: entry name and geometry. */
typedef struct Launch {
  const char *entry;            /* extern "C" name */
  unsigned grid[3], block[3];   /* geometry */
  unsigned smem;                /* dynamic shared memory bytes */
} Launch;

/* Look up and launch one entry of the module with the params struct. A
 * grid with no blocks (an empty sequence) has nothing to do: the driver
 * would reject it. */
static flex_status launch(RtCuModule mod, const Launch *l, const FlexParams *p, RtCuStream s) {
  if (!l->grid[0] || !l->grid[1] || !l->grid[2]) return FLEX_OK;
  flex_status st = rt_launch_check_geometry("cuda", l->entry, l->grid, l->block);
  if (st) return st;
  RtCuFunction f;
  st = rt_drv_function(&f, mod, l->entry);
  if (!st) st = rt_drv_set_smem(f, (int)l->smem);
  void *args[1] = {(void *)p};
  if (!st) st = rt_drv_launch(f, l->grid, l->block, l->smem, s, args);
  if (st) return rt_err(st, "launching %s: %s", l->entry, flex_last_error());
  return FLEX_OK;
}

/* The code generator's element type for the call's dtype. */
static CgDtype cg_dtype_of(DLDataType t) {
  if (t.code == kDLBfloat) return CG_BF16;
  return t.bits == 16 ? CG_FP16 : CG_FP32;
}

static Launch launch_of(const char *entry, CgLaunch g) {
  Launch l;
  l.entry = entry;
  memcpy(l.grid, g.grid, sizeof l.grid);
  memcpy(l.block, g.block, sizeof l.block);
  l.smem = (unsigned)g.smem;
  return l;
}

/* A caller's BlockMask on the device, copied to the host (it is small:
 * B*H*blocks int32) so that it is validated and normalised exactly as on
 * the other backends, its q side derived when absent. */
typedef struct HostMask {
  flex_block_mask m; /* the caller's mask with host tensors */
  DLTensor t[8];     /* host copies of its eight tensors */
  void *data[8];     /* their memory */
} HostMask;

static void host_mask_free(HostMask *h) {
  for (int i = 0; i < 8; i++) base_free(h->data[i]);
}

/* On the caller's stream: the mask may still be being written there, and a
 * non-blocking stream does not wait for the legacy default stream. */
static flex_status host_mask_copy(const flex_block_mask *u, HostMask *h, RtCuStream strm) {
  memset(h, 0, sizeof *h);
  h->m = *u;
  const DLTensor **side[8] = {&h->m.kv_num_blocks, &h->m.kv_indices, &h->m.full_kv_num_blocks,
                              &h->m.full_kv_indices, &h->m.q_num_blocks, &h->m.q_indices,
                              &h->m.full_q_num_blocks, &h->m.full_q_indices};
  for (int i = 0; i < 8; i++) {
    const DLTensor *t = *side[i];
    if (!t) continue;
    /* Copied as it is; rt_block_mask_from_user then checks dtype and shape. */
    size_t esz = (t->dtype.bits + 7u) / 8u;
    if (!esz || t->ndim < 0 || t->ndim > 8 || (t->ndim && !t->shape))
      return rt_err(FLEX_ERR_INVALID, "block_mask: a tensor has no element size or shape");
    int64_t span = 1; /* elements from the first to the last, strides included */
    for (int d = 0; d < t->ndim; d++) {
      int64_t st = rt_stride_of(t, d);
      if (t->shape[d] < 0 || st < 0)
        return rt_err(FLEX_ERR_INVALID, "block_mask: negative extents or strides are not supported");
      if (t->shape[d] == 0) span = 0;
      if (span) span += (t->shape[d] - 1) * st;
    }
    if (span > ((int64_t)1 << 31))
      return rt_err(FLEX_ERR_INVALID, "block_mask: a tensor spans %lld elements, more than any "
                                      "block mask has", (long long)span);
    h->data[i] = base_alloc((size_t)span * esz + esz);
    flex_status st = span ? rt_drv_memcpy_dtoh(h->data[i], (RtCuDevicePtr)(uintptr_t)rt_data_of(t),
                                               (size_t)span * esz, strm)
                          : FLEX_OK;
    if (st) return st;
    h->t[i] = *t;
    h->t[i].data = h->data[i];
    h->t[i].byte_offset = 0;
    h->t[i].device.device_type = kDLCPU;
    h->t[i].device.device_id = 0;
    *side[i] = &h->t[i];
  }
  return rt_drv_sync(strm);
}

/* The generated source for the call and each entry's geometry; the mask
 * mode comes from the shared plan (runtime/launch.c): implicit
 * classification, a caller's BlockMask (copied to the host and validated),
 * or one built on the device. mb[0..1]: the builder's two entries
 * (plan->build). */
static flex_status generate(const RtCall *c, const char *arch, Buf *src, Launch *fwd,
                            Launch bwd[3], RtMaskPlan *plan, Launch mb[2]) {
  CgArch ca;
  if (!cg_arch_parse(arch, &ca)) ca = CG_SM89; /* newer parts: the portable mma.sync path */
  CgOptions o;
  char err[512];
  if (!cg_options_init(&o, c->mod, cg_dtype_of(c->dtype), c->E, c->EV, ca, c->backward, err,
                       sizeof err))
    return rt_err(FLEX_ERR_UNSUPPORTED, "the cuda backend cannot run this call: %s", err);
  flex_status st;
  if (c->args->block_mask) { /* plan with the host copy of the caller's mask */
    HostMask hm;
    flex_args ha = *c->args;
    RtCall hc = *c;
    st = host_mask_copy(c->args->block_mask, &hm, (RtCuStream)c->args->stream);
    ha.block_mask = &hm.m;
    hc.args = &ha;
    if (!st) st = rt_launch_mask_plan(&hc, &o, plan);
    host_mask_free(&hm);
  } else {
    st = rt_launch_mask_plan(c, &o, plan);
  }
  if (st) return st;
  o.source = c->kernel->src.path;
  o.check_bounds = c->args->check_bounds;
  o.fast_math = c->args->fast_math;
  cg_emit_cuda(src, c->mod, &o);
  *fwd = launch_of("flex_fwd", cg_launch_fwd(&o, c->B, c->H, c->QL));
  bwd[0] = launch_of("flex_bwd_pre", cg_launch_bwd_pre(&o, c->B, c->H, c->QL));
  bwd[1] = launch_of("flex_bwd", cg_launch_bwd(&o, c->B, c->HKV, c->KL));
  bwd[2] = launch_of("flex_bwd_dq", cg_launch_bwd_dq(&o, c->B, c->H, c->QL));
  mb[0] = launch_of("flex_mask_build", cg_launch_mask_build(&o, plan->Bm, plan->Hm, plan->nq));
  mb[1] = launch_of("flex_mask_lists",
                    cg_launch_mask_lists(&o, plan->Bm, plan->Hm, plan->nq, plan->nkv));
  return FLEX_OK;
}

/* Device memory of a built BlockMask. */
typedef struct BuiltMask {
  RtCuDevicePtr mem[9]; /* the eight lists, then the class bytes */
} BuiltMask;

/* Build the BlockMask on the device (flex_mask_build, flex_mask_lists)
 * and point the walk lists at it. */
static flex_status build_mask(const RtMaskPlan *plan, FlexParams *p, RtCuModule mod,
                              const Launch mb[2], BuiltMask *bm, RtCuStream strm) {
  size_t bytes[9];
  rt_launch_mask_bytes(plan, bytes);
  flex_status st = FLEX_OK;
  for (int i = 0; i < 9 && !st; i++) st = rt_drv_alloc(&bm->mem[i], bytes[i] ? bytes[i] : 4);
  if (st) return st;
  int32_t *arr[8];
  for (int i = 0; i < 8; i++) arr[i] = (int32_t *)(uintptr_t)bm->mem[i];
  rt_launch_builder(p, plan, (unsigned char *)(uintptr_t)bm->mem[8], arr);
  st = launch(mod, &mb[0], p, strm);
  if (!st) st = launch(mod, &mb[1], p, strm);
  return st;
}

/* Upload a caller's BlockMask in normal form and point the walk lists at it. */
static flex_status upload_mask(const RtMaskPlan *plan, FlexParams *p, BuiltMask *bm,
                               RtCuStream strm) {
  const RtBlockMask *b = &plan->bm;
  int32_t *const host[8] = {b->kv_num_blocks, b->kv_indices, b->full_kv_num_blocks,
                            b->full_kv_indices, b->q_num_blocks, b->q_indices,
                            b->full_q_num_blocks, b->full_q_indices};
  size_t bh = (size_t)b->B * (size_t)b->H, nq = (size_t)b->nq, nkv = (size_t)b->nkv;
  const size_t n[8] = {bh * nq, bh * nq * nkv, bh * nq, bh * nq * nkv,
                       bh * nkv, bh * nkv * nq, bh * nkv, bh * nkv * nq};
  int32_t *dev[8] = {0};
  flex_status st = FLEX_OK;
  for (int i = 0; i < 8 && !st; i++) {
    if (!host[i]) continue; /* no full_* side */
    st = rt_drv_alloc(&bm->mem[i], n[i] * 4 + 4);
    if (!st && n[i]) st = rt_drv_memcpy_htod(bm->mem[i], host[i], n[i] * 4, strm);
    dev[i] = (int32_t *)(uintptr_t)bm->mem[i];
  }
  if (st) return st;
  rt_launch_set_lists(p, dev, b->B, b->H, b->nq, b->nkv, b->block_q, b->block_kv);
  return FLEX_OK;
}

/* Scratch device memory of one backward call. */
typedef struct Scratch {
  RtCuDevicePtr dq_acc, delta;             /* fp32 dQ accumulator and D */
  RtCuDevicePtr grad[FLEX_MAX_BUFFERS];    /* fp32 buffer-gradient accumulators we own */
} Scratch;

static void scratch_free(Scratch *s) {
  rt_drv_free(s->dq_acc);
  rt_drv_free(s->delta);
  for (int i = 0; i < FLEX_MAX_BUFFERS; i++) rt_drv_free(s->grad[i]);
}

/* Point the buffer-gradient accumulators at zeroed fp32 memory: the
 * caller's tensor when it is float32 and contiguous, else our own. */
static flex_status grad_targets(const RtCall *c, FlexParams *p, Scratch *s, RtCuStream strm) {
  for (int i = 0; i < c->mod->nbuffers; i++) {
    const DLTensor *g = c->buf_grads[i];
    if (!g) continue;
    if (!rt_contiguous(g))
      return rt_err(FLEX_ERR_UNSUPPORTED, "the cuda backend needs the gradient of buffer '%s' "
                                          "contiguous", c->mod->buffers[i].id);
    size_t n = (size_t)rt_numel(g);
    flex_status st = FLEX_OK;
    if (g->dtype.code == kDLFloat && g->dtype.bits == 32) {
      p->buf_grad[i] = (float *)rt_data_of(g);
    } else {
      st = rt_drv_alloc(&s->grad[i], n * 4);
      p->buf_grad[i] = (float *)(uintptr_t)s->grad[i];
    }
    if (!st) st = rt_drv_memset32((RtCuDevicePtr)(uintptr_t)p->buf_grad[i], 0, n, strm);
    if (st) return st;
  }
  return FLEX_OK;
}

/* Widen our fp32 buffer gradients into the caller's float64 tensors. */
static flex_status grad_finish(const RtCall *c, Scratch *s, RtCuStream strm) {
  for (int i = 0; i < c->mod->nbuffers; i++) {
    if (!s->grad[i]) continue;
    const DLTensor *g = c->buf_grads[i];
    size_t n = (size_t)rt_numel(g);
    float *f = base_alloc(n * 4 + 4);
    double *d = base_alloc(n * 8 + 8);
    flex_status st = rt_drv_memcpy_dtoh(f, s->grad[i], n * 4, strm);
    if (!st) st = rt_drv_sync(strm);
    for (size_t j = 0; !st && j < n; j++) d[j] = f[j];
    if (!st) st = rt_drv_memcpy_htod((RtCuDevicePtr)(uintptr_t)rt_data_of(g), d, n * 8, strm);
    if (!st) st = rt_drv_sync(strm);
    base_free(f);
    base_free(d);
    if (st) return st;
  }
  return FLEX_OK;
}

static flex_status run_backward(const RtCall *c, FlexParams *p, RtCuModule mod,
                                const Launch bwd[3], RtCuStream strm) {
  const flex_args *a = c->args;
  if (a->dlse) {
    bool same = a->lse && a->dlse->dtype.code == kDLFloat && a->dlse->dtype.bits == 32 &&
                rt_stride_of(a->dlse, 0) == p->lse_b && rt_stride_of(a->dlse, 1) == p->lse_h &&
                rt_stride_of(a->dlse, 2) == 1;
    if (!same)
      return rt_err(FLEX_ERR_UNSUPPORTED, "the cuda backend needs 'dlse' as float32 with the "
                                          "same strides as 'lse'");
    p->dlse = (const float *)rt_data_of(a->dlse);
  }
  Scratch s;
  memset(&s, 0, sizeof s);
  size_t rows = (size_t)c->B * (size_t)c->H * (size_t)c->QL;
  flex_status st = rt_drv_alloc(&s.dq_acc, rows * (size_t)c->E * 4);
  if (!st) st = rt_drv_alloc(&s.delta, rows * 4);
  p->dq_acc = (float *)(uintptr_t)s.dq_acc;
  p->delta = (float *)(uintptr_t)s.delta;
  if (!st) st = grad_targets(c, p, &s, strm);
  for (int i = 0; !st && i < 3; i++) st = launch(mod, &bwd[i], p, strm);
  if (!st) st = grad_finish(c, &s, strm);
  /* The launches read the scratch: wait before freeing it. */
  flex_status st2 = rt_drv_sync(strm);
  scratch_free(&s);
  return st ? st : st2;
}

/* A checked run's `sorted` promises: the buffers live on the device, so the
 * sorted ones (1-D, small) are read back first. */
static flex_status check_sorted_on_device(const RtCall *c, RtCuStream strm) {
  IrBufView views[FLEX_MAX_BUFFERS];
  void *host[FLEX_MAX_BUFFERS] = {0};
  flex_status st = FLEX_OK;
  for (int j = 0; j < c->mod->nbuffers && j < FLEX_MAX_BUFFERS; j++) {
    views[j] = c->bufs[j];
    views[j].data = NULL;
    const DLTensor *t = c->buf_tensors[j];
    if (st || !c->mod->buffers[j].sorted || !t || t->ndim != 1 || t->shape[0] <= 0) continue;
    size_t es = (t->dtype.bits + 7u) / 8u, span = (size_t)((t->shape[0] - 1) * rt_stride_of(t, 0) + 1);
    host[j] = base_alloc(span * es + es);
    st = rt_drv_memcpy_dtoh(host[j], (RtCuDevicePtr)(uintptr_t)rt_data_of(t), span * es, strm);
    views[j].data = host[j];
  }
  if (!st) st = rt_drv_sync(strm);
  if (!st) st = rt_check_sorted(c, views);
  for (int j = 0; j < FLEX_MAX_BUFFERS; j++) base_free(host[j]);
  return st;
}

/* Generate, compile (through the cache), load and launch. */
static flex_status rt_cuda_run(const RtCall *c, FlexParams *p, int device, const char *arch) {
  Buf src = {0};
  Launch fwd, bwd[3], mb[2];
  RtMaskPlan plan;
  flex_status st = generate(c, arch, &src, &fwd, bwd, &plan, mb);
  RtCuModule mod = NULL;
  if (!st) st = rt_cuda_module_for(src.data, src.len, "cubin", arch, device, &mod);
  buf_free(&src);
  if (st) return st;
  RtCuStream strm = (RtCuStream)c->args->stream;
  RtCuDevicePtr bounds = 0; /* checked runs: the failure record */
  if (c->args->check_bounds) {
    st = check_sorted_on_device(c, strm);
    if (!st) st = rt_drv_alloc(&bounds, FLEX_BOUNDS_WORDS * 4);
    if (!st) st = rt_drv_memset32(bounds, 0, FLEX_BOUNDS_WORDS, strm);
    p->bounds = (int32_t *)(uintptr_t)bounds;
    if (st) {
      rt_drv_free(bounds);
      rt_launch_mask_free(&plan);
      return st;
    }
  }
  BuiltMask bm;
  memset(&bm, 0, sizeof bm);
  if (plan.build) st = build_mask(&plan, p, mod, mb, &bm, strm);
  else if (plan.user) st = upload_mask(&plan, p, &bm, strm);
  if (!st && !c->backward)
    st = launch(mod, &fwd, p, strm); /* asynchronous, like any launch on the caller's stream */
  else if (!st)
    st = run_backward(c, p, mod, bwd, strm);
  if (plan.build || plan.user) { /* the launches read the mask: wait before freeing it */
    flex_status st2 = rt_drv_sync(strm);
    for (int i = 0; i < 9; i++) rt_drv_free(bm.mem[i]);
    if (!st) st = st2;
  }
  if (bounds) { /* the verdict of a checked run */
    int32_t rec[FLEX_BOUNDS_WORDS];
    flex_status st2 = rt_drv_memcpy_dtoh(rec, bounds, sizeof rec, strm);
    if (!st2) st2 = rt_drv_sync(strm);
    if (!st) st = st2 ? st2 : rt_launch_bounds_report(c, rec);
    rt_drv_free(bounds);
  }
  rt_launch_mask_free(&plan);
  return st;
}

/* ---- one call ------------------------------------------------------------------- */

/* Check the device, make its context current and fill the params. */
static flex_status prepare(const RtCall *c, FlexParams *p, int *device, char *arch, size_t cap) {
  flex_status st = rt_drv_init();
  if (!st) st = call_device(c, device);
  if (!st) st = rt_drv_use_device(*device);
  if (!st) st = pick_arch(*device, arch, cap);
  if (!st) st = fill_params(c, p);
  return st;
}

/* One call, forward or backward (c->backward). */
static flex_status cuda_call(const RtCall *c) {
  FlexParams p;
  int device;
  char arch[32];
  flex_status st = prepare(c, &p, &device, arch, sizeof arch);
  if (st) return st;
  return rt_cuda_run(c, &p, device, arch);
}

flex_status rt_cuda_forward(const RtCall *c) { return cuda_call(c); }
flex_status rt_cuda_backward(const RtCall *c) { return cuda_call(c); }
