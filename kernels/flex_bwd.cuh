/* flex_bwd.cuh: the backward kernel bodies.
 *
 * flex_bwd_pre: one thread per query row: D = rowsum(dO * O) - dLSE, and
 *   zeroes the row of the fp32 dQ accumulator.
 * flex_bwd_main: one CTA per (key tile of BN keys, kv head, batch). It walks
 *   every query head of its group (so grouped-query heads accumulate dK and
 *   dV in registers, no atomics) and, per head, the query tiles that see its
 *   keys; recomputes P from LSE; dV += P^T dO; dP = dO V^T; dt = P (dP - D);
 *   ds = joint(s, ..., dt) only where P != 0 (ds = dt when d score/d s == 1);
 *   dK += scale ds^T Q; dQ += scale ds K with fp32 atomics.
 *   All arithmetic is fp32 FMA on tiles staged (converted to fp32) in
 *   shared memory; 128 threads, TPR = 128 / BN threads per key row.
 * flex_bwd_dq: one thread per query row: dQ accumulator -> dq (its dtype).
 */
#ifndef FLEX_BWD_CUH
#define FLEX_BWD_CUH

#include "common.cuh"
#include "walk.cuh"

/* El: element type; EV: padded value head dim (a loop bound). */
template <class El, int EV>
__device__ __forceinline__ void flex_bwd_pre(const FlexParams &p) {
  typedef typename El::T T;
  const int qi = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (qi >= p.q_len) return;
  const T *o = (const T *)p.out + b * p.so.b + h * p.so.h + qi * p.so.row;
  const T *d = (const T *)p.dout + b * p.sdo.b + h * p.sdo.h + qi * p.sdo.row;
  float acc = 0.0f;
  for (int e = 0; e < p.EV; e++) acc = acc + El::load(o + e) * El::load(d + e);
  const int64_t row = (int64_t)(b * p.H + h) * p.q_len + qi;
  if (p.dlse) acc -= flex_gload(p.dlse + b * p.lse_b + h * p.lse_h + qi);
  flex_gstore(p.delta + row, acc);
  float *dq = p.dq_acc + row * p.E;
  for (int e = 0; e < p.E; e++) flex_gstore(dq + e, 0.0f);
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
  const float t = SCORE_ID ? s : flex_score(p, s, b, h, qi, kj);
  const float pr = exp2f((t - lse) * FLEX_LOG2E);
  if (!(pr > 0.0f)) return; /* masked by the score (-inf) or underflow: no contribution */
  const float dt = pr * (dp - delta);
  *P = pr;
  *dS = JOINT ? flex_joint(p, s, b, h, qi, kj, dt) : dt;
}

template <class El, int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID, bool JOINT>
__device__ __forceinline__ void flex_bwd_main(const FlexParams &p) {
  typedef typename El::T T;
  static_assert(BM == BN, "dQ reuses the key-row thread mapping for query rows");
  constexpr int TPR = 128 / BN;         /* threads per key row (and per query row for dQ) */
  constexpr int KS = EP + 1, VS = EVP + 1, PS = BM + 1;
  float *sK = (float *)flex_smem, *sV = sK + BN * KS, *sQ = sV + BN * VS, *sO = sQ + BM * KS;
  float *sP = sO + BM * VS, *sS = sP + BN * PS, *sL = sS + BN * PS, *sD = sL + BM;
  const int tid = threadIdx.x, n = tid / TPR, tr = tid % TPR;
  const int n0 = blockIdx.x * BN, hk = blockIdx.y, b = blockIdx.z, kj = n0 + n;
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
    walk.init(p.full_q_list, p.q_list, MASK_MODE == FLEX_MASK_LISTS, b, h, n0, p.block_kv,
              p.block_q, BM, p.q_len);
    int m0;
    bool full;
    while (walk.next(m0, full)) {
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
        float *dq = p.dq_acc + (rows + m0 + qm) * p.E;
        for (int c = tr; c < p.E; c += TPR) {
          float acc = 0.0f;
#pragma unroll 8
          for (int nn = 0; nn < BN; nn++) acc = acc + sS[nn * PS + qm] * sK[nn * KS + c];
          if (acc != 0.0f) flex_atomic_add(dq + c, acc * p.scale);
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

/* dQ accumulator (fp32, contiguous) -> dq in its dtype and strides. */
template <class El>
__device__ __forceinline__ void flex_bwd_dq(const FlexParams &p) {
  typedef typename El::T T;
  const int qi = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (qi >= p.q_len) return;
  const float *acc = p.dq_acc + ((int64_t)(b * p.H + h) * p.q_len + qi) * p.E;
  T *dq = (T *)p.dq + b * p.sdq.b + h * p.sdq.h + qi * p.sdq.row;
  for (int e = 0; e < p.E; e++) El::store(dq + e, flex_gload(acc + e));
}

#endif /* FLEX_BWD_CUH */
