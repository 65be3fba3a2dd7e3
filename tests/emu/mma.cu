/* Tensor-core fragments: mma.sync m16n8k16 and ldmatrix, one warp each.
 * The fragments are built straight from the PTX ISA layouts so the suite
 * can compare against a plain matmul and a direct read of the layout. */
#include "emu_arch.h"

extern __shared__ __align__(16) unsigned char flex_smem[];

/* D (16x8 f32, row-major) = A (16x16, row-major bits) * B (16x8 as [k][n]
 * bits) + C (16x8 f32). mode 0: fp16, 1: bf16. */
extern "C" __global__ void emu_t_mma(const EmuTestParams p) {
  const uint16_t *A = (const uint16_t *)p.in, *B = (const uint16_t *)p.in2;
  const float *C = (const float *)p.in3;
  float *D = (float *)p.out;
  int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  uint32_t a[4], b[2];
  float c[4], d[4];
  for (int r = 0; r < 4; r++) {
    int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
    a[r] = (uint32_t)flex_gload(A + row * 16 + col) | ((uint32_t)flex_gload(A + row * 16 + col + 1) << 16);
  }
  for (int r = 0; r < 2; r++) {
    int k = 2 * t + 8 * r;
    b[r] = (uint32_t)flex_gload(B + k * 8 + g) | ((uint32_t)flex_gload(B + (k + 1) * 8 + g) << 16);
  }
  for (int r = 0; r < 4; r++) c[r] = flex_gload(C + (g + 8 * (r >> 1)) * 8 + 2 * t + (r & 1));
  if (p.mode == 0) flex_mma_f16(d, a, b, c);
  else flex_mma_bf16(d, a, b, c);
  for (int r = 0; r < 4; r++) flex_gstore(D + (g + 8 * (r >> 1)) * 8 + 2 * t + (r & 1), d[r]);
}
FLEX_EMU_ENTRY(emu_t_mma, EmuTestParams)

/* in: 4 matrices of 8x8 uint16, stored matrix-major then row-major; they are
 * copied into shared memory with rows 32 bytes apart (matrix m, row r at
 * byte (r * 4 + m) * 16 ... interleaved). out[variant][lane][4] gets every
 * ldmatrix variant (x1, x2, x4, then .trans). mode 1 hands out the row
 * addresses in a wrong order (lane l -> matrix l % 4, row l / 4). */
extern "C" __global__ void emu_t_ldmatrix(const EmuTestParams p) {
  uint16_t *s = (uint16_t *)flex_smem;
  const uint16_t *in = (const uint16_t *)p.in;
  int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) {
    int m = i / 64, r = i / 8 % 8, c = i % 8;
    s[(r * 4 + m) * 8 + c] = flex_gload(in + i);
  }
  __syncthreads();
  int m = lane / 8, r = lane % 8;
  if (p.mode == 1) m = lane % 4, r = lane / 4;
  const void *row = s + (r * 4 + m) * 8;
  uint32_t v[6][4] = {};
  flex_ldmatrix_x1(v[0], row);
  flex_ldmatrix_x2(v[1], row);
  flex_ldmatrix_x4(v[2], row);
  flex_ldmatrix_x1_trans(v[3], row);
  flex_ldmatrix_x2_trans(v[4], row);
  flex_ldmatrix_x4_trans(v[5], row);
  uint32_t *out = (uint32_t *)p.out;
  for (int k = 0; k < 6; k++)
    for (int j = 0; j < 4; j++) flex_gstore(out + (k * 32 + lane) * 4 + j, v[k][j]);
}
FLEX_EMU_ENTRY(emu_t_ldmatrix, EmuTestParams)
