/* Block reduction with shuffles and __syncthreads, and the shared-memory
 * bugs the emulator must catch. One block of 128 threads per 1024 inputs. */
#include "emu_arch.h"

extern __shared__ __align__(16) unsigned char flex_smem[];

/* Sum of one warp's values, every lane gets it. */
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* out[block] = sum of in[block*1024 .. +1024); out2[block*128+t] = the
 * value lane (t+1)%32 broadcast with __shfl_sync. mode 1 leaves out the
 * __syncthreads between writing and reading the per-warp partials. */
extern "C" __global__ void emu_t_reduce(const EmuTestParams p) {
  extern __shared__ __align__(16) unsigned char flex_smem[];
  float *part = (float *)flex_smem;
  const float *in = (const float *)p.in + blockIdx.x * 1024;
  int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  float v = 0.f;
  for (int i = t; i < 1024; i += blockDim.x) v += flex_gload(in + i);
  float mine = flex_gload(in + t);
  float got = __shfl_sync(0xffffffffu, mine, (lane + 1) & 31);
  flex_gstore((float *)p.out2 + blockIdx.x * 128 + t, got);
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  if (p.mode != 1) __syncthreads();
  if (warp == 0) {
    float s = lane < 4 ? part[lane] : 0.f;
    for (int o = 2; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) flex_gstore((float *)p.out + blockIdx.x, s);
  }
}
FLEX_EMU_ENTRY(emu_t_reduce, EmuTestParams)

/* out[t] = smem[t + blockDim.x]: shared memory nobody wrote. */
extern "C" __global__ void emu_t_unwritten(const EmuTestParams p) {
  float *s = (float *)flex_smem;
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  flex_gstore((float *)p.out + threadIdx.x, s[threadIdx.x + blockDim.x]);
}
FLEX_EMU_ENTRY(emu_t_unwritten, EmuTestParams)

/* Copy n floats with a tail bug when mode == 1 (i <= n). */
extern "C" __global__ void emu_t_copy(const EmuTestParams p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  bool in_range = p.mode == 1 ? i <= p.n : i < p.n;
  if (in_range) flex_gstore((float *)p.out + i, flex_gload((const float *)p.in + i));
}
FLEX_EMU_ENTRY(emu_t_copy, EmuTestParams)

/* Thread 0 leaves early; the others wait at a barrier it never reaches. */
extern "C" __global__ void emu_t_diverge(const EmuTestParams p) {
  if (threadIdx.x == 0 && p.mode == 1) return;
  __syncthreads();
  flex_gstore((float *)p.out + threadIdx.x, 1.0f);
}
FLEX_EMU_ENTRY(emu_t_diverge, EmuTestParams)

/* Votes and block ORs: thread t's predicate is (t == mode) (mode < 0: no
 * thread's); out[t] = __any_sync, out2[t] = __all_sync of !pred over its
 * warp, out3[t] = __syncthreads_or, twice (the second with no predicate
 * set: a stale OR would show). */
extern "C" __global__ void emu_t_vote(const EmuTestParams p) {
  const int t = threadIdx.x;
  const bool pred = t == p.mode;
  flex_gstore((float *)p.out + t, (float)__any_sync(0xffffffffu, pred));
  flex_gstore((float *)p.out2 + t, (float)__all_sync(0xffffffffu, !pred));
  const int first = __syncthreads_or(pred), second = __syncthreads_or(0);
  flex_gstore((float *)p.out3 + t, (float)(first + 2 * second));
}
FLEX_EMU_ENTRY(emu_t_vote, EmuTestParams)
