/* Codegen suite: the generated CUDA for samples contains what it should
 * (names by role, wrapping integer helpers, round-tripping float literals,
 * entries followed by FLEX_EMU_ENTRY) and specialises the identity score. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "runtime/rt.h"
#include "testlib.h"

/* Generated source for a .score text (backward included). */
static char *gen_arch(const char *text, CgDtype dt, int E, CgArch arch, CgOptions *o) {
  flex_kernel *k;
  flex_status st = flex_kernel_from_source(&k, "test.score", text, strlen(text), NULL);
  ck_assert_msg(st == FLEX_OK, "%s", flex_last_error());
  char err[256];
  ck_assert_msg(cg_options_init(o, k->mod, dt, E, E, arch, true, err, sizeof err), "%s", err);
  Buf b = {0};
  cg_emit_cuda(&b, k->mod, o);
  flex_kernel_free(k);
  return b.data;
}

static char *gen(const char *text, CgDtype dt, int E, CgOptions *o) {
  return gen_arch(text, dt, E, CG_SM80, o);
}

static const char *gemma =
    "param float softcap = 50.0;\nparam int window = 4096;\nbuffer slopes: f32[H] grad;\n"
    "score alibi_softcap(s, b, h, q, kv) {\n  let biased = s + slopes[h] * float(kv - q);\n"
    "  return softcap * tanh(biased / softcap);\n}\n"
    "mask causal(b, h, q, kv) { return q >= kv; }\n"
    "mask local(b, h, q, kv) { return q - kv < window; }\n"
    "kernel gemma { score = alibi_softcap; mask = causal && local; }\n";

/* Float literals read back to the very same binary32 value (random bit
 * patterns: subnormals, huge values, 2^24 + 1 neighbours) and are the
 * shortest such decimal. */
START_TEST(float_literals_round_trip) {
  uint64_t rng = tl_seed();
  for (int n = 0; n < 20000; n++) {
    uint32_t bits = (uint32_t)tl_rand(&rng);
    float f;
    memcpy(&f, &bits, sizeof f);
    if (isnan(f) || isinf(f)) continue;
    Buf b = {0};
    cg_float_literal(&b, f);
    const char *s = b.data + (b.data[0] == '(');
    char *end;
    float back = strtof(s, &end);
    ck_assert_msg(*end == 'f', "literal %s does not end in f", b.data);
    uint32_t got;
    memcpy(&got, &back, sizeof got);
    ck_assert_msg(got == bits, "%s reads back as 0x%08x, want 0x%08x", b.data, got, bits);
    buf_free(&b);
  }
  struct { double v; const char *want; } known[] = {
      {0.1, "0.1f"}, {1e-45, "1e-45f"}, {16777216.0, "16777216.0f"}, {-2.5, "(-2.5f)"},
      {3.4028234663852886e38, "3.4028235e+38f"}, {1.0 / 0.0, "INFINITY"}};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    Buf b = {0};
    cg_float_literal(&b, known[i].v);
    ck_assert_str_eq(b.data, known[i].want);
    buf_free(&b);
  }
}
END_TEST

/* More params than FlexParams has slots: refused with a message, not an
 * internal error (it once was at 65). */
START_TEST(slot_limits) {
  Buf src = {0};
  for (int i = 0; i < 17; i++) buf_printf(&src, "param float p%d = 1.0;\n", i);
  buf_puts(&src, "score f(s, b, h, q, kv) { return s");
  for (int i = 0; i < 17; i++) buf_printf(&src, " + p%d", i);
  buf_puts(&src, "; }\n");
  flex_kernel *k;
  ck_assert_int_eq(flex_kernel_from_source(&k, "many.score", src.data, src.len, NULL), FLEX_OK);
  CgOptions o;
  char err[256];
  ck_assert(!cg_options_init(&o, k->mod, CG_FP16, 64, 64, CG_SM80, true, err, sizeof err));
  ck_assert_msg(strstr(err, "at most 16 params") && strstr(err, "this one has 17"), "%s", err);
  flex_kernel_free(k);
  buf_free(&src);
}
END_TEST

/* float(kv - q) is the kernels' flex_dqk only where the functions see the
 * kernels' q and kv and every position is below 2^24 - 1024: not past
 * CG_DQK_MAX (cg_plan), nor for a shard (offsets), which convert it. */
START_TEST(dqk_only_where_exact) {
  flex_kernel *k;
  ck_assert_int_eq(flex_kernel_from_source(&k, "test.score", gemma, strlen(gemma), NULL), FLEX_OK);
  for (int c = 0; c < 3; c++) {
    CgOptions o;
    char err[256];
    if (c < 2) {
      ck_assert_msg(cg_options_init(&o, k->mod, CG_FP16, 64, 64, CG_SM80, true, err, sizeof err), "%s", err);
      o.offsets = c == 1;
    } else { /* a call of 2^24 keys */
      CgShape sh = {.dtype = CG_FP16, .B = 1, .H = 1, .HKV = 1, .QL = 64, .KL = 1 << 24, .E = 64, .EV = 64,
                    .backward = true};
      CgDevice dev = {.arch = CG_SM80, .sms = 108};
      int splits;
      ck_assert_msg(cg_plan(&o, &splits, k->mod, &sh, &dev, err, sizeof err), "%s", err);
    }
    Buf b = {0};
    cg_emit_cuda(&b, k->mod, &o);
    const bool dqk = c == 0; /* the default, and the others */
    ck_assert_msg(!strstr(b.data, " = flex_dqk;") == !dqk, "case %d", c);
    ck_assert_msg(!(strstr(b.data, "flex_isub(kv, q)") && strstr(b.data, " = (float)t")) == dqk, "case %d", c);
    buf_free(&b);
  }
  flex_kernel_free(k);
}
END_TEST

/* The forwards' exp2-domain score: a bias score is one FMA with log2 e on
 * its q- and kv-free factor; any other score the call times log2 e. */
START_TEST(score_l2_forms) {
  static const char *const src[3] = {
      "buffer slopes: f32[H];\nscore a(s, b, h, q, kv) { return s + slopes[h] * float(kv - q); }\n",
      "buffer bias: f32[Q_LEN];\nscore c(s, b, h, q, kv) { return bias[q] + s; }\n",
      "param float cap = 30.0;\nscore t(s, b, h, q, kv) { return cap * tanh(s / cap); }\n"};
  static const char *const want[3] = {
      "return fmaf(x, p.scale * FLEX_LOG2E, (t2 * FLEX_LOG2E) * t6);",
      "return fmaf(x, p.scale * FLEX_LOG2E, t1 * FLEX_LOG2E);",
      "return flex_score(p, x * p.scale, b, h, q, kv, flex_dqk) * FLEX_LOG2E;"};
  for (int i = 0; i < 3; i++) {
    CgOptions o;
    char *s = gen(src[i], CG_BF16, 64, &o);
    const char *l2 = strstr(s, "float flex_score_l2(");
    ck_assert_msg(l2 && strstr(l2, want[i]), "case %d:\n%s", i, l2 ? l2 : s);
    free(s);
  }
}
END_TEST

/* A bias score s + a float(kv - q) + c (a, c free of q and kv) is folded
 * into S's accumulators (flex_bias, FLEX_BIAS, an identity score's
 * bodies and tiles); any other score, or a call that cannot, is not. */
START_TEST(bias_fold_forms) {
  static const char *const src[] = {
      "buffer slopes: f32[H];\nscore a(s, b, h, q, kv) { return s + slopes[h] * float(kv - q); }\n",
      "param float t = 0.5;\nbuffer c: f32[H];\nscore a(s, b, h, q, kv) { return c[h] + (float(q - kv) * t + s); }\n",
      "score a(s, b, h, q, kv) { return s - float(q - kv); }\n",
      "buffer c: f32[B, H];\nscore a(s, b, h, q, kv) { return c[b, h] + s; }\n",
      "buffer slopes: f32[H] grad;\nscore a(s, b, h, q, kv) { return s + slopes[h] * float(kv - q) + 0.5; }\n",
      "buffer bias: f32[Q_LEN];\nscore a(s, b, h, q, kv) { return bias[q] + s; }\n",
      "buffer slopes: f32[H];\nscore a(s, b, h, q, kv) { return s + slopes[h] * float(kv); }\n",
      "score a(s, b, h, q, kv) { return s * 2.0 + float(kv - q); }\n",
      "score a(s, b, h, q, kv) { return 1.0 - s + float(kv - q); }\n",
      "score a(s, b, h, q, kv) { return s + float(kv - q) - float(q - kv); }\n",
      "param float cap = 30.0;\nscore t(s, b, h, q, kv) { return cap * tanh(s / cap); }\n"};
  static const char *const want[] = {
      "  flex_a = t2;\n  flex_c = 0.0f;",
      "  flex_a = -t;\n  flex_c = t", /* float(q - kv) * t: a = -t; c = c[h] */
      "  flex_a = 1.0f;\n  flex_c = 0.0f;",
      "  flex_a = 0.0f;\n  flex_c = t",
      "  flex_c = 0.5f;", /* a grad buffer: the joint reads no s */
      NULL, NULL, NULL, NULL, NULL, NULL};
  for (int i = 0; i < (int)(sizeof src / sizeof *src); i++) {
    CgOptions o;
    char *s = gen(src[i], CG_BF16, 64, &o);
    const char *f = strstr(s, "void flex_bias(");
    ck_assert_msg(!f == !want[i] && o.score_bias == !!want[i], "case %d:\n%s", i, s);
    ck_assert_msg(!want[i] || strstr(f, want[i]), "case %d:\n%s", i, f);
    ck_assert_msg(!strstr(s, "#define FLEX_BIAS 1") == !want[i], "case %d", i);
    /* the tensor-core bodies take an identity score's softmax */
    ck_assert_msg(!strstr(s, "FLEX_MASK_NONE, true>") == !want[i], "case %d:\n%s", i, s);
    free(s);
  }
  /* Not for a tiny scale, fp32, a checked run, offsets or packed rows; an
   * identity score's tiles where it is (sm_80: 128 x 128 forward). */
  flex_kernel *k;
  ck_assert_int_eq(flex_kernel_from_source(&k, "test.score", src[0], strlen(src[0]), NULL), FLEX_OK);
  for (int c = 0; c < 7; c++) {
    CgShape sh = {.dtype = c == 2 ? CG_FP32 : CG_BF16, .B = 1, .H = 8, .HKV = c == 5 ? 1 : 8,
                  .QL = c == 5 ? 1 : 256, .KL = 512, .E = 128, .EV = 128, .backward = c != 5,
                  .scale = c == 1 ? 0x1p-17f : c == 6 ? -0.125f : 0.125f, .pack_ok = true,
                  .check_bounds = c == 3, .offsets = c == 4};
    CgDevice dev = {.arch = CG_SM80, .sms = 108};
    CgOptions o;
    char err[256];
    int splits;
    ck_assert_msg(cg_plan(&o, &splits, k->mod, &sh, &dev, err, sizeof err), "%s", err);
    const bool fold = c == 0 || c == 6;
    ck_assert_msg(cg_bias_folded(&o) == fold && (c != 5 || o.pack_gqa), "case %d", c);
    if (c != 2) ck_assert_msg((o.fwd.block_n == 128) == fold, "case %d: %d", c, o.fwd.block_n);
    Buf b = {0};
    cg_emit_cuda(&b, k->mod, &o);
    ck_assert_msg(!strstr(b.data, "#define FLEX_BIAS 1") == !fold, "case %d", c);
    buf_free(&b);
  }
  flex_kernel_free(k);
}
END_TEST

/* A division by a value the same for a whole tile (params, constants, b,
 * h) is flex_fdiv_uniform; by anything an element reads (s, q, kv, dt, a
 * buffer; h under grouped-query packing) it stays IEEE division. */
START_TEST(uniform_division) {
  static const char *const src[] = {
      "param float c = 2.0;\nscore a(s, b, h, q, kv) { return s / c; }\n",
      "param float c = 2.0;\nscore a(s, b, h, q, kv) { return s * (c / float(b + h + 1)); }\n",
      "score a(s, b, h, q, kv) { return s / float(kv + 1); }\n",
      "buffer t: f32[H];\nscore a(s, b, h, q, kv) { return s / t[h]; }\n",
      "score a(s, b, h, q, kv) { return 1.0 / (s * s + 1.0); }\n"};
  static const char *const want[] = {"flex_fdiv_uniform(s, c)", "flex_fdiv_uniform(c, ", "flex_fdiv(s, ",
                                     "flex_fdiv(s, ", "flex_fdiv(1.0f, "};
  for (int i = 0; i < (int)(sizeof src / sizeof *src); i++) {
    CgOptions o;
    char *s = gen(src[i], CG_BF16, 64, &o);
    ck_assert_msg(strstr(s, want[i]), "case %d: no %s in\n%s", i, want[i], s);
    ck_assert_msg(!strstr(s, i < 2 ? "flex_fdiv(" : "flex_fdiv_uniform("), "case %d:\n%s", i, s);
    free(s);
  }
  /* packed query rows: h is per row */
  flex_kernel *k;
  ck_assert_int_eq(flex_kernel_from_source(&k, "test.score", src[1], strlen(src[1]), NULL), FLEX_OK);
  for (int packed = 0; packed < 2; packed++) {
    CgShape sh = {.dtype = CG_BF16, .B = 1, .H = 8, .HKV = packed ? 1 : 8, .QL = packed ? 1 : 256,
                  .KL = 512, .E = 128, .EV = 128, .scale = 0.125f, .pack_ok = true};
    CgDevice dev = {.arch = CG_SM80, .sms = 108};
    CgOptions o;
    char err[256];
    int splits;
    ck_assert_msg(cg_plan(&o, &splits, k->mod, &sh, &dev, err, sizeof err), "%s", err);
    ck_assert(o.pack_gqa == packed);
    Buf b = {0};
    cg_emit_cuda(&b, k->mod, &o);
    ck_assert_msg((strstr(b.data, "flex_fdiv_uniform(c, ") == NULL) == (packed == 1), "packed %d:\n%s", packed, b.data);
    buf_free(&b);
  }
  flex_kernel_free(k);
}
END_TEST

/* A gradient element the whole tile adds to (indices free of s, q, kv and
 * dt) is summed in FlexAcc and added per warp by flex_acc_flush; one an
 * element picks (bias[q]) keeps its atomic; a deterministic backward adds
 * every element exactly. */
START_TEST(tile_gradients) {
  static const char *const src =
      "buffer slopes: f32[H] grad;\nbuffer bias: f32[Q_LEN] grad;\nbuffer w: f32[B, 4] grad;\n"
      "score a(s, b, h, q, kv) { return s + slopes[h] * float(kv - q) + bias[q] + w[b, h % 4]; }\n";
  CgOptions o;
  char *s = gen(src, CG_BF16, 64, &o);
  ck_assert_msg(strstr(s, "struct FlexAcc {\n  float g0 = 0.0f;\n  float g1 = 0.0f;\n};"), "%s", s);
  ck_assert_msg(strstr(s, "flex_warp_add(grad_slopes + h, flex_acc.g"), "%s", s);
  ck_assert_msg(strstr(s, "flex_warp_add(grad_w + ((int64_t)(b + p.b0) * 4 + "), "%s", s);
  ck_assert_msg(!strstr(s, "flex_warp_add(grad_bias"), "%s", s);
  ck_assert_msg(strstr(s, "flex_atomic_add(grad_bias + q, "), "%s", s);
  ck_assert_msg(strstr(s, "if (flex_accum && flex_acc) flex_acc->g0 += "), "%s", s);
  free(s);
  flex_kernel *k;
  ck_assert_int_eq(flex_kernel_from_source(&k, "test.score", src, strlen(src), NULL), FLEX_OK);
  char err[256];
  ck_assert_msg(cg_options_init(&o, k->mod, CG_BF16, 64, 64, CG_SM80, true, err, sizeof err), "%s", err);
  o.deterministic = true;
  Buf b = {0};
  cg_emit_cuda(&b, k->mod, &o);
  ck_assert_msg(strstr(b.data, "struct FlexAcc {};") && !strstr(b.data, "flex_acc->"), "%s", b.data);
  buf_free(&b);
  flex_kernel_free(k);
}
END_TEST

START_TEST(names_by_role) {
  CgOptions o;
  char *s = gen(gemma, CG_FP16, 64, &o);
  ck_assert_ptr_nonnull(strstr(s, "const float softcap = p.pf[0];"));
  ck_assert_ptr_nonnull(strstr(s, "const int window = p.pi[1];"));
  ck_assert_ptr_nonnull(strstr(s, "const float *slopes = (const float *)p.buf[0];"));
  ck_assert_ptr_nonnull(strstr(s, "flex_gload(slopes + h)"));
  ck_assert_ptr_nonnull(strstr(s, "flex_isub(q, kv)"));  /* wrapping int arithmetic (the mask) */
  ck_assert_ptr_nonnull(strstr(s, " = flex_dqk;"));      /* float(kv - q): the kernels' (CgOptions.dqk) */
  ck_assert_ptr_null(strstr(s, "flex_isub(kv, q)"));    /* ... and nothing else reads kv - q */
  ck_assert_ptr_nonnull(strstr(s, "flex_tanh("));
  ck_assert_ptr_null(strstr(s, "FLEX_FAST_MATH")); /* exact unless asked */
  ck_assert_ptr_nonnull(strstr(s, "float *grad_slopes = p.buf_grad[0];"));
  ck_assert_ptr_nonnull(strstr(s, "flex_atomic_add(grad_slopes + h, "));
  ck_assert_ptr_nonnull(strstr(s, "#include \"flex_fwd.cuh\""));
  ck_assert_ptr_nonnull(strstr(s, "from test.score, kernel gemma"));
  static const char *const entries[] = {"flex_fwd", "flex_bwd_pre", "flex_bwd", "flex_bwd_dq"};
  const int threads[] = {o.fwd.threads, 128, o.bwd.threads, 128};
  for (int i = 0; i < 4; i++) {
    char want[160];
    snprintf(want, sizeof want, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const FlexParams p)", threads[i], entries[i]);
    const char *at = strstr(s, want);
    ck_assert_msg(at != NULL, "missing entry %s", entries[i]);
    snprintf(want, sizeof want, "FLEX_EMU_ENTRY(%s, FlexParams)", entries[i]);
    ck_assert_msg(strstr(at, want) != NULL, "missing FLEX_EMU_ENTRY for %s", entries[i]);
  }
  ck_assert(!o.score_identity && !o.ds_is_dt && o.has_mask && o.grad_buffers);
  ck_assert_ptr_nonnull(strstr(s, "flex_fwd_tc<FlexF16, FlexF16, 64, 64, 128, 128, 8, FLEX_MASK_DENSE, false>"));
  ck_assert_ptr_nonnull(strstr(s, "flex_bwd_pre<FlexF16, FlexF16>"));
  free(s);
}
END_TEST

/* A deterministic backward: the define, exact ACCUMs and the rounding
 * entry only when asked; the source of a call without it is unchanged. */
START_TEST(deterministic_source) {
  CgOptions o;
  char *plain = gen(gemma, CG_BF16, 64, &o);
  o.deterministic = true;
  flex_kernel *k;
  ck_assert(flex_kernel_from_source(&k, "test.score", gemma, strlen(gemma), NULL) == FLEX_OK);
  Buf b = {0};
  o.source = NULL;
  cg_emit_cuda(&b, k->mod, &o);
  ck_assert_ptr_nonnull(strstr(b.data, "#define FLEX_DETERMINISTIC 1"));
  ck_assert_ptr_nonnull(strstr(b.data, "int64_t *grad_slopes = p.grad_exact[0];"));
  ck_assert_ptr_nonnull(strstr(b.data, "flex_exact_add(grad_slopes, h, "));
  ck_assert_ptr_nonnull(strstr(b.data, "flex_grad_exact(const FlexParams p)"));
  ck_assert_ptr_null(strstr(b.data, "flex_atomic_add("));
  ck_assert_ptr_null(strstr(plain, "FLEX_DETERMINISTIC"));
  ck_assert_ptr_null(strstr(plain, "flex_exact_add"));
  ck_assert_ptr_null(strstr(plain, "flex_grad_exact"));
  /* The grid: one CTA per key tile, or the split count (at most the tiles). */
  ck_assert_uint_eq(cg_launch_bwd(&o, 2, 4, 8192).grid[0], 33); /* ceil(264 / 8) */
  ck_assert_uint_eq(cg_launch_bwd(&o, 1, 1, 100).grid[0], (100 + o.bwd.block_n - 1) / o.bwd.block_n);
  o.deterministic = false;
  ck_assert_uint_eq(cg_launch_bwd(&o, 2, 4, 4096).grid[0], 4096 / o.bwd.block_n);
  flex_kernel_free(k);
  buf_free(&b);
  free(plain);
}
END_TEST

/* Tile overrides: applied when valid, refused with a reason otherwise, and
 * the options left alone on refusal. */
START_TEST(tile_override) {
  CgOptions o;
  char err[256];
  free(gen("mask causal(b, h, q, kv) { return q >= kv; }\n", CG_BF16, 128, &o));
  ck_assert_int_eq(o.fwd.block_m, 128);
  ck_assert(cg_tiles_apply(&o, "fwd=64x128x4,bwd=64x16x4", err, sizeof err));
  ck_assert_int_eq(o.fwd.block_m, 64);
  ck_assert_int_eq(o.fwd.block_n, 128);
  ck_assert_int_eq(o.bwd.block_n, 16);
  ck_assert(cg_tiles_apply(&o, "fwd=128x64x8", err, sizeof err));
  ck_assert_int_eq(o.fwd.threads, 256);
  ck_assert_int_eq(o.bwd.block_n, 16); /* the part left out stays */
  const char *bad[] = {"", "fwd=128x64", "fwd=128x64x4,", "bwd=64x32x4;fwd=64x64x4",
                       "fwd=96x64x4", "fwd=128x64x2", "fwd=64x256x4", "bwd=128x32x4",
                       "bwd=64x32x8", "side=64x64x4"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    CgOptions before = o;
    err[0] = 0;
    ck_assert_msg(!cg_tiles_apply(&o, bad[i], err, sizeof err), "accepted '%s'", bad[i]);
    ck_assert_msg(err[0], "no reason for '%s'", bad[i]);
    ck_assert(!memcmp(&before, &o, sizeof o));
  }
  /* The environment variable goes through the same parser. */
  setenv("FLEXC_TILES", "fwd=64x64x4", 1);
  free(gen("mask causal(b, h, q, kv) { return q >= kv; }\n", CG_BF16, 128, &o));
  ck_assert_int_eq(o.fwd.block_m, 64);
  setenv("FLEXC_TILES", "fwd=7x7x7", 1);
  flex_kernel *k;
  const char *src = "mask causal(b, h, q, kv) { return q >= kv; }\n";
  ck_assert_int_eq(flex_kernel_from_source(&k, "t.score", src, strlen(src), NULL), FLEX_OK);
  ck_assert(!cg_options_init(&o, k->mod, CG_BF16, 128, 128, CG_SM80, true, err, sizeof err));
  ck_assert_ptr_nonnull(strstr(err, "fwd tiles 7x7x7"));
  flex_kernel_free(k);
  unsetenv("FLEXC_TILES");
}
END_TEST

START_TEST(identity_score) {
  CgOptions o;
  char *s = gen("mask causal(b, h, q, kv) { return q >= kv; }\n", CG_BF16, 72, &o);
  ck_assert(o.score_identity && o.ds_is_dt);
  ck_assert_int_eq(o.head_dim_pad, 80);
  ck_assert_ptr_nonnull(strstr(s, "flex_fwd_tc<FlexBF16, FlexBF16, 80, 80, 128, 128, 8, FLEX_MASK_DENSE, true>"));
  ck_assert_ptr_nonnull(strstr(s, "FLEX_MASK_DENSE, true, false>"));  /* bwd: no joint call */
  ck_assert_ptr_nonnull(strstr(s, "  return s;\n"));
  free(s);
  s = gen("score bias(s, b, h, q, kv) { return s + 0.1 * float(q - kv); }\n", CG_FP32, 15, &o);
  ck_assert(!o.score_identity && o.ds_is_dt && !o.has_mask);  /* ds == dt: joint skipped */
  ck_assert_ptr_nonnull(strstr(s, "flex_fwd_simt<16, 16, 32, 32, FLEX_MASK_NONE, false>"));
  ck_assert_ptr_nonnull(strstr(s, "0.1f"));  /* shortest round-tripping literal */
  free(s);
}
END_TEST

START_TEST(int_semantics) {
  CgOptions o;
  char *s = gen("param int n = 3;\nmask m(b, h, q, kv) { return (q / n) % 7 == -kv * abs(h) + int(1.5); }\n",
                CG_FP16, 64, &o);
  ck_assert_ptr_nonnull(strstr(s, "flex_idiv(q, n)"));
  ck_assert_ptr_nonnull(strstr(s, "flex_imod("));
  ck_assert(strstr(s, "flex_imul(") || strstr(s, "flex_ineg("));
  free(s);
}
END_TEST

START_TEST(launch_geometry) {
  CgOptions o;
  for (int a = 0; a < CG_NARCH; a++) {
    /* Tiles are picked per arch: each arch's backward fits its own shared memory. */
    free(gen_arch(gemma, CG_FP16, 256, (CgArch)a, &o));
    CgLaunch l = cg_launch_fwd(&o, 3, 5, 1000);
    ck_assert_uint_eq(l.grid[0], (1000 + o.fwd.block_m - 1) / o.fwd.block_m);
    ck_assert_uint_eq(l.grid[1], 5);
    ck_assert_uint_eq(l.grid[2], 3);
    ck_assert_uint_eq(l.block[0], (unsigned)o.fwd.threads);
    l = cg_launch_bwd(&o, 3, 1, 1000);
    ck_assert_uint_eq(l.grid[0], (1000 + o.bwd.block_n - 1) / o.bwd.block_n);
    ck_assert(l.smem <= cg_arch_smem_limit((CgArch)a));
    ck_assert_uint_eq(l.block[0], (unsigned)o.bwd.threads);
  }
  /* E = 128: 64 x 128 x 8 where it fits (sm_80: 142080 bytes), 64 x 64 x 4
   * on sm_86's 99 KiB; a BlockMask of 64-key blocks narrows it to 64. */
  free(gen_arch(gemma, CG_BF16, 128, CG_SM80, &o));
  ck_assert_int_eq(o.bwd.block_n, 128);
  ck_assert_int_eq(o.bwd.threads, 256);
  ck_assert_uint_eq(cg_launch_bwd(&o, 1, 1, 1000).smem, 142080);
  cg_fit_mask_blocks(&o, 64);
  ck_assert_int_eq(o.bwd.block_n, 64);
  ck_assert_int_eq(o.bwd.threads, 128);
  ck_assert(cg_mask_blocks_ok(&o, 128, 64));
  cg_fit_mask_blocks(&o, 256); /* already divides: unchanged */
  ck_assert_int_eq(o.bwd.block_n, 64);
  free(gen_arch(gemma, CG_BF16, 128, CG_SM86, &o));
  ck_assert_int_eq(o.bwd.block_n, 64);
  ck_assert_int_eq(o.bwd.threads, 128);
  ck_assert(cg_launch_bwd(&o, 1, 1, 1000).smem <= cg_arch_smem_limit(CG_SM86));
  char err[128];
  ck_assert(!cg_options_init(&o, NULL, CG_FP16, 0, 64, CG_SM80, false, err, sizeof err));
  ck_assert(!cg_options_init(&o, NULL, CG_FP16, 257, 64, CG_SM80, false, err, sizeof err));
}
END_TEST

/* The sm_90a backward's consumer warpgroups: two splitting 128 keys (KS,
 * 384 threads) at E padded to 128; one of 64 keys (256 threads) at E <= 64;
 * two splitting the columns of 64 keys (384 threads) above 128, with E and
 * EV padded to whole panels per consumer (128 columns a pair); shared
 * memory that fits sm_90a. With E % 4 == 0 and one consumer or KS, dQ goes
 * through bulk reductions from staging buffers of 64 rows of 4 EPT + 16
 * bytes (33792 at EPT = 128; two with one consumer, one with KS); every
 * variant keeps two stages of a tile's LSE and D (1024 bytes), 12
 * mbarriers and 12 stage words (144 bytes). */
START_TEST(sm90_backward_consumers) {
  static const struct {
    int E, EV, nc, ept, evpt, keys;
    size_t smem;
    bool dqb, ks;
  } cases[] = {
      {128, 128, 2, 128, 128, 128, 1024 + 2 * 128 * 256 + 4 * 64 * 256 + 32768 + 33792 + 1024 + 144, true, true},
      {72, 40, 2, 128, 64, 128, 1024 + 2 * 128 * 192 + 4 * 64 * 192 + 32768 + 33792 + 1024 + 144, true, true},
      {70, 40, 2, 128, 64, 128, 1024 + 2 * 128 * 192 + 4 * 64 * 192 + 32768 + 1024 + 144, false, true},
      {64, 64, 1, 64, 64, 64, 1024 + 384 * 128 + 16384 + 2 * 17408 + 1024 + 144, true, false},
      {256, 256, 2, 256, 256, 64, 215184, false, false}, {160, 136, 2, 256, 256, 64, 215184, false, false},
      {200, 200, 2, 256, 256, 64, 215184, false, false},
      {256, 64, 2, 256, 128, 64, 1024 + 384 * 384 + 16384 + 1024 + 144, false, false},
      {64, 200, 2, 128, 256, 64, 1024 + 384 * 384 + 16384 + 1024 + 144, false, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    flex_kernel *k;
    ck_assert(flex_kernel_from_source(&k, "test.score", gemma, strlen(gemma), NULL) == FLEX_OK);
    CgOptions o;
    char err[256], want[96];
    ck_assert_msg(cg_options_init(&o, k->mod, CG_BF16, cases[i].E, cases[i].EV, CG_SM90A, true, err,
                                  sizeof err), "%s", err);
    ck_assert_msg(o.bwd_sm90, "E %d EV %d: not the sm_90a backward", cases[i].E, cases[i].EV);
    ck_assert_int_eq(cg_bwd_sm90_consumers(&o), cases[i].nc);
    ck_assert_int_eq(o.bwd.block_n, cases[i].keys);
    ck_assert_int_eq(o.bwd.threads, 128 * (1 + cases[i].nc));
    ck_assert_int_eq(cg_bwd_sm90_dim(&o, cases[i].E), cases[i].ept);
    ck_assert_int_eq(cg_bwd_sm90_dim(&o, cases[i].EV), cases[i].evpt);
    CgLaunch l = cg_launch_bwd(&o, 1, 1, 1000);
    ck_assert_uint_eq(l.smem, cases[i].smem);
    ck_assert_uint_le(l.smem, cg_arch_smem_limit(CG_SM90A));
    ck_assert_uint_eq(l.block[0], (unsigned)o.bwd.threads);
    Buf b = {0};
    cg_emit_cuda(&b, k->mod, &o);
    snprintf(want, sizeof want, "flex_bwd_sm90<FlexBF16, %d, %d, %d, ", cases[i].ept, cases[i].evpt,
             cases[i].nc);
    ck_assert_msg(strstr(b.data, want) != NULL, "E %d EV %d: no '%s'", cases[i].E, cases[i].EV, want);
    snprintf(want, sizeof want, ", %s, %s, 24>(t);\n}\nFLEX_EMU_ENTRY(flex_bwd,", cases[i].dqb ? "true" : "false",
             cases[i].ks ? "true" : "false");
    ck_assert_msg(strstr(b.data, want) != NULL, "E %d EV %d: no '%s'", cases[i].E, cases[i].EV, want);
    snprintf(want, sizeof want, "__launch_bounds__(%d, 1) flex_bwd(", o.bwd.threads);
    ck_assert_msg(strstr(b.data, want) != NULL, "E %d EV %d: no '%s'", cases[i].E, cases[i].EV, want);
    buf_free(&b);
    flex_kernel_free(k);
  }
}
END_TEST

/* The sm_90a forward's consumers: two unless an implicit mask has more
 * than two integer divisions (then one); the overlap for an identity score
 * and for a score function up to head dim 128. The template's NC and
 * OVERLAP follow. */
START_TEST(sm90_forward_consumers) {
  static const char softcap[] =
      "score s(x, b, h, q, kv) { return 20.0 * tanh(x / 20.0); }\n"
      "mask m(b, h, q, kv) { return q >= kv; }\n";
  static const struct {
    const char *src;
    int E, nc, bn;
    const char *overlap;
  } cases[] = {
      {"mask m(b, h, q, kv) { return q >= kv; }\n", 128, 2, 128, "true"},
      {"mask m(b, h, q, kv) { return q >= kv; }\n", 256, 2, 64, "true"},
      {"mask m(b, h, q, kv) { return q / 3 == kv / 5; }\n", 128, 2, 128, "true"},
      {"mask m(b, h, q, kv) { return (q / 3) % 5 == kv % 7; }\n", 128, 1, 128, "true"},
      {"mask m(b, h, q, kv) { return q % 4 >= kv % 3 && q / 2 >= kv / 2; }\n", 64, 1, 128, "true"},
      {softcap, 128, 2, 128, "true"},
      {softcap, 256, 2, 64, "false"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    flex_kernel *k;
    ck_assert(flex_kernel_from_source(&k, "test.score", cases[i].src, strlen(cases[i].src), NULL) ==
              FLEX_OK);
    CgOptions o;
    char err[256], want[96];
    int E = cases[i].E;
    ck_assert_msg(cg_options_init(&o, k->mod, CG_BF16, E, E, CG_SM90A, false, err, sizeof err),
                  "%s", err);
    ck_assert_msg(o.fwd_sm90, "case %zu: not the sm_90a forward", i);
    ck_assert_msg(o.fwd.block_m == 64 * cases[i].nc && o.fwd.threads == 128 * (1 + cases[i].nc),
                  "case %zu: %d rows, %d threads for %d consumers", i, o.fwd.block_m, o.fwd.threads,
                  cases[i].nc);
    Buf b = {0};
    cg_emit_cuda(&b, k->mod, &o);
    snprintf(want, sizeof want, "flex_fwd_sm90<FlexBF16, FlexBF16, %d, %d, %d, %d, %s, ", E, E,
             cases[i].bn, cases[i].nc, cases[i].overlap);
    ck_assert_msg(strstr(b.data, want) != NULL, "case %zu: no '%s'", i, want);
    buf_free(&b);
    flex_kernel_free(k);
  }
}
END_TEST

int main(void) {
  return TL_MAIN("codegen", 0, TL_TEST(float_literals_round_trip), TL_TEST(slot_limits),
                 TL_TEST(names_by_role), TL_TEST(dqk_only_where_exact), TL_TEST(score_l2_forms), TL_TEST(bias_fold_forms), TL_TEST(uniform_division), TL_TEST(tile_gradients), TL_TEST(deterministic_source), TL_TEST(tile_override),
                 TL_TEST(identity_score), TL_TEST(int_semantics), TL_TEST(launch_geometry),
                 TL_TEST(sm90_backward_consumers), TL_TEST(sm90_forward_consumers));
}
