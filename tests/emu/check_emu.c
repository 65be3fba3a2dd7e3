/* Emulator suite: hand-written kernels (the .cu files of tests/emu) run through the same
 * compile + launch path as generated code. Positive tests check the
 * emulated instructions against references computed here from the PTX
 * layouts; negative tests plant the bugs a GPU would hit and fail if the
 * emulator does NOT catch them. The kernels are compiled once, before the
 * tests fork, as one plain module and one race-check module. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/emu_host.h"
#include "runtime/npy.h"
#include "testlib.h"
#include "emu_test.h" /* tests/emu/ */

static EmuModule *plain, *racy;
static uint64_t rng;

/* One registered allocation for a launch. */
typedef struct Alloc {
  const char *name;
  const void *p;
  size_t bytes;
} Alloc;

/* Launch `kernel` with params `p`; `msg` (may be NULL) gets the error. */
static flex_status run(EmuModule *m, const char *kernel, const EmuTestParams *p, unsigned grid,
                       unsigned block, size_t smem, const Alloc *a, int na, char *msg) {
  EmuRange r[8];
  for (int i = 0; i < na; i++) r[i] = (EmuRange){(uintptr_t)a[i].p, a[i].bytes, a[i].name};
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = kernel;
  L.params = p;
  L.grid = (EmuDim){grid, 1, 1};
  L.block = (EmuDim){block, 1, 1};
  L.smem_bytes = smem;
  L.ranges = r;
  L.nranges = na;
  flex_status st = emu_module_launch(m, &L, NULL);
  if (msg) snprintf(msg, EMU_ERR_LEN, "%s", L.error);
  if (st != FLEX_OK) fprintf(stderr, "  (launch of %s: %s)\n", kernel, L.error);
  return st;
}

static float *poisoned(size_t n) {
  float *x = malloc(n * sizeof *x);
  memset(x, 0xA5, n * sizeof *x);
  return x;
}

static float *randoms(size_t n) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = (float)tl_normal(&rng) + 0.25f;
  return x;
}

/* |x - ref| / |ref| over n values; NaN on either side or an all-zero
 * reference gives infinity. */
static double rel_err(const float *x, const double *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(x[i]) || isnan(ref[i])) return INFINITY;
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  double e = den > 0 ? sqrt(num) / sqrt(den) : INFINITY;
  return isnan(e) ? INFINITY : e;
}

/* ---- reduction and shared-memory bugs ----------------------------------- */

/* Run emu_t_reduce over 3 blocks; returns the relative error of the sums. */
static double reduce_err(EmuModule *m, int mode, char *msg, flex_status *st) {
  float *in = randoms(3072), *out = poisoned(3), *out2 = poisoned(384);
  EmuTestParams p = {.in = in, .out = out, .out2 = out2, .mode = mode};
  Alloc a[] = {{"in", in, 3072 * 4}, {"out", out, 3 * 4}, {"out2", out2, 384 * 4}};
  *st = run(m, "emu_t_reduce", &p, 3, 128, 64, a, 3, msg);
  double ref[3] = {0};
  for (int i = 0; i < 3072; i++) ref[i / 1024] += in[i];
  double err = rel_err(out, ref, 3);
  for (int i = 0; *st == FLEX_OK && i < 384; i++) {
    int b = i / 128, t = i % 128, src = (t & ~31) | ((t + 1) & 31);
    ck_assert_msg(out2[i] == in[b * 1024 + src], "shfl broadcast wrong at %d", i);
  }
  free(in), free(out), free(out2);
  return err;
}

/* ---- block order ------------------------------------------------------------- */

/* The start position of each of `n` blocks, one OS thread, under `shuffle`. */
static void block_order(uint64_t shuffle, unsigned n, float *pos) {
  float counter = 0;
  EmuTestParams p = {.out = pos, .out2 = &counter};
  EmuRange r[2] = {{(uintptr_t)pos, n * sizeof *pos, "pos"}, {(uintptr_t)&counter, sizeof counter, "counter"}};
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = "emu_t_order";
  L.params = &p;
  L.grid = (EmuDim){n, 1, 1};
  L.block = (EmuDim){32, 1, 1};
  L.ranges = r;
  L.nranges = 2;
  L.threads = 1;
  L.shuffle = shuffle;
  ck_assert_msg(emu_module_launch(plain, &L, NULL) == FLEX_OK, "%s", L.error);
  ck_assert(counter == (float)n);
}

/* Blocks start in launch order, or under a seed in a permutation of it
 * ($FLEXC_EMU_SHUFFLE): every block once, and not in launch order. */
START_TEST(block_order_shuffled) {
  enum { N = 12 };
  float pos[N];
  block_order(0, N, pos);
  for (int b = 0; b < N; b++) ck_assert_msg(pos[b] == (float)b, "block %d started %g-th", b, pos[b]);
  uint64_t seed = tl_rand(&rng) | 1;
  printf("block order seed %llu\n", (unsigned long long)seed);
  int moved = 0;
  for (int t = 0; t < 4; t++, seed = seed * 6364136223846793005ull + 1442695040888963407ull) {
    block_order(seed, N, pos);
    bool seen[N] = {0};
    for (int b = 0; b < N; b++) {
      int at = (int)pos[b];
      ck_assert_msg(at >= 0 && at < N && pos[b] == (float)at && !seen[at], "not a permutation");
      seen[at] = true;
      moved += at != b;
    }
  }
  ck_assert_msg(moved > 0, "four shuffle seeds all kept launch order");
}
END_TEST

START_TEST(reduce_ok) {
  flex_status st;
  double err = reduce_err(plain, 0, NULL, &st);
  ck_assert_int_eq(st, FLEX_OK);
  ck_assert_msg(err < 1e-4, "reduction error %g", err);
}
END_TEST

START_TEST(reduce_race_free) {
  char msg[EMU_ERR_LEN];
  flex_status st;
  double err = reduce_err(racy, 0, msg, &st);
  ck_assert_msg(st == FLEX_OK, "false race report: %s", msg);
  ck_assert_msg(err < 1e-4, "reduction error %g", err);
}
END_TEST

/* Negative: no __syncthreads between the partials' write and read. */
START_TEST(missing_sync_is_wrong) {
  flex_status st;
  double err = reduce_err(plain, 1, NULL, &st);
  ck_assert_int_eq(st, FLEX_OK);
  ck_assert_msg(!(err < 1e-4), "a missing __syncthreads went unnoticed (error %g)", err);
}
END_TEST

START_TEST(missing_sync_is_a_race) {
  char msg[EMU_ERR_LEN];
  flex_status st;
  reduce_err(racy, 1, msg, &st);
  ck_assert_int_eq(st, FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(msg, "shared memory race") && strstr(msg, "emu_t_reduce"), "got: %s", msg);
}
END_TEST

/* Negative: shared memory nobody wrote reads as poison. */
START_TEST(unwritten_smem_is_poison) {
  float *out = poisoned(64);
  memset(out, 0, 64 * sizeof *out);
  EmuTestParams p = {.out = out};
  Alloc a[] = {{"out", out, 64 * 4}};
  ck_assert_int_eq(run(plain, "emu_t_unwritten", &p, 1, 64, 512, a, 1, NULL), FLEX_OK);
  for (int i = 0; i < 64; i++) ck_assert_msg(isnan(out[i]), "out[%d] = %g is not poison", i, out[i]);
  free(out);
}
END_TEST

/* Negative: i <= n in the tail fires the bounds check; i < n is clean. */
START_TEST(tail_off_by_one) {
  int n = 100;
  float *in = randoms((size_t)n), *out = poisoned((size_t)n);
  EmuTestParams p = {.in = in, .out = out, .n = n};
  Alloc a[] = {{"in", in, (size_t)n * 4}, {"out", out, (size_t)n * 4}};
  ck_assert_int_eq(run(plain, "emu_t_copy", &p, 2, 64, 0, a, 2, NULL), FLEX_OK);
  for (int i = 0; i < n; i++) ck_assert(out[i] == in[i]);
  char msg[EMU_ERR_LEN];
  p.mode = 1;
  ck_assert_int_eq(run(plain, "emu_t_copy", &p, 2, 64, 0, a, 2, msg), FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(msg, "outside every allocation") && strstr(msg, "'in'") &&
                    strstr(msg, "block (1,0,0) thread (36,0,0)"), "got: %s", msg);
  free(in), free(out);
}
END_TEST

/* Negative: a thread that exits before a barrier the others wait at. */
START_TEST(barrier_divergence) {
  float *out = poisoned(64);
  EmuTestParams p = {.out = out, .mode = 1};
  Alloc a[] = {{"out", out, 64 * 4}};
  char msg[EMU_ERR_LEN];
  ck_assert_int_eq(run(plain, "emu_t_diverge", &p, 1, 64, 0, a, 1, msg), FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(msg, "__syncthreads divergence"), "got: %s", msg);
  p.mode = 0;
  ck_assert_int_eq(run(plain, "emu_t_diverge", &p, 1, 64, 0, a, 1, NULL), FLEX_OK);
  free(out);
}
END_TEST

/* __any_sync / __all_sync per warp and __syncthreads_or per block, with
 * the predicate set in one thread of warp 1 (or none). */
START_TEST(votes) {
  const int n = 96;
  float *o1 = poisoned(n), *o2 = poisoned(n), *o3 = poisoned(n);
  Alloc a[3] = {{"out", o1, n * sizeof(float)}, {"out2", o2, n * sizeof(float)},
                {"out3", o3, n * sizeof(float)}};
  for (int mode = -1; mode <= 40; mode += 41) {
    EmuTestParams p = {.out = o1, .out2 = o2, .out3 = o3, .n = n, .mode = mode};
    ck_assert_int_eq(run(plain, "emu_t_vote", &p, 1, n, 0, a, 3, NULL), FLEX_OK);
    for (int t = 0; t < n; t++) {
      const bool in_warp = mode >= 0 && t / 32 == mode / 32;
      ck_assert_msg(o1[t] == (float)in_warp, "any: thread %d mode %d: %g", t, mode, o1[t]);
      ck_assert_msg(o2[t] == (float)!in_warp, "all: thread %d mode %d: %g", t, mode, o2[t]);
      ck_assert_msg(o3[t] == (float)(mode >= 0), "or: thread %d mode %d: %g", t, mode, o3[t]);
    }
  }
  free(o1), free(o2), free(o3);
}
END_TEST

/* ---- fp16 / bf16 ------------------------------------------------------------ */

/* x rounded to nearest even with p significant bits, minimum normal
 * exponent emin and largest finite maxv (above: infinity). */
static double ref_round(double x, int p, int emin, double maxv) {
  if (isnan(x) || isinf(x) || x == 0) return x;
  int e;
  frexp(x, &e);
  int qe = e - p < emin - p + 1 ? emin - p + 1 : e - p;
  double q = ldexp(1.0, qe), r = nearbyint(x / q) * q;
  return fabs(r) > maxv ? copysign(INFINITY, x) : r;
}
static double ref_h(double x) { return ref_round(x, 11, -14, 65504.0); }
static double ref_bf(double x) { return ref_round(x, 8, -126, ldexp(255.0, 120)); }

/* Decode 16-bit patterns with (exponent bits, mantissa bits). */
static double decode16(uint16_t v, int eb, int mb) {
  int bias = (1 << (eb - 1)) - 1, e = (v >> mb) & ((1 << eb) - 1), m = v & ((1 << mb) - 1);
  double s = (v & 0x8000) ? -1 : 1;
  if (e == (1 << eb) - 1) return m ? NAN : s * INFINITY;
  if (e == 0) return s * ldexp(m, 1 - bias - mb);
  return s * ldexp((1 << mb) + m, e - bias - mb);
}

static bool same(double got, double want) {
  if (isnan(want)) return isnan(got);
  return got == want && signbit(got) == signbit(want);
}

START_TEST(conversions) {
  const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65505.0f, 65519.99f, 65520.0f, 65536.0f,
                        1e10f, INFINITY, -INFINITY, NAN, -NAN, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                        0x3p-25f, 0x1p-14f, 0x1p-14f - 0x1p-25f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f,
                        1e-45f, 3.4028235e38f, -3.4028235e38f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f,
                        3.3895314e38f, 0x1p-126f, 0x1p-133f, 0x1p-134f, 0x3p-135f, 0.1f, -2.5e-5f};
  int ne = (int)(sizeof edge / sizeof *edge), n = 65536;
  float *in = malloc((size_t)n * 4), *out3 = poisoned((size_t)n * 2);
  uint16_t *bits = malloc((size_t)n * 2), *h = malloc((size_t)n * 2), *bf = malloc((size_t)n * 2);
  for (int i = 0; i < n; i++) {
    bits[i] = (uint16_t)i;
    uint32_t u = (uint32_t)tl_rand(&rng);
    if (i % 2) u = (u & 0x8fffffffu) | 0x30000000u; /* around the fp16 range */
    memcpy(&in[i], &u, 4);
    if (i < ne) in[i] = edge[i];
  }
  memset(h, 0x5a, (size_t)n * 2), memset(bf, 0x5a, (size_t)n * 2);
  EmuTestParams p = {.in = in, .in2 = bits, .out = h, .out2 = bf, .out3 = out3, .n = n};
  Alloc a[] = {{"in", in, (size_t)n * 4}, {"bits", bits, (size_t)n * 2}, {"h", h, (size_t)n * 2},
               {"bf", bf, (size_t)n * 2}, {"out3", out3, (size_t)n * 8}};
  ck_assert_int_eq(run(plain, "emu_t_convert", &p, 4, 128, 0, a, 5, NULL), FLEX_OK);
  for (int i = 0; i < n; i++) {
    ck_assert_msg(same(decode16(h[i], 5, 10), ref_h(in[i])), "f2h(%a) = 0x%04x", (double)in[i], h[i]);
    ck_assert_msg(same(decode16(bf[i], 8, 7), ref_bf(in[i])), "f2bf(%a) = 0x%04x", (double)in[i], bf[i]);
    ck_assert_msg(same(out3[2 * i], decode16((uint16_t)i, 5, 10)), "h2f(0x%04x) = %a", i, (double)out3[2 * i]);
    ck_assert_msg(same(out3[2 * i + 1], decode16((uint16_t)i, 8, 7)), "bf2f(0x%04x)", i);
  }
  free(in), free(out3), free(bits), free(h), free(bf);
}
END_TEST

/* ---- mma and ldmatrix ----------------------------------------------------------- */

/* Bit patterns of values already representable in fp16 / bf16. */
static uint16_t h_bits(double v) {
  uint16_t s = signbit(v) ? 0x8000 : 0;
  v = fabs(v);
  if (v == 0) return s;
  if (v < 0x1p-14) return (uint16_t)(s | (uint16_t)(v * 0x1p24));
  int e;
  double m = frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
  return (uint16_t)(s | ((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024));
}
static uint16_t bf_bits(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

static void mma_case(int mode) {
  uint16_t A[256], B[128];
  double Av[256], Bv[128];
  float *C = randoms(128), *D = poisoned(128);
  for (int i = 0; i < 256 + 128; i++) {
    double x = tl_normal(&rng);
    double v = mode ? ref_bf(x) : ref_h(x);
    uint16_t b = mode ? bf_bits(v) : h_bits(v);
    if (i < 256) A[i] = b, Av[i] = v;
    else B[i - 256] = b, Bv[i - 256] = v;
  }
  EmuTestParams p = {.in = A, .in2 = B, .in3 = C, .out = D, .mode = mode};
  Alloc a[] = {{"A", A, sizeof A}, {"B", B, sizeof B}, {"C", C, 512}, {"D", D, 512}};
  ck_assert_int_eq(run(plain, "emu_t_mma", &p, 1, 32, 0, a, 4, NULL), FLEX_OK);
  double ref[128];
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 8; c++) {
      ref[r * 8 + c] = C[r * 8 + c];
      for (int k = 0; k < 16; k++) ref[r * 8 + c] += Av[r * 16 + k] * Bv[k * 8 + c];
    }
  double err = rel_err(D, ref, 128);
  ck_assert_msg(err < 1e-4, "mma %s error %g", mode ? "bf16" : "f16", err);
  free(C), free(D);
}

START_TEST(mma_f16) { mma_case(0); }
END_TEST
START_TEST(mma_bf16) { mma_case(1); }
END_TEST

/* Run emu_t_ldmatrix; returns how many registers differ from the layout. */
static int ldmatrix_mismatches(EmuModule *m, int mode) {
  uint16_t in[256];
  uint32_t out[6 * 32 * 4];
  for (int i = 0; i < 256; i++) in[i] = (uint16_t)(tl_rand(&rng) & 0x7fff);
  memset(out, 0xA5, sizeof out);
  EmuTestParams p = {.in = in, .out = out, .mode = mode};
  Alloc a[] = {{"in", in, sizeof in}, {"out", out, sizeof out}};
  ck_assert_int_eq(run(m, "emu_t_ldmatrix", &p, 1, 32, 512, a, 2, NULL), FLEX_OK);
  static const int counts[6] = {1, 2, 4, 1, 2, 4};
  int bad = 0;
  for (int k = 0; k < 6; k++)
    for (int l = 0; l < 32; l++)
      for (int j = 0; j < 4; j++) {
        int g = l / 4, t = l % 4;
        const uint16_t *M = in + j * 64; /* matrix j, row-major 8x8 */
        uint32_t want = 0;
        if (j < counts[k])
          want = k < 3 ? (uint32_t)M[g * 8 + 2 * t] | ((uint32_t)M[g * 8 + 2 * t + 1] << 16)
                       : (uint32_t)M[2 * t * 8 + g] | ((uint32_t)M[(2 * t + 1) * 8 + g] << 16);
        bad += out[(k * 32 + l) * 4 + j] != want;
      }
  return bad;
}

START_TEST(ldmatrix_layouts) {
  ck_assert_int_eq(ldmatrix_mismatches(plain, 0), 0);
  ck_assert_int_eq(ldmatrix_mismatches(racy, 0), 0);
}
END_TEST

/* Negative: row addresses handed out in the wrong order. */
START_TEST(ldmatrix_wrong_layout) { ck_assert_int_gt(ldmatrix_mismatches(plain, 1), 0); }
END_TEST

/* ---- cp.async ---------------------------------------------------------------------- */

static void cpasync_case(EmuModule *m) {
  uint32_t in[512], out[256], out2[256], out3[256];
  for (int i = 0; i < 512; i++) in[i] = (uint32_t)tl_rand(&rng) | 1u;
  memset(out, 0, sizeof out), memset(out2, 0, sizeof out2), memset(out3, 0xA5, sizeof out3);
  EmuTestParams p = {.in = in, .out = out, .out2 = out2, .out3 = out3};
  Alloc a[] = {{"in", in, sizeof in}, {"out", out, sizeof out}, {"out2", out2, sizeof out2},
               {"out3", out3, sizeof out3}};
  char msg[EMU_ERR_LEN];
  ck_assert_msg(run(m, "emu_t_cpasync", &p, 1, 64, 2048, a, 4, msg) == FLEX_OK, "%s", msg);
  for (int i = 0; i < 256; i++) {
    ck_assert_msg(out[i] == in[i], "stage 0 word %d not landed after wait<1>", i);
    ck_assert_msg(out2[i] == 0xffffffffu, "stage 1 word %d visible before its wait", i);
    uint32_t want = (i / 4) % 5 == 0 ? 0 : in[256 + i];
    ck_assert_msg(out3[i] == want, "stage 1 word %d: 0x%08x, want 0x%08x", i, out3[i], want);
  }
}

START_TEST(cp_async_groups) {
  cpasync_case(plain);
  cpasync_case(racy);
}
END_TEST

/* ---- generated kernels against the float64 reference ------------------------------ */

static const char *const sources[] = {
    "score ident(s, b, h, q, kv) { return s; }\n",
    "param float cap = 5.0;\n"
    "score soft(s, b, h, q, kv) { return cap * tanh(s / cap) + 0.01 * float(kv - q); }\n"
    "mask causal(b, h, q, kv) { return q + 3 >= kv; }\n",
};

static void e2e(int si, uint8_t code, uint8_t bits, double tol, double gtol) {
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "e2e.score", sources[si], strlen(sources[si]), NULL) ==
                FLEX_OK, "%s", flex_last_error());
  int B = 1, H = 2, HKV = 1, QL = 19, KL = 23, E = 16;
  int64_t qs[4] = {B, H, QL, E}, ks[4] = {B, HKV, KL, E}, ls[3] = {B, H, QL};
  DLDataType dt = rt_dtype(code, bits), f32 = rt_dtype(kDLFloat, 32);
  TlPair q, kk, v, dout, out, lse, dq, dk, dv;
  tl_pair_init(&q, dt, 4, qs, true, &rng), tl_pair_init(&kk, dt, 4, ks, true, &rng);
  tl_pair_init(&v, dt, 4, ks, true, &rng), tl_pair_init(&dout, dt, 4, qs, true, &rng);
  tl_pair_init(&out, f32, 4, qs, false, &rng), tl_pair_init(&lse, f32, 3, ls, false, &rng);
  tl_pair_init(&dq, f32, 4, qs, false, &rng), tl_pair_init(&dk, f32, 4, ks, false, &rng);
  tl_pair_init(&dv, f32, 4, ks, false, &rng);
  flex_args a, r;
  memset(&a, 0, sizeof a);
  a.backend = FLEX_BACKEND_EMU;
  a.q = &q.tx, a.k = &kk.tx, a.v = &v.tx, a.out = &out.tx, a.lse = &lse.tx, a.dout = &dout.tx;
  a.dq = &dq.tx, a.dk = &dk.tx, a.dv = &dv.tx;
  r = a;
  r.backend = FLEX_BACKEND_REFERENCE;
  r.q = &q.tref, r.k = &kk.tref, r.v = &v.tref, r.out = &out.tref, r.lse = &lse.tref;
  r.dout = &dout.tref, r.dq = &dq.tref, r.dk = &dk.tref, r.dv = &dv.tref;
  ck_assert_msg(flex_forward(k, &r) == FLEX_OK, "reference: %s", flex_last_error());
  ck_assert_msg(flex_backward(k, &r) == FLEX_OK, "reference: %s", flex_last_error());
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "emu forward: %s", flex_last_error());
  ck_assert_msg(flex_backward(k, &a) == FLEX_OK, "emu backward: %s", flex_last_error());
  double eo = tl_pair_err(&out), el = tl_pair_err(&lse);
  double eq = tl_pair_err(&dq), ek = tl_pair_err(&dk), ev = tl_pair_err(&dv);
  fprintf(stderr, "  source %d dtype %d/%d: out %.2g lse %.2g dq %.2g dk %.2g dv %.2g\n", si, code,
          bits, eo, el, eq, ek, ev);
  ck_assert_msg(eo < tol && el < tol, "forward error out %g lse %g", eo, el);
  ck_assert_msg(eq < gtol && ek < gtol && ev < gtol, "gradient error dq %g dk %g dv %g", eq, ek, ev);
  TlPair *all[] = {&q, &kk, &v, &dout, &out, &lse, &dq, &dk, &dv};
  for (int i = 0; i < 9; i++) tl_pair_free(all[i]);
  flex_kernel_free(k);
}

START_TEST(generated_fp32) { e2e(_i, kDLFloat, 32, 1e-4, 1e-3); }
END_TEST
START_TEST(generated_fp16) { e2e(_i, kDLFloat, 16, 5e-3, 2e-2); }
END_TEST
START_TEST(generated_bf16) { e2e(_i, kDLBfloat, 16, 3e-2, 6e-2); }
END_TEST

/* ---- setup --------------------------------------------------------------------------- */

/* All test kernels, after emu_test.h, as one source. */
static char *test_source(void) {
  static const char *files[] = {"tests/emu/emu_test.h", "tests/emu/reduce.cu", "tests/emu/mma.cu",
                                "tests/emu/cpasync.cu", "tests/emu/convert.cu", "tests/emu/order.cu"};
  Buf src = {0};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char *text = NULL;
    size_t len = 0;
    if (base_read_file(tl_src_path(files[i]), &text, &len) != 0) {
      fprintf(stderr, "cannot read %s\n", files[i]);
      exit(EXIT_FAILURE);
    }
    buf_printf(&src, "#line 1 \"%s\"\n", files[i]);
    buf_put(&src, text, len);
    base_free(text);
  }
  return src.data;
}

static EmuModule *build(const char *src, bool race) {
  EmuBuildOpts o = {.racecheck = race};
  Buf log = {0};
  EmuModule *m = NULL;
  if (emu_module_get(&m, src, &o, &log) != FLEX_OK) {
    fprintf(stderr, "emulator module build failed:\n%s\n", log.data ? log.data : "");
    exit(EXIT_FAILURE);
  }
  buf_free(&log);
  return m;
}

int main(void) {
  rng = tl_seed();
  char *src = test_source();
  plain = build(src, false);
  racy = build(src, true);
  base_free(src);
  return TL_MAIN("emu", 0, TL_CASE("emu", 60), TL_TEST(reduce_ok), TL_TEST(block_order_shuffled),
                 TL_TEST(reduce_race_free), TL_TEST(missing_sync_is_wrong), TL_TEST(missing_sync_is_a_race),
                 TL_TEST(unwritten_smem_is_poison), TL_TEST(tail_off_by_one), TL_TEST(barrier_divergence), TL_TEST(votes),
                 TL_TEST(conversions), TL_TEST(mma_f16), TL_TEST(mma_bf16), TL_TEST(ldmatrix_layouts),
                 TL_TEST(ldmatrix_wrong_layout), TL_TEST(cp_async_groups), TL_CASE("generated", 120),
                 TL_LOOP(generated_fp32, 2), TL_LOOP(generated_fp16, 2), TL_LOOP(generated_bf16, 2));
}
