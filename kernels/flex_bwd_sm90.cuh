/* flex_bwd_sm90.cuh: the sm_90a backward's main kernel (fp16/bf16),
 * FlashAttention-3 style. flex_bwd_pre and flex_bwd_dq (flex_bwd.cuh) run
 * before and after it unchanged.
 *
 * One CTA per (BNC keys, kv head, batch), 128 (1 + NC) threads:
 *   warpgroup 0, the producer: the walker (one elected lane of warp 0)
 *     walks, for every query head of the kv head's group, the query tiles
 *     of 64 rows that see these keys (FlexWalk's backward walk, the CTA's
 *     only walk), loads the K and V tile once (TMA) and each tile's Q and
 *     dO (TMA) through a 2-stage ring of full/empty mbarriers; the loader
 *     warp (warp 1) stages each tile's LSE and D and the rows' flags
 *     (flex_bwd_sm90_loader); with DQB the dQ warp (warp 2) adds dQ to
 *     dq_acc (flex_bwd_sm90_dq_warp); the rest exit.
 *   warpgroups 1..NC, the consumers, 16 keys per warp, one tile at a time
 *   (64 query rows), every product of it in the tile loop's body:
 *     S^T = K Q^T and dP^T = V dO^T   wgmma SS (M = 64 keys, N = 64 queries)
 *     P^T = exp(score - LSE), dS^T = P^T (dP^T - D) through the joint
 *       function, on the accumulator fragments (as flex_bwd_tc_scores)
 *     dV += P^T dO, dK += dS^T Q      wgmma RS: P^T and dS^T from registers
 *     dQ += dS K                      dS^T written to shared memory as dS
 *       ([query][key], stmatrix .trans); wgmma SS over the CTA's keys, then
 *       into dq_acc: with DQB (E % 4 == 0, not the column split) in one
 *       chain over the consumer's columns, staged in shared memory, and the
 *       dQ warp adds each row with a bulk reduction; else per 64-column
 *       panel of K with fp32 atomics (a compare of a constant and a
 *       predicated red each)
 *   dS leaves the element code times the scale (folded into the
 *   subtraction of D, which the producer stages scaled, or applied after
 *   the joint function), so neither dK nor dQ needs a multiply.
 *   A tile without buffer gradients (no joint function), full under the
 *   mask, inside both sequences and without flags (every LSE finite; every
 *   row's dP scale - D provably finite), and with a positive scale for an
 *   identity score, runs the steady body: no live bits, no range tests,
 *   no tests on P or dS; the others the general body. Both sit in the
 *   tile loop, each with its own wgmma.
 *   dK and dV stay in the accumulator registers across the whole walk.
 * Three shapes (codegen: cg_bwd_sm90_consumers, bwd_sm90_keys_split):
 *   KS, E padded to 128 (FlashAttention-3's): NC = 2 consumers split BNC =
 *     128 keys, consumer c owning keys 64 c .. 64 c + 63 with every column
 *     of dK and dV (64 + 64 accumulator registers), so each Q and dO tile
 *     serves 128 keys; both write their keys' dS (panel c of a buffer) and
 *     each computes dQ for its 64 columns over all 128 keys, the two halves
 *     of a dQ row staged side by side for one reduction. setmaxnreg leaves
 *     the producer 24 registers (the walker alone walks; the loader and dQ
 *     warps only follow words) and gives the consumers 240 (FlexSm90Regs).
 *     Only under a mask without integer divisions (a dividing walk spilled
 *     in 24).
 *   NC = 1, 64 keys: E <= 64, or a mask whose tile classifier divides (its
 *     walk needs more than 24 registers), or a caller's BlockMask of
 *     64-key blocks.
 *   Above head dims 128, 64 keys: dK and dV of 64 keys would take 256
 *     accumulator registers per thread, so NC = 2 consumers split the
 *     columns: consumer c holds dK and computes dQ for columns [c KC, (c +
 *     1) KC) and holds dV for [c VC, (c + 1) VC) (KC = EPT / 2, VC = EVPT /
 *     2, whole 64-column panels: the dK / dV wgmma's N-major B operand
 *     starts on a panel of Q / dO). Both compute the whole S^T and dP^T
 *     (over every column of E and EV) and so the same P^T and dS^T
 *     fragments: that redundant work (S^T and dP^T twice: 7 / 5 of the
 *     tensor-core work at E = EV) is what keeps dK and dV in registers.
 *     Consumer 0 alone writes dS to shared memory and alone adds the joint
 *     function's buffer gradients (flex_joint's flex_accum). setmaxnreg
 *     moves registers from the producer (24, or 40 under a dividing mask)
 *     to the consumers (240, or 232).
 * The walker tells everyone which tile a stage holds (its first query row,
 * the walk's `full` flag and the query head) in three shared words per
 * stage, then arrives on `wordsb`; the loader warp, after waiting for it,
 * writes what the tile's rows hold into a flag word (FLEX_BWD_SM90_ODD,
 * FLEX_BWD_SM90_UNSAFE) and the tile's LSE (exp2 domain) and D as 32
 * records of a query pair; the 33 arrivals of walker and loaders (with the
 * copies' bytes) complete the stage's `full` phase; a first row of -1 ends
 * the loops. The UNSAFE bound: |dP| <= sum |dO| max |V| (flex_bwd_pre
 * writes each row's sum |dO|; the loader warp takes the max |V| of the
 * CTA's keys from the V tile once); a row whose bound times |scale|, or
 * whose D times the scale, reaches 2^120 flags the tile. A consumer frees
 * a stage once the wgmma that read its Q and dO (dV, dK) have retired;
 * `empty` counts all 128 NC consumer threads, so the stage is refilled
 * only after every consumer is done with it. The dQ warp learns each
 * tile's first row and head from consumer thread 0 with the staged rows.
 *
 * dS is shared between the writers' warps (a dQ row takes every key of the
 * CTA) and its readers: consumer 0 writes all of it and both read it
 * (columns split), or each consumer writes its keys and both read all of
 * it (KS). Each writer warp writes its 16 keys, then an mbarrier of 128 NC
 * arrivals (`dsbar`, one phase per tile, every consumer thread arriving)
 * orders those generic-proxy writes before any consumer's dQ wgmma reads
 * them (after fence.proxy.async). dS is double-buffered by tile parity: a
 * consumer writes buffer s of tile i only after every thread of every
 * consumer has arrived on tile i - 1's phase, which each did after its own
 * dQ wgmma of tile i - 2 (for every reader, the last read of buffer s)
 * had retired.
 *
 * Shared memory (base rounded up to 1024 bytes: the 128-byte swizzle
 * repeats every 1024): K [EPT/64 panels][BNC keys][64 cols], V [EVPT/64]
 * [BNC][64], Q [2][EPT/64][64 rows][64], dO [2][EVPT/64][64][64], dS [2]
 * [BNC/64 panels][64 queries][64 keys], every row of 128 bytes with the
 * 128-byte swizzle; with DQB NBUF dQ staging buffers (two, one with KS:
 * 64 rows x FLEX_BWD_SM90_DQ_ROW(EPT) bytes each); two stages of LSE and
 * D records (512 bytes each); then 12 mbarriers and 12 words. EPT, EVPT:
 * E and EV padded to 64 (128 with the columns split; TMA zero-fills
 * columns past E and EV, whole panels included, and rows past Q_LEN and
 * KV_LEN). KS at E = EV = 128: 199824 bytes; at EPT = EVPT = 256: 64 KB of
 * K and V, 128 KB of Q and dO stages, 16 KB of dS, with the rest 215184
 * bytes of the 227 KB.
 *
 * Accumulator layout (see flex_fwd_sm90.cuh): thread (warp w, lane 4 g + t)
 * holds d[4 j + 2 r + c] at row 16 w + g + 8 r, column 8 j + 2 t + c: for
 * S^T, key n0 + 16 w + g + 8 r and query m0 + 8 j + 2 t + c, the element
 * order flex_live_bits<..., true> gives its bits in.
 */
#ifndef FLEX_BWD_SM90_CUH
#define FLEX_BWD_SM90_CUH

/* dQ by atomics: a deterministic backward runs the sm_80 body
 * (cg_bwd_sm90_ok). */
#ifdef FLEX_DETERMINISTIC
#error "flex_bwd_sm90.cuh has no deterministic mode"
#endif

#include "flex_fwd_sm90.cuh" /* FlexWgmma */
#include "flex_bwd.cuh"

/* A tile's flags (stage_flags): a row in range has an LSE that is not
 * finite; a row's dP scale - D may not be finite (its sum |dO| times the
 * CTA's max |V| and |scale|, or its D scale, reaches 2^120). */
#define FLEX_BWD_SM90_ODD 1
#define FLEX_BWD_SM90_UNSAFE 2

/* Max |V| over the CTA's BNC keys once the K and V copies landed, as an
 * fp32 bound (+inf for a non-finite element), by the loader warp: lane l
 * reads rows l, l + 32, ... of the V tile's panels (their bytes, in any
 * order: the swizzle stays inside a row), then a butterfly of maxima. */
template <class El, int VP, int BNC>
__device__ __forceinline__ float flex_bwd_sm90_vmax(const unsigned char *sV, uint64_t *kvbar, int l) {
  flex_mbar_wait(kvbar, 0);
  uint32_t m = 0; /* the largest magnitude's bits: ordered as the values, NaN above +inf */
#pragma unroll 1
  for (int c = 0; c < VP; c++)
#pragma unroll 1
    for (int r = l; r < BNC; r += 32) {
      const uint32_t *row = (const uint32_t *)(sV + c * BNC * 128 + r * 128);
#pragma unroll
      for (int k = 0; k < 32; k++) {
        const uint32_t x = row[k], lo = x & 0x7fffu, hi = x >> 16 & 0x7fffu;
        m = lo > m ? lo : m;
        m = hi > m ? hi : m;
      }
    }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const uint32_t y = __shfl_xor_sync(0xffffffffu, m, o);
    m = y > m ? y : m;
  }
  const float f = El::f32((uint16_t)m);
  return f == f ? f : INFINITY;
}

/* The loader warp (warp 1 of the producer warpgroup): per tile, once the
 * walker has published its words (`wordsb`), the 64 rows' LSE in the exp2
 * domain (+inf for a row with no keys or past Q_LEN, so its P is 0) and D
 * (0 past Q_LEN; times the scale without a joint function, see the body)
 * into the stage's records, query pair r / 2 in entry r / 2 (a consumer
 * thread reads a pair's four values with one 16-byte load), two rows a
 * lane, and the rows' flags (FLEX_BWD_SM90_ODD, _UNSAFE) into the stage's
 * word; then its arrivals on `full`. A first row of -1 ends it. */
template <class El, int VP, int BNC, bool JOINT, bool STEADY>
__device__ __forceinline__ void flex_bwd_sm90_loader(const FlexParams &p, const unsigned char *sV, float *sld,
                                                     uint64_t *kvbar, uint64_t *fullb, uint64_t *wordsb,
                                                     const int32_t *stage_m0, const int32_t *stage_h,
                                                     int32_t *stage_flags, int b, int l) {
  float vmax = 0.0f; /* max |V| of the CTA's keys times |scale| (STEADY) */
#pragma unroll 1
  for (int i = 0;; i++) {
    const int s = i & 1;
    flex_mbar_wait(wordsb + s, (uint32_t)(i >> 1) & 1);
    const int m0 = __shfl_sync(0xffffffffu, stage_m0[s], 0);
    if (m0 < 0) {
      flex_mbar_arrive(fullb + s);
      return;
    }
    const int h = __shfl_sync(0xffffffffu, stage_h[s], 0);
    if (STEADY && i == 0) vmax = flex_bwd_sm90_vmax<El, VP, BNC>(sV, kvbar, l) * fabsf(p.scale);
    int flags = 0;
    /* one row at a time: the producer lives in 24 registers */
#pragma unroll 1
    for (int k = 0; k < 2; k++) {
      const int r = l + 32 * k, qi = m0 + r;
      const bool ok = qi < p.q_len;
      const int64_t row = (int64_t)(b * p.H + h) * p.q_len + qi;
      const float lse = ok ? flex_gload(p.lse + b * p.lse_b + h * p.lse_h + qi) : -INFINITY;
      const float lse2 = lse == -INFINITY ? INFINITY : lse * FLEX_LOG2E;
      const float dl = ok ? flex_gload(p.delta + row) : 0.0f, dls = JOINT ? dl : dl * p.scale;
      float *const rec = sld + s * 128 + 4 * (r / 2) + r % 2;
      rec[0] = lse2;
      rec[2] = dls;
      if (ok && !(fabsf(lse2) < INFINITY)) flags |= FLEX_BWD_SM90_ODD;
      if (STEADY) {
        /* |dP scale| <= sum |dO| max |V| |scale|, with room for the sum's rounding */
        const float an = !ok ? 0.0f : p.dnorm ? flex_gload(p.dnorm + row) : INFINITY; /* no bound: unsafe */
        if (!(an * vmax < 0x1p120f) || !(fabsf(dls) < 0x1p120f)) flags |= FLEX_BWD_SM90_UNSAFE;
      }
    }
    flags = (__any_sync(0xffffffffu, flags & FLEX_BWD_SM90_ODD) ? FLEX_BWD_SM90_ODD : 0) |
            (__any_sync(0xffffffffu, flags & FLEX_BWD_SM90_UNSAFE) ? FLEX_BWD_SM90_UNSAFE : 0);
    if (l == 0) stage_flags[s] = flags;
    flex_mbar_arrive(fullb + s); /* after the stage's records and flags */
  }
}

/* The dQ warp (DQB: warp 2 of the producer warpgroup): per tile i, once
 * every consumer thread has staged its dQ rows in buffer i % NBUF and
 * consumer thread 0 the tile's first row and head (`dqfull`), it adds each
 * of the 64 rows in range to dq_acc with one bulk reduction (4 E bytes; E
 * % 4 == 0 keeps every row 16-byte aligned), two rows a lane, then frees
 * the buffer (`dqempty`) once the reductions have read it. A first row of
 * -1 ends it; before exit it waits for their writes. */
template <int EPT, int NBUF>
__device__ __forceinline__ void flex_bwd_sm90_dq_warp(const FlexParams &p, const float *sdq, uint64_t *dqfull,
                                                      uint64_t *dqempty, const int32_t *dq_m0,
                                                      const int32_t *dq_h, int b, int l) {
  constexpr int RF = FLEX_BWD_SM90_DQ_ROW(EPT) / 4;
#pragma unroll 1
  for (int i = 0;; i++) {
    const int s = i % NBUF;
    flex_mbar_wait(dqfull + s, (uint32_t)(i / NBUF) & 1);
    const int m0 = __shfl_sync(0xffffffffu, dq_m0[s], 0);
    if (m0 < 0) break;
    const int h = __shfl_sync(0xffffffffu, dq_h[s], 0);
    const int64_t rows = (int64_t)(b * p.H + h) * p.q_len;
#pragma unroll
    for (int r = l; r < 64; r += 32)
      if (m0 + r < p.q_len)
        flex_bulk_reduce_add_f32(p.dq_acc + (rows + m0 + r) * p.E, sdq + (s * 64 + r) * RF, 4u * (uint32_t)p.E);
    flex_bulk_commit();
    flex_bulk_wait_read<0>();
    flex_mbar_arrive(dqempty + s);
  }
  flex_bulk_wait<0>(); /* the last writes done before the block's shared memory goes */
}

/* The A fragments of the k16 steps of a 64 x BM accumulator (rounded). */
template <class El, int BM>
__device__ __forceinline__ void flex_bwd_sm90_frag(uint32_t (*a)[4], const float *d) {
#pragma unroll
  for (int ks = 0; ks < BM / 16; ks++)
#pragma unroll
    for (int i = 0; i < 4; i++) a[ks][i] = El::pack(d[8 * ks + 2 * i], d[8 * ks + 2 * i + 1]);
}

/* EPT, EVPT: E and EV padded to 64 NC (whole panels per consumer); NC
 * consumer warpgroups. KS: they split the keys (128 per CTA, consumer c
 * owning keys 64 c .. 64 c + 63 and every column; EPT = 128), else the
 * columns (64 keys per CTA, consumer c owning columns [c KC, (c + 1) KC)
 * of dK and dQ and [c VC, (c + 1) VC) of dV); at most 128 columns each (dK
 * and dV take KC / 2 + VC / 2 accumulator registers). */
template <class El, int EPT, int EVPT, int NC, int MASK_MODE, bool SCORE_ID, bool JOINT, bool DQB, bool KS,
          int PREGS>
__device__ __forceinline__ void flex_bwd_sm90(const FlexBwdTma &t) {
  const FlexParams &p = t.p;
  typedef typename El::T T;
  typedef FlexWgmma<El> W;
  constexpr int BM = 64, BNC = KS ? 128 : 64, KP = EPT / 64, VP = EVPT / 64; /* BNC: the CTA's keys */
  constexpr int KC = KS ? EPT : EPT / NC, VC = KS ? EVPT : EVPT / NC; /* a consumer's dK and dV columns */
  constexpr int DQN = KS ? EPT / NC : EPT;       /* DQB: a consumer's dQ columns */
  constexpr int NBUF = KS ? 1 : 2;               /* DQB: dQ staging buffers */
  constexpr bool STEADY = !JOINT;                 /* tiles may take the steady body */
  static_assert(NC == 1 || NC == 2, "one or two consumer warpgroups");
  static_assert(!KS || (NC == 2 && EPT == 128 && EVPT <= 128), "keys split: two consumers at EPT = 128");
  static_assert(!DQB || NC == 1 || KS, "dQ by bulk reductions: the staging fits beside one 64-key tile or KS");
  static_assert(KS || (EPT % (64 * NC) == 0 && EVPT % (64 * NC) == 0), "whole panels per consumer");
  static_assert(KC <= 128 && VC <= 128, "a consumer's head dims in one or two 64-column panels");
  constexpr uint32_t PANEL = 64 * 128;        /* bytes of one 64-row, 64-column panel */
  constexpr uint32_t PANELKV = BNC * 128;     /* the same of the CTA's keys */
  /* K and V of the CTA's keys; a stage's Q and dO (64 rows); a dS buffer
   * [64 queries][BNC keys], a panel per 64 keys. */
  constexpr uint32_t KBYTES = KP * PANELKV, VBYTES = VP * PANELKV, QBYTES = KP * PANEL, OBYTES = VP * PANEL,
                     SBYTES = BNC / 64 * PANEL;
  unsigned char *smem = flex_smem + ((1024u - (flex_smem_addr(flex_smem) & 1023u)) & 1023u);
  unsigned char *sK = smem, *sV = sK + KBYTES, *sQ = sV + VBYTES, *sO = sQ + 2 * QBYTES;
  unsigned char *sS = sO + 2 * OBYTES;
  constexpr int RF = FLEX_BWD_SM90_DQ_ROW(EPT) / 4; /* DQB: floats per staged dQ row */
  float *sdq = (float *)(sS + 2 * SBYTES);         /* DQB: NBUF buffers of the tile's 64 dQ rows */
  /* per stage, the tile's LSE (exp2 domain) and D: 32 entries of a query pair each */
  float *sld = sdq + (DQB ? NBUF * 64 * RF : 0);
  uint64_t *kvbar = (uint64_t *)(sld + 2 * 128), *fullb = kvbar + 1, *emptyb = kvbar + 3, *dsbar = kvbar + 5,
           *dqfull = kvbar + 6, *dqempty = kvbar + 8, *wordsb = kvbar + 10;
  int32_t *stage_m0 = (int32_t *)(kvbar + 12), *stage_full = stage_m0 + 2, *stage_h = stage_m0 + 4,
          *stage_flags = stage_m0 + 6, *dq_m0 = stage_m0 + 8, *dq_h = stage_m0 + 10;
  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * BNC, hk = blockIdx.y, b = blockIdx.z;
  const FlexTensorMap *tq = (const FlexTensorMap *)&t.tq, *tk = (const FlexTensorMap *)&t.tk,
                      *tv = (const FlexTensorMap *)&t.tv, *tdo = (const FlexTensorMap *)&t.tdo;

  if (tid == 0) {
    flex_mbar_init(kvbar, 1);
    for (int s = 0; s < 2; s++) {
      flex_mbar_init(fullb + s, 33);   /* the walker and the loader warp (+ the TMA bytes) */
      flex_mbar_init(wordsb + s, 1);   /* the walker published the stage's words */
      flex_mbar_init(emptyb + s, 128 * NC); /* every consumer thread */
    }
    flex_mbar_init(dsbar, 128 * NC);
    for (int s = 0; s < 2; s++) {
      flex_mbar_init(dqfull + s, 128 * NC); /* DQB: every consumer thread staged its dQ */
      flex_mbar_init(dqempty + s, 32);  /* DQB: the dQ warp's reductions read the buffer */
    }
    /* The initialisations are generic-proxy writes the TMA unit (async
     * proxy) will update: make them visible to it before any copy. */
    flex_fence_proxy_async();
  }
  __syncthreads();

  /* The warpgroup from lane 0: ptxas then knows this branch the same in
   * every lane of a warp, and the consumers' code after it converged, so
   * their descriptors and the dQ adds' address stay in uniform registers
   * (from threadIdx, 7.11 -> 3.57 ins/4kF for causal bf16 E=128 with the
   * other changes of that step). */
  if (__shfl_sync(0xffffffffu, tid / 128, 0) == 0) { /* ---- producer ---- */
    if (NC > 1) flex_setmaxnreg_dec<PREGS>();
    /* the warp from lane 0 too: its shared-memory addresses then stay in
     * uniform registers, which the producer's 24 could not hold beside
     * the loader's and the dQ warp's own */
    const int pw = __shfl_sync(0xffffffffu, tid / 32, 0), pl = tid % 32;
    if (pw == 1) {
      flex_bwd_sm90_loader<El, VP, BNC, JOINT, STEADY>(p, sV, sld, kvbar, fullb, wordsb, stage_m0, stage_h,
                                                       stage_flags, b, pl);
      return;
    }
    if (DQB && pw == 2) {
      flex_bwd_sm90_dq_warp<EPT, NBUF>(p, sdq, dqfull, dqempty, dq_m0, dq_h, b, pl);
      return;
    }
    if (pw != 0 || !flex_elect_one()) return;
    /* The walker (one elected lane of warp 0): the K and V tile once, then
     * per tile of the walk, once the consumers freed the stage (the tile
     * two back), its words, the Q and dO copies, `wordsb` for the loader
     * warp and its own arrival on `full`. */
    flex_mbar_arrive_expect_tx(kvbar, KBYTES + VBYTES);
#pragma unroll
    for (int c = 0; c < KP; c++) flex_tma_load_4d(sK + c * PANELKV, tk, kvbar, 64 * c, n0, hk, b);
#pragma unroll
    for (int c = 0; c < VP; c++) flex_tma_load_4d(sV + c * PANELKV, tv, kvbar, 64 * c, n0, hk, b);
    int i = 0;
    for (int h = hk * p.G; h < (hk + 1) * p.G; h++) {
      FlexWalk walk;
      walk.init(p, true, MASK_MODE == FLEX_MASK_LISTS, b, h, n0, BM);
      int m0;
      bool full;
#pragma unroll 1
      for (; walk.next(p, m0, full); i++) {
        const int s = i & 1;
        if (i >= 2) flex_mbar_wait(emptyb + s, (uint32_t)((i >> 1) - 1) & 1);
        stage_m0[s] = m0, stage_full[s] = full, stage_h[s] = h;
        flex_mbar_expect_tx(fullb + s, QBYTES + OBYTES); /* Q and dO */
#pragma unroll
        for (int c = 0; c < KP; c++)
          flex_tma_load_4d(sQ + s * QBYTES + c * PANEL, tq, fullb + s, 64 * c, m0, h, b);
#pragma unroll
        for (int c = 0; c < VP; c++)
          flex_tma_load_4d(sO + s * OBYTES + c * PANEL, tdo, fullb + s, 64 * c, m0, h, b);
        flex_mbar_arrive(wordsb + s);
        flex_mbar_arrive(fullb + s);
      }
    }
    const int s = i & 1; /* the end marker: no bytes */
    if (i >= 2) flex_mbar_wait(emptyb + s, (uint32_t)((i >> 1) - 1) & 1);
    stage_m0[s] = -1;
    flex_mbar_arrive(wordsb + s);
    flex_mbar_arrive(fullb + s);
    return;
  }

  /* ---- consumer cw: keys n0 + kc + 16 w .. + 15 in warp w, its columns ---- */
  if (NC > 1) flex_setmaxnreg_inc<FlexSm90Regs<PREGS>::consumer>();
  /* cw from lane 0, the stage words read at uniform addresses: ptxas
   * keeps the descriptors in uniform registers (flex_fwd_sm90's cw). */
  const int ct = tid - 128, cw = NC > 1 ? __shfl_sync(0xffffffffu, ct / 128, 0) : 0, w = ct / 32 % 4,
            lane = ct % 32, g = lane / 4, t4 = lane % 4;
  const int kc = KS ? 64 * cw : 0; /* the consumer's first key in the CTA's tile */
  /* Every operand K-major with the 128-byte swizzle (LBO unused, SBO 8
   * rows: K-major descriptors), or N-major for the B of dK, dV and dQ (LBO
   * the next 64-column panel); each advanced by flex_wgmma_desc_at. */
  const uint32_t aK = flex_smem_addr(sK), aV = flex_smem_addr(sV), aQ = flex_smem_addr(sQ),
                 aO = flex_smem_addr(sO), aS = flex_smem_addr(sS);
  const uint64_t kK = flex_wgmma_desc(aK + kc * 128, 16, 1024, 128),
                 kV = flex_wgmma_desc(aV + kc * 128, 16, 1024, 128), kQ = flex_wgmma_desc(aQ, 16, 1024, 128),
                 kO = flex_wgmma_desc(aO, 16, 1024, 128), kS = flex_wgmma_desc(aS, 16, 1024, 128),
                 nK = flex_wgmma_desc(aK, PANELKV, 1024, 128),
                 nQ = flex_wgmma_desc(aQ, PANEL, 1024, 128), nO = flex_wgmma_desc(aO, PANEL, 1024, 128);
  /* The consumer's first column panel of Q and dO (the B operands of dK
   * and dV): byte offsets into a stage. */
  const uint32_t qcol = KS ? 0 : cw * (KC / 64) * PANEL, ocol = KS ? 0 : cw * (VC / 64) * PANEL;
  /* This thread's query pairs 8 j + 2 t4, + 1 of the tile's LSE and D: a
   * 16-byte entry each, 64 bytes apart over j. */
  const uint32_t ald = flex_smem_addr(sld) + 16 * t4;
  /* dS^T's A fragments stored as dS, K-major [query][key] with the
   * 128-byte swizzle: element (q, k) at byte q * 128 + ((k / 8) ^ (q % 8))
   * * 16 + (k % 8) * 2. Word i of k16 step ks holds the 8 x 8 block of keys
   * 16 w + 8 (i % 2) + [0, 8) and queries 8 (2 ks + i / 2) + [0, 8) in
   * stmatrix's layout, so .trans writes each of its queries' 8 keys as
   * one 16-byte row; lane L gives the row of query L % 8 of block L / 8.
   * KS: the consumer's keys in panel cw of the buffer. */
  const uint32_t ads = aS + (KS ? cw * PANEL : 0) + ((lane >> 4) * 8 + (lane & 7)) * 128 +
                       (((2 * w + ((lane >> 3) & 1)) ^ (lane & 7)) << 4);
  float dk[KC / 2], dv[VC / 2];
#pragma unroll
  for (int i = 0; i < KC / 2; i++) dk[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < VC / 2; i++) dv[i] = 0.0f;
  const float scale_log2 = p.scale * FLEX_LOG2E;
  const float bias_inv = FLEX_BIAS ? FLEX_LOG2E / scale_log2 : 0.0f; /* |scale| >= 2^-16 (cg_plan) */
  flex_mbar_wait(kvbar, 0);

  int i = 0;
#pragma unroll 1
  for (;; i++) {
    /* s from lane 0: a value carried out of the loop's divergent waits,
     * which ptxas would otherwise keep in vector registers, and every
     * descriptor made from it too */
    const int s = __shfl_sync(0xffffffffu, i & 1, 0);
    flex_mbar_wait(fullb + s, (uint32_t)(i >> 1) & 1);
    const int m0 = __shfl_sync(0xffffffffu, stage_m0[s], 0);
    if (m0 < 0) break;
    const bool full = __shfl_sync(0xffffffffu, stage_full[s], 0) != 0;
    const int h = __shfl_sync(0xffffffffu, stage_h[s], 0);
    const int64_t rows = (int64_t)(b * p.H + h) * p.q_len;
    /* FLEX_BWD_SM90_ODD, FLEX_BWD_SM90_UNSAFE of any row of the tile */
    const int flags = stage_flags[s];
    /* stage s's Q and dO: K-major for S^T and dP^T, N-major from the
     * consumer's first panel for dK and dV */
    const uint64_t kQs = flex_wgmma_desc_at(kQ, s * QBYTES), kOs = flex_wgmma_desc_at(kO, s * OBYTES),
                   nQs = flex_wgmma_desc_at(nQ, s * QBYTES + qcol), nOs = flex_wgmma_desc_at(nO, s * OBYTES + ocol);
    /* The tile's body. GEN: the general one; else the steady one, for a
     * tile with an identity score and no buffer gradients, full under the
     * mask and inside both sequences, every LSE finite and a positive
     * scale: no live bits, no range tests, no score code, P and dS
     * branch-free, and the same values as the general body's for every
     * input (S = -inf gives P = 0 through the exponent without a test,
     * which a finite LSE and a positive scale make exact; dS = 0 where P
     * is 0). dS leaves it scaled (the scale folded into D's subtraction,
     * or after the joint function): dK and dQ need no multiply. */
    auto body = [&](auto gen) {
      constexpr bool GEN = decltype(gen)::value;
      /* S^T = K Q^T and dP^T = V dO^T: every operand K-major with the
       * 128-byte swizzle (a k16 step is 32 bytes into the row; SBO 8 rows). */
      float st[BM / 2], dpt[BM / 2];
#if FLEX_BIAS
      { /* S^T's accumulators start at the bias over the scale (bias.cuh) */
        FlexBias bias;
        bias.init(p, b, h, bias_inv);
        const float base = (float)(n0 + kc + 16 * w + g - (m0 + 2 * t4));
#pragma unroll
        for (int j = 0; j < BM / 8; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) st[4 * j + e] = bias.at(base, (float)(8 * (e >> 1) - 8 * j - (e & 1)));
      }
#endif
      flex_wgmma_fence();
      /* (the general body's descriptors by 32-bit adds: flex_wgmma_desc_lo) */
      auto dat = [](uint64_t d, uint32_t off) { return GEN ? flex_wgmma_desc_lo(d, off) : flex_wgmma_desc_at(d, off); };
#pragma unroll
      for (int kk = 0; kk < EPT / 16; kk++) {
        const uint32_t off = (kk % 4) * 32;
        W::template ss<BM, 0>(st, dat(kK, (kk / 4) * PANELKV + off), dat(kQs, (kk / 4) * PANEL + off),
                              FLEX_BIAS || kk > 0);
      }
#pragma unroll
      for (int kk = 0; kk < EVPT / 16; kk++) {
        const uint32_t off = (kk % 4) * 32;
        W::template ss<BM, 0>(dpt, dat(kV, (kk / 4) * PANELKV + off), dat(kOs, (kk / 4) * PANEL + off), kk > 0);
      }
      flex_wgmma_commit();

      /* While they run: the live bits. Only tiles at the sequence ends or
       * partial under the mask test elements. */
      const bool edge = n0 + BNC > p.kv_len || m0 + BM > p.q_len;
      const bool check = GEN && (edge || (MASK_MODE != FLEX_MASK_NONE && !full));
      typename FlexBits<BM / 2>::T live[1] = {~(typename FlexBits<BM / 2>::T)0};
      if (check)
        flex_live_bits<MASK_MODE, 1, BM / 8, true>(live, p, b, h, n0 + kc + 16 * w + g, m0 + 2 * t4, full);
      flex_wgmma_wait<0>();

      /* P^T into st, dS^T into dpt (both 0 where masked or underflowed), per
       * query column: its LSE and D from the tile's copy in shared memory,
       * not held in registers beside dK, dV, S^T and dP^T. */
      FlexAcc acc; /* the joint's gradients this tile adds to one element of */
#pragma unroll
      for (int j = 0; j < BM / 8; j++) {
        float ld[4]; /* LSE (exp2) of query columns c = 0, 1, then their D */
        flex_lds_f32x4(ld, ald + s * 512 + 64 * j);
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const int qi = m0 + 8 * j + 2 * t4 + c;
          const float lse2 = ld[c], dl = ld[2 + c];
#pragma unroll
          for (int r = 0; r < 2; r++) {
            const int e = 4 * j + 2 * r + c, kj = n0 + kc + 16 * w + g + 8 * r;
            const float qk = st[e];
            const float d = flex_dqk(n0 + kc + 16 * w + g - (m0 + 2 * t4), 8 * r - 8 * j - c);
            if (!GEN) { /* the same values as below, without branches */
              const float xs =
                  SCORE_ID ? flex_ex2(flex_nonpos(fmaf(qk, scale_log2, -lse2)))
                           : flex_ex2(flex_nonpos(fmaf(flex_score(p, qk * p.scale, b, h, qi, kj, d), FLEX_LOG2E, -lse2)));
              dpt[e] = xs * fmaf(dpt[e], p.scale, -dl);
              st[e] = xs;
              continue;
            }
            float x = 0.0f;
            if (live[0] >> e & 1) {
              /* user code never sees an element that is out of range or masked */
              const float sv = SCORE_ID ? qk : flex_score(p, qk * p.scale, b, h, qi, kj, d);
              /* masked by the score (-inf): P = 0 even where LSE is NaN (docs/language.md);
               * at most 1 where a huge row's rounded LSE is below its max */
              x = sv == -INFINITY
                      ? 0.0f
                      : flex_ex2(flex_nonpos(fmaf(sv, SCORE_ID ? scale_log2 : FLEX_LOG2E, -lse2)));
            }
            /* a NaN P reaches the gradients */
            float ds;
            if (JOINT) { /* the buffer gradients once: consumer 0's */
              ds = 0.0f;
              if (x != 0.0f) ds = flex_joint(p, qk * p.scale, b, h, qi, kj, d, x * (dpt[e] - dl), KS || cw == 0, &acc) * p.scale;
            } else {
              const float dsx = x * fmaf(dpt[e], p.scale, -dl);
              ds = x != 0.0f ? dsx : 0.0f;
            }
            st[e] = x;
            dpt[e] = ds;
          }
        }
      }
      if (JOINT) flex_acc_flush(p, b, h, acc); /* every lane of the warp is here */
      uint32_t ap[BM / 16][4], as[BM / 16][4]; /* P^T, dS^T: A fragments of the k16 steps */
      flex_bwd_sm90_frag<El, BM>(ap, st);
      flex_bwd_sm90_frag<El, BM>(as, dpt);

      /* dS (this warp's 16 keys) into buffer s by stmatrix.trans (see
       * `ads`), a k16 step's four 8 x 8 blocks per instruction. KS: each
       * consumer writes its keys; else every consumer holds the same dS^T
       * and consumer 0 writes it. */
      if (KS || cw == 0) {
#pragma unroll
        for (int ks = 0; ks < BM / 16; ks++) flex_stsm_x4_trans(ads + s * SBYTES + ks * 2048, as[ks]);
      }

      /* dV += P^T dO and dK += dS^T Q over the consumer's columns: B is
       * N-major (imm-trans-b) from its first panel: LBO the next 64-column
       * panel, SBO 8 query rows, a k16 step 16 rows. */
      flex_wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BM / 16; ks++)
        W::template rs<VC, 1>(dv, ap[ks], flex_wgmma_desc_at(nOs, ks * 2048), 1);
#pragma unroll
      for (int ks = 0; ks < BM / 16; ks++)
        W::template rs<KC, 1>(dk, as[ks], flex_wgmma_desc_at(nQs, ks * 2048), 1);
      flex_wgmma_commit();
      /* Retired here: dQ's accumulators are then never live beside ap and as. */
      flex_wgmma_wait<0>();
    };
    /* The decision is the tile's, the same in every thread of the CTA. */
    if (STEADY && flags == 0 && (!SCORE_ID || scale_log2 > 0.0f) && n0 + BNC <= p.kv_len &&
        m0 + BM <= p.q_len && (MASK_MODE == FLEX_MASK_NONE || full))
      body(FlexBool<false>());
    else
      body(FlexBool<true>());
    flex_mbar_arrive(emptyb + s); /* the stage's Q and dO are no longer read */
    flex_fence_proxy_async();     /* the dS writes, before the wgmma (async proxy) reads them */
    flex_mbar_arrive(dsbar);

    /* dQ += dS K (dS scaled) over the consumer's columns and all the CTA's
     * keys: A = dS (K-major, a panel per 64 keys), B = K (N-major, a k16
     * step 16 rows of its panels). Every warp's dS is written first. */
    flex_mbar_wait(dsbar, (uint32_t)i & 1);
    const uint64_t kSs = flex_wgmma_desc_at(kS, s * SBYTES);
    if (DQB) {
      /* The consumer's DQN columns (all EPT; KS: panel cw) in one chain;
       * warp w then holds rows 16 w .. 16 w + 15 whole (element e at row g
       * + 8 (e / 2 % 2), column 8 (e / 4) + 2 t4 + e % 2) and stages them
       * in buffer i % NBUF (KS: both consumers' halves of each row), which
       * the dQ warp adds to dq_acc (flex_bwd_sm90_dq_warp). */
      float dq[DQN / 2];
      const uint64_t nKq = flex_wgmma_desc_at(nK, KS ? cw * PANELKV : 0);
      flex_wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BNC / 16; ks++)
        W::template ss<DQN, 1>(dq, flex_wgmma_desc_at(kSs, (ks / 4) * PANEL + (ks % 4) * 32),
                               flex_wgmma_desc_at(nKq, ks * 2048), ks > 0);
      flex_wgmma_commit();
      flex_wgmma_wait<0>();
      /* The buffer is free once the dQ warp's reductions of tile i - NBUF read it. */
      const int sb = i % NBUF;
      if (i >= NBUF) flex_mbar_wait(dqempty + sb, (uint32_t)(i / NBUF - 1) & 1);
      const uint32_t at = flex_smem_addr(sdq + sb * 64 * RF + (16 * w + g) * RF + (KS ? DQN * cw : 0) + 2 * t4);
#pragma unroll
      for (int j = 0; j < DQN / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
          flex_sts_f32x2_a(at + 4 * (8 * r * RF + 8 * j), dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
      if (ct == 0) dq_m0[sb] = m0, dq_h[sb] = h; /* which rows, for the dQ warp */
      flex_fence_proxy_async(); /* generic writes, then the reductions' async-proxy reads */
      flex_mbar_arrive(dqfull + sb);
      continue;
    }
    /* Else per 64-column panel of K (32 registers) into dq_acc by atomics.
     * Element e is at column 64 c + 2 t4 + k, k = 8 (e / 4) + e % 2, of
     * row r = e / 2 % 2 (dq0, dq1); it exists when k < room[r] (columns
     * left in the row: 0 past Q_LEN): one compare of a constant and a
     * predicated red per element (flex_atomic_add_below), no address
     * arithmetic. ptxas 13 still sets each red of sm_90a behind a short
     * branch (BSSY, BRA, BSYNC): 3 of the loop's 7 instructions an
     * element, where sm_80's SASS predicates the red itself. */
    const bool ok0 = m0 + 16 * w + g < p.q_len, ok1 = m0 + 16 * w + g + 8 < p.q_len;
    float *const dq0 = p.dq_acc + (rows + m0 + 16 * w + g) * p.E + 2 * t4, *const dq1 = dq0 + 8 * p.E;
#pragma unroll
    for (int c = cw * (KP / NC); c < (cw + 1) * (KP / NC) && (NC == 1 || 64 * c < p.E); c++) {
      float dq[32];
      const uint64_t nKc = flex_wgmma_desc_at(nK, __shfl_sync(0xffffffffu, c, 0) * PANELKV);
      flex_wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BNC / 16; ks++)
        W::template ss<64, 1>(dq, flex_wgmma_desc_at(kSs, (ks / 4) * PANEL + (ks % 4) * 32),
                              flex_wgmma_desc_at(nKc, ks * 2048), ks > 0);
      flex_wgmma_commit();
      flex_wgmma_wait<0>();
      float *const at[2] = {dq0 + 64 * c, dq1 + 64 * c};
      const int room[2] = {ok0 ? p.E - 64 * c - 2 * t4 : 0, ok1 ? p.E - 64 * c - 2 * t4 : 0};
#pragma unroll
      for (int e = 0; e < 32; e++) {
        const int k = 8 * (e / 4) + (e & 1), r = (e >> 1) & 1;
        flex_atomic_add_below(at[r] + k, dq[e], k, room[r]);
      }
    }
  }

  if (DQB) { /* the dQ warp's end marker, once it has read the buffer's last tile */
    const int sb = i % NBUF;
    if (i >= NBUF) flex_mbar_wait(dqempty + sb, (uint32_t)(i / NBUF - 1) & 1);
    if (ct == 0) dq_m0[sb] = -1;
    flex_mbar_arrive(dqfull + sb);
  }

  /* dK (scaled with dS) and dV of this thread's two keys, the consumer's columns. */
  const int kcol = KS ? 0 : cw * KC, vcol = KS ? 0 : cw * VC;
  T *dkp = (T *)p.dk + b * p.sdk.b + hk * p.sdk.h + kcol, *dvp = (T *)p.dv + b * p.sdv.b + hk * p.sdv.h + vcol;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int kj = n0 + kc + 16 * w + g + 8 * r;
    if (kj >= p.kv_len) continue;
#pragma unroll
    for (int j = 0; j < KC / 8; j++)
#pragma unroll
      for (int c = 0; c < 2; c++)
        if (kcol + 8 * j + 2 * t4 + c < p.E)
          El::store(dkp + kj * p.sdk.row + 8 * j + 2 * t4 + c, dk[4 * j + 2 * r + c]);
#pragma unroll
    for (int j = 0; j < VC / 8; j++)
#pragma unroll
      for (int c = 0; c < 2; c++)
        if (vcol + 8 * j + 2 * t4 + c < p.EV)
          El::store(dvp + kj * p.sdv.row + 8 * j + 2 * t4 + c, dv[4 * j + 2 * r + c]);
  }
}

#endif /* FLEX_BWD_SM90_CUH */
