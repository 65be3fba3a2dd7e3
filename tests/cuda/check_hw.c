/* Hardware-rules suite: what a GPU enforces and no numerical test on the
 * emulator would notice by itself.
 *
 *   geometry   the launch limits (gridDim.y/.z <= 65535) checked before a
 *              launch, by the runtime and by the emulator
 *   emulator   warp collectives under a per-lane branch, .aligned ops at
 *              different call sites, cp.async operands not 16-byte aligned
 *   driver     the CUDA backend against tests/cuda/mockcuda.c (a stand-in
 *              libcuda compiled here): every copy, fill, launch and sync on
 *              the caller's stream, the shared-memory opt-in before big
 *              launches, a context current on every calling thread, empty
 *              grids not launched, the legacy-stream entry points. */
#include <check.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/driver.h"
#include "emu/emu_host.h"
#include "runtime/flex.h"
#include "runtime/launch.h"
#include "cuda/nvrtc.h"
#include "testlib.h"

static const char *mock_path; /* the compiled stand-in driver; NULL if it could not be built */
static EmuModule *mod;      /* the emulator kernels below */

/* ---- geometry ------------------------------------------------------------- */

START_TEST(geometry_limits) {
  const unsigned block[3] = {128, 1, 1};
  const unsigned ok[3] = {RT_GRID_X_MAX, RT_GRID_YZ_MAX, RT_GRID_YZ_MAX};
  ck_assert_int_eq(rt_launch_check_geometry("cuda", "flex_fwd", ok, block), FLEX_OK);
  const unsigned heads[3] = {4, 65536, 1}, batches[3] = {4, 16, 70000};
  ck_assert_int_eq(rt_launch_check_geometry("cuda", "flex_fwd", heads, block), FLEX_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(flex_last_error(), "65536 heads"), "%s", flex_last_error());
  ck_assert_int_eq(rt_launch_check_geometry("cuda", "flex_bwd", batches, block),
                   FLEX_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(flex_last_error(), "70000 batches") && strstr(flex_last_error(), "65535"),
                "%s", flex_last_error());
  const unsigned big[3] = {1025, 1, 1};
  ck_assert_int_eq(rt_launch_check_geometry("cuda", "flex_fwd", ok, big), FLEX_ERR_UNSUPPORTED);
}
END_TEST

/* ---- emulator: rules a GPU has ---------------------------------------------- */

static const char *kernels =
    "#include \"emu_arch.h\"\n"
    "extern __shared__ __align__(16) unsigned char flex_smem[];\n"
    "typedef struct HwParams { const void *in; void *out; int mode; } HwParams;\n"
    /* mode 0: every lane issues both mma; 1: only lanes < 16 issue the first. */
    "extern \"C\" __global__ void hw_mma_branch(const HwParams p) {\n"
    "  const int lane = threadIdx.x % 32;\n"
    "  uint32_t a[4] = {0x3c003c00u, 0, 0, 0}, b[2] = {0x3c003c00u, 0};\n"
    "  float d[4] = {0, 0, 0, 0};\n"
    "  if (p.mode == 0 || lane < 16) flex_mma_f16(d, a, b, d);\n"
    "  flex_mma_f16(d, a, b, d);\n"
    "  flex_gstore((float *)p.out + threadIdx.x, d[0]);\n"
    "}\n"
    "FLEX_EMU_ENTRY(hw_mma_branch, HwParams)\n"
    /* mode 1: every lane issues one mma, odd and even lanes at two call sites. */
    "extern \"C\" __global__ void hw_mma_sites(const HwParams p) {\n"
    "  const int lane = threadIdx.x % 32;\n"
    "  uint32_t a[4] = {0x3c003c00u, 0, 0, 0}, b[2] = {0x3c003c00u, 0};\n"
    "  float d[4] = {0, 0, 0, 0}, e[4] = {0, 0, 0, 0};\n"
    "  if (p.mode == 0 || (lane & 1)) flex_mma_f16(d, a, b, d);\n"
    "  else flex_mma_f16(e, a, b, e);\n"
    "  flex_gstore((float *)p.out + threadIdx.x, d[0] + e[0]);\n"
    "}\n"
    "FLEX_EMU_ENTRY(hw_mma_sites, HwParams)\n"
    /* mode 0: one ldmatrix for all; 1: odd and even lanes at two call sites
     * of the same variant (each lane passes the same address either way). */
    "extern \"C\" __global__ void hw_ldm_sites(const HwParams p) {\n"
    "  const int lane = threadIdx.x % 32;\n"
    "  uint16_t *s = (uint16_t *)flex_smem;\n"
    "  for (int i = threadIdx.x; i < 64; i += blockDim.x) s[i] = (uint16_t)i;\n"
    "  __syncthreads();\n"
    "  uint32_t r[1] = {0}, q[1] = {0};\n"
    "  if (p.mode == 0) flex_ldmatrix_x1(r, s + (lane & 7) * 8);\n"
    "  else if (lane & 1) flex_ldmatrix_x1(r, s + (lane & 7) * 8);\n"
    "  else flex_ldmatrix_x1(q, s + (lane % 8) * 8);\n"
    "  flex_gstore((uint32_t *)p.out + threadIdx.x, r[0] + q[0]);\n"
    "}\n"
    "FLEX_EMU_ENTRY(hw_ldm_sites, HwParams)\n"
    /* A zero-filling cp.async (src-size 0) whose source is misaligned by mode bytes. */
    "extern \"C\" __global__ void hw_cp_zero(const HwParams p) {\n"
    "  const char *src = (const char *)p.in + p.mode;\n"
    "  flex_cp_async_16(flex_smem + threadIdx.x * 16, src, false);\n"
    "  flex_cp_async_commit();\n"
    "  flex_cp_async_wait<0>();\n"
    "  flex_gstore((unsigned char *)p.out + threadIdx.x, flex_smem[threadIdx.x * 16]);\n"
    "}\n"
    "FLEX_EMU_ENTRY(hw_cp_zero, HwParams)\n";

typedef struct HwParams {
  const void *in;
  void *out;
  int mode;
} HwParams;

/* Launch one of the kernels above; msg gets the error. */
static flex_status emu_run(const char *kernel, int mode, EmuDim grid, char *msg) {
  static float out[128] __attribute__((aligned(16)));
  static unsigned char in[64] __attribute__((aligned(16)));
  HwParams p = {in, out, mode};
  EmuRange r[2] = {{(uintptr_t)in, sizeof in, "in"}, {(uintptr_t)out, sizeof out, "out"}};
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = kernel;
  L.params = &p;
  L.grid = grid;
  L.block = (EmuDim){32, 1, 1};
  L.smem_bytes = 1024;
  L.ranges = r;
  L.nranges = 2;
  flex_status st = emu_module_launch(mod, &L, NULL);
  snprintf(msg, EMU_ERR_LEN, "%s", L.error);
  return st;
}

static const EmuDim one = {1, 1, 1};

static void run_ok(const char *kernel, int mode, EmuDim grid) {
  char msg[EMU_ERR_LEN];
  ck_assert_msg(emu_run(kernel, mode, grid, msg) == FLEX_OK, "%s mode %d: %s", kernel, mode, msg);
}

/* The launch stops with FLEX_ERR_RUNTIME and a message that says why. */
static void run_fails(const char *kernel, int mode, EmuDim grid, const char *why) {
  char msg[EMU_ERR_LEN];
  ck_assert_int_eq(emu_run(kernel, mode, grid, msg), FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(msg, why), "%s mode %d: got '%s', want '%s'", kernel, mode, msg, why);
}

START_TEST(emu_collective_under_branch) {
  run_ok("hw_mma_branch", 0, one);
  run_fails("hw_mma_branch", 1, one, "warp divergence");
}
END_TEST

START_TEST(emu_aligned_call_sites) {
  run_ok("hw_ldm_sites", 0, one);
  run_fails("hw_ldm_sites", 1, one, "different call site");
  run_ok("hw_mma_sites", 0, one);
  run_fails("hw_mma_sites", 1, one, "different call site");
}
END_TEST

START_TEST(emu_cp_async_zero_fill_aligned) {
  run_ok("hw_cp_zero", 0, one);
  run_fails("hw_cp_zero", 8, one, "not 16-byte aligned");
}
END_TEST

START_TEST(emu_grid_limits) {
  run_ok("hw_cp_zero", 0, (EmuDim){2, 3, 4});
  run_fails("hw_cp_zero", 0, (EmuDim){1, 65536, 1}, "bad launch geometry");
  run_fails("hw_cp_zero", 0, (EmuDim){1, 1, 65536}, "bad launch geometry");
}
END_TEST

/* ---- the CUDA backend against the stand-in driver ------------------------------ */

#define MOCK_STREAM ((void *)(uintptr_t)0x5150)

/* A symbol of the loaded stand-in. */
static void *mock_sym(const char *name) {
  void *h = dlopen(mock_path, RTLD_NOW | RTLD_NOLOAD);
  ck_assert_msg(h != NULL, "the stand-in driver is not loaded");
  void *p = dlsym(h, name);
  ck_assert_ptr_nonnull(p);
  dlclose(h);
  return p;
}
#define MOCK_INT(name) (*(int *)mock_sym(name))

/* One call's tensors in host memory that claims to be CUDA device 0. */
typedef struct Call {
  TlArr q, k, v, out, lse, dout, dq, dk, dv; /* the tensors */
  TlArr num, idx;                            /* a caller's BlockMask, kv side */
  flex_block_mask bm;                        /* it */
  flex_args a;                               /* the call */
} Call;

static void on_cuda(TlArr *x) { x->t.device = (DLDevice){kDLCUDA, 0}; }

/* fp16 call of B x H heads, L query rows and LK key rows, head dim E; with
 * a BlockMask of 128 x 128 blocks when mask. */
static void call_init2(Call *c, int64_t B, int64_t H, int64_t L, int64_t LK, int64_t E, bool mask) {
  memset(c, 0, sizeof *c);
  const DLDataType f16 = {kDLFloat, 16, 1}, f32 = {kDLFloat, 32, 1}, i32 = {kDLInt, 32, 1};
  int64_t s4[] = {B, H, L, E}, sk[] = {B, H, LK, E}, s3[] = {B, H, L};
  TlArr *t4[] = {&c->q, &c->out, &c->dout, &c->dq}, *tk[] = {&c->k, &c->v, &c->dk, &c->dv};
  for (int i = 0; i < 4; i++) tl_arr_init(t4[i], f16, 4, s4), on_cuda(t4[i]);
  for (int i = 0; i < 4; i++) tl_arr_init(tk[i], f16, 4, sk), on_cuda(tk[i]);
  tl_arr_init(&c->lse, f32, 3, s3), on_cuda(&c->lse);
  c->a.backend = FLEX_BACKEND_CUDA;
  c->a.q = &c->q.t, c->a.k = &c->k.t, c->a.v = &c->v.t, c->a.out = &c->out.t;
  c->a.lse = &c->lse.t, c->a.dout = &c->dout.t, c->a.dq = &c->dq.t, c->a.dk = &c->dk.t;
  c->a.dv = &c->dv.t;
  c->a.stream = MOCK_STREAM;
  if (!mask) return;
  int64_t nb = (L + 127) / 128, sn[] = {1, 1, nb}, si[] = {1, 1, nb, nb};
  tl_arr_init(&c->num, i32, 3, sn), tl_arr_init(&c->idx, i32, 4, si);
  on_cuda(&c->num), on_cuda(&c->idx);
  int32_t *num = (int32_t *)c->num.t.data, *idx = (int32_t *)c->idx.t.data;
  for (int64_t r = 0; r < nb; r++) { /* causal blocks: row r sees 0..r */
    num[r] = (int32_t)(r + 1);
    for (int64_t j = 0; j <= r; j++) idx[r * nb + j] = (int32_t)j;
  }
  c->bm.block_q = c->bm.block_kv = 128;
  c->bm.kv_num_blocks = &c->num.t, c->bm.kv_indices = &c->idx.t;
  c->a.block_mask = &c->bm;
}

static void call_init(Call *c, int64_t B, int64_t H, int64_t L, int64_t E, bool mask) {
  call_init2(c, B, H, L, L, E, mask);
}

static void call_free(Call *c) {
  TlArr *t[] = {&c->q, &c->k, &c->v, &c->out, &c->lse, &c->dout, &c->dq, &c->dk, &c->dv,
                &c->num, &c->idx};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) tl_arr_free(t[i]);
}

static flex_kernel *load(const char *sample) {
  flex_kernel *k = tl_load(sample, NULL, NULL);
  return k;
}

static void use_mock(void) {
  if (!mock_path) ck_abort_msg("the stand-in driver could not be compiled (see stderr)");
  setenv("FLEXC_LIBCUDA", mock_path, 1);
  ck_assert_int_eq(rt_drv_init(), FLEX_OK);
  *(void **)mock_sym("mock_stream") = MOCK_STREAM;
}

/* Everything asynchronous went to the caller's stream, no rule broken. */
static void expect_clean(void) {
  const char *err = (const char *)mock_sym("mock_error");
  ck_assert_msg(!err[0], "driver rule broken: %s", err);
  ck_assert_int_gt(MOCK_INT("mock_ops"), 0);
  ck_assert_msg(MOCK_INT("mock_foreign") == 0, "%d of %d stream operations not on the caller's stream",
                MOCK_INT("mock_foreign"), MOCK_INT("mock_ops"));
  ck_assert_int_eq(MOCK_INT("mock_bad_flags"), 0);
}

/* A caller's BlockMask (read back, validated, uploaded) and a backward with
 * more than 48 KB of dynamic shared memory (E = 128): all on the caller's stream. */
START_TEST(driver_streams_and_smem) {
  use_mock();
  flex_kernel *k = load("samples/causal.score");
  Call c;
  call_init(&c, 1, 2, 512, 128, true);
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  expect_clean();
  /* split-KV: the grid's 8 CTAs are fewer than the stand-in's 108 SMs, so
   * flex_fwd runs 2 key chunks (its 4 key tiles of 128, two a chunk) and
   * flex_fwd_combine merges them, its workspace allocated and zeroed on
   * the caller's stream too */
  int fwd = MOCK_INT("mock_launches");
  ck_assert_int_eq(fwd, 2);
  ck_assert_msg(flex_backward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  expect_clean();
  ck_assert_int_eq(MOCK_INT("mock_launches") - fwd, 3);
  ck_assert_int_ge(MOCK_INT("mock_big_smem_launches"), 1);
  /* the workspace (lists, split-KV partials, dQ accumulator) was allocated
   * and freed in the stream's order: cuMemFree would wait for the device */
  ck_assert_int_eq(MOCK_INT("mock_sync_frees"), 0);
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

/* A backward with workspace (the dQ accumulator) and nothing to read
 * back returns without waiting for its stream: its memory goes back in
 * the stream's order. */
START_TEST(driver_backward_asynchronous) {
  use_mock();
  flex_kernel *k = load("samples/causal.score");
  Call c;
  call_init(&c, 1, 2, 256, 64, false);
  ck_assert_msg(flex_backward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  expect_clean();
  ck_assert_int_eq(MOCK_INT("mock_syncs"), 0);
  ck_assert_int_eq(MOCK_INT("mock_sync_frees"), 0);
  ck_assert_int_eq(MOCK_INT("mock_launches"), 3);
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

/* A device without the stream-ordered allocator: cuMemAlloc and cuMemFree. */
START_TEST(driver_without_memory_pools) {
  setenv("MOCKCUDA_NO_POOLS", "1", 1);
  use_mock();
  flex_kernel *k = load("samples/causal.score");
  Call c;
  call_init(&c, 1, 2, 512, 128, true);
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(flex_backward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  expect_clean();
  ck_assert_int_gt(MOCK_INT("mock_sync_frees"), 0);
  /* ... after waiting for the launches that read the memory */
  int syncs = MOCK_INT("mock_syncs");
  call_free(&c);
  call_init(&c, 1, 2, 256, 64, false);
  ck_assert_msg(flex_backward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  ck_assert_int_eq(MOCK_INT("mock_syncs") - syncs, 1);
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

/* A call from a thread that never used the device gets a current context. */
static void *thread_call(void *arg) {
  Call *c = arg;
  flex_kernel *k = load("samples/causal.score");
  flex_status st = flex_forward(k, &c->a);
  flex_kernel_free(k);
  return (void *)(intptr_t)st;
}

START_TEST(driver_context_per_thread) {
  use_mock();
  Call c;
  call_init(&c, 1, 1, 64, 16, false);
  flex_kernel *k = load("samples/causal.score");
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  pthread_t t;
  void *ret;
  ck_assert_int_eq(pthread_create(&t, NULL, thread_call, &c), 0);
  pthread_join(t, &ret);
  ck_assert_msg((intptr_t)ret == FLEX_OK, "second thread: %s", (const char *)mock_sym("mock_error"));
  expect_clean();
  ck_assert_int_eq(MOCK_INT("mock_launches"), 2);
  flex_kernel_free(k);
  call_free(&c);
}
END_TEST

/* More batches than gridDim.z allows: a clear error before any launch. */
START_TEST(driver_batches_beyond_grid) {
  use_mock();
  Call c;
  call_init(&c, 65536, 1, 1, 8, false);
  flex_kernel *k = load("samples/causal.score");
  ck_assert_int_eq(flex_forward(k, &c.a), FLEX_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(flex_last_error(), "65536 batches"), "%s", flex_last_error());
  ck_assert_int_eq(MOCK_INT("mock_launches"), 0);
  flex_kernel_free(k);
  call_free(&c);
}
END_TEST

/* A launch the driver refuses: the message names the entry, the call and
 * the driver's error, intact. */
START_TEST(driver_launch_error_message) {
  use_mock();
  MOCK_INT("mock_fail_launches") = 1;
  Call c;
  call_init(&c, 1, 1, 16, 16, false);
  flex_kernel *k = load("samples/causal.score");
  ck_assert_int_eq(flex_forward(k, &c.a), FLEX_ERR_RUNTIME);
  const char *msg = flex_last_error();
  ck_assert_msg(strncmp(msg, "launching flex_fwd: CUDA error at ", 34) == 0 &&
                    strstr(msg, "cuLaunchKernel") &&
                    strstr(msg, "CUDA_ERROR_INVALID_VALUE (1): injected by the test"),
                "message: %s", msg);
  flex_kernel_free(k);
  call_free(&c);
}
END_TEST

/* An empty batch: nothing to launch (the driver rejects a grid with no
 * blocks, and B is gridDim.z). */
START_TEST(driver_empty_batch) {
  use_mock();
  Call c;
  call_init(&c, 0, 1, 16, 16, false);
  flex_kernel *k = load("samples/causal.score");
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  ck_assert_msg(flex_backward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  const char *err = (const char *)mock_sym("mock_error");
  ck_assert_msg(!err[0], "driver rule broken: %s", err);
  ck_assert_int_eq(MOCK_INT("mock_launches"), 0);
  flex_kernel_free(k);
  call_free(&c);
}
END_TEST

/* Compile tests/cuda/mockcuda.c into a shared library in a fresh /tmp folder. */
/* tl_cuda_call (the test suites' way onto the GPU) mirrors host tensors,
 * a grad buffer included, into device tensors the CUDA backend accepts, and
 * keeps every copy on the call's stream. */
START_TEST(driver_mirrored_call) {
  use_mock();
  flex_kernel *k = load("samples/relpos_bias.score");
  const DLDataType f16 = {kDLFloat, 16, 1}, f32 = {kDLFloat, 32, 1};
  int64_t s4[] = {1, 2, 100, 64}, s3[] = {1, 2, 100}, sb[] = {2, 31};
  TlArr t[9], bias, gbias;
  uint64_t rng = tl_seed();
  for (int i = 0; i < 9; i++) {
    tl_arr_init(&t[i], i == 4 ? f32 : f16, i == 4 ? 3 : 4, i == 4 ? s3 : s4);
    tl_arr_normal(&t[i], &rng);
  }
  tl_arr_init(&bias, f32, 2, sb), tl_arr_normal(&bias, &rng);
  tl_arr_init(&gbias, f32, 2, sb), tl_arr_poison(&gbias);
  flex_buffer buf = {"rel_bias", &bias.t, &gbias.t};
  flex_args a;
  memset(&a, 0, sizeof a);
  a.q = &t[0].t, a.k = &t[1].t, a.v = &t[2].t, a.out = &t[3].t, a.lse = &t[4].t;
  a.dout = &t[5].t, a.dq = &t[6].t, a.dk = &t[7].t, a.dv = &t[8].t;
  a.buffers = &buf, a.nbuffers = 1;
  a.stream = MOCK_STREAM;
  ck_assert_msg(tl_cuda_call(k, &a, false) == FLEX_OK, "%s", flex_last_error());
  expect_clean();
  ck_assert_msg(tl_cuda_call(k, &a, true) == FLEX_OK, "%s", flex_last_error());
  expect_clean();
  /* forward; backward: the forward again for an fp32 O (a grad buffer with
   * an fp16 O, runtime/run.c exact_out), pre, main, dq convert */
  ck_assert_int_eq(MOCK_INT("mock_launches"), 5);
  for (int i = 0; i < 9; i++) tl_arr_free(&t[i]);
  tl_arr_free(&bias), tl_arr_free(&gbias);
  flex_kernel_free(k);
}
END_TEST

/* A `sorted` buffer on the device: one flex_sorted_check launch before
 * the forward, and only its 8-byte record comes back (the buffer itself,
 * 4 * 256 bytes, is never downloaded). The stand-in runs no kernel, so
 * the record stays 0 (sorted); the emulator tests the verdicts
 * (tests/runtime/check_sorted.c, device_path_*). */
START_TEST(driver_sorted_on_device) {
  use_mock();
  flex_kernel *k = load("samples/document.score");
  Call c;
  call_init(&c, 1, 2, 256, 64, false);
  TlArr doc;
  int64_t n = 256;
  tl_arr_init(&doc, (DLDataType){kDLInt, 32, 1}, 1, &n), on_cuda(&doc);
  for (int64_t i = 0; i < n; i++) ((int32_t *)doc.t.data)[i] = (int32_t)(i / 100);
  flex_buffer fb = {"doc", &doc.t, NULL};
  c.a.buffers = &fb, c.a.nbuffers = 1;
  c.a.kv_splits = 1; /* never split: one flex_fwd launch */
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  expect_clean();
  ck_assert_int_eq(MOCK_INT("mock_launches"), 2); /* flex_sorted_check, flex_fwd */
  ck_assert_int_eq(*(long long *)mock_sym("mock_dtoh_bytes"), 8);
  c.a.trust_sorted = true; /* waived: no check, nothing downloaded */
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  ck_assert_int_eq(MOCK_INT("mock_launches"), 3);
  ck_assert_int_eq(*(long long *)mock_sym("mock_dtoh_bytes"), 8);
  tl_arr_free(&doc);
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

int main(void) {
  mock_path = tl_mock_driver();
  Buf log = {0};
  EmuBuildOpts o = {.racecheck = false};
  if (emu_module_get(&mod, kernels, &o, &log) != FLEX_OK) {
    fprintf(stderr, "emulator module build failed:\n%s\n", log.data ? log.data : "");
    return EXIT_FAILURE;
  }
  buf_free(&log);
  /* The driver tests compile real kernels: they need NVRTC (the rest do not). */
  int n = rt_nvrtc_version() >= 0;
  if (!n) fprintf(stderr, "NVRTC not available (%s): the driver tests are skipped\n", flex_last_error());
  return TL_MAIN("hw", 0, TL_CASE("hw", 120), TL_TEST(geometry_limits), TL_TEST(emu_collective_under_branch),
                 TL_TEST(emu_aligned_call_sites), TL_TEST(emu_cp_async_zero_fill_aligned),
                 TL_TEST(emu_grid_limits), TL_CASE("driver", 120), TL_LOOP(driver_streams_and_smem, n),
                 TL_LOOP(driver_backward_asynchronous, n), TL_LOOP(driver_without_memory_pools, n),                 TL_LOOP(driver_context_per_thread, n), TL_LOOP(driver_batches_beyond_grid, n),
                 TL_LOOP(driver_empty_batch, n), TL_LOOP(driver_launch_error_message, n),
                 TL_LOOP(driver_mirrored_call, n), TL_LOOP(driver_sorted_on_device, n));
}
