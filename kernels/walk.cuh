/* walk.cuh: which column tiles a row tile visits.
 *
 * The forward walks key tiles for one query tile; the backward walks query
 * tiles for one key tile. Without BlockMask lists every tile is visited
 * (and the caller evaluates the mask per element when there is one). With
 * lists, only the listed blocks are visited: first the `full` list (no
 * per-element mask needed), then the partial list. A listed block of
 * `block` columns is split into tiles of `tile` columns.
 *
 * This is the one place that decides the walk, so other block classifiers
 * (an implicit one from interval analysis) can be added here alone.
 */
#ifndef FLEX_WALK_CUH
#define FLEX_WALK_CUH

#include "common.cuh"

/* An iterator over column tiles; every thread of a CTA walks the same way. */
struct FlexWalk {
  const int32_t *idx[2]; /* full list, partial list (block indices) */
  int n[2];              /* entries in each list */
  int list, i;           /* current list and entry */
  int c, c_end;          /* next tile start and the end of the current block */
  int tile, block, total; /* tile and block widths, columns in all */
  bool lists;            /* false: visit every tile */

  /* row: the row tile's first row; block_rows: the mask's block height. */
  __device__ __forceinline__ void init(const FlexBlockList &full, const FlexBlockList &part,
                                       bool use_lists, int b, int h, int row, int block_rows,
                                       int block_cols, int tile_cols, int ncols) {
    lists = use_lists;
    tile = tile_cols;
    block = block_cols;
    total = ncols;
    list = 0;
    i = 0;
    c = 0;
    c_end = 0;
    n[0] = n[1] = 0;
    idx[0] = idx[1] = 0;
    if (!lists) return;
    const int r = row / block_rows;
    const FlexBlockList *l2[2] = {&full, &part};
    for (int k = 0; k < 2; k++) {
      const FlexBlockList &l = *l2[k];
      if (!l.num) continue;
      n[k] = flex_gload(l.num + b * l.num_b + h * l.num_h + r * l.num_r);
      idx[k] = l.idx + b * l.idx_b + h * l.idx_h + r * l.idx_r;
    }
  }

  /* The next tile's first column and whether its block is full; false at the end. */
  __device__ __forceinline__ bool next(int &col, bool &full) {
    if (!lists) {
      if (c >= total) return false;
      col = c;
      full = false;
      c += tile;
      return true;
    }
    while (c >= c_end) {
      if (list >= 2) return false;
      if (i >= n[list]) {
        list++;
        i = 0;
        continue;
      }
      const int blk = flex_gload(idx[list] + i);
      i++;
      c = blk * block;
      c_end = min(c + block, total);
    }
    col = c;
    full = list == 0;
    c += tile;
    return true;
  }
};

#endif /* FLEX_WALK_CUH */
