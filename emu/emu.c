/* emu.c: the emulator backend's verbs (runtime/backend.h): the generated
 * CUDA source, compiled with the host C++ compiler against the shim
 * (emu/emu_*.h, emu/build.c), run on the CPU.
 *
 * The caller's tensors live in host memory, so the kernels read and write
 * them in place, exactly as they would device memory; every tensor of the
 * call and every allocation of ours is registered as an allocation, so an
 * access outside all of them fails the call with the kernel, block, thread
 * and address. $FLEXC_EMU_RACECHECK=1 builds race-checking modules (much
 * slower). */
#include <stdlib.h>
#include <string.h>

#include "emu/emu_host.h"
#include "runtime/backend.h"
#include "runtime/launch.h"

/* The allocations of one call (tensors and scratch). */
typedef struct EmuState {
  EmuRange r[64]; /* the allocations */
  int n;          /* entries used */
} EmuState;

static void add_range(EmuState *s, const char *name, const void *p, size_t bytes) {
  if (p && bytes && s->n < 64) s->r[s->n++] = (EmuRange){(uintptr_t)p, bytes, name};
}

/* Register the bytes a tensor spans (non-negative strides). */
static void add_tensor(EmuState *s, const char *name, const DLTensor *t) {
  if (t && t->data) add_range(s, name, rt_data_of(t), (size_t)rt_span_bytes(t));
}

static flex_status emu_open(RtRun *r) {
  r->arch = CG_SM80; /* the default target; flex_args.arch picks another (validated) */
  if (!r->c) return FLEX_OK;
  if (r->c->args->arch && !cg_arch_parse(r->c->args->arch, &r->arch)) r->arch = CG_SM80;
  EmuState *s = base_alloc(sizeof *s);
  r->state = s;
  const RtCall *c = r->c;
  const flex_args *a = c->args;
  const char *names[] = {"q", "k", "v", "out", "lse", "dout", "dlse", "dq", "dk", "dv"};
  const DLTensor *ts[] = {a->q, a->k, a->v, a->out, a->lse, a->dout, a->dlse, a->dq, a->dk, a->dv};
  for (int i = 0; i < 10; i++)
    if (!c->pages || (i != 1 && i != 2)) add_tensor(s, names[i], ts[i]);
  if (c->pages) { /* paged K/V: k and v are views of the pools read through the table row */
    add_tensor(s, "k pool", c->k_pool);
    add_tensor(s, "v pool", c->v_pool);
    add_range(s, "page_table", c->pages, sizeof(int32_t) * (size_t)c->max_pages);
  }
  for (int i = 0; i < c->mod->nbuffers; i++) {
    add_tensor(s, c->mod->buffers[i].id, c->buf_tensors[i]);
    add_tensor(s, c->mod->buffers[i].id, c->buf_grads[i]);
  }
  return FLEX_OK;
}

/* Generate the source and get its module (built once per process). */
static flex_status emu_prepare(RtRun *r) {
  Buf src = {0}, log = {0};
  cg_emit_cuda(&src, r->c->mod, &r->opts);
  EmuBuildOpts bo = {.racecheck = base_config()->emu_racecheck};
  EmuModule *mod = NULL;
  flex_status st = emu_module_get(&mod, src.data, &bo, &log);
  if (st) st = rt_err(st, "emulator: %s", log.data ? log.data : "build failed");
  r->module = mod;
  buf_free(&src);
  buf_free(&log);
  return st;
}

static flex_status emu_alloc(RtRun *r, void **out, size_t bytes) {
  *out = base_alloc(bytes + 4); /* zeroed; a little slack past the registered end */
  if (r->state) add_range(r->state, "scratch", *out, bytes);
  return FLEX_OK;
}

static void emu_release(RtRun *r, void *p) {
  (void)r;
  base_free(p);
}

static flex_status emu_zero(RtRun *r, void *p, size_t bytes) {
  (void)r;
  memset(p, 0, bytes);
  return FLEX_OK;
}

static flex_status emu_copy(RtRun *r, void *dst, const void *src, size_t bytes) {
  (void)r;
  memmove(dst, src, bytes);
  return FLEX_OK;
}

/* The emulator builds the sm_90a forward's tensor maps itself. */
static bool emu_tensor_maps(RtRun *r) {
  (void)r;
  return true;
}

/* The emulator's stand-in for cuTensorMapEncodeTiled (RtTmapEncode). */
static const char *emu_tmap(void *ctx, FlexTmapBytes *map, const void *base, const uint64_t dims[4],
                            const uint64_t strides[3], const uint32_t box[4]) {
  (void)ctx;
  _Static_assert(sizeof(FlexTensorMap) <= sizeof(FlexTmapBytes), "the emulator's map fits a CUtensorMap");
  return emu_tensor_map_encode((FlexTensorMap *)map, 2, 4, base, dims, strides, box, 128);
}

static flex_status emu_launch(RtRun *r, RtEntry e, const CgLaunch *g, const FlexParams *p) {
  const char *entry = rt_entry_name(e);
  flex_status st = rt_launch_check_geometry("emu", entry, g->grid, g->block);
  if (st) return st;
  EmuState *s = r->state;
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = entry;
  L.params = p;
  FlexFwdTma tma; /* the sm_90a forward takes the params with q, k, v's tensor maps */
  if (e == RT_ENTRY_FWD && r->opts.fwd_sm90) {
    st = rt_launch_fwd_tma(&r->opts, p, emu_tmap, NULL, &tma);
    if (st) return st;
    L.params = &tma;
  }
  FlexBwdTma btma; /* the sm_90a backward: q, dout, k, v's tensor maps */
  if (e == RT_ENTRY_BWD && r->opts.bwd_sm90) {
    st = rt_launch_bwd_tma(&r->opts, p, emu_tmap, NULL, &btma);
    if (st) return st;
    L.params = &btma;
  }
  L.grid = (EmuDim){g->grid[0], g->grid[1], g->grid[2]};
  L.block = (EmuDim){g->block[0], g->block[1], g->block[2]};
  L.smem_bytes = g->smem;
  L.ranges = s->r;
  L.nranges = s->n;
  st = emu_module_launch(r->module, &L, NULL);
  if (st) return rt_err(st, "emulator: %s", L.error);
  r->tiles = L.tiles;
  return FLEX_OK;
}

/* The emulator has no SMs of its own: split-KV plans for the fixed count. */
static int emu_sm_count(RtRun *r) {
  (void)r;
  return RT_SPLIT_DEFAULT_SMS;
}

static flex_status emu_sync(RtRun *r) {
  (void)r;
  return FLEX_OK; /* launches run to completion */
}

static void emu_close(RtRun *r) {
  base_free(r->state);
  r->state = NULL;
}

bool rt_emu_available(void) {
  if (emu_compiler_available()) return true;
  rt_err(FLEX_ERR_UNSUPPORTED, "the emu backend needs a host C++ compiler at run time (c++, or "
                               "$FLEXC_EMU_CXX) and none was found on PATH");
  return false;
}

const RtBackend rt_emu_backend = {
    .name = "emu",
    .host_memory = true,
    .sorted_entry = true, /* the device path on host memory: tested without a GPU */
    .sm_count = emu_sm_count,
    .dq_slices = true,
    .open = emu_open,
    .prepare = emu_prepare,
    .alloc = emu_alloc,
    .release = emu_release,
    .zero = emu_zero,
    .upload = emu_copy,
    .download = emu_copy,
    .launch = emu_launch,
    .sync = emu_sync,
    .close = emu_close,
    .tensor_maps = emu_tensor_maps,
};
