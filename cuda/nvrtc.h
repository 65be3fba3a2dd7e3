/* nvrtc.h: compile generated CUDA with NVRTC (dlopened, so nothing needs
 * the toolkit at build time) and read ptxas's resource report. */
#ifndef FLEXC_NVRTC_H
#define FLEXC_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"
#include "runtime/flex.h"

/* What to produce. */
typedef enum RtNvrtcTarget { RT_NVRTC_PTX, RT_NVRTC_CUBIN } RtNvrtcTarget;

/* One compilation's result. */
typedef struct RtNvrtcResult {
  Buf image;  /* PTX text or cubin bytes */
  Buf log;    /* NVRTC's log (with the ptxas report when asked for) */
} RtNvrtcResult;

/* ptxas's report for one kernel. */
typedef struct RtPtxasInfo {
  char name[64];     /* the kernel's name */
  int registers;     /* registers per thread */
  int spill_stores;  /* bytes */
  int spill_loads;   /* bytes */
  int smem;          /* static shared memory bytes */
  int stack;         /* stack frame bytes */
  bool wgmma_serial; /* ptxas serialised its wgmma (advisory C7510-C7520: each waits for the last) */
} RtPtxasInfo;

/* Compile `src` for `arch` ("sm_80", "sm_90a", ...) with the embedded
 * templates as headers. ptxas_verbose adds the resource report to the log
 * (cubin only). FLEX_ERR_UNSUPPORTED when NVRTC cannot be loaded,
 * FLEX_ERR_COMPILE when compilation fails (the log says why); the message
 * is in flex_last_error(). Free with rt_nvrtc_free. */
flex_status rt_nvrtc_compile(RtNvrtcResult *res, const char *src, const char *arch,
                             RtNvrtcTarget target, bool ptxas_verbose);
void rt_nvrtc_free(RtNvrtcResult *res);
/* The options every compile passes after -arch (NULL-terminated); part of
 * the kernel cache's key, so changing one never serves an old cubin. */
extern const char *const rt_nvrtc_flags[];
/* NVRTC's version (major * 1000 + minor * 10), or -1 (with the reason as
 * the thread's last error) when there is none, or only one older than 12. */
int rt_nvrtc_version(void);
/* Parse the ptxas report in `log` into up to `max` entries; returns the count. */
int rt_ptxas_parse(const char *log, RtPtxasInfo *out, int max);

#endif
