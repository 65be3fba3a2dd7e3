/* libFuzzer target: a .score file through every analysis the compiler
 * runs before a kernel runs. The input is the file's text; it goes through
 * parse, check, lower, fold, cse, dce and autodiff (flex_kernel_from_source),
 * then what a call or a tool asks of a kernel: its info, the backward
 * joints without some buffer gradients, the interval analysis of the mask
 * over blocks of several shapes (with unreadable buffers, as before any
 * data is known), flexc check --explain's text, CUDA source for sm_80 and
 * sm_90a (fp16 and fp32, odd and wide head dims, dropout, deterministic),
 * and LLVM IR for the cpu backend (verified). A user error must come back
 * as FLEX_ERR_INVALID with a message; an internal check failing, a crash,
 * a leak, undefined behaviour or LLVM IR that does not verify is a bug. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interval.h"
#include "ir/ir.h"
#include "fuzz_common.h"
#include "runtime/flex.h"
#include "runtime/rt.h"
#ifdef FLEXC_HAVE_LLVM
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>

#include "cpu/cpu.h"
#endif

static void die(const char *what, const char *msg) { fuzz_die("fuzz_score", what, msg); }

/* The mask's interval analysis over a few block grids. */
static void intervals(const IrModule *m) {
  if (!m->mask) return;
  IrVal params[64];
  for (int i = 0; i < m->nparams && i < 64; i++)
    params[i] = m->params[i].has_default ? m->params[i].def
                : m->params[i].type == IT_F32 ? ir_vf(0.5) : ir_vi(3);
  int32_t sizes[64 + SZ_COUNT];
  for (int i = 0; i < 64 + SZ_COUNT; i++) sizes[i] = 17;
  sizes[SZ_B] = 2, sizes[SZ_H] = 4, sizes[SZ_HKV] = 2, sizes[SZ_Q_LEN] = 300, sizes[SZ_KV_LEN] = 500;
  IrBufView bufs[64];
  memset(bufs, 0, sizeof bufs);
  for (int i = 0; i < m->nbuffers && i < 64; i++) { /* data NULL: not readable */
    bufs[i].dtype = m->buffers[i].dtype, bufs[i].ndims = m->buffers[i].ndims;
    for (int d = 0; d < bufs[i].ndims; d++) bufs[i].shape[d] = 17;
  }
  if (m->nparams > 64 || m->nbuffers > 64 || m->nsizes > 64) return;
  IrIntervalEnv env = {params, sizes, bufs};
  static const int rects[][4] = {{0, 63, 0, 63},
                                 {64, 127, 0, 63},
                                 {0, 299, 0, 499},
                                 {128, 255, 384, 499},
                                 {0, 0, 499, 499}, /* and the widest: q, kv < 2^31 - 1 */
                                 {0, 2147483646, 0, 2147483646}};
  for (size_t r = 0; r < sizeof rects / sizeof rects[0]; r++)
    (void)ir_interval_mask(m, &env, 0, 1, 0, 3, rects[r][0], rects[r][1], rects[r][2], rects[r][3]);
  (void)ir_interval_decidable(m);
  (void)ir_interval_device_decidable(m);
}

static void emit(const flex_kernel *k, const char *arch, DLDataType dt, int e, int ev, bool fwd_only,
                 bool dropout, bool det) {
  flex_emit_options o = {.target = FLEX_TARGET_CUDA,
                         .arch = arch,
                         .dtype = dt,
                         .head_dim = e,
                         .head_dim_v = ev,
                         .forward_only = fwd_only,
                         .dropout = dropout,
                         .deterministic = det};
  char *out = NULL;
  size_t len = 0;
  flex_status st = flex_emit(k, &o, &out, &len, NULL);
  if (st != FLEX_OK && (st != FLEX_ERR_INVALID || !flex_last_error()[0])) die("flex_emit", flex_last_error());
  if (st == FLEX_OK && (!out || !len)) die("flex_emit", "no source");
  flex_free(out);
}

#ifdef FLEXC_HAVE_LLVM
static void llvm_ir(const IrModule *m, bool joint, bool check_bounds, bool exact) {
  CpuJitOpts o = {.joint = joint,
                  .identity = m->score_is_identity,
                  .check_bounds = check_bounds,
                  .exact = exact,
                  .sink_grad = joint};
  LLVMContextRef ctx = LLVMContextCreate();
  LLVMModuleRef mod = LLVMModuleCreateWithNameInContext("fuzz", ctx);
  char err[512] = "", *msg = NULL;
  if (cpu_lower(mod, m, &o, "fuzz", err, sizeof err) && LLVMVerifyModule(mod, LLVMReturnStatusAction, &msg))
    die("the cpu backend's LLVM IR does not verify", msg ? msg : "");
  LLVMDisposeMessage(msg);
  LLVMDisposeModule(mod);
  LLVMContextDispose(ctx);
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  flex_kernel *k = NULL;
  flex_status st = flex_kernel_from_source(&k, "fuzz.score", (const char *)data, size, NULL);
  if (st != FLEX_OK) {
    if (st != FLEX_ERR_INVALID || !flex_last_error()[0] || k)
      die("flex_kernel_from_source", flex_last_error());
    return 0;
  }
  flex_kernel_info info;
  if (flex_kernel_get_info(k, &info) != FLEX_OK) die("flex_kernel_get_info", flex_last_error());
  const IrModule *m = k->mod;
  bool *keep = calloc((size_t)info.nbuffers + 1, 1);
  (void)rt_kernel_module(k, keep); /* every buffer gradient dropped */
  for (int i = 0; i < info.nbuffers; i++) keep[i] = i % 2;
  (void)rt_kernel_module(k, keep); /* every other one */
  free(keep);
  intervals(m);
  char *text = NULL;
  int shape[4] = {2, 4, 300, 500};
  if (flex_mask_explain(k, shape, &text) != FLEX_OK) die("flex_mask_explain", flex_last_error());
  flex_free(text);
  unsigned h = size ? data[size / 2] : 0; /* vary what is generated with the input */
  DLDataType f16 = {kDLFloat, 16, 1}, f32 = {kDLFloat, 32, 1};
  emit(k, "sm_80", h & 1 ? f16 : f32, h & 2 ? 64 : 15, h & 4 ? 0 : 40, false, h & 8, h & 16);
  emit(k, "sm_90a", f16, h & 32 ? 256 : 128, 0, false, false, false);
#ifdef FLEXC_HAVE_LLVM
  llvm_ir(m, true, h & 1, h & 2);
  llvm_ir(m, false, false, false);
#endif
  flex_kernel_free(k);
  return 0;
}
