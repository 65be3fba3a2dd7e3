/* emit.c: flex_emit, what the compiler makes of a kernel for a GPU: the
 * generated CUDA, or PTX and cubins through NVRTC, with ptxas's resource
 * report. */
#include <string.h>

#include "api/api.h"
#include "codegen/codegen.h"
#include "cuda/nvrtc.h"
#include "runtime/tensor.h"

/* Registers, spills, shared memory (static + the launch's dynamic) and stack per entry. */
static char *resources(const char *log, const CgOptions *o) {
  RtPtxasInfo info[8];
  int n = rt_ptxas_parse(log, info, 8);
  Buf b = {0};
  for (int i = 0; i < n; i++) {
    size_t dyn = 0;
    if (!strcmp(info[i].name, "flex_fwd")) dyn = cg_launch_fwd(o, 1, 1, 1).smem;
    if (!strcmp(info[i].name, "flex_bwd")) dyn = cg_launch_bwd(o, 1, 1, 1).smem;
    buf_printf(&b,
               "%s: %d registers, %d bytes spill stores, %d bytes spill loads, "
               "shared memory %d bytes static + %zu bytes dynamic, %d bytes stack%s\n",
               info[i].name, info[i].registers, info[i].spill_stores, info[i].spill_loads,
               info[i].smem, dyn, info[i].stack,
               info[i].wgmma_serial ? ", wgmma serialized by ptxas" : "");
  }
  return b.data ? b.data : base_strdup("");
}

static bool cg_dtype_of(DLDataType t, CgDtype *out) {
  if (t.code == kDLBfloat && t.bits == 16) *out = CG_BF16;
  else if (t.code == kDLFloat && t.bits == 16) *out = CG_FP16;
  else if (t.code == kDLFloat && t.bits == 32) *out = CG_FP32;
  else return false;
  return true;
}

static flex_status do_emit(const flex_kernel *k, const flex_emit_options *eo, char **out, size_t *len,
                      char **report) {
  if (!k || !eo || !out || !len) return rt_err(FLEX_ERR_INVALID, "flex_emit: NULL argument");
  *out = NULL;
  *len = 0;
  if (report) *report = NULL;
  CgArch arch;
  CgDtype dt;
  if (!eo->arch || !cg_arch_parse(eo->arch, &arch))
    return rt_err(FLEX_ERR_INVALID, "unknown arch '%s' (sm_80, sm_86, sm_89, sm_90, sm_90a)",
                  eo->arch ? eo->arch : "(null)");
  if (!cg_dtype_of(eo->dtype, &dt))
    return rt_err(FLEX_ERR_INVALID, "dtype %s: expected float16, bfloat16 or float32",
                  rt_dtype_name(eo->dtype));
  if ((unsigned)eo->target > FLEX_TARGET_CUBIN)
    return rt_err(FLEX_ERR_INVALID, "unknown target %d", (int)eo->target);
  CgOptions o;
  char err[256];
  int ev = eo->head_dim_v ? eo->head_dim_v : eo->head_dim;
  if (!cg_options_init(&o, k->mod, dt, eo->head_dim, ev, arch, !eo->forward_only, err, sizeof err))
    return rt_err(FLEX_ERR_INVALID, "%s", err);
  o.fast_math = eo->fast_math;
  o.dropout = eo->dropout;
  o.deterministic = eo->deterministic && !eo->forward_only;
  /* Both decide bodies (the sm_90a ones do neither): tiles picked again. */
  if ((o.dropout || o.deterministic) && !cg_options_retile(&o, err, sizeof err))
    return rt_err(FLEX_ERR_INVALID, "%s", err);
  o.source = k->src.path;
  Buf src = {0};
  cg_emit_cuda(&src, k->mod, &o);
  if (eo->target == FLEX_TARGET_CUDA && !eo->resource_usage) {
    *len = src.len;
    *out = src.data;
    return FLEX_OK;
  }
  bool cubin = eo->target == FLEX_TARGET_CUBIN;
  RtNvrtcResult res;
  flex_status st = rt_nvrtc_compile(&res, src.data, cg_arch_name(arch),
                                    cubin || eo->resource_usage ? RT_NVRTC_CUBIN : RT_NVRTC_PTX,
                                    eo->resource_usage);
  if (!st && eo->resource_usage && report) *report = resources(res.log.data ? res.log.data : "", &o);
  if (!st && (cubin || !eo->resource_usage)) { /* the compile made the target itself */
    *len = res.image.len;
    *out = res.image.data;
    res.image.data = NULL;
  } else if (!st && eo->target == FLEX_TARGET_CUDA) {
    *len = src.len;
    *out = src.data;
    src.data = NULL;
  } else if (!st) { /* PTX with the report: the report came from a cubin build */
    rt_nvrtc_free(&res);
    st = rt_nvrtc_compile(&res, src.data, cg_arch_name(arch), RT_NVRTC_PTX, false);
    if (!st) {
      *len = res.image.len;
      *out = res.image.data;
      res.image.data = NULL;
    }
  }
  if (st && report) {
    base_free(*report);
    *report = NULL;
  }
  rt_nvrtc_free(&res);
  buf_free(&src);
  return st;
}

flex_status flex_emit(const flex_kernel *k, const flex_emit_options *eo, char **out, size_t *len,
                      char **report) {
  RT_TRY(do_emit(k, eo, out, len, report));
}
