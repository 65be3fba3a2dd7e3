/* flexc emit: generated CUDA, PTX or cubin for one kernel of a .score file.
 *
 *   flexc emit FILE --target cuda|ptx|cubin --arch sm_80|sm_86|sm_89|sm_90|sm_90a
 *              --head-dim E [--head-dim-v EV] --dtype fp16|bf16|fp32
 *              [--kernel K] [--forward-only] [--fast-math] [--dropout] [--deterministic]
 *              [-o OUT] [--resource-usage]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Parsed command line. */
typedef struct EmitArgs {
  const char *file, *kernel, *out; /* as given */
  flex_emit_options o;             /* what to make */
  bool have_target;                /* --target given */
} EmitArgs;

static const char *const archs[] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"};

static int parse_int(const char *s, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 1 || v > 256) return 0;
  *out = (int)v;
  return 1;
}

static int parse_args(int argc, char **argv, EmitArgs *a) {
  bool have_dtype = false;
  flex_emit_options *o = &a->o;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(f, "--forward-only")) o->forward_only = true;
    else if (!strcmp(f, "--resource-usage")) o->resource_usage = true;
    else if (!strcmp(f, "--fast-math")) o->fast_math = true;
    else if (!strcmp(f, "--dropout")) o->dropout = true;
    else if (!strcmp(f, "--deterministic")) o->deterministic = true;
    else if (f[0] == '-' && f[1] && !v) return cli_usage_error("%s needs a value", f);
    else if (!strcmp(f, "--target")) {
      static const char *const targets[] = {"cuda", "ptx", "cubin"};
      int t = 0;
      while (t < 3 && strcmp(v, targets[t])) t++;
      if (t == 3) return cli_usage_error("unknown --target '%s' (cuda, ptx, cubin)", v);
      o->target = (flex_target)t;
      a->have_target = true;
      i++;
    } else if (!strcmp(f, "--kernel")) a->kernel = argv[++i];
    else if (!strcmp(f, "-o")) a->out = argv[++i];
    else if (!strcmp(f, "--arch")) {
      size_t k = 0;
      while (k < sizeof archs / sizeof *archs && strcmp(v, archs[k])) k++;
      if (k == sizeof archs / sizeof *archs)
        return cli_usage_error("unknown --arch '%s' (sm_80, sm_86, sm_89, sm_90, sm_90a)", v);
      o->arch = archs[k];
      i++;
    } else if (!strcmp(f, "--dtype")) {
      if (!strcmp(v, "fp16")) o->dtype = (DLDataType){kDLFloat, 16, 1};
      else if (!strcmp(v, "bf16")) o->dtype = (DLDataType){kDLBfloat, 16, 1};
      else if (!strcmp(v, "fp32")) o->dtype = (DLDataType){kDLFloat, 32, 1};
      else return cli_usage_error("unknown --dtype '%s' (fp16, bf16, fp32)", v);
      have_dtype = true;
      i++;
    } else if (!strcmp(f, "--head-dim") || !strcmp(f, "--head-dim-v")) {
      if (!parse_int(argv[++i], !strcmp(f, "--head-dim") ? &o->head_dim : &o->head_dim_v))
        return cli_usage_error("%s wants an integer in 1..256, got '%s'", f, v);
    } else if (f[0] == '-') return cli_usage_error("unknown option '%s'", f);
    else if (a->file) return cli_usage_error("emit takes one FILE");
    else a->file = f;
  }
  if (!a->file) return cli_usage_error("emit needs a FILE");
  if (!a->have_target) return cli_usage_error("emit needs --target cuda|ptx|cubin");
  if (!o->arch) return cli_usage_error("emit needs --arch");
  if (!have_dtype) return cli_usage_error("emit needs --dtype");
  if (!o->head_dim) return cli_usage_error("emit needs --head-dim");
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

int cli_emit(int argc, char **argv) {
  EmitArgs a;
  memset(&a, 0, sizeof a);
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc;
  flex_kernel *k;
  if (!cli_load_kernel(&k, a.file, a.kernel)) return 1;
  char *out = NULL, *report = NULL;
  size_t len = 0;
  if (flex_emit(k, &a.o, &out, &len, &report)) {
    fprintf(stderr, "flexc: error: %s\n", flex_last_error());
    rc = 1;
  } else {
    if (report) fputs(report, stderr);
    rc = write_out(a.out, out, len);
  }
  flex_free(out);
  flex_free(report);
  flex_kernel_free(k);
  return rc;
}
