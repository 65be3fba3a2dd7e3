/* mockcuda.c: a stand-in for libcuda.so.1 that enforces the driver's rules
 * the CUDA backend must follow, for tests on machines without a GPU
 * (tests/cuda/check_hw.c compiles it with the host C compiler and points
 * $FLEXC_LIBCUDA at it). Device memory is host memory; kernels are never
 * run. What it checks, returning the driver's error codes like a device:
 *   - a context is current on the calling thread (cuCtxSetCurrent per thread)
 *   - launch geometry: no empty grid, x < 2^31, y and z <= 65535, <= 1024 threads
 *   - dynamic shared memory above 48 KB only after
 *     CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES on that function
 * and it counts the stream of every asynchronous operation, so a test can
 * see that all of them went to the caller's stream.
 *
 * By default it is an 8.0 device with 108 SMs (an A100). $MOCKCUDA_CC
 * ("9.0") and $MOCKCUDA_SMS ("132") make it another: scripts/gpu_bundle.sh
 * runs the GPU checks over it as an H100 to fill the bundle's kernel cache
 * with exactly the kernels those checks will ask for on the real device.
 * cuMemAllocAsync and cuMemFreeAsync count as stream operations, and
 * cuMemFree calls are counted (a call's workspace goes through the
 * stream-ordered pair; $MOCKCUDA_NO_POOLS makes a device without it).
 * cuTensorMapEncodeTiled (the sm_90a bodies' TMA maps) checks its
 * arguments as the driver documents them; events (benchmarks) measure
 * nothing and report 1 ms. */
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { OK = 0, INVALID_VALUE = 1, INVALID_CONTEXT = 201, NOT_FOUND = 500 };

/* A function handle: its name and the shared-memory opt-in it got. */
typedef struct MockFunc {
  char name[64];  /* the entry */
  int smem_optin; /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 0 if never set */
  struct MockFunc *next; /* every handle given out, kept (handles live as long as the process) */
} MockFunc;

/* ---- what tests read and set (dlsym) ---- */
void *mock_stream;              /* the stream every operation should use */
int mock_ops;                   /* asynchronous operations and syncs seen */
int mock_foreign;               /* of those, on another stream */
int mock_launches;              /* kernel launches accepted */
int mock_big_smem_launches;     /* of those, with more than 48 KB of dynamic shared memory */
long long mock_dtoh_bytes;      /* bytes copied device to host */
unsigned long long mock_flags;  /* cuGetProcAddress flags seen (OR) */
int mock_bad_flags;             /* cuGetProcAddress calls without the legacy-stream flag */
char mock_error[256];           /* the first rule broken */
int mock_fail_launches;         /* nonzero: every launch fails (an injected error) */
int mock_sync_frees;            /* cuMemFree calls (each waits for the whole device) */
int mock_syncs;                 /* cuStreamSynchronize calls */

/* initial-exec: static TLS, so leak checkers need not walk a dlopened
 * library's dynamic TLS of exited threads (LeakSanitizer could crash there) */
static __thread int current __attribute__((tls_model("initial-exec"))); /* a context is current on this thread */

static CUresult fail(CUresult r, const char *what) {
  if (!mock_error[0]) snprintf(mock_error, sizeof mock_error, "%s", what);
  return r;
}

static void on_stream(void *s) {
  mock_ops++;
  if (s != mock_stream) mock_foreign++;
}

CUresult cuInit(unsigned f) { return f ? INVALID_VALUE : OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int i) { *d = i; return i == 0 ? OK : INVALID_VALUE; }
/* The compute capability (major, minor) and SM count of the one device. */
static void device_shape(int *major, int *minor, int *sms) {
  const char *cc = getenv("MOCKCUDA_CC"), *n = getenv("MOCKCUDA_SMS");
  *major = 8, *minor = 0, *sms = 108;
  if (cc && sscanf(cc, "%d.%d", major, minor) != 2) *major = 8, *minor = 0;
  if (n) *sms = atoi(n);
}
CUresult cuDeviceGetAttribute(int *v, int a, int d) {
  (void)d;
  int major, minor, sms;
  device_shape(&major, &minor, &sms);
  /* compute capability (75 major, 76 minor); multiprocessors (16) */
  /* ... and the stream-ordered allocator (115) unless $MOCKCUDA_NO_POOLS */
  *v = a == 75 ? major : a == 76 ? minor : a == 16 ? sms : a == 115 ? !getenv("MOCKCUDA_NO_POOLS") : 0;
  return OK;
}
CUresult cuDeviceGetName(char *out, int n, int d) {
  (void)d;
  int major, minor, sms;
  device_shape(&major, &minor, &sms);
  snprintf(out, (size_t)n, "mock device (compute capability %d.%d, %d SMs)", major, minor, sms);
  return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) {
  (void)d;
  static int the_ctx;
  *ctx = &the_ctx;
  return OK;
}
CUresult cuCtxSetCurrent(void *ctx) {
  current = ctx != NULL;
  return OK;
}
CUresult cuModuleLoadData(void **m, const void *image) {
  if (!current) return fail(INVALID_CONTEXT, "cuModuleLoadData without a current context");
  *m = (void *)image;
  return image ? OK : INVALID_VALUE;
}
CUresult cuModuleUnload(void *m) { (void)m; return OK; }
CUresult cuModuleGetFunction(MockFunc **f, void *m, const char *name) {
  (void)m;
  if (!current) return fail(INVALID_CONTEXT, "cuModuleGetFunction without a current context");
  static MockFunc *handles; /* reachable, so leak checkers stay quiet */
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  *f = calloc(1, sizeof **f);
  if (!*f) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  snprintf((*f)->name, sizeof (*f)->name, "%s", name);
  pthread_mutex_lock(&lock);
  (*f)->next = handles;
  handles = *f;
  pthread_mutex_unlock(&lock);
  return OK;
}
CUresult cuFuncSetAttribute(MockFunc *f, int attr, int v) {
  if (attr != 8) return INVALID_VALUE;
  if (v > 227 * 1024) return fail(INVALID_VALUE, "shared memory opt-in above 227 KB");
  f->smem_optin = v;
  return OK;
}
CUresult cuLaunchKernel(MockFunc *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, void *stream, void **params, void **extra) {
  char msg[256];
  if (!current) return fail(INVALID_CONTEXT, "cuLaunchKernel without a current context");
  on_stream(stream);
  if (!params || extra) return fail(INVALID_VALUE, "cuLaunchKernel: bad kernel parameters");
  if (mock_fail_launches) return INVALID_VALUE;
  if (!gx || !gy || !gz || gx > 2147483647u || gy > 65535u || gz > 65535u ||
      (unsigned long long)bx * by * bz > 1024 || bz > 64) {
    snprintf(msg, sizeof msg, "%s: grid (%u,%u,%u) block (%u,%u,%u) beyond the device's limits",
             f->name, gx, gy, gz, bx, by, bz);
    return fail(INVALID_VALUE, msg);
  }
  if (smem > 48 * 1024 && (int)smem > f->smem_optin) {
    snprintf(msg, sizeof msg, "%s: %u bytes of dynamic shared memory without the opt-in",
             f->name, smem);
    return fail(INVALID_VALUE, msg);
  }
  mock_launches++;
  if (smem > 48 * 1024) mock_big_smem_launches++;
  return OK;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (!current) return fail(INVALID_CONTEXT, "cuMemAlloc without a current context");
  void *m = aligned_alloc(256, (n + 255) / 256 * 256);
  *p = (CUdeviceptr)(uintptr_t)m;
  return m ? OK : 2;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  mock_sync_frees++;
  free((void *)(uintptr_t)p);
  return OK;
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, void *s) {
  on_stream(s);
  if (getenv("MOCKCUDA_NO_POOLS")) return fail(INVALID_VALUE, "cuMemAllocAsync on a device without memory pools");
  if (!current) return fail(INVALID_CONTEXT, "cuMemAllocAsync without a current context");
  void *m = aligned_alloc(256, (n + 255) / 256 * 256);
  *p = (CUdeviceptr)(uintptr_t)m;
  return m ? OK : 2;
}
CUresult cuMemFreeAsync(CUdeviceptr p, void *s) {
  on_stream(s);
  free((void *)(uintptr_t)p);
  return OK;
}
CUresult cuMemsetD32Async(CUdeviceptr p, unsigned v, size_t n, void *s) {
  on_stream(s);
  for (size_t i = 0; i < n; i++) ((unsigned *)(uintptr_t)p)[i] = v;
  return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *s) {
  on_stream(s);
  memcpy((void *)(uintptr_t)d, h, n);
  return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *s) {
  on_stream(s);
  mock_dtoh_bytes += (long long)n;
  memcpy(h, (const void *)(uintptr_t)d, n);
  return OK;
}
CUresult cuStreamSynchronize(void *s) {
  on_stream(s);
  mock_syncs++;
  return OK;
}
/* Events: benchmarks time with them; nothing runs here, so 1 ms. */
static int the_event;
CUresult cuEventCreate(void **e, unsigned flags) {
  (void)flags;
  if (!current) return fail(INVALID_CONTEXT, "cuEventCreate without a current context");
  *e = &the_event;
  return OK;
}
CUresult cuEventRecord(void *e, void *s) {
  (void)e;
  on_stream(s);
  return OK;
}
CUresult cuEventSynchronize(void *e) { return e ? OK : INVALID_VALUE; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) {
  *ms = 1.0f;
  return a && b ? OK : INVALID_VALUE;
}
CUresult cuEventDestroy_v2(void *e) { return e ? OK : INVALID_VALUE; }

int mock_tensor_maps; /* tensor maps encoded */

/* cuTensorMapEncodeTiled, with the argument rules of the driver's
 * documentation for what flexc asks (no interleave): a 64-byte aligned
 * map, rank 1..5, a 16-byte aligned base, dims in 1..2^32, byte strides
 * multiples of 16 below 2^40, boxes of 1..256 elements, element strides
 * 1..8, and with the 128-byte swizzle (3) an inner box of at most 128
 * bytes. The map's bytes are the arguments, for nobody to read. */
CUresult cuTensorMapEncodeTiled(void *map, int dtype, unsigned rank, void *base,
                                const unsigned long long *dims, const unsigned long long *strides,
                                const unsigned *box, const unsigned *estrides, int interleave,
                                int swizzle, int l2, int oob) {
  static const int elem_bytes[] = {1, 2, 4, 4, 8, 8, 8, 2, 4, 8, 2, 4, 4}; /* CUtensorMapDataType */
  char msg[256];
  (void)l2, (void)oob;
  if ((uintptr_t)map % 64) return fail(INVALID_VALUE, "cuTensorMapEncodeTiled: map not 64-byte aligned");
  if (dtype < 0 || dtype > 12 || rank < 1 || rank > 5 || interleave != 0)
    return fail(INVALID_VALUE, "cuTensorMapEncodeTiled: data type, rank or interleave out of range");
  if ((uintptr_t)base % 16) return fail(INVALID_VALUE, "cuTensorMapEncodeTiled: base not 16-byte aligned");
  for (unsigned i = 0; i < rank; i++) {
    bool bad = !dims[i] || dims[i] > (1ull << 32) || !box[i] || box[i] > 256 || !estrides[i] ||
               estrides[i] > 8 || (i && (strides[i - 1] % 16 || strides[i - 1] >= (1ull << 40)));
    if (bad) {
      snprintf(msg, sizeof msg, "cuTensorMapEncodeTiled: dim %u: size %llu, stride %llu, box %u",
               i, dims[i], i ? strides[i - 1] : 0ull, box[i]);
      return fail(INVALID_VALUE, msg);
    }
  }
  if (swizzle == 3 && box[0] * (unsigned)elem_bytes[dtype] > 128)
    return fail(INVALID_VALUE, "cuTensorMapEncodeTiled: inner box over 128 bytes with the 128-byte swizzle");
  memset(map, 0, 128);
  memcpy(map, &base, sizeof base);
  mock_tensor_maps++;
  return OK;
}

CUresult cuGetErrorName(CUresult r, const char **s) {
  *s = r == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
       : r == INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT" : "CUDA_ERROR_UNKNOWN";
  return OK;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
  *s = mock_error[0] ? mock_error : "injected by the test";
  (void)r;
  return OK;
}

/* The CUDA 12 lookup: base names, as cuda.h's cuGetProcAddress_v2. */
CUresult cuGetProcAddress_v2(const char *name, void **pfn, int version, unsigned long long flags,
                             int *status) {
  static const struct { const char *n; void *f; } tab[] = {
      {"cuInit", (void *)cuInit}, {"cuDriverGetVersion", (void *)cuDriverGetVersion},
      {"cuDeviceGetCount", (void *)cuDeviceGetCount}, {"cuDeviceGet", (void *)cuDeviceGet},
      {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
      {"cuDeviceGetName", (void *)cuDeviceGetName},
      {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
      {"cuCtxSetCurrent", (void *)cuCtxSetCurrent}, {"cuModuleLoadData", (void *)cuModuleLoadData},
      {"cuModuleUnload", (void *)cuModuleUnload},
      {"cuModuleGetFunction", (void *)cuModuleGetFunction},
      {"cuFuncSetAttribute", (void *)cuFuncSetAttribute}, {"cuLaunchKernel", (void *)cuLaunchKernel},
      {"cuMemAlloc", (void *)cuMemAlloc_v2}, {"cuMemFree", (void *)cuMemFree_v2},
      {"cuMemAllocAsync", (void *)cuMemAllocAsync}, {"cuMemFreeAsync", (void *)cuMemFreeAsync},
      {"cuMemsetD32Async", (void *)cuMemsetD32Async},
      {"cuMemcpyHtoDAsync", (void *)cuMemcpyHtoDAsync_v2},
      {"cuMemcpyDtoHAsync", (void *)cuMemcpyDtoHAsync_v2},
      {"cuStreamSynchronize", (void *)cuStreamSynchronize},
      {"cuGetErrorName", (void *)cuGetErrorName}, {"cuGetErrorString", (void *)cuGetErrorString},
      {"cuEventCreate", (void *)cuEventCreate}, {"cuEventRecord", (void *)cuEventRecord},
      {"cuEventSynchronize", (void *)cuEventSynchronize},
      {"cuEventElapsedTime", (void *)cuEventElapsedTime},
      {"cuEventDestroy", (void *)cuEventDestroy_v2},
      {"cuTensorMapEncodeTiled", (void *)cuTensorMapEncodeTiled},
  };
  mock_flags |= flags;
  if (!(flags & 1)) mock_bad_flags++; /* CU_GET_PROC_ADDRESS_LEGACY_STREAM */
  if (version < 12000) return INVALID_VALUE;
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
    if (!strcmp(tab[i].n, name)) {
      *pfn = tab[i].f;
      if (status) *status = 0;
      return OK;
    }
  *pfn = NULL;
  if (status) *status = 1;
  return NOT_FOUND;
}
