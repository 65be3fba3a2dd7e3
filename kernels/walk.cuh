/* walk.cuh: which column tiles a row tile visits.
 *
 * The forward walks key tiles for one query tile; the backward walks query
 * tiles for one key tile. Without BlockMask lists every tile is visited
 * (and the caller evaluates the mask per element when there is one). With
 * lists, only the listed blocks are visited: first the `full` list (no
 * per-element mask needed), then the partial list. A listed block of
 * `block` columns is split into tiles of `tile` columns.
 *
 * Implicit masks (FLEX_WALK_IMPLICIT, defined by the generated source with
 * its classifier flex_mask_block and the row tile heights
 * FLEX_WALK_FWD_ROWS / FLEX_WALK_BWD_ROWS): no lists; the walk classifies tiles
 * itself with interval arithmetic. init() trims the column range from both
 * ends with coarse spans (causal stops at the diagonal, a window walks its
 * band); next() skips empty spans, then empty tiles, and reports full
 * tiles as `full`, so empty tiles are never loaded and full ones never run
 * the per-element mask.
 *
 * A split-KV forward restricts the walk to its chunk of key tiles (init's
 * col_lo, col_hi); lists and implicit classification work inside it.
 *
 * Under FLEXC_EMU every visited tile is counted (thread 0 of the CTA), so
 * tests can check that the walk visits exactly the live tiles.
 */
#ifndef FLEX_WALK_CUH
#define FLEX_WALK_CUH

#include "common.cuh"

/* An iterator over column tiles; every thread of a CTA walks the same way. */
struct FlexWalk {
  const int32_t *idx0, *idx1; /* full list, partial list (block indices) */
  int n0, n1;            /* entries in each list (scalars, not arrays: an
                          * array indexed by `list` would live in local memory) */
  int list, i;           /* current list and entry */
  int c, c_end;          /* next tile start and the end of the current block */
  int tile, block, total; /* tile and block widths, the end of the columns visited */
  int lo;                /* the first column visited (a split-KV chunk's start) */
  bool lists;            /* false: visit every tile */
  int rc, rc_end;        /* next(): the current run's next tile and end */
  bool run_full;         /* next(): the current run is full */
#ifdef FLEX_WALK_IMPLICIT
  bool bwd;              /* rows are keys and columns queries (backward) */
  int b, h, r0, r1;      /* the row tile: batch, head, first and last row */
  int span_end;          /* end of the current coarse span (columns) */
  bool span_full;        /* the current span is full: no per-tile test */
#endif

  /* p: the launch's params; bwd: the backward's walk (rows are keys, columns
   * queries: the q-side lists), else the forward's (rows are queries); row:
   * the row tile's first row; tile_cols: the column tile width; [col_lo,
   * col_hi): the columns this CTA may visit (a split-KV chunk, multiples of
   * tile_cols; by default all), so lists, implicit trimming and skipping
   * all work inside the chunk and a tile is never visited by two chunks. */
  __device__ __forceinline__ void init(const FlexParams &p, bool bwd_side, bool use_lists, int b_,
                                       int h_, int row, int tile_cols, int col_lo = 0,
                                       int col_hi = 0x7fffffff) {
    const FlexBlockList &full = bwd_side ? p.full_q_list : p.full_kv_list;
    const FlexBlockList &part = bwd_side ? p.q_list : p.kv_list;
    const int block_rows = bwd_side ? p.block_kv : p.block_q;
    lists = use_lists;
    tile = tile_cols;
    block = bwd_side ? p.block_q : p.block_kv;
    total = min(bwd_side ? p.q_len : p.kv_len, col_hi);
    lo = col_lo;
    list = 0;
    i = 0;
    c = col_lo;
    c_end = 0;
    n0 = n1 = 0;
    idx0 = idx1 = 0;
    rc = rc_end = 0;
    run_full = false;
#ifdef FLEX_WALK_IMPLICIT
    if (!lists) implicit_init(p, bwd_side, b_, h_, row);
#endif
    if (!lists) return;
    const int r = row / block_rows;
    if (full.num) {
      n0 = flex_gload(full.num + b_ * full.num_b + h_ * full.num_h + r * full.num_r);
      idx0 = full.idx + b_ * full.idx_b + h_ * full.idx_h + r * full.idx_r;
    }
    if (part.num) {
      n1 = flex_gload(part.num + b_ * part.num_b + h_ * part.num_h + r * part.num_r);
      idx1 = part.idx + b_ * part.idx_b + h_ * part.idx_h + r * part.idx_r;
    }
  }

  /* The next tile's first column and whether its block is full; false at
   * the end. The tiles of next_run one by one. p: init's params (the walk
   * keeps no pointer to them, so it may live in shared memory). */
  __device__ __forceinline__ bool next(const FlexParams &p, int &col, bool &full) {
    if (rc >= rc_end && !next_run(p, rc, rc_end, run_full)) return false;
    col = rc;
    full = run_full;
    rc += tile;
    return true;
  }

  /* The next run of visited tiles of one class: tiles c0, c0 + tile, ...
   * below c1 (the last may pass the columns' end), all full or all not;
   * false at the end. A kernel whose steady loop takes whole runs asks the
   * walk once per run, not per tile. */
  __device__ __forceinline__ bool next_run(const FlexParams &p, int &c0, int &c1, bool &full) {
    const bool have = next_span(p, c0, c1, full);
#ifdef FLEXC_EMU
    if (have && threadIdx.x == 0) emu_count_tiles((c1 - c0 + tile - 1) / tile);
#endif
    return have;
  }

  __device__ __forceinline__ bool next_span(const FlexParams &p, int &c0, int &c1, bool &full) {
#ifdef FLEX_WALK_IMPLICIT
    if (!lists) return implicit_next(p, c0, c1, full);
#else
    (void)p;
#endif
    if (!lists) {
      if (c >= total) return false;
      c0 = c, c1 = total;
      full = false;
      c = total;
      return true;
    }
    while (c >= c_end) {
      if (list >= 2) return false;
      if (i >= (list ? n1 : n0)) {
        list++;
        i = 0;
        continue;
      }
      const int blk = flex_gload((list ? idx1 : idx0) + i);
      i++;
      /* clipped to the chunk: a block outside it is skipped (c >= c_end) */
      c = max(blk * block, lo);
      c_end = min(blk * block + block, total);
    }
    c0 = c, c1 = c_end;
    full = list == 0;
    c = c_end;
    return true;
  }

#ifdef FLEX_WALK_IMPLICIT
  /* Spans of this many tiles are classified before their tiles. */
  static constexpr int SPAN = 8;

  /* The class of columns [c0, c1] (inclusive) against the row tile. */
  __device__ __forceinline__ int classify(const FlexParams &p, int c0, int c1) const {
    return bwd ? flex_mask_block(p, b, b, h, h, c0, c1, r0, r1)
               : flex_mask_block(p, b, b, h, h, r0, r1, c0, c1);
  }

  /* Columns of tiles [t0, t1) (clipped to the total). */
  __device__ __forceinline__ int span_class(const FlexParams &p, int t0, int t1) const {
    return classify(p, t0 * tile, min(t1 * tile, total) - 1);
  }

  /* Set up the classifier for the row tile and trim the column range. */
  __device__ __forceinline__ void implicit_init(const FlexParams &p, bool bwd_side, int b_, int h_,
                                                int row) {
    bwd = bwd_side;
    b = b_, h = h_;
    r0 = row;
    /* The row tile's height comes from the generated source (the
     * templates' BM / BN), never from the params, so it cannot be wrong. */
    r1 = min(row + (bwd ? FLEX_WALK_BWD_ROWS : FLEX_WALK_FWD_ROWS), bwd ? p.kv_len : p.q_len) - 1;
    span_end = 0;
    span_full = false;
    /* Trim empty columns from both ends, coarse spans first. One classify
     * call site (a mask is inlined once per site, and NATTEN's is large). */
    int t0 = lo / tile, t1 = (total + tile - 1) / tile;
#pragma unroll 1
    for (int s = SPAN * SPAN; s >= 1 && t0 < t1; s /= SPAN)
#pragma unroll 1
      for (int from_front = 0; from_front < 2; from_front++)
#pragma unroll 1
        while (t0 < t1) {
          const int lo = from_front ? t0 : max(t0, t1 - s), hi = from_front ? min(t1, t0 + s) : t1;
          if (span_class(p, lo, hi) != FLEX_BLOCK_EMPTY) break;
          if (from_front) t0 = hi;
          else t1 = lo;
        }
    c = t0 * tile;
    total = min(total, t1 * tile);
  }

  /* The next run of live tiles: empty spans and tiles are skipped
   * unvisited; a full span is one run, other tiles are runs of one. A span
   * is classified when c reaches its end, then its tiles one by one unless
   * it is full; one classify call site, as in implicit_init. */
  __device__ __forceinline__ bool implicit_next(const FlexParams &p, int &c0, int &c1, bool &full) {
#pragma unroll 1
    while (c < total) {
      const bool span = c >= span_end;
      if (!span && span_full) {
        c0 = c, c1 = span_end;
        full = true;
        c = span_end;
        return true;
      }
      const int end = min(c + (span ? SPAN : 1) * tile, total);
      const int k = classify(p, c, end - 1);
      if (span) {
        span_end = end;
        span_full = k == FLEX_BLOCK_FULL;
        if (k == FLEX_BLOCK_EMPTY) c = end;
        continue;
      }
      const int t0 = c;
      c = end;
      if (k == FLEX_BLOCK_EMPTY) continue;
      c0 = t0, c1 = end;
      full = k == FLEX_BLOCK_FULL;
      return true;
    }
    return false;
  }
#endif
};

/* Which elements of a thread's mma accumulators are live (row and column in
 * range, and the mask true unless the tile is `full`), one bit per element:
 * element 4 j + c of m16 tile m is bit 4 j + c of live[m], at row
 * r0 + 16 m + 8 (c / 2) and column c0 + 8 j + c % 2 (NJ 8-column groups).
 * Rows are queries and columns keys unless ROWS_ARE_KEYS. Called only on
 * tiles at the sequence ends or partial under the mask; the loop is rolled
 * so the mask is compiled once, not once per element. */
template <int BITS> struct FlexBits { typedef uint64_t T; }; /* a word of BITS <= 64 bits */
template <> struct FlexBits<32> { typedef uint32_t T; };
template <> struct FlexBits<16> { typedef uint32_t T; };
template <> struct FlexBits<8> { typedef uint32_t T; };
template <> struct FlexBits<4> { typedef uint32_t T; };

template <int MASK_MODE, int RW, int NJ, bool ROWS_ARE_KEYS>
__device__ __forceinline__ void flex_live_bits(typename FlexBits<4 * NJ>::T live[RW],
                                               const FlexParams &p, int b, int h, int r0, int c0,
                                               bool full) {
  typedef typename FlexBits<4 * NJ>::T W;
  static_assert(4 * NJ <= 64, "one 64-bit word per m16 tile");
#pragma unroll
  for (int m = 0; m < RW; m++) live[m] = 0;
#pragma unroll 1
  for (int i = 0; i < RW * 4 * NJ; i++) {
    const int m = i / (4 * NJ), e = i % (4 * NJ);
    const int r = r0 + 16 * m + 8 * (e >> 1 & 1), c = c0 + 8 * (e >> 2) + (e & 1);
    const int qi = ROWS_ARE_KEYS ? c : r, kj = ROWS_ARE_KEYS ? r : c;
    const bool ok = qi < p.q_len && kj < p.kv_len &&
                    (MASK_MODE == FLEX_MASK_NONE || full || flex_mask(p, b, h, qi, kj));
#pragma unroll
    for (int mm = 0; mm < RW; mm++)
      if (mm == m) live[mm] |= (W)ok << e;
  }
}

#endif /* FLEX_WALK_CUH */
