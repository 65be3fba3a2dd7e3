/* The order blocks start in: thread 0 of each block writes how many blocks
 * started before it (run with one OS thread, so a plain counter counts). */
#include "emu_arch.h"

extern "C" __global__ void emu_t_order(const EmuTestParams p) {
  if (threadIdx.x != 0) return;
  float *counter = (float *)p.out2;
  const float seen = flex_gload(counter);
  flex_gstore(counter, seen + 1.0f);
  flex_gstore((float *)p.out + blockIdx.x, seen);
}
FLEX_EMU_ENTRY(emu_t_order, EmuTestParams)
