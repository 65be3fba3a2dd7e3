/* flex_fwd_sm90.cuh: the sm_90a forward (fp16/bf16), FlashAttention-3 style.
 *
 * One CTA per (64 NC query rows, head, batch), 1 + NC warpgroups:
 *   warpgroup 0, the producer: one elected thread of warp 0 walks the key
 *     tiles (FlexWalk, the only walk of the CTA) and issues the TMA loads
 *     (cp.async.bulk.tensor) of Q once and of K and V per tile through a
 *     2-stage ring of full/empty mbarriers; the other 127 threads exit.
 *   warpgroups 1..NC, the consumers, 64 query rows each, sharing every K/V
 *     tile: S = Q K^T with wgmma SS, the score, mask and online softmax on
 *     the accumulator fragment, then O += P V with wgmma RS (P converted to
 *     fp16/bf16 in registers), then each frees the stage (`empty` counts
 *     all 128 NC consumer threads). Tile i's S wgmma is issued ahead of
 *     tile i - 1's P V, so the softmax runs under the P V.
 * With NC = 2, setmaxnreg moves registers from the producer (40) to the
 * consumers (232; FlexSm90Regs): 384 threads would otherwise get 168 each. The two
 * consumers also take turns at issuing their wgmma (ping-pong): consumer
 * c waits at named barrier 1 + c for its turn, issues tile i's S (and tile
 * i - 1's P V), and hands the turn to the other at barrier 2 - c. So one
 * warpgroup's matrix products run while the other does its softmax (the
 * exp unit and the tensor cores busy at once), instead of both issuing
 * together and both waiting on exp together. Consumer 0 gives itself the
 * first turn (its arrival counts as the other's); the last hand-over is
 * never waited for, which the hardware allows (barriers reset with the CTA).
 * The producer tells the consumers which tile a stage holds (its first key
 * and the walk's `full` flag) in two shared words per stage, written before
 * the arrival that completes the stage's `full` phase; a first key of -1
 * ends the loop.
 *
 * Shared memory (base rounded up to 1024 bytes: the 128-byte swizzle
 * repeats every 1024): Q [NC][EPT/64 panels][64 rows][64 cols], K [2][EPT/64]
 * [BN][64], V [2][EVPT/64][BN][64], each panel written by one TMA box with
 * the 128-byte swizzle; then the mbarriers and the stage words. EPT, EVPT:
 * head dims padded to 64 (TMA zero-fills the columns past E and EV, and the
 * rows past Q_LEN and KV_LEN).
 *
 * The wgmma accumulator of a warpgroup's 64 x N tile gives thread
 * (warp w, lane 4 g + t) the elements d[4 j + c] at row 16 w + g + 8 (c / 2)
 * and column 8 j + 2 t + c % 2: per warp exactly the m16n8 fragments of
 * mma.sync, so the per-element code is flex_fwd_tc's with one m16 tile.
 */
#ifndef FLEX_FWD_SM90_CUH
#define FLEX_FWD_SM90_CUH

#include "flex_fwd.cuh"

#if !defined(FLEXC_EMU) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "flex_fwd_sm90.cuh needs sm_90a (wgmma)"
#endif

/* The wgmma of an element type. */
/* setmaxnreg's budget with two consumer warpgroups. The registers a
 * warpgroup gains with .inc come from the CTA's pool, which holds only
 * what other warpgroups gave back with .dec: a CTA of 384 threads under
 * __launch_bounds__(384, 1) is launched with 168 registers a thread
 * (65536 / 384 rounded down to 8), 64512 in all, not the register file's
 * 65536, and an .inc the pool cannot serve waits forever. With the
 * producer warpgroup keeping P, the two consumers can take C =
 * FlexSm90Regs<P>::consumer: 128 P + 256 C <= 384 x 168 (P 24: 240,
 * P 40: 232). */
#define FLEX_SM90_LAUNCH_REGS (65536 / 384 / 8 * 8) /* 168 */
#define FLEX_FWD_SM90_PREGS 40 /* the forward's producer: the walk and an elected lane's TMA */
template <int P> struct FlexSm90Regs {
  static_assert(P >= 24 && P < FLEX_SM90_LAUNCH_REGS && P % 8 == 0, "setmaxnreg: a multiple of 8 from 24");
  static constexpr int consumer = (384 * FLEX_SM90_LAUNCH_REGS - 128 * P) / 256 / 8 * 8;
};

template <class El> struct FlexWgmma;
template <> struct FlexWgmma<FlexF16> {
  template <int N, int TB>
  static __device__ __forceinline__ void ss(float *d, uint64_t da, uint64_t db, int scale_d) {
    flex_wgmma_ss_f16<N, 0, TB>(d, da, db, scale_d);
  }
  template <int N, int TB>
  static __device__ __forceinline__ void rs(float *d, const uint32_t a[4], uint64_t db, int scale_d) {
    flex_wgmma_rs_f16<N, TB>(d, a, db, scale_d);
  }
};
template <> struct FlexWgmma<FlexBF16> {
  template <int N, int TB>
  static __device__ __forceinline__ void ss(float *d, uint64_t da, uint64_t db, int scale_d) {
    flex_wgmma_ss_bf16<N, 0, TB>(d, da, db, scale_d);
  }
  template <int N, int TB>
  static __device__ __forceinline__ void rs(float *d, const uint32_t a[4], uint64_t db, int scale_d) {
    flex_wgmma_rs_bf16<N, TB>(d, a, db, scale_d);
  }
};

/* O += P V for one tile: BN / 16 RS wgmma (P in `a`); V's descriptor dv
 * (flex_fwd_sm90_vdesc) is N-major (imm-trans-b): LBO the next 64-column
 * panel, SBO 8 keys, a k16 step 16 rows of 128 bytes. */
template <int BN> __device__ __forceinline__ uint64_t flex_fwd_sm90_vdesc(uint32_t aV) {
  return flex_wgmma_desc(aV, BN * 128, 1024, 128);
}
template <class El, int EVPT, int BN>
__device__ __forceinline__ void flex_fwd_sm90_pv(float *o, const uint32_t (*a)[4], uint64_t dv) {
#pragma unroll
  for (int ks = 0; ks < BN / 16; ks++)
    FlexWgmma<El>::template rs<EVPT, 1>(o, a[ks], flex_wgmma_desc_at(dv, ks * 2048), 1);
}

/* A consumer warpgroup of flex_fwd_sm90: its O, row state and the tile
 * steps its two loops share. Tile i's S wgmma is issued before tile
 * i - 1's P V, and the softmax of tile i runs while that P V still
 * computes, so the tensor cores work through the softmax (FlashAttention-3's
 * intra-warpgroup overlap). P of tile i - 1 stays in `a` (the RS operand
 * registers) until the wait that retires its P V; O is rescaled only after
 * that wait, since the wgmma owns it until then. */
template <class El, class OutEl, int EPT, int EVPT, int BN, int NC, bool OVERLAP, int MASK_MODE,
          bool SCORE_ID>
struct FlexFwdSm90Consumer {
  typedef FlexWgmma<El> W;
  static constexpr uint32_t PANEL_Q = 64 * 128, PANEL_KV = BN * 128; /* bytes of one 64-column panel */
  static constexpr uint32_t KBYTES = EPT / 64 * PANEL_KV, VBYTES = EVPT / 64 * PANEL_KV;
  const FlexParams &p;
  uint64_t *emptyb;
  uint64_t dQ, dK, dV; /* descriptors of this consumer's Q and of stage 0's K and V */
  int cw, w, g, t4, r0, b, h;
  /* Named barriers: consumer cw's turn to issue wgmma (1 + cw), handing
   * it to the other (2 - cw), both of 256 threads (NC = 2); the
   * warpgroup's own (4 + cw, 128 threads). Held, not derived from cw at
   * each use: two instructions fewer a tile. */
  int bar_turn, bar_other, bar_red;
  float scale_log2;
#if FLEX_BIAS
  FlexBias bias; /* the head's bias over the scale */
#endif
  float o[EVPT / 2];
  float row_max[2], row_sum[2], corr[2]; /* per row (flex_row_step) */
  float sacc[BN / 2];     /* the tile's S, then P */
  uint32_t a[BN / 16][4]; /* P of the previous tile: the A fragments of its k16 steps */
  int ps;                 /* the previous tile's stage */
  bool prev;              /* a previous tile's P V is still to be issued */

  __device__ __forceinline__ FlexFwdSm90Consumer(const FlexParams &p_) : p(p_), ps(0), prev(false) {
#pragma unroll
    for (int i = 0; i < EVPT / 2; i++) o[i] = 0.0f;
#pragma unroll
    for (int r = 0; r < 2; r++) row_max[r] = -INFINITY, row_sum[r] = 0.0f;
  }

  /* The tile in stage s (keys n0..): its S and, behind it, the previous
   * tile's P V on the tensor cores; the scores and the rows' online-softmax
   * step. GEN: the tile may be at a sequence end or partial under the
   * mask (live bits, -inf for dead elements). Not GEN: returns whether a
   * row of the warpgroup takes flex_row_step's second form. */
  template <bool GEN>
  __device__ __forceinline__ bool front(int s, int n0, bool full) {
#if FLEX_BIAS
    /* S's accumulators start at the bias over the scale (bias.cuh) */
    const float base = (float)(n0 + 2 * t4 - (r0 + 16 * w + g));
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) sacc[4 * j + c] = bias.at(base, (float)(j * 8 + (c & 1) - (c >> 1) * 8));
#endif
    /* S = Q K^T: EPT / 16 wgmma of k16 (descriptors: see dQ's). */
    if (NC > 1) flex_bar_sync_id<256>(bar_turn);
    flex_wgmma_fence();
    const uint64_t dk = flex_wgmma_desc_at(dK, s * KBYTES);
#pragma unroll
    for (int kk = 0; kk < EPT / 16; kk++) {
      const uint32_t off = (kk % 4) * 32;
      W::template ss<BN, 0>(sacc, flex_wgmma_desc_at(dQ, (kk / 4) * PANEL_Q + off),
                            flex_wgmma_desc_at(dk, (kk / 4) * PANEL_KV + off), FLEX_BIAS || kk > 0);
    }
    flex_wgmma_commit();
    if (GEN ? prev : OVERLAP) { /* the previous tile's P V behind it; wait for S only */
      flex_wgmma_fence(); /* ptxas injects this one otherwise (C7519): the RS operands are registers */
      flex_fwd_sm90_pv<El, EVPT, BN>(o, a, flex_wgmma_desc_at(dV, ps * VBYTES));
      flex_wgmma_commit();
      if (NC > 1) flex_bar_arrive_id<256>(bar_other);
      flex_wgmma_wait<1>();
    } else {
      if (NC > 1) flex_bar_arrive_id<256>(bar_other);
      flex_wgmma_wait<0>();
    }

    /* Scale and score; out-of-range or masked elements are -inf. Only the
     * general loop's tiles test elements. */
    typename FlexBits<BN / 2>::T live[1];
    live[0] = ~(typename FlexBits<BN / 2>::T)0;
    if (GEN && (n0 + BN > p.kv_len || r0 + 64 > p.q_len || (MASK_MODE != FLEX_MASK_NONE && !full)))
      flex_live_bits<MASK_MODE, 1, BN / 8, false>(live, p, b, h, r0 + 16 * w + g, n0 + 2 * t4, full);
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const bool ok = !GEN || (live[0] >> (4 * j + c) & 1);
        float &x = sacc[4 * j + c];
        if (SCORE_ID) {
          if (GEN) x = ok ? x : -INFINITY;
        } else {
          const int qi = r0 + 16 * w + g + (c >> 1) * 8, kj = n0 + j * 8 + 2 * t4 + (c & 1);
          const float d = flex_dqk(n0 + 2 * t4 - (r0 + 16 * w + g), j * 8 + (c & 1) - (c >> 1) * 8);
          /* user code never sees an element that is out of range or masked */
          x = ok ? flex_score_l2(p, x, b, h, qi, kj, d) : -INFINITY;
        }
      }

    return step<GEN>();
  }

  /* Online softmax of rows g and g + 8 (the four lanes t4 share a row):
   * max, rescale factor (applied to O in back(), once the wgmma that owns
   * O has retired) and sums. GEN: rows in either form of flex_row_step.
   * Not GEN: only when every row of the warpgroup stays in the first form;
   * else nothing changes and it returns true (a decision of the whole
   * warpgroup, bar.red.or over its 128 threads), step<true> taking the
   * tile from here. */
  template <bool GEN>
  __device__ __forceinline__ bool step() {
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) tile_max[c >> 1] = flex_max_nan(tile_max[c >> 1], sacc[4 * j + c]);
    bool big = false;
#pragma unroll
    for (int r = 0; r < 2; r++) {
      tile_max[r] = flex_max_nan(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = flex_max_nan(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      big |= !GEN && SCORE_ID && flex_row_leaves_small(row_max[r], tile_max[r], scale_log2);
    }
    if (!GEN && SCORE_ID) {
      big = flex_bar_red_or_id<128>(bar_red, big);
      if (__any_sync(0xffffffffu, big)) return true;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      if (GEN || !SCORE_ID) { /* a score function's rows may stay at -inf */
        corr[r] = flex_row_step<SCORE_ID>(row_max[r], tile_max[r], scale_log2);
      } else { /* the new max is finite: it passed flex_row_leaves_small */
        const float m1 = flex_max_nan(row_max[r], tile_max[r]);
        corr[r] = flex_ex2(row_max[r] * scale_log2 - m1 * scale_log2);
        row_max[r] = m1;
      }
      row_sum[r] *= corr[r];
    }
    return false;
  }

  /* Whether a row of the warpgroup is in flex_row_step's second form (a
   * decision of the whole warpgroup): the steady loop takes none. */
  __device__ __forceinline__ bool any_big_row() {
    if (!SCORE_ID) return false; /* a score function's rows never are */
    bool big = false;
#pragma unroll
    for (int r = 0; r < 2; r++) big |= flex_row_big<SCORE_ID>(row_max[r], scale_log2);
    return __any_sync(0xffffffffu, flex_bar_red_or_id<128>(bar_red, big));
  }

  /* The rest of the tile of stage s: P, the previous P V retired (its stage
   * freed), O rescaled, P packed as the next P V's A fragments. GEN: rows in
   * flex_row_step's second form take x - a first. */
  template <bool GEN>
  __device__ __forceinline__ void back(int s) {
    float ra[2], rb[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      if (GEN || !SCORE_ID) flex_row_ab<SCORE_ID>(row_max[r], scale_log2, ra[r], rb[r]);
      else ra[r] = 0.0f, rb[r] = row_max[r] * scale_log2; /* finite: step<false> */
    }
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        if (GEN && SCORE_ID) sacc[4 * j + c] -= ra[c >> 1];
        sacc[4 * j + c] = flex_ex2(fmaf(sacc[4 * j + c], scale_log2, -rb[c >> 1]));
        row_sum[c >> 1] += sacc[4 * j + c];
      }

    /* The previous P V done: its stage is free, O and `a` are ours again.
     * The wait is unconditional (nothing is pending without a previous
     * tile): ptxas does not relate the two tests of `prev`, and behind a
     * conditional wait it sees O read while a wgmma may own it, and
     * serialises every wgmma of the kernel. */
    flex_wgmma_wait<0>();
    if (GEN ? prev : OVERLAP) flex_mbar_arrive(emptyb + ps); /* the stage's K and V are no longer read */
#pragma unroll
    for (int j = 0; j < EVPT / 8; j++) {
      o[4 * j] *= corr[0], o[4 * j + 1] *= corr[0];
      o[4 * j + 2] *= corr[1], o[4 * j + 3] *= corr[1];
    }
    /* P's accumulator layout is the A register fragment of a k16 step
     * (columns 16 ks .. 16 ks + 15 are n8 tiles 2 ks and 2 ks + 1). */
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
      a[ks][0] = El::pack(sacc[8 * ks], sacc[8 * ks + 1]);
      a[ks][1] = El::pack(sacc[8 * ks + 2], sacc[8 * ks + 3]);
      a[ks][2] = El::pack(sacc[8 * ks + 4], sacc[8 * ks + 5]);
      a[ks][3] = El::pack(sacc[8 * ks + 6], sacc[8 * ks + 7]);
    }
    if (!OVERLAP) { /* P V right away: S of the next tile is never live beside P and O */
      flex_wgmma_fence();
      flex_fwd_sm90_pv<El, EVPT, BN>(o, a, flex_wgmma_desc_at(dV, s * VBYTES));
      flex_wgmma_commit();
      flex_wgmma_wait<0>();
      flex_mbar_arrive(emptyb + s);
      return;
    }
    prev = true;
    ps = s;
  }

  /* The last tile's P V; O and LSE normalised and written. */
  __device__ __forceinline__ void finish() {
    if (prev) {
      flex_wgmma_fence();
      flex_fwd_sm90_pv<El, EVPT, BN>(o, a, flex_wgmma_desc_at(dV, ps * VBYTES));
      flex_wgmma_commit();
      flex_wgmma_wait<0>();
      flex_mbar_arrive(emptyb + ps);
    }
    typename OutEl::T *out = (typename OutEl::T *)p.out + b * p.so.b + h * p.so.h;
#pragma unroll
    for (int r = 0; r < 2; r++) {
      row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
      row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
      float lse;
      const int qi = r0 + 16 * w + g + r * 8;
      const float inv = flex_finish_row(row_max[r], flex_row_ref<SCORE_ID>(row_max[r], scale_log2),
                                        row_sum[r], &lse, flex_row_sink2(p, b, h, qi, false));
      if (qi >= p.q_len) continue;
      if (t4 == 0) flex_gstore(p.lse + b * p.lse_b + h * p.lse_h + qi, lse);
#pragma unroll
      for (int j = 0; j < EVPT / 8; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const int col = j * 8 + 2 * t4 + c;
          if (col < p.EV) OutEl::store(out + qi * p.so.row + col, o[4 * j + 2 * r + c] * inv);
        }
    }
  }
};

/* EPT, EVPT: E and EV padded to 64 (whole 128-byte swizzle rows); BN keys
 * per tile (at most 128: one 64-bit live word per thread); NC consumer
 * warpgroups; OVERLAP: tile i's S wgmma ahead of tile i - 1's P V (S, P and
 * O live at once: see cg_fwd_sm90_overlap). */
template <class El, class OutEl, int EPT, int EVPT, int BN, int NC, bool OVERLAP, int MASK_MODE,
          bool SCORE_ID>
__device__ __forceinline__ void flex_fwd_sm90(const FlexFwdTma &t) {
  const FlexParams &p = t.p;
  typedef FlexWgmma<El> W;
  constexpr int BM = 64 * NC, QP = EPT / 64, KP = EPT / 64, VP = EVPT / 64;
  static_assert(NC == 1 || NC == 2, "one or two consumer warpgroups");
  static_assert(EPT % 64 == 0 && EVPT % 64 == 0 && EPT <= 256 && EVPT <= 256, "head dims in 64-column panels");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 128, "BN: whole k16 steps, 64 live bits per thread");
  constexpr uint32_t PANEL_Q = 64 * 128, PANEL_KV = BN * 128; /* bytes of one 64-column panel */
  constexpr uint32_t QBYTES = QP * PANEL_Q, KBYTES = KP * PANEL_KV, VBYTES = VP * PANEL_KV;
  unsigned char *smem = flex_smem + ((1024u - (flex_smem_addr(flex_smem) & 1023u)) & 1023u);
  unsigned char *sQ = smem, *sK = sQ + NC * QBYTES, *sV = sK + 2 * KBYTES;
  uint64_t *qbar = (uint64_t *)(sV + 2 * VBYTES), *fullb = qbar + 1, *emptyb = qbar + 3;
  int32_t *stage_n0 = (int32_t *)(qbar + 5), *stage_full = stage_n0 + 2;
  const int tid = threadIdx.x;
  const int m0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
  const FlexTensorMap *tq = (const FlexTensorMap *)&t.tq, *tk = (const FlexTensorMap *)&t.tk,
                      *tv = (const FlexTensorMap *)&t.tv;
  /* No query rows (an empty sequence launches one CTA): nothing to write,
   * and an empty tensor's map must not be read. */
  if (m0 >= p.q_len) return;

  if (tid == 0) {
    flex_mbar_init(qbar, 1);
    for (int s = 0; s < 2; s++) {
      flex_mbar_init(fullb + s, 1);     /* the producer's arrival (+ the TMA bytes) */
      flex_mbar_init(emptyb + s, 128 * NC); /* every consumer thread */
    }
    /* The initialisations are generic-proxy writes the TMA unit (async
     * proxy) will update: make them visible to it before any copy. */
    flex_fence_proxy_async();
  }
  __syncthreads();

  /* the warpgroup from lane 0, as flex_bwd_sm90 (uniform registers) */
  if (__shfl_sync(0xffffffffu, tid / 128, 0) == 0) { /* ---- producer ---- */
    if (NC > 1) flex_setmaxnreg_dec<FLEX_FWD_SM90_PREGS>();
    if (tid >= 32 || !flex_elect_one()) return;
    flex_mbar_arrive_expect_tx(qbar, NC * QBYTES);
#pragma unroll
    for (int r = 0; r < NC; r++)
#pragma unroll
      for (int c = 0; c < QP; c++)
        flex_tma_load_4d(sQ + r * QBYTES + c * PANEL_Q, tq, qbar, 64 * c, m0 + 64 * r, h, b);
    FlexWalk walk;
    walk.init(p, false, MASK_MODE == FLEX_MASK_LISTS, b, h, m0, BN);
#pragma unroll 1
    for (int i = 0;; i++) {
      const int s = i & 1;
      /* The consumer freed this stage (the tile two back) before it is refilled. */
      if (i >= 2) flex_mbar_wait(emptyb + s, (uint32_t)((i >> 1) - 1) & 1);
      int n0 = 0;
      bool full = false;
      const bool have = walk.next(p, n0, full);
      stage_n0[s] = have ? n0 : -1;
      stage_full[s] = full;
      if (!have) {
        flex_mbar_arrive(fullb + s); /* no bytes: the end marker */
        return;
      }
      flex_mbar_arrive_expect_tx(fullb + s, KBYTES + VBYTES);
#pragma unroll
      for (int c = 0; c < KP; c++)
        flex_tma_load_4d(sK + s * KBYTES + c * PANEL_KV, tk, fullb + s, 64 * c, n0, hk, b);
#pragma unroll
      for (int c = 0; c < VP; c++)
        flex_tma_load_4d(sV + s * VBYTES + c * PANEL_KV, tv, fullb + s, 64 * c, n0, hk, b);
    }
  }

  /* ---- consumer cw: query rows r0 .. r0 + 63, warp w owns 16 w .. 16 w + 15 of them ---- */
  if (NC > 1) flex_setmaxnreg_inc<FlexSm90Regs<FLEX_FWD_SM90_PREGS>::consumer>();
  FlexFwdSm90Consumer<El, OutEl, EPT, EVPT, BN, NC, OVERLAP, MASK_MODE, SCORE_ID> c(p);
  const int ct = tid - 128;
  /* cw from lane 0 (__shfl_sync): ptxas then knows it warp-uniform, and
   * with it every descriptor and barrier id, which stay in uniform
   * registers; from threadIdx it rebuilt each descriptor in vector
   * registers and moved it over (R2UR) before every wgmma. The same for
   * the stage words and the big-row vote in the loops. */
  c.cw = __shfl_sync(0xffffffffu, ct / 128, 0), c.w = ct / 32 % 4, c.g = ct % 32 / 4, c.t4 = ct % 4;
  c.bar_turn = 1 + c.cw, c.bar_other = 2 - c.cw, c.bar_red = 4 + c.cw;
  c.r0 = m0 + 64 * c.cw, c.b = b, c.h = h;
  /* S = Q K^T: both operands K-major with the 128-byte swizzle (LBO
   * unused, SBO 8 rows); a k16 step is 32 bytes into the row. Q's
   * descriptor has aq >> 30 (always 0: shared addresses are below 2^18)
   * in its high word, so that ptxas does not see that word as a constant:
   * it then advances the descriptor with one 64-bit add, as K's, not an
   * add, an add with carry and a move of the constant per wgmma. */
  const uint32_t aq = flex_smem_addr(sQ + c.cw * QBYTES);
  c.dQ = flex_wgmma_desc(aq, 16, 1024, 128) | (uint64_t)(aq >> 30) << 32;
  c.dK = flex_wgmma_desc(flex_smem_addr(sK), 16, 1024, 128);
  c.dV = flex_fwd_sm90_vdesc<BN>(flex_smem_addr(sV));
  c.emptyb = emptyb;
  /* The turns (NC = 2): barrier 1 + cw is this consumer's, of 256 threads
   * (its own wait and the other's hand-over). */
  if (NC > 1 && c.cw == 0) flex_bar_arrive<1, 256>();
  flex_mbar_wait(qbar, 0);
  /* An identity score keeps S unscaled, as flex_fwd_tc does: the running
   * max is taken on Q K^T and s = scale log2 e goes into the exponent's
   * FMA (x s - m s), one instruction per element instead of a multiply and
   * a subtract. That needs s positive and finite; any other scale is folded
   * into this consumer's Q in shared memory once (times -1 for a negative
   * one, exact; else times the scale, whose log2-domain value underflows or
   * overflows, s = log2 e): generic-proxy writes, then the proxy fence and
   * a barrier of every consumer thread before the first wgmma reads Q (one
   * barrier id for all: a branch on cw around the barrier cost 150
   * instructions a tile, as the turns' register ids did). A score
   * function returns log2-domain logits (s = 1). */
  float sl = SCORE_ID ? p.scale * FLEX_LOG2E : 1.0f;
  if (SCORE_ID && !(sl > 0.0f && sl < INFINITY)) {
    const bool neg = sl < 0.0f && sl > -INFINITY;
    const float f = neg ? -1.0f : p.scale;
    typename El::T *q = (typename El::T *)(sQ + c.cw * QBYTES);
    for (int e = ct % 128; e < (int)(QBYTES / 2); e += 128) q[e] = El::mul(q[e], f);
    flex_fence_proxy_async();
    flex_bar_sync<3, 128 * NC>(); /* every consumer thread: NC is all of them */
    sl = neg ? -sl : FLEX_LOG2E;
  }
  c.scale_log2 = sl;
#if FLEX_BIAS
  /* The bias over the scale, so that the accumulator times sl is the
   * logit times log2 e whichever way sl was made. */
  c.bias.init(p, b, h, FLEX_LOG2E / sl);
#endif

  /* Two loops, as flex_fwd_tc's: the steady one takes the tiles that need
   * no per-element test (full under the mask, every key below KV_LEN, this
   * consumer's rows below Q_LEN), the general one the others. A
   * warpgroup whose rows pass 2^16 in the exp2 domain (flex_row_step)
   * finishes that tile with the general code (resume): the decision is the
   * warpgroup's (bar.red.or over its 128 threads), since every wgmma after
   * it must be the same instruction for all four warps. */
  const bool rows_in = c.r0 + 64 <= p.q_len;
  int i = 0, s = 0, n0 = 0;
  bool full = false, resume = false;
  /* Tile i's stage words; false at the end. */
  auto next = [&]() {
    s = i & 1;
    flex_mbar_wait(fullb + s, (uint32_t)(i >> 1) & 1);
    n0 = __shfl_sync(0xffffffffu, stage_n0[s], 0);
    full = __shfl_sync(0xffffffffu, stage_full[s], 0) != 0;
    return n0 >= 0;
  };
  auto steady = [&]() { return rows_in && (MASK_MODE == FLEX_MASK_NONE || full) && n0 + BN <= p.kv_len; };
  if (EVPT > 128) {
    /* A head dim past 128 (O in 128 registers) runs every tile in the
     * general loop, one loop with no resume path: with both loops ptxas
     * spilled in the consumers' 232 registers (every identity-score
     * sample at E = 256, 32 to 84 bytes). A score function takes both
     * loops up to 128 since its descriptors left the vector registers
     * (softcap, gemma2 and relpos_bias spilled at E = 128 before); its
     * rows never take the second form (its logits are scaled already), so
     * its steady step keeps flex_row_step's -inf handling instead of the
     * big-row test. */
#pragma unroll 1
    while (next()) {
      c.template front<true>(s, n0, full);
      c.template back<true>(s);
      i++;
    }
    c.finish();
    return;
  }
#pragma unroll 1
  for (;;) {
    if (!resume && !next()) break;
    /* Each loop waits for its next tile at its end, so the two are loops
     * of their own (a loop entered at the top of this one would share its
     * header and become one with it). */
    /* The steady loop's first tile also has a previous tile's P V to
     * issue (OVERLAP) and its rows in the first form. */
    if (!resume && steady() && (!OVERLAP || c.prev) && !c.any_big_row()) {
#pragma unroll 1
      do {
        if (c.template front<false>(s, n0, true)) {
          /* Retire the previous P V here, not in back(): ptxas then sees
           * no wgmma in flight where the paths meet (one in flight on the
           * resume path only would serialise every wgmma of the kernel). */
          flex_wgmma_wait<0>();
          resume = true;
          break;
        }
        c.template back<false>(s);
        i++;
      } while (next() && steady());
    } else {
#pragma unroll 1
      do {
        if (!resume) c.template front<true>(s, n0, full);
        else c.template step<true>(); /* the steady loop scored it and left it at its step */
        resume = false;
        c.template back<true>(s);
        i++;
      } while (next() && !steady());
    }
  }
  c.finish();
}

#endif /* FLEX_FWD_SM90_CUH */
