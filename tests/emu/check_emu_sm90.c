/* Emulator suite for the sm_90a primitives (emu/emu_sm90.h), through the
 * kernels of tests/emu/sm90.cu: mbarrier phases and waiting, TMA tile
 * loads against the swizzle and out-of-bounds rules, wgmma against a plain
 * matmul read through the ISA's accumulator layout, and the rules whose
 * breach must fail a launch (or leave poison) instead of passing. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu/emu_host.h"
#include "testlib.h"
#include "emu_test.h" /* tests/emu/ */

static EmuModule *plain, *racy, *mod; /* mod: the one the current run uses */
static uint64_t rng;

typedef struct Alloc {
  const char *name;
  const void *p;
  size_t bytes;
} Alloc;

/* Launch `kernel` (one block); `msg` gets the error. */
static flex_status run(const char *kernel, const EmuTestParams *p, unsigned block, size_t smem,
                       const Alloc *a, int na, char *msg) {
  EmuRange r[8];
  for (int i = 0; i < na; i++) r[i] = (EmuRange){(uintptr_t)a[i].p, a[i].bytes, a[i].name};
  EmuLaunch L;
  memset(&L, 0, sizeof L);
  L.kernel = kernel;
  L.params = p;
  L.grid = (EmuDim){1, 1, 1};
  L.block = (EmuDim){block, 1, 1};
  L.smem_bytes = smem;
  L.ranges = r;
  L.nranges = na;
  flex_status st = emu_module_launch(mod, &L, NULL);
  snprintf(msg, EMU_ERR_LEN, "%s", L.error);
  return st;
}

/* fp16 bits of a small integer-valued or dyadic x (exact), and back. */
static uint16_t h_of(double x) {
  if (x == 0) return 0;
  uint16_t s = x < 0 ? 0x8000 : 0;
  int e;
  double m = frexp(fabs(x), &e); /* |x| = m 2^e, m in [0.5, 1) */
  return (uint16_t)(s | ((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024));
}
/* A random fp16 or bf16 value with few mantissa bits (products and sums of
 * 64 of them are exact in double): bits and value. */
static uint16_t rand16(int bf, double *v) {
  double x = (double)((int)(tl_rand(&rng) % 33) - 16) / 8;
  *v = x;
  if (!bf) return h_of(x);
  float f = (float)x;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

/* ---- mbarrier ------------------------------------------------------------------ */

static flex_status pingpong(int mode, int rounds, float *out, float *out2, char *msg) {
  for (int i = 0; i < 128; i++) out[i] = -1;
  *out2 = -1;
  EmuTestParams p = {.out = out, .out2 = out2, .n = rounds, .mode = mode};
  Alloc a[] = {{"out", out, 128 * 4}, {"out2", out2, 4}};
  return run("emu_t_pingpong", &p, 256, 1024, a, 2, msg);
}

/* _i 1: in the race-check module (mbarrier phases order the handoff). */
START_TEST(mbarrier_pingpong) {
  float out[128], out2;
  char msg[EMU_ERR_LEN];
  int rounds = 5;
  mod = _i ? racy : plain;
  ck_assert_msg(pingpong(0, rounds, out, &out2, msg) == FLEX_OK, "%s", msg);
  for (int t = 0; t < 128; t++) {
    double want = 0;
    for (int r = 0; r < rounds; r++) want += r * 1000 + t;
    ck_assert_msg(out[t] == (float)want, "thread %d summed %g, want %g", t + 128, out[t], want);
  }
  ck_assert(out2 == (float)rounds);
}
END_TEST

/* A consumer that does not wait reads stale slots (or the block deadlocks). */
START_TEST(mbarrier_no_wait_is_wrong) {
  float out[128], out2;
  char msg[EMU_ERR_LEN];
  flex_status st = pingpong(1, 5, out, &out2, msg);
  int bad = st != FLEX_OK;
  for (int t = 0; st == FLEX_OK && t < 128; t++) bad += out[t] != (float)(10000 + 5 * t);
  ck_assert_msg(bad > 0, "a consumer without its wait still got every sum right");
}
END_TEST

/* ---- named barriers ------------------------------------------------------------ */

static flex_status turns(int mode, int rounds, int32_t *out, char *msg) {
  for (int i = 0; i < 2 * rounds; i++) out[i] = -1;
  EmuTestParams p = {.out = out, .n = rounds, .mode = mode};
  Alloc a[] = {{"out", out, (size_t)(8 * rounds)}};
  return run("emu_t_turns", &p, 256, 1024, a, 1, msg);
}

/* _i 1: in the race-check module (each completed phase orders the turns'
 * reads and writes of the shared counter). */
START_TEST(named_barrier_turns) {
  int32_t out[16];
  char msg[EMU_ERR_LEN];
  mod = _i ? racy : plain;
  ck_assert_msg(turns(0, 8, out, msg) == FLEX_OK, "%s", msg);
  for (int i = 0; i < 16; i++) ck_assert_msg(out[i] == i % 2, "turn %d taken by %d", i, out[i]);
  /* without the barriers, warpgroup 0 runs all its turns first */
  mod = plain;
  ck_assert_msg(turns(5, 8, out, msg) == FLEX_OK, "%s", msg);
  int alternate = 1;
  for (int i = 0; i < 16; i++) alternate &= out[i] == i % 2;
  ck_assert_msg(!alternate, "the turns alternate without barriers: the test shows nothing");
}
END_TEST

START_TEST(named_barrier_rules) {
  int32_t out[8];
  char msg[EMU_ERR_LEN];
  ck_assert(turns(1, 4, out, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "deadlock") && strstr(msg, "256 at a named barrier (first 0: bar.sync 1, 128 of 256 arrived)"),
                "%s", msg);
  ck_assert(turns(2, 4, out, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "gave 256 threads") || strstr(msg, "gave 128 threads"), "%s", msg);
  ck_assert(turns(3, 4, out, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "not whole warps"), "%s", msg);
  ck_assert(turns(4, 4, out, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "named barriers 1..15"), "%s", msg);
}
END_TEST

START_TEST(mbarrier_rules) {
  float out[128], out2;
  char msg[EMU_ERR_LEN];
  ck_assert(pingpong(2, 2, out, &out2, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "no mbarrier was initialised"), "%s", msg);
  ck_assert(pingpong(3, 2, out, &out2, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "before a __syncthreads after its initialisation"), "%s", msg);
}
END_TEST

/* ---- TMA ------------------------------------------------------------------------- */

enum { TR = 20, TC = 72 }; /* the tensor: 20 rows of 72 16-bit elements */

/* The shared offset where the TMA swizzle of `span` bytes puts byte `off`
 * of a dense box: the CUDA guide's table, 16-byte chunk c of 128-byte line
 * l stored at chunk c ^ (l mod span/16). */
static uint32_t swz(uint32_t off, uint32_t span) {
  if (!span) return off;
  uint32_t line = off / 128, chunk = off / 16 % 8, n = span / 16;
  return line * 128 + ((chunk ^ (line % n)) * 16) + off % 16;
}

static void tma_case(uint32_t span) {
  static uint16_t g[TR * TC], out[32768], out2;
  for (int i = 0; i < TR * TC; i++) g[i] = (uint16_t)(1 + tl_rand(&rng) % 60000);
  uint32_t box[2] = {span ? span / 2 : 32, 8};
  uint64_t dims[2] = {TC, TR}, strides[1] = {TC * 2};
  FlexTensorMap map;
  const char *err = emu_tensor_map_encode(&map, 2, 2, g, dims, strides, box, span);
  ck_assert_msg(!err, "%s", err);
  /* Across the right and top edges, then the left and bottom ones. */
  int32_t c[4] = {TC - (int32_t)box[0] / 2, -3, -8, TR - 5};
  for (int mode = 0; mode < 2; mode++) {
    memset(out, 0, sizeof out);
    out2 = 0;
    EmuTestParams p = {.in2 = &map, .in3 = c, .out = out, .out2 = &out2, .mode = mode};
    Alloc a[] = {{"g", g, sizeof g}, {"out", out, sizeof out}, {"out2", &out2, 2}};
    char msg[EMU_ERR_LEN];
    ck_assert_msg(run("emu_t_tma", &p, 128, 65600, a, 3, msg) == FLEX_OK, "%s", msg);
    ck_assert_msg(out2 == 0xFFFF, "read right after the issue: 0x%04x, not poison", out2);
    int wrong = 0, oob = 0;
    for (int j = 0; j < 2; j++)
      for (uint32_t y = 0; y < box[1]; y++)
        for (uint32_t x = 0; x < box[0]; x++) {
          int gy = c[2 * j + 1] + (int)y, gx = c[2 * j] + (int)x;
          int in = gy >= 0 && gy < TR && gx >= 0 && gx < TC;
          uint16_t want = mode == 1 ? 0xFFFF : in ? g[gy * TC + gx] : 0;
          oob += !in;
          uint32_t at = swz(j * 32768 + (y * box[0] + x) * 2, span) / 2;
          wrong += out[at] != want;
        }
    ck_assert_int_gt(oob, 0);
    ck_assert_msg(wrong == 0, "swizzle %u mode %d: %d elements misplaced", span, mode, wrong);
  }
}

START_TEST(tma_swizzles) {
  mod = _i ? racy : plain;
  tma_case(0);
  tma_case(32);
  tma_case(64);
  tma_case(128);
}
END_TEST

/* Transaction bytes: a barrier that expects more than arrives never
 * completes, and the deadlock report names it. */
START_TEST(tma_tx_deadlock) {
  static uint16_t g[TR * TC], out[32768], out2;
  uint32_t box[2] = {32, 8};
  uint64_t dims[2] = {TC, TR}, strides[1] = {TC * 2};
  FlexTensorMap map;
  ck_assert(!emu_tensor_map_encode(&map, 2, 2, g, dims, strides, box, 0));
  int32_t c[4] = {0, 0, 8, 8};
  EmuTestParams p = {.in2 = &map, .in3 = c, .out = out, .out2 = &out2, .mode = 2};
  Alloc a[] = {{"g", g, sizeof g}, {"out", out, sizeof out}, {"out2", &out2, 2}};
  char msg[EMU_ERR_LEN];
  ck_assert(run("emu_t_tma", &p, 128, 65600, a, 3, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "deadlock") && strstr(msg, "128 waiting on an mbarrier (first 0: offset 65536, parity 0)"),
                "%s", msg);
  p.mode = 3;
  ck_assert(run("emu_t_tma", &p, 128, 65600, a, 3, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "more than its 1 arrivals in one phase"), "%s", msg);
}
END_TEST

/* A 3-D box across the end of dimension 2 and the start of dimension 1. */
START_TEST(tma_3d) {
  enum { X = 24, Y = 10, Z = 3 };
  static uint16_t g[Z * Y * X], out[128];
  for (int i = 0; i < Z * Y * X; i++) g[i] = (uint16_t)(1 + i);
  uint64_t dims[3] = {X, Y, Z}, strides[2] = {X * 2, X * Y * 2};
  uint32_t box[3] = {16, 4, 2};
  FlexTensorMap map;
  ck_assert(!emu_tensor_map_encode(&map, 2, 3, g, dims, strides, box, 32));
  int32_t c[3] = {4, -1, 2};
  memset(out, 0, sizeof out);
  EmuTestParams p = {.in2 = &map, .in3 = c, .out = out};
  Alloc a[] = {{"g", g, sizeof g}, {"out", out, sizeof out}};
  char msg[EMU_ERR_LEN];
  ck_assert_msg(run("emu_t_tma3d", &p, 32, 1088, a, 2, msg) == FLEX_OK, "%s", msg);
  for (int z = 0; z < 2; z++)
    for (int y = 0; y < 4; y++)
      for (int x = 0; x < 16; x++) {
        int gz = c[2] + z, gy = c[1] + y, gx = c[0] + x;
        uint16_t want = gz < Z && gy >= 0 && gx < X ? g[(gz * Y + gy) * X + gx] : 0;
        uint32_t at = swz((uint32_t)((z * 4 + y) * 16 + x) * 2, 32) / 2;
        ck_assert_msg(out[at] == want, "box (%d,%d,%d): %u, want %u", x, y, z, out[at], want);
      }
}
END_TEST

START_TEST(tma_encode_rules) {
  uint16_t g[64] = {0};
  FlexTensorMap map;
  uint64_t dims[2] = {8, 8}, strides[1] = {16};
  uint32_t box[2] = {128, 8}, ok_box[2] = {8, 8};
  ck_assert(emu_tensor_map_encode(&map, 2, 2, g, dims, strides, box, 64) != NULL);
  ck_assert(emu_tensor_map_encode(&map, 2, 2, (char *)g + 2, dims, strides, ok_box, 0) != NULL);
  uint64_t bad_strides[1] = {24};
  ck_assert(emu_tensor_map_encode(&map, 2, 2, g, dims, bad_strides, ok_box, 0) != NULL);
  ck_assert(emu_tensor_map_encode(&map, 2, 2, g, dims, strides, ok_box, 32) == NULL);
}
END_TEST

/* ---- wgmma ------------------------------------------------------------------------- */

/* TMA (128-byte swizzle) + four chained wgmmas: D = A B, K = 64. */
static void tma_wgmma_case(int n, int bf) {
  int K = 64;
  uint16_t *a = malloc(64 * 64 * 2), *bt = malloc((size_t)n * 64 * 2);
  double *av = malloc(64 * 64 * sizeof *av), *bv = malloc((size_t)n * 64 * sizeof *bv);
  float *out = malloc((size_t)64 * n * 4);
  for (int i = 0; i < 64 * K; i++) a[i] = rand16(bf, &av[i]);
  for (int i = 0; i < n * K; i++) bt[i] = rand16(bf, &bv[i]);
  for (int i = 0; i < 64 * n; i++) out[i] = NAN;
  FlexTensorMap ma, mb;
  uint64_t da[2] = {64, 64}, db[2] = {64, (uint64_t)n}, st[1] = {128};
  uint32_t ba[2] = {64, 64}, bb[2] = {64, (uint32_t)n};
  ck_assert(!emu_tensor_map_encode(&ma, 2, 2, a, da, st, ba, 128));
  ck_assert(!emu_tensor_map_encode(&mb, 2, 2, bt, db, st, bb, 128));
  EmuTestParams p = {.in = &ma, .in2 = &mb, .out = out, .mode = bf};
  Alloc al[] = {{"a", a, 64 * 64 * 2}, {"bt", bt, (size_t)n * 128}, {"out", out, (size_t)64 * n * 4}};
  char msg[EMU_ERR_LEN];
  ck_assert_msg(run(n == 64 ? "emu_t_tma_wgmma64" : "emu_t_tma_wgmma256", &p, 128, 65600, al, 3, msg) ==
                FLEX_OK, "%s", msg);
  for (int m = 0; m < 64; m++)
    for (int c = 0; c < n; c++) {
      double want = 0;
      for (int k = 0; k < K; k++) want += av[m * K + k] * bv[c * K + k];
      ck_assert_msg(out[m * n + c] == (float)want, "N %d %s: D[%d][%d] = %g, want %g", n,
                    bf ? "bf16" : "f16", m, c, out[m * n + c], want);
    }
  free(a), free(bt), free(av), free(bv), free(out);
}

/* The 32- and 64-byte swizzles through TMA and wgmma (bf16, N = 32). */
START_TEST(wgmma_tma_small_swizzles) {
  for (int span = 32; span <= 64; span *= 2) {
    int K = span / 2;
    uint16_t a[64 * 32], bt[32 * 32];
    double av[64 * 32], bv[32 * 32];
    float out[64 * 32];
    for (int i = 0; i < 64 * K; i++) a[i] = rand16(1, &av[i]);
    for (int i = 0; i < 32 * K; i++) bt[i] = rand16(1, &bv[i]);
    for (int i = 0; i < 64 * 32; i++) out[i] = NAN;
    FlexTensorMap ma, mb;
    uint64_t da[2] = {(uint64_t)K, 64}, db[2] = {(uint64_t)K, 32}, st[1] = {(uint64_t)span};
    uint32_t ba[2] = {(uint32_t)K, 64}, bb[2] = {(uint32_t)K, 32};
    ck_assert(!emu_tensor_map_encode(&ma, 2, 2, a, da, st, ba, (uint32_t)span));
    ck_assert(!emu_tensor_map_encode(&mb, 2, 2, bt, db, st, bb, (uint32_t)span));
    EmuTestParams p = {.in = &ma, .in2 = &mb, .out = out};
    Alloc al[] = {{"a", a, sizeof a}, {"bt", bt, sizeof bt}, {"out", out, sizeof out}};
    char msg[EMU_ERR_LEN];
    ck_assert_msg(run(span == 32 ? "emu_t_tma_wgmma_sw32" : "emu_t_tma_wgmma_sw64", &p, 128, 65600, al, 3,
                      msg) == FLEX_OK, "%s", msg);
    for (int m = 0; m < 64; m++)
      for (int c = 0; c < 32; c++) {
        double want = 0;
        for (int k = 0; k < K; k++) want += av[m * K + k] * bv[c * K + k];
        ck_assert_msg(out[m * 32 + c] == (float)want, "swizzle %d: D[%d][%d] = %g, want %g", span, m, c,
                      out[m * 32 + c], want);
      }
  }
}
END_TEST

START_TEST(wgmma_tma_f16_n64) { tma_wgmma_case(64, 0); }
END_TEST
START_TEST(wgmma_tma_bf16_n256) { tma_wgmma_case(256, 1); }
END_TEST

/* FlashAttention-3's PV: P in registers, V N-major through TMA (128-byte
 * swizzle, two 64-column atoms LBO apart), K = 32. */
START_TEST(wgmma_tma_pv) {
  enum { KV = 32, D = 128 };
  mod = _i ? racy : plain;
  uint16_t *pm = malloc(64 * KV * 2), *v = malloc(KV * D * 2);
  double *pv = malloc(64 * KV * sizeof *pv), *vv = malloc(KV * D * sizeof *vv);
  float *out = malloc(64 * D * 4);
  for (int i = 0; i < 64 * KV; i++) pm[i] = rand16(0, &pv[i]);
  for (int i = 0; i < KV * D; i++) v[i] = rand16(0, &vv[i]);
  for (int i = 0; i < 64 * D; i++) out[i] = NAN;
  FlexTensorMap mv;
  uint64_t dims[2] = {D, KV}, st[1] = {D * 2};
  uint32_t box[2] = {64, KV};
  ck_assert(!emu_tensor_map_encode(&mv, 2, 2, v, dims, st, box, 128));
  EmuTestParams p = {.in = pm, .in2 = &mv, .out = out};
  Alloc al[] = {{"p", pm, 64 * KV * 2}, {"v", v, KV * D * 2}, {"out", out, 64 * D * 4}};
  char msg[EMU_ERR_LEN];
  ck_assert_msg(run("emu_t_tma_wgmma_pv", &p, 128, 65600, al, 3, msg) == FLEX_OK, "%s", msg);
  for (int m = 0; m < 64; m++)
    for (int n = 0; n < D; n++) {
      double want = 0;
      for (int k = 0; k < KV; k++) want += pv[m * KV + k] * vv[k * D + n];
      ck_assert_msg(out[m * D + n] == (float)want, "O[%d][%d] = %g, want %g", m, n, out[m * D + n], want);
    }
  free(pm), free(v), free(pv), free(vv), free(out);
}
END_TEST

/* Producer + two consumer warpgroups through a two-stage TMA ring:
 * O = (Q K^T) V, S exact in fp16 (entries of Q, K in -1..1). _i 1: race check. */
START_TEST(fa3_skeleton) {
  enum { M = 128, L = 256, E = 64 };
  static uint16_t q[M * E], k[L * E], v[L * E];
  static double qv[M * E], kv[L * E], vv[L * E], sv[M * L];
  static float out[M * E];
  mod = _i ? racy : plain;
  for (int i = 0; i < M * E; i++) qv[i] = (double)((int)(tl_rand(&rng) % 3) - 1), q[i] = h_of(qv[i]);
  for (int i = 0; i < L * E; i++) kv[i] = (double)((int)(tl_rand(&rng) % 3) - 1), k[i] = h_of(kv[i]);
  for (int i = 0; i < L * E; i++) v[i] = rand16(0, &vv[i]);
  for (int i = 0; i < M * E; i++) out[i] = NAN;
  FlexTensorMap mq, mk, mv;
  uint64_t dq[2] = {E, M}, dk[2] = {E, L}, st[1] = {E * 2};
  uint32_t bq[2] = {E, M}, bk[2] = {E, 64};
  ck_assert(!emu_tensor_map_encode(&mq, 2, 2, q, dq, st, bq, 128));
  ck_assert(!emu_tensor_map_encode(&mk, 2, 2, k, dk, st, bk, 128));
  ck_assert(!emu_tensor_map_encode(&mv, 2, 2, v, dk, st, bk, 128));
  EmuTestParams p = {.in = &mq, .in2 = &mk, .in3 = &mv, .out = out, .mode = 1};
  Alloc al[] = {{"q", q, sizeof q}, {"k", k, sizeof k}, {"v", v, sizeof v}, {"out", out, sizeof out}};
  char msg[EMU_ERR_LEN];
  /* Freeing a stage before the wgmma reading it retired: the refill is caught
   * (the emulator retires wgmmas as late as it may, so the producer runs first). */
  ck_assert(run("emu_t_fa3_skeleton", &p, 384, 49152 + 64, al, 4, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "in-flight wgmma.mma_async still reads"), "%s", msg);
  p.mode = 0;
  ck_assert_msg(run("emu_t_fa3_skeleton", &p, 384, 49152 + 64, al, 4, msg) == FLEX_OK, "%s", msg);
  for (int m = 0; m < M; m++)
    for (int j = 0; j < L; j++) {
      sv[m * L + j] = 0;
      for (int e = 0; e < E; e++) sv[m * L + j] += qv[m * E + e] * kv[j * E + e];
    }
  for (int m = 0; m < M; m++)
    for (int n = 0; n < E; n++) {
      double want = 0;
      for (int j = 0; j < L; j++) want += sv[m * L + j] * vv[j * E + n];
      ck_assert_msg(out[m * E + n] == (float)want, "O[%d][%d] = %g, want %g", m, n, out[m * E + n], want);
    }
}
END_TEST

/* Descriptor layouts without swizzle (A K-major, B N-major) and A in
 * registers: out = A B + C, C through the accumulator layout. */
START_TEST(wgmma_layouts) {
  enum { N = 24 };
  uint16_t a[64 * 16], b[16 * N];
  double av[64 * 16], bv[16 * N];
  float c[64 * N], out[64 * N];
  for (int i = 0; i < 64 * 16; i++) a[i] = rand16(0, &av[i]);
  for (int i = 0; i < 16 * N; i++) b[i] = rand16(0, &bv[i]);
  for (int i = 0; i < 64 * N; i++) c[i] = (float)(i % 97) - 40;
  for (int mode = 0; mode < 2; mode++) {
    for (int i = 0; i < 64 * N; i++) out[i] = NAN;
    EmuTestParams p = {.in = a, .in2 = b, .in3 = c, .out = out, .mode = mode};
    Alloc al[] = {{"a", a, sizeof a}, {"b", b, sizeof b}, {"c", c, sizeof c}, {"out", out, sizeof out}};
    char msg[EMU_ERR_LEN];
    ck_assert_msg(run("emu_t_wgmma_layouts", &p, 128, 8192, al, 4, msg) == FLEX_OK, "%s", msg);
    for (int m = 0; m < 64; m++)
      for (int n = 0; n < N; n++) {
        double want = c[m * N + n];
        for (int k = 0; k < 16; k++) want += av[m * 16 + k] * bv[k * N + n];
        ck_assert_msg(out[m * N + n] == (float)want, "%s: D[%d][%d] = %g, want %g",
                      mode ? "A in registers" : "A from shared memory", m, n, out[m * N + n], want);
      }
  }
}
END_TEST

static flex_status wgmma_bad(int mode, unsigned threads, float *out, float *out2, char *msg) {
  for (int i = 0; i < 128; i++) out[i] = out2[i] = 0;
  EmuTestParams p = {.out = out, .out2 = out2, .mode = mode};
  Alloc a[] = {{"out", out, 512}, {"out2", out2, 512}};
  return run("emu_t_wgmma_bad", &p, threads, 16384, a, 2, msg);
}

/* Reading the accumulator before the wait that retires it sees poison. */
START_TEST(wgmma_early_read_is_poison) {
  float out[128], out2[128];
  char msg[EMU_ERR_LEN];
  for (int mode = 0; mode < 2; mode++) {
    ck_assert_msg(wgmma_bad(mode, 128, out, out2, msg) == FLEX_OK, "%s", msg);
    for (int t = 0; t < 128; t++) {
      uint32_t u;
      memcpy(&u, &out[t], 4);
      ck_assert_msg(u == 0xFFFFFFFFu, "mode %d thread %d read %g before the wait", mode, t, out[t]);
      ck_assert_msg(out2[t] == 16.0f, "mode %d thread %d: %g after the wait, want 16", mode, t, out2[t]);
    }
  }
}
END_TEST

START_TEST(wgmma_rules) {
  static const struct {
    int mode;
    unsigned threads;
    const char *want;
  } cases[] = {
      {2, 128, "without a wgmma.fence"},
      {3, 128, "warpgroup divergence"},
      {4, 128, "have exited"},
      {5, 128, "outside the launch's 16384 bytes"},
      {6, 128, "differ across the warpgroup"},
      {7, 128, "A registers changed"},
      {8, 64, "needs a full warpgroup"},
  };
  float out[128], out2[128];
  char msg[EMU_ERR_LEN];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ck_assert_msg(wgmma_bad(cases[i].mode, cases[i].threads, out, out2, msg) != FLEX_OK,
                  "mode %d was not caught", cases[i].mode);
    ck_assert_msg(strstr(msg, cases[i].want), "mode %d: %s", cases[i].mode, msg);
  }
}
END_TEST

/* A TMA load into shared memory an in-flight wgmma reads fails; after the
 * wait_group it is fine. */
START_TEST(wgmma_stage_overwrite) {
  static uint16_t g[8 * 64];
  float out[128];
  FlexTensorMap map;
  uint64_t dims[2] = {64, 8}, st[1] = {128};
  uint32_t box[2] = {64, 8};
  ck_assert(!emu_tensor_map_encode(&map, 2, 2, g, dims, st, box, 0));
  char msg[EMU_ERR_LEN];
  for (int mode = 0; mode < 2; mode++) {
    EmuTestParams p = {.in2 = &map, .out = out, .mode = mode};
    Alloc a[] = {{"g", g, sizeof g}, {"out", out, sizeof out}};
    flex_status st2 = run("emu_t_wgmma_overwrite", &p, 128, 16448, a, 2, msg);
    if (mode == 0) ck_assert_msg(st2 == FLEX_OK, "%s", msg);
    else ck_assert_msg(st2 != FLEX_OK && strstr(msg, "in-flight wgmma.mma_async still reads"), "%s", msg);
  }
}
END_TEST

/* cp.reduce.async.bulk: three blocks add in * (b + 1) into out; changing
 * the source before the wait fails. */
START_TEST(bulk_reduce_add) {
  static float in[256], out[256];
  for (int i = 0; i < 256; i++) in[i] = (float)(i % 17) - 8, out[i] = (float)i;
  EmuTestParams p = {.in = in, .out = out};
  Alloc a[] = {{"in", in, sizeof in}, {"out", out, sizeof out}};
  EmuRange r[2];
  for (int i = 0; i < 2; i++) r[i] = (EmuRange){(uintptr_t)a[i].p, a[i].bytes, a[i].name};
  for (int mode = 0; mode < 2; mode++) {
    p.mode = mode;
    EmuLaunch L;
    memset(&L, 0, sizeof L);
    L.kernel = "emu_t_bulk_reduce";
    L.params = &p;
    L.grid = (EmuDim){3, 1, 1};
    L.block = (EmuDim){64, 1, 1};
    L.smem_bytes = 1024;
    L.ranges = r;
    L.nranges = 2;
    flex_status st = emu_module_launch(mod, &L, NULL);
    if (mode == 1) {
      ck_assert(st != FLEX_OK);
      ck_assert_msg(strstr(L.error, "changed before the cp.async.bulk.wait_group"), "%s", L.error);
      break;
    }
    ck_assert_msg(st == FLEX_OK, "%s", L.error);
    for (int i = 0; i < 256; i++) ck_assert_msg(out[i] == (float)i + 6 * in[i], "out[%d] = %g", i, out[i]);
  }
}
END_TEST

/* ---- elect.sync, setmaxnreg ---------------------------------------------------------- */

START_TEST(elect_and_setmaxnreg) {
  float out[256];
  char msg[EMU_ERR_LEN];
  EmuTestParams p = {.out = out};
  Alloc a[] = {{"out", out, sizeof out}};
  ck_assert_msg(run("emu_t_elect", &p, 256, 0, a, 1, msg) == FLEX_OK, "%s", msg);
  for (int t = 0; t < 256; t++) ck_assert_msg(out[t] == (t % 32 == 0), "thread %d elected %g", t, out[t]);
  p.mode = 1;
  ck_assert(run("emu_t_elect", &p, 256, 0, a, 1, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "warpgroup divergence"), "%s", msg);
}
END_TEST

/* setmaxnreg.inc draws on what .dec gave back to the CTA's pool: 384 x 168
 * registers at launch, so a producer at 40 lets two consumers reach 232,
 * one at 48 does not (the .inc waits forever: a deadlock). */
START_TEST(setmaxnreg_pool) {
  float out[384];
  char msg[EMU_ERR_LEN];
  EmuTestParams p = {.out = out};
  Alloc a[] = {{"out", out, sizeof out}};
  ck_assert_msg(run("emu_t_regs", &p, 384, 0, a, 1, msg) == FLEX_OK, "%s", msg);
  for (int t = 0; t < 384; t++) ck_assert_msg(out[t] == 1.0f, "thread %d: %g", t, out[t]);
  p.mode = 1;
  ck_assert(run("emu_t_regs", &p, 384, 0, a, 1, msg) != FLEX_OK);
  ck_assert_msg(strstr(msg, "deadlock") && strstr(msg, "setmaxnreg.inc") &&
                    strstr(msg, "pool holds 7168 registers, 1024 short (168 a thread"),
                "%s", msg);
}
END_TEST

/* Each test starts on the plain module (the loop tests pick theirs). */
static void use_plain(void) { mod = plain; }

/* ---- setup ---------------------------------------------------------------------------- */

int main(void) {
  rng = tl_seed();
  static const char *files[] = {"tests/emu/emu_test.h", "tests/emu/sm90.cu"};
  Buf src = {0};
  for (size_t i = 0; i < 2; i++) {
    char *text = NULL;
    size_t len = 0;
    if (base_read_file(tl_src_path(files[i]), &text, &len) != 0) {
      fprintf(stderr, "cannot read %s\n", files[i]);
      return EXIT_FAILURE;
    }
    buf_printf(&src, "#line 1 \"%s\"\n", files[i]);
    buf_put(&src, text, len);
    base_free(text);
  }
  for (int race = 0; race < 2; race++) {
    EmuBuildOpts o = {.racecheck = race};
    Buf log = {0};
    if (emu_module_get(race ? &racy : &plain, src.data, &o, &log) != FLEX_OK) {
      fprintf(stderr, "emulator module build failed:\n%s\n", log.data ? log.data : "");
      return EXIT_FAILURE;
    }
    buf_free(&log);
  }
  mod = plain;
  buf_free(&src);
  return TL_MAIN("emu_sm90", 0, TL_FIXTURE("sm90", 60, use_plain, NULL), TL_LOOP(mbarrier_pingpong, 2),
                 TL_TEST(mbarrier_no_wait_is_wrong), TL_TEST(mbarrier_rules), TL_LOOP(named_barrier_turns, 2),
                 TL_TEST(named_barrier_rules), TL_LOOP(tma_swizzles, 2), TL_TEST(tma_tx_deadlock),
                 TL_TEST(tma_3d), TL_TEST(tma_encode_rules), TL_TEST(wgmma_tma_f16_n64),
                 TL_TEST(wgmma_tma_small_swizzles), TL_TEST(wgmma_tma_bf16_n256), TL_LOOP(wgmma_tma_pv, 2),
                 TL_TEST(wgmma_layouts), TL_LOOP(fa3_skeleton, 2), TL_TEST(wgmma_early_read_is_poison),
                 TL_TEST(wgmma_rules), TL_TEST(wgmma_stage_overwrite), TL_TEST(bulk_reduce_add),
                 TL_TEST(elect_and_setmaxnreg), TL_TEST(setmaxnreg_pool));
}
