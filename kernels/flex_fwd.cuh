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
#include "bias.cuh"

/* The scaled, scored, masked logit of one element, in the exp2 domain. */
template <int MASK_MODE, bool SCORE_ID>
__device__ __forceinline__ float flex_fwd_logit(const FlexParams &p, float acc, int b, int h, int qi,
                                                int kj, bool full) {
  /* Out-of-range rows and keys never reach user code: it may index buffers by them. */
  if (kj >= p.kv_len || qi >= p.q_len) return -INFINITY;
  if (MASK_MODE != FLEX_MASK_NONE && !full && !flex_mask(p, b, h, qi, kj)) return -INFINITY;
  if (SCORE_ID) return acc * (p.scale * FLEX_LOG2E);
  return flex_score_l2(p, acc, b, h, qi, kj, flex_dqk(kj - qi, 0));
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

/* Final O scale and LSE (natural log) of a row; fully masked rows: 0, -inf.
 * A +inf logit (and no NaN) gives LSE +inf and O NaN; a NaN one, NaN.
 * row_max: the row's max (any positive multiple of it: only its sign and
 * infinities are read); ref: the row's reference in the exp2 domain (P =
 * 2^(logit - ref), so LSE = (ref + log2(sum)) ln 2).
 * sink2: the row's sink logit times log2 e (FLEX_SINK; -inf: none), one
 * more term of the sum with no value: the keys' O is scaled down by it,
 * and a fully masked row gets O = 0, LSE = the sink. A NaN or +inf sink
 * makes LSE that and O NaN (docs/language.md). */
__device__ __forceinline__ float flex_finish_row(float row_max, float ref, float row_sum, float *lse,
                                                 float sink2 = -INFINITY) {
  if (FLEX_HAS_SINK && !(sink2 < INFINITY)) { /* NaN or +inf */
    *lse = sink2;
    return sink2 - sink2; /* NaN */
  }
  if (FLEX_HAS_SINK && sink2 > -INFINITY && row_max == row_max && row_max < INFINITY) {
    /* the keys' sum is relative to ref (none when the row is fully masked) */
    const bool keys = row_max > -INFINITY;
    const float m = keys && ref > sink2 ? ref : sink2;
    const float corr = keys ? exp2f(ref - m) : 0.0f;
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
  *lse = (ref + log2f(row_sum)) * FLEX_LN2;
  return 1.0f / row_sum;
}

/* The tensor-core forwards' online softmax keeps an identity score's S
 * unscaled and puts s = scale log2 e into the exponent, one FMA per
 * element: P = 2^(x s - b) with b = m s rounded, the row's reference (m its
 * running max; LSE and the rescale use b itself, so rounding m s moves
 * every P of the row and its sum by the same factor and cancels). That
 * holds while 2^(m s - b) is near 1: b's rounding is below 2^-8 for
 * |m s| < 2^16. Past that it grows with the row's exponent until P
 * overflows or vanishes (every element 30000 at E = 64: m s = 1e10, an
 * ulp of 1024), so such a row takes the second form: its reference is m s
 * exactly and its P is 2^((x - m) s), x - m exact near the max. In either
 * form P = 2^((x - a) s - b), (a, b) = (0, m s rounded) or (m, 0), a
 * function of m alone (flex_row_ab; m = -inf, no live element yet, counts
 * as 0 so that exp2 gives 0, not NaN), and a rescale from one reference
 * to the next is 2^((a - a') s + (b - b')), one FMA for any pair of forms
 * (0 from a max of -inf: the row has no sum yet). A score function's
 * logits are already scaled (s = 1): x - b is one exact subtraction, no
 * row takes the second form. */
#define FLEX_BIG_ROW 65536.0f

/* Whether a row whose max is m takes the second form (branch-free: the
 * steady loops test every row of every tile). */
template <bool SCORE_ID>
__device__ __forceinline__ bool flex_row_big(float m, float s) {
  return SCORE_ID & (m != -INFINITY) & (fabsf(m * s) >= FLEX_BIG_ROW);
}

/* The (a, b) of the reference of a row whose max is m. */
template <bool SCORE_ID>
__device__ __forceinline__ void flex_row_ab(float m, float s, float &a, float &b) {
  const float m_use = m == -INFINITY ? 0.0f : m;
  const bool big = flex_row_big<SCORE_ID>(m, s);
  a = big ? m_use : 0.0f;
  b = big ? 0.0f : m_use * s;
}

/* One row's step: its max m becomes max(m, tile_max); returns the factor
 * its sum and O scale by. */
template <bool SCORE_ID>
__device__ __forceinline__ float flex_row_step(float &m, float tile_max, float s) {
  const float m_new = flex_max_nan(m, tile_max);
  float a0, b0, a1, b1;
  flex_row_ab<SCORE_ID>(m, s, a0, b0);
  flex_row_ab<SCORE_ID>(m_new, s, a1, b1);
  const float corr = m == -INFINITY ? 0.0f : flex_ex2(fmaf(a0 - a1, s, b0 - b1));
  m = m_new;
  return corr;
}

/* The same for a row in the first form before and after (the steady
 * loops'; flex_row_big_step false): 2^(b - b'), a max of -inf before
 * giving 2^-inf = 0. */
__device__ __forceinline__ float flex_row_step_small(float &m, float tile_max, float s) {
  const float m_new = flex_max_nan(m, tile_max);
  const float corr = flex_ex2(m * s - (m_new == -INFINITY ? 0.0f : m_new) * s);
  m = m_new;
  return corr;
}

/* The sm_90a steady loop's test of a row's step: whether its new max
 * leaves the first form or is not finite (-inf, no element yet; NaN), for
 * the general loop to take the tile. The old max needs no test there: the
 * loop is entered only when every row is in the first form, and each step
 * inside it passed this test. */
__device__ __forceinline__ bool flex_row_leaves_small(float m, float tile_max, float s) {
  return !(fabsf(flex_max_nan(m, tile_max) * s) < FLEX_BIG_ROW);
}

/* Whether a step of a row by tile_max has the second form on either side. */
template <bool SCORE_ID>
__device__ __forceinline__ bool flex_row_big_step(float m, float tile_max, float s) {
  return flex_row_big<SCORE_ID>(m, s) | flex_row_big<SCORE_ID>(flex_max_nan(m, tile_max), s);
}

/* The row's reference R = a s + b (flex_finish_row's ref). */
template <bool SCORE_ID>
__device__ __forceinline__ float flex_row_ref(float m, float s) {
  float a, b;
  flex_row_ab<SCORE_ID>(m, s, a, b);
  return fmaf(a, s, b);
}

/* Online-softmax update of one row (fp32 SIMT, logits in the exp2 domain):
 * returns the factor old results scale by. */
__device__ __forceinline__ float flex_softmax_rescale(float &row_max, float tile_max) {
  const float m_new = flex_max_nan(row_max, tile_max);
  /* A row that has seen only -inf keeps max -inf; use 0 so exp2 gives 0, not NaN. */
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float corr = exp2f(row_max - m_use);
  row_max = m_new;
  return corr;
}

/* The sink logit of row qi: -inf without a sink, past Q_LEN (whose rows
 * are never written), for a split-KV partial, whose sink the combine
 * adds once, and for a shard whose keys do not begin the sequence
 * (kv_off > 0: the shard pair at kv_off 0 carries it, so merged pairs
 * count it once). flex_row_sink2: the same times log2 e, for flex_finish_row. */
__device__ __forceinline__ float flex_row_sink(const FlexParams &p, int b, int h, int qi, bool part) {
#ifdef FLEX_SINK
  if (qi < p.q_len && !part && p.kv_off == 0) return flex_sink(p, b, h, qi);
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
 * bytes per mma (FlashAttention-2's 128-row tiles with 32 rows per warp).
 *
 * The key tiles run in two loops, as FlashAttention-2 and -3 split theirs:
 * a steady loop for tiles that need no per-element test (full under the
 * mask, inside both sequences, loaded by unpredicated cp.async) and a
 * general loop for the others (the sequence ends, partial tiles, unaligned
 * or paged rows), so the steady loop carries no live bits, no select and
 * no bounds code. The walk hands out runs of tiles of one class
 * (FlexWalk::next_run), so the steady loop advances by adding BN. A warp
 * whose rows pass 2^16 in the exp2 domain (flex_row_step) finishes such a
 * tile in the general loop, which subtracts the row's max first. The
 * state the two loops share lives in this struct. */
template <class El, class OutEl, int EP, int EVP, int BM, int BN, int NW, int MASK_MODE, bool SCORE_ID,
          bool PAGED>
struct FlexFwdTc {
  typedef typename El::T T;
  static constexpr int NT = NW * 32, RW = BM / (16 * NW);
  static_assert(RW >= 1 && BM == 16 * NW * RW, "BM is 16 rows per m16 tile per warp");
  static_assert(BN % 16 == 0 && BN <= 128, "BN: whole ldmatrix.x4 tiles, 64 live bits per row pair");
  static constexpr int QS = EP + 8, KS = EP + 8, VS = EVP + 8; /* smem row pitch, elements */
  static constexpr uint32_t KSTAGE = BN * KS * 2; /* bytes per K stage */
  /* One m16 tile per warp (RW = 1, FlashAttention-3's 8-warp sm80 shape):
   * the warp's Q fragments stay in registers (EP / 4 per thread), so Q is
   * read from shared memory once and its space then holds V's second stage. */
  static constexpr bool QREG = RW == 1 && EP <= 128;
  static constexpr int QV = QREG && BN * VS > BM * QS ? BN * VS : BM * QS; /* elements of Q's space */
  typedef FlexTileCopy<T, BN, EP, KS, NT> CopyK;
  typedef FlexTileCopy<T, BN, EVP, VS, NT> CopyV;

  const FlexParams &p;
  const T *k, *v;
  int m0, h, b, g, t4, wr;
  uint32_t aQ, aK, aV;
  uint32_t qa[QREG ? EP / 16 : 1][4]; /* QREG: this warp's Q, the A fragment of each k16 step */
  CopyK copyK;
  CopyV copyV;
  float scale_log2;
#if FLEX_BIAS
  FlexBias bias; /* the head's bias over the scale */
#endif
  float o[RW][EVP / 8][4];
  /* Per row: the running max (in S's units; the reference is a function
   * of it, flex_row_ab) and the sum. */
  float row_max[RW][2], row_sum[RW][2];
  float s[RW][BN / 8][4]; /* the tile's S, then P */

  __device__ __forceinline__ FlexFwdTc(const FlexParams &p_) : p(p_) {}

  /* Shared memory: Q [BM][QS], then K [2][BN][KS] and V [2][BN][VS]; with
   * QREG V [1][BN][VS] there and its stage 1 in Q's space (QV elements). */
  static __device__ __forceinline__ T *smem_k() { return (T *)flex_smem + QV; }
  static __device__ __forceinline__ T *smem_v(int st) {
    return QREG && st ? (T *)flex_smem : smem_k() + 2 * BN * KS + st * BN * VS;
  }

  /* Tile n0's K and V into stage st: the general path (any rows, zero fill). */
  __device__ __forceinline__ void load(int n0, int st) {
    T *sK = smem_k() + st * BN * KS, *sV = smem_v(st);
    if (PAGED) {
      flex_tile_load_paged<T, BN, EP, NT>(sK, KS, k, p.sk.b, p.sk.row, p.pages, p.page_size, n0,
                                          p.kv_len, p.E, p.vec16);
      flex_tile_load_paged<T, BN, EVP, NT>(sV, VS, v, p.sv.b, p.sv.row, p.pages, p.page_size, n0,
                                           p.kv_len, p.EV, p.vec16);
    } else {
      copyK.load(sK, st * KSTAGE, k, p.sk.row, n0, p.kv_len, p.E, p.vec16);
      copyV.load(sV, vstage(st), v, p.sv.row, n0, p.kv_len, p.EV, p.vec16);
    }
  }

  /* The walk and its published runs, after V (FLEX_WALK_BYTES). */
  static __device__ __forceinline__ FlexWalk *smem_walk() {
    return (FlexWalk *)(smem_v(QREG ? 0 : 1) + BN * VS);
  }
  static_assert(sizeof(FlexWalk) + 3 * 3 * 4 <= FLEX_WALK_BYTES, "the walk's shared memory");

  /* Thread 0: the walk's next run into a slot of `runs` (first column -1: none). */
  __device__ __forceinline__ void publish(int32_t run[3]) {
    int c0 = -1, c1 = 0;
    bool full = false;
    if (!smem_walk()->next_run(p, c0, c1, full)) c0 = -1;
    run[0] = c0, run[1] = c1, run[2] = full;
  }

  /* Byte offset of V's stage st from stage 0 (copyV's and aV's base). */
  static __device__ __forceinline__ uint32_t vstage(int st) {
    return (uint32_t)((char *)smem_v(st) - (char *)smem_v(0));
  }

  /* S = Q K^T of tile n0 (stage st), its scores and the rows' online-softmax
   * step. GEN: the tile may be at a sequence end or partial under the mask
   * (live bits, -inf for dead elements). Returns whether a row of this warp
   * takes flex_row_step's second form. */
  template <bool GEN>
  __device__ __forceinline__ void scores(int n0, int st, bool full) {
    const uint32_t cK = aK + st * KSTAGE;
#if FLEX_BIAS
    /* S starts at the bias over the scale (bias.cuh) */
    const float base = (float)(n0 + 2 * t4 - (m0 + wr + g));
#pragma unroll
    for (int m = 0; m < RW; m++)
#pragma unroll
      for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) s[m][j][c] = bias.at(base, (float)(j * 8 + (c & 1) - 16 * m - (c >> 1) * 8));
#else
#pragma unroll
    for (int m = 0; m < RW; m++)
#pragma unroll
      for (int j = 0; j < BN / 8; j++) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
#endif
#pragma unroll
    for (int kk = 0; kk < EP / 16; kk++) {
      uint32_t a[RW][4];
#pragma unroll
      for (int m = 0; m < RW; m++) {
        if (QREG) a[m][0] = qa[kk][0], a[m][1] = qa[kk][1], a[m][2] = qa[kk][2], a[m][3] = qa[kk][3];
        else flex_ldsm_x4(a[m], aQ + (m * 16 * QS + kk * 16) * 2);
      }
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

    /* Scale and score; elements out of range or masked are -inf. Only the
     * general loop's tiles at the sequence ends or partial under the mask
     * test elements. */
    typename FlexBits<BN / 2>::T live[RW];
#pragma unroll
    for (int m = 0; m < RW; m++) live[m] = ~(typename FlexBits<BN / 2>::T)0;
    if (GEN && (n0 + BN > p.kv_len || m0 + BM > p.q_len || (MASK_MODE != FLEX_MASK_NONE && !full)))
      flex_live_bits<MASK_MODE, RW, BN / 8, false>(live, p, b, h, m0 + wr + g, n0 + 2 * t4, full);
#pragma unroll
    for (int m = 0; m < RW; m++)
#pragma unroll
      for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const bool ok = !GEN || (live[m] >> (4 * j + c) & 1);
          if (SCORE_ID) {
            if (GEN) s[m][j][c] = ok ? s[m][j][c] : -INFINITY;
          } else {
            const int qi = m0 + wr + 16 * m + g + (c >> 1) * 8, kj = n0 + j * 8 + 2 * t4 + (c & 1);
            const float d = flex_dqk(n0 + 2 * t4 - (m0 + wr + g), j * 8 + (c & 1) - 16 * m - (c >> 1) * 8);
            /* user code never sees an element that is out of range or masked */
            s[m][j][c] = ok ? flex_score_l2(p, s[m][j][c], b, h, qi, kj, d) : -INFINITY;
          }
        }

  }

  /* The rows' online-softmax step on the tile's S (rows g and g + 8 of each
   * m16 tile): max, rescale factor, sums and O rescaled. GEN: rows in
   * either form of flex_row_step. Not GEN: only when every row of the warp
   * stays in the first form; else nothing changes and it returns true,
   * step<true> taking the tile from here. */
  template <bool GEN>
  __device__ __forceinline__ bool step() {
    float tile_max[RW][2];
    bool big = false;
#pragma unroll
    for (int m = 0; m < RW; m++) {
      tile_max[m][0] = tile_max[m][1] = -INFINITY;
#pragma unroll
      for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) tile_max[m][c >> 1] = flex_max_nan(tile_max[m][c >> 1], s[m][j][c]);
#pragma unroll
      for (int r = 0; r < 2; r++) {
        tile_max[m][r] = flex_max_nan(tile_max[m][r], __shfl_xor_sync(0xffffffffu, tile_max[m][r], 1));
        tile_max[m][r] = flex_max_nan(tile_max[m][r], __shfl_xor_sync(0xffffffffu, tile_max[m][r], 2));
        big |= !GEN && flex_row_big_step<SCORE_ID>(row_max[m][r], tile_max[m][r], scale_log2);
      }
    }
    if (!GEN && SCORE_ID && __any_sync(0xffffffffu, big)) return true;
#pragma unroll
    for (int m = 0; m < RW; m++) {
      float corr[2];
#pragma unroll
      for (int r = 0; r < 2; r++) {
        corr[r] = GEN ? flex_row_step<SCORE_ID>(row_max[m][r], tile_max[m][r], scale_log2)
                      : flex_row_step_small(row_max[m][r], tile_max[m][r], scale_log2);
        row_sum[m][r] *= corr[r];
      }
#pragma unroll
      for (int j = 0; j < EVP / 8; j++) {
        o[m][j][0] *= corr[0], o[m][j][1] *= corr[0];
        o[m][j][2] *= corr[1], o[m][j][3] *= corr[1];
      }
      if (GEN && SCORE_ID) { /* x - a for rows in the second form (a = 0 in the first) */
        float a[2], b[2];
#pragma unroll
        for (int r = 0; r < 2; r++) flex_row_ab<SCORE_ID>(row_max[m][r], scale_log2, a[r], b[r]);
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
          for (int c = 0; c < 4; c++) s[m][j][c] -= a[c >> 1];
      }
    }
    return false;
  }

  /* P of the tile scored last (stage st), its sums and O += P V. GEN:
   * rows may be in flex_row_step's second form (step<true> subtracted a). */
  template <bool GEN>
  __device__ __forceinline__ void probs(int n0, int st) {
#pragma unroll
    for (int m = 0; m < RW; m++) {
      float a[2], rb[2];
#pragma unroll
      for (int r = 0; r < 2; r++) flex_row_ab<SCORE_ID && GEN>(row_max[m][r], scale_log2, a[r], rb[r]);
#pragma unroll
      for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          s[m][j][c] = flex_ex2(fmaf(s[m][j][c], scale_log2, -rb[c >> 1]));
          row_sum[m][c >> 1] += s[m][j][c];
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
    const uint32_t cV = aV + vstage(st);
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
  }

  __device__ __forceinline__ void run() {
    T *sQ = (T *)flex_smem, *sK = smem_k(), *sV = smem_v(0);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    g = lane / 4, t4 = lane % 4;
    const FlexSplit sp = flex_fwd_split<BM, BN>(p);
    m0 = sp.m0, h = blockIdx.y, b = blockIdx.z;
    const int hk = h / p.G;
    const T *q = (const T *)p.q + b * p.sq.b + h * p.sq.h;
    /* PAGED: k and v are page pools at this head (sk.b, sv.b: page strides). */
    k = (const T *)p.k + (PAGED ? 0 : b * p.sk.b) + hk * p.sk.h;
    v = (const T *)p.v + (PAGED ? 0 : b * p.sv.b) + hk * p.sv.h;
    wr = warp * 16 * RW; /* this warp's first row in the tile */
    /* 32-bit shared addresses of this lane's ldmatrix rows, computed once:
     * Q (A operand) at m tile 0 and k step 0; K (B, non-transposed) and V (B,
     * transposed) at stage 0, n tile 0, k step 0. */
    aQ = flex_smem_addr(sQ) + ((wr + (lane & 15)) * QS + (lane >> 4) * 8) * 2;
    aK = flex_smem_addr(sK) + (((lane & 7) + (lane >> 4) * 8) * KS + ((lane >> 3) & 1) * 8) * 2;
    aV = flex_smem_addr(sV) + (((lane & 7) + ((lane >> 3) & 1) * 8) * VS + (lane >> 4) * 8) * 2;
    copyK.init(sK, p.sk.row);
    copyV.init(sV, p.sv.row);

    flex_tile_load<T, BM, EP, NT>(sQ, QS, q, p.sq.row, m0, p.q_len, p.E, p.vec16);
    flex_cp_async_commit();

    /* The walk lives in shared memory and only thread 0 runs it: it
     * publishes each run (first column, end, full; a first column of -1:
     * none) in slot r % 3 of `runs`, two runs ahead. Every thread reads run
     * r and the next run's first column at the start of run r; thread 0
     * then writes run r + 2 over run r - 1, whose readers all passed the
     * barriers of run r - 1's tiles, and run r + 2's readers come after run
     * r's. So the walk's state and the next run are never live in
     * registers through the loops. */
    FlexWalk *walk = smem_walk();
    int32_t(*runs)[3] = (int32_t(*)[3])(walk + 1);
    if (tid == 0) {
      walk->init(p, false, MASK_MODE == FLEX_MASK_LISTS, b, h, m0, BN, sp.lo, sp.hi);
      publish(runs[0]);
      publish(runs[1]);
    }

#pragma unroll
    for (int m = 0; m < RW; m++)
#pragma unroll
      for (int j = 0; j < EVP / 8; j++) o[m][j][0] = o[m][j][1] = o[m][j][2] = o[m][j][3] = 0.0f;
#pragma unroll
    for (int m = 0; m < RW; m++)
#pragma unroll
      for (int r = 0; r < 2; r++) row_max[m][r] = -INFINITY, row_sum[m][r] = 0.0f;
    /* An identity score keeps S unscaled: the running max is taken on Q K^T
     * and the scale (times log2 e) goes into the exponent's FMA, x s - m s,
     * one instruction per element instead of a multiply and a subtract. That
     * needs s positive and finite in fp32; any other scale (validate.c admits
     * finite ones only) is folded into Q here, once: times -1 for a negative
     * scale (exact; s = |scale| log2 e), else times the scale itself (one
     * whose log2-domain value underflows to 0 or overflows; s = log2 e). A
     * score function sees scale * Q K^T as before and returns log2-domain
     * logits (s = 1). */
    scale_log2 = SCORE_ID ? p.scale * FLEX_LOG2E : 1.0f;
    if (SCORE_ID && !(scale_log2 > 0.0f && scale_log2 < INFINITY)) {
      const bool neg = scale_log2 < 0.0f && scale_log2 > -INFINITY;
      const float f = neg ? -1.0f : p.scale;
      flex_cp_async_wait<0>(); /* Q, the only group in flight */
      __syncthreads();
      for (int i = tid; i < BM * QS; i += NT) sQ[i] = El::mul(sQ[i], f);
      __syncthreads();
      scale_log2 = neg ? -scale_log2 : FLEX_LOG2E;
    }
#if FLEX_BIAS
    /* The bias over the scale: the accumulator times scale_log2 is then the
     * logit times log2 e however scale_log2 was made. */
    bias.init(p, b, h, FLEX_LOG2E / scale_log2);
#endif

    /* Whether a steady tile's K and V may take the unpredicated loads
     * (rows below KV_LEN tested per tile) and its rows are all below Q_LEN.
     * Head dims past 128 (O in 128 registers) run the general loop alone:
     * with both, natten_tiled's classifier spilled. */
    const bool fast_rows = !PAGED && EVP <= 128 && CopyK::fixed(p.E, p.vec16) &&
                           CopyV::fixed(p.EV, p.vec16) && m0 + BM <= p.q_len;
    /* Tile c of the current run [c, c1) (full: cfull) is in flight into
     * stage st; the iteration that computes a tile first issues the loads of
     * the tile after it (pf; npf: the next run's first, -1 for none) into the
     * other stage, freed by the barrier that precedes them. */
    __syncthreads(); /* the first two runs */
    int c = runs[0][0], c1 = 0, npf = 0, st = 0, r = 0;
    bool cfull = false;
    bool redo = false; /* tile c loaded by the steady loop, which left it at its step */
    if (c >= 0) {
      load(c, st);
      flex_cp_async_commit();
      if (QREG) { /* Q into registers; the first tile's barrier frees its space */
        flex_cp_async_wait<1>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < EP / 16; kk++) flex_ldsm_x4(qa[kk], aQ + kk * 16 * 2);
      }
    }
#pragma unroll 1
    for (; c >= 0; r++) {
      const int slot = r % 3;
      c = runs[slot][0], c1 = runs[slot][1], cfull = runs[slot][2] != 0;
      npf = runs[slot == 2 ? 0 : slot + 1][0];
      if (tid == 0) publish(runs[slot == 0 ? 2 : slot - 1]);
#pragma unroll 1
      while (c < c1) {
        /* The steady loop: tile c and the tile after it (pf) interior. A
         * row of the warp in flex_row_step's second form sends the tile to
         * the general loop (redo), each time it happens. */
#pragma unroll 1
        for (;;) {
          const int pf = c + BN < c1 ? c + BN : npf;
          if (!(fast_rows && (MASK_MODE == FLEX_MASK_NONE || cfull) && c < c1 &&
                c + BN <= p.kv_len && pf + BN <= p.kv_len))
            break;
          flex_cp_async_wait<0>();
          __syncthreads();
          if (pf >= 0) {
            copyK.load_fast((st ^ 1) * KSTAGE, k, p.sk.row, pf);
            copyV.load_fast(vstage(st ^ 1), v, p.sv.row, pf);
          }
          flex_cp_async_commit();
          scores<false>(c, st, true);
          if (step<false>()) {
            redo = true;
            break;
          }
          probs<false>(c, st);
          st ^= 1, c += BN;
        }
        /* The general loop: until a tile the steady loop can take. A tile
         * the steady loop left at its step (redo: its loads were issued) is
         * scored again here. */
        const int pf = c + BN < c1 ? c + BN : npf;
        if (c < c1 && (redo || !(fast_rows && (MASK_MODE == FLEX_MASK_NONE || cfull) &&
                                 c + BN <= p.kv_len && pf + BN <= p.kv_len))) {
          if (!redo) {
            flex_cp_async_wait<0>();
            __syncthreads();
            if (pf >= 0) load(pf, st ^ 1);
            flex_cp_async_commit();
          }
          redo = false;
          scores<true>(c, st, cfull);
          step<true>();
          probs<true>(c, st);
          st ^= 1, c += BN;
        }
      }
      c = npf;
    }
    flex_cp_async_wait<0>();

    /* A sink's logits, one row per thread into the start of shared memory
     * (Q's, or V's second stage: free once every warp is past its last
     * tile): evaluated here, one at a time, rather than the warp's rows at
     * once beside the O accumulators, where their registers would spill. */
    float *sSink = (float *)flex_smem;
    if (FLEX_HAS_SINK) {
      __syncthreads(); /* every warp is done with the last tile */
      for (int i = tid; i < BM; i += NT) sSink[i] = flex_row_sink2(p, b, h, m0 + i, sp.split >= 0);
      __syncthreads();
    }

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
        float inv = flex_finish_row(row_max[m][r], flex_row_ref<SCORE_ID>(row_max[m][r], scale_log2),
                                    row_sum[m][r], &lse, FLEX_HAS_SINK ? sSink[qi - m0] : -INFINITY);
        if (FLEX_DROP) inv *= p.drop_scale;
        if (qi >= p.q_len) continue;
        if (sp.split >= 0) { /* a partial: fp32, normalised by its own sum, into the workspace */
          const int64_t pr = flex_part_row(p, sp.split, b, h, qi);
          if (t4 == 0) flex_gstore(p.part_lse + pr, lse);
#pragma unroll
          for (int j = 0; j < EVP / 8; j++)
#pragma unroll
            for (int c2 = 0; c2 < 2; c2++) {
              const int col = j * 8 + 2 * t4 + c2;
              if (col < p.EV) flex_gstore(p.part_o + pr * p.EV + col, o[m][j][2 * r + c2] * inv);
            }
          continue;
        }
        if (t4 == 0) flex_gstore(p.lse + b * p.lse_b + h * p.lse_h + qi, lse);
#pragma unroll
        for (int j = 0; j < EVP / 8; j++)
#pragma unroll
          for (int c2 = 0; c2 < 2; c2++) {
            const int col = j * 8 + 2 * t4 + c2;
            if (col < p.EV) OutEl::store(out + qi * p.so.row + col, o[m][j][2 * r + c2] * inv);
          }
      }
  }
};

template <class El, class OutEl, int EP, int EVP, int BM, int BN, int NW, int MASK_MODE, bool SCORE_ID,
          bool PAGED = false>
__device__ __forceinline__ void flex_fwd_tc(const FlexParams &p) {
  FlexFwdTc<El, OutEl, EP, EVP, BM, BN, NW, MASK_MODE, SCORE_ID, PAGED> f(p);
  f.run();
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
  while (walk.next(p, n0, full)) {
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
  float inv = flex_finish_row(row_max, row_max, row_sum, &lse, flex_row_sink2(p, b, h, qi, sp.split >= 0));
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
