/* driver.h: the CUDA driver API, reached through dlopen("libcuda.so.1") so
 * that the library loads and runs (reference and emulator backends) on
 * machines without a GPU or driver. Nothing here links against libcuda.
 *
 * Every function returns FLEX_OK or a flex_status with a message already
 * set (rt_err): FLEX_ERR_NO_DEVICE "no CUDA device: <why>" when the driver
 * is missing, cuInit fails or there is no device; otherwise the failing
 * call, its file and line, and the driver's error name and string.
 */
#ifndef FLEXC_DRIVER_H
#define FLEXC_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/flex.h"

/* The driver's handle types, declared by us (ABI-compatible with cuda.h). */
typedef int RtCuResult;                    /* CUresult */
typedef int RtCuDevice;                    /* CUdevice */
typedef struct CUctx_st *RtCuContext;      /* CUcontext */
typedef struct CUmod_st *RtCuModule;       /* CUmodule */
typedef struct CUfunc_st *RtCuFunction;    /* CUfunction */
typedef struct CUstream_st *RtCuStream;    /* CUstream */
typedef unsigned long long RtCuDevicePtr;  /* CUdeviceptr */
typedef struct CUevent_st *RtCuEvent;      /* CUevent */

/* Load libcuda and run cuInit (once per process, thread-safe); then check
 * that a device exists. FLEX_ERR_NO_DEVICE with the reason otherwise. The
 * library path can be overridden with $FLEXC_LIBCUDA (tests use the stub). */
flex_status rt_drv_init(void);
/* Number of devices (0 when the driver is missing). */
int rt_drv_device_count(void);
/* Make the primary context of `device` current on this thread (retained
 * once per device for the life of the process). */
flex_status rt_drv_use_device(int device);
/* Compute capability of `device`, e.g. 9 and 0. */
flex_status rt_drv_compute_capability(int device, int *major, int *minor);
/* Its streaming multiprocessors (the split-KV heuristic). */
flex_status rt_drv_sm_count(int device, int *n);
/* The device's name (for messages and benchmarks). */
flex_status rt_drv_device_name(int device, char *out, size_t cap);

/* Load a cubin (or PTX) image into the current context. */
flex_status rt_drv_module_load(RtCuModule *out, const void *image);
flex_status rt_drv_module_unload(RtCuModule m);
/* Look up a kernel entry by its extern "C" name. */
flex_status rt_drv_function(RtCuFunction *out, RtCuModule m, const char *name);
/* Allow `bytes` of dynamic shared memory (needed above 48 KB). */
flex_status rt_drv_set_smem(RtCuFunction f, int bytes);
/* Launch f on `stream` (NULL: the default stream) with the kernel
 * parameters `params` (one pointer per kernel argument). */
flex_status rt_drv_launch(RtCuFunction f, const unsigned grid[3], const unsigned block[3],
                          unsigned smem, RtCuStream stream, void **params);

/* Device memory for scratch buffers. */
flex_status rt_drv_alloc(RtCuDevicePtr *out, size_t bytes);
flex_status rt_drv_free(RtCuDevicePtr p);
/* The same in `stream`'s order (cuMemAllocAsync / cuMemFreeAsync, the
 * device's default pool), on a device for which rt_drv_has_pools (asked
 * once per device): cuMemFree waits for every stream of the device, so a
 * call that allocated its workspace with it returned only once the GPU
 * was idle. A pointer goes back through the pair it came from. */
bool rt_drv_has_pools(int device);
flex_status rt_drv_alloc_async(RtCuDevicePtr *out, size_t bytes, RtCuStream stream);
flex_status rt_drv_free_async(RtCuDevicePtr p, RtCuStream stream);
/* Asynchronous fills and copies on `stream`. */
flex_status rt_drv_memset32(RtCuDevicePtr p, uint32_t value, size_t count, RtCuStream stream);
flex_status rt_drv_memcpy_htod(RtCuDevicePtr dst, const void *src, size_t bytes, RtCuStream stream);
flex_status rt_drv_memcpy_dtoh(void *dst, RtCuDevicePtr src, size_t bytes, RtCuStream stream);
/* Wait for the stream's work; reports errors of earlier launches. */
flex_status rt_drv_sync(RtCuStream stream);

/* Events (benchmarks; optional entry points: an error where the driver has
 * none). elapsed waits for `end`, then gives the milliseconds between them. */
flex_status rt_drv_event_create(RtCuEvent *out);
flex_status rt_drv_event_record(RtCuEvent e, RtCuStream stream);
flex_status rt_drv_event_elapsed(float *ms, RtCuEvent start, RtCuEvent end);
flex_status rt_drv_event_destroy(RtCuEvent e);

/* Tensor maps (optional entry point, CUDA 12 on): whether the driver has
 * cuTensorMapEncodeTiled, and a tiled map of a 16-bit tensor (rank dims,
 * innermost first; byte strides of dims 1..; box; 128-byte swizzle,
 * out-of-bounds zeros) into the 128 bytes at `map` (64-byte aligned). */
bool rt_drv_has_tensor_maps(void);
flex_status rt_drv_tensor_map_16(void *map, unsigned rank, const void *base, const uint64_t *dims,
                                 const uint64_t *strides, const unsigned *box);

/* Check one driver result: FLEX_OK, or a FLEX_ERR_RUNTIME (NOMEM for out of
 * memory) naming `what`, file, line and the driver's error name and text. */
flex_status rt_drv_check(RtCuResult r, const char *what, const char *file, int line);
#define CHECK_CU(call) rt_drv_check((call), #call, __FILE__, __LINE__)

#endif
