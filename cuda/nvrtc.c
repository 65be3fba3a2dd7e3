/* nvrtc.c: NVRTC through dlopen. We declare the few prototypes we need
 * ourselves, so no nvrtc.h is needed at build time. */
#include "cuda/nvrtc.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/embedded.h"
#include "runtime/rt.h"

typedef struct _nvrtcProgram *nvrtcProgram;
typedef int nvrtcResult; /* 0: NVRTC_SUCCESS */

/* The NVRTC entry points we use. */
static struct {
  void *lib;
  const char *(*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int *, int *);
  nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int,
                               const char *const *, const char *const *);
  nvrtcResult (*DestroyProgram)(nvrtcProgram *);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetPTX)(nvrtcProgram, char *);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
} nv;
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;
static bool nv_ok;
static char nv_why[160]; /* why NVRTC is unusable, when it is */

static void *sym(const char *name) {
  void *p = dlsym(nv.lib, name);
  if (!p) nv_ok = false;
  return p;
}

static void nv_load(void) {
  static const char *const names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12",
                                      "/usr/local/cuda/lib64/libnvrtc.so",
                                      "/usr/local/cuda/lib64/libnvrtc.so.13",
                                      "/usr/local/cuda/lib64/libnvrtc.so.12", NULL};
  for (int i = 0; names[i] && !nv.lib; i++) nv.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!nv.lib) {
    snprintf(nv_why, sizeof nv_why, "no libnvrtc.so (CUDA 12 or newer) was found");
    return;
  }
  nv_ok = true;
  *(void **)&nv.GetErrorString = sym("nvrtcGetErrorString");
  *(void **)&nv.Version = sym("nvrtcVersion");
  *(void **)&nv.CreateProgram = sym("nvrtcCreateProgram");
  *(void **)&nv.DestroyProgram = sym("nvrtcDestroyProgram");
  *(void **)&nv.CompileProgram = sym("nvrtcCompileProgram");
  *(void **)&nv.GetPTXSize = sym("nvrtcGetPTXSize");
  *(void **)&nv.GetPTX = sym("nvrtcGetPTX");
  *(void **)&nv.GetCUBINSize = sym("nvrtcGetCUBINSize");
  *(void **)&nv.GetCUBIN = sym("nvrtcGetCUBIN");
  *(void **)&nv.GetProgramLogSize = sym("nvrtcGetProgramLogSize");
  *(void **)&nv.GetProgramLog = sym("nvrtcGetProgramLog");
  int major = 0, minor = 0;
  if (!nv_ok) snprintf(nv_why, sizeof nv_why, "libnvrtc lacks an entry point flexc needs");
  else if (nv.Version(&major, &minor) != 0 || major < 12) {
    /* sm_90a and the kernels' PTX need CUDA 12; an older NVRTC counts as none. */
    snprintf(nv_why, sizeof nv_why, "NVRTC %d.%d is too old (flexc needs 12 or newer)", major, minor);
    nv_ok = false;
  }
}

static bool nv_available(void) {
  BaseTry *held = base_try_hold(); /* a jump out of a once-initialiser would block it forever */
  pthread_once(&nv_once, nv_load);
  base_try_restore(held);
  return nv_ok;
}

const char *const rt_nvrtc_flags[] = {"-std=c++17", "-default-device", "--no-source-include",
                                      "-lineinfo", NULL};

int rt_nvrtc_version(void) {
  int major = 0, minor = 0;
  if (!nv_available()) {
    rt_err(FLEX_ERR_UNSUPPORTED, "%s", nv_why);
    return -1;
  }
  if (nv.Version(&major, &minor) != 0) {
    rt_err(FLEX_ERR_UNSUPPORTED, "nvrtcVersion failed");
    return -1;
  }
  return major * 1000 + minor * 10;
}

void rt_nvrtc_free(RtNvrtcResult *res) {
  buf_free(&res->image);
  buf_free(&res->log);
}

/* Read the program's log and its PTX or cubin into res. */
static void fetch(RtNvrtcResult *res, nvrtcProgram prog, RtNvrtcTarget target, bool compiled) {
  size_t n = 0;
  if (nv.GetProgramLogSize(prog, &n) == 0 && n > 1) {
    char *log = base_alloc(n);
    if (nv.GetProgramLog(prog, log) == 0) buf_puts(&res->log, log);
    base_free(log);
  }
  if (!compiled) return;
  bool ptx = target == RT_NVRTC_PTX;
  if ((ptx ? nv.GetPTXSize : nv.GetCUBINSize)(prog, &n) != 0 || n == 0) return;
  char *img = base_alloc(n);
  if ((ptx ? nv.GetPTX : nv.GetCUBIN)(prog, img) == 0) buf_put(&res->image, img, ptx ? n - 1 : n);
  base_free(img);
}

flex_status rt_nvrtc_compile(RtNvrtcResult *res, const char *src, const char *arch,
                             RtNvrtcTarget target, bool ptxas_verbose) {
  memset(res, 0, sizeof *res);
  if (!nv_available())
    return rt_err(FLEX_ERR_UNSUPPORTED, "NVRTC is not available: %s", nv_why);
  const char *hnames[64], *htexts[64];
  int nh = 0;
  for (int i = 0; rt_embedded[i].name && nh < 64; i++, nh++) {
    hnames[nh] = rt_embedded[i].name;
    htexts[nh] = rt_embedded[i].text;
  }
  char archopt[48];
  const char *num = strncmp(arch, "sm_", 3) ? arch : arch + 3;
  snprintf(archopt, sizeof archopt, "-arch=%s_%s", target == RT_NVRTC_PTX ? "compute" : "sm", num);
  const char *opts[8];
  int no = 0;
  opts[no++] = archopt;
  for (int i = 0; rt_nvrtc_flags[i]; i++) opts[no++] = rt_nvrtc_flags[i];
  if (ptxas_verbose && target == RT_NVRTC_CUBIN) opts[no++] = "--ptxas-options=-v";
  nvrtcProgram prog;
  nvrtcResult r = nv.CreateProgram(&prog, src, "flexc_kernel.cu", nh, htexts, hnames);
  if (r != 0) return rt_err(FLEX_ERR_COMPILE, "nvrtcCreateProgram: %s", nv.GetErrorString(r));
  BaseTry t; /* an exhausted allocation in fetch: the program is destroyed first */
  base_try_push(&t);
  if (setjmp(t.jb)) {
    nv.DestroyProgram(&prog);
    base_try_rethrow(&t);
  }
  r = nv.CompileProgram(prog, no, opts);
  fetch(res, prog, target, r == 0);
  base_try_pop(&t);
  nv.DestroyProgram(&prog);
  if (r != 0)
    return rt_err(FLEX_ERR_COMPILE, "NVRTC failed (%s):\n%s", nv.GetErrorString(r),
                  res->log.data ? res->log.data : "");
  if (!res->image.len) return rt_err(FLEX_ERR_COMPILE, "NVRTC produced no output");
  return FLEX_OK;
}

/* ptxas lines look like:
 *   ptxas info    : Compiling entry function 'flex_fwd' for 'sm_80'
 *   ptxas info    : Function properties for flex_fwd
 *       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   (NVRTC: "ptxas         .     0 bytes stack frame, ...")
 *   ptxas info    : Used 128 registers, used 1 barriers, 400 bytes cmem[0]
 * (shared memory appears as ", N bytes smem" when there is static smem), and,
 * for sm_90a, advisories such as "(C7514) Potential Performance Loss:
 * wgmma.mma_async instructions are serialized due to ... in the function
 * 'flex_fwd'". */
int rt_ptxas_parse(const char *log, RtPtxasInfo *out, int max) {
  int n = -1;
  /* The entry the next properties line belongs to: a "Function properties
   * for" line names it, and ptxas also lists the functions an entry calls
   * (flex_iv_div ...) with lines of their own, after the entry's. */
  int props = -1;
  for (const char *line = log; line && *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char l[512];
    snprintf(l, sizeof l, "%.*s", (int)(len < 511 ? len : 511), line);
    const char *q;
    if ((q = strstr(l, "Compiling entry function '")) && n + 1 < max) {
      n++;
      memset(&out[n], 0, sizeof out[n]);
      q += strlen("Compiling entry function '");
      size_t k = strcspn(q, "'");
      snprintf(out[n].name, sizeof out[n].name, "%.*s", (int)(k < 63 ? k : 63), q);
      props = n;
    } else if ((q = strstr(l, "Function properties for "))) {
      q += strlen("Function properties for ");
      props = -1;
      for (int i = 0; i <= n; i++)
        if (!strcmp(out[i].name, q)) props = i;
    } else if (props >= 0 && (q = strstr(l, "bytes stack frame"))) {
      /* NVRTC writes "ptxas         .     232 bytes stack frame, ...", ptxas
       * itself "    232 bytes stack frame, ...": scan from the number. */
      while (q > l && q[-1] == ' ') q--;
      while (q > l && q[-1] >= '0' && q[-1] <= '9') q--;
      sscanf(q, "%d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &out[props].stack,
             &out[props].spill_stores, &out[props].spill_loads);
    } else if (n >= 0 && (q = strstr(l, "Used "))) {
      sscanf(q, "Used %d registers", &out[n].registers);
      const char *sm = strstr(q, "bytes smem");
      if (sm) {
        const char *c = sm;
        while (c > q && c[-1] == ' ') c--;
        while (c > q && c[-1] >= '0' && c[-1] <= '9') c--;
        out[n].smem = atoi(c);
      }
    }
    line = end ? end + 1 : NULL;
  }
  /* "... wgmma.mma_async instructions are serialized due to ... in the
   * function 'flex_fwd'" comes before that function's entry lines. */
  for (const char *q = log; q && (q = strstr(q, "instructions are serialized"));) {
    const char *fn = strstr(q, "function '"), *nl = strchr(q, '\n');
    if (fn && (!nl || fn < nl)) {
      fn += strlen("function '");
      size_t k = strcspn(fn, "'");
      for (int i = 0; i <= n; i++)
        if (strlen(out[i].name) == k && !strncmp(out[i].name, fn, k)) out[i].wgmma_serial = true;
    }
    q = nl;
  }
  return n + 1;
}
