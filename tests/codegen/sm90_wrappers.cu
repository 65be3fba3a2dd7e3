/* Every sm_90 / sm_90a wrapper of kernels/arch.cuh once, so check_nvrtc
 * can compile them for sm_90a (PTX syntax and ptxas) and find the
 * instructions in the PTX: a producer warpgroup loading by TMA, a consumer
 * warpgroup running wgmma (SS and RS, fp16 and bf16, transposed B). */
#include "arch.cuh"

extern "C" __global__ void __launch_bounds__(256, 1)
    sm90_wrappers(const __grid_constant__ FlexTensorMap map, float *out, int scale_d) {
  extern __shared__ __align__(1024) unsigned char flex_smem[];
  uint64_t *full = (uint64_t *)(flex_smem + 32768), *empty = full + 1;
  int t = threadIdx.x;
  if (t == 0) {
    flex_mbar_init(full, 1);
    flex_mbar_init(empty, 128);
  }
  __syncthreads();
  if (t < 128) { /* producer */
    flex_setmaxnreg_dec<40>();
    if (t < 32 && flex_elect_one()) {
      flex_mbar_arrive_expect_tx(full, 3 * 8192);
      flex_tma_load_2d(flex_smem, &map, full, 0, 0);
      flex_mbar_expect_tx(full, 0);
      flex_tma_load_3d(flex_smem + 8192, &map, full, 0, 0, 0);
      flex_tma_load_4d(flex_smem + 16384, &map, full, 0, 0, 0, 1);
      flex_mbar_wait(empty, 0);
    }
    return;
  }
  flex_setmaxnreg_inc<232>(); /* consumer */
  flex_mbar_wait(full, 0);
  flex_fence_proxy_async();
  float d[32];
  uint32_t a[4] = {1u, 2u, 3u, (uint32_t)t};
  uint64_t da = flex_wgmma_desc(flex_smem_addr(flex_smem), 16, 1024, 128);
  uint64_t db = flex_wgmma_desc(flex_smem_addr(flex_smem + 8192), 16, 1024, 128);
  flex_wgmma_fence();
  flex_wgmma_ss_f16<64>(d, da, db, 0);
  flex_wgmma_ss_bf16<64, 0, 1>(d, da, db, scale_d);
  flex_wgmma_rs_f16<64>(d, a, db, 1);
  flex_wgmma_rs_bf16<64, 1>(d, a, db, 1);
  flex_wgmma_commit();
  flex_wgmma_wait<0>();
  flex_mbar_arrive(empty);
  float *red = (float *)(flex_smem + 16384);
  red[t - 128] = d[0];
  flex_fence_proxy_async();
  if (t == 128) { /* (a real kernel would sync the writers first) */
    flex_bulk_reduce_add_f32(out + 256, red, 512);
    flex_bulk_commit();
    flex_bulk_wait_read<0>();
  }
  float s = 0;
  for (int i = 0; i < 32; i++) s += d[i];
  out[t] = s;
}
