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
static void add_tensor(void *ctx, const char *name, const DLTensor *t) {
  if (t->data) add_range(ctx, name, rt_data_of(t), (size_t)rt_span_bytes(t));
}

/* The emulator runs the generated kernels for the call's arch (sm_80 by
 * default), builds the sm_90a bodies' tensor maps itself, and has no SMs
 * of its own: split-KV plans for the fixed count. */
static flex_status emu_open(RtRun *r) {
  r->dev = (CgDevice){.arch = CG_SM80, .tensor_maps = true, .sms = CG_SPLIT_DEFAULT_SMS};
  if (!r->c) return FLEX_OK;
  const RtCall *c = r->c;
  if (c->args->arch && !cg_arch_parse(c->args->arch, &r->dev.arch)) r->dev.arch = CG_SM80;
  EmuState *s = base_alloc(sizeof *s);
  r->state = s;
  rt_call_tensors(c, add_tensor, s);
  if (c->pages) /* paged K/V: this sequence's row of the page table */
    add_range(s, "page_table", c->pages, sizeof(int32_t) * (size_t)c->max_pages);
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

/* The emulator's stand-in for cuTensorMapEncodeTiled (RtTmapEncode). */
static const char *emu_tmap(void *ctx, FlexTmapBytes *map, const void *base, const uint64_t dims[4],
                            const uint64_t strides[3], const uint32_t box[4]) {
  (void)ctx;
  _Static_assert(sizeof(FlexTensorMap) <= sizeof(FlexTmapBytes), "the emulator's map fits a CUtensorMap");
  return emu_tensor_map_encode((FlexTensorMap *)map, 2, 4, base, dims, strides, box, 128);
}

static flex_status emu_launch(RtRun *r, RtEntry e, const CgLaunch *g, const void *params) {
  EmuState *s = r->state;
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = rt_entry_name(e);
  L.params = params;
  L.grid = (EmuDim){g->grid[0], g->grid[1], g->grid[2]};
  L.block = (EmuDim){g->block[0], g->block[1], g->block[2]};
  L.smem_bytes = g->smem;
  L.ranges = s->r;
  L.nranges = s->n;
  flex_status st = emu_module_launch(r->module, &L, NULL);
  if (st) return rt_err(st, "emulator: %s", L.error);
  r->tiles = L.tiles;
  return FLEX_OK;
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
    .tmap = emu_tmap,
};
