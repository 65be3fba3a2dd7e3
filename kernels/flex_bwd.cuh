/* flex_bwd.cuh: the backward kernel bodies.
 *
 * flex_bwd_pre: one thread per query row: D = rowsum(dO * O) - dLSE (O in
 *   the input dtype, or fp32 for an fp32 O), sum |dO| where asked (dnorm), and
 *   zeroes the row of the fp32 dQ accumulator.
 * flex_bwd_tc (fp16/bf16) and flex_bwd_main (fp32): one CTA per (key tile
 *   of BN keys, kv head, batch). It walks every query head of its group (so
 *   grouped-query heads accumulate dK and dV in registers, no atomics) and,
 *   per head, the query tiles that see its keys; recomputes P from LSE;
 *   dV += P^T dO; dP = dO V^T; dt = P (dP - D); ds = joint(s, ..., dt) only
 *   where P != 0 (ds = dt when d score/d s == 1); dK += scale ds^T Q;
 *   dQ += scale ds K with fp32 atomics.
 *   flex_bwd_tc runs the five products on mma.sync m16n8k16 (fp32
 *   accumulators, operands from padded shared memory via ldmatrix, P and dS
 *   rounded to the input dtype as FlashAttention-2 does); flex_bwd_main is
 *   fp32 FMA on tiles in shared memory, 128 threads, TPR = 128 / BN threads
 *   per key row. flex_bwd_tc with an identity score and no dropout runs
 *   interior query tiles in a steady loop (no live bits, no bound checks,
 *   the walk in shared memory) and the others in a general one; other
 *   kernels run the general body on every tile (docs/kernels.md, "Steady
 *   and general loops").
 * flex_bwd_dq: one thread per query row: dQ accumulator -> dq (its dtype).
 * flex_grad_exact: a deterministic backward's exact buffer-gradient
 *   accumulator -> the fp32 gradient, one element per thread.
 *
 * A deterministic backward (FLEX_DETERMINISTIC, docs/kernels.md) runs
 * flex_bwd with a narrower grid: each CTA walks a strided set of key tiles
 * in order and adds dQ into its own slice of dq_acc without atomics;
 * buffer gradients go into exact integer accumulators (exact.cuh).
 */
#ifndef FLEX_BWD_CUH
#define FLEX_BWD_CUH

#include "common.cuh"
#include "walk.cuh"
#include "tile.cuh"
#include "bias.cuh"

/* El: element type of dO; OutEl: of O (El, or FlexF32 for an fp32 O). */
template <class El, class OutEl>
__device__ __forceinline__ void flex_bwd_pre(const FlexParams &p) {
  typedef typename El::T T;
  const int qi = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (qi >= p.q_len) return;
  const typename OutEl::T *o = (const typename OutEl::T *)p.out + b * p.so.b + h * p.so.h + qi * p.so.row;
  const T *d = (const T *)p.dout + b * p.sdo.b + h * p.sdo.h + qi * p.sdo.row;
  float acc = 0.0f, an = 0.0f;
  for (int e = 0; e < p.EV; e++) {
    const float x = El::load(d + e);
    acc = acc + OutEl::load(o + e) * x;
    an = an + fabsf(x);
  }
  const int64_t row = (int64_t)(b * p.H + h) * p.q_len + qi;
  if (p.dnorm) flex_gstore(p.dnorm + row, an);
  if (p.dlse) acc -= flex_gload(p.dlse + b * p.lse_b + h * p.lse_h + qi);
  flex_gstore(p.delta + row, acc);
#ifdef FLEX_SINK
  /* The sink's logit gets dsk = -Ps D, Ps = exp(sk - LSE): once per row,
   * nothing when Ps = 0 (no sink, or a +inf key outweighs it). */
  if (p.kv_off == 0) { /* the shard that carries the sink (flex_row_sink) */
    const float sk = flex_sink(p, b, h, qi); /* -inf: no sink, no weight (even with LSE -inf) */
    const float ps = sk != -INFINITY ? expf(sk - flex_gload(p.lse + b * p.lse_b + h * p.lse_h + qi)) : 0.0f;
    if (ps != 0.0f) flex_sink_grad(p, b, h, qi, -ps * acc);
  }
#endif
  float *dq = p.dq_acc + row * p.E;
  for (int e = 0; e < p.E; e++) flex_gstore(dq + e, 0.0f);
  for (int sp = 1; FLEX_DET && sp < p.dq_splits; sp++) /* the other slices */
    for (int e = 0; e < p.E; e++) flex_gstore(dq + sp * p.dq_split_stride + e, 0.0f);
}

/* Load R rows x C columns (zero-filled) of a 16-bit or fp32 tensor, as fp32. */
template <class El, int R, int C>
__device__ __forceinline__ void flex_tile_load_cvt(float *dst, int pitch, const typename El::T *src,
                                                   int64_t row_stride, int row0, int nrows,
                                                   int ncols) {
  for (int i = threadIdx.x; i < R * C; i += 128) {
    const int r = i / C, c = i % C;
    float x = 0.0f;
    if (row0 + r < nrows && c < ncols) x = El::load(src + (row0 + r) * row_stride + c);
    dst[r * pitch + c] = x;
  }
}

/* P, dS for one (key, query) pair; both 0 where the element is masked. */
template <int MASK_MODE, bool SCORE_ID, bool JOINT>
__device__ __forceinline__ void flex_bwd_elem(const FlexParams &p, float qk, float dp, float lse,
                                              float delta, int b, int h, int qi, int kj, bool full,
                                              float *P, float *dS) {
  *P = 0.0f;
  *dS = 0.0f;
  if (qi >= p.q_len || kj >= p.kv_len || lse == -INFINITY) return;
  if (MASK_MODE != FLEX_MASK_NONE && !full && !flex_mask(p, b, h, qi, kj)) return;
  const float s = qk * p.scale;
  const float d = flex_dqk(kj - qi, 0);
  const float t = SCORE_ID ? s : flex_score(p, s, b, h, qi, kj, d);
  if (t == -INFINITY) return; /* masked by the score: P = 0 even where LSE is NaN */
  const float pr = exp2f(flex_nonpos((t - lse) * FLEX_LOG2E)); /* at most 1 (flex_nonpos) */
  /* Underflow: no contribution. A NaN pr (the row's LSE is NaN, or
   * t = +inf) goes on into the gradients (IEEE). */
  if (pr == 0.0f) return;
  /* Dropout: M = keep / (1 - p) on P for dV and on dP (docs/language.md). */
  float M = 1.0f;
  if (FLEX_DROP) M = flex_drop_keep(p, b, h, qi, kj) ? p.drop_scale : 0.0f;
  const float dt = pr * (M * dp - delta);
  *P = pr * M;
  *dS = JOINT ? flex_joint(p, s, b, h, qi, kj, d, dt) : dt;
}

/* ---- fp32 SIMT ---------------------------------------------------------- */

/* One key tile of flex_bwd_main: keys n0_det .. n0_det + BN - 1, dQ into
 * dq_det in a deterministic backward; otherwise the CTA's own tile and
 * p.dq_acc, read where the atomic kernel always read them (its code does
 * not change with the deterministic variant). */
template <class El, int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID, bool JOINT>
__device__ __forceinline__ void flex_bwd_main_tile(const FlexParams &p, int n0_det, float *dq_det) {
  typedef typename El::T T;
  static_assert(BM == BN, "dQ reuses the key-row thread mapping for query rows");
  constexpr int TPR = 128 / BN;         /* threads per key row (and per query row for dQ) */
  constexpr int KS = EP + 1, VS = EVP + 1, PS = BM + 1;
  float *sK = (float *)flex_smem, *sV = sK + BN * KS, *sQ = sV + BN * VS, *sO = sQ + BM * KS;
  float *sP = sO + BM * VS, *sS = sP + BN * PS, *sL = sS + BN * PS, *sD = sL + BM;
  const int tid = threadIdx.x, n = tid / TPR, tr = tid % TPR;
  const int n0 = FLEX_DET ? n0_det : blockIdx.x * BN, hk = blockIdx.y, b = blockIdx.z, kj = n0 + n;
  const T *k = (const T *)p.k + b * p.sk.b + hk * p.sk.h;
  const T *v = (const T *)p.v + b * p.sv.b + hk * p.sv.h;
  flex_tile_load_cvt<El, BN, EP>(sK, KS, k, p.sk.row, n0, p.kv_len, p.E);
  flex_tile_load_cvt<El, BN, EVP>(sV, VS, v, p.sv.row, n0, p.kv_len, p.EV);

  float dk[EP / TPR], dv[EVP / TPR];
#pragma unroll
  for (int j = 0; j < EP / TPR; j++) dk[j] = 0.0f;
#pragma unroll
  for (int j = 0; j < EVP / TPR; j++) dv[j] = 0.0f;

  for (int h = hk * p.G; h < (hk + 1) * p.G; h++) {
    const T *q = (const T *)p.q + b * p.sq.b + h * p.sq.h;
    const T *dout = (const T *)p.dout + b * p.sdo.b + h * p.sdo.h;
    const int64_t rows = (int64_t)(b * p.H + h) * p.q_len;
    FlexWalk walk;
    walk.init(p, true, MASK_MODE == FLEX_MASK_LISTS, b, h, n0, BM);
    int m0;
    bool full;
    while (walk.next(p, m0, full)) {
      __syncthreads(); /* the previous tile's readers are done */
      flex_tile_load_cvt<El, BM, EP>(sQ, KS, q, p.sq.row, m0, p.q_len, p.E);
      flex_tile_load_cvt<El, BM, EVP>(sO, VS, dout, p.sdo.row, m0, p.q_len, p.EV);
      for (int i = tid; i < BM; i += 128) {
        const bool ok = m0 + i < p.q_len;
        sL[i] = ok ? flex_gload(p.lse + b * p.lse_b + h * p.lse_h + m0 + i) : -INFINITY;
        sD[i] = ok ? flex_gload(p.delta + rows + m0 + i) : 0.0f;
      }
      __syncthreads();
      /* P and dS for key n against the query rows tr + TPR * j. */
#pragma unroll
      for (int j = 0; j < BM / TPR; j++) {
        const int m = tr + TPR * j;
        float qk = 0.0f, dp = 0.0f;
#pragma unroll 8
        for (int e = 0; e < EP; e++) qk = qk + sQ[m * KS + e] * sK[n * KS + e];
#pragma unroll 8
        for (int e = 0; e < EVP; e++) dp = dp + sO[m * VS + e] * sV[n * VS + e];
        flex_bwd_elem<MASK_MODE, SCORE_ID, JOINT>(p, qk, dp, sL[m], sD[m], b, h, m0 + m, kj, full,
                                                  &sP[n * PS + m], &sS[n * PS + m]);
      }
      __syncthreads();
      /* dV += P^T dO and dK += dS^T Q for key n's columns tr + TPR * j. */
#pragma unroll
      for (int j = 0; j < EVP / TPR; j++) {
        float acc = dv[j];
#pragma unroll 8
        for (int m = 0; m < BM; m++) acc = acc + sP[n * PS + m] * sO[m * VS + tr + TPR * j];
        dv[j] = acc;
      }
#pragma unroll
      for (int j = 0; j < EP / TPR; j++) {
        float acc = dk[j];
#pragma unroll 8
        for (int m = 0; m < BM; m++) acc = acc + sS[n * PS + m] * sQ[m * KS + tr + TPR * j];
        dk[j] = acc;
      }
      /* dQ += scale dS K: thread rows are query rows here (BM == BN). */
      const int qm = tid / TPR;
      if (m0 + qm < p.q_len) {
        float *dq = (FLEX_DET ? dq_det : p.dq_acc) + (rows + m0 + qm) * p.E;
        for (int c = tr; c < p.E; c += TPR) {
          float acc = 0.0f;
#pragma unroll 8
          for (int nn = 0; nn < BN; nn++) acc = acc + sS[nn * PS + qm] * sK[nn * KS + c];
          if (acc != 0.0f) flex_dq_add(dq + c, acc * p.scale);
        }
      }
    }
  }
  if (kj >= p.kv_len) return;
  T *dkp = (T *)p.dk + b * p.sdk.b + hk * p.sdk.h + kj * p.sdk.row;
  T *dvp = (T *)p.dv + b * p.sdv.b + hk * p.sdv.h + kj * p.sdv.row;
#pragma unroll
  for (int j = 0; j < EP / TPR; j++)
    if (tr + TPR * j < p.E) El::store(dkp + tr + TPR * j, dk[j] * p.scale);
#pragma unroll
  for (int j = 0; j < EVP / TPR; j++)
    if (tr + TPR * j < p.EV) El::store(dvp + tr + TPR * j, dv[j]);
}

/* The key tiles of a CTA, the same for both bodies. Atomic: the CTA's own
 * tile (blockIdx.x), inlined. Deterministic (FLEX_DET): CTA x of the grid's
 * G = p.dq_splits takes key tiles x, x + G, x + 2G, ... in that order and
 * adds their dQ into slice x of dq_acc, which flex_bwd_dq sums in slice
 * order; its dK and dV stay in registers as before, so every gradient has
 * one summation order. There the tile is called, not inlined: the loop
 * with the tile inlined took flex_bwd at E = 128, bf16, sm_80 from 168
 * registers to 250-254 (what stays live across iterations); called, the
 * tile keeps the registers of the atomic kernel. Tile::run(p, n0, dq) is
 * one key tile (flex_bwd_main_tile or flex_bwd_tc_tile). */
template <class Tile>
__device__ FLEX_NOINLINE void flex_bwd_tile_call(const FlexParams &p, int n0, float *dq) {
  Tile::run(p, n0, dq);
}

template <class Tile, int BN>
__device__ __forceinline__ void flex_bwd_tiles(const FlexParams &p) {
  if (!FLEX_DET) {
    Tile::run(p, 0, nullptr);
    return;
  }
  float *dq = p.dq_acc + blockIdx.x * p.dq_split_stride;
  for (int n0 = blockIdx.x * BN; n0 < p.kv_len; n0 += gridDim.x * BN) {
    flex_bwd_tile_call<Tile>(p, n0, dq);
    __syncthreads(); /* the next tile reloads K and V */
  }
}

template <class El, int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID, bool JOINT>
struct FlexBwdMainTile {
  static __device__ __forceinline__ void run(const FlexParams &p, int n0, float *dq) {
    flex_bwd_main_tile<El, EP, EVP, BM, BN, MASK_MODE, SCORE_ID, JOINT>(p, n0, dq);
  }
};

template <class El, int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID, bool JOINT>
__device__ __forceinline__ void flex_bwd_main(const FlexParams &p) {
  flex_bwd_tiles<FlexBwdMainTile<El, EP, EVP, BM, BN, MASK_MODE, SCORE_ID, JOINT>, BN>(p);
}

/* ---- tensor cores (fp16, bf16) ----------------------------------------- */

/* Shapes of the tensor-core backward: BM = 64 query rows per iteration,
 * BN keys per CTA, NW = max(4, BN / 16) warps. Warp w works on key group
 * kg = w % WK (16 keys) and split sp = w / WK: in the score phase the split
 * picks BMW of the BM query rows (QC at a time, so the S and dP fragments
 * take QC / 2 registers each next to the dK and dV accumulators), in the
 * accumulate phase every NS-th 16-column group of dK and dV (so each thread
 * holds (EP + EVP) * BN / (32 NW) accumulators). For dQ, warp w owns query
 * rows 16 (w % 4) .. + 15 of the tile and every DW-th 16-column group from
 * w / 4, summed over all BN keys. */
template <int EP, int EVP, int BM, int BN>
struct FlexBwdShape {
  static constexpr int WK = BN / 16, NW = WK < 4 ? 4 : WK, NT = 32 * NW, NS = NW / WK;
  static constexpr int BMW = BM / NS, QC = BMW < 32 ? BMW : 32, DW = NW / 4;
  static constexpr int KS = EP + 8, VS = EVP + 8, PS = BM + 8; /* smem row pitches, elements */
  static constexpr int NGK = (EP / 16 + NS - 1) / NS, NGV = (EVP / 16 + NS - 1) / NS;
  static_assert(BM == 64 && (BN == 16 || BN == 32 || BN == 64 || BN == 128),
                "dQ: 4 warps of 16 rows (8 warps at BN = 128: two column halves)");
  static_assert(BMW % QC == 0 && QC % 16 == 0, "a warp's query rows are whole ldmatrix.x4 B tiles");
};

/* A lane's ldmatrix.x4 row, as an element offset into a tile of pitch P:
 * an A operand stored [row][k] (fa); a B operand stored [n][k], or an A
 * operand stored [k][row] read transposed (fb); a B operand stored [k][n]
 * read transposed (ft). */
__device__ __forceinline__ int flex_bwd_fa(int lane, int P) { return (lane & 15) * P + (lane >> 4) * 8; }
__device__ __forceinline__ int flex_bwd_fb(int lane, int P) {
  return ((lane & 7) + (lane >> 4) * 8) * P + ((lane >> 3) & 1) * 8;
}
__device__ __forceinline__ int flex_bwd_ft(int lane, int P) {
  return ((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 8;
}

/* acc[j] += A B^T for one warp: A is 16 rows (keys) at shared address aA
 * (this lane's fa row), B is QC rows (queries) at aB (its fb row), both
 * KT * 16 wide, row pitch STRIDE elements; acc[j] holds columns 8j..8j+7 in
 * the mma accumulator layout. */
template <class El, int QC, int KT, int STRIDE>
__device__ __forceinline__ void flex_bwd_mma_rows(float acc[][4], uint32_t aA, uint32_t aB) {
#pragma unroll
  for (int kk = 0; kk < KT; kk++) {
    uint32_t a[4];
    flex_ldsm_x4(a, aA + kk * 32);
#pragma unroll
    for (int nt = 0; nt < QC / 16; nt++) {
      uint32_t b[4];
      flex_ldsm_x4(b, aB + (uint32_t)((nt * 16 * STRIDE + kk * 16) * 2));
      El::mma(acc[2 * nt], a, b);
      El::mma(acc[2 * nt + 1], a, b + 2);
    }
  }
}

/* S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys (from kr) x QC
 * queries (from qc), then P^T and scale dS^T (both 0 where masked) rounded
 * into sP and sS [key][query]. aK, aV: this lane's fa rows of the warp's
 * keys; aQ, aO: its fb rows of query qc. */
template <class El, int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID, bool JOINT,
          bool GEN>
__device__ __forceinline__ void flex_bwd_tc_scores(const FlexParams &p, uint32_t aK, uint32_t aV,
                                                   uint32_t aQ, uint32_t aO, typename El::T *sP,
                                                   typename El::T *sS, const float *sL,
                                                   const float *sD, int b, int h, int m0, int n0,
                                                   bool full, bool check, int kr, int qc) {
  typedef FlexBwdShape<EP, EVP, BM, BN> S;
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  float st[S::QC / 8][4], dpt[S::QC / 8][4];
#if FLEX_BIAS
  /* S^T starts at the bias over the scale (bias.cuh): element c of tile j
   * is at kv - q = base + 8 (c / 2) - 8 j - c % 2 */
  FlexBias bias;
  bias.init(p, b, h, FLEX_LOG2E / (p.scale * FLEX_LOG2E));
  const float base = (float)(n0 + kr + g - (m0 + qc + 2 * t4));
#pragma unroll
  for (int j = 0; j < S::QC / 8; j++)
#pragma unroll
    for (int c = 0; c < 4; c++) st[j][c] = bias.at(base, (float)(8 * (c >> 1) - 8 * j - (c & 1))), dpt[j][c] = 0.0f;
#else
#pragma unroll
  for (int j = 0; j < S::QC / 8; j++)
#pragma unroll
    for (int c = 0; c < 4; c++) st[j][c] = dpt[j][c] = 0.0f;
#endif
  flex_bwd_mma_rows<El, S::QC, EP / 16, S::KS>(st, aK, aQ);   /* S^T = K Q^T */
  flex_bwd_mma_rows<El, S::QC, EVP / 16, S::VS>(dpt, aV, aO); /* dP^T = V dO^T */
  /* Accumulator element c of tile j: key kr + g + 8 (c / 2), query qc + 8 j + 2 t4 + c % 2.
   * Only the general body's tiles at the sequence ends or partial under
   * the mask test elements. GEN: the general body (live bits, the score
   * call, dropout); else a steady tile's, which for an identity score
   * without dropout takes the cheap path below. */
  typename FlexBits<S::QC / 2>::T live[1] = {~(typename FlexBits<S::QC / 2>::T)0};
  FlexAcc acc; /* the joint's gradients this tile adds to one element of */
  if (GEN && check)
    flex_live_bits<MASK_MODE, 1, S::QC / 8, true>(live, p, b, h, n0 + kr + g, m0 + qc + 2 * t4,
                                                  full);
  const float scale_log2 = p.scale * FLEX_LOG2E;
  /* This lane's first element of P^T and dS^T, and of the LSE and D of
   * its queries: every element below is at a constant offset from these. */
  typename El::T *const pw = sP + (kr + g) * S::PS + qc + 2 * t4, *const sw = pw + (sS - sP);
  const float *const lw = sL + qc + 2 * t4, *const dw = sD + qc + 2 * t4;
#pragma unroll
  for (int j = 0; j < S::QC / 8; j++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int key = kr + g + 8 * r, qm = qc + 8 * j + 2 * t4;
      /* this pair's kv - q: a base per tile and a constant (flex_dqk) */
      const int dbase = n0 + kr + g - (m0 + qc + 2 * t4);
      float pr[2], ds[2];
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int e = 4 * j + 2 * r + c;
        const float qk = st[j][e & 3];
        const float lse2 = lw[8 * j + c]; /* log2-domain LSE; +inf: no keys */
        const float dd = dw[8 * j + c];
        if (!GEN && SCORE_ID && !JOINT && !FLEX_DROP) {
          /* A steady tile: every element live, nothing to skip; a P that
           * underflowed to 0 meets dP - D in IEEE arithmetic. */
          const float x = flex_ex2(fmaf(qk, scale_log2, -lse2));
          pr[c] = x;
          ds[c] = x * (dpt[j][e & 3] - dd) * p.scale;
          continue;
        }
        float x = 0.0f;
        pr[c] = ds[c] = 0.0f;
        if (live[0] >> e & 1) {
          /* user code never sees an element that is out of range or masked */
          const float sv = SCORE_ID ? qk
                                    : flex_score(p, qk * p.scale, b, h, m0 + qm + c, n0 + key,
                                                 flex_dqk(dbase, 8 * r - 8 * j - c));
          /* masked by the score (-inf): P = 0 even where LSE is NaN (docs/language.md);
           * at most 1 where a huge row's rounded LSE is below its max */
          const float ex = fmaf(sv, SCORE_ID ? scale_log2 : FLEX_LOG2E, -lse2);
          x = sv == -INFINITY ? 0.0f : flex_ex2(flex_nonpos(ex));
        }
        if (x != 0.0f) { /* 0 where masked or underflowed; a NaN P reaches the gradients */
          /* Dropout: M = keep / (1 - p) on P for dV and on dP (docs/language.md). */
          float M = 1.0f;
          if (FLEX_DROP) M = flex_drop_keep(p, b, h, m0 + qm + c, n0 + key) ? p.drop_scale : 0.0f;
          const float dt = x * (M * dpt[j][e & 3] - dd);
          pr[c] = x * M;
          /* dS times the softmax scale, which both dK and dQ carry */
          ds[c] = (JOINT ? flex_joint(p, qk * p.scale, b, h, m0 + qm + c, n0 + key,
                                      flex_dqk(dbase, 8 * r - 8 * j - c), dt, true, &acc)
                         : dt) *
                  p.scale;
        }
      }
      *(uint32_t *)(pw + 8 * r * S::PS + 8 * j) = El::pack(pr[0], pr[1]);
      *(uint32_t *)(sw + 8 * r * S::PS + 8 * j) = El::pack(ds[0], ds[1]);
    }
  if (JOINT) flex_acc_flush(p, b, h, acc); /* the warp is converged here */
}

/* acc[i] += A (this warp's 16 keys x BM queries, stored [key][query], aA
 * its lane's fa row) times B (BM queries x the 16 columns of group
 * sp + NS i, stored [query][col] with pitch BS, aB its lane's ft row). */
template <class El, int NG, int NGRP, int BM, int BS>
__device__ __forceinline__ void flex_bwd_tc_accum(float acc[NG][2][4], uint32_t aA, uint32_t aB,
                                                  int sp, int NS) {
#pragma unroll
  for (int ks = 0; ks < BM / 16; ks++) {
    uint32_t a[4];
    flex_ldsm_x4(a, aA + ks * 32);
#pragma unroll
    for (int i = 0; i < NG; i++) {
      const int grp = sp + NS * i;
      if (grp >= NGRP) break; /* warp-uniform */
      uint32_t bb[4];
      flex_ldsm_x4_trans(bb, aB + (uint32_t)((ks * 16 * BS + grp * 16) * 2));
      El::mma(acc[i][0], a, bb);
      El::mma(acc[i][1], a, bb + 2);
    }
  }
}

/* dQ[rows qr..qr + 15] += dS K (dS carries the scale) for column groups
 * g0, g0 + DW, ..., added into the fp32 accumulator dq (row m0 of the tile)
 * per element. aS: this lane's fb row of sS at query qr (dS read
 * transposed as the A operand); aK: its ft row of sK at group g0. */
template <class El, int EP, int BN, int PS, int KS, int DW, bool GEN>
__device__ __forceinline__ void flex_bwd_tc_dq(const FlexParams &p, uint32_t aS, uint32_t aK,
                                               float *dq, int m0, int qr, int g0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  if (m0 + qr >= p.q_len) return; /* warp-uniform: these rows do not exist */
  float *const d0 = dq + (qr + g) * p.E + g0 * 16 + 2 * t4, *const d1 = d0 + 8 * p.E;
  /* Element offset `off` (from column 16 g0) of row g (g + 8) exists when
   * off < lim0 (lim1): the lane's columns below E, none past Q_LEN. */
  const int cols = p.E - g0 * 16 - 2 * t4;
  const int lim0 = m0 + qr + g < p.q_len ? cols : 0, lim1 = m0 + qr + g + 8 < p.q_len ? cols : 0;
  /* dS^T's fragments, loaded once for every column group; with dropout
   * once per group (its Philox rounds leave no registers for them: ptxas
   * spilled at E = 128). */
  constexpr bool RELOAD = GEN && FLEX_DROP;
  uint32_t a[RELOAD ? 1 : BN / 16][4];
#pragma unroll
  for (int ks = 0; !RELOAD && ks < BN / 16; ks++)
    flex_ldsm_x4_trans(a[ks], aS + (uint32_t)(ks * 16 * PS * 2));
#pragma unroll
  for (int i = 0; i < (EP / 16 + DW - 1) / DW; i++) {
    const int grp = DW * i; /* past g0 */
    /* warp-uniform; E rounds up to EP (a steady tile has E == EP) */
    if (g0 + grp >= EP / 16 || (GEN && (g0 + grp) * 16 >= p.E)) break;
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
      uint32_t bk[4];
      if (RELOAD) flex_ldsm_x4_trans(a[0], aS + (uint32_t)(ks * 16 * PS * 2));
      flex_ldsm_x4_trans(bk, aK + (uint32_t)((ks * 16 * KS + grp * 16) * 2));
      El::mma(acc[0], a[RELOAD ? 0 : ks], bk);
      El::mma(acc[1], a[RELOAD ? 0 : ks], bk + 2);
    }
    /* Every element is added, zeros included: a test per element costs
     * more issue slots than the adds it would save. */
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int off = grp * 16 + nt * 8 + (c & 1);
        float *const d = (c >> 1 ? d1 : d0) + off;
        const int lim = c >> 1 ? lim1 : lim0;
        if (!GEN) flex_dq_add(d, acc[nt][c]); /* an interior tile: every element exists */
        else if (!FLEX_DET) flex_atomic_add_below(d, acc[nt][c], off, lim);
        else if (off < lim) flex_dq_add(d, acc[nt][c]);
      }
  }
}

/* Write this warp's accumulators (16 keys x its column groups) as dK or dV. */
template <class El, int NG, int NGRP>
__device__ __forceinline__ void flex_bwd_tc_store(typename El::T *dst, int64_t row_stride,
                                                  const float acc[NG][2][4], int key0, int nkeys,
                                                  int ncols, int sp, int NS) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int i = 0; i < NG; i++)
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int key = key0 + g + 8 * (c >> 1), col = (sp + NS * i) * 16 + nt * 8 + 2 * t4 + (c & 1);
        if (sp + NS * i < NGRP && key < nkeys && col < ncols)
          El::store(dst + key * row_stride + col, acc[i][nt][c]);
      }
}

/* One key tile of flex_bwd_tc (n0_det, dq_det: as flex_bwd_main_tile). */
template <class El, int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID, bool JOINT>
__device__ __forceinline__ void flex_bwd_tc_tile(const FlexParams &p, int n0_det, float *dq_det) {
  typedef typename El::T T;
  typedef FlexBwdShape<EP, EVP, BM, BN> S;
  constexpr int NT = S::NT;
  T *sK = (T *)flex_smem, *sV = sK + BN * S::KS, *sQ = sV + BN * S::VS, *sO = sQ + BM * S::KS;
  T *sP = sO + BM * S::VS, *sS = sP + BN * S::PS;
  float *sL = (float *)(sS + BN * S::PS), *sD = sL + BM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  /* sp is 0 with one split (NS = 1): a constant, not a register per test. */
  const int kr = warp % S::WK * 16, sp = S::NS == 1 ? 0 : warp / S::WK, qw = sp * S::BMW;
  const int n0 = FLEX_DET ? n0_det : blockIdx.x * BN, hk = blockIdx.y, b = blockIdx.z;
  const T *k = (const T *)p.k + b * p.sk.b + hk * p.sk.h;
  const T *v = (const T *)p.v + b * p.sv.b + hk * p.sv.h;
  /* 32-bit shared addresses of this lane's ldmatrix rows, computed once,
   * each as one base plus the tile's offset: addresses that differ by a
   * constant (K and V, Q and dO, P^T and dS^T where the pitches agree)
   * then share a register, the difference an immediate of the ldmatrix. */
  const uint32_t s0 = flex_smem_addr(flex_smem);
  auto at = [&](const T *tile, int elem) {
    return s0 + (uint32_t)((tile - sK) + elem) * 2u;
  };
  const uint32_t aK = at(sK, kr * S::KS + flex_bwd_fa(lane, S::KS));
  const uint32_t aV = at(sV, kr * S::VS + flex_bwd_fa(lane, S::VS));
  const uint32_t aQ = at(sQ, qw * S::KS + flex_bwd_fb(lane, S::KS));
  const uint32_t aO = at(sO, qw * S::VS + flex_bwd_fb(lane, S::VS));
  const uint32_t aP = at(sP, kr * S::PS + flex_bwd_fa(lane, S::PS));
  const uint32_t aS = at(sS, kr * S::PS + flex_bwd_fa(lane, S::PS));
  const uint32_t aQt = at(sQ, flex_bwd_ft(lane, S::KS));
  const uint32_t aOt = at(sO, flex_bwd_ft(lane, S::VS));
  const int qr = warp % 4 * 16, g0 = warp / 4; /* dQ: rows and first column group */
  const uint32_t aSq = at(sS, qr + flex_bwd_fb(lane, S::PS));
  const uint32_t aKt = at(sK, g0 * 16 + flex_bwd_ft(lane, S::KS));
  flex_tile_load<T, BN, EP, NT>(sK, S::KS, k, p.sk.row, n0, p.kv_len, p.E, p.vec16);
  flex_tile_load<T, BN, EVP, NT>(sV, S::VS, v, p.sv.row, n0, p.kv_len, p.EV, p.vec16);
  flex_cp_async_commit();
  FlexTileCopy<T, BM, EP, S::KS, NT> copyQ;
  FlexTileCopy<T, BM, EVP, S::VS, NT> copyO;

  float dk[S::NGK][2][4], dv[S::NGV][2][4];
#pragma unroll
  for (int i = 0; i < S::NGK; i++)
#pragma unroll
    for (int c = 0; c < 8; c++) dk[i][c / 4][c % 4] = 0.0f;
#pragma unroll
  for (int i = 0; i < S::NGV; i++)
#pragma unroll
    for (int c = 0; c < 8; c++) dv[i][c / 4][c % 4] = 0.0f;

  copyQ.init(sQ, p.sq.row);
  copyO.init(sO, p.sdo.row);
  /* One query tile m0 of head h (full: under the mask). GEN: the general body,
   * for tiles at the sequence ends, partial under the mask, with a head
   * dim off its padding or a row whose LSE passes 2^16 in the exp2
   * domain; else the steady one (no live bits, no bound checks on dQ).
   * The steady body returns true, having done nothing past its loads,
   * when one of the tile's rows has such an LSE (the general body then
   * takes the tile). */
  auto tile = [&](auto gen, int h, int m0, bool full) {
    constexpr bool GEN = decltype(gen)::value;
    const T *q = (const T *)p.q + b * p.sq.b + h * p.sq.h;
    const T *dout = (const T *)p.dout + b * p.sdo.b + h * p.sdo.h;
    const int64_t rows = (int64_t)(b * p.H + h) * p.q_len;
    const float *lse = p.lse + b * p.lse_b + h * p.lse_h;
    __syncthreads(); /* the previous tile's readers are done */
    if (GEN) {
      copyQ.load(sQ, 0, q, p.sq.row, m0, p.q_len, p.E, p.vec16);
      copyO.load(sO, 0, dout, p.sdo.row, m0, p.q_len, p.EV, p.vec16);
    } else {
      copyQ.load_fast(0, q, p.sq.row, m0);
      copyO.load_fast(0, dout, p.sdo.row, m0);
    }
    flex_cp_async_commit();
    bool big = false;
    if (threadIdx.x < BM) {
      const int i = threadIdx.x;
      const bool ok = !GEN || m0 + i < p.q_len;
      /* LSE in the exp2 domain; a row with no keys (or past Q_LEN) gets
       * +inf, so every P of it is exp2(-inf) = 0. */
      const float l = ok ? flex_gload(lse + m0 + i) : -INFINITY;
      const float l2 = l == -INFINITY ? INFINITY : l * FLEX_LOG2E;
      sL[i] = l2;
      sD[i] = ok ? flex_gload(p.delta + rows + m0 + i) : 0.0f;
      big = !(fabsf(l2) < FLEX_BIG_ROW);
    }
    flex_cp_async_wait<0>();
    if (GEN) __syncthreads();
    else if (__syncthreads_or(big)) return true;
    const bool check = GEN && (n0 + BN > p.kv_len || m0 + BM > p.q_len ||
                               (MASK_MODE != FLEX_MASK_NONE && !full));
#pragma unroll
    for (int qc = 0; qc < S::BMW; qc += S::QC)
      flex_bwd_tc_scores<El, EP, EVP, BM, BN, MASK_MODE, SCORE_ID, JOINT, GEN>(
          p, aK, aV, aQ + qc * S::KS * 2, aO + qc * S::VS * 2, sP, sS, sL, sD, b, h, m0, n0,
          full, check, kr, qw + qc);
    __syncthreads();
    flex_bwd_tc_accum<El, S::NGV, EVP / 16, BM, S::VS>(dv, aP, aOt, sp, S::NS);
    flex_bwd_tc_accum<El, S::NGK, EP / 16, BM, S::KS>(dk, aS, aQt, sp, S::NS);
    flex_bwd_tc_dq<El, EP, BN, S::PS, S::KS, S::DW, GEN>(
        p, aSq, aKt, (FLEX_DET ? dq_det : p.dq_acc) + (rows + m0) * p.E, m0, qr, g0);
    return false;
  };
  /* An identity score without dropout takes the steady loop (its tiles
   * need no score call and no live bits: the cheap path of
   * flex_bwd_tc_scores), up to head dim 128. Other kernels walk every tile
   * with the general body, as one loop: with a score function's or
   * Philox's registers beside the dK and dV accumulators, or the 64 x 32
   * tiles of head dims past 128, a second loop and the published runs
   * spilled (ptxas, 255 registers). */
  constexpr bool STEADY = SCORE_ID && !JOINT && !FLEX_DROP && EP <= 128 && EVP <= 128;
  if (!STEADY) {
    for (int h = hk * p.G; h < (hk + 1) * p.G; h++) {
      FlexWalk walk;
      walk.init(p, true, MASK_MODE == FLEX_MASK_LISTS, b, h, n0, BM);
      int m0;
      bool full;
      while (walk.next(p, m0, full)) tile(FlexBool<true>(), h, m0, full);
    }
  } else {
    /* The walk lives in shared memory and only thread 0 runs it, over
     * the heads of the group in turn: before each run it publishes the run
     * (head, first column, end, class; a first column of -1: the end) in
     * `run`, which every thread reads after the barrier that follows.
     * Thread 0 writes the next run once every thread has passed a barrier
     * of this run's tiles (each tile starts with one), so after reading
     * it. So the walk's state is never live in registers through the
     * loops. */
    static_assert(sizeof(FlexWalk) + 4 * 4 <= FLEX_WALK_BYTES, "the walk's shared memory");
    FlexWalk *walk = (FlexWalk *)(sD + BM);
    int32_t *run = (int32_t *)(walk + 1);
    if (threadIdx.x == 0) run[0] = hk * p.G - 1; /* before the group's first head */
    /* Runs of query tiles of one class (FlexWalk::next_run): the steady
     * loop takes a run's tiles while they are interior, the general loop
     * the others (the last rows, partial tiles, huge rows) one by one. */
#pragma unroll 1
    for (;;) {
      if (threadIdx.x == 0) {
        int c0 = -1, c1 = 0, hh = run[0];
        bool f = false;
        /* One call site each for init and next_run (the classifier is
         * inlined into both). */
#pragma unroll 1
        for (;;) {
          if (hh >= hk * p.G && walk->next_run(p, c0, c1, f)) break;
          if (++hh == (hk + 1) * p.G) {
            c0 = -1;
            break;
          }
          walk->init(p, true, MASK_MODE == FLEX_MASK_LISTS, b, hh, n0, BM);
        }
        /* Whether this CTA's keys allow steady tiles: all below KV_LEN,
         * head dims on their padding (dQ's rows have E columns) and rows
         * 16-byte aligned (the unpredicated copies, FlexTileCopy::fixed);
         * computed here, where it is used, so that it is not held through
         * the loops. */
        const bool steady_keys = n0 + BN <= p.kv_len && decltype(copyQ)::fixed(p.E, p.vec16) &&
                                 decltype(copyO)::fixed(p.EV, p.vec16);
        /* bit 0: full; bit 1: its interior tiles take the steady loop */
        run[0] = hh, run[1] = c0, run[2] = c1;
        run[3] = f | (steady_keys && (MASK_MODE == FLEX_MASK_NONE || f)) << 1;
      }
      __syncthreads();
      const int h = run[0], c1 = run[2], cls = run[3];
      int m0 = run[1];
      if (m0 < 0) break;
#pragma unroll 1
      while (m0 < c1) {
        if (cls & 2) {
          const int end = min(c1, p.q_len - BM + 1); /* interior tiles: m0 + BM <= Q_LEN */
#pragma unroll 1
          for (; m0 < end; m0 += BM)
            if (tile(FlexBool<false>(), h, m0, true)) break;
        }
        if (m0 < c1) {
          tile(FlexBool<true>(), h, m0, (cls & 1) != 0);
          m0 += BM;
        }
      }
    }
  }
  flex_cp_async_wait<0>(); /* K and V when no query tile was visited */
  T *dkp = (T *)p.dk + b * p.sdk.b + hk * p.sdk.h + n0 * p.sdk.row;
  T *dvp = (T *)p.dv + b * p.sdv.b + hk * p.sdv.h + n0 * p.sdv.row;
  flex_bwd_tc_store<El, S::NGK, EP / 16>(dkp, p.sdk.row, dk, kr, p.kv_len - n0, p.E, sp, S::NS);
  flex_bwd_tc_store<El, S::NGV, EVP / 16>(dvp, p.sdv.row, dv, kr, p.kv_len - n0, p.EV, sp, S::NS);
}

template <class El, int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID, bool JOINT>
struct FlexBwdTcTile {
  static __device__ __forceinline__ void run(const FlexParams &p, int n0, float *dq) {
    flex_bwd_tc_tile<El, EP, EVP, BM, BN, MASK_MODE, SCORE_ID, JOINT>(p, n0, dq);
  }
};

/* In flex_bwd_tc_dq each dQ element of a tile is one lane's sum over the
 * tile's keys, added once, so a deterministic slice sees one add per tile. */
template <class El, int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID, bool JOINT>
__device__ __forceinline__ void flex_bwd_tc(const FlexParams &p) {
  flex_bwd_tiles<FlexBwdTcTile<El, EP, EVP, BM, BN, MASK_MODE, SCORE_ID, JOINT>, BN>(p);
}

/* dQ accumulator (fp32, contiguous) -> dq in its dtype and strides; in a
 * deterministic backward the sum of the slices, in slice order. */
template <class El>
__device__ __forceinline__ void flex_bwd_dq(const FlexParams &p) {
  typedef typename El::T T;
  const int qi = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (qi >= p.q_len) return;
  const float *acc = p.dq_acc + ((int64_t)(b * p.H + h) * p.q_len + qi) * p.E;
  T *dq = (T *)p.dq + b * p.sdq.b + h * p.sdq.h + qi * p.sdq.row;
  if (!FLEX_DET) {
    for (int e = 0; e < p.E; e++) El::store(dq + e, flex_gload(acc + e));
    return;
  }
  for (int e = 0; e < p.E; e++) {
    float x = flex_gload(acc + e);
    for (int sp = 1; sp < p.dq_splits; sp++) x = x + flex_gload(acc + sp * p.dq_split_stride + e);
    El::store(dq + e, x);
  }
}

/* flex_grad_exact: buffer gradient exact_slot's exact accumulator, plus
 * what its fp32 gradient already holds (zero, or earlier sequences of a
 * packed call), rounded once into that fp32 gradient. A grid-stride loop. */
__device__ __forceinline__ void flex_grad_exact_body(const FlexParams &p) {
  float *g = p.buf_grad[p.exact_slot];
  const int64_t *acc = p.grad_exact[p.exact_slot];
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < p.exact_len;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t w[FLEX_EXACT_WORDS]; /* through flex_gload, so the emulator checks the reads */
    for (int j = 0; j < FLEX_EXACT_WORDS; j++) w[j] = flex_gload(acc + i * FLEX_EXACT_WORDS + j);
    flex_gstore(g + i, flex_exact_value(w, flex_gload(g + i)));
  }
}

#endif /* FLEX_BWD_CUH */
