/* cuda.c: the CUDA backend's verbs (runtime/backend.h). For one call:
 * check that every tensor lives on the same CUDA device, pick the target
 * arch from the device, compile the generated kernels through the cache
 * (cuda/cache.c, cuda/nvrtc.c), and launch on the caller's stream through
 * the dlopened driver (cuda/driver.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "cuda/cache.h"
#include "cuda/driver.h"
#include "runtime/backend.h"
#include "runtime/launch.h"

/* The per-call state: NVRTC's target for the device. */
typedef struct CudaState {
  char arch[32]; /* "sm_90a", "sm_86", ... */
} CudaState;

/* ---- tensors ------------------------------------------------------------- */

/* The device every tensor of the call lives on (or the first error). */
typedef struct Where {
  int device;        /* -1: none seen yet */
  flex_status st;
} Where;

static void on_device(void *ctx, const char *name, const DLTensor *t) {
  Where *w = ctx;
  if (w->st) return;
  if (t->device.device_type != kDLCUDA && t->device.device_type != kDLCUDAManaged)
    w->st = rt_err(FLEX_ERR_INVALID,
                   "the cuda backend needs every tensor on a CUDA device, but '%s' is on "
                   "device type %d (%s), id %d",
                   name, (int)t->device.device_type,
                   t->device.device_type == kDLCPU ? "CPU" : "not CUDA", (int)t->device.device_id);
  else if (w->device < 0) w->device = t->device.device_id;
  else if (w->device != t->device.device_id)
    w->st = rt_err(FLEX_ERR_INVALID, "'%s' is on CUDA device %d, but the other tensors are on %d",
                   name, (int)t->device.device_id, w->device);
}

static flex_status call_device(const RtCall *c, int *device) {
  Where w = {-1, FLEX_OK};
  rt_call_tensors(c, on_device, &w);
  *device = w.device < 0 ? 0 : w.device;
  return w.st;
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

/* ---- the verbs ------------------------------------------------------------------ */

static flex_status cuda_open(RtRun *r) {
  flex_status st = rt_drv_init();
  int device = 0;
  if (!st && r->c) st = call_device(r->c, &device);
  if (!st) st = rt_drv_use_device(device);
  if (st || !r->c) {
    r->device = device;
    return st;
  }
  CudaState *s = base_alloc(sizeof *s);
  r->state = s;
  r->device = device;
  st = pick_arch(device, s->arch, sizeof s->arch);
  r->dev = (CgDevice){.arch = CG_SM80};
  if (!st && !cg_arch_parse(s->arch, &r->dev.arch)) r->dev.arch = CG_SM89; /* newer parts: the portable mma.sync path */
  if (!st && rt_drv_sm_count(device, &r->dev.sms)) r->dev.sms = 0; /* unknown: the heuristic's default */
  /* The sm_90a forward and backward on a GPU: each opt-in
   * ($FLEXC_CUDA_SM90_FWD=1, $FLEXC_CUDA_SM90_BWD=1) until it has been run
   * on hardware (both are verified on the emulator), and only with a
   * driver that encodes tensor maps. */
  const BaseConfig *cfg = base_config();
  r->dev.tensor_maps = (r->c->backward ? cfg->cuda_sm90_bwd : cfg->cuda_sm90_fwd) &&
                       rt_drv_has_tensor_maps();
  r->dev.watchdog = cfg->cuda_watchdog; /* a hang's location (docs/config.md) */
  r->ordered_release = rt_drv_has_pools(device); /* cuda_alloc, cuda_release */
  return st;
}

/* Generate, compile (through the cache) and load the module. */
static flex_status cuda_prepare(RtRun *r) {
  Buf src = {0};
  cg_emit_cuda(&src, r->c->mod, &r->opts);
  RtCuModule mod = NULL;
  CudaState *s = r->state;
  flex_status st = rt_cuda_module_for(src.data, src.len, "cubin", s->arch, r->device, &mod);
  buf_free(&src);
  r->module = mod;
  return st;
}

/* A call's workspace on a device with memory pools (r->ordered_release,
 * set by cuda_open for a call) lives in the call's stream order:
 * allocated, used and freed there, the call never waits for the device.
 * A tensor of the public API (flex_tensor_alloc, no call) may be used on
 * any stream later: cuMemAlloc and cuMemFree. */
static flex_status cuda_alloc(RtRun *r, void **out, size_t bytes) {
  RtCuDevicePtr p = 0;
  size_t words = (bytes + 3) / 4; /* whole words, so that the fill covers every byte */
  flex_status st = r->ordered_release ? rt_drv_alloc_async(&p, words * 4, (RtCuStream)r->stream)
                                      : rt_drv_alloc(&p, words * 4);
  if (!st) st = rt_drv_memset32(p, 0, words, (RtCuStream)r->stream);
  *out = (void *)(uintptr_t)p;
  return st;
}

static void cuda_release(RtRun *r, void *p) {
  if (!p) return;
  if (r->ordered_release) rt_drv_free_async((RtCuDevicePtr)(uintptr_t)p, (RtCuStream)r->stream);
  else rt_drv_free((RtCuDevicePtr)(uintptr_t)p);
}

static flex_status cuda_zero(RtRun *r, void *p, size_t bytes) {
  return rt_drv_memset32((RtCuDevicePtr)(uintptr_t)p, 0, bytes / 4, (RtCuStream)r->stream);
}

static flex_status cuda_upload(RtRun *r, void *dst, const void *src, size_t bytes) {
  return rt_drv_memcpy_htod((RtCuDevicePtr)(uintptr_t)dst, src, bytes, (RtCuStream)r->stream);
}

static flex_status cuda_download(RtRun *r, void *dst, const void *src, size_t bytes) {
  return rt_drv_memcpy_dtoh(dst, (RtCuDevicePtr)(uintptr_t)src, bytes, (RtCuStream)r->stream);
}

/* RtTmapEncode through the driver. */
static const char *cuda_tmap(void *ctx, FlexTmapBytes *map, const void *base, const uint64_t dims[4],
                             const uint64_t strides[3], const uint32_t box[4]) {
  (void)ctx;
  static _Thread_local char why[512]; /* the caller formats it into the next error */
  if (!rt_drv_tensor_map_16(map, 4, base, dims, strides, box)) return NULL;
  snprintf(why, sizeof why, "%s", flex_last_error());
  return why;
}

/* Look up and launch one entry of the module with the params struct. */
static flex_status cuda_launch(RtRun *r, RtEntry e, const CgLaunch *g, const void *params) {
  const char *entry = rt_entry_name(e);
  RtCuFunction f;
  flex_status st = rt_drv_function(&f, (RtCuModule)r->module, entry);
  if (!st) st = rt_drv_set_smem(f, (int)g->smem);
  void *args[1] = {(void *)params}; /* copied at launch */
  if (!st) st = rt_drv_launch(f, g->grid, g->block, (unsigned)g->smem, (RtCuStream)r->stream, args);
  if (st) return rt_err(st, "launching %s: %s", entry, flex_last_error());
  return FLEX_OK;
}

static flex_status cuda_sync(RtRun *r) { return rt_drv_sync((RtCuStream)r->stream); }

static void cuda_close(RtRun *r) {
  base_free(r->state);
  r->state = NULL;
}

flex_status rt_cuda_device_name(int device, char *out, size_t cap) {
  return rt_drv_device_name(device, out, cap);
}

const RtBackend rt_cuda_backend = {
    .name = "cuda",
    .host_memory = false,
    .sorted_entry = true,
    .dq_slices = true,
    .open = cuda_open,
    .prepare = cuda_prepare,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .zero = cuda_zero,
    .upload = cuda_upload,
    .download = cuda_download,
    .launch = cuda_launch,
    .sync = cuda_sync,
    .close = cuda_close,
    .tmap = cuda_tmap,
};
