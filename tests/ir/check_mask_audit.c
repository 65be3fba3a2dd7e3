/* Block skipping under integer and float edge cases: the analysis against a
 * dense evaluation on masks built to break it (32-bit wrap-around, C
 * division and remainder with negative and run-time zero divisors,
 * clamp with lo > hi, int(float) saturation and NaN, inf/NaN comparisons,
 * signed zeros, extreme params, shifts and bit operations, floordiv and
 * floormod); the shared integer rules against brute force near INT_MIN /
 * INT_MAX; a caller's BlockMask with block sizes near
 * INT_MAX (the block counts must not wrap) run on the emulator. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/interval.cuh"
#include "kernels/scalar.cuh"
#include "ir/interval.h"
#include "runtime/blockmask.h"
#include "runtime/rt.h"
#include "testlib.h"

/* One adversarial mask: its source and an int param value (if it has one). */
typedef struct Adv {
  const char *src;
  int32_t param; /* value of the first param, overriding its default */
} Adv;

static const Adv advs[] = {
    {"mask m(b, h, q, kv) { return q * 20000000 >= kv * 20000000; }", 0},
    {"mask m(b, h, q, kv) { return q + 2147483000 > kv + 2147483000; }", 0},
    {"mask m(b, h, q, kv) { return abs(q - 2147483647) > abs(kv - 2147483647); }", 0},
    {"mask m(b, h, q, kv) { return abs(-2147483647 - 1 + q) >= kv; }", 0},
    {"mask m(b, h, q, kv) { return abs(q - 2147483647 - 1 - kv) > 5; }", 0},
    {"mask m(b, h, q, kv) { return (q - kv) / (h - 1) > 2; }", 0},
    {"mask m(b, h, q, kv) { return q % (kv - 5) < 3; }", 0},
    {"mask m(b, h, q, kv) { return (q - kv) % 64 == 0; }", 0},
    {"mask m(b, h, q, kv) { return (q - kv) % -7 < -2; }", 0},
    {"mask m(b, h, q, kv) { return (-2147483647 - 1 + q) / (kv - 1) < 0; }", 0},
    {"mask m(b, h, q, kv) { return clamp(q, 300, 100) >= kv; }", 0},
    {"mask m(b, h, q, kv) { return where(q > kv, 1.5, 1) > 1.2; }", 0},
    {"mask m(b, h, q, kv) { return int(float(q) * 1e30) > kv; }", 0},
    {"mask m(b, h, q, kv) { return int(sqrt(float(q - kv))) < 3; }", 0},
    {"mask m(b, h, q, kv) { return float(q) / float(kv) < 2.0; }", 0},
    {"mask m(b, h, q, kv) { return !(float(q - kv) / float(q) < 0.5); }", 0},
    {"mask m(b, h, q, kv) { return int(q > kv) * 5 - 2 > 0; }", 0},
    {"mask m(b, h, q, kv) { return 1.0 / (0.0 * float(q - kv)) > 0.0; }", 0},
    {"mask m(b, h, q, kv) { return 1.0 / where(q > kv, 0.0, -0.0) > 0.0; }", 0},
    {"mask m(b, h, q, kv) { return float(q - kv) % 64.0 == 0.0; }", 0},
    {"mask m(b, h, q, kv) { return !(q >= kv && (q - kv) % 3 != 1) || kv > 100; }", 0},
    {"mask m(b, h, q, kv) { return kv >= KV_LEN - Q_LEN + q; }", 0},
    {"param int w = 0;\nmask m(b, h, q, kv) { return q - kv < w && q >= kv; }", -5},
    {"param int w = 0;\nmask m(b, h, q, kv) { return kv - q > w; }", -2147483647 - 1},
    {"param int w = 0;\nmask m(b, h, q, kv) { return q + w > kv + w; }", 2147483647 - 60},
    {"param int w = 0;\nmask m(b, h, q, kv) { return (q - kv) / w >= 1; }", 0},
    /* version 2: shifts that wrap or count outside 0..31, bit ops on negative
     * values, Python's floor division with run-time zero and negative divisors */
    {"mask m(b, h, q, kv) { return (q << 27) > (kv << 27); }", 0},
    {"mask m(b, h, q, kv) { return (q >> (kv - 40)) == 0; }", 0},
    {"mask m(b, h, q, kv) { return ((q - 64) >> (kv - 3)) < -1; }", 0},
    {"mask m(b, h, q, kv) { return (1 << (q - kv)) > 4; }", 0},
    {"mask m(b, h, q, kv) { return ((q - 70) & (kv - 60)) < 0; }", 0},
    {"mask m(b, h, q, kv) { return ((q - 70) | (kv - 2147483647)) > -5; }", 0},
    {"mask m(b, h, q, kv) { return (~q ^ (kv - 50)) >= 0; }", 0},
    {"mask m(b, h, q, kv) { return floordiv(q - kv, kv - 3) < 1; }", 0},
    {"mask m(b, h, q, kv) { return floormod(q - kv, -7) > -3; }", 0},
    {"mask m(b, h, q, kv) { return floormod(q, 64) >= floormod(kv, 64) && floordiv(q, 64) == floordiv(kv, 64); }", 0},
    {"param int w = 0;\nmask m(b, h, q, kv) { return floordiv(-2147483647 - 1 + q, w) > kv; }", -1},
    {"mask m(b, h, q, kv) { return (q > kv) ^ (q - kv < 16) | (q & 1) == (kv & 1); }", 0},
    {"mask m(b, h, q, kv) { return sum(i, 0, 4, (q >> i) & 1) > sum(i, 0, 4, (kv >> i) & 1); }", 0},
};
#define NADV ((int)(sizeof advs / sizeof *advs))

/* The class of every block (0 empty, 1 full, 2 partial), from the layout. */
static uint8_t *classes(const RtBlockMask *bm) {
  size_t rows = (size_t)bm->B * bm->H * bm->nq;
  uint8_t *c = calloc(rows * (size_t)bm->nkv, 1);
  for (size_t r = 0; r < rows; r++) {
    for (int k = 0; k < bm->kv_num_blocks[r]; k++) c[r * bm->nkv + bm->kv_indices[r * bm->nkv + k]] = 2;
    for (int k = 0; k < bm->full_kv_num_blocks[r]; k++)
      c[r * bm->nkv + bm->full_kv_indices[r * bm->nkv + k]] = 1;
  }
  return c;
}

/* A block the analysis calls empty or full is so on every element. */
START_TEST(adversarial_sound) {
  const Adv *a = &advs[_i];
  flex_kernel *k;
  ck_assert_msg(flex_kernel_from_source(&k, "adv.score", a->src, strlen(a->src), NULL) == FLEX_OK,
                "%s: %s", a->src, flex_last_error());
  static const int shapes[][4] = {{2, 3, 150, 130}, {1, 3, 1, 130}, {2, 1, 130, 1}, {1, 2, 40, 150}};
  static const int blocks[][2] = {{16, 16}, {128, 128}, {64, 32}, {100, 60}, {7, 3}};
  IrVal params[1] = {ir_vi(a->param)};
  for (int s = 0; s < 4; s++) {
    const int *sh = shapes[s];
    int32_t sizes[SZ_COUNT] = {sh[0], sh[1], sh[1], sh[2], sh[3]};
    IrIntervalEnv env = {params, sizes, NULL};
    for (int bsz = 0; bsz < 5; bsz++) {
      RtMaskShape ms = {sh[0], sh[1], sh[2], sh[3], blocks[bsz][0], blocks[bsz][1], 0, 0};
      RtBlockMask an, dense;
      ck_assert_msg(rt_block_mask_build(&an, k->mod, &env, &ms, RT_MASK_ANALYSIS, NULL) == FLEX_OK, "%s", flex_last_error());
      ck_assert_msg(rt_block_mask_build(&dense, k->mod, &env, &ms, RT_MASK_DENSE, NULL) == FLEX_OK, "%s", flex_last_error());
      ck_assert_int_eq(an.B, dense.B);
      ck_assert_int_eq(an.H, dense.H);
      uint8_t *ca = classes(&an), *cd = classes(&dense);
      size_t n = (size_t)an.B * an.H * an.nq * an.nkv;
      for (size_t i = 0; i < n; i++)
        ck_assert_msg(ca[i] == 2 || ca[i] == cd[i],
                      "%s (param %d) shape %d,%d,%d,%d blocks %dx%d: block %zu is %d by analysis, "
                      "%d by evaluation", a->src, a->param, sh[0], sh[1], sh[2], sh[3],
                      blocks[bsz][0], blocks[bsz][1], i, ca[i], cd[i]);
      free(ca), free(cd);
      rt_block_mask_free(&an), rt_block_mask_free(&dense);
    }
  }
  flex_kernel_free(k);
}
END_TEST

/* A join of +0.0 and -0.0 is not one signed zero: the block is partial. Which
 * zero fmin/fmax return on a tie is up to libm and the compiler, so the
 * range must keep both signs for any of them (1.0 / x tells them apart). */
START_TEST(signed_zero_join) {
  const char *srcs[] = {"mask m(b, h, q, kv) { return 1.0 / where(q > kv, 0.0, -0.0) > 0.0; }",
                        "mask m(b, h, q, kv) { return 1.0 / where(q <= kv, -0.0, 0.0) > 0.0; }"};
  for (int s = 0; s < 2; s++) {
    flex_kernel *k;
    ck_assert_int_eq(flex_kernel_from_source(&k, "z.score", srcs[s], strlen(srcs[s]), NULL), FLEX_OK);
    const IrFunc *f = k->mod->mask;
    IrAbs args[ARG_COUNT], vals[64];
    memset(args, 0, sizeof args);
    args[ARG_Q].hi = args[ARG_KV].hi = 15;
    ck_assert_int_le(f->n, 64);
    static const IrIntervalEnv none;
    ir_interval_eval(k->mod, f, &none, args, vals);
    int sel = -1;
    for (int i = 0; i <= f->ret; i++)
      if (f->inst[i].op == IR_SELECT) sel = i;
    ck_assert_int_ge(sel, 0);
    ck_assert_msg(signbit(vals[sel].flo) && !signbit(vals[sel].fhi), "%s: select range [%g, %g]",
                  srcs[s], vals[sel].flo, vals[sel].fhi);
    ck_assert_int_eq(ir_interval_mask(k->mod, NULL, 0, 0, 0, 0, 0, 15, 0, 15), FLEX_BLOCK_PARTIAL);
    ck_assert_int_eq(ir_interval_mask(k->mod, NULL, 0, 0, 0, 0, 16, 31, 0, 15), FLEX_BLOCK_FULL);
    ck_assert_int_eq(ir_interval_mask(k->mod, NULL, 0, 0, 0, 0, 0, 15, 16, 31), FLEX_BLOCK_EMPTY);
    flex_kernel_free(k);
  }
}
END_TEST

/* ---- the shared integer rules, by brute force ---------------------------------- */

/* An endpoint near 0 or the ends of the i32 range, or anywhere. */
static int64_t pick(uint64_t *rng) {
  static const int64_t sp[] = {INT32_MIN, INT32_MIN + 1, INT32_MAX, INT32_MAX - 1, 0, 1, -1, 2, -2, 64, -64, 7};
  int64_t v;
  switch (tl_rand(rng) % 4) {
  case 0: v = sp[tl_rand(rng) % 12]; break;
  case 1: v = (int64_t)(tl_rand(rng) % 41) - 20; break;
  case 2: v = sp[tl_rand(rng) % 12] + (int64_t)(tl_rand(rng) % 7) - 3; break;
  default: v = (int32_t)tl_rand(rng); break;
  }
  return v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v;
}

static FlexIvI rand_iv(uint64_t *rng) {
  int64_t lo = pick(rng), hi = lo + (int64_t)(tl_rand(rng) % (tl_rand(rng) % 2 ? 4 : 40));
  FlexIvI r = {lo, hi > INT32_MAX ? INT32_MAX : hi};
  return r;
}

/* Every op on every pair of values of two small ranges lands in the result. */
START_TEST(int_rules_brute_force) {
  uint64_t rng = tl_seed();
  for (int it = 0; it < 40000; it++) {
    FlexIvI x = rand_iv(&rng), y = rand_iv(&rng);
    int op = (int)(tl_rand(&rng) % 20);
    FlexIvI r = {0, 0};
    FlexIvB rb = {true, true};
    switch (op) {
    case 0: r = flex_iv_add(x, y); break;
    case 1: r = flex_iv_sub(x, y); break;
    case 2: r = flex_iv_mul(x, y); break;
    case 3: r = flex_iv_div(x, y); break;
    case 4: r = flex_iv_mod(x, y); break;
    case 5: r = flex_iv_neg(x); break;
    case 6: r = flex_iv_iabs(x); break;
    case 7: r = flex_iv_imin(x, y); break;
    case 8: r = flex_iv_imax(x, y); break;
    case 9: rb = flex_iv_lt(x, y); break;
    case 10: rb = flex_iv_le(x, y); break;
    case 11: rb = flex_iv_eq(x, y); break;
    case 12: r = flex_iv_band(x, y); break;
    case 13: r = flex_iv_bor(x, y); break;
    case 14: r = flex_iv_bxor(x, y); break;
    case 15: r = flex_iv_shl(x, y); break;
    case 16: r = flex_iv_shr(x, y); break;
    case 17: r = flex_iv_floordiv(x, y); break;
    case 18: r = flex_iv_floormod(x, y); break;
    default: r = flex_iv_bnot(x); break;
    }
    for (int64_t a = x.lo; a <= x.hi; a++)
      for (int64_t b = y.lo; b <= y.hi; b++) {
        int32_t A = (int32_t)a, Bv = (int32_t)b;
        int64_t v = 0;
        bool bv = false;
        switch (op) {
        case 0: v = flex_iadd(A, Bv); break;
        case 1: v = flex_isub(A, Bv); break;
        case 2: v = flex_imul(A, Bv); break;
        case 3: v = flex_idiv(A, Bv); break;
        case 4: v = flex_imod(A, Bv); break;
        case 5: v = flex_ineg(A); break;
        case 6: v = flex_iabs(A); break;
        case 7: v = A < Bv ? A : Bv; break;
        case 8: v = A > Bv ? A : Bv; break;
        case 9: bv = A < Bv; break;
        case 10: bv = A <= Bv; break;
        case 11: bv = A == Bv; break;
        case 12: v = A & Bv; break;
        case 13: v = A | Bv; break;
        case 14: v = A ^ Bv; break;
        case 15: v = flex_shl(A, Bv); break;
        case 16: v = flex_shr(A, Bv); break;
        case 17: v = flex_floordiv(A, Bv); break;
        case 18: v = flex_floormod(A, Bv); break;
        default: v = ~A; break;
        }
        bool ok = op >= 9 && op <= 11 ? (bv ? rb.may_true : rb.may_false) : v >= r.lo && v <= r.hi;
        ck_assert_msg(ok, "op %d on [%lld, %lld], [%lld, %lld] at %d, %d: %lld outside [%lld, %lld]",
                      op, (long long)x.lo, (long long)x.hi, (long long)y.lo, (long long)y.hi, A, Bv,
                      (long long)v, (long long)r.lo, (long long)r.hi);
      }
  }
}
END_TEST

/* The bitwise rules are exact: both ends of the bound are attained (Hacker's
 * Delight 4-3, over each sign class); the shift and floor rules are exact
 * for one shift count and for one positive divisor within one period. */
START_TEST(bit_rules_exact) {
  uint64_t rng = tl_seed();
  for (int it = 0; it < 20000; it++) {
    FlexIvI x = rand_iv(&rng), y = rand_iv(&rng);
    int op = (int)(tl_rand(&rng) % 5);
    if (op >= 3) { /* one count in 0..31, or one divisor in 1..64 within one period */
      y.lo = y.hi = op == 3 ? (int64_t)(tl_rand(&rng) % 32) : 1 + (int64_t)(tl_rand(&rng) % 64);
      int64_t end = (x.lo - flex_floormod((int32_t)x.lo, (int32_t)y.lo)) + y.lo - 1; /* of x.lo's period */
      if (op == 4 && x.hi > end) x.hi = end;
    }
    FlexIvI r = op == 0 ? flex_iv_band(x, y) : op == 1 ? flex_iv_bor(x, y) : op == 2 ? flex_iv_bxor(x, y)
              : op == 3 ? flex_iv_shr(x, y) : flex_iv_floormod(x, y);
    bool lo = false, hi = false;
    for (int64_t a = x.lo; a <= x.hi; a++)
      for (int64_t b = y.lo; b <= y.hi; b++) {
        int32_t A = (int32_t)a, Bv = (int32_t)b;
        int64_t v = op == 0 ? A & Bv : op == 1 ? A | Bv : op == 2 ? A ^ Bv
                  : op == 3 ? flex_shr(A, Bv) : flex_floormod(A, Bv);
        lo |= v == r.lo;
        hi |= v == r.hi;
      }
    ck_assert_msg(lo && hi, "op %d on [%lld, %lld], [%lld, %lld]: [%lld, %lld] is not attained", op,
                  (long long)x.lo, (long long)x.hi, (long long)y.lo, (long long)y.hi,
                  (long long)r.lo, (long long)r.hi);
  }
}
END_TEST

/* ---- a caller's BlockMask with huge blocks -------------------------------------- */

enum { QL = 150, KL = 100, E = 16 };
#define HUGE_BLOCK (2147483647 - 127) /* a multiple of 128 close to INT_MAX */

/* One block of HUGE_BLOCK covers everything: the counts are 1 x 1 (a
 * wrapped ceil(len / block) gave 0 and let an empty mask through), and the
 * emulator walking it matches the reference. */
START_TEST(user_mask_huge_block) {
  RtMaskShape s = {1, 1, QL, KL, HUGE_BLOCK, HUGE_BLOCK, 0, 0};
  int32_t num[1] = {1}, idx[1] = {0};
  int64_t s3[3] = {1, 1, 1}, s4[4] = {1, 1, 1, 1}, z3[3] = {1, 1, 0}, z4[4] = {1, 1, 0, 1};
  DLTensor t[2] = {{.data = num, .device = {kDLCPU, 0}, .ndim = 3, .dtype = rt_dtype(kDLInt, 32), .shape = s3},
                   {.data = idx, .device = {kDLCPU, 0}, .ndim = 4, .dtype = rt_dtype(kDLInt, 32), .shape = s4}};
  flex_block_mask u = {HUGE_BLOCK, HUGE_BLOCK, &t[0], &t[1], NULL, NULL, NULL, NULL, NULL, NULL};
  RtBlockMask bm;
  ck_assert_msg(rt_block_mask_from_user(&bm, &u, &s) == FLEX_OK, "%s", flex_last_error());
  ck_assert_int_eq(bm.nq, 1);
  ck_assert_int_eq(bm.nkv, 1);
  ck_assert_int_eq(bm.kv_num_blocks[0], 1);
  rt_block_mask_free(&bm);
  t[0].shape = z3, t[1].shape = z4; /* zero blocks a side: refused */
  ck_assert_int_eq(rt_block_mask_from_user(&bm, &u, &s), FLEX_ERR_INVALID);
  t[0].shape = s3, t[1].shape = s4;
  /* Blocks of 1 x 1 over 2^20 x 2^20: a few small lists, a grid of 2^40
   * cells: refused with the figures instead of aborting on the allocation. */
  RtMaskShape tiny = {1, 1, 1 << 20, 1 << 20, 1, 1, 0, 0};
  int64_t w3[3] = {1, 1, 1 << 20}, w4[4] = {1, 1, 1 << 20, 1};
  int32_t *wnum = calloc((size_t)1 << 20, sizeof *wnum), *widx = calloc((size_t)1 << 20, sizeof *widx);
  DLTensor wt[2] = {{.data = wnum, .device = {kDLCPU, 0}, .ndim = 3, .dtype = rt_dtype(kDLInt, 32), .shape = w3},
                    {.data = widx, .device = {kDLCPU, 0}, .ndim = 4, .dtype = rt_dtype(kDLInt, 32), .shape = w4}};
  flex_block_mask wu = {1, 1, &wt[0], &wt[1], NULL, NULL, NULL, NULL, NULL, NULL};
  ck_assert_int_eq(rt_block_mask_from_user(&bm, &wu, &tiny), FLEX_ERR_INVALID);
  ck_assert_msg(strstr(flex_last_error(), "more than half"), "%s", flex_last_error());
  free(wnum), free(widx);

  const char *src = "mask m(b, h, q, kv) { return q >= kv; }";
  flex_kernel *k;
  ck_assert_int_eq(flex_kernel_from_source(&k, "huge.score", src, strlen(src), NULL), FLEX_OK);
  uint64_t rng = tl_seed();
  DLDataType f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  int64_t sq[4] = {1, 1, QL, E}, sk[4] = {1, 1, KL, E}, sl[3] = {1, 1, QL};
  TlArr q, kk, v, out[2], lse[2];
  tl_arr_init(&q, f32, 4, sq), tl_arr_normal(&q, &rng);
  tl_arr_init(&kk, f32, 4, sk), tl_arr_normal(&kk, &rng);
  tl_arr_init(&v, f32, 4, sk), tl_arr_normal(&v, &rng);
  for (int i = 0; i < 2; i++) {
    tl_arr_init(&out[i], i ? f64 : f32, 4, sq), tl_arr_poison(&out[i]);
    tl_arr_init(&lse[i], i ? f64 : f32, 3, sl), tl_arr_poison(&lse[i]);
    flex_args a = {0};
    a.backend = i ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
    a.q = &q.t, a.k = &kk.t, a.v = &v.t, a.out = &out[i].t, a.lse = &lse[i].t;
    a.block_mask = i ? NULL : &u;
    ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "%s: %s", i ? "reference" : "emu", flex_last_error());
  }
  double eo = tl_rel_err(&out[0].a, &out[1].a), el = tl_rel_err(&lse[0].a, &lse[1].a);
  fprintf(stderr, "  huge user block: out %.2g lse %.2g\n", eo, el);
  ck_assert(eo <= tl_dtypes[0].tol && el <= tl_dtypes[0].tol);
  TlArr *all[] = {&q, &kk, &v, &out[0], &out[1], &lse[0], &lse[1]};
  for (int i = 0; i < 7; i++) tl_arr_free(all[i]);
  flex_kernel_free(k);
}
END_TEST

/* A caller's BlockMask is part of the semantics on every backend, as in
 * PyTorch: a block it omits is masked even where the mask allows it, and
 * a block it calls full is kept even where the mask says no. The reference
 * and the emulator, given the same odd BlockMask for a causal mask, agree
 * forward and backward, and differ from plain causal attention. */
START_TEST(user_mask_semantics) {
  enum { L = 256, D = 32 };
  const char *src = "mask m(b, h, q, kv) { return q >= kv; }";
  flex_kernel *k;
  ck_assert_int_eq(flex_kernel_from_source(&k, "sem.score", src, strlen(src), NULL), FLEX_OK);
  /* 128 x 128 blocks: row 0 lists block 0 as full (the upper triangle of
   * the diagonal block is kept); row 1 lists block 1 only (block 0, all
   * allowed by causality, is left out). */
  int32_t num[2] = {0, 1}, idx[4] = {0, 0, 1, 0}, fnum[2] = {1, 0}, fidx[4] = {0, 0, 0, 0};
  int64_t s3[3] = {1, 1, 2}, s4[4] = {1, 1, 2, 2};
  DLDataType i32 = rt_dtype(kDLInt, 32);
  DLTensor t[4] = {{.data = num, .device = {kDLCPU, 0}, .ndim = 3, .dtype = i32, .shape = s3},
                   {.data = idx, .device = {kDLCPU, 0}, .ndim = 4, .dtype = i32, .shape = s4},
                   {.data = fnum, .device = {kDLCPU, 0}, .ndim = 3, .dtype = i32, .shape = s3},
                   {.data = fidx, .device = {kDLCPU, 0}, .ndim = 4, .dtype = i32, .shape = s4}};
  flex_block_mask u = {128, 128, &t[0], &t[1], &t[2], &t[3], NULL, NULL, NULL, NULL};
  uint64_t rng = tl_seed();
  DLDataType f32 = rt_dtype(kDLFloat, 32), f64 = rt_dtype(kDLFloat, 64);
  int64_t sq[4] = {1, 1, L, D}, sl[3] = {1, 1, L};
  TlArr q, kk, v, dout, out[3], lse[3], dq[3], dk[3], dv[3];
  tl_arr_init(&q, f32, 4, sq), tl_arr_normal(&q, &rng);
  tl_arr_init(&kk, f32, 4, sq), tl_arr_normal(&kk, &rng);
  tl_arr_init(&v, f32, 4, sq), tl_arr_normal(&v, &rng);
  tl_arr_init(&dout, f32, 4, sq), tl_arr_normal(&dout, &rng);
  for (int i = 0; i < 3; i++) { /* emu with the mask, reference with it, reference without */
    DLDataType o = i ? f64 : f32;
    tl_arr_init(&out[i], o, 4, sq), tl_arr_init(&lse[i], o, 3, sl);
    tl_arr_init(&dq[i], o, 4, sq), tl_arr_init(&dk[i], o, 4, sq), tl_arr_init(&dv[i], o, 4, sq);
    TlArr *outs[] = {&out[i], &lse[i], &dq[i], &dk[i], &dv[i]};
    for (int j = 0; j < 5; j++) tl_arr_poison(outs[j]);
    flex_args a = {0};
    a.backend = i ? FLEX_BACKEND_REFERENCE : FLEX_BACKEND_EMU;
    a.q = &q.t, a.k = &kk.t, a.v = &v.t, a.out = &out[i].t, a.lse = &lse[i].t;
    a.dout = &dout.t, a.dq = &dq[i].t, a.dk = &dk[i].t, a.dv = &dv[i].t;
    a.block_mask = i < 2 ? &u : NULL;
    ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "run %d: %s", i, flex_last_error());
    ck_assert_msg(flex_backward(k, &a) == FLEX_OK, "run %d: %s", i, flex_last_error());
  }
  TlArr *res[5][3] = {{&out[0], &out[1], &out[2]}, {&lse[0], &lse[1], &lse[2]},
                      {&dq[0], &dq[1], &dq[2]}, {&dk[0], &dk[1], &dk[2]}, {&dv[0], &dv[1], &dv[2]}};
  const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
  for (int j = 0; j < 5; j++) {
    double e = tl_rel_err(&res[j][0]->a, &res[j][1]->a), plain = tl_rel_err(&res[j][2]->a, &res[j][1]->a);
    fprintf(stderr, "  user BlockMask %s: emu vs reference %.2g; plain causal differs by %.2g\n", names[j],
            e, plain);
    ck_assert_msg(e <= (j < 2 ? tl_dtypes[0].tol : tl_dtypes[0].gtol), "%s: %g", names[j], e);
    ck_assert_msg(plain > 0.05, "%s: the BlockMask changed nothing (%g)", names[j], plain);
  }
  TlArr *all[] = {&q, &kk, &v, &dout};
  for (int i = 0; i < 4; i++) tl_arr_free(all[i]);
  for (int j = 0; j < 5; j++)
    for (int i = 0; i < 3; i++) tl_arr_free(res[j][i]);
  flex_kernel_free(k);
}
END_TEST

/* `flexc mask --out` creates a missing directory, as `flexc run --out` does. */
START_TEST(cli_out_dir_created) {
  char dir[] = "/tmp/flexc_maskauditXXXXXX", sub[4200], cmd[8400], p[4300];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(sub, sizeof sub, "%s/new/deeper", dir);
  snprintf(cmd, sizeof cmd, "%s mask %s --shape 1,1,300,200 --block-size 64,32 --out %s", tl_flexc(),
           tl_src_path("samples/causal.score"), sub);
  Buf out = {0};
  ck_assert_int_eq(tl_run(cmd, &out), 0);
  buf_free(&out);
  const char *names[] = {"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                         "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"};
  for (int i = 0; i < 8; i++) {
    snprintf(p, sizeof p, "%s/%s.npy", sub, names[i]);
    FILE *f = fopen(p, "rb");
    ck_assert_msg(f != NULL, "%s missing", p);
    fclose(f);
    remove(p);
  }
  remove(sub);
  snprintf(p, sizeof p, "%s/new", dir);
  remove(p);
  remove(dir);
}
END_TEST

int main(void) {
  return TL_MAIN("mask_audit", 60, TL_LOOP(adversarial_sound, NADV), TL_TEST(signed_zero_join),
                 TL_TEST(int_rules_brute_force), TL_TEST(bit_rules_exact), TL_TEST(user_mask_huge_block),
                 TL_TEST(user_mask_semantics), TL_TEST(cli_out_dir_created));
}
