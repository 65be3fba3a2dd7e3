/* Interval analysis: soundness on random masks and rectangles, exactness on
 * the mask families users write (causal, lower-right causal, sliding
 * windows, prefix LM, dilated, 2-D neighbourhoods, documents). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interval.h"
#include "runtime/rt.h"
#include "testlib.h"

enum { T = 96 }; /* length of the test buffers (and Q_LEN, KV_LEN in the fuzz) */

/* A compiled mask with everything it reads bound. */
typedef struct Fixture {
  flex_kernel *k;
  IrVal params[8];
  int32_t sizes[16];
  IrBufView bufs[4];
  int32_t doc[T], w[T]; /* `sorted` document ids; unsorted values */
  IrIntervalEnv ienv;
  IrEnv env;
  IrVal *vals;
} Fixture;

/* Compile text; bind params (defaults, or `pv` for an int param named P),
 * sizes and the buffers doc (sorted) and w. NULL when it does not compile. */
static Fixture *fixture(const char *text, int B, int H, int QL, int KL, uint64_t *rng) {
  Fixture *fx = calloc(1, sizeof *fx);
  if (flex_kernel_from_source(&fx->k, "t.score", text, strlen(text), NULL) != FLEX_OK) {
    fprintf(stderr, "does not compile: %s\n%s\n", text, flex_last_error());
    free(fx);
    return NULL;
  }
  const IrModule *m = fx->k->mod;
  ck_assert_int_le(m->nparams, 8);
  ck_assert_int_le(m->nsizes, 16);
  for (int i = 0; i < m->nparams; i++)
    fx->params[i] = m->params[i].has_default ? m->params[i].def
                    : m->params[i].type == IT_F32 ? ir_vf(1.5) : ir_vi(5);
  int32_t pre[SZ_COUNT] = {B, H, H, QL, KL};
  for (int i = 0; i < m->nsizes; i++) fx->sizes[i] = i < SZ_COUNT ? pre[i] : T;
  int id = (int)(tl_rand(rng) % 3);
  for (int i = 0; i < T; i++) {
    /* Random document lengths, after a first document of 24 tokens so that
     * every tiling the exactness tests use has a full block. */
    if (i >= 24 && tl_rand(rng) % 7 == 0) id++;
    fx->doc[i] = id;
    fx->w[i] = (int32_t)(tl_rand(rng) % 41) - 20;
  }
  ck_assert_int_le(m->nbuffers, 4);
  for (int i = 0; i < m->nbuffers; i++) {
    IrBufView *bv = &fx->bufs[i];
    bv->data = m->buffers[i].sorted ? fx->doc : fx->w;
    bv->dtype = DT_I32;
    bv->ndims = 1;
    bv->shape[0] = T;
    bv->strides[0] = 1;
  }
  fx->ienv = (IrIntervalEnv){fx->params, fx->sizes, fx->bufs};
  fx->env.params = fx->params;
  fx->env.sizes = fx->sizes;
  fx->env.bufs = fx->bufs;
  fx->env.mod = m;
  fx->vals = calloc((size_t)m->mask->n, sizeof *fx->vals);
  return fx;
}

static void fixture_free(Fixture *fx) {
  flex_kernel_free(fx->k);
  free(fx->vals);
  free(fx);
}

/* The truth over a rectangle, by evaluating every element. */
static FlexBlockClass brute(Fixture *fx, const int *r) {
  bool t = false, f = false;
  for (int b = r[0]; b <= r[1]; b++)
    for (int h = r[2]; h <= r[3]; h++)
      for (int q = r[4]; q <= r[5]; q++)
        for (int kv = r[6]; kv <= r[7]; kv++) {
          fx->env.args[ARG_B] = ir_vi(b);
          fx->env.args[ARG_H] = ir_vi(h);
          fx->env.args[ARG_Q] = ir_vi(q);
          fx->env.args[ARG_KV] = ir_vi(kv);
          if (ir_eval(fx->k->mod->mask, &fx->env, fx->vals).b) t = true;
          else f = true;
        }
  return t && f ? FLEX_BLOCK_PARTIAL : t ? FLEX_BLOCK_FULL : FLEX_BLOCK_EMPTY;
}

static FlexBlockClass analyse(Fixture *fx, const int *r) {
  return ir_interval_mask(fx->k->mod, &fx->ienv, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
}

/* ---- random masks ------------------------------------------------------------ */

static void gen_int(Buf *o, uint64_t *rng, int depth);

static void gen_float(Buf *o, uint64_t *rng, int depth) {
  int k = depth <= 0 ? (int)(tl_rand(rng) % 2) : (int)(tl_rand(rng) % 6);
  switch (k) {
  case 0: buf_printf(o, "%d.5", (int)(tl_rand(rng) % 20) - 10); break;
  case 1: buf_puts(o, "float("); gen_int(o, rng, depth - 1); buf_puts(o, ")"); break;
  case 2: case 3: {
    static const char *ops[] = {"+", "-", "*", "/"};
    buf_puts(o, "(");
    gen_float(o, rng, depth - 1);
    buf_printf(o, " %s ", ops[tl_rand(rng) % 4]);
    gen_float(o, rng, depth - 1);
    buf_puts(o, ")");
    break;
  }
  default: {
    static const char *fns[] = {"tanh", "exp", "sqrt", "log", "floor", "abs", "sin", "erf"};
    buf_printf(o, "%s(", fns[tl_rand(rng) % 8]);
    gen_float(o, rng, depth - 1);
    buf_puts(o, ")");
  }
  }
}

static void gen_bool(Buf *o, uint64_t *rng, int depth);

static void gen_int(Buf *o, uint64_t *rng, int depth) {
  static const char *leaves[] = {"q", "kv", "b", "h", "Q_LEN", "KV_LEN", "P"};
  int k = depth <= 0 ? (int)(tl_rand(rng) % 3) : (int)(tl_rand(rng) % 15);
  switch (k) {
  case 0: buf_puts(o, leaves[tl_rand(rng) % 7]); break;
  case 1: buf_puts(o, tl_rand(rng) % 2 ? "q" : "kv"); break;
  case 2: buf_printf(o, "%d", (int)(tl_rand(rng) % 49) - 8); break;
  case 3: case 4: case 5: {
    static const char *ops[] = {"+", "-", "*", "/", "%", "+", "-", "&", "|", "^", "<<", ">>"};
    const char *op = ops[tl_rand(rng) % 12];
    buf_puts(o, "(");
    gen_int(o, rng, depth - 1);
    buf_printf(o, " %s ", op);
    bool div = op[0] == '/' || op[0] == '%';
    uint64_t pick = tl_rand(rng) % 4;
    if (div && pick == 0) buf_printf(o, "%d", (int)(tl_rand(rng) % 9) + 2);
    else if (div && pick == 1) /* a divisor that is zero (and negative) inside the ranges */
      buf_printf(o, "(%s - %d)", (const char *[]){"q", "kv", "h", "b"}[tl_rand(rng) % 4],
                 (int)(tl_rand(rng) % 3));
    else gen_int(o, rng, depth - 1);
    buf_puts(o, ")");
    break;
  }
  case 6: {
    static const char *fns[] = {"min", "max"};
    buf_printf(o, "%s(", fns[tl_rand(rng) % 2]);
    gen_int(o, rng, depth - 1);
    buf_puts(o, ", ");
    gen_int(o, rng, depth - 1);
    buf_puts(o, ")");
    break;
  }
  case 7: buf_puts(o, "abs("); gen_int(o, rng, depth - 1); buf_puts(o, ")"); break;
  case 8:
    buf_printf(o, "%s[clamp(", tl_rand(rng) % 2 ? "doc" : "w");
    gen_int(o, rng, depth - 1);
    buf_printf(o, ", 0, %d)]", T - 1);
    break;
  case 9: buf_puts(o, "int("); gen_float(o, rng, depth - 1); buf_puts(o, ")"); break;
  case 10: {
    buf_printf(o, "%s(", tl_rand(rng) % 2 ? "floordiv" : "floormod");
    gen_int(o, rng, depth - 1);
    buf_puts(o, ", ");
    if (tl_rand(rng) % 2) buf_printf(o, "%d", (int)(tl_rand(rng) % 19) - 9);
    else gen_int(o, rng, depth - 1);
    buf_puts(o, ")");
    break;
  }
  case 11: buf_puts(o, "~"); gen_int(o, rng, depth - 1); break;
  case 12: /* sum: unrolled in the IR, its index a constant per term (named by depth: nested sums differ) */
    buf_printf(o, "sum(j%d, %d, %d, (", depth, (int)(tl_rand(rng) % 3), 2 + (int)(tl_rand(rng) % 3));
    gen_int(o, rng, depth - 1);
    if (tl_rand(rng) % 2) buf_printf(o, " >> j%d) & 1)", depth);
    else buf_printf(o, ") * j%d - j%d)", depth, depth);
    break;
  case 13: /* helpers of the fuzz prefix, inlined */
    buf_printf(o, "%s(", tl_rand(rng) % 2 ? "mix" : "lowbits");
    gen_int(o, rng, depth - 1);
    buf_puts(o, ", ");
    gen_int(o, rng, depth - 1);
    buf_puts(o, ")");
    break;
  default:
    buf_puts(o, "(");
    gen_bool(o, rng, depth - 1);
    buf_puts(o, " ? ");
    gen_int(o, rng, depth - 1);
    buf_puts(o, " : ");
    gen_int(o, rng, depth - 1);
    buf_puts(o, ")");
  }
}

static void gen_bool(Buf *o, uint64_t *rng, int depth) {
  static const char *cmps[] = {"<", "<=", ">", ">=", "==", "!="};
  int k = depth <= 0 ? 0 : (int)(tl_rand(rng) % 7);
  if (k <= 2) {
    bool fl = tl_rand(rng) % 5 == 0;
    (fl ? gen_float : gen_int)(o, rng, depth - 1);
    buf_printf(o, " %s ", cmps[tl_rand(rng) % 6]);
    (fl ? gen_float : gen_int)(o, rng, depth - 1);
  } else if (k == 3) {
    buf_puts(o, "!(");
    gen_bool(o, rng, depth - 1);
    buf_puts(o, ")");
  } else {
    buf_puts(o, "(");
    gen_bool(o, rng, depth - 1);
    static const char *ops[] = {" && ", " || ", " & ", " | ", " ^ "};
    buf_puts(o, k == 4 ? ops[tl_rand(rng) % 5] : " || ");
    gen_bool(o, rng, depth - 1);
    buf_puts(o, ")");
  }
}

/* Whenever the analysis says EMPTY or FULL, every element agrees (the
 * language-2 forms included: bit operations, floordiv and floormod, erf,
 * sum and typed helpers). */
START_TEST(soundness_fuzz) {
  uint64_t rng = tl_seed() ^ 0x1234;
  int compiled = 0, decided = 0, checked = 0;
  for (int iter = 0; iter < 300; iter++) {
    Buf src = {0};
    buf_printf(&src, "param int P = %d;\nbuffer doc: i32[N] sorted;\nbuffer w: i32[N];\n"
                     "int mix(int a, int c) { return (a ^ (c << 1)) - floordiv(c, 3); }\n"
                     "int lowbits(int a, int n) { return a & ((1 << (n & 7)) - 1); }\n"
                     "mask m(b, h, q, kv) { return ",
               (int)(tl_rand(&rng) % 30));
    gen_bool(&src, &rng, 1 + (int)(tl_rand(&rng) % 4));
    buf_puts(&src, "; }\n");
    Fixture *fx = fixture(src.data, 2, 3, T, T, &rng);
    if (fx) {
      compiled++;
      for (int r = 0; r < 30; r++) {
        int q0 = (int)(tl_rand(&rng) % T), k0 = (int)(tl_rand(&rng) % T);
        int q1 = q0 + (int)(tl_rand(&rng) % (uint64_t)(T - q0));
        int k1 = k0 + (int)(tl_rand(&rng) % (uint64_t)(T - k0));
        int b0 = (int)(tl_rand(&rng) % 2), h0 = (int)(tl_rand(&rng) % 3);
        int rect[8] = {b0, b0 + (int)(tl_rand(&rng) % (uint64_t)(2 - b0)), h0,
                       h0 + (int)(tl_rand(&rng) % (uint64_t)(3 - h0)), q0, q1, k0, k1};
        FlexBlockClass a = analyse(fx, rect);
        if (a == FLEX_BLOCK_PARTIAL) continue;
        decided++;
        FlexBlockClass t = brute(fx, rect);
        checked++;
        if (t != a)
          ck_abort_msg("unsound: %s says %s over b[%d,%d] h[%d,%d] q[%d,%d] kv[%d,%d], truth %s",
                       src.data, a == FLEX_BLOCK_FULL ? "FULL" : "EMPTY", rect[0], rect[1], rect[2],
                       rect[3], q0, q1, k0, k1, t == FLEX_BLOCK_FULL ? "FULL" : t == FLEX_BLOCK_EMPTY ? "EMPTY" : "PARTIAL");
      }
      fixture_free(fx);
    }
    buf_free(&src);
  }
  fprintf(stderr, "fuzz: %d masks compiled, %d decided rectangles checked\n", compiled, checked);
  ck_assert_int_ge(compiled, 250);
  ck_assert_int_gt(decided, 100);
}
END_TEST

/* ---- exactness on the families ------------------------------------------------ */

/* Every block of a BQ x BK tiling (partial edges included) classified
 * exactly as the truth; the tiling must have empty and partial blocks, and
 * full ones when need_full. */
static void exact_case_full(const char *text, int QL, int KL, int BQ, int BK, int H,
                            bool need_full) {
  uint64_t rng = tl_seed() ^ 0x77;
  Fixture *fx = fixture(text, 1, H, QL, KL, &rng);
  ck_assert_msg(fx != NULL, "does not compile: %s", text);
  int counts[3] = {0};
  for (int h = 0; h < H; h++)
    for (int q0 = 0; q0 < QL; q0 += BQ)
      for (int k0 = 0; k0 < KL; k0 += BK) {
        int r[8] = {0, 0, h, h, q0, q0 + BQ - 1 < QL - 1 ? q0 + BQ - 1 : QL - 1,
                    k0, k0 + BK - 1 < KL - 1 ? k0 + BK - 1 : KL - 1};
        FlexBlockClass a = analyse(fx, r), t = brute(fx, r);
        counts[t]++;
        ck_assert_msg(a == t, "%s: block q[%d,%d] kv[%d,%d] h %d: analysis %d, truth %d", text,
                      r[4], r[5], r[6], r[7], h, a, t);
      }
  /* The case must exercise all three classes to mean anything. */
  ck_assert_msg(counts[0] && (counts[1] || !need_full) && counts[2], "%s: %d empty %d full %d partial", text,
                counts[0], counts[1], counts[2]);
  fixture_free(fx);
}
static void exact_case(const char *text, int QL, int KL, int BQ, int BK, int H) {
  exact_case_full(text, QL, KL, BQ, BK, H, true);
}


START_TEST(exact_causal) {
  exact_case("mask m(b, h, q, kv) { return q >= kv; }", 200, 200, 16, 16, 1);
  exact_case("mask m(b, h, q, kv) { return q >= kv; }", 77, 93, 16, 32, 1);
}
END_TEST

START_TEST(exact_lower_right) {
  exact_case("mask m(b, h, q, kv) { return q + (KV_LEN - Q_LEN) >= kv; }", 96, 200, 16, 16, 1);
}
END_TEST

START_TEST(exact_sliding_window) {
  exact_case("param int W = 40;\nmask m(b, h, q, kv) { return q >= kv && q - kv < W; }", 256,
             256, 16, 16, 1);
  exact_case("param int W = 24;\nmask m(b, h, q, kv) { return abs(q - kv) <= W; }", 200, 190, 16,
             8, 1);
}
END_TEST

START_TEST(exact_prefix_lm) {
  exact_case("param int prefix = 40;\nmask m(b, h, q, kv) { return kv < prefix || q >= kv; }",
             192, 192, 16, 16, 1);
}
END_TEST

START_TEST(exact_dilated) {
  exact_case_full("param int d = 4;\nmask m(b, h, q, kv) { return q >= kv && (q - kv) % d == h % d; }",
             128, 128, 16, 16, 4, false);
}
END_TEST

START_TEST(exact_natten) {
  const char *s = "param int width = 8;\nparam int radius = 1;\n"
                  "mask m(b, h, q, kv) { let dr = q / width - kv / width;\n"
                  "  let dc = q % width - kv % width;\n"
                  "  return abs(dr) <= radius && abs(dc) <= radius; }";
  exact_case_full(s, 256, 256, 8, 8, 1, false);
  exact_case_full(s, 256, 256, 32, 16, 1, false);
  const char *wide = "param int width = 8;\nparam int radius = 2;\n"
                     "mask m(b, h, q, kv) { let dr = q / width - kv / width;\n"
                     "  let dc = q % width - kv % width;\n"
                     "  return abs(dr) <= radius && abs(dc) <= radius; }";
  exact_case(wide, 128, 128, 2, 2, 1);
  const char *whole = "param int width = 16;\nparam int radius = 4;\n"
                      "mask m(b, h, q, kv) { let dr = q / width - kv / width;\n"
                      "  let dc = q % width - kv % width;\n"
                      "  return abs(dr) <= radius && abs(dc) <= radius; }";
  exact_case_full(whole, 256, 256, 32, 32, 1, false);
}
END_TEST

START_TEST(exact_document) {
  exact_case("buffer doc: i32[N] sorted;\nmask m(b, h, q, kv) { return doc[q] == doc[kv]; }", T,
             T, 8, 8, 1);
  exact_case("buffer doc: i32[N] sorted;\n"
             "mask m(b, h, q, kv) { return doc[q] == doc[kv] && q >= kv; }", T, T, 4, 8, 1);
}
END_TEST

/* NATTEN over a 32x32 grid stored in Morton (Z) order, written with bit
 * operations: sound on every block, and exact (every empty block found):
 * the deinterleaved coordinates depend on one argument each, so the
 * analysis enumerates them over the block (the per-op bitwise rules alone
 * find none of these blocks: `x | (x >> 1)` loses the correlation). */
START_TEST(morton_natten_skips) {
  const char *s =
      "const R = 2;\n"
      "mask m(b, h, q, kv) {\n"
      "  let qx0 = q & 0x55555555; let qx1 = (qx0 | (qx0 >> 1)) & 0x33333333;\n"
      "  let qx2 = (qx1 | (qx1 >> 2)) & 0x0F0F0F0F; let qx = (qx2 | (qx2 >> 4)) & 0x00FF00FF;\n"
      "  let qy0 = (q >> 1) & 0x55555555; let qy1 = (qy0 | (qy0 >> 1)) & 0x33333333;\n"
      "  let qy2 = (qy1 | (qy1 >> 2)) & 0x0F0F0F0F; let qy = (qy2 | (qy2 >> 4)) & 0x00FF00FF;\n"
      "  let kx0 = kv & 0x55555555; let kx1 = (kx0 | (kx0 >> 1)) & 0x33333333;\n"
      "  let kx2 = (kx1 | (kx1 >> 2)) & 0x0F0F0F0F; let kx = (kx2 | (kx2 >> 4)) & 0x00FF00FF;\n"
      "  let ky0 = (kv >> 1) & 0x55555555; let ky1 = (ky0 | (ky0 >> 1)) & 0x33333333;\n"
      "  let ky2 = (ky1 | (ky1 >> 2)) & 0x0F0F0F0F; let ky = (ky2 | (ky2 >> 4)) & 0x00FF00FF;\n"
      "  return abs(qx - kx) <= R && abs(qy - ky) <= R;\n"
      "}\n";
  uint64_t rng = tl_seed();
  Fixture *fx = fixture(s, 1, 1, 1024, 1024, &rng);
  ck_assert_ptr_nonnull(fx);
  int empty = 0, found = 0;
  for (int q0 = 0; q0 < 1024; q0 += 64)
    for (int k0 = 0; k0 < 1024; k0 += 64) {
      int r[8] = {0, 0, 0, 0, q0, q0 + 63, k0, k0 + 63};
      FlexBlockClass a = analyse(fx, r), t = brute(fx, r);
      ck_assert_msg(a == FLEX_BLOCK_PARTIAL || a == t, "block q %d kv %d: analysis %d, truth %d", q0, k0, a, t);
      empty += t == FLEX_BLOCK_EMPTY;
      found += a == FLEX_BLOCK_EMPTY;
    }
  ck_assert_msg(empty > 0 && found == empty, "%d of %d empty blocks found", found, empty);
  fixture_free(fx);
}
END_TEST

/* decidable: only `sorted` buffers may be read. */
START_TEST(decidable) {
  uint64_t rng = tl_seed();
  Fixture *a = fixture("buffer doc: i32[N] sorted;\nmask m(b, h, q, kv) { return doc[q] == doc[kv]; }",
                       1, 1, T, T, &rng);
  Fixture *b = fixture("buffer w: i32[N];\nmask m(b, h, q, kv) { return w[q] < kv; }", 1, 1, T, T, &rng);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  ck_assert(ir_interval_decidable(a->k->mod));
  ck_assert(!ir_interval_decidable(b->k->mod));
  ck_assert(!ir_interval_uses_arg(a->k->mod, ARG_B));
  ck_assert(ir_interval_uses_arg(a->k->mod, ARG_Q));
  fixture_free(a);
  fixture_free(b);
}
END_TEST

int main(void) {
  return TL_MAIN("interval", 0, TL_TEST(soundness_fuzz), TL_TEST(exact_causal), TL_TEST(exact_lower_right),
                 TL_TEST(exact_sliding_window), TL_TEST(exact_prefix_lm), TL_TEST(exact_dilated),
                 TL_TEST(exact_natten), TL_TEST(morton_natten_skips), TL_TEST(exact_document),
                 TL_TEST(decidable));
}
