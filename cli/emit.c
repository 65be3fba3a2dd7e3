/* flexc emit: generated CUDA, PTX or cubin for one kernel of a .score file.
 *
 *   flexc emit FILE --target cuda|ptx|cubin --arch sm_80|sm_86|sm_89|sm_90|sm_90a
 *              --head-dim E [--head-dim-v EV] --dtype fp16|bf16|fp32
 *              [--kernel K] [--forward-only] [--fast-math] [-o OUT] [--resource-usage]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "codegen/codegen.h"
#include "runtime/nvrtc.h"
#include "runtime/rt.h"

/* Parsed command line. */
typedef struct EmitArgs {
  const char *file, *target, *kernel, *out; /* as given */
  CgArch arch;                              /* --arch */
  CgDtype dtype;                            /* --dtype */
  int E, EV;                                /* --head-dim, --head-dim-v (0: E) */
  bool forward_only, resources, fast_math;  /* flags */
} EmitArgs;

static int parse_int(const char *s, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 1 || v > 256) return 0;
  *out = (int)v;
  return 1;
}

static int parse_args(int argc, char **argv, EmitArgs *a) {
  bool have_arch = false, have_dtype = false;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--forward-only")) a->forward_only = true;
    else if (!strcmp(o, "--resource-usage")) a->resources = true;
    else if (!strcmp(o, "--fast-math")) a->fast_math = true;
    else if (o[0] == '-' && o[1] && !v) return cli_usage_error("%s needs a value", o);
    else if (!strcmp(o, "--target")) a->target = argv[++i];
    else if (!strcmp(o, "--kernel")) a->kernel = argv[++i];
    else if (!strcmp(o, "-o")) a->out = argv[++i];
    else if (!strcmp(o, "--arch")) {
      if (!cg_arch_parse(argv[++i], &a->arch))
        return cli_usage_error("unknown --arch '%s' (sm_80, sm_86, sm_89, sm_90, sm_90a)", v);
      have_arch = true;
    } else if (!strcmp(o, "--dtype")) {
      if (!cg_dtype_parse(argv[++i], &a->dtype))
        return cli_usage_error("unknown --dtype '%s' (fp16, bf16, fp32)", v);
      have_dtype = true;
    } else if (!strcmp(o, "--head-dim") || !strcmp(o, "--head-dim-v")) {
      if (!parse_int(argv[++i], !strcmp(o, "--head-dim") ? &a->E : &a->EV))
        return cli_usage_error("%s wants an integer in 1..256, got '%s'", o, v);
    } else if (o[0] == '-') return cli_usage_error("unknown option '%s'", o);
    else if (a->file) return cli_usage_error("emit takes one FILE");
    else a->file = o;
  }
  if (!a->file) return cli_usage_error("emit needs a FILE");
  if (!a->target) return cli_usage_error("emit needs --target cuda|ptx|cubin");
  if (strcmp(a->target, "cuda") && strcmp(a->target, "ptx") && strcmp(a->target, "cubin"))
    return cli_usage_error("unknown --target '%s' (cuda, ptx, cubin)", a->target);
  if (!have_arch) return cli_usage_error("emit needs --arch");
  if (!have_dtype) return cli_usage_error("emit needs --dtype");
  if (!a->E) return cli_usage_error("emit needs --head-dim");
  if (!a->EV) a->EV = a->E;
  return 0;
}

static int write_out(const char *path, const char *data, size_t len) {
  FILE *f = path && strcmp(path, "-") ? fopen(path, "wb") : stdout;
  if (!f) {
    fprintf(stderr, "flexc: error: cannot write %s\n", path);
    return 1;
  }
  fwrite(data, 1, len, f);
  if (f != stdout && fclose(f)) return 1;
  return 0;
}

/* Registers, spills, shared memory (static + the launch's dynamic) and stack per kernel. */
static void print_resources(const char *log, const CgOptions *o) {
  RtPtxasInfo info[8];
  int n = rt_ptxas_parse(log, info, 8);
  for (int i = 0; i < n; i++) {
    size_t dyn = 0;
    if (!strcmp(info[i].name, "flex_fwd")) dyn = cg_launch_fwd(o, 1, 1, 1).smem;
    if (!strcmp(info[i].name, "flex_bwd")) dyn = cg_launch_bwd(o, 1, 1, 1).smem;
    fprintf(stderr,
            "%s: %d registers, %d bytes spill stores, %d bytes spill loads, "
            "shared memory %d bytes static + %zu bytes dynamic, %d bytes stack\n",
            info[i].name, info[i].registers, info[i].spill_stores, info[i].spill_loads,
            info[i].smem, dyn, info[i].stack);
  }
}

int cli_emit(int argc, char **argv) {
  EmitArgs a;
  memset(&a, 0, sizeof a);
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc;
  flex_kernel *k;
  if (!cli_load_kernel(&k, a.file, a.kernel)) return 1;
  CgOptions o;
  char err[256];
  if (!cg_options_init(&o, k->mod, a.dtype, a.E, a.EV, a.arch, !a.forward_only, err, sizeof err)) {
    fprintf(stderr, "flexc: error: %s\n", err);
    flex_kernel_free(k);
    return 1;
  }
  o.fast_math = a.fast_math;
  Buf src = {0};
  cg_emit_cuda(&src, k->mod, &o);
  rc = 0;
  if (!strcmp(a.target, "cuda")) {
    rc = write_out(a.out, src.data, src.len);
  } else {
    RtNvrtcResult res;
    bool cubin = !strcmp(a.target, "cubin");
    flex_status st = rt_nvrtc_compile(&res, src.data, cg_arch_name(a.arch),
                                      cubin || a.resources ? RT_NVRTC_CUBIN : RT_NVRTC_PTX,
                                      a.resources);
    if (st != FLEX_OK) {
      fprintf(stderr, "flexc: error: %s\n", flex_last_error());
      rc = 1;
    } else {
      if (a.resources) print_resources(res.log.data ? res.log.data : "", &o);
      bool have = cubin || !a.resources; /* the first compile made the target itself */
      if (have) rc = write_out(a.out, res.image.data, res.image.len);
      rt_nvrtc_free(&res);
      if (!have) { /* PTX with --resource-usage: the report came from a cubin build */
        st = rt_nvrtc_compile(&res, src.data, cg_arch_name(a.arch), RT_NVRTC_PTX, false);
        if (st == FLEX_OK) rc = write_out(a.out, res.image.data, res.image.len);
        else rc = 1, fprintf(stderr, "flexc: error: %s\n", flex_last_error());
        rt_nvrtc_free(&res);
      }
    }
  }
  buf_free(&src);
  flex_kernel_free(k);
  return rc;
}
