/* sm_90a primitives: mbarrier phases and a two-warpgroup ping-pong, TMA
 * tile loads (swizzle, out-of-bounds zeros, poison until landed), and
 * wgmma (accumulator fragment, descriptors, asynchrony, its rules). */
#include "emu_arch.h"

extern __shared__ __align__(16) unsigned char flex_smem[];

/* Two warpgroups pass p.n rounds through one shared slot: warpgroup 0
 * writes round r's values and arrives on `full`, warpgroup 1 waits for
 * `full`, adds them up and arrives on `empty`, which warpgroup 0 waits for
 * before the next round. out[t] (t in warpgroup 1) = the sum over rounds
 * of what thread t - 128 wrote; out2[0] = the phases `full` completed.
 * Without working waits the sums come out wrong or the block deadlocks.
 * mode 1: warpgroup 1 skips its wait (a broken consumer); 2: nobody
 * initialises the barriers; 3: no __syncthreads after the initialisation. */
extern "C" __global__ void emu_t_pingpong(const EmuTestParams p) {
  uint64_t *full = (uint64_t *)flex_smem, *empty = full + 1;
  float *slot = (float *)(flex_smem + 64);
  int t = threadIdx.x;
  if (t == 0 && p.mode != 2) {
    flex_mbar_init(full, 128);
    flex_mbar_init(empty, 128);
  }
  if (p.mode != 3) __syncthreads();
  float sum = 0;
  for (int r = 0; r < p.n; r++) {
    if (t < 128) {
      if (r > 0) flex_mbar_wait(empty, (uint32_t)(r - 1) & 1);
      slot[t] = (float)(r * 1000 + t);
      flex_mbar_arrive(full);
    } else {
      if (p.mode != 1) flex_mbar_wait(full, (uint32_t)r & 1);
      sum += slot[t - 128];
      flex_mbar_arrive(empty);
    }
  }
  if (t >= 128) flex_gstore((float *)p.out + (t - 128), sum);
  __syncthreads();
  if (t == 0) {
    /* full completed p.n phases: waiting on the parity of phase p.n - 1 passes,
     * on the parity of phase p.n (not yet complete) it would block. */
    flex_mbar_wait(full, (uint32_t)(p.n - 1) & 1);
    flex_gstore((float *)p.out2, (float)p.n);
  }
}
FLEX_EMU_ENTRY(emu_t_pingpong, EmuTestParams)

/* Two warpgroups take turns through named barriers 1 and 2, as the sm_90a
 * forward's consumers do: warpgroup c waits at barrier 1 + c (256 threads:
 * its own 128 and the other's arrival), takes its turn (thread 0 logs c),
 * then arrives at the other's barrier; warpgroup 0 gives itself the first
 * turn. out[i] = who took turn i, for p.n turns each. mode 1: no first turn
 * (deadlock); 2: warpgroup 1 arrives with 128 threads, not 256; 3: only
 * half of warp 0 gives the first turn; 4: barrier 0; 5: no barriers. */
extern "C" __global__ void emu_t_turns(const EmuTestParams p) {
  int32_t *turn = (int32_t *)flex_smem, *log = turn + 1;
  const int t = threadIdx.x, c = t / 128;
  if (t == 0) *turn = 0;
  __syncthreads();
  if (c == 0 && p.mode != 1 && p.mode != 5 && (p.mode != 3 || t % 32 < 16)) flex_bar_arrive<1, 256>();
  for (int r = 0; r < p.n; r++) {
    if (p.mode == 4) flex_bar_sync<0, 256>();
    else if (p.mode != 5 && c == 0) flex_bar_sync<1, 256>();
    else if (p.mode != 5) flex_bar_sync<2, 256>();
    if (t % 128 == 0) log[(*turn)++] = c;
    if (p.mode == 2 && c == 1) flex_bar_arrive<1, 128>();
    else if (p.mode != 5 && c == 0) flex_bar_arrive<2, 256>();
    else if (p.mode != 5) flex_bar_arrive<1, 256>();
  }
  __syncthreads();
  if (t < 2 * p.n) flex_gstore((int32_t *)p.out + t, log[t]);
}
FLEX_EMU_ENTRY(emu_t_turns, EmuTestParams)

/* One thread loads two boxes of a 2-D 16-bit tensor (the map in p.in2,
 * coordinates in p.in3: c0, c1, c0', c1') into shared memory at 0 and
 * 32768, completing on one mbarrier; everybody waits, then out gets the
 * raw 64 KiB. out2[0] gets what thread 0 read right after issuing (before
 * the copy may land). mode 1: nobody waits (reads see poison); 2: the
 * barrier expects 16 bytes more than the boxes bring (a deadlock); 3: one
 * arrival too many while the phase waits for its bytes. */
extern "C" __global__ void emu_t_tma(const EmuTestParams p) {
  uint64_t *bar = (uint64_t *)(flex_smem + 65536);
  const FlexTensorMap *map = (const FlexTensorMap *)p.in2;
  const int32_t *c = (const int32_t *)p.in3;
  int t = threadIdx.x;
  if (t == 0) flex_mbar_init(bar, 1);
  __syncthreads();
  if (t == 0) {
    uint32_t bytes = map->box[0] * map->box[1] * 2;
    flex_mbar_arrive_expect_tx(bar, 2 * bytes + (p.mode == 2 ? 16 : 0));
    flex_tma_load_2d(flex_smem, map, bar, c[0], c[1]);
    flex_tma_load_2d(flex_smem + 32768, map, bar, c[2], c[3]);
    if (p.mode == 3) flex_mbar_arrive(bar); /* a second arrival on a count-1 barrier */
    flex_gstore((uint16_t *)p.out2, *(uint16_t *)flex_smem);
  }
  if (p.mode != 1) flex_mbar_wait(bar, 0);
  __syncthreads();
  for (int i = t; i < 32768; i += blockDim.x) flex_gstore((uint16_t *)p.out + i, ((uint16_t *)flex_smem)[i]);
}
FLEX_EMU_ENTRY(emu_t_tma, EmuTestParams)

/* D (64 x N, row-major) to and from the accumulator fragment of this thread's warpgroup. */
template <int N> static void wgmma_store(float *out, const float *d) {
  int t = threadIdx.x % 128, w = t / 32, g = (t % 32) / 4, q = t % 4; /* within the warpgroup */
  for (int i = 0; i < N / 2; i++)
    flex_gstore(out + (16 * w + g + 8 * ((i / 2) % 2)) * N + 8 * (i / 4) + 2 * q + i % 2, d[i]);
}
template <int N> static void wgmma_load(float *d, const float *in) {
  int t = threadIdx.x % 128, w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int i = 0; i < N / 2; i++)
    d[i] = flex_gload(in + (16 * w + g + 8 * ((i / 2) % 2)) * N + 8 * (i / 4) + 2 * q + i % 2);
}

/* TMA + wgmma as a FlashAttention-3 QK^T: A (64 x 64, row-major 16-bit,
 * map p.in) and B^T (N x 64, map p.in2), both K-major, loaded with the
 * 128-byte swizzle; four wgmmas (K = 16 each, descriptors advanced by 32
 * bytes inside the swizzled rows, SBO 1024) in one group. out = A B (64 x N),
 * stored through the ISA's accumulator layout. mode: 0 fp16, 1 bf16. */
template <int N> static void tma_wgmma(const EmuTestParams p) {
  uint64_t *bar = (uint64_t *)(flex_smem + 65536);
  unsigned char *sa = flex_smem, *sb = flex_smem + 8192;
  int t = threadIdx.x;
  if (t == 0) flex_mbar_init(bar, 1);
  __syncthreads();
  if (t == 0) {
    flex_mbar_arrive_expect_tx(bar, 64 * 128 + N * 128);
    flex_tma_load_2d(sa, (const FlexTensorMap *)p.in, bar, 0, 0);
    flex_tma_load_2d(sb, (const FlexTensorMap *)p.in2, bar, 0, 0);
  }
  flex_mbar_wait(bar, 0);
  float d[N / 2];
  flex_wgmma_fence();
  for (int k = 0; k < 4; k++) {
    uint64_t da = flex_wgmma_desc(flex_smem_addr(sa) + 32 * k, 16, 1024, 128);
    uint64_t db = flex_wgmma_desc(flex_smem_addr(sb) + 32 * k, 16, 1024, 128);
    if (p.mode == 0) flex_wgmma_ss_f16<N>(d, da, db, k > 0);
    else flex_wgmma_ss_bf16<N>(d, da, db, k > 0);
  }
  flex_wgmma_commit();
  flex_wgmma_wait<0>();
  wgmma_store<N>((float *)p.out, d);
}
extern "C" __global__ void emu_t_tma_wgmma64(const EmuTestParams p) { tma_wgmma<64>(p); }
FLEX_EMU_ENTRY(emu_t_tma_wgmma64, EmuTestParams)
extern "C" __global__ void emu_t_tma_wgmma256(const EmuTestParams p) { tma_wgmma<256>(p); }
FLEX_EMU_ENTRY(emu_t_tma_wgmma256, EmuTestParams)

/* The layouts without TMA, written element by element from the formulas
 * of emu_sm90.h's comment: A (64 x 16 fp16, p.in row-major) K-major, no
 * swizzle, LBO 128 (the two 8-column core matrices), SBO 256 (8-row groups);
 * B (16 x 24, p.in2 row-major [k][n]) N-major (imm-trans-b 1), no swizzle,
 * 8-element core rows, SBO 128 (next 8 columns), LBO 384 (next 8 k).
 * D starts as p.in3 (the accumulator layout), scale-d 1: out = A B + C.
 * mode 1: A from registers (its fragment layout) instead of shared memory. */
extern "C" __global__ void emu_t_wgmma_layouts(const EmuTestParams p) {
  const uint16_t *A = (const uint16_t *)p.in, *B = (const uint16_t *)p.in2;
  uint16_t *sa = (uint16_t *)flex_smem, *sb = (uint16_t *)(flex_smem + 4096);
  int t = threadIdx.x;
  for (int i = t; i < 64 * 16; i += 128) {
    int m = i / 16, k = i % 16;
    sa[((m % 8) * 16 + (m / 8) * 256 + (k % 8) * 2 + (k / 8) * 128) / 2] = flex_gload(A + i);
  }
  for (int i = t; i < 16 * 24; i += 128) {
    int k = i / 24, n = i % 24;
    sb[((n % 8) * 2 + (n / 8) * 128 + (k % 8) * 16 + (k / 8) * 384) / 2] = flex_gload(B + i);
  }
  __syncthreads();
  float d[12];
  wgmma_load<24>(d, (const float *)p.in3);
  uint64_t da = flex_wgmma_desc(flex_smem_addr(sa), 128, 256, 0);
  uint64_t db = flex_wgmma_desc(flex_smem_addr(sb), 384, 128, 0);
  uint32_t a[4];
  int w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int r = 0; r < 4; r++) {
    int row = 16 * w + g + 8 * (r & 1), col = 2 * q + 8 * (r >> 1);
    a[r] = (uint32_t)flex_gload(A + row * 16 + col) | ((uint32_t)flex_gload(A + row * 16 + col + 1) << 16);
  }
  flex_wgmma_fence();
  if (p.mode == 0) flex_wgmma_ss_f16<24, 0, 1>(d, da, db, 1);
  else flex_wgmma_rs_f16<24, 1>(d, a, db, 1);
  flex_wgmma_commit();
  flex_wgmma_wait<0>();
  wgmma_store<24>((float *)p.out, d);
}
FLEX_EMU_ENTRY(emu_t_wgmma_layouts, EmuTestParams)

/* Broken uses of wgmma; each must fail the launch or show poison. Shared
 * memory is zeroed first so results are finite. mode:
 *   0  read the accumulator between issue and wait (out gets d[0]: poison)
 *   1  wait<1> with the only group the newest: still poison; wait<0> lands it
 *   2  no wgmma.fence before the first wgmma.mma_async
 *   3  warp 3 issues from another call site
 *   4  warp 3 has exited
 *   5  B descriptor beyond shared memory
 *   6  descriptors differ across the warpgroup
 *   7  the A registers change before the wait
 *   8  64 threads only (a partial warpgroup) */
extern "C" __global__ void emu_t_wgmma_bad(const EmuTestParams p) {
  int t = threadIdx.x;
  for (int i = t; i < 4096; i += blockDim.x) ((uint32_t *)flex_smem)[i] = 0x3c003c00u; /* fp16 1.0 */
  __syncthreads();
  float d[4] = {0, 0, 0, 0};
  uint32_t a[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
  uint64_t da = flex_wgmma_desc(0, 128, 256, 0), db = flex_wgmma_desc(4096, 128, 256, 0);
  if (p.mode == 5) db = flex_wgmma_desc(16320, 128, 256, 0);
  if (p.mode == 6 && t == 5) db = flex_wgmma_desc(8192, 128, 256, 0);
  if (p.mode == 4 && t >= 96) return;
  if (p.mode != 2) flex_wgmma_fence();
  if (p.mode == 3 && t >= 96) flex_wgmma_ss_f16<8>(d, da, db, 0);
  else if (p.mode == 7) flex_wgmma_rs_f16<8>(d, a, db, 0);
  else flex_wgmma_ss_f16<8>(d, da, db, 0);
  if (p.mode == 0) flex_gstore((float *)p.out + t, d[0]);
  if (p.mode == 7) a[0] = 0;
  flex_wgmma_commit();
  if (p.mode == 1) {
    flex_wgmma_wait<1>();
    flex_gstore((float *)p.out + t, d[0]);
  }
  flex_wgmma_wait<0>();
  flex_gstore((float *)p.out2 + t, d[0]);
}
FLEX_EMU_ENTRY(emu_t_wgmma_bad, EmuTestParams)

/* elect.sync picks one lane per warp; setmaxnreg is a warpgroup op.
 * out[t] = 1 for the elected threads. mode 1: warpgroup 1 asks for a
 * different register count on one warp (not warpgroup-uniform). */
extern "C" __global__ void emu_t_elect(const EmuTestParams p) {
  int t = threadIdx.x;
  flex_fence_proxy_async();
  if (t < 128) flex_setmaxnreg_dec<40>();
  else if (p.mode == 1 && t >= 224) flex_setmaxnreg_inc<224>();
  else flex_setmaxnreg_inc<232>();
  flex_gstore((float *)p.out + t, flex_elect_one() ? 1.0f : 0.0f);
}
FLEX_EMU_ENTRY(emu_t_elect, EmuTestParams)

/* setmaxnreg's pool in a CTA of 384 threads (168 registers a thread at
 * launch): warpgroup 0 gives back to 40 (mode 0) or 48 (mode 1), the
 * other two ask for 232. Mode 1 asks 1024 registers more than the pool
 * holds and waits forever. out[t] = 1 for every thread past it. */
extern "C" __global__ void emu_t_regs(const EmuTestParams p) {
  int t = threadIdx.x;
  if (t >= 128) flex_setmaxnreg_inc<232>();
  else if (p.mode == 1) flex_setmaxnreg_dec<48>();
  else flex_setmaxnreg_dec<40>();
  flex_gstore((float *)p.out + t, 1.0f);
}
FLEX_EMU_ENTRY(emu_t_regs, EmuTestParams)

/* TMA + wgmma as a FlashAttention-3 PV: P (64 x 32, p.in row-major 16-bit)
 * from registers in the A fragment layout, V (32 x 128, map p.in2 over the
 * [kv][d] tensor) loaded with the 128-byte swizzle as two boxes of 64
 * columns (d 0..63 at offset 0, d 64..127 at 4096): B is N-major
 * (imm-trans-b 1), LBO 4096 (the next 64 columns), SBO 1024 (the next 8
 * rows of k). Two wgmmas (k 0..15, 16..31: start + 2048). out = P V. */
extern "C" __global__ void emu_t_tma_wgmma_pv(const EmuTestParams p) {
  uint64_t *bar = (uint64_t *)(flex_smem + 65536);
  const uint16_t *P = (const uint16_t *)p.in;
  int t = threadIdx.x;
  if (t == 0) flex_mbar_init(bar, 1);
  __syncthreads();
  if (t == 0) {
    flex_mbar_arrive_expect_tx(bar, 2 * 32 * 128);
    flex_tma_load_2d(flex_smem, (const FlexTensorMap *)p.in2, bar, 0, 0);
    flex_tma_load_2d(flex_smem + 4096, (const FlexTensorMap *)p.in2, bar, 64, 0);
  }
  flex_mbar_wait(bar, 0);
  float d[64];
  uint32_t a[2][4];
  int w = t / 32, g = (t % 32) / 4, q = t % 4;
  for (int k = 0; k < 2; k++)
    for (int r = 0; r < 4; r++) {
      int row = 16 * w + g + 8 * (r & 1), col = 16 * k + 2 * q + 8 * (r >> 1);
      a[k][r] = (uint32_t)flex_gload(P + row * 32 + col) | ((uint32_t)flex_gload(P + row * 32 + col + 1) << 16);
    }
  flex_wgmma_fence();
  for (int k = 0; k < 2; k++) {
    uint64_t db = flex_wgmma_desc(flex_smem_addr(flex_smem) + 2048 * k, 4096, 1024, 128);
    flex_wgmma_rs_f16<128, 1>(d, a[k], db, k > 0);
  }
  flex_wgmma_commit();
  flex_wgmma_wait<0>();
  wgmma_store<128>((float *)p.out, d);
}
FLEX_EMU_ENTRY(emu_t_tma_wgmma_pv, EmuTestParams)

/* A producer that refills a stage while a wgmma still reads it: thread 0
 * issues a TMA load (map p.in2, an 8 x 64 box of 16-bit) into the A tile
 * of an in-flight wgmma (mode 1: must fail), or after the wait_group that
 * retires it (mode 0: fine). */
extern "C" __global__ void emu_t_wgmma_overwrite(const EmuTestParams p) {
  uint64_t *bar = (uint64_t *)(flex_smem + 16384);
  int t = threadIdx.x;
  for (int i = t; i < 4096; i += 128) ((uint32_t *)flex_smem)[i] = 0;
  if (t == 0) flex_mbar_init(bar, 1);
  __syncthreads();
  float d[4];
  flex_wgmma_fence();
  flex_wgmma_ss_f16<8>(d, flex_wgmma_desc(0, 128, 256, 0), flex_wgmma_desc(4096, 128, 256, 0), 0);
  flex_wgmma_commit();
  if (t == 0 && p.mode == 1) {
    flex_mbar_arrive_expect_tx(bar, 1024);
    flex_tma_load_2d(flex_smem, (const FlexTensorMap *)p.in2, bar, 0, 0);
  }
  flex_wgmma_wait<0>();
  if (t == 0 && p.mode == 0) {
    flex_mbar_arrive_expect_tx(bar, 1024);
    flex_tma_load_2d(flex_smem, (const FlexTensorMap *)p.in2, bar, 0, 0);
  }
  flex_mbar_wait(bar, 0);
  flex_gstore((float *)p.out + t, d[0]);
}
FLEX_EMU_ENTRY(emu_t_wgmma_overwrite, EmuTestParams)

/* A 3-D box (map p.in2, 16-bit, box {16, 4, 2}) at coordinates p.in3
 * into shared memory at 0; out gets the 256 bytes (64 elements) after the wait. */
extern "C" __global__ void emu_t_tma3d(const EmuTestParams p) {
  uint64_t *bar = (uint64_t *)(flex_smem + 1024);
  const int32_t *c = (const int32_t *)p.in3;
  int t = threadIdx.x;
  if (t == 0) flex_mbar_init(bar, 1);
  __syncthreads();
  if (t == 0) {
    flex_mbar_arrive_expect_tx(bar, 256);
    flex_tma_load_3d(flex_smem, (const FlexTensorMap *)p.in2, bar, c[0], c[1], c[2]);
  }
  flex_mbar_wait(bar, 0);
  for (int i = t; i < 128; i += blockDim.x) flex_gstore((uint16_t *)p.out + i, ((uint16_t *)flex_smem)[i]);
}
FLEX_EMU_ENTRY(emu_t_tma3d, EmuTestParams)

/* The FlashAttention-3 skeleton without the softmax: O = (Q K^T) V with a
 * producer warpgroup and two consumer warpgroups (64 query rows each).
 * The producer's elected thread loads Q (128 x 64, map p.in) once and K, V
 * (map p.in2, p.in3: 64 x 64 tiles of a 256 x 64 tensor) through a
 * two-stage ring of full / empty mbarriers; each consumer computes
 * S = Q K^T (four SS wgmmas, K-major, 128-byte swizzle), turns the S
 * accumulator into fp16 A fragments (d[8j+2r], d[8j+2r+1] -> a_j[r]) and
 * adds P V (four RS wgmmas, V N-major), then frees the stage. out: O, 128 x 64.
 * mode 1: the consumers free the stage before the wait_group of its P V. */
extern "C" __global__ void emu_t_fa3_skeleton(const EmuTestParams p) {
  unsigned char *qs = flex_smem, *ks = flex_smem + 16384, *vs = flex_smem + 32768;
  uint64_t *full = (uint64_t *)(flex_smem + 49152), *empty = full + 2, *qbar = full + 4;
  int t = threadIdx.x, wg = t / 128;
  if (t == 0) {
    for (int s = 0; s < 2; s++) {
      flex_mbar_init(full + s, 1);
      flex_mbar_init(empty + s, 256);
    }
    flex_mbar_init(qbar, 1);
  }
  __syncthreads();
  if (wg == 0) { /* producer */
    flex_setmaxnreg_dec<40>();
    if (t < 32 && flex_elect_one()) {
      flex_mbar_arrive_expect_tx(qbar, 16384);
      flex_tma_load_2d(qs, (const FlexTensorMap *)p.in, qbar, 0, 0);
      for (int j = 0; j < 4; j++) {
        int s = j % 2;
        if (j >= 2) flex_mbar_wait(empty + s, (uint32_t)(j / 2 - 1) & 1);
        flex_mbar_arrive_expect_tx(full + s, 16384);
        flex_tma_load_2d(ks + 8192 * s, (const FlexTensorMap *)p.in2, full + s, 0, 64 * j);
        flex_tma_load_2d(vs + 8192 * s, (const FlexTensorMap *)p.in3, full + s, 0, 64 * j);
      }
    }
    return;
  }
  flex_setmaxnreg_inc<232>(); /* consumers */
  int c = wg - 1;
  float o[32], sacc[32];
  for (int i = 0; i < 32; i++) o[i] = 0;
  flex_mbar_wait(qbar, 0);
  for (int j = 0; j < 4; j++) {
    int s = j % 2;
    flex_mbar_wait(full + s, (uint32_t)(j / 2) & 1);
    flex_wgmma_fence();
    for (int k = 0; k < 4; k++) {
      uint64_t dq = flex_wgmma_desc(flex_smem_addr(qs + 8192 * c) + 32 * k, 16, 1024, 128);
      uint64_t dk = flex_wgmma_desc(flex_smem_addr(ks + 8192 * s) + 32 * k, 16, 1024, 128);
      flex_wgmma_ss_f16<64>(sacc, dq, dk, k > 0);
    }
    flex_wgmma_commit();
    flex_wgmma_wait<0>();
    uint32_t a[4][4];
    for (int kj = 0; kj < 4; kj++)
      for (int r = 0; r < 4; r++) a[kj][r] = flex_pack_h2(sacc[8 * kj + 2 * r], sacc[8 * kj + 2 * r + 1]);
    flex_wgmma_fence();
    for (int kj = 0; kj < 4; kj++) {
      uint64_t dv = flex_wgmma_desc(flex_smem_addr(vs + 8192 * s) + 2048 * kj, 8192, 1024, 128);
      flex_wgmma_rs_f16<64, 1>(o, a[kj], dv, 1);
    }
    flex_wgmma_commit();
    if (p.mode == 1) flex_mbar_arrive(empty + s); /* broken: frees the stage too early */
    flex_wgmma_wait<0>();
    if (p.mode != 1) flex_mbar_arrive(empty + s);
  }
  wgmma_store<64>((float *)p.out + 64 * 64 * c, o);
}
FLEX_EMU_ENTRY(emu_t_fa3_skeleton, EmuTestParams)

/* cp.reduce.async.bulk add: each block puts 256 floats (in[i] * (block + 1))
 * in shared memory and thread 0 adds them to out with two 512-byte bulk
 * reductions. mode 1: thread 0 overwrites the source before the wait. */
extern "C" __global__ void emu_t_bulk_reduce(const EmuTestParams p) {
  float *s = (float *)flex_smem;
  int t = threadIdx.x;
  for (int i = t; i < 256; i += 64) s[i] = flex_gload((const float *)p.in + i) * (float)(blockIdx.x + 1);
  flex_fence_proxy_async();
  __syncthreads();
  if (t == 0) {
    flex_bulk_reduce_add_f32((float *)p.out, s, 512);
    flex_bulk_reduce_add_f32((float *)p.out + 128, s + 128, 512);
    flex_bulk_commit();
    if (p.mode == 1) s[200] = 0;
    flex_bulk_wait_read<0>();
  }
}
FLEX_EMU_ENTRY(emu_t_bulk_reduce, EmuTestParams)

/* The 32- and 64-byte swizzles: A (64 x K) and B^T (32 x K), K = SPAN / 2
 * (one swizzle row), K-major, TMA-loaded with that swizzle; K / 16 wgmmas
 * (start + 32 bytes each), SBO = 8 rows of SPAN bytes. out = A B, 64 x 32. */
template <int SPAN> static void tma_wgmma_sw(const EmuTestParams p) {
  uint64_t *bar = (uint64_t *)(flex_smem + 65536);
  unsigned char *sa = flex_smem, *sb = flex_smem + 8192;
  int t = threadIdx.x;
  if (t == 0) flex_mbar_init(bar, 1);
  __syncthreads();
  if (t == 0) {
    flex_mbar_arrive_expect_tx(bar, 64 * SPAN + 32 * SPAN);
    flex_tma_load_2d(sa, (const FlexTensorMap *)p.in, bar, 0, 0);
    flex_tma_load_2d(sb, (const FlexTensorMap *)p.in2, bar, 0, 0);
  }
  flex_mbar_wait(bar, 0);
  float d[16];
  flex_wgmma_fence();
  for (int k = 0; k < SPAN / 32; k++) {
    uint64_t da = flex_wgmma_desc(flex_smem_addr(sa) + 32 * k, 16, 8 * SPAN, SPAN);
    uint64_t db = flex_wgmma_desc(flex_smem_addr(sb) + 32 * k, 16, 8 * SPAN, SPAN);
    flex_wgmma_ss_bf16<32>(d, da, db, k > 0);
  }
  flex_wgmma_commit();
  flex_wgmma_wait<0>();
  wgmma_store<32>((float *)p.out, d);
}
extern "C" __global__ void emu_t_tma_wgmma_sw32(const EmuTestParams p) { tma_wgmma_sw<32>(p); }
FLEX_EMU_ENTRY(emu_t_tma_wgmma_sw32, EmuTestParams)
extern "C" __global__ void emu_t_tma_wgmma_sw64(const EmuTestParams p) { tma_wgmma_sw<64>(p); }
FLEX_EMU_ENTRY(emu_t_tma_wgmma_sw64, EmuTestParams)
