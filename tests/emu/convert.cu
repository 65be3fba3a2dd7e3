/* fp16 / bf16 conversions, element-wise over n inputs. */
#include "emu_arch.h"

/* in: n floats -> out: fp16 bits, out2: bf16 bits.
 * in2: n uint16 -> out3: [h2f(bits), bf2f(bits)] pairs. */
extern "C" __global__ void emu_t_convert(const EmuTestParams p) {
  int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    float x = flex_gload((const float *)p.in + i);
    flex_gstore((uint16_t *)p.out + i, flex_f2h(x));
    flex_gstore((uint16_t *)p.out2 + i, flex_f2bf(x));
    uint16_t b = flex_gload((const uint16_t *)p.in2 + i);
    flex_gstore((float *)p.out3 + 2 * i, flex_h2f(b));
    flex_gstore((float *)p.out3 + 2 * i + 1, flex_bf2f(b));
  }
}
FLEX_EMU_ENTRY(emu_t_convert, EmuTestParams)
