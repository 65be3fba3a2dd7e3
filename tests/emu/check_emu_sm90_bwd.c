/* The sm_90a backward (kernels/flex_bwd_sm90.cuh: K/V once and Q/dO
 * through an mbarrier ring by TMA, wgmma SS for S^T, dP^T and dQ, wgmma RS
 * for dV and dK) on the emulator against the float64 reference, through
 * the public API with flex_args.arch "sm_90a".
 *
 * Samples with a score function (softcap, alibi, relpos_bias with its
 * `grad` buffer), implicit masks (causal, sliding_window, dilated with
 * fully masked rows) and a mask the
 * runtime builds BlockMask lists for (document); fp16 and bf16; head dims
 * 64 and 128 and padded ones (72 / 40); Q_LEN and KV_LEN that miss the
 * 64-row tiles; GQA and MQA; with and without dLSE. Head dims above 128
 * (case `wide`: two consumer warpgroups splitting the dK, dV and dQ
 * columns): E = EV = 256 and 200, E = 256 with EV = 64, E = 160 with EV =
 * 136, over causal, softcap, alibi, relpos_bias, document, dilated and
 * chunked_gelu, a caller's BlockMask and a packed batch at E = 256. Each case runs the
 * forward and the backward on both backends (the emulator's backward reads
 * its own forward's O and LSE), with fresh random inputs (seed printed) and
 * NaN-poisoned outputs; dQ, dK, dV and buffer gradients are compared by
 * relative norm error (fp16 2e-2, bf16 6e-2), NaN never passes, and a
 * fully masked row's dQ must be exactly 0. Each case asserts that flex_bwd
 * was the sm_90a body (rt_run_last_stats().bwd_sm90); the fallback cases
 * (E = 15, deterministic also at E = 256) assert the sm_80 body ran and
 * still matches; a packed (cu_seqlens) batch
 * runs the sm_90a body per sequence, and so does a call with a caller's
 * BlockMask whose blocks its tiles divide.
 *
 * The default run gives every sample both dtypes once with the shapes
 * rotated; --full (CTest check_emu_sm90_bwd_full, label slow) runs the
 * cross product.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"
#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;

typedef struct Shape {
  TlShape s; /* sizes */
  bool dlse; /* the backward gets a dLSE */
} Shape;

static const Shape shapes[] = {
    {{2, 4, 2, 77, 131, 64, 64}, true},     /* GQA, two query tiles, three key tiles with tails */
    {{1, 2, 1, 70, 67, 128, 128}, false},   /* MQA, Q_LEN > KV_LEN, both past one tile */
    {{1, 2, 2, 45, 100, 72, 40}, true},     /* padded head dims (72 -> 128, 40 -> 64), EV != E */
};
#define NSHAPES ((int)(sizeof shapes / sizeof *shapes))

/* Head dims above 128: two consumer warpgroups, each with half of the dK,
 * dV and dQ columns (E and EV padded to 128 per consumer pair). */
static const Shape wide_shapes[] = {
    {{1, 2, 1, 100, 130, 256, 256}, true},  /* GQA, odd lengths, dLSE */
    {{1, 2, 2, 90, 70, 200, 200}, false},   /* 200 pads to 256, Q_LEN > KV_LEN */
    {{1, 2, 1, 70, 100, 256, 64}, true},    /* EV != E: dV's halves 64 columns (EV padded to 128) */
    {{1, 1, 1, 66, 80, 160, 136}, false},   /* both padded: 160 and 136 to 256 */
};
#define NWIDE ((int)(sizeof wide_shapes / sizeof *wide_shapes))
static const char *const wide_samples[] = {"causal",      "softcap",  "alibi",  "relpos_bias",
                                           "document",    "dilated",  "chunked_gelu"};
#define NWSAMPLES ((int)(sizeof wide_samples / sizeof *wide_samples))

static const char *const samples[] = {"causal",         "softcap", "alibi",      "document",
                                      "sliding_window", "dilated", "relpos_bias"};
#define NSAMPLES ((int)(sizeof samples / sizeof *samples))

/* Forward and backward of c on the emulator (sm_90a) and the reference,
 * checked; returns whether flex_bwd was the sm_90a body. */
static bool run_checked(TlCall *c, const char *label) {
  tl_call_forward(c);
  tl_call_backward(c);
  bool sm90 = rt_run_last_stats().bwd_sm90;
  fprintf(stderr, "  %s: %s body\n", label, sm90 ? "sm_90a" : "sm_80");
  tl_call_check(c, TL_FWD | TL_BWD, label);
  tl_call_free(c);
  return sm90;
}

static TlCase sm90_case(const char *sample, int di, TlShape s) {
  return (TlCase){.sample = sample, .s = s, .dt = &tl_dtypes[di], .backend = FLEX_BACKEND_EMU,
                  .arch = "sm_90a"};
}

/* One forward + backward on the emulator (sm_90a, `deterministic` as
 * given) and on the reference; returns whether flex_bwd was the sm_90a body. */
static bool run_shape(const char *sample, int di, const Shape *s, bool deterministic) {
  TlCase tc = sm90_case(sample, di, s->s);
  tc.dlse = s->dlse, tc.deterministic = deterministic;
  TlCall c;
  tl_call_init(&c, &tc, &rng);
  tl_call_sample_extras(&c);
  return run_checked(&c, sample);
}

/* Default: every sample x {fp16, bf16}, shapes rotated so that each dtype
 * meets every shape. */
START_TEST(sample_default) {
  int si = _i / 2, di = 1 + _i % 2, shi = (si + _i % 2) % 2;
  ck_assert_msg(run_shape(samples[si], di, &shapes[shi], false), "%s: the sm_80 body ran", samples[si]);
}
END_TEST

START_TEST(sample_full) {
  int si = _i / (2 * NSHAPES), di = 1 + _i / NSHAPES % 2;
  ck_assert_msg(run_shape(samples[si], di, &shapes[_i % NSHAPES], false), "%s: the sm_80 body ran",
                samples[si]);
}
END_TEST

/* Head dims above 128, default: each sample once, the dtypes alternating
 * and the shapes rotated (fp16 and bf16 each meet several shapes). */
START_TEST(wide_default) {
  ck_assert_msg(run_shape(wide_samples[_i], 1 + _i % 2, &wide_shapes[_i % NWIDE], false),
                "%s: the sm_80 body ran", wide_samples[_i]);
}
END_TEST

START_TEST(wide_full) {
  int si = _i / (2 * NWIDE), di = 1 + _i / NWIDE % 2;
  ck_assert_msg(run_shape(wide_samples[si], di, &wide_shapes[_i % NWIDE], false),
                "%s: the sm_80 body ran", wide_samples[si]);
}
END_TEST

/* Padded head dims (72 -> 128, 40 -> 64): TMA zero-fills the panels. */
START_TEST(padded_dims) {
  ck_assert_msg(run_shape("relpos_bias", 2, &shapes[2], false), "the sm_80 body ran");
}
END_TEST

/* What the sm_90a body does not do runs the sm_80 backward, correctly:
 * E = 15 (rows TMA cannot load), a deterministic backward (also at E = 256). */
START_TEST(fallbacks) {
  const Shape unaligned = {{1, 2, 1, 37, 70, 15, 16}, true}, wide = {{1, 2, 1, 20, 40, 256, 64}, false};
  ck_assert_msg(!run_shape("causal", 1, &unaligned, false), "E = 15 ran the sm_90a body");
  ck_assert_msg(!run_shape("relpos_bias", 1, &shapes[0], true), "deterministic ran the sm_90a body");
  ck_assert_msg(!run_shape("softcap", 2, &wide, true), "deterministic E = 256 ran the sm_90a body");
}
END_TEST

/* A packed batch (cu_seqlens): one sub-call per sequence over strided
 * views starting mid-tensor, so the backward's four tensor maps are built
 * per sequence with offset bases; sequences of 70, 0, 1 and 150 query
 * rows against 90, 5, 0 and 150 keys (a sequence without queries leaves
 * its dK and dV 0; one without keys launches no flex_bwd). */
static void packed_case(int E) {
  static const int lq[4] = {70, 0, 1, 150}, lk[4] = {90, 5, 0, 150};
  TlCase tc = sm90_case("causal", 1, (TlShape){4, 4, 2, 0, 0, E, E});
  tc.lens_q = lq, tc.lens_kv = lk;
  TlCall c;
  tl_call_init(&c, &tc, &rng);
  ck_assert_msg(run_checked(&c, "packed causal"), "the packed call did not run the sm_90a backward");
}

START_TEST(packed_batch) { packed_case(64); }
END_TEST

/* The same at E = 128: two consumers splitting 128 keys, whose dQ warp must
 * end on the consumers' marker also in a CTA that visits no tile. */
START_TEST(packed_batch_ks) { packed_case(128); }
END_TEST

/* The same at E = 256: the two-consumer backward per sequence. */
START_TEST(packed_batch_wide) { packed_case(256); }
END_TEST

/* A caller's BlockMask (the walk's lists, partial blocks tested per
 * element) with 128 x blk blocks at head dim E, dtype di; want: whether
 * the sm_90a backward must run. */
static void block_mask_case(int E, int di, int blk, bool want) {
  TlCall c;
  TlCase tc = sm90_case("sliding_window", di, (TlShape){1, 2, 2, 200, 300, E, E});
  tl_call_init(&c, &tc, &rng);
  tl_call_param(&c, "window", 40);
  tl_call_block_mask(&c, NULL, 128, blk);
  char label[64];
  snprintf(label, sizeof label, "BlockMask 128x%d", blk);
  bool sm90 = run_checked(&c, label);
  ck_assert_msg(sm90 == want, "%d-blocks E%d: the %s backward ran", blk, E, sm90 ? "sm_90a" : "sm_80");
}

/* 128 x 128 blocks run the sm_90a backward (its 64 x 64 tiles divide
 * them); 128 x 64 blocks, which the sm_90a forward's 128-key tiles do not
 * divide, run the sm_80 kernels. */
START_TEST(user_block_mask) {
  block_mask_case(64, 1, 128, true);
  block_mask_case(64, 1, 64, false);
}
END_TEST

/* At E = 256 the sm_90a forward takes 64-key tiles, so 128 x 64 blocks run
 * both sm_90a bodies: the two-consumer backward on the walk's lists. */
START_TEST(user_block_mask_wide) { block_mask_case(256, 2, 64, true); }
END_TEST

/* The steady body's flags (kernels/flex_bwd_sm90.cuh): an identity score
 * without a mask at Q_LEN = KV_LEN = 128, bf16, where every tile is full
 * and inside both sequences, at E = 64 (one consumer of 64 keys) and 128
 * (two consumers splitting 128 keys). Query row 5 puts all its weight on
 * key 0 (its other scores lie hundreds below, so their P underflows to 0
 * in fp32), and its dO and key 70's V are 2^66 in every column, so dP of
 * (5, 70) passes fp32 (2^138 and more) where P is 0. dS must be 0 there
 * (docs/language.md), which the steady body, with no test on P, would make
 * NaN (0 x inf) in dQ of row 5 and dK of key 70; the producer's bound (sum
 * |dO| max |V| |scale| past 2^120) sends that tile to the general body,
 * while the other query tile (ordinary dO) takes the steady one. The
 * reference's P there is exp(-500) or less, not 0, and its dS negligible:
 * the gradients agree within the tolerance and none is NaN. */
START_TEST(steady_flags) {
  static const char src[] = "score identity(s, b, h, q, kv) {\n    return s;\n}\n";
  for (int E = 64; E <= 128; E *= 2) {
    TlCase tc = {.name = "identity.score", .src = src, .s = {1, 1, 1, 128, 128, E, E},
                 .dt = &tl_dtypes[2], .backend = FLEX_BACKEND_EMU, .arch = "sm_90a"};
    TlCall c;
    tl_call_init(&c, &tc, &rng);
    const int row = 5, key = 70;
    for (int e = 0; e < E; e++) {
      rt_array_set(&c.k.a, 0 * E + e, 8.0); /* key 0 takes row 5's weight */
      rt_array_set(&c.q.a, row * E + e, 8.0);
      rt_array_set(&c.v.a, key * E + e, 0x1p66);
      rt_array_set(&c.dout.a, row * E + e, 0x1p66);
    }
    char label[64];
    snprintf(label, sizeof label, "identity E%d, dP past fp32 where P underflows", E);
    ck_assert_msg(run_checked(&c, label), "the sm_80 body ran");
  }
}
END_TEST

int main(int argc, char **argv) {
  rng = tl_seed();
  bool full = false;
  for (int i = 1; i < argc; i++) full |= !strcmp(argv[i], "--full");
  if (full) /* head dims above 128 in their own test case */
    return TL_MAIN("emu_sm90_bwd", 0, TL_CASE("backward", 600), TL_LOOP(sample_full, NSAMPLES * 2 * NSHAPES),
                 TL_CASE("wide", 1200), TL_LOOP(wide_full, NWSAMPLES * 2 * NWIDE));
  return TL_MAIN("emu_sm90_bwd", 0, TL_CASE("backward", 600), TL_LOOP(sample_default, NSAMPLES * 2),
                 TL_TEST(padded_dims), TL_TEST(fallbacks), TL_TEST(packed_batch), TL_TEST(packed_batch_ks),
                 TL_TEST(user_block_mask),
                 TL_TEST(steady_flags),
                 TL_CASE("wide", 1200), TL_LOOP(wide_default, NWSAMPLES), TL_TEST(user_block_mask_wide),
                 TL_TEST(packed_batch_wide));
}
