/* tile.cuh: global -> shared tile loads with zero fill.
 *
 * A tile is R rows x C columns (C padded to the kernel's multiple) of a
 * row-major source whose rows start `row_stride` elements apart. Rows at or
 * past `nrows` and columns at or past `ncols` are zero in shared memory, so
 * padded head dims and ragged sequence tails contribute nothing to a dot
 * product. 16-bit tiles use 16-byte cp.async when rows are 16-byte aligned
 * (vec16), else element loads; a 16-byte chunk that straddles `ncols` is
 * loaded element-wise, so nothing past a row's last column is ever read.
 */
#ifndef FLEX_TILE_CUH
#define FLEX_TILE_CUH

#include "common.cuh"

/* 16-bit elements; C a multiple of 8. Asynchronous when vec16 (commit and
 * wait are the caller's), synchronous otherwise. */
template <class T, int R, int C, int NT>
__device__ __forceinline__ void flex_tile_load(T *dst, int pitch, const T *src, int64_t row_stride,
                                               int row0, int nrows, int ncols, int vec16) {
  constexpr int CH = C / 8; /* 16-byte chunks per row */
  if (vec16) {
#pragma unroll 1
    for (int i = threadIdx.x; i < R * CH; i += NT) {
      const int r = i / CH, c = i % CH * 8;
      const bool row_ok = row0 + r < nrows;
      if (row_ok && c < ncols && c + 8 > ncols) {
        /* A chunk straddling ncols (E = 15, say): its tail is the next row
         * or past the tensor, and must read as zero, so go element-wise. */
        for (int e = 0; e < 8; e++)
          dst[r * pitch + c + e] =
              c + e < ncols ? flex_gload(src + (row0 + r) * row_stride + c + e) : (T)0;
        continue;
      }
      const bool ok = row_ok && c < ncols;
      const T *g = ok ? src + (row0 + r) * row_stride + c : src;
      flex_cp_async_16(dst + r * pitch + c, g, ok);
    }
  } else {
#pragma unroll 1
    for (int i = threadIdx.x; i < R * C; i += NT) {
      const int r = i / C, c = i % C;
      T x = 0;
      if (row0 + r < nrows && c < ncols) x = flex_gload(src + (row0 + r) * row_stride + c);
      dst[r * pitch + c] = x;
    }
  }
}

/* A tile load whose interior case is fixed at compile time: when every row
 * is below nrows, the columns are exactly C and rows are 16-byte aligned
 * (vec16), thread t copies chunks t, t + NT, ... of every tile, so its
 * shared address and source offset are computed once (init: two registers)
 * and each tile costs R * C / 8 / NT unpredicated cp.async. Tiles at the
 * last rows take the same chunks, zero-filled past them (load_rows); a head
 * dim off the chunk grid or unaligned rows take flex_tile_load, a rolled
 * loop. P: the shared row pitch, elements. */
template <class T, int R, int C, int P, int NT>
struct FlexTileCopy {
  static constexpr int CH = C / 8;                                /* chunks per row */
  static constexpr bool FIXED = NT % CH == 0 && R * CH % NT == 0; /* the same chunks every tile */
  static constexpr int RS = FIXED ? NT / CH : 1;                  /* rows between a thread's chunks */
  static constexpr int N = FIXED ? R * CH / NT : 0;               /* chunks per thread */
  uint32_t s;   /* shared byte address of this thread's first chunk (stage 0) */
  int32_t off;  /* source offset of that chunk from row 0, elements */

  __device__ __forceinline__ void init(const T *dst, int64_t row_stride) {
    const int r = threadIdx.x / CH, c = threadIdx.x % CH * 8;
    s = flex_smem_addr(dst) + (uint32_t)((r * P + c) * (int)sizeof(T));
    off = (int32_t)(r * row_stride + c);
  }

  /* Whether every tile of a call takes the unpredicated path (below
   * nrows): the columns are exactly C and rows 16-byte aligned. */
  static __device__ __forceinline__ bool fixed(int ncols, int vec16) {
    return FIXED && vec16 && ncols == C;
  }

  /* The unpredicated path alone: rows row0 .. row0 + R - 1 all exist and
   * fixed() holds. */
  __device__ __forceinline__ void load_fast(uint32_t stage, const T *src, int64_t stride,
                                            int row0) const {
    const T *from = src + row0 * stride + off;
#pragma unroll
    for (int k = 0; k < N; k++)
      flex_cp_async_16_a(s + stage + (uint32_t)(k * RS * P * (int)sizeof(T)), from + k * RS * stride);
  }

  /* The same chunks where rows may pass nrows: those are zero-filled
   * (fixed() holds). */
  __device__ __forceinline__ void load_rows(uint32_t stage, const T *src, int64_t stride, int row0,
                                            int nrows) const {
    const int r = threadIdx.x / CH;
    const T *from = src + row0 * stride + off;
#pragma unroll
    for (int k = 0; k < N; k++) {
      const bool ok = row0 + r + k * RS < nrows;
      flex_cp_async_16_ap(s + stage + (uint32_t)(k * RS * P * (int)sizeof(T)),
                          ok ? from + k * RS * stride : src, ok);
    }
  }

  /* Rows row0.. of src (row stride `stride`) into the tile at dst, which is
   * `stage` bytes past init's. */
  __device__ __forceinline__ void load(T *dst, uint32_t stage, const T *src, int64_t stride,
                                       int row0, int nrows, int ncols, int vec16) const {
    if (fixed(ncols, vec16) && row0 + R <= nrows)
      load_fast(stage, src, stride, row0);
    else if (fixed(ncols, vec16))
      load_rows(stage, src, stride, row0, nrows);
    else
      flex_tile_load<T, R, C, NT>(dst, P, src, stride, row0, nrows, ncols, vec16);
  }
};

/* fp32 elements, synchronous. */
template <int R, int C, int NT>
__device__ __forceinline__ void flex_tile_load_f32(float *dst, int pitch, const float *src,
                                                   int64_t row_stride, int row0, int nrows,
                                                   int ncols) {
  for (int i = threadIdx.x; i < R * C; i += NT) {
    const int r = i / C, c = i % C;
    float x = 0.0f;
    if (row0 + r < nrows && c < ncols) x = flex_gload(src + (row0 + r) * row_stride + c);
    dst[r * pitch + c] = x;
  }
}

/* ---- paged K/V (docs/language.md "Paged key/value cache") ---------------------------
 * Row kv of a paged source is row kv % page_size of page pages[kv /
 * page_size]; `src` is the pool at this head, page_stride and row_stride in
 * elements. A tile of rows may span pages or sit inside one, so every row's
 * address is computed from its own page. Rows at or past nrows read no page
 * table entry (entries past a sequence's last page may be anything). */
template <class T>
__device__ __forceinline__ const T *flex_paged_row(const T *src, int64_t page_stride,
                                                   int64_t row_stride, const int32_t *pages,
                                                   int page_size, int row) {
  return src + (int64_t)flex_gload(pages + row / page_size) * page_stride +
         (int64_t)(row % page_size) * row_stride;
}

/* flex_tile_load through a page table (16-bit elements, C a multiple of 8). */
template <class T, int R, int C, int NT>
__device__ __forceinline__ void flex_tile_load_paged(T *dst, int pitch, const T *src,
                                                     int64_t page_stride, int64_t row_stride,
                                                     const int32_t *pages, int page_size, int row0,
                                                     int nrows, int ncols, int vec16) {
  constexpr int CH = C / 8;
  if (vec16) {
#pragma unroll 1
    for (int i = threadIdx.x; i < R * CH; i += NT) {
      const int r = i / CH, c = i % CH * 8;
      const bool ok = row0 + r < nrows && c < ncols;
      const T *row = ok ? flex_paged_row(src, page_stride, row_stride, pages, page_size, row0 + r) : src;
      if (ok && c + 8 > ncols) {
        for (int e = 0; e < 8; e++) dst[r * pitch + c + e] = c + e < ncols ? flex_gload(row + c + e) : (T)0;
        continue;
      }
      flex_cp_async_16(dst + r * pitch + c, ok ? row + c : src, ok);
    }
  } else {
#pragma unroll 1
    for (int i = threadIdx.x; i < R * C; i += NT) {
      const int r = i / C, c = i % C;
      T x = 0;
      if (row0 + r < nrows && c < ncols)
        x = flex_gload(flex_paged_row(src, page_stride, row_stride, pages, page_size, row0 + r) + c);
      dst[r * pitch + c] = x;
    }
  }
}

/* flex_tile_load_f32 through a page table. */
template <int R, int C, int NT>
__device__ __forceinline__ void flex_tile_load_f32_paged(float *dst, int pitch, const float *src,
                                                         int64_t page_stride, int64_t row_stride,
                                                         const int32_t *pages, int page_size,
                                                         int row0, int nrows, int ncols) {
  for (int i = threadIdx.x; i < R * C; i += NT) {
    const int r = i / C, c = i % C;
    float x = 0.0f;
    if (row0 + r < nrows && c < ncols)
      x = flex_gload(flex_paged_row(src, page_stride, row_stride, pages, page_size, row0 + r) + c);
    dst[r * pitch + c] = x;
  }
}

#endif /* FLEX_TILE_CUH */
