/* driver.c: the CUDA driver API through dlopen. The entry points are looked
 * up with cuGetProcAddress (asking for the CUDA 12 ABI of each, so the
 * prototypes below stay right on newer drivers), falling back to dlsym of
 * the versioned export names on drivers that lack it. */
#include "cuda/driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt.h"

enum {
  CU_SUCCESS = 0,
  CU_ERR_OUT_OF_MEMORY = 2,
  CU_ATTR_CC_MAJOR = 75,
  CU_ATTR_CC_MINOR = 76,
  CU_ATTR_SM_COUNT = 16, /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
  CU_ATTR_MEMORY_POOLS = 115, /* CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED */
  CU_FUNC_ATTR_MAX_DYN_SMEM = 8,
  CU_ABI_VERSION = 12000, /* the ABI our prototypes follow */
  /* CU_GET_PROC_ADDRESS_LEGACY_STREAM: the entry points with the legacy
   * default-stream semantics, the same ones the dlsym fallback finds
   * (flag 0 leaves the choice to how the caller was compiled). */
  CU_PROC_LEGACY_STREAM = 1,
  MAX_DEVICES = 64,
};

/* Every driver entry point we use (prototypes as in cuda.h 12/13). */
typedef struct Drv {
  RtCuResult (*cuInit)(unsigned);
  RtCuResult (*cuDriverGetVersion)(int *);
  RtCuResult (*cuDeviceGetCount)(int *);
  RtCuResult (*cuDeviceGet)(RtCuDevice *, int);
  RtCuResult (*cuDeviceGetAttribute)(int *, int, RtCuDevice);
  RtCuResult (*cuDeviceGetName)(char *, int, RtCuDevice);
  RtCuResult (*cuDevicePrimaryCtxRetain)(RtCuContext *, RtCuDevice);
  RtCuResult (*cuCtxSetCurrent)(RtCuContext);
  RtCuResult (*cuModuleLoadData)(RtCuModule *, const void *);
  RtCuResult (*cuModuleUnload)(RtCuModule);
  RtCuResult (*cuModuleGetFunction)(RtCuFunction *, RtCuModule, const char *);
  RtCuResult (*cuFuncSetAttribute)(RtCuFunction, int, int);
  RtCuResult (*cuLaunchKernel)(RtCuFunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, RtCuStream, void **, void **);
  RtCuResult (*cuMemAlloc)(RtCuDevicePtr *, size_t);
  RtCuResult (*cuMemFree)(RtCuDevicePtr);
  RtCuResult (*cuMemsetD32Async)(RtCuDevicePtr, unsigned, size_t, RtCuStream);
  RtCuResult (*cuMemcpyHtoDAsync)(RtCuDevicePtr, const void *, size_t, RtCuStream);
  RtCuResult (*cuMemcpyDtoHAsync)(void *, RtCuDevicePtr, size_t, RtCuStream);
  RtCuResult (*cuStreamSynchronize)(RtCuStream);
  RtCuResult (*cuGetErrorName)(RtCuResult, const char **);
  RtCuResult (*cuGetErrorString)(RtCuResult, const char **);
  /* optional (benchmarks): events */
  RtCuResult (*cuEventCreate)(RtCuEvent *, unsigned);
  RtCuResult (*cuEventRecord)(RtCuEvent, RtCuStream);
  RtCuResult (*cuEventSynchronize)(RtCuEvent);
  RtCuResult (*cuEventElapsedTime)(float *, RtCuEvent, RtCuEvent);
  RtCuResult (*cuEventDestroy)(RtCuEvent);
  /* optional (CUDA 11.2 on): the stream-ordered allocator (per-call workspace) */
  RtCuResult (*cuMemAllocAsync)(RtCuDevicePtr *, size_t, RtCuStream);
  RtCuResult (*cuMemFreeAsync)(RtCuDevicePtr, RtCuStream);
  /* optional (CUDA 12 on): the sm_90a forward's tensor maps */
  RtCuResult (*cuTensorMapEncodeTiled)(void *, int, unsigned, void *, const uint64_t *,
                                       const uint64_t *, const unsigned *, const unsigned *, int,
                                       int, int, int);
} Drv;

static Drv D;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static flex_status load_status = FLEX_ERR_NO_DEVICE; /* the outcome of the one load */
static char load_why[512];                            /* why it failed */
static int ndevices;                                  /* found by cuDeviceGetCount */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static RtCuContext primary[MAX_DEVICES];              /* retained primary contexts */
static signed char pools[MAX_DEVICES];                /* stream-ordered allocator: 0 not yet asked, 1, -1 */

/* One entry of the lookup table: the base name cuGetProcAddress takes, the
 * exported name for dlsym, and where the pointer goes. */
typedef struct Sym {
  const char *name, *export_name;
  void **slot;
} Sym;

#define SYM(f) {#f, #f, (void **)&D.f}
#define SYMV(f, exp) {#f, exp, (void **)&D.f}
static const Sym syms[] = {
    SYM(cuInit), SYM(cuDriverGetVersion), SYM(cuDeviceGetCount), SYM(cuDeviceGet),
    SYM(cuDeviceGetAttribute), SYM(cuDeviceGetName),
    SYM(cuDevicePrimaryCtxRetain), SYM(cuCtxSetCurrent), SYM(cuModuleLoadData),
    SYM(cuModuleUnload), SYM(cuModuleGetFunction), SYM(cuFuncSetAttribute),
    SYM(cuLaunchKernel), SYMV(cuMemAlloc, "cuMemAlloc_v2"), SYMV(cuMemFree, "cuMemFree_v2"),
    SYM(cuMemsetD32Async), SYMV(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    SYMV(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"), SYM(cuStreamSynchronize),
    SYM(cuGetErrorName), SYM(cuGetErrorString),
};

/* Entry points only benchmarks use: their absence does not fail the load. */
static const Sym opt_syms[] = {
    SYM(cuEventCreate), SYM(cuEventRecord), SYM(cuEventSynchronize), SYM(cuEventElapsedTime),
    SYMV(cuEventDestroy, "cuEventDestroy_v2"), SYM(cuMemAllocAsync), SYM(cuMemFreeAsync),
    SYM(cuTensorMapEncodeTiled),
};

/* Names for the errors a stub or broken install gives before
 * cuGetErrorName itself can be trusted. */
static const char *fallback_name(RtCuResult r) {
  switch (r) {
  case 2: return "CUDA_ERROR_OUT_OF_MEMORY";
  case 3: return "CUDA_ERROR_NOT_INITIALIZED";
  case 34: return "CUDA_ERROR_STUB_LIBRARY";
  case 35: return "CUDA_ERROR_INSUFFICIENT_DRIVER";
  case 100: return "CUDA_ERROR_NO_DEVICE";
  case 101: return "CUDA_ERROR_INVALID_DEVICE";
  case 803: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
  case 804: return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
  default: return "CUDA_ERROR";
  }
}

/* "NAME (text)" for a driver result. */
static void describe(RtCuResult r, char *out, size_t cap) {
  const char *name = NULL, *text = NULL;
  if (D.cuGetErrorName && D.cuGetErrorName(r, &name) != CU_SUCCESS) name = NULL;
  if (D.cuGetErrorString && D.cuGetErrorString(r, &text) != CU_SUCCESS) text = NULL;
  if (!name) name = fallback_name(r);
  if (text) snprintf(out, cap, "%s (%d): %s", name, r, text);
  else snprintf(out, cap, "%s (%d)", name, r);
}

typedef RtCuResult (*GetProcV2)(const char *, void **, int, unsigned long long, int *);
typedef RtCuResult (*GetProcV1)(const char *, void **, int, unsigned long long);

/* Resolve every entry point; false (with load_why set) if one is missing. */
static int resolve(void *lib) {
  GetProcV2 gp2 = NULL;
  GetProcV1 gp1 = NULL;
  *(void **)&gp2 = dlsym(lib, "cuGetProcAddress_v2");
  if (!gp2) *(void **)&gp1 = dlsym(lib, "cuGetProcAddress");
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    void *p = NULL;
    int found = 0;
    if (gp2 && gp2(syms[i].name, &p, CU_ABI_VERSION, CU_PROC_LEGACY_STREAM, &found) != CU_SUCCESS)
      p = NULL;
    if (!p && gp1 && gp1(syms[i].name, &p, CU_ABI_VERSION, CU_PROC_LEGACY_STREAM) != CU_SUCCESS)
      p = NULL;
    if (!p) p = dlsym(lib, syms[i].export_name);
    if (!p) {
      snprintf(load_why, sizeof load_why, "the driver library has no %s", syms[i].export_name);
      return 0;
    }
    *syms[i].slot = p;
  }
  for (size_t i = 0; i < sizeof opt_syms / sizeof opt_syms[0]; i++) {
    void *p = NULL;
    int found = 0;
    if (gp2 && gp2(opt_syms[i].name, &p, CU_ABI_VERSION, CU_PROC_LEGACY_STREAM, &found))
      p = NULL;
    if (!p && gp1 && gp1(opt_syms[i].name, &p, CU_ABI_VERSION, CU_PROC_LEGACY_STREAM)) p = NULL;
    if (!p) p = dlsym(lib, opt_syms[i].export_name);
    *opt_syms[i].slot = p;
  }
  return 1;
}

static void load_once(void) {
  const char *path = *base_config()->libcuda ? base_config()->libcuda : "libcuda.so.1";
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    snprintf(load_why, sizeof load_why, "cannot load the CUDA driver library (%.400s)",
             e ? e : path);
    return;
  }
  if (!resolve(lib)) {
    memset(&D, 0, sizeof D);
    return;
  }
  char desc[256];
  RtCuResult r = D.cuInit(0);
  if (r != CU_SUCCESS) {
    describe(r, desc, sizeof desc);
    snprintf(load_why, sizeof load_why, "cuInit failed: %s", desc);
    return;
  }
  r = D.cuDeviceGetCount(&ndevices);
  if (r != CU_SUCCESS || ndevices <= 0) {
    if (r != CU_SUCCESS) describe(r, desc, sizeof desc);
    else snprintf(desc, sizeof desc, "the driver reports 0 devices");
    snprintf(load_why, sizeof load_why, "%s", desc);
    ndevices = 0;
    return;
  }
  load_status = FLEX_OK;
}

flex_status rt_drv_init(void) {
  BaseTry *held = base_try_hold(); /* a jump out of a once-initialiser would block it forever */
  pthread_once(&once, load_once);
  base_try_restore(held);
  if (load_status != FLEX_OK) return rt_err(FLEX_ERR_NO_DEVICE, "no CUDA device: %s", load_why);
  return FLEX_OK;
}

int rt_drv_device_count(void) { return rt_drv_init() == FLEX_OK ? ndevices : 0; }

flex_status rt_drv_check(RtCuResult r, const char *what, const char *file, int line) {
  if (r == CU_SUCCESS) return FLEX_OK;
  char desc[256];
  describe(r, desc, sizeof desc);
  return rt_err(r == CU_ERR_OUT_OF_MEMORY ? FLEX_ERR_NOMEM : FLEX_ERR_RUNTIME,
                "CUDA error at %s:%d: %s failed: %s", file, line, what, desc);
}

/* A device ordinal we can use, with the driver loaded. */
static flex_status check_device(int device) {
  flex_status st = rt_drv_init();
  if (st) return st;
  if (device < 0 || device >= ndevices || device >= MAX_DEVICES)
    return rt_err(FLEX_ERR_NO_DEVICE, "no CUDA device: device %d requested, %d present", device,
                  ndevices);
  return FLEX_OK;
}

flex_status rt_drv_use_device(int device) {
  flex_status st = check_device(device);
  if (st) return st;
  pthread_mutex_lock(&ctx_lock);
  if (!primary[device]) {
    RtCuDevice dev;
    st = CHECK_CU(D.cuDeviceGet(&dev, device));
    if (!st) st = CHECK_CU(D.cuDevicePrimaryCtxRetain(&primary[device], dev));
  }
  RtCuContext ctx = primary[device];
  pthread_mutex_unlock(&ctx_lock);
  if (st) return st;
  return CHECK_CU(D.cuCtxSetCurrent(ctx));
}

flex_status rt_drv_compute_capability(int device, int *major, int *minor) {
  flex_status st = check_device(device);
  RtCuDevice dev;
  if (!st) st = CHECK_CU(D.cuDeviceGet(&dev, device));
  if (!st) st = CHECK_CU(D.cuDeviceGetAttribute(major, CU_ATTR_CC_MAJOR, dev));
  if (!st) st = CHECK_CU(D.cuDeviceGetAttribute(minor, CU_ATTR_CC_MINOR, dev));
  return st;
}

flex_status rt_drv_sm_count(int device, int *n) {
  flex_status st = check_device(device);
  RtCuDevice dev;
  if (!st) st = CHECK_CU(D.cuDeviceGet(&dev, device));
  if (!st) st = CHECK_CU(D.cuDeviceGetAttribute(n, CU_ATTR_SM_COUNT, dev));
  return st;
}

flex_status rt_drv_device_name(int device, char *out, size_t cap) {
  flex_status st = check_device(device);
  RtCuDevice dev;
  if (!st) st = CHECK_CU(D.cuDeviceGet(&dev, device));
  if (!st) st = CHECK_CU(D.cuDeviceGetName(out, (int)cap, dev));
  return st;
}

/* Every call below runs after rt_drv_use_device() succeeded (a context is
 * current), so the driver is loaded; the CHECK guards that order. */
flex_status rt_drv_module_load(RtCuModule *out, const void *image) {
  CHECK(D.cuModuleLoadData);
  return CHECK_CU(D.cuModuleLoadData(out, image));
}

flex_status rt_drv_module_unload(RtCuModule m) {
  CHECK(D.cuModuleUnload);
  return CHECK_CU(D.cuModuleUnload(m));
}

flex_status rt_drv_function(RtCuFunction *out, RtCuModule m, const char *name) {
  CHECK(D.cuModuleGetFunction);
  return CHECK_CU(D.cuModuleGetFunction(out, m, name));
}

flex_status rt_drv_set_smem(RtCuFunction f, int bytes) {
  CHECK(D.cuFuncSetAttribute);
  if (bytes <= 48 * 1024) return FLEX_OK; /* the default limit covers it */
  return CHECK_CU(D.cuFuncSetAttribute(f, CU_FUNC_ATTR_MAX_DYN_SMEM, bytes));
}

flex_status rt_drv_launch(RtCuFunction f, const unsigned grid[3], const unsigned block[3],
                          unsigned smem, RtCuStream stream, void **params) {
  CHECK(D.cuLaunchKernel);
  return CHECK_CU(D.cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                   smem, stream, params, NULL));
}

flex_status rt_drv_alloc(RtCuDevicePtr *out, size_t bytes) {
  CHECK(D.cuMemAlloc);
  return CHECK_CU(D.cuMemAlloc(out, bytes ? bytes : 4));
}

flex_status rt_drv_free(RtCuDevicePtr p) {
  CHECK(D.cuMemFree);
  return p ? CHECK_CU(D.cuMemFree(p)) : FLEX_OK;
}

/* Whether `device` takes stream-ordered allocations (asked once). */
bool rt_drv_has_pools(int device) {
  if (!D.cuMemAllocAsync || !D.cuMemFreeAsync || device < 0 || device >= MAX_DEVICES) return false;
  pthread_mutex_lock(&ctx_lock);
  if (!pools[device]) {
    RtCuDevice dev;
    int yes = 0;
    if (D.cuDeviceGet(&dev, device) != CU_SUCCESS ||
        D.cuDeviceGetAttribute(&yes, CU_ATTR_MEMORY_POOLS, dev) != CU_SUCCESS)
      yes = 0;
    pools[device] = yes ? 1 : -1;
  }
  bool yes = pools[device] > 0;
  pthread_mutex_unlock(&ctx_lock);
  return yes;
}

flex_status rt_drv_alloc_async(RtCuDevicePtr *out, size_t bytes, RtCuStream stream) {
  CHECK(D.cuMemAllocAsync);
  return CHECK_CU(D.cuMemAllocAsync(out, bytes ? bytes : 4, stream));
}

flex_status rt_drv_free_async(RtCuDevicePtr p, RtCuStream stream) {
  CHECK(D.cuMemFreeAsync);
  return p ? CHECK_CU(D.cuMemFreeAsync(p, stream)) : FLEX_OK;
}

flex_status rt_drv_memset32(RtCuDevicePtr p, uint32_t value, size_t count, RtCuStream stream) {
  CHECK(D.cuMemsetD32Async);
  return count ? CHECK_CU(D.cuMemsetD32Async(p, value, count, stream)) : FLEX_OK;
}

flex_status rt_drv_memcpy_htod(RtCuDevicePtr dst, const void *src, size_t bytes,
                               RtCuStream stream) {
  CHECK(D.cuMemcpyHtoDAsync);
  return bytes ? CHECK_CU(D.cuMemcpyHtoDAsync(dst, src, bytes, stream)) : FLEX_OK;
}

flex_status rt_drv_memcpy_dtoh(void *dst, RtCuDevicePtr src, size_t bytes, RtCuStream stream) {
  CHECK(D.cuMemcpyDtoHAsync);
  return bytes ? CHECK_CU(D.cuMemcpyDtoHAsync(dst, src, bytes, stream)) : FLEX_OK;
}

bool rt_drv_has_tensor_maps(void) { return D.cuTensorMapEncodeTiled != NULL; }

/* cuda.h's enumerators: CU_TENSOR_MAP_DATA_TYPE_UINT16 (the copy moves
 * bits; fp16 and bf16 alike, zero fill is 0.0 in both), no interleave,
 * CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
 * CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE (zeros). Element strides 1. */
flex_status rt_drv_tensor_map_16(void *map, unsigned rank, const void *base, const uint64_t *dims,
                                 const uint64_t *strides, const unsigned *box) {
  if (!D.cuTensorMapEncodeTiled)
    return rt_err(FLEX_ERR_UNSUPPORTED, "the CUDA driver library has no cuTensorMapEncodeTiled");
  unsigned ones[5] = {1, 1, 1, 1, 1};
  return CHECK_CU(D.cuTensorMapEncodeTiled(map, 1, rank, (void *)base, dims, strides, box, ones,
                                           0, 3, 2, 0));
}

/* The event entry points are optional: an error, not an internal check. */
static flex_status have_events(void) {
  if (D.cuEventCreate && D.cuEventRecord && D.cuEventSynchronize && D.cuEventElapsedTime &&
      D.cuEventDestroy)
    return FLEX_OK;
  return rt_err(FLEX_ERR_UNSUPPORTED, "the CUDA driver library has no event entry points");
}

flex_status rt_drv_event_create(RtCuEvent *out) {
  flex_status st = have_events();
  return st ? st : CHECK_CU(D.cuEventCreate(out, 0));
}

flex_status rt_drv_event_record(RtCuEvent e, RtCuStream stream) {
  flex_status st = have_events();
  return st ? st : CHECK_CU(D.cuEventRecord(e, stream));
}

flex_status rt_drv_event_elapsed(float *ms, RtCuEvent start, RtCuEvent end) {
  flex_status st = have_events();
  if (!st) st = CHECK_CU(D.cuEventSynchronize(end));
  return st ? st : CHECK_CU(D.cuEventElapsedTime(ms, start, end));
}

flex_status rt_drv_event_destroy(RtCuEvent e) {
  flex_status st = have_events();
  return st ? st : CHECK_CU(D.cuEventDestroy(e));
}

flex_status rt_drv_sync(RtCuStream stream) {
  CHECK(D.cuStreamSynchronize);
  return CHECK_CU(D.cuStreamSynchronize(stream));
}
