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
#pragma unroll
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
    for (int i = threadIdx.x; i < R * C; i += NT) {
      const int r = i / C, c = i % C;
      T x = 0;
      if (row0 + r < nrows && c < ncols) x = flex_gload(src + (row0 + r) * row_stride + c);
      dst[r * pitch + c] = x;
    }
  }
}

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

#endif /* FLEX_TILE_CUH */
