/* flex_fwd.cuh: the forward kernel bodies.
 *
 * flex_fwd_tc (fp16/bf16): FlashAttention-2 style. One CTA per (query tile
 * of BM rows, head, batch); BM/16 warps, each owning 16 query rows. K/V
 * tiles of BN keys stream through a 2-stage cp.async pipeline into padded
 * shared memory (row pitch = head dim + 8 elements, so ldmatrix rows hit
 * distinct banks). S = Q K^T and O += P V run on mma.sync m16n8k16 with
 * fp32 accumulators; the online softmax works in the exp2 domain.
 *
 * flex_fwd_simt (fp32): the same walk and softmax with FMA on fp32 in
 * shared memory: fp32-accurate, no tensor cores, no TF32.
 *
 * Both: scale, then the score function, then the mask (skipped on blocks a
 * BlockMask lists as full), keys past KV_LEN are -inf. Fully masked rows
 * give O = 0 and LSE = -inf.
 */
#ifndef FLEX_FWD_CUH
#define FLEX_FWD_CUH

#include "common.cuh"
#include "walk.cuh"
#include "tile.cuh"

/* The scaled, scored, masked logit of one element, in the exp2 domain. */
template <int MASK_MODE, bool SCORE_ID>
__device__ __forceinline__ float flex_fwd_logit(const FlexParams &p, float acc, int b, int h, int qi,
                                                int kj, bool full) {
  /* Out-of-range rows and keys never reach user code: it may index buffers by them. */
  if (kj >= p.kv_len || qi >= p.q_len) return -INFINITY;
  if (MASK_MODE != FLEX_MASK_NONE && !full && !flex_mask(p, b, h, qi, kj)) return -INFINITY;
  if (SCORE_ID) return acc * (p.scale * FLEX_LOG2E);
  return flex_score(p, acc * p.scale, b, h, qi, kj) * FLEX_LOG2E;
}

/* Online-softmax update of one row: returns the factor old results scale by. */
__device__ __forceinline__ float flex_softmax_rescale(float &row_max, float tile_max) {
  const float m_new = fmaxf(row_max, tile_max);
  /* A row that has seen only -inf keeps max -inf; use 0 so exp2 gives 0, not NaN. */
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float corr = exp2f(row_max - m_use);
  row_max = m_new;
  return corr;
}

/* Final O scale and LSE (natural log) of a row; fully masked rows: 0, -inf. */
__device__ __forceinline__ float flex_finish_row(float row_max, float row_sum, float *lse) {
  if (row_sum == 0.0f || row_max == -INFINITY) {
    *lse = -INFINITY;
    return 0.0f;
  }
  *lse = (row_max + log2f(row_sum)) * FLEX_LN2;
  return 1.0f / row_sum;
}

/* ---- tensor cores (fp16, bf16) ----------------------------------------- */

/* EP, EVP: head dims padded to multiples of 16. BM = 16 * warps. */
template <class El, int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID>
__device__ __forceinline__ void flex_fwd_tc(const FlexParams &p) {
  typedef typename El::T T;
  constexpr int NT = BM / 16 * 32;
  constexpr int QS = EP + 8, KS = EP + 8, VS = EVP + 8; /* smem row pitch, elements */
  T *sQ = (T *)flex_smem;
  T *sK = sQ + BM * QS;           /* [2][BN][KS] */
  T *sV = sK + 2 * BN * KS;       /* [2][BN][VS] */
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int m0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
  const T *q = (const T *)p.q + b * p.sq.b + h * p.sq.h;
  const T *k = (const T *)p.k + b * p.sk.b + hk * p.sk.h;
  const T *v = (const T *)p.v + b * p.sv.b + hk * p.sv.h;

  flex_tile_load<T, BM, EP, NT>(sQ, QS, q, p.sq.row, m0, p.q_len, p.E, p.vec16);
  flex_cp_async_commit();

  FlexWalk walk;
  walk.init(p, false, MASK_MODE == FLEX_MASK_LISTS, b, h, m0, BN);
  int n0 = 0, n1 = 0;
  bool full = false, full1 = false;
  bool have = walk.next(n0, full);
  if (have) {
    flex_tile_load<T, BN, EP, NT>(sK, KS, k, p.sk.row, n0, p.kv_len, p.E, p.vec16);
    flex_tile_load<T, BN, EVP, NT>(sV, VS, v, p.sv.row, n0, p.kv_len, p.EV, p.vec16);
  }
  flex_cp_async_commit();

  float o[EVP / 8][4];
#pragma unroll
  for (int j = 0; j < EVP / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  const int wr = warp * 16; /* this warp's first row in the tile */
  int stage = 0;

  while (have) {
    const bool have_next = walk.next(n1, full1);
    if (have_next) {
      T *k1 = sK + (stage ^ 1) * BN * KS, *v1 = sV + (stage ^ 1) * BN * VS;
      flex_tile_load<T, BN, EP, NT>(k1, KS, k, p.sk.row, n1, p.kv_len, p.E, p.vec16);
      flex_tile_load<T, BN, EVP, NT>(v1, VS, v, p.sv.row, n1, p.kv_len, p.EV, p.vec16);
    }
    flex_cp_async_commit();
    flex_cp_async_wait<1>();
    __syncthreads();
    const T *cK = sK + stage * BN * KS, *cV = sV + stage * BN * VS;

    /* S = Q K^T for this warp's 16 rows x BN keys. */
    float s[BN / 8][4];
#pragma unroll
    for (int j = 0; j < BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < EP / 16; kk++) {
      uint32_t a[4];
      flex_ldmatrix_x4(a, sQ + (wr + (lane & 15)) * QS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int nt = 0; nt < BN / 16; nt++) {
        uint32_t bk[4];
        flex_ldmatrix_x4(bk, cK + (nt * 16 + (lane & 7) + (lane >> 4) * 8) * KS + kk * 16 +
                                 ((lane >> 3) & 1) * 8);
        El::mma(s[2 * nt], a, bk);
        El::mma(s[2 * nt + 1], a, bk + 2);
      }
    }

    /* Scale, score, mask; then the online softmax per row (rows g, g + 8). */
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int qi = m0 + wr + g + (c >> 1) * 8, kj = n0 + j * 8 + 2 * t4 + (c & 1);
        s[j][c] = flex_fwd_logit<MASK_MODE, SCORE_ID>(p, s[j][c], b, h, qi, kj, full);
        tile_max[c >> 1] = fmaxf(tile_max[c >> 1], s[j][c]);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      corr[r] = flex_softmax_rescale(row_max[r], tile_max[r]);
      row_sum[r] *= corr[r];
    }
    const float m_use[2] = {row_max[0] == -INFINITY ? 0.0f : row_max[0],
                            row_max[1] == -INFINITY ? 0.0f : row_max[1]};
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        s[j][c] = exp2f(s[j][c] - m_use[c >> 1]);
        row_sum[c >> 1] += s[j][c];
      }
#pragma unroll
    for (int j = 0; j < EVP / 8; j++) {
      o[j][0] *= corr[0], o[j][1] *= corr[0];
      o[j][2] *= corr[1], o[j][3] *= corr[1];
    }

    /* O += P V: P's accumulator layout is the A fragment of the next mma. */
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
      uint32_t a[4];
      a[0] = El::pack(s[2 * ks][0], s[2 * ks][1]);
      a[1] = El::pack(s[2 * ks][2], s[2 * ks][3]);
      a[2] = El::pack(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      a[3] = El::pack(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
      for (int nv = 0; nv < EVP / 16; nv++) {
        uint32_t bv[4];
        flex_ldmatrix_x4_trans(bv, cV + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * VS +
                                       nv * 16 + (lane >> 4) * 8);
        El::mma(o[2 * nv], a, bv);
        El::mma(o[2 * nv + 1], a, bv + 2);
      }
    }
    __syncthreads(); /* the next iteration's loads overwrite the other stage */
    stage ^= 1;
    n0 = n1;
    full = full1;
    have = have_next;
  }
  flex_cp_async_wait<0>();

  /* Normalise and write O and LSE. */
  T *out = (T *)p.out + b * p.so.b + h * p.so.h;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
    float lse;
    const float inv = flex_finish_row(row_max[r], row_sum[r], &lse);
    const int qi = m0 + wr + g + r * 8;
    if (qi >= p.q_len) continue;
    if (t4 == 0) flex_gstore(p.lse + b * p.lse_b + h * p.lse_h + qi, lse);
#pragma unroll
    for (int j = 0; j < EVP / 8; j++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int col = j * 8 + 2 * t4 + c;
        if (col < p.EV) El::store(out + qi * p.so.row + col, o[j][2 * r + c] * inv);
      }
  }
}

/* ---- fp32 SIMT ---------------------------------------------------------- */

/* 128 threads; TPR = 128 / BM threads share a query row, each owning the
 * keys tpr + TPR * j of a tile and the output columns tpr + TPR * j. EP and
 * EVP are the head dims padded to multiples of TPR. */
template <int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID>
__device__ __forceinline__ void flex_fwd_simt(const FlexParams &p) {
  constexpr int NT = 128, TPR = NT / BM;
  constexpr int QS = EP + 1, KS = EP + 1, VS = EVP, PS = BN + 1;
  float *sQ = (float *)flex_smem, *sK = sQ + BM * QS, *sV = sK + BN * KS, *sP = sV + BN * VS;
  const int tid = threadIdx.x, r = tid / TPR, tr = tid % TPR;
  const int m0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
  const float *q = (const float *)p.q + b * p.sq.b + h * p.sq.h;
  const float *k = (const float *)p.k + b * p.sk.b + hk * p.sk.h;
  const float *v = (const float *)p.v + b * p.sv.b + hk * p.sv.h;
  const int qi = m0 + r;

  flex_tile_load_f32<BM, EP, NT>(sQ, QS, q, p.sq.row, m0, p.q_len, p.E);
  FlexWalk walk;
  walk.init(p, false, MASK_MODE == FLEX_MASK_LISTS, b, h, m0, BN);
  float o[EVP / TPR];
#pragma unroll
  for (int j = 0; j < EVP / TPR; j++) o[j] = 0.0f;
  float row_max = -INFINITY, row_sum = 0.0f;
  int n0;
  bool full;
  while (walk.next(n0, full)) {
    flex_tile_load_f32<BN, EP, NT>(sK, KS, k, p.sk.row, n0, p.kv_len, p.E);
    flex_tile_load_f32<BN, EVP, NT>(sV, VS, v, p.sv.row, n0, p.kv_len, p.EV);
    __syncthreads();
    float s[BN / TPR], tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < BN / TPR; j++) {
      const int n = tr + TPR * j;
      float acc = 0.0f;
#pragma unroll 8
      for (int e = 0; e < EP; e++) acc = acc + sQ[r * QS + e] * sK[n * KS + e];
      s[j] = flex_fwd_logit<MASK_MODE, SCORE_ID>(p, acc, b, h, qi, n0 + n, full);
      tile_max = fmaxf(tile_max, s[j]);
    }
#pragma unroll
    for (int off = 1; off < TPR; off *= 2)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
    const float corr = flex_softmax_rescale(row_max, tile_max);
    const float m_use = row_max == -INFINITY ? 0.0f : row_max;
    row_sum *= corr;
#pragma unroll
    for (int j = 0; j < BN / TPR; j++) {
      const float pj = exp2f(s[j] - m_use);
      row_sum += pj;
      sP[r * PS + tr + TPR * j] = pj;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < EVP / TPR; j++) {
      float acc = o[j] * corr;
#pragma unroll 8
      for (int n = 0; n < BN; n++) acc = acc + sP[r * PS + n] * sV[n * VS + tr + TPR * j];
      o[j] = acc;
    }
    __syncthreads();
  }
#pragma unroll
  for (int off = 1; off < TPR; off *= 2) row_sum += __shfl_xor_sync(0xffffffffu, row_sum, off);
  float lse;
  const float inv = flex_finish_row(row_max, row_sum, &lse);
  if (qi >= p.q_len) return;
  if (tr == 0) flex_gstore(p.lse + b * p.lse_b + h * p.lse_h + qi, lse);
  float *out = (float *)p.out + b * p.so.b + h * p.so.h + qi * p.so.row;
#pragma unroll
  for (int j = 0; j < EVP / TPR; j++) {
    const int col = tr + TPR * j;
    if (col < p.EV) flex_gstore(out + col, o[j] * inv);
  }
}

#endif /* FLEX_FWD_CUH */
