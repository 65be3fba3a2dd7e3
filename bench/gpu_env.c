/* gpu_env: what a GPU run needs to know about its machine before it
 * starts (bench/run_gpu.sh, stage 1), as key=value lines:
 *
 *   nvrtc=13000            NVRTC's version as the kernel cache's key names it
 *                          (major * 1000 + minor * 10; "none: why" without it)
 *   device=NVIDIA H100 ... device 0's name
 *   compute_capability=9.0
 *   sms=132                its multiprocessors
 *   arch=sm_90a            what the cuda backend compiles for on it
 *   cache_entries=412      files in $FLEXC_CACHE_DIR that are cache entries
 *
 * NVRTC is reported first and does not need a device; the cuda backend
 * needs both. Exits 0 with a usable device 0, 77 when there is no CUDA
 * device (after the lines it could write), 1 when the device fails.
 *
 *   gpu_env
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/driver.h"
#include "cuda/nvrtc.h"

/* Entries of the disk cache: files named <64 hex digits>.cubin. */
static int cache_entries(const char *dir) {
  DIR *d = dir ? opendir(dir) : NULL;
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    n += strlen(e->d_name) == 64 + 6 && !strcmp(e->d_name + 64, ".cubin") &&
         strspn(e->d_name, "0123456789abcdef") == 64;
  closedir(d);
  return n;
}

int main(int argc, char **argv) {
  (void)argv;
  if (argc > 1) {
    fprintf(stderr, "usage: gpu_env (prints key=value lines; exit 77 without a CUDA device)\n");
    return 2;
  }
  int v = rt_nvrtc_version();
  if (v < 0) printf("nvrtc=none: %s\n", flex_last_error());
  else printf("nvrtc=%d\n", v);
  const char *dir = getenv("FLEXC_CACHE_DIR");
  printf("cache_entries=%d\n", cache_entries(dir));
  fflush(stdout);
  if (rt_drv_init() != FLEX_OK) {
    printf("device=none: %s\n", flex_last_error());
    return 77;
  }
  char name[256];
  int major = 0, minor = 0, sms = 0;
  if (rt_drv_use_device(0) || rt_drv_device_name(0, name, sizeof name) ||
      rt_drv_compute_capability(0, &major, &minor) || rt_drv_sm_count(0, &sms)) {
    printf("device=failed: %s\n", flex_last_error());
    return 1;
  }
  printf("device=%s\ncompute_capability=%d.%d\nsms=%d\n", name, major, minor, sms);
  /* as cuda/cuda.c picks it: sm_90a on 9.0 (the wgmma paths), sm_XY elsewhere */
  printf("arch=sm_%d%d%s\n", major, minor, major == 9 && minor == 0 ? "a" : "");
  return 0;
}
