/* flex_bwd_sm90.cuh: the sm_90a backward's main kernel (fp16/bf16),
 * FlashAttention-3 style. flex_bwd_pre and flex_bwd_dq (flex_bwd.cuh) run
 * before and after it unchanged.
 *
 * One CTA per (64 keys, kv head, batch), as flex_bwd_tc, 128 (1 + NC)
 * threads:
 *   warpgroup 0, the producer: one elected thread of warp 0 loads the K and
 *     V tile once (TMA), then walks, for every query head of the kv head's
 *     group, the query tiles that see these keys (FlexWalk's backward walk,
 *     the only walk of the CTA) and loads each tile's Q and dO (TMA) through
 *     a 2-stage ring of full/empty mbarriers; the other 127 threads exit.
 *   warpgroups 1..NC, the consumers, 16 keys per warp, per step of QH
 *   query rows of the tile (QH = 64, or 32 when a consumer's dK and dV
 *   columns, KC + VC, pass 128):
 *     S^T = K Q^T and dP^T = V dO^T   wgmma SS (M = 64 keys, N = QH queries)
 *     P^T = exp(score - LSE), dS^T = P^T (dP^T - D) through the joint
 *       function, on the accumulator fragments (as flex_bwd_tc_scores)
 *     dV += P^T dO, dK += dS^T Q      wgmma RS: P^T and dS^T from registers
 *     dQ += dS K                      dS^T written to shared memory as dS
 *       ([query][key]); once the tile's steps are done, wgmma SS per
 *       64-column panel of K, then into dq_acc (scaled): with DQB (one
 *       consumer, E % 4 == 0) each warp stages its 16 rows in shared memory
 *       and adds them with a bulk reduction per row; else fp32 atomics (a
 *       compare of a constant and a predicated red each)
 *   A tile with an identity score and no buffer gradients, full under the
 *   mask and inside both sequences, runs its steps in a loop of their own
 *   with the steady body (no live bits, range tests or score code; P and
 *   dS without branches); the others in the general loop.
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
 * stage, written before the arrival that completes the stage's `full`
 * phase; a first row of -1 ends the loop. A consumer frees a stage once
 * the wgmma that read its Q and dO (dV, dK) have retired; `empty` counts
 * all 128 NC consumer threads, so the stage is refilled only after every
 * consumer is done with it.
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
 * with DQB the dQ staging (4 warps x 16 rows x FLEX_BWD_SM90_DQ_ROW
 * bytes); the tile's LSE and D (64 floats each); then 6 mbarriers and 6
 * stage words. EPT, EVPT: E and EV padded to 64 NC
 * (TMA zero-fills columns past E and EV, whole panels included, and rows
 * past Q_LEN and KV_LEN). At EPT = EVPT = 256: 64 KB of K and V, 128 KB of
 * Q and dO stages, 16 KB of dS, with the slack 214600 bytes of the 227 KB.
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
  constexpr int QH = KC + VC > 128 ? 32 : 64;    /* query rows per step of a tile */
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
  float *sdq = (float *)(sS + 2 * SBYTES); /* DQB: each warp's 16 dQ rows of a panel */
  /* the tile's LSE (exp2 domain) and D, a float per query row each */
  float *slse = (float *)((unsigned char *)sdq + (DQB ? 4 * 16 * FLEX_BWD_SM90_DQ_ROW : 0)), *sdl = slse + 64;
  uint64_t *kvbar = (uint64_t *)(sdl + 64), *fullb = kvbar + 1, *emptyb = kvbar + 3,
           *dsbar = kvbar + 5;
  int32_t *stage_m0 = (int32_t *)(kvbar + 6), *stage_full = stage_m0 + 2, *stage_h = stage_m0 + 4;
  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * BN, hk = blockIdx.y, b = blockIdx.z;
  const FlexTensorMap *tq = (const FlexTensorMap *)&t.tq, *tk = (const FlexTensorMap *)&t.tk,
                      *tv = (const FlexTensorMap *)&t.tv, *tdo = (const FlexTensorMap *)&t.tdo;

  if (tid == 0) {
    flex_mbar_init(kvbar, 1);
    for (int s = 0; s < 2; s++) {
      flex_mbar_init(fullb + s, 1);    /* the producer's arrival (+ the TMA bytes) */
      flex_mbar_init(emptyb + s, 128 * NC); /* every consumer thread */
    }
    flex_mbar_init(dsbar, 128 * NC);
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
    if (tid >= 32 || !flex_elect_one()) return;
    flex_mbar_arrive_expect_tx(kvbar, KBYTES + VBYTES);
#pragma unroll
    for (int c = 0; c < KP; c++) flex_tma_load_4d(sK + c * PANEL, tk, kvbar, 64 * c, n0, hk, b);
#pragma unroll
    for (int c = 0; c < VP; c++) flex_tma_load_4d(sV + c * PANEL, tv, kvbar, 64 * c, n0, hk, b);
    int i = 0;
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
        stage_m0[s] = m0, stage_full[s] = full, stage_h[s] = h;
        flex_mbar_arrive_expect_tx(fullb + s, KBYTES + VBYTES); /* Q and dO */
#pragma unroll
        for (int c = 0; c < KP; c++)
          flex_tma_load_4d(sQ + s * KBYTES + c * PANEL, tq, fullb + s, 64 * c, m0, h, b);
#pragma unroll
        for (int c = 0; c < VP; c++)
          flex_tma_load_4d(sO + s * VBYTES + c * PANEL, tdo, fullb + s, 64 * c, m0, h, b);
      }
    }
    const int s = i & 1; /* the end marker: no bytes */
    if (i >= 2) flex_mbar_wait(emptyb + s, (uint32_t)((i >> 1) - 1) & 1);
    stage_m0[s] = -1;
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
  float dk[KC / 2], dv[VC / 2];
#pragma unroll
  for (int i = 0; i < KC / 2; i++) dk[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < VC / 2; i++) dv[i] = 0.0f;
  const float scale_log2 = p.scale * FLEX_LOG2E;
  flex_mbar_wait(kvbar, 0);

#pragma unroll 1
  for (int i = 0;; i++) {
    /* s, the step offset and the panel below from lane 0: values carried
     * out of the loops' divergent waits, which ptxas would otherwise keep
     * in vector registers, and every descriptor made from them too */
    const int s = __shfl_sync(0xffffffffu, i & 1, 0);
    flex_mbar_wait(fullb + s, (uint32_t)(i >> 1) & 1);
    const int m0 = __shfl_sync(0xffffffffu, stage_m0[s], 0);
    if (m0 < 0) break;
    const bool full = __shfl_sync(0xffffffffu, stage_full[s], 0) != 0;
    const int h = __shfl_sync(0xffffffffu, stage_h[s], 0);
    const int64_t rows = (int64_t)(b * p.H + h) * p.q_len;
    /* The tile's LSE (exp2 domain; +inf for a row with no keys or past
     * Q_LEN, so its P is 0) and D (0 past Q_LEN) into shared memory, a row
     * per consumer thread of the first 128: every step reads its query
     * columns' pairs with one 8-byte load each instead of two global loads
     * and the LSE's conversion. Overwriting the last tile's is safe: this
     * thread passed that tile's `dsbar` phase, which every consumer thread
     * completed after its last step. */
    if (ct < 128) {
      const int r = ct % 64, qi = m0 + r;
      const bool ok = qi < p.q_len;
      if (ct < 64) {
        const float lse = ok ? flex_gload(p.lse + b * p.lse_b + h * p.lse_h + qi) : -INFINITY;
        slse[r] = lse == -INFINITY ? INFINITY : lse * FLEX_LOG2E;
      } else {
        sdl[r] = ok ? flex_gload(p.delta + rows + qi) : 0.0f;
      }
    }
    flex_bar_sync<1, 128 * NC>();

    /* The tile in steps of QH query rows (QH = 32 when a consumer's dK and
     * dV take 128 registers: S^T and dP^T of 64 rows beside them made
     * ptxas spill). */
    unsigned char *ds_buf = sS + s * SBYTES;
    /* Step hf of the tile. GEN: the general body; else the steady one, for
     * a tile with an identity score and no buffer gradients, full under
     * the mask and inside both sequences: no live bits, no range tests,
     * no score code, P and dS branch-free (the same values as the general
     * body's for every input: P = 0 where S is -inf, dS = 0 where P is). */
    auto step = [&](auto gen, int hf) {
      constexpr bool GEN = decltype(gen)::value;
      const int mh = m0 + QH * hf;
      const uint32_t qoff = __shfl_sync(0xffffffffu, hf * QH * 128, 0); /* the step's first row of Q, dO and dS */

      /* S^T = K Q^T and dP^T = V dO^T: every operand K-major with the
       * 128-byte swizzle (a k16 step is 32 bytes into the row; SBO 8 rows). */
      float st[QH / 2], dpt[QH / 2];
      /* the step's descriptors: its rows of Q and dO in stage s */
      const uint64_t kQs = flex_wgmma_desc_at(kQ, s * KBYTES + qoff), kOs = flex_wgmma_desc_at(kO, s * VBYTES + qoff),
                     nQs = flex_wgmma_desc_at(nQ, s * KBYTES + qcol + qoff),
                     nOs = flex_wgmma_desc_at(nO, s * VBYTES + ocol + qoff);
      flex_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < EPT / 16; kk++) {
        const uint32_t off = (kk / 4) * PANEL + (kk % 4) * 32;
        W::template ss<QH, 0>(st, flex_wgmma_desc_at(kK, off), flex_wgmma_desc_at(kQs, off),
                              kk > 0);
      }
#pragma unroll
      for (int kk = 0; kk < EVPT / 16; kk++) {
        const uint32_t off = (kk / 4) * PANEL + (kk % 4) * 32;
        W::template ss<QH, 0>(dpt, flex_wgmma_desc_at(kV, off), flex_wgmma_desc_at(kOs, off),
                              kk > 0);
      }
      flex_wgmma_commit();

      /* While they run: the live bits. Only steps at the sequence ends or
       * in a tile partial under the mask test elements. */
      const bool edge = n0 + BN > p.kv_len || mh + QH > p.q_len;
      const bool check = GEN && (edge || (MASK_MODE != FLEX_MASK_NONE && !full));
      typename FlexBits<QH / 2>::T live[1] = {~(typename FlexBits<QH / 2>::T)0};
      if (check)
        flex_live_bits<MASK_MODE, 1, QH / 8, true>(live, p, b, h, n0 + 16 * w + g, mh + 2 * t4, full);
      flex_wgmma_wait<0>();

      /* P^T into st, dS^T into dpt (both 0 where masked or underflowed), per
       * query column: its LSE and D from the tile's copy in shared memory,
       * not held in registers beside dK, dV, S^T and dP^T. */
#pragma unroll
      for (int j = 0; j < QH / 8; j++) {
        float lse2s[2], dls[2];
        flex_lds_f32x2(slse + QH * hf + 8 * j + 2 * t4, lse2s[0], lse2s[1]);
        flex_lds_f32x2(sdl + QH * hf + 8 * j + 2 * t4, dls[0], dls[1]);
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const int qi = mh + 8 * j + 2 * t4 + c;
          const float lse2 = lse2s[c], dl = dls[c];
#pragma unroll
          for (int r = 0; r < 2; r++) {
            const int e = 4 * j + 2 * r + c, kj = n0 + 16 * w + g + 8 * r;
            const float qk = st[e];
            if (!GEN) { /* the same values as below, without branches */
              const float xs = qk == -INFINITY ? 0.0f : flex_ex2(flex_nonpos(fmaf(qk, scale_log2, -lse2)));
              dpt[e] = xs != 0.0f ? xs * (dpt[e] - dl) : 0.0f;
              st[e] = xs;
              continue;
            }
            float x = 0.0f, ds = 0.0f;
            if (live[0] >> e & 1) {
              /* user code never sees an element that is out of range or masked */
              const float sv = SCORE_ID ? qk : flex_score(p, qk * p.scale, b, h, qi, kj);
              /* masked by the score (-inf): P = 0 even where LSE is NaN (docs/language.md);
               * at most 1 where a huge row's rounded LSE is below its max */
              x = sv == -INFINITY
                      ? 0.0f
                      : flex_ex2(flex_nonpos(fmaf(sv, SCORE_ID ? scale_log2 : FLEX_LOG2E, -lse2)));
            }
            if (x != 0.0f) { /* a NaN P reaches the gradients */
              const float dt = x * (dpt[e] - dl);
              /* the buffer gradients once: consumer 0's */
              ds = JOINT ? flex_joint(p, qk * p.scale, b, h, qi, kj, dt, cw == 0) : dt;
            }
            st[e] = x;
            dpt[e] = ds;
          }
        }
      }
      uint32_t ap[QH / 16][4], as[QH / 16][4]; /* P^T, dS^T: A fragments of the k16 steps */
      flex_bwd_sm90_frag<El, QH>(ap, st);
      flex_bwd_sm90_frag<El, QH>(as, dpt);

      /* dS (this warp's 16 keys of the step's query rows) into buffer s,
       * K-major [query][key] with the 128-byte swizzle: element (q, k) at
       * byte q * 128 + ((k / 8) ^ (q % 8)) * 16 + (k % 8) * 2. Element
       * e = 4 j + 2 r + c (q = 8 j + 2 t + c, k = 16 w + g + 8 r) is half c
       * of word as[j / 2][j % 2 * 2 + r]; q % 8 = 2 t + c and k / 8 = 2 w + r
       * do not depend on j, so four offsets serve the step (+ 1024 j).
       * Every consumer holds the same dS^T; consumer 0 writes it. */
      if (cw == 0) {
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
          for (int c = 0; c < 2; c++) {
            unsigned char *at = ds_buf + qoff + (2 * t4 + c) * 128 + (((2 * w + r) ^ (2 * t4 + c)) << 4) + 2 * g;
#pragma unroll
            for (int j = 0; j < QH / 8; j++)
              *(uint16_t *)(at + 1024 * j) = (uint16_t)(as[j / 2][j % 2 * 2 + r] >> (16 * c));
          }
      }

      /* dV += P^T dO and dK += dS^T Q over the consumer's columns: B is
       * N-major (imm-trans-b) from its first panel: LBO the next 64-column
       * panel, SBO 8 query rows, a k16 step 16 rows. */
      flex_wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < QH / 16; ks++)
        W::template rs<VC, 1>(dv, ap[ks], flex_wgmma_desc_at(nOs, ks * 2048), 1);
#pragma unroll
      for (int ks = 0; ks < QH / 16; ks++)
        W::template rs<KC, 1>(dk, as[ks], flex_wgmma_desc_at(nQs, ks * 2048), 1);
      flex_wgmma_commit();
      /* Retired here: ap and as are rewritten by the next step, and dQ's
       * accumulators are then never live beside them. */
      flex_wgmma_wait<0>();
    };
    /* Two loops of their own (the decision is the tile's, the same in
     * every thread of the CTA). The steady body would be right at the
     * sequence ends too (a query row past Q_LEN has LSE +inf and zeros
     * for Q and dO, which TMA fills in; a key past KV_LEN zeros for K and
     * V, so its P and dS reach only its own dK and dV, never stored, and
     * dQ through a K row of zeros), but without the range test ptxas 13
     * serializes the causal kernel's wgmma (C7514: accumulators read
     * inside a pipeline stage), so those tiles take the general body. */
    if (SCORE_ID && !JOINT && n0 + BN <= p.kv_len && m0 + BM <= p.q_len &&
        (MASK_MODE == FLEX_MASK_NONE || full)) {
#pragma unroll 1
      for (int hf = 0; hf < BM / QH; hf++) step(FlexBool<false>(), hf);
    } else {
#pragma unroll 1
      for (int hf = 0; hf < BM / QH; hf++) step(FlexBool<true>(), hf);
    }
    flex_mbar_arrive(emptyb + s); /* the stage's Q and dO are no longer read */
    flex_fence_proxy_async();     /* the dS writes, before the wgmma (async proxy) reads them */
    flex_mbar_arrive(dsbar);

    /* dQ += scale dS K over the consumer's columns, one 64-column panel of
     * K at a time (32 registers): A = dS (K-major), B = K (N-major). Every
     * warp's dS is written first. */
    flex_mbar_wait(dsbar, (uint32_t)i & 1);
    const bool ok0 = m0 + 16 * w + g < p.q_len, ok1 = m0 + 16 * w + g + 8 < p.q_len;
    float *const dq0 = p.dq_acc + (rows + m0 + 16 * w + g) * p.E + 2 * t4, *const dq1 = dq0 + 8 * p.E;
    const uint64_t kSs = flex_wgmma_desc_at(kS, s * SBYTES);
#pragma unroll 1
    for (int c = cw * (KP / NC); c < (cw + 1) * (KP / NC) && (NC == 1 || 64 * c < p.E); c++) {
      float dq[BN / 2];
      const uint64_t nKc = flex_wgmma_desc_at(nK, __shfl_sync(0xffffffffu, c, 0) * PANEL);
      flex_wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BN / 16; ks++)
        W::template ss<64, 1>(dq, flex_wgmma_desc_at(kSs, ks * 32),
                              flex_wgmma_desc_at(nKc, ks * 2048), ks > 0);
      flex_wgmma_commit();
      flex_wgmma_wait<0>();
      if (DQB) {
        /* Warp w holds rows 16 w .. 16 w + 15 of the panel whole (element
         * e at row g + 8 (e / 2 % 2), column 8 (e / 4) + 2 t4 + e % 2): it
         * stages them, scaled, in its own 16 rows of shared memory, and
         * lane l < 16 adds row l to dq_acc with one bulk reduction (256
         * bytes, or the E - 64 c columns left; E % 4 == 0 keeps every row
         * 16-byte aligned). Nothing crosses warps: __syncwarp orders a
         * lane's wait for its previous reduction's read before the
         * rewrite, and the rewrite (then fence.proxy.async: generic
         * writes, async-proxy reads) before the next reduction. */
        constexpr int RF = FLEX_BWD_SM90_DQ_ROW / 4; /* floats per staged row */
        float *const rows_at = sdq + w * 16 * RF;
        if (lane < 16) flex_bulk_wait_read<0>();
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
          for (int r = 0; r < 2; r++)
            flex_sts_f32x2(rows_at + (g + 8 * r) * RF + 8 * j + 2 * t4, dq[4 * j + 2 * r] * p.scale,
                           dq[4 * j + 2 * r + 1] * p.scale);
        flex_fence_proxy_async();
        __syncwarp();
        const int row = m0 + 16 * w + lane, cols = p.E - 64 * c < 64 ? p.E - 64 * c : 64;
        if (lane < 16 && row < p.q_len)
          flex_bulk_reduce_add_f32(p.dq_acc + (rows + row) * p.E + 64 * c, rows_at + lane * RF,
                                   4u * (uint32_t)cols);
        if (lane < 16) flex_bulk_commit();
        continue;
      }
      /* Element e is at column 64 c + 2 t4 + k, k = 8 (e / 4) + e % 2, of
       * row r = e / 2 % 2 (dq0, dq1); it exists when k < room[r] (columns
       * left in the row: 0 past Q_LEN): one compare of a constant and a
       * predicated red per element (flex_atomic_add_below), no address
       * arithmetic. ptxas 13 still sets each red of sm_90a behind a short
       * branch (BSSY, BRA, BSYNC): 3 of the loop's 7 instructions an
       * element, where sm_80's SASS predicates the red itself. */
      float *const at[2] = {dq0 + 64 * c, dq1 + 64 * c};
      const int room[2] = {ok0 ? p.E - 64 * c - 2 * t4 : 0, ok1 ? p.E - 64 * c - 2 * t4 : 0};
#pragma unroll
      for (int e = 0; e < BN / 2; e++) {
        const int k = 8 * (e / 4) + (e & 1), r = (e >> 1) & 1;
        flex_atomic_add_below(at[r] + k, dq[e] * p.scale, k, room[r]);
      }
    }
  }

  /* The last panels' reductions done before the block's shared memory goes. */
  if (DQB && lane < 16) flex_bulk_wait<0>();

  /* dK (scaled) and dV of this thread's two keys, the consumer's columns. */
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
          El::store(dkp + kj * p.sdk.row + 8 * j + 2 * t4 + c, dk[4 * j + 2 * r + c] * p.scale);
#pragma unroll
    for (int j = 0; j < VC / 8; j++)
#pragma unroll
      for (int c = 0; c < 2; c++)
        if (cw * VC + 8 * j + 2 * t4 + c < p.EV)
          El::store(dvp + kj * p.sdv.row + 8 * j + 2 * t4 + c, dv[4 * j + 2 * r + c]);
  }
}

#endif /* FLEX_BWD_SM90_CUH */
