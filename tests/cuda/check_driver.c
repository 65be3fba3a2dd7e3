/* Driver suite: the CUDA backend where there is no device (a clear
 * FLEX_ERR_NO_DEVICE, never a crash), and, with `--gpu` on a machine with
 * one, every single-kernel sample without buffers run forward and backward
 * on the GPU in fp32, fp16 and bf16 against the float64 reference (exit 77
 * when there is no device; a failure when nothing could be compared).
 *
 * Check forks a fresh process per test, so each sees a driver that was never
 * loaded and can point $FLEXC_LIBCUDA somewhere first. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/driver.h"
#include "runtime/flex.h"
#include "runtime/npy.h"
#include "runtime/rt.h"
#include "testlib.h"

#define STUB "/usr/local/cuda/lib64/stubs/libcuda.so"

static void expect_no_device(flex_status st, const char *why) {
  ck_assert_int_eq(st, FLEX_ERR_NO_DEVICE);
  const char *msg = flex_last_error();
  ck_assert_msg(strncmp(msg, "no CUDA device: ", 16) == 0, "message: %s", msg);
  if (why) ck_assert_msg(strstr(msg, why) != NULL, "message: %s (expected '%s')", msg, why);
}

START_TEST(missing_driver_library) {
  setenv("FLEXC_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  expect_no_device(rt_drv_init(), "cannot load the CUDA driver library");
  expect_no_device(rt_drv_init(), "cannot load"); /* asked again: same answer, no reload */
  ck_assert_int_eq(rt_drv_device_count(), 0);
  expect_no_device(rt_drv_use_device(0), NULL);
}
END_TEST

START_TEST(stub_driver_library) {
  if (access(STUB, R_OK) != 0) return; /* toolkit without stubs: nothing to check */
  setenv("FLEXC_LIBCUDA", STUB, 1);
  expect_no_device(rt_drv_init(), "cuInit failed");
  ck_assert_msg(strstr(flex_last_error(), "CUDA_ERROR_STUB_LIBRARY"), "%s", flex_last_error());
}
END_TEST

START_TEST(not_a_driver_library) {
  setenv("FLEXC_LIBCUDA", "libm.so.6", 1); /* loads, but has no cuInit */
  expect_no_device(rt_drv_init(), "has no cu");
}
END_TEST

START_TEST(system_driver_answers_cleanly) {
  unsetenv("FLEXC_LIBCUDA");
  flex_status st = rt_drv_init();
  if (st != FLEX_OK) expect_no_device(st, NULL);
  else ck_assert_int_gt(rt_drv_device_count(), 0);
}
END_TEST

/* A small causal call whose tensors claim to be on CUDA device 0 (their
 * data pointers are never touched without a device). */
START_TEST(forward_and_backward_without_device) {
  setenv("FLEXC_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  flex_kernel *k = tl_load("samples/causal.score", NULL, NULL);
  static char fake[64] __attribute__((aligned(16)));
  int64_t s4[] = {1, 2, 16, 16}, s3[] = {1, 2, 16};
  DLTensor t4 = {fake, {kDLCUDA, 0}, 4, {kDLFloat, 32, 1}, s4, NULL, 0};
  DLTensor t3 = {fake, {kDLCUDA, 0}, 3, {kDLFloat, 32, 1}, s3, NULL, 0};
  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = FLEX_BACKEND_CUDA;
  a.q = a.k = a.v = a.out = a.dout = a.dq = a.dk = a.dv = &t4;
  a.lse = &t3;
  expect_no_device(flex_forward(k, &a), "cannot load");
  expect_no_device(flex_backward(k, &a), "cannot load");
  flex_kernel_free(k);
}
END_TEST

START_TEST(cli_run_without_device) {
  /* flexc run --backend cuda: one clear error and exit status 1. */
  Buf out = {0};
  char cmd[8192];
  char dir[] = "/tmp/flexc-driver-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  RtArray q;
  int64_t shape[] = {1, 1, 8, 16};
  rt_array_init(&q, rt_dtype(kDLFloat, 32), 4, shape);
  uint64_t st = tl_seed();
  for (int i = 0; i < 128; i++) rt_array_set(&q, i, tl_normal(&st));
  char path[512];
  snprintf(path, sizeof path, "%s/q.npy", dir);
  ck_assert_int_eq(rt_npy_write(path, &q), 0);
  rt_array_free(&q);
  snprintf(cmd, sizeof cmd,
           "FLEXC_LIBCUDA=/nonexistent/libcuda.so.1 %s run %s --q %s --k %s --v %s "
           "--backend cuda --out %s/out",
           tl_flexc(), tl_src_path("samples/causal.score"), path, path, path, dir);
  int rc = tl_run(cmd, &out);
  ck_assert_msg(rc == 1, "exit %d: %s", rc, out.data);
  ck_assert_msg(strstr(out.data, "no CUDA device"), "output: %s", out.data);
  buf_free(&out);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  tl_run(cmd, &out);
  buf_free(&out);
}
END_TEST

/* ---- with a device (--gpu) ------------------------------------------------ */

/* Forward and backward of one sample in one dtype against the reference:
 * the number of failures, or -1 when the sample is not one this test can
 * run (it says why; buffers are the emulator suites' job). */
static int gpu_sample(const char *path, DLDataType dt, const double tol[2]) {
  flex_kernel *k;
  if (flex_kernel_load(&k, path, NULL)) {
    fprintf(stderr, "%s: not run here (%s)\n", path, flex_last_error());
    return -1;
  }
  for (int i = 0; i < k->mod->nbuffers; i++)
    if (k->mod->buffers[i].used) {
      fprintf(stderr, "%s: not run here (it reads buffer '%s')\n", path, k->mod->buffers[i].id);
      flex_kernel_free(k);
      return -1;
    }
  uint64_t st = tl_seed() ^ (uint64_t)dt.bits;
  enum { B = 2, H = 4, HKV = 2, QL = 136, KL = 200, E = 64 };
  const int64_t sq[] = {B, H, QL, E}, sk[] = {B, HKV, KL, E}, sl[] = {B, H, QL};
  /* q k v out lse dout dq dk dv: the tested dtype (lse float32) and float64
   * twins; inputs random, outputs poisoned. The GPU side runs on device
   * mirrors of the host tensors (tl_cuda_call). */
  TlPair t[9];
  for (int i = 0; i < 9; i++) {
    const int64_t *shape = i == 1 || i == 2 || i == 7 || i == 8 ? sk : i == 4 ? sl : sq;
    tl_pair_init(&t[i], i == 4 ? rt_dtype(kDLFloat, 32) : dt, i == 4 ? 3 : 4, shape,
                 i < 3 || i == 5, &st);
  }
  int fails = 0;
  for (int side = 0; side < 2; side++) {
    const DLTensor *p[9];
    for (int i = 0; i < 9; i++) p[i] = side ? &t[i].tref : &t[i].tx;
    flex_args a = {.backend = FLEX_BACKEND_REFERENCE, .q = p[0], .k = p[1], .v = p[2], .out = p[3],
                   .lse = p[4], .dout = p[5], .dq = p[6], .dk = p[7], .dv = p[8]};
    flex_status s1 = side ? flex_forward(k, &a) : tl_cuda_call(k, &a, false);
    flex_status s2 = s1 ? s1 : side ? flex_backward(k, &a) : tl_cuda_call(k, &a, true);
    if (s2) {
      fprintf(stderr, "%s: %s\n", path, flex_last_error());
      fails++;
      break;
    }
  }
  const char *names[] = {"out", "lse", "dq", "dk", "dv"};
  const int which[] = {3, 4, 6, 7, 8};
  for (int i = 0; !fails && i < 5; i++) {
    double e = tl_rel_err(&t[which[i]].x, &t[which[i]].ref);
    double lim = i < 2 ? tol[0] : tol[1];
    fprintf(stderr, "%s %d-bit %s: rel. error %.2e%s\n", path, dt.bits, names[i], e,
            e <= lim ? "" : " FAIL");
    fails += !(e <= lim);
  }
  for (int i = 0; i < 9; i++) tl_pair_free(&t[i]);
  flex_kernel_free(k);
  return fails;
}

static int run_gpu(void) {
  if (rt_drv_init() != FLEX_OK) {
    printf("skipped: %s\n", flex_last_error());
    return 77;
  }
  if (rt_drv_use_device(0) != FLEX_OK) {
    fprintf(stderr, "%s\n", flex_last_error());
    return 1;
  }
  DIR *d = opendir(tl_src_path("samples"));
  if (!d) return 1;
  struct dirent *e;
  int fails = 0, compared = 0;
  const double t16[2] = {5e-3, 2e-2}, tbf[2] = {3e-2, 6e-2}, t32[2] = {1e-4, 1e-3};
  const DLDataType dts[3] = {rt_dtype(kDLFloat, 32), rt_dtype(kDLFloat, 16), rt_dtype(kDLBfloat, 16)};
  const double *tols[3] = {t32, t16, tbf};
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 7 || strcmp(e->d_name + n - 6, ".score") != 0) continue;
    char rel[512];
    snprintf(rel, sizeof rel, "samples/%s", e->d_name);
    const char *path = tl_src_path(rel);
    /* On CUDA the outputs have q's dtype (as in PyTorch's SDPA). */
    for (int i = 0; i < 3; i++) {
      int f = gpu_sample(path, dts[i], tols[i]);
      if (f < 0) break;
      fails += f;
      compared++;
    }
  }
  closedir(d);
  fprintf(stderr, "%d sample x dtype runs compared, %d failed\n", compared, fails);
  return fails || compared == 0 ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--gpu") == 0) return run_gpu();
  return TL_MAIN("driver", 0, TL_TEST(missing_driver_library), TL_TEST(stub_driver_library),
                 TL_TEST(not_a_driver_library), TL_TEST(system_driver_answers_cleanly),
                 TL_TEST(forward_and_backward_without_device), TL_TEST(cli_run_without_device));
}
