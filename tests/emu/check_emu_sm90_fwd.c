/* The sm_90a forward (kernels/flex_fwd_sm90.cuh: TMA through an mbarrier
 * ring, wgmma SS for Q K^T, wgmma RS for P V) on the emulator against the
 * float64 reference, through the public API with flex_args.arch "sm_90a".
 *
 * Samples with a score function (softcap, alibi, relpos_bias), implicit
 * masks (causal, sliding_window, dilated with fully masked rows; natten,
 * whose four divisions give one consumer with the overlap) and a mask
 * the runtime builds BlockMask lists for (document), fp16 and bf16, head
 * dims 64, 128, 256 and padded ones (72 / 40 / 136: TMA zero-fills the
 * panel), Q_LEN
 * and KV_LEN that miss the tiles, GQA and MQA, O in q's dtype or float32.
 * Both backends read the same rounded inputs; outputs are NaN-poisoned
 * first; O and LSE are compared by relative norm error (fp16 5e-3, bf16
 * 3e-2), NaN never passes; fully masked rows must be exactly O = 0,
 * LSE = -inf. Each case also asserts that the sm_90a body ran
 * (rt_run_last_stats().fwd_sm90), and one case that a call TMA cannot load
 * (E = 15: rows not 16-byte aligned) falls back to the sm_80 body and still
 * matches.
 *
 * The default run gives every sample both dtypes once with the shapes
 * rotated; --full (CTest check_emu_sm90_fwd_full, label slow) runs the
 * cross product. --cuda runs the same cases on GPU 0 through the CUDA
 * backend (O in q's dtype; exit 77 without a device); CTest
 * check_emu_sm90_fwd_gpu sets FLEXC_CUDA_SM90_FWD=1, so on a 9.0 device it
 * checks the sm_90a body on the hardware, elsewhere the sm_80 one.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/driver.h"
#include "runtime/backend.h"
#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;
static bool on_cuda;  /* --cuda: the GPU (CUDA backend) instead of the emulator */
static bool want_sm90; /* the sm_90a body must run: always on the emulator; on a GPU, a 9.0
                          device with FLEXC_CUDA_SM90_FWD=1 */

typedef struct Shape {
  TlShape s;       /* sizes */
  bool native_out; /* O in q's dtype instead of float32 */
} Shape;

static const Shape shapes[] = {
    {{2, 4, 2, 77, 300, 64, 64}, false},  /* GQA, two row tiles, three key tiles with a tail (the second steady) */
    {{1, 2, 1, 130, 67, 128, 128}, true}, /* MQA, three row tiles, one partial key tile */
    {{1, 2, 2, 45, 150, 72, 40}, false},  /* padded head dims (72 -> 128, 40 -> 64), EV != E */
    {{1, 2, 1, 33, 150, 256, 136}, true}, /* wide: 64-key tiles, P V at N = 192 */
};
#define NSHAPES ((int)(sizeof shapes / sizeof *shapes))

static const char *const samples[] = {"causal",  "softcap",     "alibi",          "document",
                                      "dilated", "relpos_bias", "sliding_window", "natten"};
#define NSAMPLES ((int)(sizeof samples / sizeof *samples))

/* Case tc (dtype, shape and sample set) on the emulator (sm_90a) or the
 * GPU, with the sample's usual params and buffers when extras. */
static void call_init(TlCall *c, TlCase *tc, bool extras) {
  tc->backend = on_cuda ? FLEX_BACKEND_CUDA : FLEX_BACKEND_EMU;
  tc->arch = "sm_90a";
  tc->native_out |= on_cuda;
  tl_call_init(c, tc, &rng);
  if (extras) tl_call_sample_extras(c);
}

/* Forward of c on both backends, checked; whether the sm_90a body ran. */
static bool forward_checked(TlCall *c, const char *label) {
  tl_call_forward(c);
  bool sm90 = rt_run_last_stats().fwd_sm90;
  fprintf(stderr, "  %s: %s body\n", label, sm90 ? "sm_90a" : "sm_80");
  tl_call_check(c, TL_FWD, label);
  tl_call_free(c);
  return sm90;
}

/* One forward on the emulator (sm_90a) and on the reference; returns
 * whether the sm_90a body ran. */
static bool run_shape(const char *sample, int di, const Shape *s) {
  TlCase tc = {.sample = sample, .s = s->s, .dt = &tl_dtypes[di], .native_out = s->native_out};
  TlCall c;
  call_init(&c, &tc, true);
  return forward_checked(&c, sample);
}

/* Default: every sample x {fp16, bf16}, shapes rotated so that each dtype
 * meets every shape and each sample two of them (softcap and relpos_bias,
 * score functions without a mask, meet shape 0's steady key tile). */
START_TEST(sample_default) {
  int si = _i / 2, di = 1 + _i % 2, shi = (si + 2 * (_i % 2) + 1) % NSHAPES;
  ck_assert_msg(run_shape(samples[si], di, &shapes[shi]) == want_sm90, "%s: the wrong body ran",
                samples[si]);
}
END_TEST

START_TEST(sample_full) {
  int si = _i / (2 * NSHAPES), di = 1 + _i / NSHAPES % 2;
  ck_assert_msg(run_shape(samples[si], di, &shapes[_i % NSHAPES]) == want_sm90,
                "%s: the wrong body ran", samples[si]);
}
END_TEST

/* E = 15: rows of 30 bytes cannot be TMA-loaded; the sm_80 body runs, correctly. */
START_TEST(fallback_unaligned) {
  const Shape s = {{1, 2, 1, 37, 70, 15, 16}, false};
  ck_assert_msg(!run_shape("causal", 1, &s), "E = 15 ran the sm_90a body");
}
END_TEST

/* A packed batch (cu_seqlens): one sub-call per sequence over strided views
 * starting mid-tensor, so the tensor maps are built per sequence with
 * offset bases; sequences of 0, 1, 70 and 150 query rows, one of them with no keys. */
START_TEST(packed_batch) {
  static const int lq[4] = {70, 0, 1, 150}, lk[4] = {90, 5, 0, 150};
  TlCase tc = {.sample = "causal", .s = {4, 4, 2, 0, 0, 64, 64}, .dt = &tl_dtypes[1],
               .lens_q = lq, .lens_kv = lk};
  TlCall c;
  call_init(&c, &tc, false);
  ck_assert_msg(forward_checked(&c, "packed causal"), "the packed call did not run the sm_90a body");
}
END_TEST

/* A caller's BlockMask: 128 x 128 blocks (the sm_90a tiles divide them)
 * run the sm_90a body and visit only the listed blocks; 128 x 64 blocks
 * (not multiples of its 128-key tiles) fall back to the sm_80 body. */
START_TEST(user_block_mask) {
  for (int blk = 128; blk >= 64; blk /= 2) {
    TlCase tc = {.sample = "sliding_window", .s = {1, 2, 2, 200, 300, 64, 64}, .dt = &tl_dtypes[1]};
    TlCall c;
    call_init(&c, &tc, false);
    tl_call_param(&c, "window", 40);
    tl_call_block_mask(&c, NULL, 128, blk);
    char label[64];
    snprintf(label, sizeof label, "BlockMask 128x%d", blk);
    bool sm90 = forward_checked(&c, label);
    ck_assert_msg(sm90 == (blk == 128), "%d-blocks: the %s body ran", blk, sm90 ? "sm_90a" : "sm_80");
  }
}
END_TEST

/* An unknown arch is the caller's error, named, on every backend. */
START_TEST(bad_arch) {
  flex_kernel *k = tl_load("samples/causal.score", NULL, NULL);
  int64_t sh[4] = {1, 1, 8, 16};
  TlArr q, o, l;
  tl_arr_init(&q, rt_dtype(kDLFloat, 16), 4, sh), tl_arr_normal(&q, &rng);
  tl_arr_init(&o, rt_dtype(kDLFloat, 32), 4, sh), tl_arr_init(&l, rt_dtype(kDLFloat, 32), 3, sh);
  for (int i = 0; i < 2; i++) {
    flex_args a;
    memset(&a, 0, sizeof a);
    a.backend = i ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
    a.arch = "sm_91x";
    a.q = a.k = a.v = &q.t, a.out = &o.t, a.lse = &l.t;
    ck_assert_int_eq(flex_forward(k, &a), FLEX_ERR_INVALID);
    ck_assert_msg(strstr(flex_last_error(), "arch 'sm_91x'"), "%s", flex_last_error());
  }
  tl_arr_free(&q), tl_arr_free(&o), tl_arr_free(&l);
  flex_kernel_free(k);
}
END_TEST

int main(int argc, char **argv) {
  rng = tl_seed();
  bool full = false;
  for (int i = 1; i < argc; i++) {
    full |= !strcmp(argv[i], "--full");
    on_cuda |= !strcmp(argv[i], "--cuda");
  }
  want_sm90 = true;
  if (on_cuda) {
    int major = 0, minor = 0, rc = tl_cuda_setup(); /* CK_FORK=no: one process uses the device */
    if (rc) return rc;
    if (rt_drv_compute_capability(0, &major, &minor) != FLEX_OK) {
      printf("device 0: %s\n", flex_last_error());
      return 1;
    }
    const char *on = getenv("FLEXC_CUDA_SM90_FWD");
    want_sm90 = major == 9 && minor == 0 && on && !strcmp(on, "1") && rt_drv_has_tensor_maps();
    fprintf(stderr, "cuda device 0: compute capability %d.%d, sm_90a forward %s\n", major, minor,
            want_sm90 ? "expected" : "not expected");
  }
  if (full) return TL_MAIN("emu_sm90_fwd", 600, TL_LOOP(sample_full, NSAMPLES * 2 * NSHAPES));
  if (on_cuda) /* the emulator alone: the arch field and packed batches on host tensors */
    return TL_MAIN("emu_sm90_fwd", 600, TL_LOOP(sample_default, NSAMPLES * 2), TL_TEST(fallback_unaligned));
  return TL_MAIN("emu_sm90_fwd", 600, TL_LOOP(sample_default, NSAMPLES * 2), TL_TEST(fallback_unaligned),
                 TL_TEST(bad_arch), TL_TEST(packed_batch), TL_TEST(user_block_mask));
}
