/* cp.async commit groups: data lands only at the matching wait; a !pred
 * copy zero-fills without reading global memory. 64 threads, each copies
 * 16 bytes per stage; in holds 2 stages of 64 x 16 bytes. */
#include "emu_arch.h"

extern __shared__ __align__(16) unsigned char flex_smem[];

/* out:  stage 0 as seen after wait<1>
 * out2: stage 1 as seen after wait<1> (still in flight: poison)
 * out3: stage 1 after wait<0>; threads with t % 5 == 0 load it with
 *       pred = false (zeros), passing a pointer just past the input. */
extern "C" __global__ void emu_t_cpasync(const EmuTestParams p) {
  int t = threadIdx.x;
  const uint32_t *in = (const uint32_t *)p.in;
  uint32_t *s = (uint32_t *)flex_smem;
  flex_cp_async_16(s + t * 4, in + t * 4, true);
  flex_cp_async_commit();
  bool pred = t % 5 != 0;
  flex_cp_async_16(s + 256 + t * 4, pred ? in + 256 + t * 4 : in + 512, pred);
  flex_cp_async_commit();
  flex_cp_async_wait<1>();
  for (int j = 0; j < 4; j++) {
    flex_gstore((uint32_t *)p.out + t * 4 + j, s[t * 4 + j]);
    flex_gstore((uint32_t *)p.out2 + t * 4 + j, s[256 + t * 4 + j]);
  }
  flex_cp_async_wait<0>();
  for (int j = 0; j < 4; j++) flex_gstore((uint32_t *)p.out3 + t * 4 + j, s[256 + t * 4 + j]);
}
FLEX_EMU_ENTRY(emu_t_cpasync, EmuTestParams)
