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
 * Both: K/V rows through a page table when PAGED (tile.cuh), else rows of
 * K and V; scale, then the score function, then the mask (skipped on blocks a
 * BlockMask lists as full), keys past KV_LEN are -inf. Fully masked rows
 * give O = 0 and LSE = -inf.
 *
 * Split-KV (kernels generated with FLEX_KV_SPLIT and FlexParams.kv_splits >
 * 1, docs/decoding.md): each CTA walks one chunk of the key tiles and writes
 * fp32 partials; flex_fwd_combine_body merges them by LSE.
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

/* Dropout's keep bits of a thread's accumulator fragments: bit 4 j + c of
 * bits[m] is element c of tile j of m16 tile m, at row row0 + 16 m +
 * 8 (c / 2) and key col0 + 8 j + c % 2 (col0 even), the layout of
 * flex_live_bits. One Philox call per row and key pair. */
template <int RW, int NJ, class Bits>
__device__ __forceinline__ void flex_drop_bits(Bits bits[RW], const FlexParams &p, int b, int h,
                                               int row0, int col0) {
#pragma unroll
  for (int m = 0; m < RW; m++) {
    Bits w = 0;
#pragma unroll 1
    for (int j = 0; j < NJ; j++)
#pragma unroll
      for (int r = 0; r < 2; r++) {
        bool keep[2];
        flex_drop_keep2(p, b, h, row0 + 16 * m + 8 * r, col0 + 8 * j, keep);
        w |= (Bits)(keep[0] | keep[1] << 1) << (4 * j + 2 * r);
      }
    bits[m] = w;
  }
}

/* Online-softmax update of one row: returns the factor old results scale by. */
__device__ __forceinline__ float flex_softmax_rescale(float &row_max, float tile_max) {
  const float m_new = flex_max_nan(row_max, tile_max);
  /* A row that has seen only -inf keeps max -inf; use 0 so exp2 gives 0, not NaN. */
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float corr = exp2f(row_max - m_use);
  row_max = m_new;
  return corr;
}

/* Final O scale and LSE (natural log) of a row; fully masked rows: 0, -inf.
 * A +inf logit (and no NaN) gives LSE +inf and O NaN; a NaN one, NaN.
 * sink2: the row's sink logit times log2 e (FLEX_SINK; -inf: none), one
 * more term of the sum with no value: the keys' O is scaled down by it,
 * and a fully masked row gets O = 0, LSE = the sink. A NaN or +inf sink
 * makes LSE that and O NaN (docs/language.md). */
__device__ __forceinline__ float flex_finish_row(float row_max, float row_sum, float *lse,
                                                 float sink2 = -INFINITY) {
  if (FLEX_HAS_SINK && !(sink2 < INFINITY)) { /* NaN or +inf */
    *lse = sink2;
    return sink2 - sink2; /* NaN */
  }
  if (FLEX_HAS_SINK && sink2 > -INFINITY && row_max == row_max && row_max < INFINITY) {
    const float m = row_max > sink2 ? row_max : sink2;
    const float corr = row_max == -INFINITY ? 0.0f : exp2f(row_max - m);
    const float sum = row_sum * corr + exp2f(sink2 - m);
    *lse = (m + log2f(sum)) * FLEX_LN2;
    return corr / sum;
  }
  if (row_max == INFINITY) {
    *lse = INFINITY;
    return 1.0f / row_sum; /* NaN: the sum holds exp2(inf - inf) */
  }
  if (row_sum == 0.0f || row_max == -INFINITY) {
    *lse = -INFINITY;
    return 0.0f;
  }
  *lse = (row_max + log2f(row_sum)) * FLEX_LN2;
  return 1.0f / row_sum;
}

/* The sink logit of row qi: -inf without a sink, past Q_LEN (whose rows
 * are never written) and for a split-KV partial, whose sink the combine
 * adds once. flex_row_sink2: the same times log2 e, for flex_finish_row. */
__device__ __forceinline__ float flex_row_sink(const FlexParams &p, int b, int h, int qi, bool part) {
#ifdef FLEX_SINK
  if (qi < p.q_len && !part) return flex_sink(p, b, h, qi);
#else
  (void)p, (void)b, (void)h, (void)qi, (void)part;
#endif
  return -INFINITY;
}
__device__ __forceinline__ float flex_row_sink2(const FlexParams &p, int b, int h, int qi, bool part) {
  return flex_row_sink(p, b, h, qi, part) * FLEX_LOG2E;
}

/* ---- split-KV (docs/decoding.md) ---------------------------------------- */

/* Which part of the forward a CTA computes. Unsplit (p.kv_splits <= 1):
 * blockIdx.x is the query tile and every key. Split into S chunks:
 * blockIdx.x = split * query tiles + query tile, and split s walks key
 * tiles [s nt / S, (s + 1) nt / S) of the nt tiles of BN keys (S <= nt, so
 * no chunk is empty of tiles; its tiles may all be masked). */
struct FlexSplit {
  int m0;      /* first query row of the tile */
  int split;   /* this CTA's chunk; -1: not split (O and LSE go to out and lse) */
  int lo, hi;  /* the chunk's keys (multiples of BN; hi may pass KV_LEN) */
};

template <int BM, int BN>
__device__ __forceinline__ FlexSplit flex_fwd_split(const FlexParams &p) {
  FlexSplit sp;
  if (!FLEX_SPLIT || p.kv_splits <= 1) {
    sp.m0 = blockIdx.x * BM, sp.split = -1, sp.lo = 0, sp.hi = 0x7fffffff;
    return sp;
  }
  const int qt = (p.q_len + BM - 1) / BM, nt = (p.kv_len + BN - 1) / BN, S = p.kv_splits;
  const int s = blockIdx.x / qt;
  sp.m0 = (blockIdx.x % qt) * BM;
  sp.split = s;
  sp.lo = (int)((int64_t)s * nt / S) * BN;
  sp.hi = (int)((int64_t)(s + 1) * nt / S) * BN;
  return sp;
}

/* Row qi of (b, h) in the partial arrays of split s: [S][B][H][Q_LEN]. */
__device__ __forceinline__ int64_t flex_part_row(const FlexParams &p, int s, int b, int h, int qi) {
  return (((int64_t)s * p.B + b) * p.H + h) * p.q_len + qi;
}

/* ---- tensor cores (fp16, bf16) ----------------------------------------- */

/* EP, EVP: head dims padded to multiples of 16. NW warps, each owning
 * RW = BM / (16 NW) m16 tiles of query rows: with RW = 2 every K and V
 * fragment read from shared memory feeds two mma, which halves the shared
 * bytes per mma (FlashAttention-2's 128-row tiles with 32 rows per warp). */
template <class El, class OutEl, int EP, int EVP, int BM, int BN, int NW, int MASK_MODE, bool SCORE_ID,
          bool PAGED = false>
__device__ __forceinline__ void flex_fwd_tc(const FlexParams &p) {
  typedef typename El::T T;
  constexpr int NT = NW * 32, RW = BM / (16 * NW);
  static_assert(RW >= 1 && BM == 16 * NW * RW, "BM is 16 rows per m16 tile per warp");
  static_assert(BN % 16 == 0 && BN <= 128, "BN: whole ldmatrix.x4 tiles, 64 live bits per row pair");
  constexpr int QS = EP + 8, KS = EP + 8, VS = EVP + 8; /* smem row pitch, elements */
  constexpr uint32_t KSTAGE = BN * KS * 2, VSTAGE = BN * VS * 2; /* bytes per pipeline stage */
  T *sQ = (T *)flex_smem;
  T *sK = sQ + BM * QS;           /* [2][BN][KS] */
  T *sV = sK + 2 * BN * KS;       /* [2][BN][VS] */
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const FlexSplit sp = flex_fwd_split<BM, BN>(p);
  const int m0 = sp.m0, h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
  const T *q = (const T *)p.q + b * p.sq.b + h * p.sq.h;
  /* PAGED: k and v are page pools at this head (sk.b, sv.b: page strides). */
  const T *k = (const T *)p.k + (PAGED ? 0 : b * p.sk.b) + hk * p.sk.h;
  const T *v = (const T *)p.v + (PAGED ? 0 : b * p.sv.b) + hk * p.sv.h;
  const int wr = warp * 16 * RW; /* this warp's first row in the tile */
  /* 32-bit shared addresses of this lane's ldmatrix rows, computed once:
   * Q (A operand) at m tile 0 and k step 0; K (B, non-transposed) and V (B,
   * transposed) at stage 0, n tile 0, k step 0. */
  const uint32_t aQ = flex_smem_addr(sQ) + ((wr + (lane & 15)) * QS + (lane >> 4) * 8) * 2;
  const uint32_t aK =
      flex_smem_addr(sK) + (((lane & 7) + (lane >> 4) * 8) * KS + ((lane >> 3) & 1) * 8) * 2;
  const uint32_t aV =
      flex_smem_addr(sV) + (((lane & 7) + ((lane >> 3) & 1) * 8) * VS + (lane >> 4) * 8) * 2;
  FlexTileCopy<T, BN, EP, KS, NT> copyK;
  FlexTileCopy<T, BN, EVP, VS, NT> copyV;
  copyK.init(sK, p.sk.row);
  copyV.init(sV, p.sv.row);

  flex_tile_load<T, BM, EP, NT>(sQ, QS, q, p.sq.row, m0, p.q_len, p.E, p.vec16);
  flex_cp_async_commit();

  FlexWalk walk;
  walk.init(p, false, MASK_MODE == FLEX_MASK_LISTS, b, h, m0, BN, sp.lo, sp.hi);
  int n0 = 0, n1 = 0;
  bool full = false, full1 = false;

  float o[RW][EVP / 8][4];
#pragma unroll
  for (int m = 0; m < RW; m++)
#pragma unroll
    for (int j = 0; j < EVP / 8; j++) o[m][j][0] = o[m][j][1] = o[m][j][2] = o[m][j][3] = 0.0f;
  float row_max[RW][2], row_sum[RW][2];
#pragma unroll
  for (int m = 0; m < RW; m++)
    row_max[m][0] = row_max[m][1] = -INFINITY, row_sum[m][0] = row_sum[m][1] = 0.0f;
  /* An identity score keeps S unscaled: the running max is taken on Q K^T
   * and the scale (times log2 e) goes into the exponent's FMA, x s - m s,
   * one instruction per element instead of a multiply and a subtract. That
   * needs s positive and finite in fp32; any other scale (validate.c admits
   * finite ones only) is folded into Q here, once: times -1 for a negative
   * scale (exact; s = |scale| log2 e), else times the scale itself (one
   * whose log2-domain value underflows to 0 or overflows; s = log2 e). A
   * score function sees scale * Q K^T as before and returns log2-domain
   * logits (s = 1). */
  float scale_log2 = SCORE_ID ? p.scale * FLEX_LOG2E : 1.0f;
  if (SCORE_ID && !(scale_log2 > 0.0f && scale_log2 < INFINITY)) {
    const bool neg = scale_log2 < 0.0f && scale_log2 > -INFINITY;
    const float f = neg ? -1.0f : p.scale;
    flex_cp_async_wait<0>(); /* Q, the only group in flight */
    __syncthreads();
    for (int i = tid; i < BM * QS; i += NT) sQ[i] = El::mul(sQ[i], f);
    __syncthreads();
    scale_log2 = neg ? -scale_log2 : FLEX_LOG2E;
  }
  /* Iteration i loads tile i into stage i % 2 and computes tile i - 1: the
   * first iteration only loads, so the walk advances at one call site. */
  int stage = 1;
  bool have = false;

#pragma unroll 1
  for (;;) {
    const bool have_next = walk.next(n1, full1);
    if (have_next) {
      const int ns = stage ^ 1;
      if (PAGED) {
        flex_tile_load_paged<T, BN, EP, NT>(sK + ns * BN * KS, KS, k, p.sk.b, p.sk.row, p.pages,
                                            p.page_size, n1, p.kv_len, p.E, p.vec16);
        flex_tile_load_paged<T, BN, EVP, NT>(sV + ns * BN * VS, VS, v, p.sv.b, p.sv.row, p.pages,
                                             p.page_size, n1, p.kv_len, p.EV, p.vec16);
      } else {
        copyK.load(sK + ns * BN * KS, ns * KSTAGE, k, p.sk.row, n1, p.kv_len, p.E, p.vec16);
        copyV.load(sV + ns * BN * VS, ns * VSTAGE, v, p.sv.row, n1, p.kv_len, p.EV, p.vec16);
      }
    }
    flex_cp_async_commit();
    if (!have) {
      if (!have_next) break;
      stage ^= 1, n0 = n1, full = full1, have = true;
      continue;
    }
    flex_cp_async_wait<1>();
    __syncthreads();
    const uint32_t cK = aK + stage * KSTAGE, cV = aV + stage * VSTAGE;

    /* S = Q K^T for this warp's RW x 16 rows x BN keys. */
    float s[RW][BN / 8][4];
#pragma unroll
    for (int m = 0; m < RW; m++)
#pragma unroll
      for (int j = 0; j < BN / 8; j++) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < EP / 16; kk++) {
      uint32_t a[RW][4];
#pragma unroll
      for (int m = 0; m < RW; m++) flex_ldsm_x4(a[m], aQ + (m * 16 * QS + kk * 16) * 2);
#pragma unroll
      for (int nt = 0; nt < BN / 16; nt++) {
        uint32_t bk[4];
        flex_ldsm_x4(bk, cK + (nt * 16 * KS + kk * 16) * 2);
#pragma unroll
        for (int m = 0; m < RW; m++) {
          El::mma(s[m][2 * nt], a[m], bk);
          El::mma(s[m][2 * nt + 1], a[m], bk + 2);
        }
      }
    }

    /* Scale and score; elements out of range or masked are -inf. Only tiles
     * at the sequence ends or partial under the mask test elements at all. */
    const bool edge = n0 + BN > p.kv_len || m0 + BM > p.q_len;
    const bool check = edge || (MASK_MODE != FLEX_MASK_NONE && !full);
    typename FlexBits<BN / 2>::T live[RW];
#pragma unroll
    for (int m = 0; m < RW; m++) live[m] = ~(typename FlexBits<BN / 2>::T)0;
    if (check)
      flex_live_bits<MASK_MODE, RW, BN / 8, false>(live, p, b, h, m0 + wr + g, n0 + 2 * t4, full);
#pragma unroll
    for (int m = 0; m < RW; m++)
#pragma unroll
      for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const bool ok = live[m] >> (4 * j + c) & 1;
          if (SCORE_ID) {
            s[m][j][c] = ok ? s[m][j][c] : -INFINITY;
          } else {
            const int qi = m0 + wr + 16 * m + g + (c >> 1) * 8, kj = n0 + j * 8 + 2 * t4 + (c & 1);
            /* user code never sees an element that is out of range or masked */
            s[m][j][c] = ok ? flex_score(p, s[m][j][c] * p.scale, b, h, qi, kj) * FLEX_LOG2E
                            : -INFINITY;
          }
        }

    /* Online softmax per row (rows g and g + 8 of each m16 tile). */
#pragma unroll
    for (int m = 0; m < RW; m++) {
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) tile_max[c >> 1] = flex_max_nan(tile_max[c >> 1], s[m][j][c]);
      float corr[2], m_use[2];
#pragma unroll
      for (int r = 0; r < 2; r++) {
        tile_max[r] = flex_max_nan(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = flex_max_nan(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        const float m_new = flex_max_nan(row_max[m][r], tile_max[r]);
        /* A row that has seen only -inf keeps max -inf; use 0 so exp2 gives 0,
         * not NaN. m_use is in S's units; times scale_log2 in log2 units. */
        m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
        corr[r] = flex_ex2((row_max[m][r] - m_use[r]) * scale_log2);
        m_use[r] *= scale_log2;
        row_max[m][r] = m_new;
        row_sum[m][r] *= corr[r];
      }
#pragma unroll
      for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          s[m][j][c] = flex_ex2(fmaf(s[m][j][c], scale_log2, -m_use[c >> 1]));
          row_sum[m][c >> 1] += s[m][j][c];
        }
#pragma unroll
      for (int j = 0; j < EVP / 8; j++) {
        o[m][j][0] *= corr[0], o[m][j][1] *= corr[0];
        o[m][j][2] *= corr[1], o[m][j][3] *= corr[1];
      }
    }

    /* Dropout: P's dropped elements are 0 in the PV product only (the row
     * sums above are of the undropped P); 1 / (1 - p) scales O at the end. */
    if (FLEX_DROP) {
      /* The bits first, in a loop that leaves s alone (dynamic shifts, no
       * spill of the fully unrolled fragments), then one select each. */
      typename FlexBits<BN / 2>::T kept[RW];
      flex_drop_bits<RW, BN / 8>(kept, p, b, h, m0 + wr + g, n0 + 2 * t4);
#pragma unroll
      for (int m = 0; m < RW; m++)
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
          for (int c = 0; c < 4; c++)
            if (!(kept[m] >> (4 * j + c) & 1)) s[m][j][c] = 0.0f;
    }

    /* O += P V: P's accumulator layout is the A fragment of the next mma. */
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
      uint32_t a[RW][4];
#pragma unroll
      for (int m = 0; m < RW; m++) {
        a[m][0] = El::pack(s[m][2 * ks][0], s[m][2 * ks][1]);
        a[m][1] = El::pack(s[m][2 * ks][2], s[m][2 * ks][3]);
        a[m][2] = El::pack(s[m][2 * ks + 1][0], s[m][2 * ks + 1][1]);
        a[m][3] = El::pack(s[m][2 * ks + 1][2], s[m][2 * ks + 1][3]);
      }
#pragma unroll
      for (int nv = 0; nv < EVP / 16; nv++) {
        uint32_t bv[4];
        flex_ldsm_x4_trans(bv, cV + (ks * 16 * VS + nv * 16) * 2);
#pragma unroll
        for (int m = 0; m < RW; m++) {
          El::mma(o[m][2 * nv], a[m], bv);
          El::mma(o[m][2 * nv + 1], a[m], bv + 2);
        }
      }
    }
    __syncthreads(); /* the next iteration's loads overwrite the other stage */
    if (!have_next) break;
    stage ^= 1;
    n0 = n1;
    full = full1;
  }
  flex_cp_async_wait<0>();

  /* Normalise and write O and LSE. */
  typename OutEl::T *out = (typename OutEl::T *)p.out + b * p.so.b + h * p.so.h;
#pragma unroll
  for (int m = 0; m < RW; m++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      row_sum[m][r] += __shfl_xor_sync(0xffffffffu, row_sum[m][r], 1);
      row_sum[m][r] += __shfl_xor_sync(0xffffffffu, row_sum[m][r], 2);
      float lse;
      const int qi = m0 + wr + 16 * m + g + r * 8;
      float inv = flex_finish_row(row_max[m][r] * scale_log2, row_sum[m][r], &lse,
                                  flex_row_sink2(p, b, h, qi, sp.split >= 0));
      if (FLEX_DROP) inv *= p.drop_scale;
      if (qi >= p.q_len) continue;
      if (sp.split >= 0) { /* a partial: fp32, normalised by its own sum, into the workspace */
        const int64_t pr = flex_part_row(p, sp.split, b, h, qi);
        if (t4 == 0) flex_gstore(p.part_lse + pr, lse);
#pragma unroll
        for (int j = 0; j < EVP / 8; j++)
#pragma unroll
          for (int c = 0; c < 2; c++) {
            const int col = j * 8 + 2 * t4 + c;
            if (col < p.EV) flex_gstore(p.part_o + pr * p.EV + col, o[m][j][2 * r + c] * inv);
          }
        continue;
      }
      if (t4 == 0) flex_gstore(p.lse + b * p.lse_b + h * p.lse_h + qi, lse);
#pragma unroll
      for (int j = 0; j < EVP / 8; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const int col = j * 8 + 2 * t4 + c;
          if (col < p.EV) OutEl::store(out + qi * p.so.row + col, o[m][j][2 * r + c] * inv);
        }
    }
}

/* ---- fp32 SIMT ---------------------------------------------------------- */

/* 128 threads; TPR = 128 / BM threads share a query row, each owning the
 * keys tpr + TPR * j of a tile and the output columns tpr + TPR * j. EP and
 * EVP are the head dims padded to multiples of TPR. */
template <int EP, int EVP, int BM, int BN, int MASK_MODE, bool SCORE_ID, bool PAGED = false>
__device__ __forceinline__ void flex_fwd_simt(const FlexParams &p) {
  constexpr int NT = 128, TPR = NT / BM;
  constexpr int QS = EP + 1, KS = EP + 1, VS = EVP, PS = BN + 1;
  float *sQ = (float *)flex_smem, *sK = sQ + BM * QS, *sV = sK + BN * KS, *sP = sV + BN * VS;
  const int tid = threadIdx.x, r = tid / TPR, tr = tid % TPR;
  const FlexSplit sp = flex_fwd_split<BM, BN>(p);
  const int m0 = sp.m0, h = blockIdx.y, b = blockIdx.z, hk = h / p.G;
  const float *q = (const float *)p.q + b * p.sq.b + h * p.sq.h;
  const float *k = (const float *)p.k + (PAGED ? 0 : b * p.sk.b) + hk * p.sk.h;
  const float *v = (const float *)p.v + (PAGED ? 0 : b * p.sv.b) + hk * p.sv.h;
  const int qi = m0 + r;

  flex_tile_load_f32<BM, EP, NT>(sQ, QS, q, p.sq.row, m0, p.q_len, p.E);
  FlexWalk walk;
  walk.init(p, false, MASK_MODE == FLEX_MASK_LISTS, b, h, m0, BN, sp.lo, sp.hi);
  float o[EVP / TPR];
#pragma unroll
  for (int j = 0; j < EVP / TPR; j++) o[j] = 0.0f;
  float row_max = -INFINITY, row_sum = 0.0f;
  int n0;
  bool full;
  while (walk.next(n0, full)) {
    if (PAGED) {
      flex_tile_load_f32_paged<BN, EP, NT>(sK, KS, k, p.sk.b, p.sk.row, p.pages, p.page_size, n0,
                                           p.kv_len, p.E);
      flex_tile_load_f32_paged<BN, EVP, NT>(sV, VS, v, p.sv.b, p.sv.row, p.pages, p.page_size, n0,
                                            p.kv_len, p.EV);
    } else {
      flex_tile_load_f32<BN, EP, NT>(sK, KS, k, p.sk.row, n0, p.kv_len, p.E);
      flex_tile_load_f32<BN, EVP, NT>(sV, VS, v, p.sv.row, n0, p.kv_len, p.EV);
    }
    __syncthreads();
    float s[BN / TPR], tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < BN / TPR; j++) {
      const int n = tr + TPR * j;
      float acc = 0.0f;
#pragma unroll 8
      for (int e = 0; e < EP; e++) acc = acc + sQ[r * QS + e] * sK[n * KS + e];
      s[j] = flex_fwd_logit<MASK_MODE, SCORE_ID>(p, acc, b, h, qi, n0 + n, full);
      tile_max = flex_max_nan(tile_max, s[j]);
    }
#pragma unroll
    for (int off = 1; off < TPR; off *= 2)
      tile_max = flex_max_nan(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
    const float corr = flex_softmax_rescale(row_max, tile_max);
    const float m_use = row_max == -INFINITY ? 0.0f : row_max;
    row_sum *= corr;
#pragma unroll
    for (int j = 0; j < BN / TPR; j++) {
      const float pj = exp2f(s[j] - m_use);
      row_sum += pj;
      /* dropout: 0 in the PV product only; 1 / (1 - p) scales O at the end */
      const bool keep = !FLEX_DROP || flex_drop_keep(p, b, h, qi, n0 + tr + TPR * j);
      sP[r * PS + tr + TPR * j] = keep ? pj : 0.0f;
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
  float inv = flex_finish_row(row_max, row_sum, &lse, flex_row_sink2(p, b, h, qi, sp.split >= 0));
  if (FLEX_DROP) inv *= p.drop_scale;
  if (qi >= p.q_len) return;
  float *out = (float *)p.out + b * p.so.b + h * p.so.h + qi * p.so.row;
  if (sp.split >= 0) { /* a partial into the workspace (see flex_fwd_tc) */
    const int64_t pr = flex_part_row(p, sp.split, b, h, qi);
    if (tr == 0) flex_gstore(p.part_lse + pr, lse);
    out = p.part_o + pr * p.EV;
  } else if (tr == 0) {
    flex_gstore(p.lse + b * p.lse_b + h * p.lse_h + qi, lse);
  }
#pragma unroll
  for (int j = 0; j < EVP / TPR; j++) {
    const int col = tr + TPR * j;
    if (col < p.EV) flex_gstore(out + col, o[j] * inv);
  }
}

/* ---- the split-KV combine ----------------------------------------------- */

/* One warp per row of (b, h, qi), lanes over the EV columns: the S partial
 * LSEs and O rows merge as lse = log sum_s exp(lse_s) and
 * O = sum_s exp(lse_s - lse) O_s (each O_s already carries dropout's
 * 1 / (1 - p), so it is applied once). A chunk with no live key has
 * lse_s = -inf and weight 0 and is skipped, so it adds no NaN. The
 * non-finite rows of flex_finish_row carry over: any NaN lse_s makes the
 * row NaN; else a +inf one gives LSE +inf and O NaN; all -inf (a fully
 * masked row) gives O = 0 and LSE = -inf. A sink joins here, once (the
 * partials have none): one more term of the sum with no value. */
template <class OutEl>
__device__ __forceinline__ void flex_fwd_combine_body(const FlexParams &p) {
  const int64_t rows = (int64_t)p.B * p.H * p.q_len;
  const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32, S = p.kv_splits;
  if (row >= rows) return;
  const int qi = (int)(row % p.q_len), h = (int)(row / p.q_len % p.H), b = (int)(row / p.q_len / p.H);
  const float sk = flex_row_sink(p, b, h, qi, false);
  float m = sk;
#pragma unroll 1
  for (int s = 0; s < S; s++) m = flex_max_nan(m, flex_gload(p.part_lse + s * rows + row));
  if (sk != sk) m = sk; /* a NaN sink (flex_max_nan keeps NaN from the partials only) */
  float lse, sum = sk == -INFINITY || m != m || m == INFINITY ? 0.0f : expf(sk - m);
  if (m != m || m == INFINITY) lse = m;
  else if (m == -INFINITY) lse = -INFINITY;
  else {
#pragma unroll 1
    for (int s = 0; s < S; s++) sum += expf(flex_gload(p.part_lse + s * rows + row) - m);
    lse = m + logf(sum);
  }
  if (lane == 0) flex_gstore(p.lse + b * p.lse_b + h * p.lse_h + qi, lse);
  typename OutEl::T *out = (typename OutEl::T *)p.out + b * p.so.b + h * p.so.h + qi * p.so.row;
#pragma unroll 1
  for (int col = lane; col < p.EV; col += 32) {
    float acc = 0.0f;
    if (m != m || m == INFINITY) acc = m - m; /* NaN for both */
    else if (m != -INFINITY) {
#pragma unroll 1
      for (int s = 0; s < S; s++) {
        const float w = expf(flex_gload(p.part_lse + s * rows + row) - m);
        if (w > 0.0f) acc += w * flex_gload(p.part_o + (s * rows + row) * p.EV + col);
      }
      acc /= sum;
    }
    OutEl::store(out + col, acc);
  }
}

#endif /* FLEX_FWD_CUH */
