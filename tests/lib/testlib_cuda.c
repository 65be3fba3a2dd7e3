/* testlib_cuda.c: run a host-tensor attention call on the CUDA backend.
 *
 * The numerical suites build their tensors in host memory for the emulator.
 * tl_cuda_call mirrors every tensor of a flex_args on the device
 * (flex_mirror_wrap: compact device copies), runs the call with the CUDA
 * backend on the call's stream, and copies the outputs back into the host
 * tensors, so the same suites can check the GPU against the float64
 * reference when there is one. flex.h and flex_mirror.h alone (and the
 * driver's own loader, for tl_cuda_setup's device check); tl_mock_driver
 * builds the stand-in driver (tests/cuda/mockcuda.c) the suites without a
 * device run the CUDA backend over. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/driver.h"
#include "runtime/flex_mirror.h"
#include "testlib.h"

enum { MAXM = 10 + 2 * 16 + 8 + 4 };

flex_status tl_cuda_call(flex_kernel *k, const flex_args *host, bool backward) {
  flex_mirror m[MAXM];
  memset(m, 0, sizeof m);
  if (host->nbuffers > 16) return FLEX_ERR_INVALID;
  int n = 0;
  flex_status st = FLEX_OK;
  flex_args a = *host;
  a.backend = FLEX_BACKEND_CUDA;
  const DLTensor **slots[10] = {&a.q, &a.k, &a.v, &a.out, &a.lse, &a.dout, &a.dlse, &a.dq, &a.dk, &a.dv};
  for (int i = 0; i < 10 && !st; i++, n++) {
    st = flex_mirror_wrap(&m[n], FLEX_BACKEND_CUDA, *slots[i], a.stream);
    *slots[i] = m[n].dev;
  }
  flex_buffer bufs[16];
  for (int i = 0; i < a.nbuffers && !st; i++) {
    bufs[i] = a.buffers[i];
    st = flex_mirror_wrap(&m[n], FLEX_BACKEND_CUDA, bufs[i].tensor, a.stream);
    bufs[i].tensor = m[n++].dev;
    if (!st) st = flex_mirror_wrap(&m[n], FLEX_BACKEND_CUDA, bufs[i].grad, a.stream);
    bufs[i].grad = m[n++].dev;
  }
  a.buffers = bufs;
  flex_block_mask bm;
  if (a.block_mask && !st) {
    bm = *a.block_mask;
    const DLTensor **ms[8] = {&bm.kv_num_blocks, &bm.kv_indices, &bm.full_kv_num_blocks,
                              &bm.full_kv_indices, &bm.q_num_blocks, &bm.q_indices,
                              &bm.full_q_num_blocks, &bm.full_q_indices};
    for (int i = 0; i < 8 && !st; i++, n++) {
      st = flex_mirror_wrap(&m[n], FLEX_BACKEND_CUDA, *ms[i], a.stream);
      *ms[i] = m[n].dev;
    }
    a.block_mask = &bm;
  }
  /* packed offsets and a paged cache's table and lengths (NULL: none) */
  const DLTensor **ix[4] = {&a.cu_seqlens_q, &a.cu_seqlens_kv, &a.page_table, &a.kv_lens};
  for (int i = 0; i < 4 && !st; i++, n++) {
    st = flex_mirror_wrap(&m[n], FLEX_BACKEND_CUDA, *ix[i], a.stream);
    *ix[i] = m[n].dev;
  }
  if (!st) st = backward ? flex_backward(k, &a) : flex_forward(k, &a);
  if (!st) st = flex_sync(FLEX_BACKEND_CUDA, a.stream);
  /* Outputs back: out and lse from a forward; dq, dk, dv and buffer
   * gradients from a backward. */
  for (int i = 3; !st && !backward && i < 5; i++) st = flex_mirror_pull(&m[i], a.stream);
  for (int i = 7; !st && backward && i < 10; i++) st = flex_mirror_pull(&m[i], a.stream);
  for (int i = 0; !st && backward && i < a.nbuffers; i++) st = flex_mirror_pull(&m[10 + 2 * i + 1], a.stream);
  for (int i = 0; i < n; i++) flex_mirror_free(&m[i]);
  /* said here too, in one greppable form: scripts/gpu_bundle.sh fails a
   * cache fill whose calls failed (a call that stops early compiles less) */
  if (st) fprintf(stderr, "tl_cuda_call: %s failed: %s\n", backward ? "backward" : "forward", flex_last_error());
  return st;
}

static char mock_path[512]; /* the compiled stand-in driver; "" if none */
static pid_t mock_owner;     /* the process that built it (Check's forked tests exit too) */

static void mock_remove(void) {
  if (getpid() != mock_owner) return;
  unlink(mock_path);
  *strrchr(mock_path, '/') = 0;
  rmdir(mock_path);
}

const char *tl_mock_driver(void) {
  static bool tried;
  if (tried) return mock_path[0] ? mock_path : NULL;
  tried = true;
  char dir[] = "/tmp/flexc-mockcuda-XXXXXX";
  if (!mkdtemp(dir)) return NULL;
  snprintf(mock_path, sizeof mock_path, "%s/libcuda.so.1", dir);
  const char *cc = getenv("CC");
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "%s -shared -fPIC -pthread -O1 -o '%s' '%s'", cc && *cc ? cc : "cc", mock_path,
           tl_src_path("tests/cuda/mockcuda.c"));
  Buf out = {0};
  if (tl_run(cmd, &out) != 0) {
    fprintf(stderr, "cannot build the stand-in driver:\n%s\n", out.data ? out.data : "");
    rmdir(dir);
    mock_path[0] = 0;
  } else {
    mock_owner = getpid();
    atexit(mock_remove);
  }
  buf_free(&out);
  return mock_path[0] ? mock_path : NULL;
}

flex_status tl_call(flex_kernel *k, const flex_args *a, bool backward) {
  if (a->backend != FLEX_BACKEND_CUDA) return backward ? flex_backward(k, a) : flex_forward(k, a);
  return tl_cuda_call(k, a, backward);
}

int tl_cuda_setup(void) {
  setenv("CK_FORK", "no", 1);
  if (rt_drv_init() != FLEX_OK) {
    printf("skipped: %s\n", flex_last_error());
    return 77;
  }
  if (rt_drv_use_device(0) != FLEX_OK) { /* a device that fails is a failure */
    printf("device 0: %s\n", flex_last_error());
    return 1;
  }
  return 0;
}

int tl_cuda_mode(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--cuda")) return tl_cuda_setup();
  return -1;
}
