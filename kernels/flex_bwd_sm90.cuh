/* flex_bwd_sm90.cuh: the sm_90a backward's main kernel (fp16/bf16),
 * FlashAttention-3 style. flex_bwd_pre and flex_bwd_dq (flex_bwd.cuh) run
 * before and after it unchanged.
 *
 * One CTA per (64 keys, kv head, batch), as flex_bwd_tc, 128 (1 + NC)
 * threads:
 *   warpgroup 0, the producer: warps 0 and 1 walk, for every query head of
 *     the kv head's group, the query tiles of 64 rows that see these keys
 *     (FlexWalk's backward walk, the same in all 64 threads). One elected
 *     lane of warp 0 (the lead) loads the K and V tile once (TMA) and each
 *     tile's Q and dO (TMA) through a 2-stage ring of full/empty
 *     mbarriers; each of the 64 threads stages its row of the tile's LSE
 *     and D and the rows' flags in the stage (below). With DQB warp 2 is
 *     the dQ warp (flex_bwd_sm90_dq_warp); the rest exit.
 *   warpgroups 1..NC, the consumers, 16 keys per warp, one tile at a time
 *   (64 query rows), every product of it in the tile loop's body:
 *     S^T = K Q^T and dP^T = V dO^T   wgmma SS (M = 64 keys, N = 64 queries)
 *     P^T = exp(score - LSE), dS^T = P^T (dP^T - D) through the joint
 *       function, on the accumulator fragments (as flex_bwd_tc_scores)
 *     dV += P^T dO, dK += dS^T Q      wgmma RS: P^T and dS^T from registers
 *     dQ += dS K                      dS^T written to shared memory as dS
 *       ([query][key], stmatrix .trans); wgmma SS, then into dq_acc: with
 *       DQB (one consumer, E % 4 == 0) all EPT columns in one chain, the
 *       consumer staging the tile's 64 rows in one of two buffers and the
 *       dQ warp adding each row with a bulk reduction; else per 64-column
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
 * NC = 1 up to head dims 128. Above, dK and dV of 64 keys would take 256
 * accumulator registers per thread, so NC = 2 consumers split the columns:
 * consumer c holds dK and computes dQ for columns [c KC, (c + 1) KC) and
 * holds dV for [c VC, (c + 1) VC) (KC = EPT / 2, VC = EVPT / 2, whole
 * 64-column panels: the dK / dV wgmma's N-major B operand starts on a panel
 * of Q / dO). Both compute the whole S^T and dP^T (over every column of E
 * and EV) and so the same P^T and dS^T fragments: that redundant work
 * (S^T and dP^T twice: 7 / 5 of the tensor-core work at E = EV) is what
 * keeps dK and dV in registers. Consumer 0 alone writes dS to shared
 * memory and alone adds the joint function's buffer gradients
 * (flex_joint's flex_accum). setmaxnreg moves registers from the producer
 * (48) to the consumers (232), as the forward does.
 * The producer tells the consumer which tile a stage holds (its first query
 * row, the walk's `full` flag and the query head) in three shared words per
 * stage, and what its rows hold in two flag words (one per producer warp:
 * FLEX_BWD_SM90_ODD, FLEX_BWD_SM90_UNSAFE), with the tile's LSE (exp2
 * domain) and D as 32 records of a query pair, all written before the 64
 * arrivals that (with the copies' bytes) complete the stage's `full`
 * phase; a first row of -1 ends the loop. The UNSAFE bound: |dP| <= sum
 * |dO| max |V| (flex_bwd_pre writes each row's sum |dO|; the producer
 * takes the max |V| of its keys from the V tile once); a row whose bound
 * times |scale|, or whose D times the scale, reaches 2^120 flags the tile.
 * A consumer frees a stage once the wgmma that read its Q and dO (dV, dK)
 * have retired; `empty` counts all 128 NC consumer threads, so the stage
 * is refilled only after every consumer is done with it.
 *
 * dS is shared between consumer 0's four warps (a dQ row takes every key)
 * and, with NC = 2, consumer 1, which reads it without writing it: each
 * warp of consumer 0 writes its 16 keys, then an mbarrier of 128 NC
 * arrivals (`dsbar`, one phase per tile, every consumer thread arriving)
 * orders those generic-proxy writes before any consumer's dQ wgmma reads
 * them (after fence.proxy.async). dS is double-buffered by tile parity:
 * consumer 0 writes buffer s of tile i only after every thread of every
 * consumer has arrived on tile i - 1's phase, which each did after its own
 * dQ wgmma of tile i - 2 (for both readers, the last read of buffer s)
 * had retired.
 *
 * Shared memory (base rounded up to 1024 bytes: the 128-byte swizzle
 * repeats every 1024): K [EPT/64 panels][64 keys][64 cols], V [EVPT/64]
 * [64][64], Q [2][EPT/64][64 rows][64], dO [2][EVPT/64][64][64], dS [2]
 * [64 queries][64 keys], every row of 128 bytes with the 128-byte swizzle;
 * with DQB two dQ staging buffers (64 rows x FLEX_BWD_SM90_DQ_ROW(EPT)
 * bytes each); two stages of LSE and D records (512 bytes each); then 10
 * mbarriers, 10 stage words and the producer warps' two max |V|. EPT, EVPT: E and EV
 * padded to 64 NC (TMA zero-fills columns past E and EV, whole panels
 * included, and rows past Q_LEN and KV_LEN). At EPT = EVPT = 256: 64 KB of
 * K and V, 128 KB of Q and dO stages, 16 KB of dS, with the rest 215168
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

/* setmaxnreg with two consumer warpgroups (384 threads, 168 registers each
 * at launch): the producer gives registers to the consumers, whose dK and
 * dV halves (128) sit beside S^T, dP^T and the A fragments; 128 x 48 +
 * 256 x 232 = 65536, the whole register file. The producer keeps 48: at
 * 24 or 32 ptxas spilled in the walk of natten / natten_tiled (their block
 * classifier); the consumers need more than 200 (softcap, alibi and
 * relpos_bias spilled there) and fit 232 at E = 256 without spills. */
#define FLEX_BWD_SM90_PRODUCER_REGS 48
#define FLEX_BWD_SM90_CONSUMER_REGS 232

/* A tile's flags (stage_flags): a row in range has an LSE that is not
 * finite; a row's dP scale - D may not be finite (its sum |dO| times the
 * CTA's max |V| and |scale|, or its D scale, reaches 2^120). */
#define FLEX_BWD_SM90_ODD 1
#define FLEX_BWD_SM90_UNSAFE 2

/* Max |V| over the CTA's keys once the K and V copies landed, as an fp32
 * bound (+inf for a non-finite element): the producer's warps 0 and 1,
 * thread t reading the 64 EVPT-wide rows' row t (its bytes, in any order:
 * the swizzle stays inside a row), then their maxima through svmax and
 * named barrier 2. */
template <class El, int VP>
__device__ __forceinline__ float flex_bwd_sm90_vmax(const unsigned char *sV, uint64_t *kvbar, float *svmax,
                                                    int t) {
  flex_mbar_wait(kvbar, 0);
  uint32_t m = 0; /* the largest magnitude's bits: ordered as the values, NaN above +inf */
#pragma unroll
  for (int c = 0; c < VP; c++) {
    const uint32_t *row = (const uint32_t *)(sV + c * 64 * 128 + t * 128);
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
  if (t % 32 == 0) svmax[t / 32] = f == f ? f : INFINITY;
  flex_bar_sync<2, 64>();
  return fmaxf(svmax[0], svmax[1]);
}

/* The dQ warp (DQB: warp 2 of the producer warpgroup): it walks the tiles
 * as the producer does and, per tile i, once every consumer thread has
 * staged its dQ rows in buffer i % 2 (`dqfull`), adds each of the 64 rows
 * in range to dq_acc with one bulk reduction (4 E bytes; E % 4 == 0 keeps
 * every row 16-byte aligned), two rows a lane, then frees the buffer
 * (`dqempty`) once the reductions have read it; before exit it waits for
 * their writes. */
template <int EPT, int MASK_MODE>
__device__ __forceinline__ void flex_bwd_sm90_dq_warp(const FlexParams &p, const float *sdq, uint64_t *dqfull,
                                                      uint64_t *dqempty, int b, int hk, int n0, int l) {
  constexpr int RF = FLEX_BWD_SM90_DQ_ROW(EPT) / 4;
  int i = 0;
  for (int h = hk * p.G; h < (hk + 1) * p.G; h++) {
    FlexWalk walk;
    walk.init(p, true, MASK_MODE == FLEX_MASK_LISTS, b, h, n0, 64);
    int m0;
    bool full;
#pragma unroll 1
    for (; walk.next(p, m0, full); i++) {
      const int s = i & 1;
      const int64_t rows = (int64_t)(b * p.H + h) * p.q_len;
      flex_mbar_wait(dqfull + s, (uint32_t)(i >> 1) & 1);
#pragma unroll
      for (int r = l; r < 64; r += 32)
        if (m0 + r < p.q_len)
          flex_bulk_reduce_add_f32(p.dq_acc + (rows + m0 + r) * p.E, sdq + (s * 64 + r) * RF, 4u * (uint32_t)p.E);
      flex_bulk_commit();
      flex_bulk_wait_read<0>();
      flex_mbar_arrive(dqempty + s);
    }
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
 * consumer warpgroups, consumer c owning columns [c KC, (c + 1) KC) of dK
 * and dQ and [c VC, (c + 1) VC) of dV, at most 128 each (dK and dV take
 * KC / 2 + VC / 2 accumulator registers). */
template <class El, int EPT, int EVPT, int NC, int MASK_MODE, bool SCORE_ID, bool JOINT, bool DQB>
__device__ __forceinline__ void flex_bwd_sm90(const FlexBwdTma &t) {
  const FlexParams &p = t.p;
  typedef typename El::T T;
  typedef FlexWgmma<El> W;
  constexpr int BM = 64, BN = 64, KP = EPT / 64, VP = EVPT / 64;
  constexpr int KC = EPT / NC, VC = EVPT / NC;   /* a consumer's dK / dQ and dV columns */
  constexpr bool STEADY = !JOINT;                 /* tiles may take the steady body */
  static_assert(NC == 1 || NC == 2, "one or two consumer warpgroups");
  static_assert(!DQB || NC == 1, "dQ by bulk reductions: one consumer (the staging fits beside it)");
  static_assert(EPT % (64 * NC) == 0 && EVPT % (64 * NC) == 0 && KC <= 128 && VC <= 128,
                "a consumer's head dims in one or two 64-column panels");
  constexpr uint32_t PANEL = 64 * 128; /* bytes of one 64-row, 64-column panel */
  /* A K tile and a Q tile take the same bytes (64 rows, EPT columns), as
   * do a V tile and a dO tile; a dS buffer is one panel. */
  constexpr uint32_t KBYTES = KP * PANEL, VBYTES = VP * PANEL, SBYTES = PANEL;
  unsigned char *smem = flex_smem + ((1024u - (flex_smem_addr(flex_smem) & 1023u)) & 1023u);
  unsigned char *sK = smem, *sV = sK + KBYTES, *sQ = sV + VBYTES, *sO = sQ + 2 * KBYTES;
  unsigned char *sS = sO + 2 * VBYTES;
  constexpr int RF = FLEX_BWD_SM90_DQ_ROW(EPT) / 4; /* DQB: floats per staged dQ row */
  float *sdq = (float *)(sS + 2 * SBYTES);         /* DQB: two buffers of the tile's 64 dQ rows */
  /* per stage, the tile's LSE (exp2 domain) and D: 32 entries of a query pair each */
  float *sld = sdq + (DQB ? 2 * 64 * RF : 0);
  uint64_t *kvbar = (uint64_t *)(sld + 2 * 128), *fullb = kvbar + 1, *emptyb = kvbar + 3, *dsbar = kvbar + 5,
           *dqfull = kvbar + 6, *dqempty = kvbar + 8;
  int32_t *stage_m0 = (int32_t *)(kvbar + 10), *stage_full = stage_m0 + 2, *stage_h = stage_m0 + 4,
          *stage_flags = stage_m0 + 6;
  float *svmax = (float *)(stage_m0 + 10); /* the producer warps' max |V| */
  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * BN, hk = blockIdx.y, b = blockIdx.z;
  const FlexTensorMap *tq = (const FlexTensorMap *)&t.tq, *tk = (const FlexTensorMap *)&t.tk,
                      *tv = (const FlexTensorMap *)&t.tv, *tdo = (const FlexTensorMap *)&t.tdo;

  if (tid == 0) {
    flex_mbar_init(kvbar, 1);
    for (int s = 0; s < 2; s++) {
      flex_mbar_init(fullb + s, 64);   /* the producer's 64 threads (+ the TMA bytes) */
      flex_mbar_init(emptyb + s, 128 * NC); /* every consumer thread */
    }
    flex_mbar_init(dsbar, 128 * NC);
    for (int s = 0; s < 2; s++) {
      flex_mbar_init(dqfull + s, 128);  /* DQB: every consumer thread staged its dQ */
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
    if (NC > 1) flex_setmaxnreg_dec<FLEX_BWD_SM90_PRODUCER_REGS>();
    if (DQB && tid / 32 == 2) { /* the dQ warp */
      flex_bwd_sm90_dq_warp<EPT, MASK_MODE>(p, sdq, dqfull, dqempty, b, hk, n0, tid % 32);
      return;
    }
    if (tid >= 64) return;
    /* Warps 0 and 1 walk the tiles together; one elected lane of warp 0
     * (lead) issues the copies, and every one of the 64 threads stages its
     * row of each tile's LSE and D. */
    bool lead = false;
    if (tid < 32) lead = flex_elect_one();
    if (lead) {
      flex_mbar_arrive_expect_tx(kvbar, KBYTES + VBYTES);
#pragma unroll
      for (int c = 0; c < KP; c++) flex_tma_load_4d(sK + c * PANEL, tk, kvbar, 64 * c, n0, hk, b);
#pragma unroll
      for (int c = 0; c < VP; c++) flex_tma_load_4d(sV + c * PANEL, tv, kvbar, 64 * c, n0, hk, b);
    }
    int i = 0;
    float vmax = 0.0f; /* max |V| of the CTA's keys times |scale| (STEADY) */
    for (int h = hk * p.G; h < (hk + 1) * p.G; h++) {
      FlexWalk walk;
      walk.init(p, true, MASK_MODE == FLEX_MASK_LISTS, b, h, n0, BM);
      int m0;
      bool full;
#pragma unroll 1
      for (; walk.next(p, m0, full); i++) {
        const int s = i & 1;
        /* The consumer freed this stage (the tile two back) before it is refilled. */
        if (i >= 2) flex_mbar_wait(emptyb + s, (uint32_t)((i >> 1) - 1) & 1);
        /* The copies first (the lead), then the stage's words and records
         * (every thread), then the 64 arrivals that complete the phase
         * with the copies' bytes. */
        if (lead) {
          stage_m0[s] = m0, stage_full[s] = full, stage_h[s] = h;
          flex_mbar_expect_tx(fullb + s, KBYTES + VBYTES); /* Q and dO */
#pragma unroll
          for (int c = 0; c < KP; c++)
            flex_tma_load_4d(sQ + s * KBYTES + c * PANEL, tq, fullb + s, 64 * c, m0, h, b);
#pragma unroll
          for (int c = 0; c < VP; c++)
            flex_tma_load_4d(sO + s * VBYTES + c * PANEL, tdo, fullb + s, 64 * c, m0, h, b);
        }
        /* Row tid of the tile: its LSE in the exp2 domain (+inf for a row
         * with no keys or past Q_LEN, so its P is 0) and D (0 past Q_LEN;
         * times the scale without a joint function, see the body), query
         * pair tid / 2 in entry tid / 2 of the stage's records: a consumer
         * thread reads a pair's four values with one 16-byte load. Each
         * warp also ORs its rows' flags (FLEX_BWD_SM90_ODD, _UNSAFE) into
         * a word of the stage. */
        const int qi = m0 + tid;
        const bool ok = qi < p.q_len;
        const int64_t row = (int64_t)(b * p.H + h) * p.q_len + qi;
        const float lse = ok ? flex_gload(p.lse + b * p.lse_b + h * p.lse_h + qi) : -INFINITY;
        const float lse2 = lse == -INFINITY ? INFINITY : lse * FLEX_LOG2E;
        const float dl = ok ? flex_gload(p.delta + row) : 0.0f, dls = JOINT ? dl : dl * p.scale;
        float *const rec = sld + s * 128 + 4 * (tid / 2) + tid % 2;
        rec[0] = lse2;
        rec[2] = dls;
        int flags = ok && !(fabsf(lse2) < INFINITY) ? FLEX_BWD_SM90_ODD : 0;
        if (STEADY) {
          if (i == 0) vmax = flex_bwd_sm90_vmax<El, VP>(sV, kvbar, svmax, tid) * fabsf(p.scale);
          /* |dP scale| <= sum |dO| max |V| |scale|, with room for the sum's rounding */
          const float an = !ok ? 0.0f : p.dnorm ? flex_gload(p.dnorm + row) : INFINITY; /* no bound: unsafe */
          if (!(an * vmax < 0x1p120f) || !(fabsf(dls) < 0x1p120f)) flags |= FLEX_BWD_SM90_UNSAFE;
        }
        flags = (__any_sync(0xffffffffu, flags & FLEX_BWD_SM90_ODD) ? FLEX_BWD_SM90_ODD : 0) |
                (__any_sync(0xffffffffu, flags & FLEX_BWD_SM90_UNSAFE) ? FLEX_BWD_SM90_UNSAFE : 0);
        if (tid % 32 == 0) stage_flags[2 * s + tid / 32] = flags;
        flex_mbar_arrive(fullb + s); /* after the stage's words and records */
      }
    }
    const int s = i & 1; /* the end marker: no bytes */
    if (i >= 2) flex_mbar_wait(emptyb + s, (uint32_t)((i >> 1) - 1) & 1);
    if (lead) stage_m0[s] = -1;
    flex_mbar_arrive(fullb + s);
    return;
  }

  /* ---- consumer cw: keys n0 + 16 w .. n0 + 16 w + 15 in warp w, its columns ---- */
  if (NC > 1) flex_setmaxnreg_inc<FLEX_BWD_SM90_CONSUMER_REGS>();
  /* cw from lane 0, the stage words read at uniform addresses: ptxas
   * keeps the descriptors in uniform registers (flex_fwd_sm90's cw). */
  const int ct = tid - 128, cw = NC > 1 ? __shfl_sync(0xffffffffu, ct / 128, 0) : 0, w = ct / 32 % 4,
            lane = ct % 32, g = lane / 4, t4 = lane % 4;
  /* Every operand K-major with the 128-byte swizzle (LBO unused, SBO 8
   * rows: K-major descriptors), or N-major for the B of dK, dV and dQ (LBO
   * the next 64-column panel); each advanced by flex_wgmma_desc_at. */
  const uint32_t aK = flex_smem_addr(sK), aV = flex_smem_addr(sV), aQ = flex_smem_addr(sQ),
                 aO = flex_smem_addr(sO), aS = flex_smem_addr(sS);
  const uint64_t kK = flex_wgmma_desc(aK, 16, 1024, 128), kV = flex_wgmma_desc(aV, 16, 1024, 128),
                 kQ = flex_wgmma_desc(aQ, 16, 1024, 128), kO = flex_wgmma_desc(aO, 16, 1024, 128),
                 kS = flex_wgmma_desc(aS, 16, 1024, 128), nK = flex_wgmma_desc(aK, PANEL, 1024, 128),
                 nQ = flex_wgmma_desc(aQ, PANEL, 1024, 128), nO = flex_wgmma_desc(aO, PANEL, 1024, 128);
  /* The consumer's first column panel of Q and dO (the B operands of dK
   * and dV): byte offsets into a stage. */
  const uint32_t qcol = cw * (KC / 64) * PANEL, ocol = cw * (VC / 64) * PANEL;
  /* This thread's query pairs 8 j + 2 t4, + 1 of the tile's LSE and D: a
   * 16-byte entry each, 64 bytes apart over j. */
  const uint32_t ald = flex_smem_addr(sld) + 16 * t4;
  /* dS^T's A fragments stored as dS, K-major [query][key] with the
   * 128-byte swizzle: element (q, k) at byte q * 128 + ((k / 8) ^ (q % 8))
   * * 16 + (k % 8) * 2. Word i of k16 step ks holds the 8 x 8 block of keys
   * 16 w + 8 (i % 2) + [0, 8) and queries 8 (2 ks + i / 2) + [0, 8) in
   * stmatrix's layout, so .trans writes each of its queries' 8 keys as
   * one 16-byte row; lane L gives the row of query L % 8 of block L / 8. */
  const uint32_t ads = aS + ((lane >> 4) * 8 + (lane & 7)) * 128 + (((2 * w + ((lane >> 3) & 1)) ^ (lane & 7)) << 4);
  float dk[KC / 2], dv[VC / 2];
#pragma unroll
  for (int i = 0; i < KC / 2; i++) dk[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < VC / 2; i++) dv[i] = 0.0f;
  const float scale_log2 = p.scale * FLEX_LOG2E;
  flex_mbar_wait(kvbar, 0);

#pragma unroll 1
  for (int i = 0;; i++) {
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
    const int flags = stage_flags[2 * s] | stage_flags[2 * s + 1];
    unsigned char *ds_buf = sS + s * SBYTES;
    /* stage s's Q and dO: K-major for S^T and dP^T, N-major from the
     * consumer's first panel for dK and dV */
    const uint64_t kQs = flex_wgmma_desc_at(kQ, s * KBYTES), kOs = flex_wgmma_desc_at(kO, s * VBYTES),
                   nQs = flex_wgmma_desc_at(nQ, s * KBYTES + qcol), nOs = flex_wgmma_desc_at(nO, s * VBYTES + ocol);
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
      flex_wgmma_fence();
      /* (the general body's descriptors by 32-bit adds: flex_wgmma_desc_lo) */
      auto dat = [](uint64_t d, uint32_t off) { return GEN ? flex_wgmma_desc_lo(d, off) : flex_wgmma_desc_at(d, off); };
#pragma unroll
      for (int kk = 0; kk < EPT / 16; kk++) {
        const uint32_t off = (kk / 4) * PANEL + (kk % 4) * 32;
        W::template ss<BM, 0>(st, dat(kK, off), dat(kQs, off), kk > 0);
      }
#pragma unroll
      for (int kk = 0; kk < EVPT / 16; kk++) {
        const uint32_t off = (kk / 4) * PANEL + (kk % 4) * 32;
        W::template ss<BM, 0>(dpt, dat(kV, off), dat(kOs, off), kk > 0);
      }
      flex_wgmma_commit();

      /* While they run: the live bits. Only tiles at the sequence ends or
       * partial under the mask test elements. */
      const bool edge = n0 + BN > p.kv_len || m0 + BM > p.q_len;
      const bool check = GEN && (edge || (MASK_MODE != FLEX_MASK_NONE && !full));
      typename FlexBits<BM / 2>::T live[1] = {~(typename FlexBits<BM / 2>::T)0};
      if (check)
        flex_live_bits<MASK_MODE, 1, BM / 8, true>(live, p, b, h, n0 + 16 * w + g, m0 + 2 * t4, full);
      flex_wgmma_wait<0>();

      /* P^T into st, dS^T into dpt (both 0 where masked or underflowed), per
       * query column: its LSE and D from the tile's copy in shared memory,
       * not held in registers beside dK, dV, S^T and dP^T. */
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
            const int e = 4 * j + 2 * r + c, kj = n0 + 16 * w + g + 8 * r;
            const float qk = st[e];
            if (!GEN) { /* the same values as below, without branches */
              const float xs =
                  SCORE_ID ? flex_ex2(flex_nonpos(fmaf(qk, scale_log2, -lse2)))
                           : flex_ex2(flex_nonpos(fmaf(flex_score(p, qk * p.scale, b, h, qi, kj), FLEX_LOG2E, -lse2)));
              dpt[e] = xs * fmaf(dpt[e], p.scale, -dl);
              st[e] = xs;
              continue;
            }
            float x = 0.0f;
            if (live[0] >> e & 1) {
              /* user code never sees an element that is out of range or masked */
              const float sv = SCORE_ID ? qk : flex_score(p, qk * p.scale, b, h, qi, kj);
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
              if (x != 0.0f) ds = flex_joint(p, qk * p.scale, b, h, qi, kj, x * (dpt[e] - dl), cw == 0) * p.scale;
            } else {
              const float dsx = x * fmaf(dpt[e], p.scale, -dl);
              ds = x != 0.0f ? dsx : 0.0f;
            }
            st[e] = x;
            dpt[e] = ds;
          }
        }
      }
      uint32_t ap[BM / 16][4], as[BM / 16][4]; /* P^T, dS^T: A fragments of the k16 steps */
      flex_bwd_sm90_frag<El, BM>(ap, st);
      flex_bwd_sm90_frag<El, BM>(as, dpt);

      /* dS (this warp's 16 keys) into buffer s by stmatrix.trans (see
       * `ads`), a k16 step's four 8 x 8 blocks per instruction. Every
       * consumer holds the same dS^T; consumer 0 writes it. */
      if (cw == 0) {
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
    if (STEADY && flags == 0 && (!SCORE_ID || scale_log2 > 0.0f) && n0 + BN <= p.kv_len &&
        m0 + BM <= p.q_len && (MASK_MODE == FLEX_MASK_NONE || full))
      body(FlexBool<false>());
    else
      body(FlexBool<true>());
    flex_mbar_arrive(emptyb + s); /* the stage's Q and dO are no longer read */
    flex_fence_proxy_async();     /* the dS writes, before the wgmma (async proxy) reads them */
    flex_mbar_arrive(dsbar);

    /* dQ += dS K (dS scaled) over the consumer's columns: A = dS
     * (K-major), B = K (N-major). Every warp's dS is written first. */
    flex_mbar_wait(dsbar, (uint32_t)i & 1);
    const uint64_t kSs = flex_wgmma_desc_at(kS, s * SBYTES);
    if (DQB) {
      /* All EPT columns in one chain; warp w then holds rows 16 w .. 16 w
       * + 15 whole (element e at row g + 8 (e / 2 % 2), column 8 (e / 4)
       * + 2 t4 + e % 2) and stages them in buffer s (tile parity), which
       * the dQ warp adds to dq_acc (flex_bwd_sm90_dq_warp). */
      float dq[EPT / 2];
      flex_wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BN / 16; ks++)
        W::template ss<EPT, 1>(dq, flex_wgmma_desc_at(kSs, ks * 32), flex_wgmma_desc_at(nK, ks * 2048), ks > 0);
      flex_wgmma_commit();
      flex_wgmma_wait<0>();
      /* Buffer s is free once the dQ warp's reductions of tile i - 2 read it. */
      if (i >= 2) flex_mbar_wait(dqempty + s, (uint32_t)((i >> 1) - 1) & 1);
      const uint32_t at = flex_smem_addr(sdq + s * 64 * RF + (16 * w + g) * RF + 2 * t4);
#pragma unroll
      for (int j = 0; j < EPT / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
          flex_sts_f32x2_a(at + 4 * (8 * r * RF + 8 * j), dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
      flex_fence_proxy_async(); /* generic writes, then the reductions' async-proxy reads */
      flex_mbar_arrive(dqfull + s);
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
      float dq[BN / 2];
      const uint64_t nKc = flex_wgmma_desc_at(nK, __shfl_sync(0xffffffffu, c, 0) * PANEL);
      flex_wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BN / 16; ks++)
        W::template ss<64, 1>(dq, flex_wgmma_desc_at(kSs, ks * 32), flex_wgmma_desc_at(nKc, ks * 2048), ks > 0);
      flex_wgmma_commit();
      flex_wgmma_wait<0>();
      float *const at[2] = {dq0 + 64 * c, dq1 + 64 * c};
      const int room[2] = {ok0 ? p.E - 64 * c - 2 * t4 : 0, ok1 ? p.E - 64 * c - 2 * t4 : 0};
#pragma unroll
      for (int e = 0; e < BN / 2; e++) {
        const int k = 8 * (e / 4) + (e & 1), r = (e >> 1) & 1;
        flex_atomic_add_below(at[r] + k, dq[e], k, room[r]);
      }
    }
  }

  /* dK (scaled with dS) and dV of this thread's two keys, the consumer's columns. */
  T *dkp = (T *)p.dk + b * p.sdk.b + hk * p.sdk.h + cw * KC,
    *dvp = (T *)p.dv + b * p.sdv.b + hk * p.sdv.h + cw * VC;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int kj = n0 + 16 * w + g + 8 * r;
    if (kj >= p.kv_len) continue;
#pragma unroll
    for (int j = 0; j < KC / 8; j++)
#pragma unroll
      for (int c = 0; c < 2; c++)
        if (cw * KC + 8 * j + 2 * t4 + c < p.E)
          El::store(dkp + kj * p.sdk.row + 8 * j + 2 * t4 + c, dk[4 * j + 2 * r + c]);
#pragma unroll
    for (int j = 0; j < VC / 8; j++)
#pragma unroll
      for (int c = 0; c < 2; c++)
        if (cw * VC + 8 * j + 2 * t4 + c < p.EV)
          El::store(dvp + kj * p.sdv.row + 8 * j + 2 * t4 + c, dv[4 * j + 2 * r + c]);
  }
}

#endif /* FLEX_BWD_SM90_CUH */
